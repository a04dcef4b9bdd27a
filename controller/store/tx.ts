/**
 * The store's reads (`SqlRows`) and its transaction object (`SqlTx`, the `StoreTx`), written
 * once over the statements of controller/store/statements.ts, so SQLite and PostgreSQL behave alike. The
 * store opens and ends the transaction. Rows read for change are read `FOR UPDATE` (the
 * deployment a revision or a signal changes, the cluster head) and the operations a tick
 * advances are claimed `SKIP LOCKED`: PostgreSQL's row locks; SQLite's one writer makes them
 * moot and its statements leave them out.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { DeployAction } from '../../protocol/heat.js';
import { CLUSTER_INSERT_BATCH_ENTRIES } from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { ChangeSetBuilder } from '../model/change-set.js';
import { newId } from './ids.js';
import { ObjectRows } from './objects.js';
import { inDocument, knows } from '../model/document.js';
import { coerceInputValues } from '../model/inputs.js';
import type { ClusterGlance, ClusterHead, ClusterRows, NodeStepChange, StepResult } from '../clusters/tx.js';
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
  KnownGenerations,
  MetadataCluster,
  MetadataRead,
  MetadataSource,
  NewConfig,
  NewDeployment,
  NewNodegroup,
  NodegroupRecord,
  NodeRecord,
  RevisionRecord,
  Rollout,
} from '../model/records.js';
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
  metadataDeploymentOf,
  nodeOfValues,
  type NodeRow,
  type RevisionRow,
} from './rows.js';
import { INSERT_MANY, METADATA_DEPLOYMENT_AT, type Statements } from './statements.js';
import type { StoreTx } from './store.js';

const IN_PROGRESS_REASON = 'Deploy data available';

/** A cluster's node groups' configs, `[install, uninstall]` each, in the groups' order. */
export type GroupConfigs = ReadonlyArray<readonly [string | null, string | null]>;

/** What a node's uninstall deployment is made of (`cnUninstallSource`). */
interface UninstallSourceRow {
  uninstall_deployment_id: string | null;
  name: string;
  uninstall_config_id: string;
  input_values: string;
  group_uninstall_config_id: string | null;
  group_input_values: string | null;
}

/** The columns of a cluster member's row the insert writes, in its order. */
const MEMBER_COLUMNS = INSERT_MANY.cnInsertMany.columns.map(([c]) => c as keyof ClusterNodeRow);

/** A cluster's new members, as rows of each table: written with one many-row insert per table for each batch of CLUSTER_INSERT_BATCH_ENTRIES members. */
class MemberRows {
  /** The rows of members not yet inserted (see SqlTx #insertMembers). */
  deployments: unknown[][] = [];
  revisions: unknown[][] = [];
  /** Whole rows, as a read of them would give them back (the insert takes its columns). */
  readonly nodes: ClusterNodeRow[] = [];
  /** nodes[inserted..] are not inserted yet. */
  inserted = 0;

  get pending(): number {
    return this.nodes.length - this.inserted;
  }
}

/** Every read; the store runs them outside transactions, SqlTx inside. */
export class SqlRows {
  readonly s: Statements;
  readonly now: () => number;
  /** Configs are immutable: one cache may serve every transaction of a store. */
  readonly configCache: Map<string, ConfigRecord>;
  /** Inside a transaction a config read may be one it created and may yet roll back: use the cache, never fill it. */
  readonly #fillCache: boolean;

  constructor(
    s: Statements,
    now: () => number,
    configCache = new Map<string, ConfigRecord>(),
    o: { inTransaction?: boolean } = {},
  ) {
    this.s = s;
    this.now = now;
    this.configCache = configCache;
    this.#fillCache = !o.inTransaction;
  }

  iso(ms = this.now()): string {
    return new Date(ms).toISOString();
  }

  async generation(): Promise<number> {
    return ((await this.s.seqGet.get()) as { value: number }).value;
  }

  async node(id: string): Promise<NodeRecord | undefined> {
    const r = (await this.s.nodeGet.get(id)) as NodeRow | undefined;
    return r && nodeOf(r);
  }

  async isTombstoned(id: string): Promise<boolean> {
    return (await this.s.tombGet.get(id)) !== undefined;
  }

  async nodes(): Promise<NodeRecord[]> {
    return ((await this.s.nodeList.all()) as NodeRow[]).map(nodeOf);
  }

  async config(id: string): Promise<ConfigRecord | undefined> {
    const cached = this.configCache.get(id);
    if (cached) return cached;
    const r = (await this.s.configGet.get(id)) as ConfigRow | undefined;
    if (!r) return undefined;
    const c = configOf(r);
    if (this.#fillCache) this.configCache.set(id, c); // configs are immutable
    return c;
  }

  async configs(): Promise<ConfigRecord[]> {
    return ((await this.s.configList.all()) as ConfigRow[]).map(configOf);
  }

  /** `forUpdate` locks the deployment's row to the end of the transaction (a revision or a signal changes it). */
  async deployment(id: string, forUpdate = false): Promise<DeploymentRecord | undefined> {
    if (forUpdate) await this.s.depLock.get(id);
    const r = (await this.s.depGet.get(id)) as DeploymentRow | undefined;
    return r && deploymentOf(r);
  }

  async deployments(filter: { node?: string | undefined } = {}): Promise<DeploymentRecord[]> {
    const rows = (
      filter.node === undefined ? await this.s.depList.all() : await this.s.depByNode.all(filter.node)
    ) as DeploymentRow[];
    return rows.map(deploymentOf);
  }

  async revisions(id: string): Promise<RevisionRecord[]> {
    return ((await this.s.revList.all(id)) as RevisionRow[]).map(revisionOf);
  }

  /**
   * The node and the deployments its document carries (`inDocument`: not one born not triggered
   * until a later revision of it), each with its config and its cluster's name and configs (the
   * cluster's own and its nodegroups'): two reads, their rows as arrays (VALUES_SQL), and one
   * more for each cluster among them (a node is a member of one cluster at a time); configs come
   * from the cache (they never change). The deployments are not read when the node's generation
   * is one of `known` (the asker holds it, or its document is built already).
   */
  async metadataSource(node: string, known: KnownGenerations = []): Promise<MetadataRead | undefined> {
    const nodeRow = (await this.s.nodeValues.all(node))[0];
    if (nodeRow === undefined) return undefined;
    const n = nodeOfValues(nodeRow);
    if (knows(known, n.generation)) return { node: n, source: null };
    const rows = await this.s.depForMetadata.all(node);
    return { node: n, source: await this.metadataOf(n, rows, (id) => this.#groupConfigs(id)) };
  }

  /**
   * `n`'s document's source from its deployments' rows (VALUES_SQL.depForMetadata's columns, at
   * METADATA_DEPLOYMENT_AT); `groupConfigs(clusterId, row)` gives a cluster's node groups' configs
   * (SQL.ngConfigsOfCluster's rows, in its order), asked once per cluster.
   */
  async metadataOf(
    n: NodeRecord,
    rows: Iterable<readonly unknown[]>,
    groupConfigs: (clusterId: string, row: readonly unknown[]) => GroupConfigs | Promise<GroupConfigs>,
  ): Promise<MetadataSource> {
    const at = METADATA_DEPLOYMENT_AT;
    const clusters = new Map<string, MetadataCluster>();
    const entries: MetadataSource['entries'] = [];
    for (const v of rows) {
      if (!inDocument(v[at.revision] as number, v[at.action] as string, v[at.actions] as string)) continue;
      let cluster: MetadataCluster | null = null;
      const clusterId = v[at.cluster_id] as string | null;
      if (clusterId !== null) {
        cluster = clusters.get(clusterId) ?? null;
        if (!cluster) {
          const configs = await this.#clusterConfigs(
            v[at.cluster_install_config_id] as string | null,
            v[at.cluster_uninstall_config_id] as string | null,
            () => groupConfigs(clusterId, v),
          );
          cluster = { id: clusterId, name: (v[at.cluster_name] as string | null) ?? '', configs };
          clusters.set(clusterId, cluster);
        }
      }
      const config = (await this.config(v[at.config_id] as string))!;
      entries.push({ deployment: metadataDeploymentOf(v), config, cluster });
    }
    return { node: n, entries };
  }

  async #groupConfigs(clusterId: string): Promise<GroupConfigs> {
    return (
      (await this.s.ngConfigsOfCluster.all(clusterId)) as Array<{
        install_config_id: string | null;
        uninstall_config_id: string | null;
      }>
    ).map((g) => [g.install_config_id, g.uninstall_config_id]);
  }

  /** A cluster's configs in clusterConfigIds' order: its own two, then its nodegroups' by position; each once. */
  async #clusterConfigs(
    installConfigId: string | null,
    uninstallConfigId: string | null,
    groupConfigs: () => GroupConfigs | Promise<GroupConfigs>,
  ): Promise<ConfigRecord[]> {
    const ids = new Set<string>();
    if (installConfigId !== null) {
      ids.add(installConfigId);
      ids.add(uninstallConfigId!);
      for (const [install, uninstall] of await groupConfigs()) {
        if (install !== null) ids.add(install);
        if (uninstall !== null) ids.add(uninstall);
      }
    }
    const configs: ConfigRecord[] = [];
    for (const id of ids) {
      const config = await this.config(id);
      if (config) configs.push(config);
    }
    return configs;
  }

  /** The cluster's head row; `forUpdate` locks it to the end of the transaction (the engine's lock point). */
  async clusterHead(id: string, forUpdate = false): Promise<ClusterHead | undefined> {
    const r = (await (forUpdate ? this.s.clusterGetForUpdate : this.s.clusterGet).get(id)) as ClusterRow | undefined;
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

  async nodegroups(clusterId: string): Promise<NodegroupRecord[]> {
    return ((await this.s.ngList.all(clusterId)) as NodegroupRow[]).map(nodegroupOf);
  }

  async cluster(id: string): Promise<ClusterRecord | undefined> {
    const r = (await this.s.clusterGet.get(id)) as ClusterRow | undefined;
    return (
      r &&
      clusterOf(r, (await this.s.cnList.all(id)) as ClusterNodeRow[], (await this.s.ngList.all(id)) as NodegroupRow[])
    );
  }

  async clusterStatus(id: string): Promise<{ status: ClusterStatus; statusReason: string } | undefined> {
    const r = (await this.s.clusterStatus.get(id)) as { status: ClusterStatus; status_reason: string } | undefined;
    return r ? { status: r.status, statusReason: r.status_reason } : undefined;
  }

  async clusterConfigIds(id: string): Promise<string[] | undefined> {
    const r = (await this.s.clusterConfigIds.get(id)) as
      | { install_config_id: string; uninstall_config_id: string }
      | undefined;
    if (!r) return undefined;
    const ids = new Set([r.install_config_id, r.uninstall_config_id]);
    for (const g of await this.nodegroups(id)) {
      if (g.installConfigId !== null) ids.add(g.installConfigId);
      if (g.uninstallConfigId !== null) ids.add(g.uninstallConfigId);
    }
    return [...ids];
  }

  async clusters(): Promise<ClusterRecord[]> {
    const out: ClusterRecord[] = [];
    for (const r of (await this.s.clusterList.all()) as ClusterRow[])
      out.push(
        clusterOf(
          r,
          (await this.s.cnList.all(r.id)) as ClusterNodeRow[],
          (await this.s.ngList.all(r.id)) as NodegroupRow[],
        ),
      );
    return out;
  }

  async activeClusterIds(): Promise<string[]> {
    return ((await this.s.clusterActive.all()) as Array<{ id: string }>).map((r) => r.id);
  }

  async audit(limit: number): Promise<AuditRecord[]> {
    return (
      (await this.s.auditList.all(limit)) as Array<{
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
export class SqlTx implements StoreTx {
  readonly changes: ChangeSetBuilder;
  readonly #r: SqlRows;
  readonly #s: Statements;
  #ended = false;
  /**
   * The configs this transaction has read, by id: the store's cache is filled only outside a
   * transaction (one that rolls back may have created what it read), and a cluster's nodes name
   * the same few configs thousands of times in one transaction.
   */
  readonly #configs = new Map<string, ConfigRecord>();

  constructor(rows: SqlRows, changes: ChangeSetBuilder) {
    this.#r = rows;
    this.#s = rows.s;
    this.changes = changes;
  }

  /** Heat's object store, in this transaction. */
  get objects(): ObjectRows {
    this.#live();
    return new ObjectRows(this.#s, this.#r.now);
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
    await this.#s.auditInsert.run(this.#r.iso(), who, action, target, detail === null ? null : JSON.stringify(detail));
  }

  // ---- nodes -------------------------------------------------------------------------------

  async node(id: string): Promise<NodeRecord | undefined> {
    this.#live();
    return await this.#r.node(id);
  }

  async createNode(id: string, endpoint: string | null, who: string): Promise<void> {
    this.#live();
    if (await this.#s.nodeGet.get(id))
      throw new HeraldError('node_exists', `node ${id} exists already`, { field: 'id' });
    const now = this.#r.iso();
    await this.#s.tombDelete.run(id);
    await this.#s.nodeInsert.run(id, endpoint, now, now);
    this.changes.touch(id);
    this.changes.endpointSet(id, endpoint);
    await this.audit(who, 'node.create', id, endpoint === null ? null : { endpoint });
  }

  async announceEndpoint(
    id: string,
    url: string,
    who: string,
    autoRegister: boolean,
  ): Promise<{ created: boolean; changed: boolean }> {
    this.#live();
    const row = (await this.#s.nodeGet.get(id)) as NodeRow | undefined;
    const now = this.#r.iso();
    if (row === undefined) {
      if (await this.#s.tombGet.get(id))
        throw new HeraldError('node_deleted', `node ${id} was deleted; an operator must add it again`);
      if (!autoRegister)
        throw new HeraldError(
          'not_found',
          `node ${id} is not registered (the controller runs with --no-auto-register)`,
        );
      await this.#s.nodeInsert.run(id, url, now, now);
      this.changes.touch(id);
      this.changes.endpointSet(id, url);
      await this.audit(who, 'node.register', id, { endpoint: url });
      return { created: true, changed: true };
    }
    if (row.endpoint === url) return { created: false, changed: false };
    await this.#s.nodeSetEndpoint.run(url, now, id);
    this.changes.nodeChanged(id);
    this.changes.endpointSet(id, url);
    await this.audit(who, 'node.endpoint', id, { endpoint: url });
    return { created: false, changed: true };
  }

  async deleteNode(id: string, who: string): Promise<void> {
    this.#live();
    if (!(await this.#s.nodeLock.get(id))) throw new HeraldError('not_found', `no node ${id}`);
    const cluster = (await this.#s.cnByNode.get(id)) as { cluster_id: string } | undefined;
    if (cluster) throw new HeraldError('node_in_cluster', `node ${id} belongs to cluster ${cluster.cluster_id}`);
    for (const { id: dep } of (await this.#s.depIdsByNode.all(id)) as Array<{ id: string }>)
      await this.#removeDeployment(dep);
    await this.#s.nodeDelete.run(id);
    await this.#s.tombInsert.run(id, this.#r.iso(), who);
    this.changes.nodeRemoved(id);
    await this.audit(who, 'node.delete', id);
  }

  // ---- configs -----------------------------------------------------------------------------

  async config(id: string): Promise<ConfigRecord | undefined> {
    this.#live();
    return await this.#config(id);
  }

  async #config(id: string): Promise<ConfigRecord | undefined> {
    const seen = this.#configs.get(id);
    if (seen !== undefined) return seen;
    const c = await this.#r.config(id);
    if (c !== undefined) this.#configs.set(id, c); // configs are immutable, never deleted
    return c;
  }

  async createConfig(c: NewConfig, who: string): Promise<ConfigRecord> {
    this.#live();
    const id = newId();
    await this.#s.configInsert.run(
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
    return (await this.#config(id))!;
  }

  // ---- deployments -------------------------------------------------------------------------

  async deployment(id: string): Promise<DeploymentRecord | undefined> {
    this.#live();
    return await this.#r.deployment(id, true);
  }

  async createDeployment(d: NewDeployment, who: string): Promise<DeploymentRecord> {
    this.#live();
    const id = newId();
    await this.#insertDeployment(id, d, null, null, 'deployment');
    await this.audit(who, 'deployment.create', id, { node: d.node, config_id: d.configId, action: d.action });
    return (await this.#r.deployment(id))!;
  }

  async updateDeployment(id: string, p: DeploymentPatch, who: string): Promise<DeploymentRecord> {
    this.#live();
    const d = await this.#mustDeployment(id);
    if (d.clusterId !== null)
      throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
    if (d.current.action === 'DELETE')
      throw new HeraldError('deployment_deleting', `deployment ${id} is being deleted`);
    // a patch merged into a revision read outside this transaction would drop what came between
    if (d.current.revision !== p.revises)
      throw new HeraldError(
        'internal',
        `deployment ${id}: a patch of revision ${p.revises} while revision ${d.current.revision} is current (read it in the transaction that writes)`,
      );
    const action = p.action ?? 'UPDATE';
    await this.#newRevision(
      id,
      d.node,
      d.actions,
      d.current.revision,
      action,
      p.inputValues ?? d.current.inputValues,
      'deployment',
    );
    await this.audit(who, 'deployment.update', id, { revision: d.current.revision + 1, action });
    return (await this.#r.deployment(id))!;
  }

  async deleteDeployment(id: string, who: string): Promise<DeploymentRecord | null> {
    this.#live();
    const d = await this.#mustDeployment(id);
    if (d.clusterId !== null)
      throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
    if (d.current.action === 'DELETE' && !d.current.signalled) return d; // its DELETE runs already
    if (d.actions.includes('DELETE')) {
      await this.#newRevision(id, d.node, d.actions, d.current.revision, 'DELETE', d.current.inputValues, 'deployment');
      await this.audit(who, 'deployment.delete', id, { revision: d.current.revision + 1, runs: true });
      return (await this.#r.deployment(id))!;
    }
    await this.#removeDeployment(id);
    await this.audit(who, 'deployment.delete', id, { runs: false });
    return null;
  }

  async removeDeployment(id: string): Promise<void> {
    this.#live();
    await this.#removeDeployment(id);
  }

  async newRevision(d: DeploymentRecord, action: DeployAction, reason: WakeReason): Promise<boolean> {
    this.#live();
    return await this.#newRevision(d.id, d.node, d.actions, d.current.revision, action, d.current.inputValues, reason);
  }

  async recordResult(d: DeploymentRecord, r: StepResult, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    await this.#s.revResult.run(
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

  async #mustDeployment(id: string): Promise<DeploymentRecord> {
    const d = await this.#r.deployment(id, true);
    if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
    return d;
  }

  /** A deployment and its first revision; the node is held against a delete to the commit. */
  async #insertDeployment(
    id: string,
    d: NewDeployment,
    clusterId: string | null,
    role: 'install' | 'uninstall' | 'health' | null,
    reason: WakeReason,
  ): Promise<void> {
    if (!(await this.#s.nodeKeyLock.get(d.node)))
      throw new HeraldError('unknown_node', `no node ${d.node}`, { field: 'node' });
    if (!(await this.#config(d.configId)))
      throw new HeraldError('unknown_config', `no config ${d.configId}`, { field: 'config_id' });
    await this.#writeDeployment(id, d, clusterId, role, reason);
  }

  /** A deployment's row and its first revision's, with no check (#insertDeployment checks). */
  async #writeDeployment(
    id: string,
    d: NewDeployment,
    clusterId: string | null,
    role: 'install' | 'uninstall' | 'health' | null,
    reason: WakeReason,
  ): Promise<void> {
    const now = this.#r.iso();
    await this.#s.depInsert.run(...this.#deploymentRow(id, d, clusterId, role, now));
    await this.#s.revInsert.run(...this.#revisionRow(id, d.node, d.actions, 1, d.action, d.inputValues, reason, now));
  }

  /** A new deployment's row, born at revision 1 (its revision's row comes next: no UPDATE of the row just inserted). */
  #deploymentRow(
    id: string,
    d: NewDeployment,
    clusterId: string | null,
    role: 'install' | 'uninstall' | 'health' | null,
    now: string,
  ): unknown[] {
    this.changes.deploymentChanged(id);
    return [id, d.node, d.configId, d.name, JSON.stringify(d.actions), 1, clusterId, role, now, now];
  }

  /** Adds revision `prev + 1` and makes it current. A revision whose action is not listed completes at once. */
  async #newRevision(
    id: string,
    node: string,
    actions: DeployAction[],
    prev: number,
    action: DeployAction,
    inputValues: Record<string, unknown>,
    reason: WakeReason,
  ): Promise<boolean> {
    const now = this.#r.iso();
    await this.#s.revInsert.run(...this.#revisionRow(id, node, actions, prev + 1, action, inputValues, reason, now));
    await this.#s.depSetRevision.run(prev + 1, now, id);
    return actions.includes(action);
  }

  /**
   * The row of revision `revision` (the deployment's row names it as current itself), its
   * `signalled` and `signalled_at` set when its action is not listed (it completes at once); its
   * node touched.
   */
  #revisionRow(
    id: string,
    node: string,
    actions: DeployAction[],
    revision: number,
    action: DeployAction,
    inputValues: Record<string, unknown>,
    reason: WakeReason,
    now: string,
  ): unknown[] {
    const triggered = actions.includes(action);
    const status: DeploymentStatus = triggered ? 'IN_PROGRESS' : 'COMPLETE';
    const why = triggered
      ? IN_PROGRESS_REASON
      : `not triggered: action ${action} is not in actions (${actions.join(', ')})`;
    this.changes.touch(node, triggered ? reason : null);
    this.changes.deploymentChanged(id);
    return [
      id,
      revision,
      newId(),
      action,
      JSON.stringify(inputValues),
      status,
      why,
      triggered ? 0 : 1,
      now,
      now,
      triggered ? null : now,
    ];
  }

  async #removeDeployment(id: string): Promise<void> {
    const d = await this.#r.deployment(id);
    if (!d) return;
    await this.#s.revDelete.run(id);
    await this.#s.depDelete.run(id);
    this.changes.touch(d.node);
    this.changes.deploymentRemoved(id);
  }

  // ---- clusters ----------------------------------------------------------------------------

  /**
   * Each node exists (held against a delete to the commit) and is in no cluster: two clusters'
   * uninstall and install steps must never run on one node at once (PostgreSQL's unique index
   * on cluster_nodes(node) settles two controllers racing for one node).
   * @throws HeraldError unknown_node | cluster_busy (field `nodes.<i>`)
   */
  async #assertFreeNodes(nodes: readonly string[]): Promise<void> {
    const known = new Set(((await this.#s.nodesKeyLock.all(nodes)) as Array<{ id: string }>).map((r) => r.id));
    const taken = new Map(
      ((await this.#s.cnByNodes.all(nodes)) as Array<{ node: string; cluster_id: string }>).map((r) => [
        r.node,
        r.cluster_id,
      ]),
    );
    for (const [i, n] of nodes.entries()) {
      if (!known.has(n)) throw new HeraldError('unknown_node', `no node ${n}`, { field: `nodes.${i}` });
      const other = taken.get(n);
      if (other !== undefined)
        throw new HeraldError('cluster_busy', `node ${n} already belongs to cluster ${other}`, {
          field: `nodes.${i}`,
        });
    }
  }

  async insertCluster(c: ClusterRows, nowMs: number): Promise<ClusterRecord> {
    this.#live();
    await this.#assertFreeNodes(c.nodes);
    if (!(await this.#config(c.installConfigId)))
      throw new HeraldError('unknown_config', `no config ${c.installConfigId}`, { field: 'install_config_id' });
    if (!(await this.#config(c.uninstallConfigId)))
      throw new HeraldError('unknown_config', `no config ${c.uninstallConfigId}`, { field: 'uninstall_config_id' });
    for (const [i, g] of c.nodegroups.entries()) await this.#assertGroupConfigs(g, `nodegroups.${i}.`);
    const id = newId();
    const now = this.#r.iso(nowMs);
    const row: ClusterRow = {
      id,
      name: c.name,
      status: 'CREATE_IN_PROGRESS',
      status_reason: 'create in progress',
      install_config_id: c.installConfigId,
      uninstall_config_id: c.uninstallConfigId,
      input_values: JSON.stringify(c.inputValues),
      operation: 'create',
      max_unavailable: c.nodes.length,
      op_started_at: now,
      op_finished_at: null,
      created_at: now,
      updated_at: now,
      rollout: null,
    };
    await this.#s.clusterInsert.run(
      id,
      row.name,
      row.status,
      row.status_reason,
      row.install_config_id,
      row.uninstall_config_id,
      row.input_values,
      row.operation,
      row.max_unavailable,
      now,
      now,
      now,
    );
    const members = new MemberRows();
    const groups: NodegroupRow[] = [];
    let position = 0;
    for (const [gi, g] of c.nodegroups.entries()) {
      groups.push(await this.#insertGroupRow(id, g, gi, now));
      for (const node of g.nodes) await this.#addMember(members, id, c.name, g, node, position++, c, now);
    }
    await this.#insertMembers(members);
    this.changes.clusterChanged(id);
    // the rows just written, mapped as a read maps them: the answer needs no read after the commit
    return clusterOf(row, members.nodes, groups);
  }

  /** @throws HeraldError unknown_config (field `<prefix>install_config_id` or `<prefix>uninstall_config_id`) */
  async #assertGroupConfigs(g: NewNodegroup, prefix: string): Promise<void> {
    if (!(await this.#config(g.installConfigId)))
      throw new HeraldError('unknown_config', `no config ${g.installConfigId}`, {
        field: `${prefix}install_config_id`,
      });
    if (!(await this.#config(g.uninstallConfigId)))
      throw new HeraldError('unknown_config', `no config ${g.uninstallConfigId}`, {
        field: `${prefix}uninstall_config_id`,
      });
  }

  /** Inserts group `g`'s row; returns it. */
  async #insertGroupRow(clusterId: string, g: NewNodegroup, position: number, now: string): Promise<NodegroupRow> {
    const row: NodegroupRow = {
      cluster_id: clusterId,
      name: g.name,
      position,
      role: g.role,
      install_config_id: g.ownInstallConfigId,
      uninstall_config_id: g.ownUninstallConfigId,
      input_values: g.ownInputValues === null ? null : JSON.stringify(g.ownInputValues),
      created_at: now,
    };
    await this.#s.ngInsert.run(
      clusterId,
      row.name,
      row.position,
      row.role,
      row.install_config_id,
      row.uninstall_config_id,
      row.input_values,
      now,
    );
    return row;
  }

  /**
   * Adds the rows of a node of group `g` to `out`: its install deployment (runs at once), its
   * revision, and its own row (no uninstall deployment: newUninstallDeployment makes it when the
   * node's first uninstall starts); and inserts what `out` holds once it is
   * CLUSTER_INSERT_BATCH_ENTRIES members (the caller inserts the rest at the end). The caller has
   * held the node with #assertFreeNodes and checked the configs.
   */
  async #addMember(
    out: MemberRows,
    clusterId: string,
    clusterName: string,
    g: NewNodegroup,
    node: string,
    position: number,
    rows: Pick<ClusterRows, 'installActions' | 'stepDeadlineMs'>,
    now: string,
  ): Promise<void> {
    const id = newId();
    const { installConfigId: configId, installInputValues: inputValues } = g;
    const actions = rows.installActions;
    const d = { node, configId, name: `${clusterName}-install`, actions, action: 'CREATE' as const, inputValues };
    out.deployments.push(this.#deploymentRow(id, d, clusterId, 'install', now));
    out.revisions.push(this.#revisionRow(id, node, actions, 1, 'CREATE', inputValues, 'deployment', now));
    out.nodes.push({
      cluster_id: clusterId,
      node,
      position,
      phase: 'installing',
      install_deployment_id: id,
      uninstall_deployment_id: null,
      step_deadline_ms: rows.stepDeadlineMs,
      uninstall_started_at: null,
      uninstall_finished_at: null,
      install_started_at: now,
      install_finished_at: null,
      reason: null,
      nodegroup: g.name,
      health_deployment_id: null,
      check_started_at: null,
      ended_at_ms: null,
    });
    if (out.pending >= CLUSTER_INSERT_BATCH_ENTRIES) await this.#insertMembers(out);
  }

  /** Inserts the members' rows not inserted yet: each member's deployments, then their revisions, then its own row. */
  async #insertMembers(m: MemberRows): Promise<void> {
    if (m.pending === 0) return;
    const deployments = m.deployments;
    const revisions = m.revisions;
    const nodes = m.nodes.slice(m.inserted);
    m.deployments = [];
    m.revisions = [];
    m.inserted = m.nodes.length;
    await this.#s.depInsertMany.run(deployments);
    await this.#s.revInsertMany.run(revisions);
    await this.#s.cnInsertMany.run(nodes.map((n) => MEMBER_COLUMNS.map((c) => n[c])));
  }

  async insertNodegroup(
    clusterId: string,
    g: NewNodegroup,
    rows: Pick<ClusterRows, 'installActions' | 'stepDeadlineMs'>,
    nowMs: number,
  ): Promise<void> {
    this.#live();
    await this.#assertFreeNodes(g.nodes);
    await this.#assertGroupConfigs(g, '');
    const name = ((await this.#s.clusterName.get(clusterId)) as { name: string } | undefined)?.name;
    if (name === undefined) throw new HeraldError('not_found', `no cluster ${clusterId}`);
    const now = this.#r.iso(nowMs);
    await this.#insertGroupRow(clusterId, g, ((await this.#s.ngNextPosition.get(clusterId)) as { p: number }).p, now);
    let position = ((await this.#s.cnNextPosition.get(clusterId)) as { p: number }).p;
    const members = new MemberRows();
    for (const node of g.nodes) await this.#addMember(members, clusterId, name, g, node, position++, rows, now);
    await this.#insertMembers(members);
    this.changes.clusterChanged(clusterId);
  }

  async removeNodegroup(clusterId: string, name: string): Promise<void> {
    this.#live();
    for (const { node } of (await this.#s.cnOfGroup.all(clusterId, name)) as Array<{ node: string }>)
      for (const { id } of (await this.#s.depIdsByClusterNode.all(clusterId, node)) as Array<{ id: string }>)
        await this.#removeDeployment(id);
    await this.#s.cnDeleteGroup.run(clusterId, name);
    await this.#s.ngDeleteOne.run(clusterId, name);
    this.changes.clusterChanged(clusterId);
  }

  async clusterHead(id: string): Promise<ClusterHead | undefined> {
    this.#live();
    return await this.#r.clusterHead(id, true);
  }

  async claimActiveClusters(): Promise<string[]> {
    this.#live();
    return ((await this.#s.clusterActiveClaim.all()) as Array<{ id: string }>).map((r) => r.id);
  }

  async glance(clusterId: string): Promise<ClusterGlance> {
    this.#live();
    const q = (await this.#s.cnGlance.get(clusterId, clusterId, clusterId, clusterId, clusterId)) as {
      due_uninstall: number | null;
      due_install: number | null;
      in_flight: number;
      pending: number;
      failed: number;
    };
    return {
      dueUninstallMs: q.due_uninstall,
      dueInstallMs: q.due_install,
      inFlight: Number(q.in_flight) !== 0,
      pending: Number(q.pending) !== 0,
      failed: Number(q.failed) !== 0,
    };
  }

  async countInFlight(clusterId: string, upTo: number): Promise<number> {
    this.#live();
    return ((await this.#s.cnInFlightCount.get(clusterId, upTo)) as { n: number }).n;
  }

  async clusterNodes(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#live();
    return ((await this.#s.cnList.all(clusterId)) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async nodesInFlight(clusterId: string): Promise<ClusterNodeRecord[]> {
    this.#live();
    return ((await this.#s.cnInFlight.all(clusterId)) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async firstPending(clusterId: string, limit: number): Promise<ClusterNodeRecord[]> {
    this.#live();
    return ((await this.#s.cnFirstPending.all(clusterId, limit)) as ClusterNodeRow[]).map(clusterNodeOf);
  }

  async clusterNode(clusterId: string, node: string): Promise<ClusterNodeRecord | undefined> {
    this.#live();
    const r = (await this.#s.cnGet.get(clusterId, node)) as ClusterNodeRow | undefined;
    return r && clusterNodeOf(r);
  }

  async setNodeStep(clusterId: string, node: string, change: NodeStepChange, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    switch (change.type) {
      case 'start':
        if (change.step === 'uninstall')
          await this.#s.cnStartUninstall.run(
            change.deadlineMs,
            at,
            change.uninstallDeploymentId ?? null,
            clusterId,
            node,
          );
        else await this.#s.cnStartInstall.run(change.deadlineMs, at, clusterId, node);
        break;
      case 'uninstalled':
        await this.#s.cnUninstallDone.run(at, clusterId, node);
        break;
      case 'check':
        await this.#s.cnStartCheck.run(change.deadlineMs, at, at, change.healthDeploymentId, clusterId, node);
        break;
      case 'complete':
        await this.#s.cnComplete.run(change.installFinished ? at : null, nowMs, clusterId, node);
        break;
      case 'fail':
        if (change.step === 'uninstall') await this.#s.cnFailUninstall.run(at, change.reason, nowMs, clusterId, node);
        else if (change.step === 'install') await this.#s.cnFailInstall.run(at, change.reason, nowMs, clusterId, node);
        else await this.#s.cnFailCheck.run(change.reason, nowMs, clusterId, node);
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
    await this.#s.clusterStart.run(
      `${op.toUpperCase()}_IN_PROGRESS`,
      `${op} in progress`,
      op,
      maxUnavailable,
      now,
      now,
      clusterId,
    );
    await this.#s.clusterSetRollout.run(rollout === null ? null : JSON.stringify(rollout), clusterId);
    if (rollout === null) await this.#s.cnReset.run(clusterId);
    else for (const g of rollout.groups) await this.#s.cnResetGroup.run(clusterId, g.name);
    this.changes.clusterChanged(clusterId);
  }

  async nodegroups(clusterId: string): Promise<NodegroupRecord[]> {
    this.#live();
    return await this.#r.nodegroups(clusterId);
  }

  async newHealthDeployment(
    clusterId: string,
    node: string,
    configId: string,
    replaces: string | null,
  ): Promise<string> {
    this.#live();
    if (replaces !== null) await this.#removeDeployment(replaces);
    const id = newId();
    await this.#insertDeployment(
      id,
      { node, configId, name: 'health', actions: ['CHECK'], action: 'CHECK', inputValues: {} },
      clusterId,
      'health',
      'restart',
    );
    return id;
  }

  async newUninstallDeployment(
    clusterId: string,
    node: string,
    actions: DeployAction[],
    action: DeployAction,
    reason: WakeReason,
  ): Promise<{ id: string; configId: string }> {
    this.#live();
    const src = (await this.#s.cnUninstallSource.get(clusterId, node)) as UninstallSourceRow | undefined;
    if (!src) throw new HeraldError('not_found', `cluster ${clusterId} has no node ${node}`);
    if (src.uninstall_deployment_id !== null)
      throw new HeraldError('internal', `node ${node} of cluster ${clusterId} has an uninstall deployment`);
    const configId = src.group_uninstall_config_id ?? src.uninstall_config_id;
    const config = await this.#config(configId);
    if (!config) throw new HeraldError('internal', `cluster ${clusterId} has no config ${configId}`);
    // as the cluster's creation resolved them (service.ts): the group's values over the cluster's
    const values = {
      ...JSON.parse(src.input_values),
      ...(src.group_input_values ? JSON.parse(src.group_input_values) : {}),
    };
    const id = newId();
    const d = {
      node,
      configId,
      name: `${src.name}-uninstall`,
      actions,
      action,
      inputValues: coerceInputValues(config, values),
    };
    // the node needs no lock here (#insertDeployment's): a member cannot be deleted, and its row
    // goes only with its cluster or group, whose head this transaction holds (clusters/tx.ts)
    await this.#writeDeployment(id, d, clusterId, 'uninstall', reason);
    return { id, configId };
  }

  async finishCluster(clusterId: string, status: ClusterStatus, reason: string, nowMs: number): Promise<void> {
    this.#live();
    const at = this.#r.iso(nowMs);
    await this.#s.clusterFinish.run(status, reason, at, at, clusterId);
    this.changes.clusterChanged(clusterId);
  }

  async removeCluster(clusterId: string): Promise<void> {
    this.#live();
    for (const { id } of (await this.#s.depIdsByCluster.all(clusterId)) as Array<{ id: string }>)
      await this.#removeDeployment(id);
    await this.#s.cnDelete.run(clusterId);
    await this.#s.ngDelete.run(clusterId);
    await this.#s.clusterDelete.run(clusterId);
    this.changes.clusterRemoved(clusterId);
  }
}
