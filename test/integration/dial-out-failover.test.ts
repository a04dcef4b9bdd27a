/**
 * Several controllers and agents that dial out (docs/several-controllers.md, "Agents that dial
 * in"; docs/dial-out.md): two controllers on one PostgreSQL, six agents that listen on nothing and
 * dial one of the two (each starts at FNV-1a of its node, so they spread). The controller a group
 * of them uses is killed with -9; every agent of that group dials the survivor and runs a change
 * made right after the kill, within 10 s; and a controller killed mid cluster restart leaves the
 * restart to the survivor, each node's uninstall and install run once. Real `bin/herald` processes.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestbedAgent } from '../../cli/testbed/agent.js';
import type { TestbedController } from '../../cli/testbed/controller.js';
import { freePort } from '../../cli/testbed/ports.js';
import { Testbed } from '../../cli/testbed/testbed.js';
import type { NodeView } from '../../protocol/rest.js';
import { pgAvailable, startPg, type PgServer } from '../helpers/pg.js';
import { api, credOf, isBuilt, waitFor } from '../helpers/procs.js';

const here = pgAvailable() && isBuilt();
if (!pgAvailable()) console.log('dial-out-failover: skipped, no PostgreSQL server binaries (docs/development.md)');

const NODES = ['k1', 'k2', 'k3', 'k4', 'k5', 'k6'];
/** The bound the takeover must keep (docs/several-controllers.md). */
const SERVED_WITHIN_MS = 10_000;

let bed: Testbed;
let pg: PgServer;
const ctl = new Map<string, TestbedController>();
const connectPort = new Map<string, number>();
const agents = new Map<string, TestbedAgent>();

const op = () => credOf(bed.pki!.dir, 'operator', 'admin');

beforeAll(async () => {
  if (!here) return;
  bed = new Testbed({ prefix: 'herald-dial-failover-', keep: process.env.KEEP !== undefined });
  await bed.makePki({ controllers: ['c1', 'c2'], agents: NODES });
  pg = await startPg();
  const db = await pg.createDatabase();
  for (const c of ['c1', 'c2']) {
    connectPort.set(c, await freePort());
    ctl.set(
      c,
      await bed.startController({
        name: c,
        db,
        pushWorkers: 1,
        args: ['--connect-listen', `127.0.0.1:${connectPort.get(c)}`],
      }),
    );
  }
  const dialOut = ['c1', 'c2'].map((c) => `wss://127.0.0.1:${connectPort.get(c)}/v1/connect`).join(',');
  for (const node of NODES)
    agents.set(
      node,
      bed.startAgent({
        node,
        listen: null,
        controllers: [...ctl.values()].map((c) => c.url),
        controllerId: '*',
        pollInterval: '600s',
        hooksDir: path.join(bed.dir, `hooks-${node}`),
        args: ['--dial-out', dialOut],
      }),
    );
  await waitFor(
    'every agent dialled in',
    async () => {
      // a controller shows the push connections it holds itself
      const held = new Set<string>();
      for (const c of ctl.values()) {
        const r = await api(c.port, op(), 'GET', '/v1/nodes');
        for (const x of (r.json?.items ?? []) as NodeView[]) if (x.push?.via === 'dialled-in') held.add(x.id);
      }
      return NODES.every((n) => held.has(n));
    },
    60_000,
  );
}, 180_000);

afterAll(async () => {
  await bed?.stop();
  await pg?.close();
});

/** Which controller each agent is connected to now (its last "push connection up"). */
function usedBy(node: string): string {
  const ups = agents
    .get(node)!
    .proc.log()
    .split('\n')
    .filter((l) => l.includes('push connection up'));
  const port = Number(/127\.0\.0\.1:(\d+)\/v1\/connect/.exec(ups.at(-1) ?? '')?.[1]);
  for (const [c, p] of connectPort) if (p === port) return c;
  throw new Error(`${node} is connected to no controller`);
}

describe.skipIf(!here)('dialled-in agents when their controller dies', { timeout: 120_000 }, () => {
  it('kill -9 of the controller a group uses: each agent of it is served by the survivor with the change made after the kill, within 10 s', async () => {
    const byController = new Map<string, string[]>();
    for (const n of NODES) byController.set(usedBy(n), [...(byController.get(usedBy(n)) ?? []), n]);
    // the agents spread over both controllers (FNV-1a of the node picks the first URL)
    expect([...byController.keys()].sort()).toEqual(['c1', 'c2']);
    const victim = 'c1';
    const survivor = ctl.get('c2')!;
    const group = byController.get(victim)!;
    const cfg = await api(survivor.port, op(), 'POST', '/v1/configs', {
      name: 'after-kill',
      group: 'script',
      config: '#!/bin/sh\necho after the kill\n',
    });
    expect(cfg.status).toBe(201);
    await ctl.get(victim)!.proc.kill9();
    const killedAt = Date.now();
    const ids: string[] = [];
    for (const node of group) {
      const d = await api(survivor.port, op(), 'POST', '/v1/deployments', {
        node,
        config_id: cfg.json.id,
        action: 'CREATE',
      });
      expect(d.status).toBe(201);
      ids.push(d.json.id as string);
    }
    await waitFor(
      `the ${group.length} agents of ${victim} ran the change through ${survivor.name}`,
      async () => {
        for (const id of ids)
          if ((await api(survivor.port, op(), 'GET', `/v1/deployments/${id}`)).json?.status !== 'COMPLETE')
            return false;
        return true;
      },
      SERVED_WITHIN_MS - (Date.now() - killedAt),
    );
    for (const n of group) expect(usedBy(n)).toBe('c2');
    // each ran it once
    for (const n of group)
      expect(
        agents
          .get(n)!
          .proc.log()
          .split('\n')
          .filter((l) => l.includes('deployment item started')),
      ).toHaveLength(1);
  });

  it('kill -9 of the controller the dialled-in agents use mid cluster restart: the survivor finishes it, each step run once', async () => {
    // the controller killed above comes back on its connect port; every agent is on c2 now
    ctl.set(
      'c1',
      await bed.startController({
        name: 'c1',
        db: ctl.get('c2')!.db,
        pushWorkers: 1,
        args: ['--connect-listen', `127.0.0.1:${connectPort.get('c1')}`],
      }),
    );
    for (const n of NODES) expect(usedBy(n)).toBe('c2');
    const c1 = ctl.get('c1')!;
    const log = path.join(bed.dir, 'steps.log');
    fs.writeFileSync(log, '');
    const mk = async (name: string, body: string) => {
      const r = await api(c1.port, op(), 'POST', '/v1/configs', { name, group: 'script', config: body });
      expect(r.status).toBe(201);
      return r.json.id as string;
    };
    // each install takes a moment, so the kill lands with nodes done, in flight and pending
    const install = await mk(
      'install',
      `#!/bin/sh\nsleep 0.5\necho "install $deploy_server_id $deploy_action" >> ${log}\n`,
    );
    const uninstall = await mk('uninstall', `#!/bin/sh\necho "uninstall $deploy_server_id $deploy_action" >> ${log}\n`);
    const created = await api(c1.port, op(), 'POST', '/v1/clusters', {
      name: 'behind-nat',
      nodes: NODES,
      install_config_id: install,
      uninstall_config_id: uninstall,
    });
    expect(created.status).toBe(201);
    const id = created.json.id as string;
    const cluster = async () => (await api(c1.port, op(), 'GET', `/v1/clusters/${id}`)).json;
    await waitFor('CREATE_COMPLETE', async () => (await cluster()).status === 'CREATE_COMPLETE', 60_000, 100);
    fs.writeFileSync(log, '');
    expect(
      (await api(c1.port, op(), 'PATCH', `/v1/clusters/${id}/actions/restart`, { max_unavailable: 2 })).status,
    ).toBe(204);
    await waitFor(
      'some nodes restarted, some still to go',
      async () => {
        const phases = ((await cluster()).nodes as Array<{ phase: string }>).map((n) => n.phase);
        return phases.includes('complete') && phases.includes('pending');
      },
      30_000,
      20,
    );
    await ctl.get('c2')!.proc.kill9();
    const done = await waitFor(
      'the restart to end',
      async () => {
        const c = await cluster();
        return /_(COMPLETE|FAILED)$/.test(c.status) ? c : null;
      },
      90_000,
      100,
    );
    expect(done.status).toBe('RESTART_COMPLETE');
    for (const n of NODES) expect(usedBy(n)).toBe('c1');
    const lines = fs.readFileSync(log, 'utf8').trim().split('\n').sort();
    expect(lines).toEqual(NODES.flatMap((n) => [`install ${n} RESTART`, `uninstall ${n} RESTART`]).sort());
  });
});
