/**
 * Several controllers on one throwaway PostgreSQL, and agents that know all of them, as
 * separate `bin/herald` processes on 127.0.0.1 (docs/several-controllers.md), through the testbed
 * (cli/testbed/): the PKI made by certs/ (each controller with its own certificate and signing
 * key), each controller optionally
 * reaching the database through a TCP proxy the test can stop ("cut from the database").
 */
import fs from 'node:fs';
import path from 'node:path';
import { Testbed } from '../../cli/testbed/testbed.js';
import { startPg, type PgServer } from './pg.js';
import { api, freePort, hasExited, REPO, stopProc, track, waitFor, type Cred, type Proc } from './procs.js';
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
  /** Starts (or starts again, on the same port) controller `name`; `args`: more `herald controller` options. */
  startController(name: string, o?: { viaProxy?: boolean; args?: string[] }): Promise<FleetController>;
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
  const bed = new Testbed({ prefix: 'herald-fleet-', cwd: REPO, keep: true, onSpawn: track });
  const work = bed.dir;
  const made = await bed.makePki({ controllers, agents: nodes });
  const pki = made.dir;
  const op = made.operator();
  const pg = await startPg();
  const db = await pg.createDatabase();
  const ports = new Map<string, number>();
  for (const c of controllers) ports.set(c, await freePort());
  const urls = () => controllers.map((c) => `https://127.0.0.1:${ports.get(c)}`);
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
      const { proc } = await bed.startController({
        label: `${name}-${n++}`,
        name,
        port,
        db: url,
        timeoutMs: 20_000,
        ...(o.args ? { args: o.args } : {}),
      });
      const c = { name, port, proc, proxy, url: `https://127.0.0.1:${port}` };
      fleet.controllers.set(name, c);
      return c;
    },
    async startAgents(list) {
      const spawnAgent = async (node: string): Promise<FleetAgent> => {
        const port = await freePort();
        const hooks = path.join(work, `hooks-${node}`);
        const { proc } = bed.startAgent({
          node,
          label: `agent-${node}-${n++}`,
          controllers: urls(),
          controllerId: '*',
          listen: `127.0.0.1:${port}`,
          stateDir: path.join(work, `state-${node}`),
          hooksDir: hooks,
        });
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
