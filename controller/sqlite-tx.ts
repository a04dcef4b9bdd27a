/**
 * SQLite's reads (`SqliteRows`, synchronous: better-sqlite3 is) and its transaction object
 * (`SqliteTx`, the async `StoreTx` over them). SqliteStore (sqlite-store.ts) opens and ends the
 * transaction and runs at most one at a time, so nothing here locks: SQLite's one writer is the
 * lock a PostgreSQL store takes row by row.
 */
import { randomUUID } from 'node:crypto';
import { HeraldError } from '../protocol/errors.js';
import type { DeployAction } from '../protocol/heat.js';
import type { WakeReason } from '../protocol/wake.js';
import type { ChangeSetBuilder } from './change-set.js';
import type { ClusterGlance, ClusterHead, ClusterRows, NodeStepChange, StepResult } from './clusters/tx.js';
import type {
  AuditRecord,
  ClusterNodeRecord,
  ClusterOperation,
  ClusterRecord,
  ClusterStatus,
  ConfigRecord,
  DeploymentPatch,
  DeploymentRecord,
  DeploymentStatus,
  MetadataSource,
  NewConfig,
  NewDeployment,
  NewNodegroup,
  NodegroupRecord,
  NodeRecord,
  RevisionRecord,
  Rollout,
} from './records.js';
import {
  clusterNodeOf,
  clusterOf,
  configOf,
  deploymentOf,
  nodegroupOf,
  nodeOf,
  revisionOf,
  type ClusterNodeRow,
  type NodegroupRow,
  type ClusterRow,
  type ConfigRow,
  type DeploymentRow,
  type NodeRow,
  type RevisionRow,
  type Statements,
} from './sqlite-schema.js';
import type { StoreTx } from './store.js';

const IN_PROGRESS_REASON = 'Deploy data available';

/** Every read, synchronous; the store runs them outside transactions, SqliteTx inside. */
export class SqliteRows {
  readonly s: Statements;
  readonly now: () => number;
  readonly #configs = new Map<string, ConfigRecord>();

  constructor(s: Statements, now: () => number) {
    this.s = s;
    this.now = now;
  }

  iso(ms = this.now()): string {
    return new Date(ms).toISOString();
  }

  generation(): number {
    return (this.s.seqGet.get() as { value: number }).value;
  }

  node(id: string): NodeRecord | undefined {
    const r = this.s.nodeGet.get(id) as NodeRow | undefined;
    return r && nodeOf(r);
  }

  isTombstoned(id: string): boolean {
    return this.s.tombGet.get(id) !== undefined;
  }

  nodes(): NodeRecord[] {
    return (this.s.nodeList.all() as NodeRow[]).map(nodeOf);
  }

  config(id: string): ConfigRecord | undefined {
    const cached = this.#configs.get(id);
    if (cached) return cached;
    const r = this.s.configGet.get(id) as ConfigRow | undefined;
    if (!r) return undefined;
    const c = configOf(r);
    this.#configs.set(id, c); // configs are immutable
    return c;
  }

  configs(): ConfigRecord[] {
    return (this.s.configList.all() as ConfigRow[]).map(configOf);
  }

  deployment(id: string): DeploymentRecord | undefined {
    const r = this.s.depGet.get(id) as DeploymentRow | undefined;
    return r && deploymentOf(r);
  }

  deployments(filter: { node?: string | undefined } = {}): DeploymentRecord[] {
    const rows = (
      filter.node === undefined ? this.s.depList.all() : this.s.depByNode.all(filter.node)
    ) as DeploymentRow[];
    return rows.map(deploymentOf);
  }

  revisions(id: string): RevisionRecord[] {
    return (this.s.revList.all(id) as RevisionRow[]).map(revisionOf);
  }

  metadataSource(node: string): MetadataSource | undefined {
    const n = this.node(node);
    if (!n) return undefined;
    const names = new Map<string, { id: string; name: string }>();
    const entries = (this.s.depByNode.all(node) as DeploymentRow[]).map((r) => {
      const deployment = deploymentOf(r);
      let cluster: { id: string; name: string } | null = null;
      if (deployment.clusterId !== null) {
        cluster = names.get(deployment.clusterId) ?? null;
        if (!cluster) {
          const c = this.s.clusterName.get(deployment.clusterId) as { name: string } | undefined;
          cluster = { id: deployment.clusterId, name: c?.name ?? '' };
          names.set(deployment.clusterId, cluster);
        }
      }
      return { deployment, config: this.config(deployment.configId)!, cluster };
    });
    return { node: n, entries };
  }

  clusterHead(id: string): ClusterHead | undefined {
    const r = this.s.clusterGet.get(id) as ClusterRow | undefined;
    return (
      r && {
        id: r.id,
        status: r.status as ClusterStatus,
        operation: r.operation as ClusterOperation,
        maxUnavailable: r.max_unavailable,
        updatedAt: r.updated_at,
        rollout: r.rollout === null ? null : (JSON.parse(r.rollout) as Rollout),
      }
    );
  }

  nodegroups(clusterId: string): NodegroupRecord[] {
    return (this.s.ngList.all(clusterId) as NodegroupRow[]).map(nodegroupOf);
  }

  cluster(id: string): ClusterRecord | undefined {
    const r = this.s.clusterGet.get(id) as ClusterRow | undefined;
    return r && clusterOf(r, this.s.cnList.all(id) as ClusterNodeRow[], this.s.ngList.all(id) as NodegroupRow[]);
  }

  clusterStatus(id: string): { status: ClusterStatus; statusReason: string } | undefined {
    const r = this.s.clusterStatus.get(id) as { status: ClusterStatus; status_reason: string } | undefined;
    return r ? { status: r.status, statusReason: r.status_reason } : undefined;
  }

  clusterConfigIds(id: string): string[] | undefined {
    const r = this.s.clusterConfigIds.get(id) as { install_config_id: string; uninstall_config_id: string } | undefined;
    if (!r) return undefined;
    const ids = new Set([r.install_config_id, r.uninstall_config_id]);
    for (const g of this.nodegroups(id)) {
      if (g.installConfigId !== null) ids.add(g.installConfigId);
      if (g.uninstallConfigId !== null) ids.add(g.uninstallConfigId);
    }
    return [...ids];
  }

  clusters(): ClusterRecord[] {
    return (this.s.clusterList.all() as ClusterRow[]).map((r) =>
      clusterOf(r, this.s.cnList.all(r.id) as ClusterNodeRow[], this.s.ngList.all(r.id) as NodegroupRow[]),
    );
  }

  activeClusterIds(): string[] {
    return (this.s.clusterActive.all() as Array<{ id: string }>).map((r) => r.id);
  }

  audit(limit: number): AuditRecord[] {
    return (
      this.s.auditList.all(limit) as Array<{
        seq: number;
        at: string;
        who: string;
        action: string;
        target: string;
        detail: string | null;
      }>
    ).map((r) => ({
      seq: r.seq,
      at: r.at,
      who: r.who,
      action: r.action,
      target: r.target,
      detail: r.detail === null ? null : (JSON.parse(r.detail) as Record<string, unknown>),
    }));
  }
}

/** One transaction (or savepoint) on SQLite; valid until `end()`. */
export class SqliteTx implements StoreTx {
  readonly changes: ChangeSetBuilder;
  readonly #r: SqliteRows;
  readonly #s: Statements;
  #ended = false;

  constructor(rows: SqliteRows, changes: ChangeSetBuilder) {
    this.#r = rows;
    this.#s = rows.s;
    this.changes = changes;
  }

  /** The callback settled: any later use is a bug (a missing await) and rejects. */
  end(): void {
    this.#ended = true;
  }

  #live(): void {
    if (this.#ended) throw new HeraldError('internal', 'a transaction object was used after its transaction ended');
  }

  async audit(
    who: string,
    action: string,
    target: string,
    detail: Record<string, unknown> | null = null,
  ): Promise<void> {
    this.#live();
    this.#s.auditInsert.run(this.#r.iso(), who, action, target, detail === null ? null : JSON.stringify(detail));
  }

  // ---- nodes -------------------------------------------------------------------------------

  async node(id: string): Promise<NodeRecord | undefined> {
    this.#live();
    return this.#r.node(id);
  }

  async createNode(id: string, endpoint: string | null, who: string): Promise<void> {
    this.#live();
    if (this.#s.nodeGet.get(id)) throw new HeraldError('node_exists', `node ${id} exists already`, { field: 'id' });
    const now = this.#r.iso();
    this.#s.tombDelete.run(id);
    this.#s.nodeInsert.run(id, endpoint, now, now);
    this.changes.touch(id);
    await this.audit(who, 'node.create', id, endpoint === null ? null : { endpoint });
  }

  async announceEndpoint(
    id: string,
    url: string,
    who: string,
    autoRegister: boolean,
  ): Promise<{ created: boolean; changed: boolean }> {
    this.#live();
    const row = this.#s.nodeGet.get(id) as NodeRow | undefined;
    const now = this.#r.iso();
    if (row === undefined) {
      if (this.#s.tombGet.get(id))
        throw new HeraldError('node_deleted', `node ${id} was deleted; an operator must add it again`);
      if (!autoRegister)
        throw new HeraldError(
          'not_found',
          `node ${id} is not registered (the controller runs with --no-auto-register)`,
        );
      this.#s.nodeInsert.run(id, url, now, now);
      this.changes.touch(id);
      await this.audit(who, 'node.register', id, { endpoint: url });
      return { created: true, changed: true };
    }
    if (row.endpoint === url) return { created: false, changed: false };
    this.#s.nodeSetEndpoint.run(url, now, id);
    this.changes.nodeChanged(id);
    await this.audit(who, 'node.endpoint', id, { endpoint: url });
    return { created: false, changed: true };
  }

  async deleteNode(id: string, who: string): Promise<void> {
    this.#live();
    if (!this.#s.nodeGet.get(id)) throw new HeraldError('not_found', `no node ${id}`);
    const cluster = this.#s.cnByNode.get(id) as { cluster_id: string } | undefined;
    if (cluster) throw new HeraldError('node_in_cluster', `node ${id} belongs to cluster ${cluster.cluster_id}`);
    for (const { id: dep } of this.#s.depIdsByNode.all(id) as Array<{ id: string }>) this.#removeDeployment(dep);
    this.#s.nodeDelete.run(id);
    this.#s.tombInsert.run(id, this.#r.iso(), who);
    this.changes.nodeRemoved(id);
    await this.audit(who, 'node.delete', id);
  }

  // ---- configs -----------------------------------------------------------------------------

  async config(id: string): Promise<ConfigRecord | undefined> {
    this.#live();
    return this.#r.config(id);
  }

  async createConfig(c: NewConfig, who: string): Promise<ConfigRecord> {
    this.#live();
    const id = randomUUID();
    this.#s.configInsert.run(
      id,
      c.name,
      c.group,
      JSON.stringify(c.config),
      JSON.stringify(c.inputs),
      JSON.stringify(c.outputs),
      JSON.stringify(c.options),
      this.#r.iso(),
    );
    await this.audit(who, 'config.create', id, { name: c.name, group: c.group });
    return this.#r.config(id)!;
  }

  // ---- deployments -------------------------------------------------------------------------

  async deployment(id: string): Promise<DeploymentRecord | undefined> {
    this.#live();
    return this.#r.deployment(id);
  }

  async createDeployment(d: NewDeployment, who: string): Promise<DeploymentRecord> {
    this.#live();
    const id = randomUUID();
    this.#insertDeployment(id, d, null, null, 'deployment');
    await this.audit(who, 'deployment.create', id, { node: d.node, config_id: d.configId, action: d.action });
    return this.#r.deployment(id)!;
  }

  async updateDeployment(id: string, p: DeploymentPatch, who: string): Promise<DeploymentRecord> {
    this.#live();
    const d = this.#mustDeployment(id);
    if (d.clusterId !== null)
      throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
    if (d.current.action === 'DELETE')
      throw new HeraldError('deployment_deleting', `deployment ${id} is being deleted`);
    const action = p.action ?? 'UPDATE';
    this.#newRevision(
      id,
      d.node,
      d.actions,
      d.current.revision,
      action,
      p.inputValues ?? d.current.inputValues,
      'deployment',
    );
    await this.audit(who, 'deployment.update', id, { revision: d.current.revision + 1, action });
    return this.#r.deployment(id)!;
  }

  async deleteDeployment(id: string, who: string): Promise<DeploymentRecord | null> {
    this.#live();
    const d = this.#mustDeployment(id);
    if (d.clusterId !== null)
      throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
    if (d.current.action === 'DELETE' && !d.current.signalled) return d; // its DELETE runs already
    if (d.actions.includes('DELETE')) {
      this.#newRevision(id, d.node, d.actions, d.current.revision, 'DELETE', d.current.inputValues, 'deployment');
      await this.audit(who, 'deployment.delete', id, { revision: d.current.revision + 1, runs: true });
      return this.#r.deployment(id)!;
    }
    this.#removeDeployment(id);
    await this.audit(who, 'deployment.delete', id, { runs: false });
    return null;
  }

  async removeDeployment(id: string): Promise<void> {
    this.#live();
    this.#removeDeployment(id);
  }

  async newRevision(d: DeploymentRecord, action: DeployAction, reason: WakeReason): Promise<boolean> {
    this.#live();
    return this.#newRevision(d.id, d.node, d.actions, d.current.revision, action, d.current.inputValues, reason);
  }

  async recordResult(d: DeploymentRecord, r: StepResult, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    this.#s.revResult.run(
      r.status,
      r.statusReason,
      r.outputValues === null ? null : JSON.stringify(r.outputValues),
      at,
      at,
      d.id,
      d.current.revision,
    );
    this.changes.touch(d.node); // the item now reads signalled: true; no work, so no wake-up
    this.changes.deploymentChanged(d.id);
  }

  #mustDeployment(id: string): DeploymentRecord {
    const d = this.#r.deployment(id);
    if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
    return d;
  }

  #insertDeployment(
    id: string,
    d: NewDeployment,
    clusterId: string | null,
    role: 'install' | 'uninstall' | 'health' | null,
    reason: WakeReason,
  ): void {
    if (!this.#s.nodeGet.get(d.node)) throw new HeraldError('unknown_node', `no node ${d.node}`, { field: 'node' });
    if (!this.#r.config(d.configId))
      throw new HeraldError('unknown_config', `no config ${d.configId}`, { field: 'config_id' });
    const now = this.#r.iso();
    this.#s.depInsert.run(id, d.node, d.configId, d.name, JSON.stringify(d.actions), clusterId, role, now, now);
    this.changes.deploymentChanged(id);
    this.#newRevision(id, d.node, d.actions, 0, d.action, d.inputValues, reason);
  }

  /** Adds revision `prev + 1` and makes it current. A revision whose action is not listed completes at once. */
  #newRevision(
    id: string,
    node: string,
    actions: DeployAction[],
    prev: number,
    action: DeployAction,
    inputValues: Record<string, unknown>,
    reason: WakeReason,
  ): boolean {
    const now = this.#r.iso();
    const revision = prev + 1;
    const triggered = actions.includes(action);
    const status: DeploymentStatus = triggered ? 'IN_PROGRESS' : 'COMPLETE';
    const why = triggered
      ? IN_PROGRESS_REASON
      : `not triggered: action ${action} is not in actions (${actions.join(', ')})`;
    this.#s.revInsert.run(
      id,
      revision,
      randomUUID(),
      action,
      JSON.stringify(inputValues),
      status,
      why,
      triggered ? 0 : 1,
      now,
      now,
      triggered ? null : now,
    );
    this.#s.depSetRevision.run(revision, now, id);
    this.changes.touch(node, triggered ? reason : null);
    this.changes.deploymentChanged(id);
    return triggered;
  }

  #removeDeployment(id: string): void {
    const d = this.#r.deployment(id);
    if (!d) return;
    this.#s.revDelete.run(id);
    this.#s.depDelete.run(id);
    this.changes.touch(d.node);
    this.changes.deploymentRemoved(id);
  }

  // ---- clusters ----------------------------------------------------------------------------

  async insertCluster(c: ClusterRows, nowMs: number): Promise<string> {
    this.#live();
    for (const [i, n] of c.nodes.entries()) {
      if (!this.#s.nodeGet.get(n)) throw new HeraldError('unknown_node', `no node ${n}`, { field: `nodes.${i}` });
      // two clusters' uninstall and install steps must never run on one node at once
      const other = this.#s.cnByNode.get(n) as { cluster_id: string } | undefined;
      if (other)
        throw new HeraldError('cluster_busy', `node ${n} already belongs to cluster ${other.cluster_id}`, {
          field: `nodes.${i}`,
        });
    }
    if (!this.#r.config(c.installConfigId))
      throw new HeraldError('unknown_config', `no config ${c.installConfigId}`, { field: 'install_config_id' });
    if (!this.#r.config(c.uninstallConfigId))
      throw new HeraldError('unknown_config', `no config ${c.uninstallConfigId}`, { field: 'uninstall_config_id' });
    for (const [i, g] of c.nodegroups.entries()) {
      if (!this.#r.config(g.installConfigId))
        throw new HeraldError('unknown_config', `no config ${g.installConfigId}`, {
          field: `nodegroups.${i}.install_config_id`,
        });
      if (!this.#r.config(g.uninstallConfigId))
        throw new HeraldError('unknown_config', `no config ${g.uninstallConfigId}`, {
          field: `nodegroups.${i}.uninstall_config_id`,
        });
    }
    const id = randomUUID();
    const now = this.#r.iso(nowMs);
    this.#s.clusterInsert.run(
      id,
      c.name,
      'CREATE_IN_PROGRESS',
      'create in progress',
      c.installConfigId,
      c.uninstallConfigId,
      JSON.stringify(c.inputValues),
      'create',
      c.nodes.length,
      now,
      now,
      now,
    );
    let position = 0;
    for (const [gi, g] of c.nodegroups.entries()) {
      this.#insertGroupRow(id, g, gi, now);
      for (const node of g.nodes) this.#insertMember(id, c.name, g, node, position++, c, now);
    }
    this.changes.clusterChanged(id);
    return id;
  }

  #insertGroupRow(clusterId: string, g: NewNodegroup, position: number, now: string): void {
    this.#s.ngInsert.run(
      clusterId,
      g.name,
      position,
      g.role,
      g.ownInstallConfigId,
      g.ownUninstallConfigId,
      g.ownInputValues === null ? null : JSON.stringify(g.ownInputValues),
      now,
    );
  }

  /** A node of group `g`: its install deployment (runs at once) and uninstall deployment (not yet), and its row. */
  #insertMember(
    clusterId: string,
    clusterName: string,
    g: NewNodegroup,
    node: string,
    position: number,
    rows: Pick<ClusterRows, 'installActions' | 'uninstallActions' | 'stepDeadlineMs'>,
    now: string,
  ): void {
    const installId = randomUUID();
    const uninstallId = randomUUID();
    this.#insertDeployment(
      installId,
      {
        node,
        configId: g.installConfigId,
        name: `${clusterName}-install`,
        actions: rows.installActions,
        action: 'CREATE',
        inputValues: g.installInputValues,
      },
      clusterId,
      'install',
      'deployment',
    );
    this.#insertDeployment(
      uninstallId,
      {
        node,
        configId: g.uninstallConfigId,
        name: `${clusterName}-uninstall`,
        actions: rows.uninstallActions,
        action: 'CREATE',
        inputValues: g.uninstallInputValues,
      },
      clusterId,
      'uninstall',
      'deployment',
    );
    this.#s.cnInsert.run(
      clusterId,
      node,
      position,
      'installing',
      installId,
      uninstallId,
      rows.stepDeadlineMs,
      now,
      g.name,
    );
  }

  async insertNodegroup(
    clusterId: string,
    g: NewNodegroup,
    rows: Pick<ClusterRows, 'installActions' | 'uninstallActions' | 'stepDeadlineMs'>,
    nowMs: number,
  ): Promise<void> {
    this.#live();
    for (const [i, n] of g.nodes.entries()) {
      if (!this.#s.nodeGet.get(n)) throw new HeraldError('unknown_node', `no node ${n}`, { field: `nodes.${i}` });
      const other = this.#s.cnByNode.get(n) as { cluster_id: string } | undefined;
      if (other)
        throw new HeraldError('cluster_busy', `node ${n} already belongs to cluster ${other.cluster_id}`, {
          field: `nodes.${i}`,
        });
    }
    const name = (this.#s.clusterName.get(clusterId) as { name: string } | undefined)?.name;
    if (name === undefined) throw new HeraldError('not_found', `no cluster ${clusterId}`);
    const now = this.#r.iso(nowMs);
    this.#insertGroupRow(clusterId, g, (this.#s.ngNextPosition.get(clusterId) as { p: number }).p, now);
    let position = (this.#s.cnNextPosition.get(clusterId) as { p: number }).p;
    for (const node of g.nodes) this.#insertMember(clusterId, name, g, node, position++, rows, now);
    this.changes.clusterChanged(clusterId);
  }

  async removeNodegroup(clusterId: string, name: string): Promise<void> {
    this.#live();
    for (const { node } of this.#s.cnOfGroup.all(clusterId, name) as Array<{ node: string }>)
      for (const { id } of this.#s.depIdsByClusterNode.all(clusterId, node) as Array<{ id: string }>)
        this.#removeDeployment(id);
    this.#s.cnDeleteGroup.run(clusterId, name);
    this.#s.ngDeleteOne.run(clusterId, name);
    this.changes.clusterChanged(clusterId);
  }

  async clusterHead(id: string): Promise<ClusterHead | undefined> {
    this.#live();
    return this.#r.clusterHead(id);
  }

  async claimActiveClusters(): Promise<string[]> {
    this.#live();
    return this.#r.activeClusterIds();
  }

  async glance(clusterId: string): Promise<ClusterGlance> {
    this.#live();
    const q = this.#s.cnGlance.get({ id: clusterId }) as {
      due_uninstall: number | null;
      due_install: number | null;
      in_flight: number;
      pending: number;
      failed: number;
    };
    return {
      dueUninstallMs: q.due_uninstall,
      dueInstallMs: q.due_install,
      inFlight: q.in_flight !== 0,
      pending: q.pending !== 0,
      failed: q.failed !== 0,
    };
  }

  async countInFlight(clusterId: string, upTo: number): Promise<number> {
    this.#live();
    return (this.#s.cnInFlightCount.get({ id: clusterId, window: upTo }) as { n: number }).n;
  }

  async clusterNodes(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#live();
    return (this.#s.cnList.all(clusterId) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async nodesInFlight(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#live();
    return (this.#s.cnInFlight.all(clusterId) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async firstPending(clusterId: string, limit: number): Promise<ClusterNodeRecord[]> {
    this.#live();
    return (this.#s.cnFirstPending.all(clusterId, limit) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async clusterNode(clusterId: string, node: string): Promise<ClusterNodeRecord | undefined> {
    this.#live();
    const r = this.#s.cnGet.get(clusterId, node) as ClusterNodeRow | undefined;
    return r && clusterNodeOf(r);
  }

  async setNodeStep(clusterId: string, node: string, change: NodeStepChange, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    switch (change.type) {
      case 'start':
        if (change.step === 'uninstall') this.#s.cnStartUninstall.run(change.deadlineMs, at, clusterId, node);
        else this.#s.cnStartInstall.run(change.deadlineMs, at, clusterId, node);
        break;
      case 'uninstalled':
        this.#s.cnUninstallDone.run(at, clusterId, node);
        break;
      case 'check':
        this.#s.cnStartCheck.run(change.deadlineMs, at, at, change.healthDeploymentId, clusterId, node);
        break;
      case 'complete':
        this.#s.cnComplete.run(change.installFinished ? at : null, clusterId, node);
        this.#s.cnEnded.run(nowMs, clusterId, node);
        break;
      case 'fail':
        if (change.step === 'uninstall') this.#s.cnFailUninstall.run(at, change.reason, clusterId, node);
        else if (change.step === 'install') this.#s.cnFailInstall.run(at, change.reason, clusterId, node);
        else this.#s.cnFailCheck.run(change.reason, clusterId, node);
        this.#s.cnEnded.run(nowMs, clusterId, node);
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
    this.#live();
    const now = this.#r.iso(nowMs);
    this.#s.clusterStart.run(
      `${op.toUpperCase()}_IN_PROGRESS`,
      `${op} in progress`,
      op,
      maxUnavailable,
      now,
      now,
      clusterId,
    );
    this.#s.clusterSetRollout.run(rollout === null ? null : JSON.stringify(rollout), clusterId);
    if (rollout === null) this.#s.cnReset.run(clusterId);
    else for (const g of rollout.groups) this.#s.cnResetGroup.run(clusterId, g.name);
    this.changes.clusterChanged(clusterId);
  }

  async nodegroups(clusterId: string): Promise<NodegroupRecord[]> {
    this.#live();
    return this.#r.nodegroups(clusterId);
  }

  async newHealthDeployment(
    clusterId: string,
    node: string,
    configId: string,
    replaces: string | null,
  ): Promise<string> {
    this.#live();
    if (replaces !== null) this.#removeDeployment(replaces);
    const id = randomUUID();
    this.#insertDeployment(
      id,
      { node, configId, name: 'health', actions: ['CHECK'], action: 'CHECK', inputValues: {} },
      clusterId,
      'health',
      'restart',
    );
    return id;
  }

  async finishCluster(clusterId: string, status: ClusterStatus, reason: string, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    this.#s.clusterFinish.run(status, reason, at, at, clusterId);
    this.changes.clusterChanged(clusterId);
  }

  async removeCluster(clusterId: string): Promise<void> {
    this.#live();
    for (const { id } of this.#s.depIdsByCluster.all(clusterId) as Array<{ id: string }>) this.#removeDeployment(id);
    this.#s.cnDelete.run(clusterId);
    this.#s.ngDelete.run(clusterId);
    this.#s.clusterDelete.run(clusterId);
    this.changes.clusterRemoved(clusterId);
  }
}
