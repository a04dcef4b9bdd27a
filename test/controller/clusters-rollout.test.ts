/**
 * Restarts with node groups (docs/api.md) on the engine and the in-memory ClusterTx: the order of the
 * groups, each group's window (counts and percentages), pause_s, the failure budget, the health
 * check, a one-group restart and the plan of a dry run. No SQLite, no sockets.
 */
import { describe, expect, it } from 'vitest';
import { newCluster } from '../helpers/new-cluster.js';
import { codeOf } from '../../protocol/errors.js';
import { ClusterEngine, type RestartOptions } from '../../controller/clusters/engine.js';
import { groupWindow } from '../../controller/clusters/plan.js';
import type { ClusterNodeRecord, NewNodegroup } from '../../controller/model/records.js';
import { FakeClusterData } from './clusters-fake-tx.js';

const WHO = 'spiffe://herald.local/operator/admin';
const T0 = Date.parse('2030-01-01T00:00:00Z');

/** A fake world with groups `spec` (name → role and node count), created and installed. */
async function world(spec: Array<{ name: string; role: 'master' | 'worker'; n: number }>) {
  const data = new FakeClusterData();
  const engine = new ClusterEngine({ stepMarginS: 0 });
  const install = data.addConfig('install', 60);
  const uninstall = data.addConfig('uninstall', 60);
  const health = data.addConfig('health', 60);
  const groups: NewNodegroup[] = spec.map((g) => ({
    name: g.name,
    role: g.role,
    nodes: Array.from({ length: g.n }, (_, i) => `${g.name}${i}`),
    ownInstallConfigId: null,
    ownUninstallConfigId: null,
    ownInputValues: null,
    installConfigId: install,
    uninstallConfigId: uninstall,
    installInputValues: {},
  }));
  const {
    result: { id },
  } = await data.run((tx) =>
    engine.create(
      tx,
      newCluster({
        nodes: groups.flatMap((g) => g.nodes),
        nodegroups: groups,
        installConfigId: install,
        uninstallConfigId: uninstall,
      }),
      WHO,
      T0,
    ),
  );
  const cluster = () => data.cluster(id)!;
  const node = (name: string) => cluster().nodes.find((x) => x.node === name)!;
  const depOf = (n: ClusterNodeRecord) =>
    n.phase === 'installing'
      ? n.installDeploymentId
      : n.phase === 'checking'
        ? n.healthDeploymentId!
        : n.uninstallDeploymentId!;
  const result = (name: string, ok: boolean, nowMs: number) =>
    data.run(async (tx) => {
      const depId = depOf(node(name));
      const d = (await tx.deployment(depId))!;
      const reason = ok ? 'Outputs received' : 'Deployment to server failed: exploded';
      await tx.recordResult(d, { status: ok ? 'COMPLETE' : 'FAILED', statusReason: reason, outputValues: {} }, nowMs);
      await engine.onStepResult(tx, { clusterId: id, node: name, deploymentId: depId, ok, reason }, nowMs);
    });
  for (const n of cluster().nodes) await result(n.node, true, T0);
  const restart = (o: RestartOptions, nowMs: number) => data.run((tx) => engine.restart(tx, id, o, WHO, nowMs));
  const tick = (nowMs: number) => data.run((tx) => engine.tick(tx, nowMs));
  const busy = () =>
    cluster()
      .nodes.filter((x) => ['uninstalling', 'installing', 'checking'].includes(x.phase))
      .map((x) => x.node);
  /**
   * Answers every step in flight (`ok` decides) one node at a time, 1 s apart, ticking each
   * second, until the cluster is idle; records what was in flight after each event.
   */
  const drive = async (from: number, ok: (node: string) => boolean = () => true) => {
    const seen: string[][] = [];
    let now = from;
    for (let i = 0; i < 10_000 && cluster().head.status === 'RESTART_IN_PROGRESS'; i++) {
      seen.push(busy());
      const b = busy();
      now += 1000;
      if (b.length > 0) await result(b[0]!, ok(b[0]!), now);
      else await tick(now);
    }
    return { seen, now };
  };
  return { data, engine, id, install, uninstall, health, cluster, node, result, restart, tick, busy, drive };
}

async function rejected(p: Promise<unknown>): Promise<{ code: string | undefined; field: unknown }> {
  try {
    await p;
  } catch (err) {
    return { code: codeOf(err), field: (err as { field?: unknown }).field };
  }
  return { code: undefined, field: undefined };
}

describe('rollout: group windows', () => {
  it('is 1 in a master group and all in the others by default; a percentage rounds down, at least 1, at most all', () => {
    expect(groupWindow('master', 5, null)).toBe(1);
    expect(groupWindow('worker', 5, null)).toBe(5);
    expect(groupWindow('worker', 10, '25%')).toBe(2);
    expect(groupWindow('worker', 3, '10%')).toBe(1);
    expect(groupWindow('master', 7, '100%')).toBe(7);
    expect(groupWindow('worker', 3, 10)).toBe(3);
    expect(groupWindow('master', 3, 2)).toBe(2);
  });
});

describe('rollout: order and window', () => {
  it('restarts masters first, one at a time, then the workers in creation order, each group after the one before completed', async () => {
    const w = await world([
      { name: 'wa', role: 'worker', n: 3 },
      { name: 'm', role: 'master', n: 3 },
      { name: 'wb', role: 'worker', n: 2 },
    ]);
    await w.restart({}, T0 + 10_000);
    const { seen } = await w.drive(T0 + 10_000);
    expect(w.cluster().head.status).toBe('RESTART_COMPLETE');
    const groupOf = (n: string) => n.replace(/[0-9]+$/, '');
    // every look: one group only in flight; masters at most 1; and the groups come in order m, wa, wb
    const order: string[] = [];
    for (const b of seen) {
      const gs = [...new Set(b.map(groupOf))];
      expect(gs.length).toBeLessThanOrEqual(1);
      if (gs[0] === 'm') expect(b.length).toBeLessThanOrEqual(1);
      if (gs[0] && order[order.length - 1] !== gs[0]) order.push(gs[0]);
    }
    expect(order).toEqual(['m', 'wa', 'wb']);
    // the workers' default window: all of the group at once
    expect(Math.max(...seen.filter((b) => groupOf(b[0] ?? '') === 'wa').map((b) => b.length))).toBe(3);
  });

  it('holds a percentage window per group: 50% of 4 workers is 2', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 4 }]);
    await w.restart({ maxUnavailable: '50%' }, T0 + 10_000);
    expect(w.busy()).toEqual(['w0', 'w1']);
    const { seen } = await w.drive(T0 + 10_000);
    expect(Math.max(...seen.map((b) => b.length))).toBe(2);
    expect(w.cluster().head.status).toBe('RESTART_COMPLETE');
  });
});

describe('rollout: pause_s', () => {
  it("keeps a node's slot pause_s after its end: the next node starts on the first tick after it", async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    const t = T0 + 10_000;
    await w.restart({ maxUnavailable: 1, pauseS: 5 }, t);
    await w.result('w0', true, t + 100); // uninstall
    await w.result('w0', true, t + 200); // install: w0 ends
    expect(w.node('w0').phase).toBe('complete');
    expect(w.busy()).toEqual([]);
    await w.tick(t + 200 + 4_999);
    expect(w.node('w1').phase).toBe('pending');
    await w.tick(t + 200 + 5_000);
    expect(w.node('w1').phase).toBe('uninstalling');
    await w.result('w1', true, t + 6_000);
    await w.result('w1', true, t + 6_100);
    // the last node's pause delays nothing
    expect(w.cluster().head.status).toBe('RESTART_COMPLETE');
  });
});

describe('rollout: failure budget', () => {
  it('with max_failures 1, goes on after one failure, starts nothing after the second, and ends RESTART_FAILED when the nodes in flight end', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 6 }]);
    const t = T0 + 10_000;
    await w.restart({ maxUnavailable: 2, maxFailures: 1 }, t);
    expect(w.busy()).toEqual(['w0', 'w1']);
    await w.result('w0', false, t + 1); // first failure: within the budget
    expect(w.busy()).toEqual(['w1', 'w2']);
    await w.result('w1', false, t + 2); // second: over the budget
    expect(w.busy()).toEqual(['w2']);
    expect(w.cluster().head.status).toBe('RESTART_IN_PROGRESS');
    await w.result('w2', true, t + 3);
    await w.result('w2', true, t + 4);
    expect(w.cluster().head.status).toBe('RESTART_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/^restart failed on w0: .*; w1: .*\(3 node\(s\) not started\)$/);
    expect(['w3', 'w4', 'w5'].map((n) => w.node(n).phase)).toEqual(['pending', 'pending', 'pending']);
  });

  it('with the default budget 0, the first failure stops new starts', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    await w.restart({ maxUnavailable: 1, pauseS: 1 }, T0 + 10_000);
    await w.result('w0', false, T0 + 10_001);
    await w.tick(T0 + 20_000);
    expect(w.cluster().head.status).toBe('RESTART_FAILED');
    expect(w.node('w1').phase).toBe('pending');
  });
});

describe('rollout: health check', () => {
  it('runs the health config (CHECK) after the install; the node ends when it succeeded, fails when it failed', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    const t = T0 + 10_000;
    await w.restart({ maxUnavailable: 1, healthConfigId: w.health, maxFailures: 1 }, t);
    await w.result('w0', true, t + 1);
    await w.result('w0', true, t + 2);
    const n0 = w.node('w0');
    expect(n0.phase).toBe('checking');
    const d = w.data.deployment(n0.healthDeploymentId!)!;
    expect(d).toMatchObject({ configId: w.health, clusterRole: 'health', actions: ['CHECK'] });
    expect(d.current).toMatchObject({ action: 'CHECK', status: 'IN_PROGRESS' });
    expect(w.node('w1').phase).toBe('pending'); // the slot is still w0's
    await w.result('w0', true, t + 3);
    expect(w.node('w0').phase).toBe('complete');
    await w.result('w1', true, t + 4);
    await w.result('w1', true, t + 5);
    await w.result('w1', false, t + 6); // its health check fails
    expect(w.node('w1')).toMatchObject({ phase: 'failed', reason: 'check: Deployment to server failed: exploded' });
    expect(w.cluster().head.status).toBe('RESTART_FAILED');
  });

  it('fails a health check past its deadline', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 1 }]);
    const t = T0 + 10_000;
    await w.restart({ healthConfigId: w.health }, t);
    await w.result('w0', true, t + 1);
    await w.result('w0', true, t + 2);
    await w.tick(t + 2 + 60_000);
    expect(w.node('w0').phase).toBe('failed');
    expect(w.node('w0').reason).toMatch(/^check: no result within the step deadline/);
    expect(w.cluster().head.status).toBe('RESTART_FAILED');
  });
});

describe('rollout: one group, and the plan', () => {
  it('restarts only the groups asked for and leaves the others untouched', async () => {
    const w = await world([
      { name: 'm', role: 'master', n: 1 },
      { name: 'w', role: 'worker', n: 2 },
    ]);
    const before = w.data.deployment(w.node('m0').installDeploymentId)!.current.revision;
    await w.restart({ nodegroups: ['w'] }, T0 + 10_000);
    expect(w.busy()).toEqual(['w0', 'w1']);
    await w.drive(T0 + 10_000);
    expect(w.cluster().head.status).toBe('RESTART_COMPLETE');
    expect(w.cluster().head.statusReason).toBe('restart complete on 2 node(s) in 1 group(s)');
    expect(w.node('m0').phase).toBe('complete');
    expect(w.data.deployment(w.node('m0').installDeploymentId)!.current.revision).toBe(before);
    // m0 never uninstalled: it has no uninstall deployment; the workers' were made by the restart
    expect(w.node('m0').uninstallDeploymentId).toBeNull();
    expect(w.data.deployment(w.node('w0').uninstallDeploymentId!)!.current).toMatchObject({
      revision: 1,
      action: 'RESTART',
    });
  });

  it('plans without changing anything, and refuses an unknown group or health config naming the field', async () => {
    const w = await world([
      { name: 'w', role: 'worker', n: 4 },
      { name: 'm', role: 'master', n: 2 },
    ]);
    const deployments = JSON.stringify([...w.data.deployments.values()]);
    const { result: plan, changes } = await w.data.run((tx) =>
      w.engine.planRestart(tx, w.id, { maxUnavailable: '50%', pauseS: 3 }),
    );
    expect(plan.rollout.groups).toEqual([
      { name: 'm', role: 'master', window: 1, quorum: 1 },
      { name: 'w', role: 'worker', window: 2 },
    ]);
    expect(plan.nodes.get('w')).toEqual(['w0', 'w1', 'w2', 'w3']);
    expect(changes.wakes).toEqual([]);
    expect(JSON.stringify([...w.data.deployments.values()])).toBe(deployments);
    expect(w.cluster().head.status).toBe('CREATE_COMPLETE');

    expect(await rejected(w.restart({ nodegroups: ['w', 'gpu'] }, T0))).toEqual({
      code: 'unknown_nodegroup',
      field: 'nodegroups.1',
    });
    expect(await rejected(w.restart({ healthConfigId: 'nope' }, T0))).toEqual({
      code: 'unknown_config',
      field: 'health_config_id',
    });
    expect(w.cluster().head.status).toBe('CREATE_COMPLETE');
  });
});

describe('node groups added and removed', () => {
  it('adds a group to an idle cluster: its nodes install, the others are untouched, UPDATE_COMPLETE', async () => {
    const w = await world([{ name: 'm', role: 'master', n: 1 }]);
    const { install, uninstall } = w;
    const before = w.data.deployment(w.node('m0').installDeploymentId)!.current.revision;
    const g: NewNodegroup = {
      name: 'gpu',
      role: 'worker',
      nodes: ['g0', 'g1'],
      ownInstallConfigId: null,
      ownUninstallConfigId: null,
      ownInputValues: null,
      installConfigId: install,
      uninstallConfigId: uninstall,
      installInputValues: {},
    };
    await w.data.run((tx) => w.engine.addNodegroup(tx, w.id, g, WHO, T0 + 10_000));
    expect(w.cluster().head.status).toBe('UPDATE_IN_PROGRESS');
    expect(w.busy()).toEqual(['g0', 'g1']);
    expect(w.cluster().nodegroups.map((x) => x.name)).toEqual(['m', 'gpu']);
    await w.result('g0', true, T0 + 10_001);
    await w.result('g1', true, T0 + 10_002);
    expect(w.cluster().head).toMatchObject({
      status: 'UPDATE_COMPLETE',
      statusReason: 'adding node group gpu complete on 2 node(s)',
    });
    expect(w.data.deployment(w.node('m0').installDeploymentId)!.current.revision).toBe(before);
    expect(
      (await rejected(w.data.run((tx) => w.engine.addNodegroup(tx, w.id, { ...g, nodes: ['x'] }, WHO, T0)))).field,
    ).toBe('name');
    expect(
      await rejected(w.data.run((tx) => w.engine.addNodegroup(tx, w.id, { ...g, name: 'more' }, WHO, T0))),
    ).toEqual({ code: 'cluster_busy', field: 'nodes.0' });
  });

  it('removes a group: its nodes uninstall (DELETE) at once, then it and their deployments go; the last group stays', async () => {
    const w = await world([
      { name: 'm', role: 'master', n: 1 },
      { name: 'w', role: 'worker', n: 2 },
    ]);
    await w.data.run((tx) => w.engine.deleteNodegroup(tx, w.id, 'w', WHO, T0 + 10_000));
    const deps = [w.node('w0'), w.node('w1')].flatMap((n) => [n.installDeploymentId, n.uninstallDeploymentId!]);
    expect(w.busy()).toEqual(['w0', 'w1']);
    expect(w.data.deployment(w.node('w0').uninstallDeploymentId!)!.current.action).toBe('DELETE');
    await w.result('w0', true, T0 + 10_001);
    expect(w.cluster().head.status).toBe('UPDATE_IN_PROGRESS');
    await w.result('w1', true, T0 + 10_002);
    expect(w.cluster().head).toMatchObject({ status: 'UPDATE_COMPLETE' });
    expect(w.cluster().nodes.map((n) => n.node)).toEqual(['m0']);
    expect(w.cluster().nodegroups.map((g) => g.name)).toEqual(['m']);
    expect(deps.every((d) => w.data.deployment(d) === undefined)).toBe(true);
    expect((await rejected(w.data.run((tx) => w.engine.deleteNodegroup(tx, w.id, 'm', WHO, T0 + 20_000)))).code).toBe(
      'invalid_request',
    );
    expect((await rejected(w.data.run((tx) => w.engine.deleteNodegroup(tx, w.id, 'x', WHO, T0)))).code).toBe(
      'not_found',
    );
  });

  it('keeps a group whose uninstall failed: UPDATE_FAILED naming the node', async () => {
    const w = await world([
      { name: 'm', role: 'master', n: 1 },
      { name: 'w', role: 'worker', n: 1 },
    ]);
    await w.data.run((tx) => w.engine.deleteNodegroup(tx, w.id, 'w', WHO, T0 + 10_000));
    await w.result('w0', false, T0 + 10_001);
    expect(w.cluster().head.status).toBe('UPDATE_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/^removing node group w failed on w0: uninstall: /);
    expect(w.cluster().nodegroups.map((g) => g.name)).toEqual(['m', 'w']);
  });
});
