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
import { AUDIT_LIST_DETAIL_MAX_BYTES, CLUSTER_INSERT_BATCH_ENTRIES } from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { ChangeSetBuilder } from '../model/change-set.js';
import { newId } from './ids.js';
import { grantOf, readGrants, readNodeFacts, readNodeLabels, type GrantRow } from './access-rows.js';
import { chainRowOf, type AuditEntry, type AuditWriter, type ChainHead } from './audit-chain.js';
import { AUDIT_GENESIS_HASH, type AuditChainRow } from '../../protocol/audit-chain.js';
import { ObjectRows } from './objects.js';
import { inDocument, knows } from '../model/document.js';
import { coerceInputValues } from '../model/inputs.js';
import type {
  ClusterGlance,
  ClusterHead,
  ClusterRows,
  DeploymentSource,
  NodeStepChange,
  StepResult,
} from '../clusters/tx.js';
import type {
  AccessGrantRecord,
  AuditRecord,
  ClusterNodeRecord,
  ClusterOperation,
  ClusterRecord,
  ClusterRevisionRecord,
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
  NewClusterRevision,
  NewDeployment,
  NewAccessGrant,
  NewNodegroup,
  NodeFacts,
  NodegroupRecord,
  NodeRecord,
  RevisionGroup,
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
  type ClusterRevisionRow,
  clusterRevisionOf,
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

  /** Every grant, or `subject`'s (docs/access.md). */
  accessGrants(subject?: string): Promise<AccessGrantRecord[]> {
    return readGrants(this.s, subject);
  }

  nodeLabels(nodes: readonly string[] | null): Promise<Map<string, Record<string, string>>> {
    return readNodeLabels(this.s, nodes);
  }

  nodeFacts(nodes: readonly string[] | null): Promise<Map<string, NodeFacts>> {
    return readNodeFacts(this.s, nodes);
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
        revision: Number(r.revision ?? 1),
      }
    );
  }

  /**
   * Revision `revision` of the cluster. A cluster made before revisions has none written: its
   * revision 1 is then its rows as they are (stable unless its create failed or runs).
   */
  async clusterRevision(id: string, revision: number): Promise<ClusterRevisionRecord | undefined> {
    const r = (await this.s.crGet.get(id, revision)) as ClusterRevisionRow | undefined;
    if (r) return clusterRevisionOf(r);
    if (revision !== 1 || Number(((await this.s.crCount.get(id)) as { n: number }).n) !== 0) return undefined;
    return await this.#firstRevision(id);
  }

  /** Every revision of the cluster, oldest first (see clusterRevision). */
  async clusterRevisions(id: string): Promise<ClusterRevisionRecord[]> {
    const rows = ((await this.s.crList.all(id)) as ClusterRevisionRow[]).map(clusterRevisionOf);
    if (rows.length > 0) return rows;
    const first = await this.#firstRevision(id);
    return first ? [first] : [];
  }

  /** The revision 1 of a cluster made before revisions: its rows. */
  async #firstRevision(id: string): Promise<ClusterRevisionRecord | undefined> {
    const c = (await this.s.clusterGet.get(id)) as ClusterRow | undefined;
    if (!c) return undefined;
    return {
      revision: 1,
      installConfigId: c.install_config_id,
      uninstallConfigId: c.uninstall_config_id,
      inputValues: JSON.parse(c.input_values) as Record<string, unknown>,
      nodegroups: (await this.nodegroups(id)).map((g) => ({
        name: g.name,
        installConfigId: g.installConfigId,
        uninstallConfigId: g.uninstallConfigId,
        inputValues: g.inputValues,
      })),
      createdAt: c.created_at,
      createdBy: '',
      stableAt: c.status === 'CREATE_IN_PROGRESS' || c.status === 'CREATE_FAILED' ? null : c.created_at,
      sourceRevision: null,
    };
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
    // and every earlier revision's: a node may still have them, and values they hide stay hidden
    for (const rev of (await this.s.crList.all(id)) as ClusterRevisionRow[]) {
      ids.add(rev.install_config_id);
      ids.add(rev.uninstall_config_id);
      for (const g of JSON.parse(rev.nodegroups) as RevisionGroup[]) {
        if (g.installConfigId !== null) ids.add(g.installConfigId);
        if (g.uninstallConfigId !== null) ids.add(g.uninstallConfigId);
      }
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

  /** The newest rows, newest first; `beforeSeq`: only rows before that seq (paging back). */
  async audit(limit: number, beforeSeq?: number): Promise<AuditRecord[]> {
    const rows = (
      beforeSeq === undefined ? await this.s.auditList.all(limit) : await this.s.auditListBefore.all(beforeSeq, limit)
    ) as Array<Record<string, unknown>>;
    return rows.map((raw) => {
      const r = chainRowOf(raw);
      // (a request's whole body may be a megabyte: the list names its length, the export has it)
      const bytes = r.detail === null ? 0 : Buffer.byteLength(r.detail);
      const omit = bytes > AUDIT_LIST_DETAIL_MAX_BYTES;
      return {
        seq: r.seq,
        at: r.at,
        who: r.who,
        action: r.action,
        target: r.target,
        detail: r.detail === null || omit ? null : (JSON.parse(r.detail) as Record<string, unknown>),
        ...(omit ? { detailBytes: bytes } : {}),
        outcome: r.outcome,
        controller: r.controller,
        prevHash: r.prev_hash,
        hash: r.hash,
      };
    });
  }

  /** Up to `limit` rows after `afterSeq`, oldest first, as the chain hashes them. */
  async auditPage(afterSeq: number, limit: number): Promise<AuditChainRow[]> {
    return ((await this.s.auditPage.all(afterSeq, limit)) as Array<Record<string, unknown>>).map(chainRowOf);
  }

  /** The seq of the newest row of `action`, if any. */
  async auditNewestOf(action: string): Promise<number | undefined> {
    const r = (await this.s.auditNewestOf.get(action)) as { seq: number } | undefined;
    return r === undefined ? undefined : Number(r.seq);
  }

  /** The chain head the last append recorded. */
  async auditHead(): Promise<ChainHead> {
    const r = (await this.s.auditHeadGet.get()) as { seq: number; hash: string } | undefined;
    return r === undefined ? { seq: 0, hash: AUDIT_GENESIS_HASH } : { seq: Number(r.seq), hash: r.hash };
  }
}

/** One transaction (or savepoint) on SQLite; valid until `end()`. */
export class SqlTx implements StoreTx {
  readonly changes: ChangeSetBuilder;
  readonly #r: SqlRows;
  readonly #s: Statements;
  readonly #chain: AuditWriter;
  /** The audit rows of this unit's changes, written when its work is done (`flushAudit`). */
  readonly #audits: AuditEntry[] = [];
  #ended = false;
  /**
   * The configs this transaction has read, by id: the store's cache is filled only outside a
   * transaction (one that rolls back may have created what it read), and a cluster's nodes name
   * the same few configs thousands of times in one transaction.
   */
  readonly #configs = new Map<string, ConfigRecord>();

  constructor(rows: SqlRows, changes: ChangeSetBuilder, chain: AuditWriter) {
    this.#r = rows;
    this.#s = rows.s;
    this.changes = changes;
    this.#chain = chain;
  }

  /** The audit chain in this transaction: rows appended at once, the head locked at its first use. */
  get auditChain(): AuditWriter {
    this.#live();
    return this.#chain;
  }

  /**
   * Appends the audit rows this unit's changes recorded: the store calls it once the unit's work
   * is done, so the chain head's lock is taken late and held shortly (controller/store/audit-chain.ts).
   */
  async flushAudit(): Promise<void> {
    this.#live();
    if (this.#audits.length > 0) await this.#chain.append(this.#audits.splice(0));
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
    this.#audits.push({ at: this.#r.iso(), who, action, target, detail });
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
    await this.#s.labelsDelete.run(id);
    await this.#s.tombInsert.run(id, this.#r.iso(), who);
    this.changes.nodeRemoved(id);
    await this.audit(who, 'node.delete', id);
  }

  /** The labels of `ids` as this transaction sees them (a node without labels is absent). */
  async nodeLabels(ids: readonly string[]): Promise<Map<string, Record<string, string>>> {
    this.#live();
    return await this.#r.nodeLabels(ids);
  }

  /**
   * Replaces the node's labels (docs/access.md); none removes them. No generation: labels are not
   * in the node's metadata. @throws HeraldError not_found
   */
  async setNodeLabels(id: string, labels: Readonly<Record<string, string>>, who: string): Promise<void> {
    this.#live();
    if (!(await this.#s.nodeKeyLock.get(id))) throw new HeraldError('not_found', `no node ${id}`);
    if (Object.keys(labels).length === 0) await this.#s.labelsDelete.run(id);
    else await this.#s.labelsSet.run(id, JSON.stringify(labels));
    this.changes.nodeChanged(id);
    await this.audit(who, 'node.labels', id, { labels });
  }

  // ---- who may do what (docs/access.md) ----------------------------------------------------

  async createAccessGrant(g: NewAccessGrant, who: string): Promise<AccessGrantRecord> {
    this.#live();
    const at = this.#r.iso();
    await this.#s.grantInsert.run(g.id, g.subject, g.role, JSON.stringify(g.scope), at, who);
    await this.audit(who, 'access.grant', g.id, { subject: g.subject, role: g.role, scope: g.scope });
    return { ...g, createdAt: at, createdBy: who };
  }

  /** @throws HeraldError not_found */
  async deleteAccessGrant(id: string, who: string): Promise<AccessGrantRecord> {
    this.#live();
    const row = (await this.#s.grantGet.get(id)) as GrantRow | undefined;
    if (!row) throw new HeraldError('not_found', `no grant ${id}`);
    const g = grantOf(row);
    await this.#s.grantDelete.run(id);
    await this.audit(who, 'access.revoke', id, { subject: g.subject, role: g.role, scope: g.scope });
    return g;
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
    this.changes.deploymentRemoved(id, d.node);
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
      revision: 1,
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
    // its revision 1 (docs/api.md "Revisions"): stable once the create completed
    await this.#insertRevision(
      id,
      1,
      {
        installConfigId: c.installConfigId,
        uninstallConfigId: c.uninstallConfigId,
        inputValues: c.inputValues,
        nodegroups: c.nodegroups.map((g) => ({
          name: g.name,
          installConfigId: g.ownInstallConfigId,
          uninstallConfigId: g.ownUninstallConfigId,
          inputValues: g.ownInputValues,
        })),
        sourceRevision: null,
      },
      c.createdBy,
      now,
      null,
    );
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
    revision = 1,
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
      revision,
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
    const head = (await this.#s.clusterGet.get(clusterId)) as ClusterRow | undefined;
    if (head === undefined) throw new HeraldError('not_found', `no cluster ${clusterId}`);
    const { name } = head;
    const revision = Number(head.revision ?? 1);
    const now = this.#r.iso(nowMs);
    await this.#insertGroupRow(clusterId, g, ((await this.#s.ngNextPosition.get(clusterId)) as { p: number }).p, now);
    let position = ((await this.#s.cnNextPosition.get(clusterId)) as { p: number }).p;
    const members = new MemberRows();
    for (const node of g.nodes)
      await this.#addMember(members, clusterId, name, g, node, position++, rows, now, revision);
    await this.#insertMembers(members);
    // the group's own configs and values join the cluster's revision: no node of it had others
    const cur = (await this.#s.crGet.get(clusterId, revision)) as ClusterRevisionRow | undefined;
    if (cur) {
      const groups = (JSON.parse(cur.nodegroups) as RevisionGroup[]).filter((x) => x.name !== g.name);
      groups.push({
        name: g.name,
        installConfigId: g.ownInstallConfigId,
        uninstallConfigId: g.ownUninstallConfigId,
        inputValues: g.ownInputValues,
      });
      await this.#s.crSetGroups.run(JSON.stringify(groups), clusterId, revision);
    }
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
    source?: DeploymentSource,
  ): Promise<{ id: string; configId: string }> {
    this.#live();
    const src = (await this.#s.cnUninstallSource.get(clusterId, node)) as UninstallSourceRow | undefined;
    if (!src) throw new HeraldError('not_found', `cluster ${clusterId} has no node ${node}`);
    if (src.uninstall_deployment_id !== null)
      throw new HeraldError('internal', `node ${node} of cluster ${clusterId} has an uninstall deployment`);
    const configId = source?.configId ?? src.group_uninstall_config_id ?? src.uninstall_config_id;
    const config = await this.#config(configId);
    if (!config) throw new HeraldError('internal', `cluster ${clusterId} has no config ${configId}`);
    // as the cluster's creation resolved them (service.ts): the group's values over the cluster's
    const values = source?.inputValues ?? {
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

  async reviseDeployment(
    d: DeploymentRecord,
    to: DeploymentSource,
    action: DeployAction,
    reason: WakeReason,
  ): Promise<void> {
    this.#live();
    const config = await this.#config(to.configId);
    if (!config) throw new HeraldError('internal', `deployment ${d.id}: no config ${to.configId}`);
    const values = coerceInputValues(config, to.inputValues);
    if (config.id !== d.configId) await this.#s.depSetConfig.run(config.id, d.id);
    await this.#newRevision(d.id, d.node, d.actions, d.current.revision, action, values, reason);
  }

  async dropUninstallDeployment(clusterId: string, node: string): Promise<void> {
    this.#live();
    const n = (await this.#s.cnGet.get(clusterId, node)) as ClusterNodeRow | undefined;
    if (!n || n.uninstall_deployment_id === null) return;
    await this.#s.cnDropUninstall.run(clusterId, node);
    await this.#removeDeployment(n.uninstall_deployment_id);
    this.changes.clusterChanged(clusterId);
  }

  async clusterRevision(clusterId: string, revision: number): Promise<ClusterRevisionRecord | undefined> {
    this.#live();
    return await this.#r.clusterRevision(clusterId, revision);
  }

  async clusterRevisions(clusterId: string): Promise<ClusterRevisionRecord[]> {
    this.#live();
    return await this.#r.clusterRevisions(clusterId);
  }

  async #insertRevision(
    clusterId: string,
    revision: number,
    r: NewClusterRevision,
    who: string,
    at: string,
    stableAt: string | null,
  ): Promise<void> {
    await this.#s.crInsert.run(
      clusterId,
      revision,
      r.installConfigId,
      r.uninstallConfigId,
      JSON.stringify(r.inputValues),
      JSON.stringify(r.nodegroups),
      at,
      who,
      stableAt,
      r.sourceRevision,
    );
  }

  async addClusterRevision(clusterId: string, r: NewClusterRevision, who: string, nowMs: number): Promise<number> {
    this.#live();
    const head = (await this.#s.clusterGet.get(clusterId)) as ClusterRow | undefined;
    if (!head) throw new HeraldError('not_found', `no cluster ${clusterId}`);
    const cur = Number(head.revision ?? 1);
    if (Number(((await this.#s.crCount.get(clusterId)) as { n: number }).n) === 0) {
      // a cluster made before revisions: its revision 1, as its rows are, written first
      const first = await this.#r.clusterRevision(clusterId, 1);
      if (first) await this.#insertRevision(clusterId, 1, first, first.createdBy, first.createdAt, first.stableAt);
    }
    const at = this.#r.iso(nowMs);
    const revision = cur + 1;
    await this.#insertRevision(clusterId, revision, r, who, at, null);
    await this.#s.clusterSetConfigs.run(
      r.installConfigId,
      r.uninstallConfigId,
      JSON.stringify(r.inputValues),
      revision,
      at,
      clusterId,
    );
    for (const g of r.nodegroups)
      await this.#s.ngSetOwn.run(
        g.installConfigId,
        g.uninstallConfigId,
        g.inputValues === null ? null : JSON.stringify(g.inputValues),
        clusterId,
        g.name,
      );
    this.changes.clusterChanged(clusterId);
    return revision;
  }

  async markRevisionStable(clusterId: string, revision: number, nowMs: number): Promise<void> {
    this.#live();
    if (Number(((await this.#s.crCount.get(clusterId)) as { n: number }).n) === 0) return; // (revision 1 read from the rows is)
    await this.#s.crSetStable.run(this.#r.iso(nowMs), clusterId, revision);
  }

  async setRollout(clusterId: string, rollout: Rollout): Promise<void> {
    this.#live();
    await this.#s.clusterSetRollout.run(JSON.stringify(rollout), clusterId);
    this.changes.clusterChanged(clusterId);
  }

  async setNodeRevision(clusterId: string, node: string, revision: number): Promise<void> {
    this.#live();
    await this.#s.cnSetRevision.run(revision, clusterId, node);
    this.changes.clusterChanged(clusterId);
  }

  async resetNodes(clusterId: string, nodes: readonly string[]): Promise<void> {
    this.#live();
    for (const n of nodes) await this.#s.cnResetOne.run(clusterId, n);
    this.changes.clusterChanged(clusterId);
  }

  async settleNode(clusterId: string, node: string): Promise<void> {
    this.#live();
    await this.#s.cnSettle.run(clusterId, node);
    this.changes.clusterChanged(clusterId);
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
    await this.#s.crDelete.run(clusterId);
    await this.#s.clusterDelete.run(clusterId);
    this.changes.clusterRemoved(clusterId);
  }
}
