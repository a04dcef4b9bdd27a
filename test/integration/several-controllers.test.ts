/**
 * Several controllers on one PostgreSQL (docs/several-controllers.md), all real processes: three `bin/herald
 * controller`s sharing a throwaway PostgreSQL, thirty agents that know all three, and the
 * faults: a controller killed mid-restart, PostgreSQL killed, a controller cut
 * from the database while alive, and two controllers racing on one deployment.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { controllerNames, makeFleet, nodeNames, type TestFleet } from '../helpers/fleet.js';
import { readEvents } from '../helpers/event-stream.js';
import { keepFleetLogs } from '../helpers/fleet-logs.js';
import { api, isBuilt, stopProc, waitFor } from '../helpers/procs.js';

const CONTROLLERS = controllerNames(3);
const NODES = nodeNames(30);
let f: TestFleet;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  f = await makeFleet(CONTROLLERS, NODES);
  for (const c of CONTROLLERS) await f.startController(c, { viaProxy: c === 'c3' });
  await f.startAgents(NODES);
}, 180_000);

// the work dir (every controller's and agent's log) goes at cleanup: keep it when a test fails
beforeEach(({ onTestFailed, task }) => {
  onTestFailed(async () => {
    await keepFleetLogs(f, task.name);
  }, 60_000);
});

afterAll(async () => {
  await f?.cleanup();
});

type ControllerRow = { name: string; live: boolean; nodes_owned: number; nodes_held: number };
const controllers = async (port = f.anyPort()): Promise<ControllerRow[]> =>
  (await api(port, f.op, 'GET', '/v1/controllers')).json.items;

/** Waits for the restart to end; it must be RESTART_COMPLETE with each node's uninstall and install run once (the scripts' count). */
async function restartCompletesEachStepOnce(cluster: () => Promise<{ status: string }>, log: string): Promise<void> {
  const done = await waitFor(
    'the restart to end',
    async () => {
      const c = await cluster();
      return c.status.endsWith('_COMPLETE') || c.status.endsWith('_FAILED') ? c : null;
    },
    90_000,
    100,
  );
  expect(done.status).toBe('RESTART_COMPLETE');
  const lines = fs.readFileSync(log, 'utf8').trim().split('\n').sort();
  expect(lines).toEqual(NODES.flatMap((n) => [`install ${n} RESTART`, `uninstall ${n} RESTART`]).sort());
}

describe('three controllers on one PostgreSQL', { timeout: 150_000 }, () => {
  it('spread the nodes: every node owned by exactly one live controller, each holding its own connected', async () => {
    const rows = await waitFor(
      'every node owned and held',
      async () => {
        const r = await controllers();
        const live = r.filter((c) => c.live);
        return live.length === 3 &&
          live.every((c) => c.nodes_owned > 0 && c.nodes_held === c.nodes_owned) &&
          live.reduce((a, c) => a + c.nodes_owned, 0) === NODES.length
          ? r
          : null;
      },
      30_000,
      100,
    );
    expect(rows.map((c) => c.name)).toEqual(CONTROLLERS);
    // any controller names each node's owner; the owner's own view shows the connection
    const nodes = (await api(f.controllers.get('c1')!.port, f.op, 'GET', '/v1/nodes')).json.items as Array<{
      id: string;
      owner: string;
    }>;
    for (const c of rows) expect(nodes.filter((n) => n.owner === c.name).length, c.name).toBe(c.nodes_owned);
    const one = nodes[0]!;
    const fromOwner = (await api(f.controllers.get(one.owner)!.port, f.op, 'GET', `/v1/nodes/${one.id}`)).json;
    expect(fromOwner).toMatchObject({ owner: one.owner, push: { connected: true } });
    // every controller answers with the same membership
    for (const c of CONTROLLERS)
      expect((await controllers(f.controllers.get(c)!.port)).map((x) => x.name)).toEqual(CONTROLLERS);
  });

  it("every controller's event stream carries a change another controller made; metrics per controller", async () => {
    const [c1, c3] = [f.controllers.get('c1')!, f.controllers.get('c3')!];
    const stream = readEvents(c3.port, f.op);
    try {
      await stream.opened;
      const cfg = await api(c1.port, f.op, 'POST', '/v1/configs', {
        name: 'ev',
        group: 'script',
        config: '#!/bin/sh\n',
      });
      const d = await api(c1.port, f.op, 'POST', '/v1/deployments', {
        node: 'n09',
        config_id: cfg.json.id,
        action: 'CREATE',
      });
      expect(d.status).toBe(201);
      // made through c1, seen on c3's stream: first in progress, then done, in commit order
      const seen = await waitFor(
        'the deployment to complete, as c3 tells it',
        () => {
          const mine = stream.events.filter((e) => e.event === 'deployment' && e.data.id === d.json.id);
          return mine.some((e) => e.data.status === 'COMPLETE') ? mine : null;
        },
        20_000,
        20,
      );
      expect(seen[0]!.data.status).toBe('IN_PROGRESS');
      expect(seen[seen.length - 1]!.data.status).toBe('COMPLETE');
    } finally {
      stream.close();
    }
    const metrics = (await api(c1.port, f.op, 'GET', '/metrics')).raw;
    for (const name of [
      'herald_fleet_nodes_owned',
      'herald_fleet_nodes_held',
      'herald_fleet_takeovers_total',
      'herald_fleet_notifications_total',
      'herald_fleet_lease_renew_seconds_count',
    ])
      expect(metrics, name).toMatch(new RegExp(`^${name} \\d+`, 'm'));
    const owned = Number(/^herald_fleet_nodes_owned (\d+)/m.exec(metrics)![1]);
    expect(owned).toBe((await controllers()).find((c) => c.name === 'c1')!.nodes_owned);
  });

  it("a change made through one controller is applied by its node's owner alone: only the owner wakes it, and no controller reads it back", async () => {
    /** The sum of metric `name`'s samples on controller `c` (those whose labels include `label`). */
    const metric = async (c: string, name: string, label = ''): Promise<number> => {
      const raw = (await api(f.controllers.get(c)!.port, f.op, 'GET', '/metrics')).raw;
      let sum = 0;
      for (const line of raw.split('\n')) {
        const [series, value] = line.split(' ');
        if (series === undefined || value === undefined || series.startsWith('#')) continue;
        if ((series === name || series.startsWith(`${name}{`)) && series.includes(label)) sum += Number(value);
      }
      return sum;
    };
    const snapshot = async () =>
      Object.fromEntries(
        await Promise.all(
          CONTROLLERS.map(
            async (c) =>
              [
                c,
                {
                  woke: await metric(c, 'herald_wakeups_sent_total'),
                  pushReads: await metric(c, 'herald_change_reads_total', 'for="push"'),
                  applied: await metric(c, 'herald_fleet_changes_applied_total'),
                },
              ] as const,
          ),
        ),
      );
    const nodes = (await api(f.controllers.get('c1')!.port, f.op, 'GET', '/v1/nodes')).json.items as Array<{
      id: string;
      owner: string;
    }>;
    const x = nodes.find((n) => n.owner === 'c2')!;
    const c1 = f.controllers.get('c1')!;
    const cfg = await api(c1.port, f.op, 'POST', '/v1/configs', {
      name: 'own',
      group: 'script',
      config: '#!/bin/sh\n',
    });
    const before = await snapshot();
    const d = await api(c1.port, f.op, 'POST', '/v1/deployments', { node: x.id, config_id: cfg.json.id });
    expect(d.status).toBe(201);
    await waitFor(
      'the deployment to complete',
      async () => (await api(c1.port, f.op, 'GET', `/v1/deployments/${d.json.id}`)).json.status === 'COMPLETE',
      20_000,
      50,
    );
    // the deployment and its signal: two change sets, applied by every controller
    const after = await waitFor(
      'every controller to apply both changes',
      async () => {
        const s = await snapshot();
        return CONTROLLERS.every((c) => s[c]!.applied >= before[c]!.applied + 2) ? s : null;
      },
      20_000,
      50,
    );
    expect(after.c2!.woke - before.c2!.woke).toBe(1);
    expect(after.c1!.woke - before.c1!.woke).toBe(0);
    expect(after.c3!.woke - before.c3!.woke).toBe(0);
    for (const c of CONTROLLERS) expect(after[c]!.pushReads - before[c]!.pushReads, c).toBe(0);
  });

  it('a kill -9 of a controller mid rolling restart: its nodes are taken over and pinged within 10 s, the restart completes, every step ran once', async () => {
    const log = path.join(f.work, 'steps.log');
    fs.writeFileSync(log, '');
    const mk = async (name: string, body: string) => {
      const r = await api(f.anyPort(), f.op, 'POST', '/v1/configs', { name, group: 'script', config: body });
      expect(r.status).toBe(201);
      return r.json.id as string;
    };
    // each step takes a moment, so the kill lands with nodes done, in flight and pending
    const install = await mk(
      'install',
      `#!/bin/sh\nsleep 0.3\necho "install $deploy_server_id $deploy_action" >> ${log}\n`,
    );
    const uninstall = await mk('uninstall', `#!/bin/sh\necho "uninstall $deploy_server_id $deploy_action" >> ${log}\n`);
    const created = await api(f.controllers.get('c2')!.port, f.op, 'POST', '/v1/clusters', {
      name: 'k8s',
      nodes: NODES,
      install_config_id: install,
      uninstall_config_id: uninstall,
    });
    expect(created.status).toBe(201);
    const id = created.json.id as string;
    const cluster = async () => (await api(f.anyPort(), f.op, 'GET', `/v1/clusters/${id}`)).json;
    await waitFor('CREATE_COMPLETE', async () => (await cluster()).status === 'CREATE_COMPLETE', 60_000, 100);
    fs.writeFileSync(log, '');

    const before = await controllers();
    const victim = [...before].sort((a, b) => b.nodes_owned - a.nodes_owned)[0]!.name;
    const owned = new Set<string>();
    for (const n of NODES) {
      const v = await api(f.controllers.get(victim)!.port, f.op, 'GET', `/v1/nodes/${n}`);
      if (v.json.push?.connected) owned.add(n);
    }
    expect(owned.size).toBe(before.find((c) => c.name === victim)!.nodes_owned);
    expect(
      (
        await api(f.controllers.get('c3')!.port, f.op, 'PATCH', `/v1/clusters/${id}/actions/restart`, {
          max_unavailable: 3,
        })
      ).status,
    ).toBe(204);
    await waitFor(
      'some nodes restarted, some still to go',
      async () => {
        const c = await cluster();
        const phases = c.nodes.map((n: { phase: string }) => n.phase);
        return phases.filter((p: string) => p === 'complete').length >= 3 && phases.includes('pending');
      },
      30_000,
      20,
    );
    const victimProc = f.controllers.get(victim)!.proc;
    const killedAt = Date.now();
    await stopProc(victimProc, 'SIGKILL');
    const survivors = CONTROLLERS.filter((c) => c !== victim).map((c) => f.controllers.get(c)!);
    // docs/several-controllers.md: within 10 s of the death, each of its nodes is owned by a survivor that is
    // connected to it and has had its ping wake-up acknowledged since the kill
    const pinged = new Set<string>();
    await waitFor(
      `the ${owned.size} nodes of ${victim} pinged by their new owners`,
      async () => {
        for (const n of owned) {
          if (pinged.has(n)) continue;
          for (const s of survivors) {
            const p = (await api(s.port, f.op, 'GET', `/v1/nodes/${n}`)).json.push;
            if (p?.connected && p.last_ack_at && Date.parse(p.last_ack_at) >= killedAt) pinged.add(n);
          }
        }
        return pinged.size === owned.size;
      },
      10_000 - (Date.now() - killedAt),
      50,
    );
    await restartCompletesEachStepOnce(cluster, log);
    const after = await controllers(survivors[0]!.port);
    expect(after.find((c) => c.name === victim)!.live).toBe(false);
    expect(after.filter((c) => c.live).reduce((a, c) => a + c.nodes_owned, 0)).toBe(NODES.length);
    // back to three: the restarted controller takes its share again
    await f.startController(victim);
    await waitFor(
      `${victim} to own nodes again`,
      async () => {
        const r = await controllers();
        return r.every((c) => c.live && c.nodes_owned > 0 && c.nodes_held === c.nodes_owned);
      },
      30_000,
      100,
    );
  });

  it('two controllers racing on one deployment: consecutive revisions, nothing lost, the agent ends on the latest', async () => {
    const out = path.join(f.work, 'race.out');
    const cfg = await api(f.anyPort(), f.op, 'POST', '/v1/configs', {
      name: 'race',
      group: 'script',
      inputs: [{ name: 'k', type: 'String' }],
      config: `#!/bin/sh\necho "$k" > ${out}\n`,
    });
    expect(cfg.status).toBe(201);
    const d = await api(f.anyPort(), f.op, 'POST', '/v1/deployments', {
      node: 'n05',
      config_id: cfg.json.id,
      action: 'CREATE',
      actions: ['CREATE', 'UPDATE'],
      input_values: { k: 'k0' },
    });
    expect(d.status).toBe(201);
    const id = d.json.id as string;
    const [a, b] = [f.controllers.get('c1')!.port, f.controllers.get('c2')!.port];
    const patches = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        api(i % 2 === 0 ? a : b, f.op, 'PATCH', `/v1/deployments/${id}`, { input_values: { k: `k${i + 1}` } }),
      ),
    );
    expect(patches.map((p) => p.status)).toEqual(patches.map(() => 200));
    // every PATCH got its own revision, numbered without a gap or a repeat
    expect(patches.map((p) => p.json.revision as number).sort((x, y) => x - y)).toEqual(
      Array.from({ length: 40 }, (_, i) => i + 2),
    );
    const revisions = (await api(a, f.op, 'GET', `/v1/deployments/${id}/revisions`)).json.items as Array<{
      revision: number;
      input_values: { k: string };
    }>;
    expect(revisions.map((r) => r.revision)).toEqual(Array.from({ length: 41 }, (_, i) => i + 1));
    const latest = revisions[revisions.length - 1]!;
    const done = await waitFor(
      'the agent to run the latest revision',
      async () => {
        const r = (await api(b, f.op, 'GET', `/v1/deployments/${id}`)).json;
        return r.revision === 41 && r.status === 'COMPLETE' ? r : null;
      },
      30_000,
      50,
    );
    expect(done.revision).toBe(latest.revision);
    expect(fs.readFileSync(out, 'utf8').trim()).toBe(latest.input_values.k);
  });

  it('a controller cut from the database stops pushing when its lease ends, the others take its nodes, and it rejoins without a duplicated step', async () => {
    const c3 = f.controllers.get('c3')!;
    const log = path.join(f.work, 'steps.log');
    fs.writeFileSync(log, '');
    const clusterId = (await api(f.anyPort(), f.op, 'GET', '/v1/clusters')).json.items[0].id as string;
    const cluster = async () =>
      (await api(f.controllers.get('c1')!.port, f.op, 'GET', `/v1/clusters/${clusterId}`)).json;
    await waitFor(
      'c3 to own nodes',
      async () => ((await controllers()).find((c) => c.name === 'c3')?.nodes_owned ?? 0) > 0,
      30_000,
      100,
    );
    expect(
      (await api(f.anyPort(), f.op, 'PATCH', `/v1/clusters/${clusterId}/actions/restart`, { max_unavailable: 2 }))
        .status,
    ).toBe(204);
    await waitFor(
      'the restart under way',
      async () => (await cluster()).nodes.some((n: { phase: string }) => n.phase === 'complete'),
      30_000,
      20,
    );
    await c3.proxy!.stop();
    // while cut off, c3 answers 503 with a code, not a hang or a 500
    const refused = await waitFor(
      'c3 to answer 503',
      async () => {
        const r = await api(c3.port, f.op, 'GET', '/v1/nodes');
        return r.status === 503 ? r : null;
      },
      15_000,
      100,
    );
    expect(refused.json.error.code).toBe('store_unavailable');
    expect(refused.headers['retry-after']).toBe('1');
    // its lease ends: it says it stopped pushing, and the two others own every node
    await waitFor('c3 to stop pushing', () => c3.proc.log().includes('lease ended without a renewal'), 20_000, 100);
    await waitFor(
      'c1 and c2 to own every node',
      async () => {
        const r = await controllers(f.controllers.get('c1')!.port);
        const live = r.filter((c) => c.live);
        return (
          live.map((c) => c.name).join() === 'c1,c2' &&
          live.reduce((x, c) => x + c.nodes_owned, 0) === NODES.length &&
          live.every((c) => c.nodes_held === c.nodes_owned)
        );
      },
      20_000,
      100,
    );
    await c3.proxy!.start();
    await waitFor(
      'c3 to rejoin and hold its share again',
      async () => {
        const r = await controllers(c3.port).catch(() => []);
        return r.length === 3 && r.every((c) => c.live && c.nodes_owned > 0 && c.nodes_held === c.nodes_owned);
      },
      30_000,
      100,
    );
    await restartCompletesEachStepOnce(cluster, log);
  });

  it('a kill -9 of PostgreSQL: 503 store_unavailable meanwhile, then every acknowledged change is there and every missed wake-up is sent', async () => {
    const out = path.join(f.work, 'pgkill.out');
    const cfg = await api(f.anyPort(), f.op, 'POST', '/v1/configs', {
      name: 'pgkill',
      group: 'script',
      inputs: [{ name: 'k', type: 'String' }],
      config: `#!/bin/sh\necho "$k" > ${out}\n`,
    });
    const d = await api(f.anyPort(), f.op, 'POST', '/v1/deployments', {
      node: 'n17',
      config_id: cfg.json.id,
      action: 'CREATE',
      actions: ['CREATE', 'UPDATE'],
      input_values: { k: 'before' },
    });
    const id = d.json.id as string;
    await waitFor(
      'the first run',
      () => fs.existsSync(out) && fs.readFileSync(out, 'utf8').trim() === 'before',
      20_000,
    );
    // acknowledged just before the crash: its wake-up may or may not have gone out
    const patched = await api(f.controllers.get('c2')!.port, f.op, 'PATCH', `/v1/deployments/${id}`, {
      input_values: { k: 'acknowledged' },
    });
    expect(patched.status).toBe(200);
    await f.pg.kill9();
    for (const c of f.controllers.values()) {
      const r = await api(c.port, f.op, 'GET', '/v1/nodes');
      expect({ c: c.name, status: r.status, code: r.json?.error?.code }).toEqual({
        c: c.name,
        status: 503,
        code: 'store_unavailable',
      });
    }
    const refusedWrite = await api(f.anyPort(), f.op, 'PATCH', `/v1/deployments/${id}`, {
      input_values: { k: 'lost' },
    });
    expect(refusedWrite.status).toBe(503);
    await f.pg.start();
    const done = await waitFor(
      'the acknowledged revision to run',
      async () => {
        const r = await api(f.anyPort(), f.op, 'GET', `/v1/deployments/${id}`);
        return r.status === 200 && r.json.revision === patched.json.revision && r.json.status === 'COMPLETE'
          ? r.json
          : null;
      },
      40_000,
      100,
    );
    expect(done.input_values.k).toBe('acknowledged');
    expect(fs.readFileSync(out, 'utf8').trim()).toBe('acknowledged');
    await waitFor(
      'all three controllers live and holding every node again',
      async () => {
        const r = await controllers().catch(() => []);
        return (
          r.length === 3 &&
          r.every((c) => c.live) &&
          r.reduce((x, c) => x + c.nodes_owned, 0) === NODES.length &&
          r.every((c) => c.nodes_held === c.nodes_owned)
        );
      },
      40_000,
      200,
    );
  });
});
