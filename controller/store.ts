/**
 * The controller's durable state, behind a narrow interface: nodes (and tombstones of deleted
 * ids), immutable configs, deployments with one row per revision, clusters and their per-node
 * phases, the audit trail, and the one global generation sequence (SPEC §3 "Generations").
 *
 * Every mutating method is one transaction: the change, its audit row and the generation bump
 * commit together or not at all, and each returns a `ChangeSet` saying which nodes to wake and
 * what to announce. Validation of names and input values happens above (controller/service.ts);
 * the store checks only what needs its data (existence, revisions, states). A PostgreSQL store
 * can implement the same interface.
 */
import type { DeployAction, InputType } from '../protocol/heat.js';
import type { WakeReason } from '../protocol/wake.js';

export { SqliteStore } from './sqlite-store.js';

export type DeploymentStatus = 'IN_PROGRESS' | 'COMPLETE' | 'FAILED';

export interface NodeRecord {
  id: string;
  /** `wss://host:port/v1/wake`, or null before the agent announced one. */
  endpoint: string | null;
  /** Sequence value of the node's latest metadata change. */
  generation: number;
  /** The highest generation the agent is known to have fetched (ack or fetch), if any. */
  ackedGeneration: number | null;
  createdAt: string;
  updatedAt: string;
}

export interface ConfigInput {
  name: string;
  type: InputType;
  default?: unknown;
  description?: string;
  hidden?: boolean;
}

export interface ConfigOutput {
  name: string;
  type: InputType;
  error_output: boolean;
  description?: string;
}

export interface ConfigRecord {
  id: string;
  name: string;
  group: string;
  config: unknown;
  inputs: ConfigInput[];
  outputs: ConfigOutput[];
  options: Record<string, unknown>;
  createdAt: string;
}

export type NewConfig = Omit<ConfigRecord, 'id' | 'createdAt'>;

export interface RevisionRecord {
  revision: number;
  /** The metadata item `id` of this revision: new per revision, stored (SPEC §5). */
  itemId: string;
  action: DeployAction;
  /** As stored, hidden ones included: mask before showing (service.ts). */
  inputValues: Record<string, unknown>;
  status: DeploymentStatus;
  statusReason: string;
  /** Declared outputs present in the signal plus deploy_stdout/stderr/status_code; null before. */
  outputValues: Record<string, unknown> | null;
  /** The controller holds this revision's result (or nothing runs for it). */
  signalled: boolean;
  createdAt: string;
  updatedAt: string;
  signalledAt: string | null;
}

export type ClusterRole = 'install' | 'uninstall';

export interface DeploymentRecord {
  id: string;
  node: string;
  configId: string;
  name: string | null;
  actions: DeployAction[];
  clusterId: string | null;
  clusterRole: ClusterRole | null;
  createdAt: string;
  updatedAt: string;
  /** The current revision. */
  current: RevisionRecord;
}

export interface NewDeployment {
  node: string;
  configId: string;
  name: string | null;
  actions: DeployAction[];
  action: DeployAction;
  inputValues: Record<string, unknown>;
}

export interface DeploymentPatch {
  /** Replaces the stored values (service.ts merges a PATCH into them first). */
  inputValues?: Record<string, unknown>;
  action?: DeployAction;
}

export interface SignalInput {
  revision: number;
  deployStatusCode: number;
  deployStdout: string;
  deployStderr: string;
  outputs: Record<string, unknown>;
  statusReason?: string | undefined;
}

export type ClusterStatus =
  | 'CREATE_IN_PROGRESS' | 'CREATE_COMPLETE' | 'CREATE_FAILED'
  | 'RESTART_IN_PROGRESS' | 'RESTART_COMPLETE' | 'RESTART_FAILED'
  | 'DELETE_IN_PROGRESS' | 'DELETE_FAILED';
export type ClusterOperation = 'create' | 'restart' | 'delete';
export type ClusterNodePhase = 'pending' | 'uninstalling' | 'installing' | 'complete' | 'failed';

export interface ClusterNodeRecord {
  node: string;
  position: number;
  phase: ClusterNodePhase;
  installDeploymentId: string;
  uninstallDeploymentId: string;
  /** When the step in flight must have its result (epoch ms), else null. */
  stepDeadlineMs: number | null;
  uninstallStartedAt: string | null;
  uninstallFinishedAt: string | null;
  installStartedAt: string | null;
  installFinishedAt: string | null;
  reason: string | null;
}

export interface ClusterRecord {
  id: string;
  name: string;
  status: ClusterStatus;
  statusReason: string;
  installConfigId: string;
  uninstallConfigId: string;
  inputValues: Record<string, unknown>;
  operation: ClusterOperation;
  maxUnavailable: number;
  operationStartedAt: string | null;
  operationFinishedAt: string | null;
  createdAt: string;
  updatedAt: string;
  nodes: ClusterNodeRecord[];
}

export interface NewCluster {
  name: string;
  nodes: string[];
  installConfigId: string;
  uninstallConfigId: string;
  /** Already checked against each config's inputs (service.ts). */
  installInputValues: Record<string, unknown>;
  uninstallInputValues: Record<string, unknown>;
  /** As given (stored for display; masked above). */
  inputValues: Record<string, unknown>;
}

export interface Wake {
  node: string;
  generation: number;
  reason: WakeReason;
}

/** What one transaction changed: who to wake, what to announce. */
export interface ChangeSet {
  /** The new sequence value, when some node's metadata changed. */
  generation: number | null;
  /** Nodes whose metadata changed (their generation is now `generation`). */
  touchedNodes: string[];
  /** Nodes that have work: wake them with their new generation. */
  wakes: Wake[];
  nodes: string[];
  removedNodes: string[];
  deployments: string[];
  removedDeployments: string[];
  clusters: string[];
  removedClusters: string[];
}

export interface AuditRecord {
  seq: number;
  at: string;
  who: string;
  action: string;
  target: string;
  detail: Record<string, unknown> | null;
}

export interface MetadataSource {
  node: NodeRecord;
  /** The node's deployments with their current revision and config, unsorted. */
  entries: Array<{ deployment: DeploymentRecord; config: ConfigRecord; cluster: { id: string; name: string } | null }>;
}

export interface AnnounceResult {
  node: NodeRecord;
  created: boolean;
  /** The URL differs from the stored one (or the node is new). */
  changed: boolean;
  changes: ChangeSet;
}

/**
 * The controller's storage. Methods throw HeraldError with a code (`not_found`, `node_exists`,
 * `node_deleted`, `unknown_node`, `unknown_config`, `stale_revision`, `unknown_revision`,
 * `deployment_busy`, `deployment_deleting`, `node_in_cluster`, `restart_in_progress`); `who` is
 * the caller's SPIFFE id, written to the audit trail.
 */
export interface Store {
  /** The sequence's current value (0 before any change). */
  generation(): number;

  createNode(id: string, endpoint: string | null, who: string): { node: NodeRecord; changes: ChangeSet };
  /** An agent's announcement; creates the node when `autoRegister` (else `not_found`). */
  announceEndpoint(id: string, url: string, who: string, autoRegister: boolean): AnnounceResult;
  getNode(id: string): NodeRecord | undefined;
  isTombstoned(id: string): boolean;
  listNodes(): NodeRecord[];
  /** Removes the node and its deployments, leaves a tombstone. */
  deleteNode(id: string, who: string): ChangeSet;
  /** Raises nodes' acknowledged generations (never lowers them); one transaction for the batch. */
  recordAcked(acks: ReadonlyMap<string, number>): void;

  createConfig(c: NewConfig, who: string): ConfigRecord;
  getConfig(id: string): ConfigRecord | undefined;
  listConfigs(): ConfigRecord[];

  createDeployment(d: NewDeployment, who: string): { deployment: DeploymentRecord; changes: ChangeSet };
  updateDeployment(id: string, p: DeploymentPatch, who: string): { deployment: DeploymentRecord; changes: ChangeSet };
  /** `deployment` is null when it was removed at once (no DELETE run). */
  deleteDeployment(id: string, who: string): { deployment: DeploymentRecord | null; changes: ChangeSet };
  getDeployment(id: string): DeploymentRecord | undefined;
  listDeployments(filter?: { node?: string | undefined }): DeploymentRecord[];
  /** Revisions of a deployment, oldest first. */
  listRevisions(id: string): RevisionRecord[];
  recordSignal(node: string, deploymentId: string, s: SignalInput, who: string, nowMs?: number): {
    outcome: 'recorded' | 'duplicate';
    deployment: DeploymentRecord | null;
    changes: ChangeSet;
  };

  metadataSource(node: string): MetadataSource | undefined;

  createCluster(c: NewCluster, who: string, nowMs?: number): { cluster: ClusterRecord; changes: ChangeSet };
  getCluster(id: string): ClusterRecord | undefined;
  /** A cluster's status alone (no nodes): O(1), for the path of every signal. */
  getClusterStatus(id: string): { status: ClusterStatus; statusReason: string } | undefined;
  /** Every config that feeds the cluster's deployments (their hidden inputs are hidden in all of them). */
  clusterConfigIds(id: string): string[] | undefined;
  listClusters(): ClusterRecord[];
  /** Starts a restart (window `maxUnavailable`, default all nodes). */
  restartCluster(id: string, maxUnavailable: number | null, who: string, nowMs?: number): ChangeSet;
  /** Uninstalls everywhere; the cluster and its deployments are removed once all succeeded. */
  deleteCluster(id: string, who: string, nowMs?: number): ChangeSet;
  /** Fails steps past their deadline and fills restart windows; returns what changed. */
  tickClusters(nowMs?: number): ChangeSet;
  /** Cluster ids with an operation in flight (the timer only needs these). */
  activeClusterIds(): string[];

  listAudit(limit?: number): AuditRecord[];
  /**
   * Runs `fn` in one transaction: the store calls inside it keep their own all-or-nothing
   * (savepoints) but share one commit (group commit: one fsync for many changes).
   */
  group<T>(fn: () => T): T;
  close(): void;
}

export function emptyChanges(): ChangeSet {
  return {
    generation: null,
    touchedNodes: [],
    wakes: [],
    nodes: [],
    removedNodes: [],
    deployments: [],
    removedDeployments: [],
    clusters: [],
    removedClusters: [],
  };
}
