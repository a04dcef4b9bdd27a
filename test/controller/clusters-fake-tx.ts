/**
 * An in-memory `ClusterTx` (controller/clusters/tx.ts) for the engine's unit tests: maps for
 * configs, deployments with their revisions, and clusters with their node rows. No SQL, no
 * rollback (a test that needs one uses the real store). It counts the reads it serves, so a
 * test can check what a signal costs.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { DeployAction } from '../../protocol/heat.js';
import type { WakeReason } from '../../protocol/wake.js';
import { ChangeSetBuilder } from '../../controller/model/change-set.js';
import { configsOf } from '../../controller/clusters/revisions.js';
import type {
  ClusterGlance,
  ClusterHead,
  ClusterRows,
  ClusterTx,
  DeploymentSource,
  NodeStepChange,
  StepResult,
} from '../../controller/clusters/tx.js';
import type {
  ChangeSet,
  ClusterNodeRecord,
  ClusterRecord,
  ClusterRevisionRecord,
  ClusterOperation,
  ClusterStatus,
  ConfigRecord,
  DeploymentRecord,
  NewClusterRevision,
  NewNodegroup,
  NodegroupRecord,
  RevisionRecord,
  Rollout,
} from '../../controller/model/records.js';

interface FakeCluster {
  head: ClusterHead & { name: string; statusReason: string };
  nodes: ClusterNodeRecord[];
  nodegroups: NodegroupRecord[];
  /** Its revisions, oldest first (docs/api.md "Revisions"). */
  revisions: ClusterRevisionRecord[];
  /** Each node's uninstall config (its group's, resolved), for its uninstall deployment when it is made. */
  uninstallConfigs: Map<string, string>;
}

const iso = (ms: number): string => new Date(ms).toISOString();

/** A node's row with its marks cleared, pending (a new operation's). */
const FRESH = {
  phase: 'pending',
  stepDeadlineMs: null,
  uninstallStartedAt: null,
  uninstallFinishedAt: null,
  installStartedAt: null,
  installFinishedAt: null,
  reason: null,
  checkStartedAt: null,
  endedAtMs: null,
} as const;

/** The data every fake transaction works on. */
export class FakeClusterData {
  readonly configs = new Map<string, ConfigRecord>();
  readonly deployments = new Map<string, { d: Omit<DeploymentRecord, 'current'>; revisions: RevisionRecord[] }>();
  readonly clusters = new Map<string, FakeCluster>();
  readonly audit: Array<{ who: string; action: string; target: string }> = [];
  /** Reads served, by method name. */
  readonly reads = new Map<string, number>();
  #seq = 0;

  id(prefix: string): string {
    return `${prefix}-${++this.#seq}`;
  }

  /** A config whose hook timeout is `timeoutS` seconds. */
  addConfig(name: string, timeoutS: number): string {
    const id = this.id('cfg');
    this.configs.set(id, {
      id,
      name,
      group: 'script',
      config: '',
      inputs: [],
      outputs: [],
      options: { timeout: timeoutS },
      createdAt: iso(0),
    });
    return id;
  }

  deployment(id: string): DeploymentRecord | undefined {
    const e = this.deployments.get(id);
    return e && { ...e.d, current: { ...e.revisions[e.revisions.length - 1]! } };
  }

  cluster(id: string): FakeCluster | undefined {
    return this.clusters.get(id);
  }

  read(name: string): void {
    this.reads.set(name, (this.reads.get(name) ?? 0) + 1);
  }

  /** Runs `fn` on a fresh transaction; resolves with its result and what it changed (no generation: the fake has no sequence). */
  async run<T>(fn: (tx: FakeClusterTx) => Promise<T>): Promise<{ result: T; changes: ChangeSet }> {
    const tx = new FakeClusterTx(this);
    const result = await fn(tx);
    return { result, changes: tx.changes.build(tx.changes.needsGeneration ? 1 : null) };
  }
}

export class FakeClusterTx implements ClusterTx {
  readonly changes = new ChangeSetBuilder();
  readonly #w: FakeClusterData;

  constructor(w: FakeClusterData) {
    this.#w = w;
  }

  async audit(who: string, action: string, target: string): Promise<void> {
    this.#w.audit.push({ who, action, target });
  }

  async config(id: string): Promise<ConfigRecord | undefined> {
    this.#w.read('config');
    return this.#w.configs.get(id);
  }

  async deployment(id: string): Promise<DeploymentRecord | undefined> {
    this.#w.read('deployment');
    return this.#w.deployment(id);
  }

  async newRevision(d: DeploymentRecord, action: DeployAction, reason: WakeReason): Promise<boolean> {
    return this.#revise(d.id, action, reason);
  }

  #revise(id: string, action: DeployAction, reason: WakeReason, values?: Record<string, unknown>): boolean {
    const e = this.#w.deployments.get(id)!;
    const prev = e.revisions[e.revisions.length - 1];
    const triggered = e.d.actions.includes(action);
    e.revisions.push({
      revision: (prev?.revision ?? 0) + 1,
      itemId: this.#w.id('item'),
      action,
      inputValues: values ?? prev?.inputValues ?? {},
      status: triggered ? 'IN_PROGRESS' : 'COMPLETE',
      statusReason: triggered ? 'Deploy data available' : 'not triggered',
      outputValues: null,
      signalled: !triggered,
      createdAt: iso(0),
      updatedAt: iso(0),
      signalledAt: null,
    });
    this.changes.touch(e.d.node, triggered ? reason : null);
    this.changes.deploymentChanged(id);
    return triggered;
  }

  async recordResult(d: DeploymentRecord, r: StepResult, nowMs: number): Promise<void> {
    const e = this.#w.deployments.get(d.id)!;
    const cur = e.revisions[e.revisions.length - 1]!;
    Object.assign(cur, {
      status: r.status,
      statusReason: r.statusReason,
      outputValues: r.outputValues,
      signalled: true,
      signalledAt: iso(nowMs),
    });
    this.changes.touch(d.node);
    this.changes.deploymentChanged(d.id);
  }

  async insertCluster(c: ClusterRows, nowMs: number): Promise<ClusterRecord> {
    for (const [i, n] of c.nodes.entries()) {
      for (const other of this.#w.clusters.values()) {
        if (other.nodes.some((x) => x.node === n))
          throw new HeraldError('cluster_busy', `node ${n} is in a cluster`, { field: `nodes.${i}` });
      }
    }
    const id = this.#w.id('cluster');
    const at = iso(nowMs);
    const groupOf = (node: string) => c.nodegroups.find((g) => g.nodes.includes(node))!;
    const uninstallConfigs = new Map<string, string>();
    const nodes: ClusterNodeRecord[] = c.nodes.map((node, position) => {
      const g = groupOf(node);
      uninstallConfigs.set(node, g.uninstallConfigId);
      return {
        node,
        position,
        phase: 'installing',
        installDeploymentId: this.#mkDeployment(
          id,
          c.name,
          node,
          'install',
          g.installConfigId,
          c.installActions,
          'CREATE',
          'deployment',
          at,
        ),
        uninstallDeploymentId: null,
        stepDeadlineMs: c.stepDeadlineMs,
        uninstallStartedAt: null,
        uninstallFinishedAt: null,
        installStartedAt: at,
        installFinishedAt: null,
        reason: null,
        nodegroup: g.name,
        healthDeploymentId: null,
        checkStartedAt: null,
        endedAtMs: null,
        revision: 1,
      };
    });
    const made: FakeCluster = {
      head: {
        id,
        name: c.name,
        status: 'CREATE_IN_PROGRESS',
        statusReason: 'create in progress',
        operation: 'create',
        maxUnavailable: c.nodes.length,
        updatedAt: at,
        rollout: null,
        revision: 1,
      },
      nodes,
      uninstallConfigs,
      revisions: [
        {
          revision: 1,
          installConfigId: c.installConfigId,
          uninstallConfigId: c.uninstallConfigId,
          inputValues: c.inputValues,
          nodegroups: c.nodegroups.map((g) => ({
            name: g.name,
            installConfigId: g.ownInstallConfigId,
            uninstallConfigId: g.ownUninstallConfigId,
            inputValues: g.ownInputValues,
          })),
          createdAt: at,
          createdBy: c.createdBy,
          stableAt: null,
          sourceRevision: null,
        },
      ],
      nodegroups: c.nodegroups.map((g, position) => ({
        name: g.name,
        role: g.role,
        position,
        installConfigId: g.ownInstallConfigId,
        uninstallConfigId: g.ownUninstallConfigId,
        inputValues: g.ownInputValues,
        createdAt: at,
      })),
    };
    this.#w.clusters.set(id, made);
    this.changes.clusterChanged(id);
    return {
      id,
      name: c.name,
      status: made.head.status,
      statusReason: made.head.statusReason,
      installConfigId: c.installConfigId,
      uninstallConfigId: c.uninstallConfigId,
      inputValues: c.inputValues,
      operation: made.head.operation,
      maxUnavailable: made.head.maxUnavailable,
      operationStartedAt: at,
      operationFinishedAt: null,
      createdAt: at,
      updatedAt: at,
      nodes: made.nodes,
      nodegroups: made.nodegroups,
      rollout: null,
      revision: 1,
    };
  }

  /** A cluster's deployment on `node` and its first revision, `action`; returns its id. */
  #mkDeployment(
    clusterId: string,
    clusterName: string,
    node: string,
    role: 'install' | 'uninstall',
    configId: string,
    actions: DeployAction[],
    action: DeployAction,
    reason: WakeReason,
    at: string,
  ): string {
    const depId = this.#w.id(role);
    this.#w.deployments.set(depId, {
      d: {
        id: depId,
        node,
        configId,
        name: `${clusterName}-${role}`,
        actions,
        clusterId,
        clusterRole: role,
        createdAt: at,
        updatedAt: at,
      },
      revisions: [],
    });
    this.changes.deploymentChanged(depId);
    this.#revise(depId, action, reason);
    return depId;
  }

  async newUninstallDeployment(
    clusterId: string,
    node: string,
    actions: DeployAction[],
    action: DeployAction,
    reason: WakeReason,
    source?: DeploymentSource,
  ): Promise<{ id: string; configId: string }> {
    const c = this.#cluster(clusterId);
    const n = c.nodes.find((x) => x.node === node);
    if (!n) throw new HeraldError('not_found', `cluster ${clusterId} has no node ${node}`);
    if (n.uninstallDeploymentId !== null) throw new Error(`the fake's node ${node} has an uninstall deployment`);
    // as the store resolves it: the cluster's current revision's, for the node's group
    const cur = c.revisions.find((r) => r.revision === c.head.revision)!;
    const configId = source?.configId ?? configsOf(cur, n.nodegroup).uninstall.configId;
    const id = this.#mkDeployment(clusterId, c.head.name, node, 'uninstall', configId, actions, action, reason, iso(0));
    if (source) this.#w.deployments.get(id)!.revisions[0]!.inputValues = source.inputValues;
    return { id, configId };
  }

  async reviseDeployment(
    d: DeploymentRecord,
    to: DeploymentSource,
    action: DeployAction,
    reason: WakeReason,
  ): Promise<void> {
    const e = this.#w.deployments.get(d.id)!;
    e.d.configId = to.configId;
    this.#revise(d.id, action, reason, to.inputValues);
  }

  async dropUninstallDeployment(clusterId: string, node: string): Promise<void> {
    const n = this.#cluster(clusterId).nodes.find((x) => x.node === node)!;
    if (n.uninstallDeploymentId === null) return;
    this.#w.deployments.delete(n.uninstallDeploymentId);
    this.changes.deploymentRemoved(n.uninstallDeploymentId);
    n.uninstallDeploymentId = null;
    this.changes.clusterChanged(clusterId);
  }

  async clusterRevision(clusterId: string, revision: number): Promise<ClusterRevisionRecord | undefined> {
    const r = this.#cluster(clusterId).revisions.find((x) => x.revision === revision);
    return r && structuredClone(r);
  }

  async clusterRevisions(clusterId: string): Promise<ClusterRevisionRecord[]> {
    return structuredClone(this.#cluster(clusterId).revisions);
  }

  async addClusterRevision(clusterId: string, r: NewClusterRevision, who: string, nowMs: number): Promise<number> {
    const c = this.#cluster(clusterId);
    const revision = c.head.revision + 1;
    c.revisions.push({ ...structuredClone(r), revision, createdAt: iso(nowMs), createdBy: who, stableAt: null });
    c.head.revision = revision;
    for (const g of r.nodegroups) {
      const own = c.nodegroups.find((x) => x.name === g.name);
      if (own)
        Object.assign(own, {
          installConfigId: g.installConfigId,
          uninstallConfigId: g.uninstallConfigId,
          inputValues: g.inputValues,
        });
    }
    this.changes.clusterChanged(clusterId);
    return revision;
  }

  async markRevisionStable(clusterId: string, revision: number, nowMs: number): Promise<void> {
    const r = this.#cluster(clusterId).revisions.find((x) => x.revision === revision);
    if (r && r.stableAt === null) r.stableAt = iso(nowMs);
  }

  async setRollout(clusterId: string, rollout: Rollout): Promise<void> {
    this.#cluster(clusterId).head.rollout = structuredClone(rollout);
    this.changes.clusterChanged(clusterId);
  }

  async setNodeRevision(clusterId: string, node: string, revision: number): Promise<void> {
    this.#cluster(clusterId).nodes.find((x) => x.node === node)!.revision = revision;
    this.changes.clusterChanged(clusterId);
  }

  async resetNodes(clusterId: string, nodes: readonly string[]): Promise<void> {
    for (const n of this.#cluster(clusterId).nodes) if (nodes.includes(n.node)) Object.assign(n, FRESH);
    this.changes.clusterChanged(clusterId);
  }

  async settleNode(clusterId: string, node: string): Promise<void> {
    Object.assign(this.#cluster(clusterId).nodes.find((x) => x.node === node)!, { ...FRESH, phase: 'complete' });
    this.changes.clusterChanged(clusterId);
  }

  #cluster(id: string): FakeCluster {
    const c = this.#w.clusters.get(id);
    if (!c) throw new Error(`the fake has no cluster ${id}`);
    return c;
  }

  async clusterHead(id: string): Promise<ClusterHead | undefined> {
    this.#w.read('clusterHead');
    const c = this.#w.clusters.get(id);
    return (
      c && {
        id: c.head.id,
        status: c.head.status,
        operation: c.head.operation,
        maxUnavailable: c.head.maxUnavailable,
        updatedAt: c.head.updatedAt,
        rollout: c.head.rollout ? structuredClone(c.head.rollout) : null,
        revision: c.head.revision,
      }
    );
  }

  async insertNodegroup(
    clusterId: string,
    g: NewNodegroup,
    rows: Pick<ClusterRows, 'installActions' | 'stepDeadlineMs'>,
    nowMs: number,
  ): Promise<void> {
    for (const [i, n] of g.nodes.entries())
      for (const other of this.#w.clusters.values())
        if (other.nodes.some((x) => x.node === n))
          throw new HeraldError('cluster_busy', `node ${n} is in a cluster`, { field: `nodes.${i}` });
    const c = this.#cluster(clusterId);
    const at = iso(nowMs);
    c.nodegroups.push({
      name: g.name,
      role: g.role,
      position: c.nodegroups.length,
      installConfigId: g.ownInstallConfigId,
      uninstallConfigId: g.ownUninstallConfigId,
      inputValues: g.ownInputValues,
      createdAt: at,
    });
    for (const node of g.nodes) {
      c.uninstallConfigs.set(node, g.uninstallConfigId);
      c.nodes.push({
        node,
        position: c.nodes.length,
        phase: 'installing',
        installDeploymentId: this.#mkDeployment(
          clusterId,
          c.head.name,
          node,
          'install',
          g.installConfigId,
          rows.installActions,
          'CREATE',
          'deployment',
          at,
        ),
        uninstallDeploymentId: null,
        stepDeadlineMs: rows.stepDeadlineMs,
        uninstallStartedAt: null,
        uninstallFinishedAt: null,
        installStartedAt: at,
        installFinishedAt: null,
        reason: null,
        nodegroup: g.name,
        healthDeploymentId: null,
        checkStartedAt: null,
        endedAtMs: null,
        revision: c.head.revision,
      });
    }
    const cur = c.revisions.find((r) => r.revision === c.head.revision);
    cur?.nodegroups.push({
      name: g.name,
      installConfigId: g.ownInstallConfigId,
      uninstallConfigId: g.ownUninstallConfigId,
      inputValues: g.ownInputValues,
    });
    this.changes.clusterChanged(clusterId);
  }

  async removeNodegroup(clusterId: string, name: string): Promise<void> {
    const c = this.#cluster(clusterId);
    const members = new Set(c.nodes.filter((n) => n.nodegroup === name).map((n) => n.node));
    for (const [id, e] of this.#w.deployments) {
      if (e.d.clusterId !== clusterId || !members.has(e.d.node)) continue;
      this.#w.deployments.delete(id);
      this.changes.touch(e.d.node);
      this.changes.deploymentRemoved(id);
    }
    c.nodes = c.nodes.filter((n) => !members.has(n.node));
    c.nodegroups = c.nodegroups.filter((g) => g.name !== name);
    this.changes.clusterChanged(clusterId);
  }

  async nodegroups(clusterId: string): Promise<NodegroupRecord[]> {
    return this.#cluster(clusterId).nodegroups.map((g) => ({ ...g }));
  }

  async newHealthDeployment(
    clusterId: string,
    node: string,
    configId: string,
    replaces: string | null,
  ): Promise<string> {
    if (replaces !== null && this.#w.deployments.delete(replaces)) this.changes.deploymentRemoved(replaces);
    const at = iso(0);
    const depId = this.#w.id('health');
    this.#w.deployments.set(depId, {
      d: {
        id: depId,
        node,
        configId,
        name: 'health',
        actions: ['CHECK'],
        clusterId,
        clusterRole: 'health',
        createdAt: at,
        updatedAt: at,
      },
      revisions: [],
    });
    this.changes.deploymentChanged(depId);
    this.#revise(depId, 'CHECK', 'restart');
    return depId;
  }

  async claimActiveClusters(): Promise<string[]> {
    return [...this.#w.clusters.values()].filter((c) => c.head.status.endsWith('_IN_PROGRESS')).map((c) => c.head.id);
  }

  async glance(clusterId: string): Promise<ClusterGlance> {
    this.#w.read('glance');
    const nodes = this.#cluster(clusterId).nodes;
    const due = (phase: string): number | null => {
      const ds = nodes.filter((n) => n.phase === phase && n.stepDeadlineMs !== null).map((n) => n.stepDeadlineMs!);
      return ds.length === 0 ? null : Math.min(...ds);
    };
    return {
      dueUninstallMs: due('uninstalling'),
      dueInstallMs: due('installing'),
      inFlight: nodes.some((n) => n.phase === 'uninstalling' || n.phase === 'installing'),
      pending: nodes.some((n) => n.phase === 'pending'),
      failed: nodes.some((n) => n.phase === 'failed'),
    };
  }

  async countInFlight(clusterId: string, upTo: number): Promise<number> {
    this.#w.read('countInFlight');
    return Math.min(
      upTo,
      this.#cluster(clusterId).nodes.filter((n) => n.phase === 'uninstalling' || n.phase === 'installing').length,
    );
  }

  async clusterNodes(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#w.read('clusterNodes');
    return this.#cluster(clusterId).nodes.map((n) => ({ ...n }));
  }

  async nodesInFlight(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#w.read('nodesInFlight');
    return this.#cluster(clusterId)
      .nodes.filter((n) => n.phase === 'uninstalling' || n.phase === 'installing')
      .map((n) => ({ ...n }));
  }

  async firstPending(clusterId: string, limit: number): Promise<ClusterNodeRecord[]> {
    this.#w.read('firstPending');
    return this.#cluster(clusterId)
      .nodes.filter((n) => n.phase === 'pending')
      .slice(0, limit)
      .map((n) => ({ ...n }));
  }

  async clusterNode(clusterId: string, node: string): Promise<ClusterNodeRecord | undefined> {
    this.#w.read('clusterNode');
    const n = this.#w.clusters.get(clusterId)?.nodes.find((x) => x.node === node);
    return n && { ...n };
  }

  async setNodeStep(clusterId: string, node: string, change: NodeStepChange, nowMs: number): Promise<void> {
    const n = this.#cluster(clusterId).nodes.find((x) => x.node === node)!;
    const at = iso(nowMs);
    switch (change.type) {
      case 'start':
        if (change.step === 'uninstall')
          Object.assign(n, {
            phase: 'uninstalling',
            uninstallDeploymentId: change.uninstallDeploymentId ?? n.uninstallDeploymentId,
            uninstallStartedAt: at,
            uninstallFinishedAt: null,
            installStartedAt: null,
            installFinishedAt: null,
          });
        else Object.assign(n, { phase: 'installing', installStartedAt: at, installFinishedAt: null });
        Object.assign(n, { stepDeadlineMs: change.deadlineMs, reason: null });
        break;
      case 'uninstalled':
        n.uninstallFinishedAt = at;
        break;
      case 'check':
        Object.assign(n, {
          phase: 'checking',
          stepDeadlineMs: change.deadlineMs,
          checkStartedAt: at,
          installFinishedAt: at,
          healthDeploymentId: change.healthDeploymentId,
          reason: null,
        });
        break;
      case 'complete':
        Object.assign(n, { phase: 'complete', stepDeadlineMs: null, endedAtMs: nowMs });
        if (change.installFinished) n.installFinishedAt = at;
        break;
      case 'fail':
        Object.assign(n, { phase: 'failed', stepDeadlineMs: null, reason: change.reason, endedAtMs: nowMs });
        if (change.step === 'uninstall') n.uninstallFinishedAt = at;
        else if (change.step === 'install') n.installFinishedAt = at;
        break;
    }
    this.changes.clusterChanged(clusterId);
  }

  async beginOperation(
    clusterId: string,
    op: ClusterOperation,
    maxUnavailable: number,
    nowMs: number,
    rollout: Rollout | null = null,
  ): Promise<void> {
    const c = this.#cluster(clusterId);
    Object.assign(c.head, {
      status: `${op.toUpperCase()}_IN_PROGRESS`,
      statusReason: `${op} in progress`,
      operation: op,
      maxUnavailable,
      updatedAt: iso(nowMs),
      rollout: rollout ? structuredClone(rollout) : null,
    });
    const inScope = rollout === null ? null : new Set(rollout.groups.map((g) => g.name));
    for (const n of c.nodes) {
      if (inScope && !inScope.has(n.nodegroup)) continue;
      Object.assign(n, FRESH);
    }
    this.changes.clusterChanged(clusterId);
  }

  async finishCluster(clusterId: string, status: ClusterStatus, reason: string, nowMs: number): Promise<void> {
    Object.assign(this.#cluster(clusterId).head, { status, statusReason: reason, updatedAt: iso(nowMs) });
    this.changes.clusterChanged(clusterId);
  }

  async removeCluster(clusterId: string): Promise<void> {
    for (const [id, e] of this.#w.deployments) {
      if (e.d.clusterId !== clusterId) continue;
      this.#w.deployments.delete(id);
      this.changes.touch(e.d.node);
      this.changes.deploymentRemoved(id);
    }
    this.#w.clusters.delete(clusterId);
    this.changes.clusterRemoved(clusterId);
  }
}
