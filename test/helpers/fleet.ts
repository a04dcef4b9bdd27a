/**
 * Several controllers on one throwaway PostgreSQL, and agents that know all of them, as
 * separate `bin/herald` processes on 127.0.0.1 (docs/several-controllers.md): the PKI made by `bin/herald certs`
 * (each controller with its own certificate and signing key), each controller optionally
 * reaching the database through a TCP proxy the test can stop ("cut from the database").
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startPg, type PgServer } from './pg.js';
import {
  api,
  credOf,
  freePort,
  hasExited,
  heraldSync,
  startHerald,
  stopProc,
  waitFor,
  type Cred,
  type Proc,
} from './procs.js';
import { TcpProxy } from './tcp-proxy.js';

export interface FleetController {
  name: string;
  port: number;
  proc: Proc;
  /** The proxy between it and PostgreSQL, when started with `viaProxy`. */
  proxy: TcpProxy | undefined;
  url: string;
}

export interface FleetAgent {
  node: string;
  port: number;
  proc: Proc;
  hooks: string;
}

export interface TestFleet {
  work: string;
  pki: string;
  op: Cred;
  pg: PgServer;
  db: string;
  controllers: Map<string, FleetController>;
  agents: Map<string, FleetAgent>;
  /** Starts (or starts again, on the same port) controller `name`. */
  startController(name: string, o?: { viaProxy?: boolean }): Promise<FleetController>;
  /** Starts the agents, all at once; each knows every controller (`--controller-id *`). */
  startAgents(nodes: string[]): Promise<void>;
  /** A live controller's port (the first in name order that is running). */
  anyPort(): number;
  cleanup(): Promise<void>;
}

export const controllerNames = (n: number): string[] => Array.from({ length: n }, (_, i) => `c${i + 1}`);
export const nodeNames = (n: number): string[] =>
  Array.from({ length: n }, (_, i) => `n${String(i + 1).padStart(2, '0')}`);

/** A PKI with `controllers` and `nodes`, a fresh database on a new PostgreSQL; nothing started yet. */
export async function makeFleet(controllers: string[], nodes: string[]): Promise<TestFleet> {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-fleet-'));
  const pki = path.join(work, 'pki');
  const must = (args: string[]) => {
    const r = heraldSync(args);
    if (r.code !== 0) throw new Error(`herald ${args.join(' ')}: ${r.err}`);
  };
  must(['certs', 'init', '--dir', pki]);
  for (const c of controllers)
    must(['certs', 'issue', 'controller', c, '--dir', pki, '--ip', '127.0.0.1', '--dns', 'localhost']);
  for (const n of nodes) must(['certs', 'issue', 'agent', n, '--dir', pki, '--ip', '127.0.0.1', '--dns', 'localhost']);
  const op = credOf(pki, 'operator', 'admin');
  const pg = await startPg();
  const db = await pg.createDatabase();
  const ports = new Map<string, number>();
  for (const c of controllers) ports.set(c, await freePort());
  const urls = () => controllers.map((c) => `https://127.0.0.1:${ports.get(c)}`).join(',');
  let n = 0;

  const fleet: TestFleet = {
    work,
    pki,
    op,
    pg,
    db,
    controllers: new Map(),
    agents: new Map(),
    async startController(name, o = {}) {
      const port = ports.get(name)!;
      let proxy = fleet.controllers.get(name)?.proxy;
      let url = db;
      if (o.viaProxy || proxy) {
        proxy ??= await new TcpProxy(pg.port).start();
        const u = new URL(db);
        u.port = String(proxy.port);
        url = u.toString();
      }
      const proc = startHerald(
        `${name}-${n++}`,
        ['controller', '--name', name, '--listen', `127.0.0.1:${port}`, '--pki', pki, '--db', url],
        work,
      );
      await waitFor(
        `controller ${name} /healthz`,
        async () => {
          if (hasExited(proc)) throw new Error(`${name} exited: ${proc.log().split('\n').slice(-15).join('\n')}`);
          return (await api(port, op, 'GET', '/healthz')).status === 200;
        },
        20_000,
        50,
      );
      const c = { name, port, proc, proxy, url: `https://127.0.0.1:${port}` };
      fleet.controllers.set(name, c);
      return c;
    },
    async startAgents(list) {
      const spawnAgent = async (node: string): Promise<FleetAgent> => {
        const port = await freePort();
        const hooks = path.join(work, `hooks-${node}`);
        fs.mkdirSync(hooks, { recursive: true, mode: 0o755 });
        const proc = startHerald(
          `agent-${node}-${n++}`,
          [
            'agent',
            '--node',
            node,
            '--controller',
            urls(),
            '--controller-id',
            '*',
            '--listen',
            `127.0.0.1:${port}`,
            '--pki',
            pki,
            '--state-dir',
            path.join(work, `state-${node}`),
            '--hooks-dir',
            hooks,
          ],
          work,
        );
        const a = { node, port, proc, hooks };
        fleet.agents.set(node, a);
        return a;
      };
      const started: FleetAgent[] = [];
      for (const node of list) started.push(await spawnAgent(node));
      await waitFor(
        `${list.length} agents to announce themselves`,
        async () => {
          for (const [i, a] of started.entries()) {
            if (!hasExited(a.proc)) continue;
            // a free port taken by another process between its pick and the bind: pick again
            if (a.proc.log().includes('EADDRINUSE')) started[i] = await spawnAgent(a.node);
            else throw new Error(`agent ${a.node} exited: ${a.proc.log().slice(-2000)}`);
          }
          const r = await api(fleet.anyPort(), op, 'GET', '/v1/nodes');
          const have = new Set(
            ((r.json?.items ?? []) as Array<{ id: string; endpoint: string | null }>)
              .filter((x) => x.endpoint)
              .map((x) => x.id),
          );
          return started.every((a) => have.has(a.node) && JSON.stringify(r.json).includes(`:${a.port}/`));
        },
        60_000,
        100,
      );
    },
    anyPort() {
      for (const c of [...fleet.controllers.values()].sort((a, b) => a.name.localeCompare(b.name)))
        if (!hasExited(c.proc)) return c.port;
      throw new Error('no controller is running');
    },
    async cleanup() {
      for (const a of fleet.agents.values()) await stopProc(a.proc, 'SIGKILL').catch(() => {});
      for (const c of fleet.controllers.values()) {
        await stopProc(c.proc, 'SIGKILL').catch(() => {});
        await c.proxy?.stop();
      }
      await pg.close();
      if (!process.env.KEEP) fs.rmSync(work, { recursive: true, force: true });
    },
  };
  return fleet;
}
