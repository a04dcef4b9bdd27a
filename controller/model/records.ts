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
  /** Masked to operators who may not deploy to the node (docs/access.md). */
  hidden?: boolean;
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
  /** The cluster revision whose configs the node's install deployment has (docs/api.md "Revisions"). */
  revision: number;
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
  /** A master group's quorum rule (unless `force`): at most this many of its nodes down at once, max(1, ⌊(n−1)/2⌋). */
  quorum?: number;
  /** How many of the group's nodes are canaries (its first ones the rollout changes), 0 for none. */
  canary?: number;
}

/** What a rollout does once more than `maxFailures` nodes failed (docs/api.md, `on_failure`). */
export type OnFailure = 'pause' | 'abort' | 'revert';

/**
 * A rollout's external gate (docs/api.md, `gate`): read before each new node starts. `url`: an
 * HTTPS URL whose 2xx answer means go; `prometheus`: an instant query whose non-empty result
 * means stop. One that cannot be read stops the rollout unless `failOpen`.
 */
export interface RolloutGate {
  kind: 'url' | 'prometheus';
  url: string;
  /** The Prometheus query (`prometheus` only). */
  query?: string;
  failOpen: boolean;
}

/** A gate's last answer, kept with the rollout so a controller started again does not lose it. */
export interface GateVerdict {
  /** Already read with `failOpen`: an unreadable gate is `go` only then. */
  verdict: 'go' | 'stop';
  atMs: number;
  /** What was read (a status, a count of series), or why it could not be read. */
  detail: string;
  /** It could not be read. */
  error: boolean;
  /** A `go` admits the starts of one plan, then a new answer is needed. */
  used: boolean;
}

/** How a rollout's nodes fared (docs/api.md, `counters`); frozen here when a revert begins. */
export interface RolloutCounts {
  completed: number;
  failed: number;
  timedOut: number;
}

/** What changed while a rollout ran: kept on the cluster's row with its limits (docs/api.md). */
export interface RolloutState {
  /** Its start, the last node that completed, a resume or a promotion (epoch ms): `progressDeadlineS` counts from here. */
  progressAtMs: number;
  /** Paused by an operator (`failure` false) or by `on_failure: pause`. */
  paused: { by: string; atMs: number; reason: string; failure: boolean } | null;
  /** Failed nodes a resume forgave: the budget counts those beyond them. */
  forgiven: number;
  aborted: { by: string; atMs: number } | null;
  /** A deadline ended it: no node starts any more. */
  expired: { atMs: number; reason: string } | null;
  /** The canaries were promoted (`by` an operator, or `auto`). */
  promoted: { by: string; atMs: number } | null;
  /** The gate's last answer; `wantedAtMs` since when a start waits for a new one. */
  gate: GateVerdict | null;
  gateWantedAtMs: number | null;
  /** A revert: the changed nodes go back to `revision`; `before` the counts it froze. */
  revert: { revision: number; atMs: number; nodes: string[]; before: RolloutCounts; why: string } | null;
}

/** An upgrade (docs/api.md): the cluster revision its nodes go to, and the stable one a revert goes back to. */
export interface RolloutUpgrade {
  revision: number;
  /** The cluster's revision before this one. */
  from: number;
  /** The last stable revision before `revision`, else null (no revert possible). */
  stable: number | null;
  /** An undo: the earlier revision whose configs `revision` copies. */
  undoOf?: number;
}

/** The limits of a restart or an upgrade (docs/api.md), kept on the cluster's row while it runs. */
export interface Rollout {
  groups: RolloutGroup[];
  pauseS: number;
  maxFailures: number;
  healthConfigId: string | null;
  /** For an `update`: the group added (its nodes install) or removed (its nodes uninstall, then go). */
  change?: { type: 'add' | 'remove'; nodegroup: string };
  /** For an `update` that rolls new configs (or an undo): where its nodes go. */
  upgrade?: RolloutUpgrade;
  /**
   * One group holding every node of the cluster, no pause, no failure budget, no health check
   * (nor any of the options below): the same rules as a restart before node groups, so the
   * engine takes its fast path. A control (pause, abort) makes it false.
   */
  plain: boolean;
  /** Default `abort`: no node starts any more and the operation ends failed once none is in flight. */
  onFailure?: OnFailure;
  /** A node's whole pass (from its uninstall's start to its end) must end within this, else it fails timed out. */
  nodeDeadlineS?: number | null;
  /** The rollout fails once this long passes without progress (docs/api.md). */
  progressDeadlineS?: number | null;
  /** The canaries are promoted this long after the last of them completed; null: an operator promotes. */
  autoPromoteS?: number | null;
  /** The canary nodes, in the order they go. */
  canaries?: string[];
  gate?: RolloutGate | null;
  /** The quorum rule of master groups was lifted (`force`). */
  force?: boolean;
  /** How many nodes the rollout changes (an upgrade leaves alone those already at its configs). */
  targeted?: number;
  state?: RolloutState;
}

/** A group's own configs and input values in a cluster revision (null: the cluster's). */
export interface RevisionGroup {
  name: string;
  installConfigId: string | null;
  uninstallConfigId: string | null;
  inputValues: Record<string, unknown> | null;
}

/**
 * A numbered cluster revision (docs/api.md "Revisions"): the cluster's configs and input values,
 * and each group's own, as a change (or the creation) left them. Stable once a rollout to it
 * completed on every node.
 */
export interface ClusterRevisionRecord {
  revision: number;
  installConfigId: string;
  uninstallConfigId: string;
  /** As given (merged into the revision before it), hidden ones included: views mask them. */
  inputValues: Record<string, unknown>;
  nodegroups: RevisionGroup[];
  createdAt: string;
  /** The SPIFFE id of who made it (the cluster's creator for revision 1). */
  createdBy: string;
  stableAt: string | null;
  /** An undo copies this earlier revision, else null. */
  sourceRevision: number | null;
}

/** A new revision's content (its number and times are the store's). */
export type NewClusterRevision = Pick<
  ClusterRevisionRecord,
  'installConfigId' | 'uninstallConfigId' | 'inputValues' | 'nodegroups' | 'sourceRevision'
>;

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
  /** The cluster's revision: the configs and input values it has now (docs/api.md "Revisions"). */
  revision: number;
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
  /** The node of each removed deployment, where the transaction knew it. */
  removedDeploymentNodes?: Record<string, string>;
  clusters: string[];
  removedClusters: string[];
}

/** A grant (docs/access.md): `subject`, an operator's name, holds `role` over the nodes `scope` selects. */
export interface AccessGrantRecord {
  id: string;
  subject: string;
  role: string;
  /** Selectors as written (protocol/access.ts): `*`, `node:web-*`, `label:team=web`, ... */
  scope: string[];
  createdAt: string;
  createdBy: string;
}

export type NewAccessGrant = Omit<AccessGrantRecord, 'createdAt' | 'createdBy'>;

/** What a scope check knows of a node (docs/access.md): its labels, and its cluster and group there. */
export interface NodeFacts {
  id: string;
  labels: Readonly<Record<string, string>>;
  cluster: { id: string; name: string; nodegroup: string } | null;
}

export interface AuditRecord {
  seq: number;
  at: string;
  who: string;
  action: string;
  target: string;
  detail: Record<string, unknown> | null;
  /** The detail's length when the list leaves it out (over AUDIT_LIST_DETAIL_MAX_BYTES). */
  detailBytes?: number;
  /** `ok`, or the code the change was refused with. */
  outcome: string;
  /** The controller that wrote the row (null: written before the chain was). */
  controller: string | null;
  /** Its place in the hash chain (docs/access.md "Audit trail"). */
  prevHash: string;
  hash: string;
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
