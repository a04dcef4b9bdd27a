/**
 * Dialled-in connections (docs/protocol.md, "Dialled-in connections") at real `bin/herald
 * controller` processes with `--connect-listen`:
 *
 * - a stop (SIGTERM) closes them with 1012 spread over `--connect-drain-ms`, and the process exits 0;
 * - with several controllers on one PostgreSQL (docs/several-controllers.md, "Agents that dial
 *   in"): an agent
 * that dials in to a controller that does not own its node gets its ping there and every later
 * wake-up there, whichever controller made the change (the change feed brings it to every
 * controller, and push follows the connection); the owner, with no endpoint announced, dials
 * nothing. The agent is a bare `ws` client with the node's certificate
 * (test/helpers/connect-agent.ts); every wake-up it takes is verified (signed by the holder).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pkiPaths } from '../../certs/paths.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { KeySet } from '../../protocol/jws.js';
import { decodeControllerAnswer } from '../../protocol/frames.js';
import { newNonce } from '../../protocol/metadata.js';
import type { NodeView } from '../../protocol/rest.js';
import { dialIn, type DialledInAgent } from '../helpers/connect-agent.js';
import { makeFleet, type TestFleet } from '../helpers/fleet.js';
import { api, freePort, isBuilt, waitFor } from '../helpers/procs.js';
import { startControllerProcess } from '../helpers/controller-process.js';
import { makeControllerTestPki } from '../helpers/controller-pki.js';

const CONTROLLERS = ['c1', 'c2'];
const NODES = Array.from({ length: 8 }, (_, i) => `d${i + 1}`);
let f: TestFleet;
const connectPorts = new Map<string, number>();
const open: DialledInAgent[] = [];

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  f = await makeFleet(CONTROLLERS, NODES);
  for (const c of CONTROLLERS) {
    const port = await freePort();
    connectPorts.set(c, port);
    await f.startController(c, { args: ['--connect-listen', `127.0.0.1:${port}`] });
  }
}, 120_000);

afterAll(async () => {
  for (const a of open) await a.close();
  await f?.cleanup();
});

const portOf = (c: string): number => f.controllers.get(c)!.port;
const nodeOn = async (c: string, node: string): Promise<NodeView & { owner: string | null }> =>
  (await api(portOf(c), f.op, 'GET', `/v1/nodes/${node}`)).json;

describe('an agent that dials in to a controller that does not own its node', { timeout: 90_000 }, () => {
  it('gets its ping and every wake-up there, whichever controller made the change; the owner dials nothing', async () => {
    // nodes of agents that only dial out: none announces an endpoint
    for (const n of NODES) expect((await api(portOf('c1'), f.op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
    const owners = await waitFor(
      'every node owned, by both controllers between them',
      async () => {
        const items = (await api(portOf('c1'), f.op, 'GET', '/v1/nodes')).json.items as Array<{
          id: string;
          owner: string | null;
        }>;
        const by = new Map(items.map((n) => [n.id, n.owner]));
        return NODES.every((n) => by.get(n)) && new Set(by.values()).size === 2 ? by : null;
      },
      30_000,
      100,
    );
    const node = NODES.find((n) => owners.get(n) === 'c1')!;
    const holder = 'c2';
    const keys = new KeySet(JSON.parse(fs.readFileSync(pkiPaths(f.pki).jwks, 'utf8')));
    const a = await dialIn(connectPorts.get(holder)!, {
      node,
      cred: {
        ca: fs.readFileSync(pkiPaths(f.pki).caCrt),
        cert: fs.readFileSync(pkiPaths(f.pki).cert('agent', node)),
        key: fs.readFileSync(pkiPaths(f.pki).key('agent', node)),
      },
      keys,
      controller: spiffeIdOf('herald.local', 'controller', holder),
    });
    open.push(a);
    const generation = (await nodeOn('c1', node)).generation;
    const ping = await a.nextWake(10_000);
    expect(ping).toMatchObject({ reason: 'ping', gen: generation });
    a.ack(ping, generation);

    // a change made through the owner reaches the holder's connection
    const cfg = await api(portOf('c1'), f.op, 'POST', '/v1/configs', { name: 'c', group: 'script', config: 'true' });
    const dep = await api(portOf('c1'), f.op, 'POST', '/v1/deployments', {
      node,
      config_id: cfg.json.id,
      action: 'CREATE',
    });
    expect(dep.status, JSON.stringify(dep.json)).toBe(201);
    const wake = await a.nextWake(10_000);
    expect(wake).toMatchObject({ reason: 'deployment', gen: (await nodeOn('c1', node)).generation });
    a.ack(wake, wake.gen, 'started');
    // its fetch on the connection is answered by the holder, from the shared database
    const nonce = newNonce();
    a.fetch(nonce);
    const answer = decodeControllerAnswer(await a.nextAnswer(10_000));
    expect(answer.type === 'metadata' && answer.head).toMatchObject({ nonce, status: 200 });

    // and one made through the holder itself
    const again = await api(portOf('c2'), f.op, 'POST', '/v1/deployments', {
      node,
      config_id: cfg.json.id,
      action: 'CREATE',
    });
    expect(again.status).toBe(201);
    const wake2 = await a.nextWake(10_000);
    expect(wake2.gen).toBeGreaterThan(wake.gen);
    a.ack(wake2, wake2.gen);

    const held = await waitFor(
      "the holder's view",
      async () => {
        const v = await nodeOn(holder, node);
        return v.push.connected && v.push.generation_acked === wake2.gen ? v : null;
      },
      10_000,
      100,
    );
    expect(held).toMatchObject({ owner: 'c1', push: { state: 'connected', via: 'dialled-in' } });
    // the owner holds nothing for it and dials nothing: no endpoint
    expect((await nodeOn('c1', node)).push).toMatchObject({ state: 'idle', connected: false, via: null });
    const rows = (await api(portOf(holder), f.op, 'GET', '/v1/controllers')).json.items as Array<{
      name: string;
      nodes_held: number;
    }>;
    expect(rows.find((r) => r.name === holder)!.nodes_held).toBe(1);
  });
});

describe('a controller stopped with SIGTERM', { timeout: 60_000 }, () => {
  it.each([
    ['in the main process', 0],
    ['in a push worker', 1],
  ])(
    'closes its dialled-in connections (%s) with 1012 spread over --connect-drain-ms, then exits 0',
    async (_where, workers) => {
      const pki = await makeControllerTestPki();
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-drain-'));
      try {
        const port = await freePort();
        const drainMs = 900;
        const c = await startControllerProcess(
          [
            '--pki',
            pki.dir,
            '--db',
            path.join(dir, 'herald.db'),
            '--push-workers',
            String(workers),
            '--connect-listen',
            `127.0.0.1:${port}`,
            '--connect-drain-ms',
            String(drainMs),
          ],
          path.join(dir, 'controller.log'),
        );
        const op = pki.cred('operator', 'admin');
        const agents: DialledInAgent[] = [];
        for (const n of ['n1', 'n2', 'n3']) {
          expect(
            (await api(c.port, { ca: pki.ca, cert: op.cert!, key: op.key! }, 'POST', '/v1/nodes', { id: n })).status,
          ).toBe(201);
          const a = await dialIn(port, { node: n, cred: pki.cred('agent', n), keys: pki.keys });
          open.push(a);
          a.ack(await a.nextWake(10_000), 0);
          agents.push(a);
        }
        const at: number[] = [];
        const closes = agents.map((a) =>
          a.closed.then((x) => {
            at.push(performance.now());
            return x;
          }),
        );
        const t0 = performance.now();
        const exit = await c.kill('SIGTERM');
        for (const x of await Promise.all(closes)) expect(x).toEqual({ code: 1012, reason: 'shutting_down' });
        expect(exit.code).toBe(0);
        at.sort((x, y) => x - y);
        // the last of three at 2/3 of the window: timers never fire early
        expect(at[2]! - t0).toBeGreaterThanOrEqual((drainMs * 2) / 3 - 5);
        expect(c.log()).toMatch(/closing the dialled-in connections/);
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
        pki.cleanup();
      }
    },
  );
});
