/**
 * Upgrades, revisions and the rollout rules that came with them (docs/api.md "Upgrades",
 * "Revisions", "Rollouts") on the engine and the in-memory ClusterTx: new configs rolled node by
 * node in group order within the window, the revision made stable, canaries with automatic and
 * manual promotion, on_failure pause|abort|revert, deadlines that end a rollout, the quorum of a
 * master group, the external gate's answers, the controls and the counters. No SQLite, no sockets.
 */
import { describe, expect, it } from 'vitest';
import { newCluster } from '../helpers/new-cluster.js';
import { codeOf } from '../../protocol/errors.js';
import {
  ClusterEngine,
  canaryCount,
  rolloutCounters,
  type RestartOptions,
  type RolloutControl,
} from '../../controller/clusters/engine.js';
import { planRollout, quorumCap } from '../../controller/clusters/plan.js';
import type { ConfigChange } from '../../controller/clusters/revisions.js';
import type { ClusterNodeRecord, NewNodegroup, Rollout } from '../../controller/model/records.js';
import { FakeClusterData } from './clusters-fake-tx.js';

const WHO = 'spiffe://herald.local/operator/admin';
const T0 = Date.parse('2030-01-01T00:00:00Z');

async function world(spec: Array<{ name: string; role: 'master' | 'worker'; n: number }>) {
  const data = new FakeClusterData();
  const engine = new ClusterEngine({ stepMarginS: 0 });
  const install = data.addConfig('install', 60);
  const install2 = data.addConfig('install-v2', 60);
  const uninstall = data.addConfig('uninstall', 60);
  const uninstall2 = data.addConfig('uninstall-v2', 60);
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
        inputValues: { version: '1' },
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
  /** Every step run, in order: `<node> <role> <action> <config name>`. */
  const steps: string[] = [];
  const result = (name: string, ok: boolean, nowMs: number) =>
    data.run(async (tx) => {
      const depId = depOf(node(name));
      const d = (await tx.deployment(depId))!;
      steps.push(`${name} ${d.clusterRole} ${d.current.action} ${data.configs.get(d.configId)!.name}`);
      const reason = ok ? 'Outputs received' : 'Deployment to server failed: exploded';
      await tx.recordResult(d, { status: ok ? 'COMPLETE' : 'FAILED', statusReason: reason, outputValues: {} }, nowMs);
      await engine.onStepResult(tx, { clusterId: id, node: name, deploymentId: depId, ok, reason }, nowMs);
    });
  for (const n of cluster().nodes) await result(n.node, true, T0);
  steps.length = 0;
  const upgrade = (c: ConfigChange & { undoTo?: number }, o: RestartOptions, nowMs: number) =>
    data.run((tx) => engine.upgrade(tx, id, c, o, WHO, nowMs));
  const control = (what: RolloutControl, nowMs: number) => data.run((tx) => engine.control(tx, id, what, WHO, nowMs));
  const tick = (nowMs: number) => data.run((tx) => engine.tick(tx, nowMs));
  const busy = () =>
    cluster()
      .nodes.filter((x) => ['uninstalling', 'installing', 'checking'].includes(x.phase))
      .map((x) => x.node);
  const status = () => cluster().head.status;
  const rollout = () => cluster().head.rollout!;
  /** Answers the first step in flight (`ok` decides), 1 s apart, ticking when none is, until `until` holds. */
  const drive = async (
    from: number,
    ok: (node: string) => boolean = () => true,
    until = () => !status().endsWith('_IN_PROGRESS'),
  ) => {
    const seen: string[][] = [];
    let now = from;
    for (let i = 0; i < 2_000 && !until(); i++) {
      const b = busy();
      seen.push(b);
      now += 1000;
      if (b.length > 0) await result(b[0]!, ok(b[0]!), now);
      else await tick(now);
    }
    return { seen, now };
  };
  const deployment = (depId: string) => data.deployment(depId)!;
  return {
    data,
    engine,
    id,
    install,
    install2,
    uninstall,
    uninstall2,
    health,
    cluster,
    node,
    result,
    upgrade,
    control,
    tick,
    busy,
    status,
    rollout,
    drive,
    steps,
    deployment,
  };
}

async function rejected(p: Promise<unknown>): Promise<{ code: string | undefined; field: unknown }> {
  try {
    await p;
  } catch (err) {
    return { code: codeOf(err), field: (err as { field?: unknown }).field };
  }
  return { code: undefined, field: undefined };
}

describe('upgrade: new configs rolled node by node', () => {
  it('uninstalls the old and installs the new on each node (UPDATE), masters first, within the window; the revision becomes stable', async () => {
    const w = await world([
      { name: 'w', role: 'worker', n: 3 },
      { name: 'm', role: 'master', n: 3 },
    ]);
    const t = T0 + 10_000;
    const rev = await w.upgrade(
      { installConfigId: w.install2, uninstallConfigId: w.uninstall2, inputValues: { version: '2' } },
      { maxUnavailable: 2 },
      t,
    );
    expect(rev.result).toBe(2);
    expect(w.status()).toBe('UPDATE_IN_PROGRESS');
    const { seen } = await w.drive(t);
    expect(w.status()).toBe('UPDATE_COMPLETE');
    expect(w.cluster().head.statusReason).toBe('update complete on 6 node(s) to revision 2');
    // masters one at a time (the quorum of 3 is 1, whatever max_unavailable says), then workers two at a time
    for (const b of seen) {
      const groups = new Set(b.map((n) => n[0]));
      expect(groups.size).toBeLessThanOrEqual(1);
      if (groups.has('m')) expect(b.length).toBeLessThanOrEqual(1);
      else expect(b.length).toBeLessThanOrEqual(2);
    }
    const firstWorker = w.steps.findIndex((s) => s.startsWith('w'));
    expect(w.steps.slice(0, firstWorker).every((s) => s.startsWith('m'))).toBe(true);
    // each node: its old uninstall config, then the new install config, both UPDATE
    for (const n of ['m0', 'm1', 'm2', 'w0', 'w1', 'w2'])
      expect(w.steps.filter((s) => s.startsWith(`${n} `))).toEqual([
        `${n} uninstall UPDATE uninstall`,
        `${n} install UPDATE install-v2`,
      ]);
    for (const n of w.cluster().nodes) {
      expect(n.revision).toBe(2);
      const d = w.deployment(n.installDeploymentId);
      expect(d.configId).toBe(w.install2);
      expect(d.current.inputValues).toEqual({ version: '2' });
      // the old uninstall deployment went: the next uninstall makes one of the new configs
      expect(n.uninstallDeploymentId).toBeNull();
    }
    expect(w.cluster().revisions.map((r) => [r.revision, r.stableAt !== null])).toEqual([
      [1, true],
      [2, true],
    ]);
    expect(w.data.audit.map((a) => a.action)).toContain('cluster.upgrade');
  });

  it("a group's upgrade rolls that group only; the others have the new revision at once, nothing run", async () => {
    const w = await world([
      { name: 'm', role: 'master', n: 1 },
      { name: 'w', role: 'worker', n: 2 },
    ]);
    await w.upgrade({ nodegroup: 'w', installConfigId: w.install2 }, {}, T0 + 10_000);
    expect(w.node('m0').phase).toBe('complete');
    await w.drive(T0 + 10_000);
    expect(w.status()).toBe('UPDATE_COMPLETE');
    expect(w.steps.some((s) => s.startsWith('m0'))).toBe(false);
    expect(w.cluster().nodes.map((n) => n.revision)).toEqual([2, 2, 2]);
    expect(w.deployment(w.node('m0').installDeploymentId).configId).toBe(w.install);
    expect(w.deployment(w.node('w0').installDeploymentId).configId).toBe(w.install2);
    expect(w.cluster().nodegroups.find((g) => g.name === 'w')!.installConfigId).toBe(w.install2);
  });

  it('a node added later gets the new configs; a later restart uninstalls with the new uninstall config', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 1 }]);
    await w.upgrade({ installConfigId: w.install2, uninstallConfigId: w.uninstall2 }, {}, T0 + 10_000);
    await w.drive(T0 + 10_000);
    await w.data.run((tx) => w.engine.restart(tx, w.id, {}, WHO, T0 + 100_000));
    await w.drive(T0 + 100_000);
    expect(w.steps.slice(-2)).toEqual(['w0 uninstall RESTART uninstall-v2', 'w0 install RESTART install-v2']);
  });

  it('refuses a change that changes no node, an unknown config, and a revert with no stable revision', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    expect((await rejected(w.upgrade({ inputValues: { version: '1' } }, {}, T0 + 1))).code).toBe('no_change');
    expect(await rejected(w.upgrade({ installConfigId: 'nope' }, {}, T0 + 1))).toEqual({
      code: 'unknown_config',
      field: 'install_config_id',
    });
    expect(w.cluster().revisions.length).toBe(1);
    expect(w.status()).toBe('CREATE_COMPLETE');
  });

  it('an undo rolls an earlier revision as a new one; its default is the last stable revision before', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    await w.upgrade({ installConfigId: w.install2 }, {}, T0 + 10_000);
    await w.drive(T0 + 10_000);
    const to = await w.data.run((tx) => w.engine.undoTarget(tx, w.id));
    expect(to.result).toBe(1);
    await w.upgrade({ undoTo: 1 }, {}, T0 + 50_000);
    await w.drive(T0 + 50_000);
    expect(w.status()).toBe('UPDATE_COMPLETE');
    expect(w.cluster().head.revision).toBe(3);
    expect(w.cluster().revisions[2]).toMatchObject({ revision: 3, sourceRevision: 1, installConfigId: w.install });
    expect(w.deployment(w.node('w0').installDeploymentId).configId).toBe(w.install);
    expect(w.data.audit.map((a) => a.action)).toContain('cluster.undo');
  });
});

describe('canaries and promotion', () => {
  it('canaries go first, then the rollout waits; auto_promote_s after they completed it goes on', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 4 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { canary: 1, autoPromoteS: 30, maxUnavailable: 4 }, t);
    expect(w.busy()).toEqual(['w0']);
    await w.result('w0', true, t + 1000);
    await w.result('w0', true, t + 2000); // canary done at t+2000
    expect(w.busy()).toEqual([]);
    await w.tick(t + 2000 + 29_999);
    expect(w.busy()).toEqual([]);
    expect(w.rollout().state?.promoted).toBeNull();
    await w.tick(t + 2000 + 30_000);
    expect(w.rollout().state?.promoted?.by).toBe('auto');
    expect(w.busy()).toEqual(['w1', 'w2', 'w3']);
  });

  it('without auto_promote_s the canaries wait for a promote, past any progress deadline', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { canary: '50%', progressDeadlineS: 60 }, t);
    expect(w.rollout().canaries).toEqual(['w0']);
    await w.result('w0', true, t + 1);
    await w.result('w0', true, t + 2);
    await w.tick(t + 3_600_000);
    expect(w.status()).toBe('UPDATE_IN_PROGRESS');
    expect(w.busy()).toEqual([]);
    await w.control('promote', t + 3_600_001);
    expect(w.busy()).toEqual(['w1', 'w2']);
    expect(w.data.audit.map((a) => a.action)).toContain('cluster.promote');
    expect((await rejected(w.control('promote', t + 3_600_002))).code).toBe('not_promotable');
  });

  it('a failed canary fails the rollout whatever max_failures says', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    await w.upgrade({ installConfigId: w.install2 }, { canary: 1, maxFailures: 5 }, T0 + 10_000);
    await w.result('w0', false, T0 + 10_001);
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(['w1', 'w2'].map((n) => w.node(n).phase)).toEqual(['pending', 'pending']);
  });

  it('a failed canary paused by on_failure never stalls past its progress deadline; resumed, it waits for a promote', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { canary: 1, onFailure: 'pause', progressDeadlineS: 100 }, t);
    await w.result('w0', false, t + 1_000);
    expect(w.rollout().state?.paused?.failure).toBe(true);
    await w.tick(t + 99_999);
    expect(w.status()).toBe('UPDATE_IN_PROGRESS');
    await w.tick(t + 100_000);
    expect(w.status()).toBe('UPDATE_FAILED');

    const v = await world([{ name: 'w', role: 'worker', n: 3 }]);
    await v.upgrade({ installConfigId: v.install2 }, { canary: 1, onFailure: 'pause', autoPromoteS: 0 }, t);
    await v.result('w0', false, t + 1_000);
    await v.control('resume', t + 2_000);
    // the failure forgiven, the canaries' outcome is the operator's to judge: no automatic promotion
    await v.tick(t + 3_000);
    expect(v.status()).toBe('UPDATE_IN_PROGRESS');
    expect(v.busy()).toEqual([]);
    await v.control('promote', t + 4_000);
    expect(v.busy()).toEqual(['w1', 'w2']);
  });

  it('counts canaries per group: a count, or a percentage of the nodes changed, at least 1', () => {
    expect(canaryCount(1, 5)).toBe(1);
    expect(canaryCount(9, 5)).toBe(5);
    expect(canaryCount('10%', 5)).toBe(1);
    expect(canaryCount('40%', 10)).toBe(4);
    expect(canaryCount(null, 5)).toBe(0);
    expect(canaryCount(1, 0)).toBe(0);
  });
});

describe('on_failure', () => {
  it('revert: the changed nodes go back to the stable revision at once (every group, full window, no canary); UPDATE_FAILED names them', async () => {
    const w = await world([
      { name: 'm', role: 'master', n: 3 },
      { name: 'w', role: 'worker', n: 4 },
    ]);
    const t = T0 + 10_000;
    await w.upgrade(
      { installConfigId: w.install2, uninstallConfigId: w.uninstall2 },
      { onFailure: 'revert', healthConfigId: w.health, maxUnavailable: 2, canary: 1, autoPromoteS: 0 },
      t,
    );
    // m0 (canary), m1, m2 and w0 go to revision 2; w1's health check fails
    const { now } = await w.drive(
      t,
      (n) => !(n === 'w1' && w.node('w1').phase === 'checking'),
      () => w.rollout().state?.revert != null,
    );
    const revert = w.rollout().state!.revert!;
    expect(revert.revision).toBe(1);
    // every node whose pass started (w2 took w0's slot while w1 was checked); w3 never started
    expect([...revert.nodes].sort()).toEqual(['m0', 'm1', 'm2', 'w0', 'w1', 'w2']);
    // at once: both groups together, each at its full window (masters one at a time: their quorum; workers 2)
    const b = w.busy();
    expect(b.filter((n) => n.startsWith('m')).length).toBe(1);
    expect(b.filter((n) => n.startsWith('w')).length).toBe(2);
    for (const n of revert.nodes) expect(w.node(n).phase === 'pending' || b.includes(n), n).toBe(true);
    await w.drive(now);
    expect(w.status()).toBe('UPDATE_FAILED');
    const reason = w.cluster().head.statusReason;
    expect(reason).toMatch(/^update failed on w1: check: /);
    expect(reason).toMatch(/reverted to revision 1: /);
    for (const n of revert.nodes) {
      expect(reason).toContain(n);
      expect(w.node(n).revision).toBe(1);
      expect(w.deployment(w.node(n).installDeploymentId).configId).toBe(w.install);
    }
    // a reverted node: uninstall of the new, install of the stable revision's configs
    expect(w.steps.filter((s) => s.startsWith('w1 ')).slice(-3)).toEqual([
      'w1 uninstall UPDATE uninstall-v2',
      'w1 install UPDATE install',
      'w1 health CHECK health',
    ]);
    expect(w.node('w3').phase).toBe('pending');
    const k = rolloutCounters(w.rollout(), w.cluster().nodes);
    expect(k).toMatchObject({ failed: 1, reverted: revert.nodes.length, inFlight: 0 });
  });

  it('revert names the nodes whose revert failed', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { onFailure: 'revert', maxUnavailable: 1 }, t);
    let failures = 0;
    // w0 upgrades; w1 fails its install; in the revert w0's uninstall fails
    await w.drive(t, (n) => {
      if (n === 'w1' && w.node('w1').phase === 'installing' && !w.rollout().state?.revert) return false;
      if (n === 'w0' && w.rollout().state?.revert && failures++ === 0) return false;
      return true;
    });
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/revert failed on w0: uninstall: /);
    expect(w.cluster().head.statusReason).toMatch(/reverted to revision 1: w1/);
  });

  it('pause: waits for an operator once the budget is spent; resume forgives the failures so far', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { onFailure: 'pause', maxUnavailable: 1 }, t);
    await w.result('w0', false, t + 1);
    expect(w.status()).toBe('UPDATE_IN_PROGRESS');
    expect(w.rollout().state?.paused?.failure).toBe(true);
    await w.tick(t + 5_000);
    expect(w.busy()).toEqual([]);
    await w.control('resume', t + 6_000);
    expect(w.busy()).toEqual(['w1']);
    await w.drive(t + 6_000);
    expect(w.status()).toBe('UPDATE_FAILED'); // w0 failed, even forgiven
    expect(w.node('w2').phase).toBe('complete');
  });

  it('a failure pause still ends at the progress deadline', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    const t = T0 + 10_000;
    await w.upgrade(
      { installConfigId: w.install2 },
      { onFailure: 'pause', progressDeadlineS: 100, maxUnavailable: 1 },
      t,
    );
    await w.result('w0', false, t + 1);
    await w.tick(t + 99_000);
    expect(w.status()).toBe('UPDATE_IN_PROGRESS');
    await w.tick(t + 100_000);
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/no progress within the progress deadline \(100 s\)/);
  });
});

describe('controls', () => {
  it('pause stops new nodes from starting (those in flight finish); resume goes on; each is audited with who', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { maxUnavailable: 1 }, t);
    await w.control('pause', t + 1);
    await w.result('w0', true, t + 2);
    await w.result('w0', true, t + 3);
    await w.tick(t + 60_000);
    expect(w.busy()).toEqual([]);
    expect(w.node('w1').phase).toBe('pending');
    await w.control('pause', t + 60_001); // again: nothing changes
    await w.control('resume', t + 60_002);
    expect(w.busy()).toEqual(['w1']);
    expect(w.data.audit.filter((a) => a.action.startsWith('cluster.p') || a.action === 'cluster.resume')).toEqual([
      { who: WHO, action: 'cluster.pause', target: w.id },
      { who: WHO, action: 'cluster.pause', target: w.id },
      { who: WHO, action: 'cluster.resume', target: w.id },
    ]);
  });

  it('abort stops new nodes; the operation ends failed once none is in flight; a plain restart takes controls too', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 3 }]);
    const t = T0 + 10_000;
    await w.data.run((tx) => w.engine.restart(tx, w.id, 1, WHO, t));
    expect(w.rollout().plain).toBe(true);
    await w.control('abort', t + 1);
    expect(w.status()).toBe('RESTART_IN_PROGRESS');
    await w.result('w0', true, t + 2);
    await w.result('w0', true, t + 3);
    expect(w.status()).toBe('RESTART_FAILED');
    expect(w.cluster().head.statusReason).toBe(`restart aborted by ${WHO} (2 node(s) not started)`);
    expect((await rejected(w.control('pause', t + 4))).code).toBe('no_operation');
  });
});

describe('deadlines that always end', () => {
  it("a node past node_deadline_s fails timed out, though its step's own deadline is later", async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 1 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { nodeDeadlineS: 30 }, t);
    await w.result('w0', true, t + 20_000);
    await w.tick(t + 30_000);
    expect(w.node('w0')).toMatchObject({ phase: 'failed' });
    expect(w.node('w0').reason).toMatch(/^install: node deadline \(30 s\) passed/);
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(rolloutCounters(w.rollout(), w.cluster().nodes)).toMatchObject({ failed: 1, timedOut: 1 });
  });

  it('the progress deadline ends a rollout whose gate never opens', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 1 }]);
    const t = T0 + 10_000;
    await w.upgrade(
      { installConfigId: w.install2 },
      { progressDeadlineS: 50, gate: { kind: 'url', url: 'https://gate.example/ok', failOpen: false } },
      t,
    );
    for (let s = 1; s < 50; s += 5) {
      const gates = (await w.tick(t + s * 1000)).result;
      for (const g of gates)
        await w.data.run((tx) =>
          w.engine.recordGate(
            tx,
            g.clusterId,
            { verdict: 'stop', atMs: t + s * 1000, detail: 'HTTP 503', error: false },
            t + s * 1000,
          ),
        );
    }
    expect(w.node('w0').phase).toBe('pending');
    await w.tick(t + 50_000);
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/progress deadline/);
  });
});

describe('quorum of a master group', () => {
  it('is max(1, ⌊(n−1)/2⌋)', () => {
    expect([1, 2, 3, 4, 5, 6, 7].map(quorumCap)).toEqual([1, 1, 1, 1, 2, 2, 3]);
  });

  it('holds whatever max_unavailable says; force lifts it; a restart keeps it too', async () => {
    const w = await world([{ name: 'm', role: 'master', n: 5 }]);
    await w.data.run((tx) => w.engine.restart(tx, w.id, { maxUnavailable: 5 }, WHO, T0 + 10_000));
    expect(w.rollout().groups[0]).toMatchObject({ window: 2, quorum: 2 });
    const { seen } = await w.drive(T0 + 10_000);
    expect(Math.max(...seen.map((b) => b.length))).toBe(2);
    const plan = await w.data.run((tx) => w.engine.planRestart(tx, w.id, { maxUnavailable: 5, force: true }));
    expect(plan.result.rollout.groups[0]!.window).toBe(5);
  });

  it('a failed master counts as down: the others wait, and the rollout ends failed rather than break quorum', async () => {
    const w = await world([{ name: 'm', role: 'master', n: 3 }]);
    const t = T0 + 10_000;
    await w.upgrade({ installConfigId: w.install2 }, { maxFailures: 2 }, t);
    await w.result('m0', false, t + 1);
    expect(w.busy()).toEqual([]);
    expect(w.status()).toBe('UPDATE_FAILED');
    expect(w.cluster().head.statusReason).toMatch(/quorum of master group m/);
  });
});

describe('the external gate', () => {
  it('asks for an answer before nodes start; a go admits one plan of starts, a stop none', async () => {
    const w = await world([{ name: 'w', role: 'worker', n: 2 }]);
    const t = T0 + 10_000;
    const gate = { kind: 'url' as const, url: 'https://gate.example/ok', failOpen: false };
    await w.upgrade({ installConfigId: w.install2 }, { maxUnavailable: 1, gate }, t);
    expect(w.busy()).toEqual([]);
    expect(w.rollout().state?.gateWantedAtMs).toBe(t);
    const asked = (await w.tick(t + 1000)).result;
    expect(asked).toEqual([{ clusterId: w.id, gate }]);
    await w.data.run((tx) =>
      w.engine.recordGate(tx, w.id, { verdict: 'stop', atMs: t + 1000, detail: 'HTTP 503', error: false }, t + 1000),
    );
    expect(w.busy()).toEqual([]);
    expect((await w.tick(t + 2000)).result).toEqual([]); // asked again only GATE_RETRY_INTERVAL_MS after a stop
    expect((await w.tick(t + 3000)).result.length).toBe(1);
    await w.data.run((tx) =>
      w.engine.recordGate(tx, w.id, { verdict: 'go', atMs: t + 3000, detail: 'HTTP 200', error: false }, t + 3000),
    );
    expect(w.busy()).toEqual(['w0']);
    expect(w.rollout().state?.gate?.used).toBe(true);
    await w.result('w0', true, t + 4000);
    await w.result('w0', true, t + 5000);
    expect(w.busy()).toEqual([]); // w1 waits for a new answer
    expect((await w.tick(t + 6000)).result.length).toBe(1);
  });
});

describe('planRollout', () => {
  it('never starts a node in a revert outside the nodes it brings back', () => {
    const r: Rollout = {
      groups: [{ name: 'w', role: 'worker', window: 5 }],
      pauseS: 0,
      maxFailures: 0,
      healthConfigId: null,
      plain: false,
      upgrade: { revision: 2, from: 1, stable: 1 },
      state: {
        progressAtMs: 0,
        paused: null,
        forgiven: 0,
        aborted: null,
        expired: null,
        promoted: null,
        gate: null,
        gateWantedAtMs: null,
        revert: { revision: 1, atMs: 0, nodes: ['a'], before: { completed: 0, failed: 1, timedOut: 0 }, why: 'x' },
      },
    };
    const nodes = ['a', 'b'].map((node, position) => ({
      node,
      position,
      phase: 'pending' as const,
      stepDeadlineMs: null,
      reason: null,
      nodegroup: 'w',
    }));
    expect(planRollout(r, nodes, 1)).toEqual([{ type: 'start', node: 'a', step: 'uninstall' }]);
  });
});
