/**
 * The records the controller stores, as every store returns them (SQLite today, PostgreSQL
 * next), and the `ChangeSet` a transaction reports. Types only: the store's interface is in
 * store.ts, the cluster engine's narrow one in clusters/tx.ts, and both import these.
 */
import type { DeployAction, InputType } from '../../protocol/heat.js';
import type {
  ClusterNodePhase,
  ClusterOperation,
  ClusterStatus,
  DeploymentStatus,
  NodegroupRole,
} from '../../protocol/rest.js';
import type { WakeReason } from '../../protocol/wake.js';

// the statuses and phases are the wire's (protocol/rest.ts): one definition for the API and the store
export type { ClusterNodePhase, ClusterOperation, ClusterStatus, DeploymentStatus, NodegroupRole };

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
  /** The metadata item `id` of this revision: new per revision, stored (docs/protocol.md). */
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

/** What a cluster's deployment is for; `health`: the restart's health check on one node (docs/api.md). */
export type ClusterRole = 'install' | 'uninstall' | 'health';

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
  /**
   * The current revision the patch was made from: the store writes the next one only while it
   * is still current (else `internal`), so values merged into a revision read earlier can never
   * silently replace a revision written since. Read it in the same transaction, under its lock
   * (`StoreTx.deployment`), and the check never fails.
   */
  revises: number;
  /** Replaces the stored values (service.ts merges a PATCH into those of revision `revises`). */
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

export interface ClusterNodeRecord {
  node: string;
  position: number;
  phase: ClusterNodePhase;
  installDeploymentId: string;
  /** Null until the node's first uninstall starts: the deployment is made then (engine.ts #startStep). */
  uninstallDeploymentId: string | null;
  /** When the step in flight must have its result (epoch ms), else null. */
  stepDeadlineMs: number | null;
  uninstallStartedAt: string | null;
  uninstallFinishedAt: string | null;
  installStartedAt: string | null;
  installFinishedAt: string | null;
  reason: string | null;
  /** The node's group (docs/api.md); 'default-worker' for a cluster made from a flat node list. */
  nodegroup: string;
  /** The health deployment a restart with a health config made on this node, else null. */
  healthDeploymentId: string | null;
  checkStartedAt: string | null;
  /** When the node's step of the current operation ended, complete or failed (epoch ms), else null. */
  endedAtMs: number | null;
}

/** A node group of a cluster (docs/api.md). */
export interface NodegroupRecord {
  name: string;
  role: NodegroupRole;
  /** Creation order (masters restart first, then the others in this order). */
  position: number;
  /** The group's own configs and input values, else null (the cluster's apply). */
  installConfigId: string | null;
  uninstallConfigId: string | null;
  inputValues: Record<string, unknown> | null;
  createdAt: string;
}

/** One group of a restart, in the order the groups restart, with its window (docs/api.md). */
export interface RolloutGroup {
  name: string;
  role: NodegroupRole;
  /** At most this many of the group's nodes between the start of their uninstall and their end. */
  window: number;
}

/** The limits of a restart (docs/api.md), kept on the cluster's row while it runs. */
export interface Rollout {
  groups: RolloutGroup[];
  pauseS: number;
  maxFailures: number;
  healthConfigId: string | null;
  /** For an `update`: the group added (its nodes install) or removed (its nodes uninstall, then go). */
  change?: { type: 'add' | 'remove'; nodegroup: string };
  /**
   * One group holding every node of the cluster, no pause, no failure budget, no health check:
   * the same rules as a restart before node groups, so the engine takes its fast path.
   */
  plain: boolean;
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
  nodegroups: NodegroupRecord[];
  /** The current (or last) restart's limits, else null. */
  rollout: Rollout | null;
}

/** A group of a new cluster; configs and input values already resolved (the group's over the cluster's). */
export interface NewNodegroup {
  name: string;
  role: NodegroupRole;
  nodes: string[];
  /** As given (null: the cluster's). */
  ownInstallConfigId: string | null;
  ownUninstallConfigId: string | null;
  ownInputValues: Record<string, unknown> | null;
  installConfigId: string;
  uninstallConfigId: string;
  /** The uninstall's are coerced when its deployment is made, at the node's first uninstall (controller/store/tx.ts). */
  installInputValues: Record<string, unknown>;
}

export interface NewCluster {
  name: string;
  /** Every node, in the groups' order (a flat list makes one group 'default-worker'). */
  nodes: string[];
  /** Absent: one group 'default-worker' of `nodes` with the cluster's configs and values. */
  nodegroups?: NewNodegroup[];
  installConfigId: string;
  uninstallConfigId: string;
  /** Already checked against the install config's inputs (service.ts); the uninstall's as NewNodegroup's. */
  installInputValues: Record<string, unknown>;
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
  /**
   * Nodes created or whose endpoint changed, each with its endpoint now (null: none announced),
   * so the push service learns it without reading the node back. Absent from change sets an
   * older Herald logged.
   */
  endpoints?: Array<[node: string, url: string | null]>;
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

export type { KnownGenerations } from './document.js';

/**
 * A metadata read: the node, and its deployments (`source`) unless its generation was one the
 * reader knew (null: the generation alone answers the fetch, a 304 or a document already built).
 */
export interface MetadataRead {
  node: NodeRecord;
  source: MetadataSource | null;
}

export interface MetadataSource {
  node: NodeRecord;
  /**
   * The node's deployments with their current revision and config, unsorted; a cluster's
   * deployment with its cluster and every config that feeds the cluster (install, uninstall, its
   * node groups'), read in the same snapshot, for the hidden inputs (Service.hiddenInputsOf).
   */
  entries: Array<{ deployment: MetadataDeployment; config: ConfigRecord; cluster: MetadataCluster | null }>;
}

/**
 * What a node's metadata document takes from a deployment: its row and current revision, without
 * the results (status, outputs) and bookkeeping no document carries. A DeploymentRecord is one.
 */
export type MetadataDeployment = Pick<
  DeploymentRecord,
  'id' | 'node' | 'configId' | 'name' | 'clusterId' | 'createdAt'
> & {
  current: Pick<RevisionRecord, 'revision' | 'itemId' | 'action' | 'inputValues' | 'signalled'>;
};

export interface MetadataCluster {
  id: string;
  name: string;
  configs: ConfigRecord[];
}

export interface AnnounceResult {
  node: NodeRecord;
  created: boolean;
  /** The URL differs from the stored one (or the node is new). */
  changed: boolean;
  changes: ChangeSet;
}

/** A revision's result: Heat's status rules (heat-status.ts) or the engine's deadline. */
export interface StepResult {
  status: DeploymentStatus;
  statusReason: string;
  /** Null when no result came (a deadline passed). */
  outputValues: Record<string, unknown> | null;
}
