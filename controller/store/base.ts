/**
 * What SqliteStore and PgStore share above their connections, written once: every read of
 * `StoreReads` over the rows of controller/store/tx.ts and controller/store/output.ts, each run the way the store reads
 * (`read`: SQLite in turn with its transactions; PostgreSQL on its pool, or in one snapshot
 * when a read takes several statements that must agree), and the one-transaction shortcuts
 * (one StoreTx call in its own transaction, the record read after the commit).
 */
import type {
  AccessGrantRecord,
  AnnounceResult,
  AuditRecord,
  ChangeSet,
  ClusterRecord,
  ClusterRevisionRecord,
  ClusterStatus,
  ConfigRecord,
  DeploymentPatch,
  DeploymentRecord,
  KnownGenerations,
  MetadataRead,
  NewAccessGrant,
  NewConfig,
  NewDeployment,
  NodeFacts,
  NodeRecord,
  RevisionRecord,
} from '../model/records.js';
import type { KeptOutput } from './output.js';
import type { AuditChainRow } from '../../protocol/audit-chain.js';
import type { ChainHead } from './audit-chain.js';
import { ObjectRows } from './objects.js';
import type { SqlOutputRows } from './output.js';
import type { SqlRows } from './tx.js';
import type { Committed, TxFn } from './store.js';

export abstract class SqlStoreBase {
  abstract transaction<T>(fn: TxFn<T>): Promise<Committed<T>>;
  /**
   * Runs a read outside any transaction. `snapshot`: it takes several statements that must see
   * one committed state (a store with MVCC runs them in one read-only snapshot; SQLite's reads
   * are in turn with its transactions anyway).
   */
  protected abstract read<T>(fn: (rows: SqlRows, output: SqlOutputRows) => Promise<T>, snapshot?: boolean): Promise<T>;

  // ---- reads -------------------------------------------------------------------------------

  generation(): Promise<number> {
    return this.read((r) => r.generation());
  }

  getNode(id: string): Promise<NodeRecord | undefined> {
    return this.read((r) => r.node(id));
  }

  isTombstoned(id: string): Promise<boolean> {
    return this.read((r) => r.isTombstoned(id));
  }

  listNodes(): Promise<NodeRecord[]> {
    return this.read((r) => r.nodes());
  }

  getConfig(id: string): Promise<ConfigRecord | undefined> {
    return this.read((r) => r.config(id));
  }

  listConfigs(): Promise<ConfigRecord[]> {
    return this.read((r) => r.configs());
  }

  getDeployment(id: string): Promise<DeploymentRecord | undefined> {
    return this.read((r) => r.deployment(id));
  }

  listDeployments(filter: { node?: string | undefined } = {}): Promise<DeploymentRecord[]> {
    return this.read((r) => r.deployments(filter));
  }

  listRevisions(id: string): Promise<RevisionRecord[]> {
    return this.read((r) => r.revisions(id));
  }

  /** The node's generation and its deployments agree: the generation an agent acknowledges is never newer than what it was given. */
  metadataSource(node: string, known?: KnownGenerations): Promise<MetadataRead | undefined> {
    return this.read((r) => r.metadataSource(node, known), true);
  }

  getCluster(id: string): Promise<ClusterRecord | undefined> {
    return this.read((r) => r.cluster(id), true);
  }

  getClusterStatus(id: string): Promise<{ status: ClusterStatus; statusReason: string } | undefined> {
    return this.read((r) => r.clusterStatus(id));
  }

  clusterConfigIds(id: string): Promise<string[] | undefined> {
    return this.read((r) => r.clusterConfigIds(id), true);
  }

  listClusters(): Promise<ClusterRecord[]> {
    return this.read((r) => r.clusters(), true);
  }

  listClusterRevisions(id: string): Promise<ClusterRevisionRecord[] | undefined> {
    return this.read(async (r) => ((await r.clusterStatus(id)) ? await r.clusterRevisions(id) : undefined), true);
  }

  activeClusterIds(): Promise<string[]> {
    return this.read((r) => r.activeClusterIds());
  }

  listAudit(limit = 100, beforeSeq?: number): Promise<AuditRecord[]> {
    return this.read((r) => r.audit(limit, beforeSeq));
  }

  auditPage(afterSeq: number, limit: number): Promise<AuditChainRow[]> {
    return this.read((r) => r.auditPage(afterSeq, limit));
  }

  auditNewestOf(action: string): Promise<number | undefined> {
    return this.read((r) => r.auditNewestOf(action));
  }

  auditHead(): Promise<ChainHead> {
    return this.read((r) => r.auditHead());
  }

  readOutput(deploymentId: string, revision: number): Promise<KeptOutput> {
    return this.read((_, o) => o.read(deploymentId, revision));
  }

  lastOutput(deploymentIds: readonly string[]): Promise<Map<string, string>> {
    return this.read((_, o) => o.lastChunks(deploymentIds));
  }

  listAccessGrants(subject?: string): Promise<AccessGrantRecord[]> {
    return this.read((r) => r.accessGrants(subject));
  }

  nodeLabels(nodes: readonly string[] | null): Promise<Map<string, Record<string, string>>> {
    return this.read((r) => r.nodeLabels(nodes));
  }

  nodeFacts(nodes: readonly string[] | null): Promise<Map<string, NodeFacts>> {
    return this.read((r) => r.nodeFacts(nodes));
  }

  readObjects<T>(fn: (o: ObjectRows) => Promise<T>): Promise<T> {
    return this.read((r) => fn(new ObjectRows(r.s, r.now)));
  }

  // ---- one-transaction shortcuts -----------------------------------------------------------

  async createNode(
    id: string,
    endpoint: string | null,
    who: string,
  ): Promise<{ node: NodeRecord; changes: ChangeSet }> {
    const { changes } = await this.transaction((tx) => tx.createNode(id, endpoint, who));
    return { node: (await this.getNode(id))!, changes };
  }

  async announceEndpoint(id: string, url: string, who: string, autoRegister: boolean): Promise<AnnounceResult> {
    const { result, changes } = await this.transaction((tx) => tx.announceEndpoint(id, url, who, autoRegister));
    return { node: (await this.getNode(id))!, ...result, changes };
  }

  async createAccessGrant(g: NewAccessGrant, who: string): Promise<AccessGrantRecord> {
    return (await this.transaction((tx) => tx.createAccessGrant(g, who))).result;
  }

  async deleteAccessGrant(id: string, who: string): Promise<AccessGrantRecord> {
    return (await this.transaction((tx) => tx.deleteAccessGrant(id, who))).result;
  }

  async deleteNode(id: string, who: string): Promise<ChangeSet> {
    return (await this.transaction((tx) => tx.deleteNode(id, who))).changes;
  }

  async createConfig(c: NewConfig, who: string): Promise<ConfigRecord> {
    return (await this.transaction((tx) => tx.createConfig(c, who))).result;
  }

  async createDeployment(d: NewDeployment, who: string): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.createDeployment(d, who));
    return { deployment: result, changes };
  }

  async updateDeployment(
    id: string,
    p: DeploymentPatch,
    who: string,
  ): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.updateDeployment(id, p, who));
    return { deployment: result, changes };
  }

  async deleteDeployment(
    id: string,
    who: string,
  ): Promise<{ deployment: DeploymentRecord | null; changes: ChangeSet }> {
    const { result, changes } = await this.transaction((tx) => tx.deleteDeployment(id, who));
    return { deployment: result, changes };
  }
}
