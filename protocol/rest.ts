/**
 * The controller's REST contract (docs/api.md operator routes): the JSON bodies `GET/POST/PATCH
 * /v1/...` answer with, the list envelope, the error body and the `/v1/events` payloads. The
 * controller's views (controller/service/views.ts) return these types and the CLI reads them, so both
 * sides compile against one shape and neither guesses at field names.
 *
 * Types only. They are `type` aliases, not interfaces, so a view stays assignable to
 * `Record<string, unknown>` where a caller still wants that. Times are ISO 8601 strings.
 */
import type { NodeCertificateView } from './enroll.js';
import type { DeployAction, InputType } from './heat.js';

// ---- lists and errors ---------------------------------------------------------------------------

/** Every `GET` of a collection (`/v1/nodes`, `/v1/configs`, ...) answers `{ "items": [...] }`. */
export type ListEnvelope<T> = { items: T[] };

/**
 * The body of every refusal: a stable code (protocol/errors.ts), a message for people, and the
 * request field at fault when there is one.
 */
export type ErrorBody = { error: { code: string; message: string; field?: string } };

// ---- nodes --------------------------------------------------------------------------------------

export type PushConnectionState = 'idle' | 'connecting' | 'connected' | 'disconnected' | 'half_open';

/**
 * How a node's open push connection was made: `dialled`, the controller dialled the agent's
 * listener (its announced endpoint); `dialled-in`, the agent dialled the controller's
 * `--connect-listen` (docs/protocol.md, "Dialled-in connections").
 */
export type PushVia = 'dialled' | 'dialled-in';

/** A node's push state as `GET /v1/nodes/{id}` shows it (the dialer's state plus the fetches). */
export type PushStateView = {
  state: PushConnectionState;
  connected: boolean;
  /** How the open connection was made; null while none is open. */
  via: PushVia | null;
  /** Highest generation sent in a wake-up. */
  generation_pushed: number | null;
  /** Highest generation the agent acknowledged or fetched. */
  generation_acked: number | null;
  generation_fetched: number | null;
  last_ack_at: string | null;
  last_fetch_at: string | null;
  /** Code of the last failure (dial error, nack code, `half_open`, ...). */
  last_error: string | null;
  last_error_at: string | null;
};

/** `GET /v1/nodes/{id}`, an item of `GET /v1/nodes`, the answer of `POST /v1/nodes`. */
export type NodeView = {
  id: string;
  /** `wss://host:port/v1/wake`, or null before the agent announced one. */
  endpoint: string | null;
  generation: number;
  created_at: string;
  updated_at: string;
  /** What grants may select the node by (docs/access.md); on operator routes and events (not in an agent's announcement answer). */
  labels?: Record<string, string>;
  push: PushStateView;
  /**
   * Several controllers (docs/several-controllers.md): the controller that owns the node and pushes to it (null
   * while none does). `push` is the answering controller's view, so it is the owner's only when
   * this names the answering controller. Absent on SQLite (one controller).
   */
  owner?: string | null;
  /**
   * `GET /v1/nodes/{id}` only: the node's certificate as the controller last saw it, with its
   * renewal state (docs/adding-nodes.md); null before the agent presented one.
   */
  certificate?: NodeCertificateView | null;
};

// ---- configs ------------------------------------------------------------------------------------

export type ConfigInputView = {
  name: string;
  type: InputType;
  /** `"***"` when the input is hidden. */
  default?: unknown;
  description?: string;
  hidden?: boolean;
};

export type ConfigOutputView = {
  name: string;
  type: InputType;
  error_output: boolean;
  description?: string;
  /** Its value shows as `"***"` to an operator who may not deploy to the node (docs/access.md). */
  hidden?: boolean;
};

/** `GET /v1/configs/{id}`, an item of `GET /v1/configs`, the answer of `POST /v1/configs`. */
export type ConfigView = {
  id: string;
  name: string;
  group: string;
  config: unknown;
  inputs: ConfigInputView[];
  outputs: ConfigOutputView[];
  options: Record<string, unknown>;
  creation_time: string;
};

// ---- deployments --------------------------------------------------------------------------------

export type DeploymentStatus = 'IN_PROGRESS' | 'COMPLETE' | 'FAILED';

/** One revision of a deployment: an item of `GET /v1/deployments/{id}/revisions`. */
export type RevisionView = {
  revision: number;
  item_id: string;
  action: DeployAction;
  status: DeploymentStatus;
  status_reason: string;
  signalled: boolean;
  /** Hidden inputs shown as `"***"`. */
  input_values: Record<string, unknown>;
  /** Declared outputs plus deploy_stdout/stderr/status_code; null before the signal. */
  output_values: Record<string, unknown> | null;
  creation_time: string;
  updated_time: string;
  signalled_time: string | null;
};

/**
 * `GET /v1/deployments/{id}` (its current revision inlined), an item of `GET /v1/deployments`,
 * the answer of `POST`, `PATCH` and a 202 `DELETE`. `deployment_id` and `server_id` repeat
 * `id` and `node` under Heat's names.
 */
export type DeploymentView = {
  id: string;
  deployment_id: string;
  node: string;
  server_id: string;
  config_id: string;
  name: string | null;
  actions: DeployAction[];
  action: DeployAction;
  revision: number;
  item_id: string;
  status: DeploymentStatus;
  status_reason: string;
  signalled: boolean;
  input_values: Record<string, unknown>;
  output_values: Record<string, unknown> | null;
  /** The cluster this deployment belongs to, else null. */
  cluster_id: string | null;
  creation_time: string;
  updated_time: string;
  signalled_time: string | null;
};

// ---- clusters -----------------------------------------------------------------------------------

export type ClusterStatus =
  | 'CREATE_IN_PROGRESS'
  | 'CREATE_COMPLETE'
  | 'CREATE_FAILED'
  | 'RESTART_IN_PROGRESS'
  | 'RESTART_COMPLETE'
  | 'RESTART_FAILED'
  | 'DELETE_IN_PROGRESS'
  | 'DELETE_FAILED'
  | 'UPDATE_IN_PROGRESS'
  | 'UPDATE_COMPLETE'
  | 'UPDATE_FAILED';
/** `update`: a node group added (its nodes install) or removed (its nodes uninstall), docs/api.md. */
export type ClusterOperation = 'create' | 'restart' | 'delete' | 'update';
/** `checking`: the restart's health config runs on the node (docs/api.md, `health_config_id`). */
export type ClusterNodePhase = 'pending' | 'uninstalling' | 'installing' | 'checking' | 'complete' | 'failed';
export type NodegroupRole = 'master' | 'worker';

/** One member of a cluster, in the cluster's `nodes`. */
export type ClusterNodeView = {
  node: string;
  phase: ClusterNodePhase;
  /** Why the node failed, else null. */
  reason: string | null;
  install_deployment_id: string;
  /** Null until the node's first uninstall starts (a restart, a delete, its group's removal): its deployment is made then. */
  uninstall_deployment_id: string | null;
  uninstall_started_at: string | null;
  uninstall_finished_at: string | null;
  install_started_at: string | null;
  install_finished_at: string | null;
  /** When the step in flight must have its result, else null. */
  step_deadline_at: string | null;
  /** The node's group (docs/api.md). */
  nodegroup: string;
  /** The health deployment the last restart with `health_config_id` made on this node, else null. */
  health_deployment_id: string | null;
  check_started_at: string | null;
  /** When the node's step of the current operation ended (its `pause_s` counts from here), else null. */
  ended_at: string | null;
  /** The cluster revision whose configs and values its install deployment has (docs/api.md "Revisions"). */
  revision: number;
};

/** A node group of a cluster (docs/api.md), with its nodes in the cluster's order. */
export type NodegroupView = {
  name: string;
  role: NodegroupRole;
  /** The group's own config, else the cluster's. */
  install_config_id: string;
  uninstall_config_id: string;
  /** The group's own input values (over the cluster's), hidden ones as `"***"`. */
  input_values: Record<string, unknown>;
  creation_time: string;
  nodes: ClusterNodeView[];
};

/** A rollout's external gate (docs/api.md `gate`), as given. */
export type GateView = { url?: string; prometheus?: string; query?: string; fail_open: boolean };

/** Where a running rollout is (docs/api.md "Rollouts"); `done` once its operation ended. */
export type RolloutPhase =
  | 'rolling'
  | 'canary'
  | 'awaiting_promotion'
  | 'waiting_for_gate'
  | 'paused'
  | 'aborting'
  | 'reverting'
  | 'done';

/** How a rollout's nodes fared (docs/api.md `counters`). */
export type CountersView = {
  targeted: number;
  completed: number;
  failed: number;
  timed_out: number;
  in_flight: number;
  reverted: number;
};

/** The limits of a restart or an upgrade (docs/api.md): the groups in the order they go, each with its window. */
export type RolloutView = {
  nodegroups: Array<{
    name: string;
    role: NodegroupRole;
    /** The nodes it changes (an upgrade leaves alone those that have its configs already). */
    nodes: string[];
    /** The window used: at most `quorum_max_unavailable` in a master group unless `force`. */
    max_unavailable: number;
    /** In a master group: at most this many of its nodes down at once, max(1, ⌊(n−1)/2⌋). */
    quorum_max_unavailable?: number;
    canary: number;
  }>;
  pause_s: number;
  max_failures: number;
  health_config_id: string | null;
  /** The canary nodes, in the order they go. */
  canaries: string[];
  auto_promote_s: number | null;
  on_failure: 'pause' | 'abort' | 'revert';
  node_deadline_s: number | null;
  progress_deadline_s: number | null;
  gate: GateView | null;
  force: boolean;
  /** An upgrade's: the revision its nodes go to, the cluster's before, and the stable one a revert goes back to. */
  revision?: number;
  from_revision?: number;
  stable_revision?: number | null;
  /** An undo's: the earlier revision it copies. */
  undo_of?: number;
};

/** What a running (or the last) rollout met (docs/api.md "Rollouts"). */
export type RolloutStateView = {
  phase: RolloutPhase;
  /** Its start, or the last node that completed, resume or promotion: the progress deadline counts from here. */
  progress_at: string | null;
  paused: { by: string; at: string; reason: string } | null;
  aborted: { by: string; at: string } | null;
  /** A deadline ended it. */
  expired: { at: string; reason: string } | null;
  promoted: { by: string; at: string } | null;
  gate: { verdict: 'go' | 'stop'; at: string; detail: string; error: boolean } | null;
  waiting_for_gate_since: string | null;
  revert: { revision: number; at: string; nodes: string[]; reason: string } | null;
};

/** The answer of a restart (or an upgrade, an undo) with `"dry_run": true`: what would run; nothing did. */
export type RestartPlanView = RolloutView & { cluster: string; dry_run: true };

/** An upgrade's dry run (docs/api.md "Upgrades"): whether it makes a new revision, and the plan. */
export type UpgradePlanView = RestartPlanView & { new_revision: boolean };

/** `GET /v1/clusters/{id}/revisions` (docs/api.md "Revisions"): one revision, hidden values as `"***"`. */
export type ClusterRevisionView = {
  revision: number;
  install_config_id: string;
  uninstall_config_id: string;
  input_values: Record<string, unknown>;
  nodegroups: Array<{
    name: string;
    install_config_id: string | null;
    uninstall_config_id: string | null;
    input_values: Record<string, unknown> | null;
  }>;
  created_at: string;
  created_by: string | null;
  stable: boolean;
  stable_at: string | null;
  /** An undo's: the earlier revision it copies. */
  source_revision: number | null;
  /** The cluster has this revision now. */
  current: boolean;
};

/** `GET /v1/clusters/{id}`, an item of `GET /v1/clusters`, the answer of `POST /v1/clusters`. */
export type ClusterView = {
  id: string;
  name: string;
  status: ClusterStatus;
  status_reason: string;
  install_config_id: string;
  uninstall_config_id: string;
  /** Hidden inputs (of either config) shown as `"***"`. */
  input_values: Record<string, unknown>;
  operation: ClusterOperation;
  max_unavailable: number;
  operation_started_at: string | null;
  operation_finished_at: string | null;
  creation_time: string;
  updated_time: string;
  nodes: ClusterNodeView[];
  nodegroups: NodegroupView[];
  /** The limits of the current (or last) restart or upgrade, with what it met, else null. */
  rollout: (RolloutView & { state: RolloutStateView | null }) | null;
  /** The cluster's revision: the configs and input values it has now (docs/api.md "Revisions"). */
  revision: number;
  /** How the nodes of the current (or last) operation fared. */
  counters: CountersView;
};

/**
 * `POST /v1/clusters` with `Prefer: return=minimal` (RFC 7240): the cluster without its members,
 * counted instead (a 10,000-node cluster's whole view is ~9 MB).
 */
export type ClusterSummaryView = Omit<ClusterView, 'nodes' | 'nodegroups'> & {
  node_count: number;
  nodegroups: Array<Omit<NodegroupView, 'nodes'> & { node_count: number }>;
};

// ---- events -------------------------------------------------------------------------------------

/** `output`: a live output chunk (protocol/output.ts `OutputEventView`, docs/api.md). */
/** `GET /v1/controllers` (docs/several-controllers.md): one controller of the database, live or not. */
export type ControllerView = {
  name: string;
  api_url: string;
  /** Its lease (database time) is ahead: it owns and pushes to its nodes. */
  live: boolean;
  started_at: string;
  heartbeat_at: string;
  lease_until: string;
  /** Nodes whose ownership names it. */
  nodes_owned: number;
  /**
   * The push connections it holds (as it last reported): of its own nodes, and of other
   * controllers' nodes whose agents dialled in to it (docs/several-controllers.md).
   */
  nodes_held: number;
};

export type EventType = 'deployment' | 'node' | 'cluster' | 'push' | 'output';

/** What a `deleted` event carries instead of the resource. */
export type DeletedView = { id: string; deleted: true };

/**
 * The JSON `data` of one `/v1/events` Server-Sent Event (whose `event:` is `type`): the event's
 * type and time, then the resource as the API shows it (or a deletion, or a node's push state).
 */
export type EventData = { at: string } & (
  | ({ type: 'node' } & (NodeView | DeletedView))
  | ({ type: 'deployment' } & (DeploymentView | (DeletedView & { deployment_id: string; node?: string })))
  | ({ type: 'cluster' } & (ClusterView | DeletedView))
  | ({ type: 'push'; node: string } & Omit<PushStateView, 'generation_fetched' | 'last_fetch_at'>)
);
