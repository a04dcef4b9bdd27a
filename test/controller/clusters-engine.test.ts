/**
 * The cluster engine (controller/clusters/engine.ts) against an in-memory ClusterTx
 * (clusters-fake-tx.ts): no SQLite, no sockets, milliseconds. Create, a restart's sliding
 * window, failure, deadlines, delete, late results and a step started with no budget left.
 */
import { describe, expect, it } from 'vitest';
import { newCluster } from '../helpers/new-cluster.js';
import { codeOf } from '../../protocol/errors.js';
import { ClusterEngine, stepBudgetMs } from '../../controller/clusters/engine.js';
import { FakeClusterData } from './clusters-fake-tx.js';

const WHO = 'spiffe://herald.local/operator/admin';
const T0 = Date.parse('2030-01-01T00:00:00Z');
const STEP_MS = 10_000;

/** A fake world with `n` nodes, configs of STEP_MS / 1000 s, and an engine without margin. */
function world(n: number, o: { timeoutS?: number; marginS?: number } = {}) {
  const data = new FakeClusterData();
  const engine = new ClusterEngine({ stepMarginS: o.marginS ?? 0 });
  const install = data.addConfig('install', o.timeoutS ?? STEP_MS / 1000);
  const uninstall = data.addConfig('uninstall', o.timeoutS ?? STEP_MS / 1000);
  const nodes = Array.from({ length: n }, (_, i) => `n${i}`);

  const create = async (nowMs = T0) => {
    const r = await data.run((tx) =>
      engine.create(tx, newCluster({ nodes, installConfigId: install, uninstallConfigId: uninstall }), WHO, nowMs),
    );
    return { id: r.result.id, changes: r.changes };
  };
  const cluster = (id: string) => data.cluster(id)!;
  const phases = (id: string) => cluster(id).nodes.map((x) => x.phase);
  /** The agent's result for `node`'s step in flight, as signal.ts records it: the revision's result, then the engine. */
  const result = (id: string, node: string, ok: boolean, nowMs: number, step?: 'install' | 'uninstall') =>
    data.run(async (tx) => {
      const n = cluster(id).nodes.find((x) => x.node === node)!;
      const which = step ?? (n.phase === 'installing' ? 'install' : 'uninstall');
      const depId = which === 'install' ? n.installDeploymentId : n.uninstallDeploymentId!;
      const d = (await tx.deployment(depId))!;
      const reason = ok ? 'Outputs received' : 'Deployment to server failed: exploded';
      await tx.recordResult(d, { status: ok ? 'COMPLETE' : 'FAILED', statusReason: reason, outputValues: {} }, nowMs);
      await engine.onStepResult(tx, { clusterId: id, node, deploymentId: depId, ok, reason }, nowMs);
    });
  const restart = (id: string, max: number | null, nowMs: number) =>
    data.run((tx) => engine.restart(tx, id, max, WHO, nowMs));
  const tick = (nowMs: number) => data.run((tx) => engine.tick(tx, nowMs));
  /** Every node in a step answers `ok` until the cluster is idle; returns the most nodes in a step at once. */
  const drive = async (id: string, nowMs: number, ok: (node: string) => boolean = () => true) => {
    let most = 0;
    for (;;) {
      const busy = cluster(id).nodes.filter((x) => x.phase === 'uninstalling' || x.phase === 'installing');
      most = Math.max(most, busy.length);
      if (busy.length === 0) return most;
      for (const x of busy) await result(id, x.node, ok(x.node), nowMs);
    }
  };
  return { data, engine, nodes, install, uninstall, create, cluster, phases, result, restart, tick, drive };
}

async function rejectedCode(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    return codeOf(err);
  }
  return undefined;
}

describe('cluster engine: create', () => {
  it('installs everywhere at once with one deadline, wakes every node, and audits', async () => {
    const w = world(3);
    const { id, changes } = await w.create();
    const c = w.cluster(id);
    expect(c.head).toMatchObject({ status: 'CREATE_IN_PROGRESS', operation: 'create', maxUnavailable: 3 });
    expect(c.nodes.every((n) => n.phase === 'installing' && n.stepDeadlineMs === T0 + STEP_MS)).toBe(true);
    expect(changes.wakes.map((x) => `${x.node}:${x.reason}`)).toEqual([
      'n0:deployment',
      'n1:deployment',
      'n2:deployment',
    ]);
    expect(changes.clusters).toEqual([id]);
    // the installs alone: an uninstall deployment is made at the node's first uninstall (as Heat
    // makes none for CREATE, which is not among its actions)
    expect(changes.deployments).toEqual(c.nodes.map((n) => n.installDeploymentId));
    expect(c.nodes.map((n) => n.uninstallDeploymentId)).toEqual([null, null, null]);
    expect([...w.data.deployments.values()].map((e) => e.d.clusterRole)).toEqual(['install', 'install', 'install']);
    expect(w.data.audit).toEqual([{ who: WHO, action: 'cluster.create', target: id }]);
  });

  it('is CREATE_COMPLETE when every install succeeded, CREATE_FAILED naming the node otherwise', async () => {
    const good = world(2);
    const a = await good.create();
    await good.result(a.id, 'n0', true, T0 + 1);
    expect(good.cluster(a.id).head.status).toBe('CREATE_IN_PROGRESS');
    await good.result(a.id, 'n1', true, T0 + 2);
    expect(good.cluster(a.id).head).toMatchObject({
      status: 'CREATE_COMPLETE',
      statusReason: 'create complete on 2 node(s)',
    });

    const bad = world(2);
    const b = await bad.create();
    await bad.result(b.id, 'n1', false, T0 + 1);
    await bad.result(b.id, 'n0', true, T0 + 2);
    expect(bad.cluster(b.id).head).toMatchObject({
      status: 'CREATE_FAILED',
      statusReason: 'create failed on n1: install: Deployment to server failed: exploded',
    });
  });

  it('refuses an unknown install config before anything is written', async () => {
    const w = world(1);
    const code = await rejectedCode(
      w.data.run((tx) =>
        w.engine.create(
          tx,
          {
            name: 'k',
            nodes: ['n0'],
            installConfigId: 'nope',
            uninstallConfigId: w.uninstall,
            installInputValues: {},

            inputValues: {},
          },
          WHO,
          T0,
        ),
      ),
    );
    expect(code).toBe('unknown_config');
    expect(w.data.clusters.size).toBe(0);
  });

  it('computes a step budget from the hook timeout plus the margin', () => {
    const w = world(1, { timeoutS: 7 });
    expect(stepBudgetMs(w.data.configs.get(w.install)!, 3)).toBe(10_000);
    expect(() => new ClusterEngine({ stepMarginS: Number.NaN })).toThrow(TypeError);
  });
});

describe('cluster engine: restart', () => {
  it('keeps at most max_unavailable nodes in a step, uninstall before install, in position order', async () => {
    const w = world(5);
    const { id } = await w.create();
    await w.drive(id, T0 + 1);
    expect(w.cluster(id).head.status).toBe('CREATE_COMPLETE');

    const r = await w.restart(id, 2, T0 + 10);
    expect(w.phases(id)).toEqual(['uninstalling', 'uninstalling', 'pending', 'pending', 'pending']);
    expect(r.changes.wakes.map((x) => `${x.node}:${x.reason}`)).toEqual(['n0:restart', 'n1:restart']);
    expect(w.cluster(id).head).toMatchObject({ status: 'RESTART_IN_PROGRESS', maxUnavailable: 2 });

    // the uninstall's success starts the install in the same transaction; the window stays full
    const u = await w.result(id, 'n0', true, T0 + 11);
    expect(u.changes.wakes.map((x) => `${x.node}:${x.reason}`)).toEqual(['n0:restart']);
    expect(w.phases(id)).toEqual(['installing', 'uninstalling', 'pending', 'pending', 'pending']);
    // the install's success frees a slot: the next pending node starts
    await w.result(id, 'n0', true, T0 + 12);
    expect(w.phases(id)).toEqual(['complete', 'uninstalling', 'uninstalling', 'pending', 'pending']);

    expect(await w.drive(id, T0 + 13)).toBeLessThanOrEqual(2);
    expect(w.cluster(id).head).toMatchObject({
      status: 'RESTART_COMPLETE',
      statusReason: 'restart complete on 5 node(s)',
    });
    for (const n of w.cluster(id).nodes) {
      // made by the restart, its first revision the restart's
      expect(w.data.deployment(n.uninstallDeploymentId!)).toMatchObject({
        clusterRole: 'uninstall',
        configId: w.uninstall,
        current: { revision: 1, action: 'RESTART' },
      });
      expect(w.data.deployment(n.installDeploymentId)!.current).toMatchObject({ revision: 2, action: 'RESTART' });
    }
  });

  it('a signal that cannot change the plan reads the head, its node and a glance, never the whole cluster', async () => {
    const w = world(50);
    const { id } = await w.create();
    await w.drive(id, T0 + 1);
    await w.restart(id, 10, T0 + 10);
    w.data.reads.clear();
    await w.result(id, 'n3', true, T0 + 11); // uninstall done, install started: the window is still full
    expect(w.data.reads.get('clusterNodes')).toBeUndefined();
    expect(w.data.reads.get('clusterNode')).toBe(1);
    w.data.reads.clear();
    await w.result(id, 'n3', true, T0 + 12); // a slot frees: the in-flight nodes and one pending are read
    expect(w.data.reads.get('clusterNodes')).toBeUndefined();
    expect(w.data.reads.get('firstPending')).toBe(1);
    expect(w.phases(id).filter((p) => p === 'uninstalling' || p === 'installing').length).toBe(10);
  });

  it('after a failure starts no one new and ends RESTART_FAILED once the steps in flight finish', async () => {
    const w = world(5);
    const { id } = await w.create();
    await w.drive(id, T0 + 1);
    await w.restart(id, 2, T0 + 10);
    await w.result(id, 'n0', true, T0 + 11); // n0 installing
    await w.result(id, 'n0', false, T0 + 12); // n0's install fails
    expect(w.phases(id)).toEqual(['failed', 'uninstalling', 'pending', 'pending', 'pending']);
    expect(w.cluster(id).head.status).toBe('RESTART_IN_PROGRESS'); // n1 is still in flight
    await w.drive(id, T0 + 13);
    const c = w.cluster(id);
    expect(c.nodes.map((n) => n.phase)).toEqual(['failed', 'complete', 'pending', 'pending', 'pending']);
    expect(c.head).toMatchObject({
      status: 'RESTART_FAILED',
      statusReason: 'restart failed on n0: install: Deployment to server failed: exploded',
    });
    // a restart from the failed state repairs
    await w.restart(id, null, T0 + 20);
    await w.drive(id, T0 + 21);
    expect(w.cluster(id).head.status).toBe('RESTART_COMPLETE');
  });

  it('refuses a restart or a delete while an operation runs, and an unknown cluster', async () => {
    const w = world(2);
    const { id } = await w.create();
    expect(await rejectedCode(w.restart(id, null, T0 + 1))).toBe('restart_in_progress');
    expect(await rejectedCode(w.data.run((tx) => w.engine.delete(tx, id, WHO, T0 + 1)))).toBe('restart_in_progress');
    expect(await rejectedCode(w.restart('nope', null, T0 + 1))).toBe('not_found');
  });
});

describe('cluster engine: deadlines', () => {
  it('a tick fails every step past its deadline (and only those), recording the timeout as the result', async () => {
    const w = world(3);
    const { id } = await w.create();
    await w.result(id, 'n0', true, T0 + 1);
    const early = await w.tick(T0 + STEP_MS - 1);
    expect(early.changes.generation).toBeNull();
    expect(early.changes.clusters).toEqual([]);

    const late = await w.tick(T0 + STEP_MS);
    expect(late.changes.clusters).toEqual([id]);
    const c = w.cluster(id);
    expect(c.nodes.map((n) => n.phase)).toEqual(['complete', 'failed', 'failed']);
    expect(c.nodes[1]!.reason).toBe('install: no result within the step deadline (10 s)');
    expect(c.head.status).toBe('CREATE_FAILED');
    // the timed-out revision holds a FAILED result: a late signal would be a duplicate
    expect(w.data.deployment(c.nodes[2]!.installDeploymentId)!.current).toMatchObject({
      status: 'FAILED',
      signalled: true,
    });
    // nothing in flight: a tick now claims no cluster and changes nothing
    expect((await w.tick(T0 + 10 * STEP_MS)).changes.generation).toBeNull();
  });

  it('a step started with no budget left fails before any other node of the window starts', async () => {
    // a hook timeout of 1 s and a margin of -1 s: a step's deadline is the moment it starts
    const w = world(5, { timeoutS: 1, marginS: -1 });
    const { id } = await w.create();
    await w.tick(T0);
    expect(w.cluster(id).head.status).toBe('CREATE_FAILED');
    await w.restart(id, 3, T0 + 1);
    const c = w.cluster(id);
    expect(c.head.status).toBe('RESTART_FAILED');
    expect(c.nodes.map((n) => n.phase)).toEqual(['failed', 'pending', 'pending', 'pending', 'pending']);
    expect(c.head.statusReason).toBe('restart failed on n0: uninstall: no result within the step deadline (0 s)');
  });
});

describe('cluster engine: delete', () => {
  it('uninstalls (DELETE) everywhere, then removes the cluster and its deployments', async () => {
    const w = world(3);
    const { id } = await w.create();
    await w.drive(id, T0 + 1);
    const del = await w.data.run((tx) => w.engine.delete(tx, id, WHO, T0 + 10));
    const deps = w.cluster(id).nodes.flatMap((n) => [n.installDeploymentId, n.uninstallDeploymentId!]);
    expect(w.cluster(id).head.status).toBe('DELETE_IN_PROGRESS');
    expect(w.phases(id)).toEqual(['uninstalling', 'uninstalling', 'uninstalling']);
    expect(del.changes.wakes.map((x) => x.reason)).toEqual(['deployment', 'deployment', 'deployment']);
    expect(w.data.deployment(w.cluster(id).nodes[0]!.uninstallDeploymentId!)!.current).toMatchObject({
      revision: 1,
      action: 'DELETE',
    });
    await w.result(id, 'n0', true, T0 + 11);
    expect(w.phases(id)).toEqual(['complete', 'uninstalling', 'uninstalling']);
    await w.result(id, 'n1', true, T0 + 12);
    const last = await w.result(id, 'n2', true, T0 + 13);
    expect(w.data.cluster(id)).toBeUndefined();
    expect(last.changes.removedClusters).toEqual([id]);
    expect(last.changes.clusters).toEqual([]);
    expect([...last.changes.removedDeployments].sort()).toEqual([...deps].sort());
    expect(last.changes.deployments).toEqual([]);
  });

  it('is DELETE_FAILED when an uninstall fails, and the cluster stays', async () => {
    const w = world(2);
    const { id } = await w.create();
    await w.drive(id, T0 + 1);
    await w.data.run((tx) => w.engine.delete(tx, id, WHO, T0 + 10));
    await w.drive(id, T0 + 11, (node) => node !== 'n1');
    expect(w.cluster(id).head).toMatchObject({
      status: 'DELETE_FAILED',
      statusReason: 'delete failed on n1: uninstall: Deployment to server failed: exploded',
    });
  });
});

describe('cluster engine: late results', () => {
  it('a result for a step no longer in flight, or after the operation ended, changes nothing', async () => {
    const w = world(2);
    const { id } = await w.create();
    await w.tick(T0 + STEP_MS); // both installs time out: CREATE_FAILED
    const n0 = w.cluster(id).nodes[0]!;
    const before = structuredClone(w.cluster(id));
    const late = await w.data.run((tx) =>
      w.engine.onStepResult(
        tx,
        { clusterId: id, node: 'n0', deploymentId: n0.installDeploymentId, ok: true, reason: 'ok' },
        T0 + STEP_MS + 1,
      ),
    );
    expect(late.changes.clusters).toEqual([]);
    expect(w.cluster(id)).toEqual(before);

    // in a restart: the install's result arriving while the node is still uninstalling
    await w.restart(id, 1, T0 + 2 * STEP_MS);
    expect(w.phases(id)).toEqual(['uninstalling', 'pending']);
    const wrongStep = await w.data.run((tx) =>
      w.engine.onStepResult(
        tx,
        { clusterId: id, node: 'n0', deploymentId: n0.installDeploymentId, ok: true, reason: 'ok' },
        T0 + 2 * STEP_MS + 1,
      ),
    );
    expect(wrongStep.changes.clusters).toEqual([]);
    expect(w.phases(id)).toEqual(['uninstalling', 'pending']);
    // and for a cluster that is gone
    const gone = await w.data.run((tx) =>
      w.engine.onStepResult(tx, { clusterId: 'nope', node: 'n0', deploymentId: 'x', ok: true, reason: 'ok' }, T0),
    );
    expect(gone.changes.clusters).toEqual([]);
  });
});
