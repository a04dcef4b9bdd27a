/**
 * The controller's durable state, behind one asynchronous interface: nodes (and tombstones of
 * deleted ids), immutable configs, deployments with one row per revision, clusters and their
 * per-node phases, the audit trail, and the one global generation sequence (docs/api.md
 * "Generations"). SqliteStore implements it; a PostgreSQL store can (docs/several-controllers.md).
 *
 * Changes run in transactions: `transaction(fn)` gives `fn` a `StoreTx`, and everything `fn`
 * does through it commits together (with its audit rows and one generation bump for the nodes
 * it touched) or not at all; the result says which nodes to wake and what to announce. The
 * store is persistence only: Heat's status rules (heat-status.ts), signals (signal.ts) and the
 * cluster engine (clusters/engine.ts) run inside a transaction on top of it. Validation of
 * names and input values happens above (service.ts); the store checks only what needs its
 * data (existence, revisions, states).
 */
import type { ClusterTx } from '../clusters/tx.js';
import type { AuditChainRow } from '../../protocol/audit-chain.js';
import type { AuditWriter, ChainHead } from './audit-chain.js';
import type { KeptOutput, OutputChunkRecord } from './output.js';
import type { ObjectRows } from './objects.js';
import type {
  ConsumeResult,
  EnrollmentTokenRecord,
  FloorReason,
  IdentityFloorRecord,
  NewEnrollmentToken,
  NodeCertificateRecord,
  SeenCertificate,
} from './enrollment-records.js';
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

export type * from '../model/records.js';

/** A transaction's outcome: what `fn` returned, and what the transaction changed. */
export interface Committed<T> {
  result: T;
  changes: ChangeSet;
}

/** A unit of work in a transaction; it must use only `tx` (a call on the store itself from inside waits for the transaction: a deadlock). */
export type TxFn<T> = (tx: StoreTx) => Promise<T>;

/** One unit's outcome in a group commit. */
export type UnitOutcome<T> = { ok: true; value: Committed<T> } | { ok: false; error: unknown };

/**
 * Reads outside any transaction. Each sees only committed data: while a write transaction is
 * open, a read waits for its end (SQLite: one connection), or reads the last committed state
 * (a store with MVCC). Each resolves to one consistent snapshot of what it returns.
 */
export interface StoreReads {
  /** The sequence's current value (0 before any change). */
  generation(): Promise<number>;
  getNode(id: string): Promise<NodeRecord | undefined>;
  isTombstoned(id: string): Promise<boolean>;
  listNodes(): Promise<NodeRecord[]>;
  getConfig(id: string): Promise<ConfigRecord | undefined>;
  listConfigs(): Promise<ConfigRecord[]>;
  getDeployment(id: string): Promise<DeploymentRecord | undefined>;
  listDeployments(filter?: { node?: string | undefined }): Promise<DeploymentRecord[]>;
  /** Revisions of a deployment, oldest first. */
  listRevisions(id: string): Promise<RevisionRecord[]>;
  /**
   * The node and, unless its generation is among `known` (the asker holds it, or its document is
   * built already; default none), every deployment's current revision and config, in one
   * snapshot: on PostgreSQL one statement, whichever (a fetch is one round trip to the database);
   * on SQLite the node's read, then its deployments' when wanted.
   */
  metadataSource(node: string, known?: KnownGenerations): Promise<MetadataRead | undefined>;
  getCluster(id: string): Promise<ClusterRecord | undefined>;
  /** A cluster's status alone (no nodes): O(1), for the path of every signal. */
  getClusterStatus(id: string): Promise<{ status: ClusterStatus; statusReason: string } | undefined>;
  /** Every config that feeds the cluster's deployments (their hidden inputs are hidden in all of them). */
  clusterConfigIds(id: string): Promise<string[] | undefined>;
  listClusters(): Promise<ClusterRecord[]>;
  /** A cluster's revisions, oldest first (docs/api.md "Revisions"); undefined: no such cluster. */
  listClusterRevisions(id: string): Promise<ClusterRevisionRecord[] | undefined>;
  /** Cluster ids with an operation in flight (the timer opens a transaction only when there are some). */
  activeClusterIds(): Promise<string[]>;
  /** The newest `limit` (default 100) audit rows, newest first; with `beforeSeq`, those before it. */
  listAudit(limit?: number, beforeSeq?: number): Promise<AuditRecord[]>;
  /** Up to `limit` audit rows after `afterSeq`, oldest first, as the hash chain holds them (docs/access.md). */
  auditPage(afterSeq: number, limit: number): Promise<AuditChainRow[]>;
  /** The seq of the newest audit row of `action` (`audit.checkpoint`), if any. */
  auditNewestOf(action: string): Promise<number | undefined>;
  /** The audit chain's head as the last append recorded it (seq 0 and the genesis hash before any row). */
  auditHead(): Promise<ChainHead>;
  /** A revision's kept live output chunks (docs/api.md), oldest first, and the bytes cut per stream. */
  readOutput(deploymentId: string, revision: number): Promise<KeptOutput>;
  /** The text of the newest live output chunk of each deployment's current revision (none: absent). */
  lastOutput(deploymentIds: readonly string[]): Promise<Map<string, string>>;
  /** Every grant (docs/access.md), or `subject`'s, oldest first. */
  listAccessGrants(subject?: string): Promise<AccessGrantRecord[]>;
  /** The labels of `nodes` (null: of every node); a node without labels is absent. */
  nodeLabels(nodes: readonly string[] | null): Promise<Map<string, Record<string, string>>>;
  /** What a scope check knows of `nodes` (null: of every node): labels and cluster; a node that does not exist is absent. */
  nodeFacts(nodes: readonly string[] | null): Promise<Map<string, NodeFacts>>;
  /** Reads of Heat's object store (docs/heat.md), outside any transaction. */
  readObjects<T>(fn: (o: ObjectRows) => Promise<T>): Promise<T>;
}

/**
 * The controller's storage. Methods reject with HeraldError and a code (`not_found`,
 * `node_exists`, `node_deleted`, `unknown_node`, `unknown_config`, `deployment_busy`,
 * `deployment_deleting`, `node_in_cluster`, `cluster_busy`; `internal` once closed); `who` is
 * the caller's SPIFFE id, written to the audit trail.
 */
export interface Store extends StoreReads {
  /**
   * Runs `fn` in one transaction (SQLite: BEGIN IMMEDIATE … COMMIT; transactions never
   * interleave). When `fn` resolves, the touched nodes take one new generation, and the
   * transaction commits; when it rejects (or the commit fails) everything is rolled back and
   * the promise rejects with that error. Resolves only after the commit is durable.
   */
  transaction<T>(fn: TxFn<T>): Promise<Committed<T>>;
  /**
   * Group commit: runs `units` in order in one transaction, each in its own savepoint with its
   * own generation and change set, so one unit's error undoes that unit alone; one commit (one
   * fsync) for all. Resolves after the commit with each unit's outcome; rejects only when the
   * shared transaction itself fails (then nothing of any unit was kept).
   */
  group<T>(units: ReadonlyArray<TxFn<T>>): Promise<Array<UnitOutcome<T>>>;

  // one-transaction shortcuts for what StoreTx does; records are read after the commit
  createNode(id: string, endpoint: string | null, who: string): Promise<{ node: NodeRecord; changes: ChangeSet }>;
  /** An agent's announcement; creates the node when `autoRegister` (else `not_found`). */
  announceEndpoint(id: string, url: string, who: string, autoRegister: boolean): Promise<AnnounceResult>;
  /** Removes the node and its deployments, leaves a tombstone. */
  deleteNode(id: string, who: string): Promise<ChangeSet>;
  createConfig(c: NewConfig, who: string): Promise<ConfigRecord>;
  createDeployment(d: NewDeployment, who: string): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }>;
  updateDeployment(
    id: string,
    p: DeploymentPatch,
    who: string,
  ): Promise<{ deployment: DeploymentRecord; changes: ChangeSet }>;
  /** `deployment` is null when it was removed at once (no DELETE run). */
  deleteDeployment(id: string, who: string): Promise<{ deployment: DeploymentRecord | null; changes: ChangeSet }>;

  /**
   * Keeps one live output chunk (no generation, no audit: output is not state the agent reads);
   * `duplicate` when that sequence number of the revision was kept before. Only the newest
   * OUTPUT_KEPT_PER_REVISION_BYTES of a revision stay.
   */
  appendOutput(chunk: OutputChunkRecord): Promise<{ duplicate: boolean }>;
  // ---- enrolment (docs/adding-nodes.md): no generation; each change one transaction with its audit row ----
  /** Stores a join token (only its hash); audit `enrollment_token.create`. */
  createEnrollmentToken(t: NewEnrollmentToken, who: string): Promise<EnrollmentTokenRecord>;
  /** Every token, oldest first, without secrets or hashes. */
  listEnrollmentTokens(): Promise<EnrollmentTokenRecord[]>;
  /**
   * Sets `revoked_at` (once; revoking again changes nothing and writes no audit row); audit
   * `enrollment_token.revoke`. @throws HeraldError not_found
   */
  revokeEnrollmentToken(id: string, who: string): Promise<EnrollmentTokenRecord>;
  /**
   * Marks the token with this hash used, atomically and at most once: only when it exists, is
   * unused, unrevoked, unexpired (expires_at after now) and for `node`; else says why (checked
   * in that order: unknown, revoked, used, expired, wrong_node) and changes nothing. Audit
   * `enrollment_token.use` by `usedBy` on success.
   */
  consumeEnrollmentToken(tokenHash: string, node: string, usedBy: string): Promise<ConsumeResult>;
  /** What the controller knows of the node's certificate, or undefined. */
  getNodeCertificate(node: string): Promise<NodeCertificateRecord | undefined>;
  /**
   * Records a node's certificate. `issued`: this controller issued it now (failures reset to 0,
   * issued_at and last attempt set; audit `certificate.issue`). Else a certificate seen on a
   * request: its serial and dates replace the row's (nothing is written when the serial is
   * the one stored).
   */
  noteNodeCertificate(node: string, c: SeenCertificate, who: string): Promise<void>;
  /**
   * A failed renewal of a node that has a row: renewal_failures = max(renewal_failures + 1,
   * reported), last error and attempt time set. No audit row (nothing changed hands).
   */
  noteRenewalFailure(node: string, code: string, reported: number): Promise<void>;
  /** Every node's identity floor (enrollment-records.ts IdentityFloorRecord). */
  listIdentityFloors(): Promise<IdentityFloorRecord[]>;
  /**
   * Raises `node`'s identity floor to `notBefore` (never lowers it) and records `renewed`, the
   * certificate a renewal just issued (null clears it). `reason` 'revoke' writes the audit row
   * `node.revoke` by `who`.
   */
  raiseIdentityFloor(
    node: string,
    notBefore: string,
    renewed: { serial: string; notBefore: string } | null,
    reason: FloorReason,
    who: string,
  ): Promise<void>;
  /** The renewed certificate `serial` of `node` was used: its floor rises to that certificate's notBefore. */
  retireSupersededCertificates(node: string, serial: string): Promise<boolean>;
  /** Raises nodes' acknowledged generations (never lowers them); one transaction for the batch, no generation. */
  recordAcked(acks: ReadonlyMap<string, number>): Promise<void>;
  // ---- who may do what (docs/access.md): each change one transaction with its audit row ----
  createAccessGrant(g: NewAccessGrant, who: string): Promise<AccessGrantRecord>;
  /** @throws HeraldError not_found */
  deleteAccessGrant(id: string, who: string): Promise<AccessGrantRecord>;
  /** Waits for the open transaction, then closes; later calls reject `internal`. Idempotent. */
  close(): Promise<void>;
}

/**
 * One open transaction (or a savepoint of a group commit). Reads through it see its own
 * writes; a store with row locks locks the rows it reads for change (`SELECT … FOR UPDATE`:
 * the deployment a signal or a revision changes, the cluster head, see clusters/tx.ts). It is
 * valid only until the callback that received it settles; using it later rejects `internal`.
 */
export interface StoreTx extends ClusterTx {
  /** Heat's object store (docs/heat.md), its writes in this transaction. */
  readonly objects: ObjectRows;
  /**
   * The audit trail's hash chain in this transaction (docs/access.md): rows appended at once, the
   * head locked at its first use (a change's own rows, `audit()`, are appended at its end).
   */
  readonly auditChain: AuditWriter;
  node(id: string): Promise<NodeRecord | undefined>;
  /** @throws HeraldError node_exists (field `id`) */
  createNode(id: string, endpoint: string | null, who: string): Promise<void>;
  /**
   * Sets the node's endpoint; creates the node when unknown and `autoRegister`.
   * @throws HeraldError node_deleted | not_found
   */
  announceEndpoint(
    id: string,
    url: string,
    who: string,
    autoRegister: boolean,
  ): Promise<{ created: boolean; changed: boolean }>;
  /** @throws HeraldError not_found | node_in_cluster */
  deleteNode(id: string, who: string): Promise<void>;
  createConfig(c: NewConfig, who: string): Promise<ConfigRecord>;
  /** @throws HeraldError unknown_node (field `node`) | unknown_config (field `config_id`) */
  createDeployment(d: NewDeployment, who: string): Promise<DeploymentRecord>;
  /**
   * A new revision (action default UPDATE) of revision `p.revises`, which must still be current.
   * A caller that merges into the current values reads them through `deployment(id)` in this
   * same transaction (the row stays locked to the commit), never from an earlier read.
   * @throws HeraldError not_found | deployment_busy | deployment_deleting | internal (`p.revises` is not current)
   */
  updateDeployment(id: string, p: DeploymentPatch, who: string): Promise<DeploymentRecord>;
  /** Runs its DELETE when listed (resolves with it), else removes it at once (resolves null). @throws HeraldError not_found | deployment_busy */
  deleteDeployment(id: string, who: string): Promise<DeploymentRecord | null>;
  /** Removes the deployment and its revisions (touching its node); nothing when it is gone already. */
  removeDeployment(id: string): Promise<void>;
  /** The labels of `ids` as this transaction sees them (a node without labels is absent). */
  nodeLabels(ids: readonly string[]): Promise<Map<string, Record<string, string>>>;
  /** Replaces the node's labels (none: removes them); audit `node.labels`. @throws HeraldError not_found */
  setNodeLabels(id: string, labels: Readonly<Record<string, string>>, who: string): Promise<void>;
  /** Audit `access.grant`. */
  createAccessGrant(g: NewAccessGrant, who: string): Promise<AccessGrantRecord>;
  /** Audit `access.revoke`. @throws HeraldError not_found */
  deleteAccessGrant(id: string, who: string): Promise<AccessGrantRecord>;
}
