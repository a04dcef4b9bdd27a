/**
 * A controller revoked while it runs, all real processes: three `bin/herald controller`s on a
 * throwaway PostgreSQL and nine agents that know all three. `herald certs revoke controller/c2`
 * while c2 runs: c2's nodes go to the two others within the takeover bound
 * (docs/several-controllers.md), c2 refuses writes with a code and its probe says why, and a
 * change made through another controller reaches c2's former nodes.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { controllerNames, makeFleet, nodeNames, type TestFleet } from '../helpers/fleet.js';
import { keepFleetLogs } from '../helpers/fleet-logs.js';
import { api, heraldSync, isBuilt, waitFor } from '../helpers/procs.js';

const CONTROLLERS = controllerNames(3);
const NODES = nodeNames(9);
/** docs/several-controllers.md: a controller's nodes are with the others within 10 s of its end. */
const TAKEOVER_BOUND_MS = 10_000;
let f: TestFleet;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  f = await makeFleet(CONTROLLERS, NODES);
  for (const c of CONTROLLERS) await f.startController(c);
  await f.startAgents(NODES);
}, 180_000);

beforeEach(({ onTestFailed, task }) => {
  onTestFailed(async () => {
    await keepFleetLogs(f, task.name);
  }, 60_000);
});

afterAll(async () => {
  await f?.cleanup();
});

type ControllerRow = { name: string; live: boolean; nodes_owned: number; nodes_held: number };
const controllers = async (port: number): Promise<ControllerRow[]> =>
  (await api(port, f.op, 'GET', '/v1/controllers')).json.items;

describe('a controller revoked while it runs', { timeout: 120_000 }, () => {
  it('loses its nodes to the others within the takeover bound, refuses writes with controller_revoked, and a change made elsewhere reaches its former nodes', async () => {
    const [c1, c2] = [f.controllers.get('c1')!, f.controllers.get('c2')!];
    await waitFor(
      'every controller owning and holding its share',
      async () => {
        const r = await controllers(c1.port);
        return r.length === 3 && r.every((c) => c.live && c.nodes_owned > 0 && c.nodes_held === c.nodes_owned);
      },
      30_000,
      100,
    );
    const owners = (await api(c1.port, f.op, 'GET', '/v1/nodes')).json.items as Array<{ id: string; owner: string }>;
    const former = owners.filter((n) => n.owner === 'c2').map((n) => n.id);
    expect(former.length).toBeGreaterThan(0);

    const revokedAt = Date.now();
    const r = heraldSync(['certs', 'revoke', 'controller/c2', '--dir', f.pki]);
    expect(r.code, r.err).toBe(0);

    // each of c2's nodes owned by c1 or c3, connected, and pinged by it since the revocation
    const survivors = ['c1', 'c3'].map((c) => f.controllers.get(c)!);
    const pinged = new Set<string>();
    await waitFor(
      `the ${former.length} nodes of c2 pinged by c1 and c3`,
      async () => {
        for (const n of former) {
          if (pinged.has(n)) continue;
          for (const s of survivors) {
            const p = (await api(s.port, f.op, 'GET', `/v1/nodes/${n}`)).json.push;
            if (p?.connected && p.last_ack_at && Date.parse(p.last_ack_at) >= revokedAt) pinged.add(n);
          }
        }
        return pinged.size === former.length;
      },
      TAKEOVER_BOUND_MS - (Date.now() - revokedAt),
      50,
    );
    const after = await controllers(c1.port);
    expect(after.find((c) => c.name === 'c2')).toMatchObject({ live: false, nodes_owned: 0 });
    expect(after.filter((c) => c.live).reduce((a, c) => a + c.nodes_owned, 0)).toBe(NODES.length);

    // c2 is still running; what is written through it is refused with a code, and its probe says why
    const refused = await api(c2.port, f.op, 'POST', '/v1/configs', { name: 'via-c2', group: 'script', config: '' });
    expect({ status: refused.status, code: refused.json?.error?.code }).toEqual({
      status: 503,
      code: 'controller_revoked',
    });
    const health = await api(c2.port, f.op, 'GET', '/healthz');
    expect({ status: health.status, body: health.json }).toEqual({
      status: 503,
      body: { status: 'controller_revoked' },
    });
    expect(
      (await api(c1.port, f.op, 'GET', '/v1/configs')).json.items.map((c: { name: string }) => c.name),
    ).not.toContain('via-c2');

    // a change made through c1 reaches a node c2 owned
    const out = path.join(f.work, 'after-revoke.out');
    const node = former[0]!;
    const cfg = await api(c1.port, f.op, 'POST', '/v1/configs', {
      name: 'after-revoke',
      group: 'script',
      config: `#!/bin/sh\necho "$deploy_server_id" > ${out}\n`,
    });
    expect(cfg.status).toBe(201);
    const d = await api(c1.port, f.op, 'POST', '/v1/deployments', { node, config_id: cfg.json.id, action: 'CREATE' });
    expect(d.status).toBe(201);
    await waitFor(
      'the deployment to complete',
      async () => (await api(c1.port, f.op, 'GET', `/v1/deployments/${d.json.id}`)).json.status === 'COMPLETE',
      30_000,
      50,
    );
    expect(fs.readFileSync(out, 'utf8').trim()).toBe(node);
    expect(c2.proc.log()).toContain('controller_revoked');
  });
});
