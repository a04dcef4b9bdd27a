/**
 * What the cluster engine needs of a transaction, and nothing more: a store's transaction
 * object implements it (SqliteStore's does), and so does the in-memory fake the engine's unit
 * tests run against. Every method acts inside the caller's open transaction: nothing is
 * visible to other readers until it commits, and all of it is undone if it rolls back.
 *
 * Locking (for stores with row locks, such as PostgreSQL): the engine reads a cluster's head
 * (`clusterHead`) before it reads or changes any of that cluster's nodes, in every entry point,
 * so a store that takes the head row's lock there (`SELECT … FOR UPDATE`) serialises all work
 * on one cluster; `claimActiveClusters` is the tick's `FOR UPDATE SKIP LOCKED`, so controllers
 * sharing a database advance each cluster once. SQLite's one writer needs neither.
 *
 * Each change method notes what it changed in `changes` (the node it touched or woke, the
 * deployment, the cluster), so a store cannot forget to announce it.
 */
import type { WakeReason } from '../../protocol/wake.js';
import type { DeployAction } from '../../protocol/heat.js';
import type { ChangeSetBuilder } from '../model/change-set.js';
import type {
  ClusterNodeRecord,
  ClusterOperation,
  ClusterRecord,
  ClusterRevisionRecord,
  ClusterStatus,
  ConfigRecord,
  DeploymentRecord,
  NewCluster,
  NewClusterRevision,
  NewNodegroup,
  NodegroupRecord,
  Rollout,
} from '../model/records.js';

/** A cluster's own row, without its nodes. */
export type ClusterHead = Pick<
  ClusterRecord,
  'id' | 'status' | 'operation' | 'maxUnavailable' | 'updatedAt' | 'revision'
> & {
  /** The restart's limits (docs/api.md); null for other operations and for restarts before node groups. */
  rollout?: Rollout | null;
};

/** What a node's deployment is made of: a config and the input values given (coerced by the store). */
export interface DeploymentSource {
  configId: string;
  inputValues: Record<string, unknown>;
}

/** What the cluster's node phases say at a glance (each answer an index seek, not a scan). */
export interface ClusterGlance {
  /** Earliest deadline (epoch ms) among the nodes uninstalling, or null when none is. */
  dueUninstallMs: number | null;
  /** Earliest deadline (epoch ms) among the nodes installing, or null when none is. */
  dueInstallMs: number | null;
  inFlight: boolean;
  pending: boolean;
  failed: boolean;
}

/** A change to one node's step (docs/api.md "Clusters"); timestamps are the call's `nowMs`. */
export type NodeStepChange =
  /**
   * The step starts: phase uninstalling or installing until `deadlineMs` (epoch ms). Starting the
   * uninstall clears the install's marks; `uninstallDeploymentId`, the node's uninstall deployment
   * made for this step (newUninstallDeployment), is then named on its row.
   */
  | { type: 'start'; step: 'uninstall' | 'install'; deadlineMs: number; uninstallDeploymentId?: string }
  /** The uninstall succeeded (the phase stays until the install starts or the node completes). */
  | { type: 'uninstalled' }
  /** The install succeeded and the health check starts (docs/api.md): phase checking until `deadlineMs`, on that deployment. */
  | { type: 'check'; deadlineMs: number; healthDeploymentId: string }
  /** Phase complete, no deadline; `installFinished` stamps the install's end; the node's end is `nowMs`. */
  | { type: 'complete'; installFinished: boolean }
  /** Phase failed, no deadline; stamps `step`'s end (and the node's) and keeps `reason`. */
  | { type: 'fail'; step: 'uninstall' | 'install' | 'check'; reason: string };

import type { StepResult } from '../model/records.js';
export type { StepResult };

/** Creating a cluster: what NewCluster says, plus the first step's deadline. */
export interface ClusterRows extends NewCluster {
  /** The groups in creation order; their nodes, in order, are `nodes`. */
  nodegroups: NewNodegroup[];
  /** Actions of each node's install deployment (made with a triggered CREATE revision). */
  installActions: DeployAction[];
  /** When every node's install must have its result (epoch ms). */
  stepDeadlineMs: number;
  /** Who creates it: the author of its first revision (docs/api.md "Revisions"). */
  createdBy: string;
}

export interface ClusterTx {
  /** What this transaction changed so far; change methods note into it. */
  readonly changes: ChangeSetBuilder;

  /** Appends an audit row; `who` is a SPIFFE id. */
  audit(who: string, action: string, target: string, detail?: Record<string, unknown> | null): Promise<void>;

  /** A config (immutable, so a store may cache it). */
  config(id: string): Promise<ConfigRecord | undefined>;
  /** A deployment with its current revision, as this transaction sees it. */
  deployment(id: string): Promise<DeploymentRecord | undefined>;
  /**
   * Adds revision `d.current.revision + 1` with `action` and the current input values, and
   * makes it current. Touches `d.node`, and wakes it with `reason` when `action` is among the
   * deployment's actions; otherwise the revision completes at once ("not triggered").
   * @returns whether the revision was triggered
   */
  newRevision(d: DeploymentRecord, action: DeployAction, reason: WakeReason): Promise<boolean>;
  /** Records `r` as the current revision's result (signalled from now on); touches its node, wakes nobody. */
  recordResult(d: DeploymentRecord, r: StepResult, nowMs: number): Promise<void>;

  /**
   * Inserts a cluster in CREATE_IN_PROGRESS with, for each node in order, its install deployment
   * and its row (phase installing until `stepDeadlineMs`; no uninstall deployment yet:
   * newUninstallDeployment makes it when the node's first uninstall starts).
   * @returns the new cluster as a read of it in this transaction would give it back
   * @throws HeraldError unknown_node | cluster_busy (field `nodes.<i>`), unknown_config
   */
  insertCluster(c: ClusterRows, nowMs: number): Promise<ClusterRecord>;
  /** The cluster's head row; a store with row locks locks it for the rest of the transaction. */
  clusterHead(id: string): Promise<ClusterHead | undefined>;
  /** Ids of clusters with an operation in flight that no other transaction holds, locked (oldest first). */
  claimActiveClusters(): Promise<string[]>;
  glance(clusterId: string): Promise<ClusterGlance>;
  /** How many of the cluster's nodes are in flight, counting no further than `upTo`. */
  countInFlight(clusterId: string, upTo: number): Promise<number>;
  /** Every node of the cluster, by position. */
  clusterNodes(clusterId: string): Promise<ClusterNodeRecord[]>;
  /** The nodes uninstalling or installing (any order). */
  nodesInFlight(clusterId: string): Promise<ClusterNodeRecord[]>;
  /** The first `limit` pending nodes by position. */
  firstPending(clusterId: string, limit: number): Promise<ClusterNodeRecord[]>;
  clusterNode(clusterId: string, node: string): Promise<ClusterNodeRecord | undefined>;
  setNodeStep(clusterId: string, node: string, change: NodeStepChange, nowMs: number): Promise<void>;
  /**
   * Starts operation `op` with window `maxUnavailable`: status `<OP>_IN_PROGRESS`, every node
   * pending with its marks cleared; with `rollout`, kept as the operation's limits, and only the
   * nodes of its groups are made pending (the others are left as they are).
   */
  beginOperation(
    clusterId: string,
    op: ClusterOperation,
    maxUnavailable: number,
    nowMs: number,
    rollout?: Rollout | null,
  ): Promise<void>;
  /**
   * Adds group `g` (after the others) to an idle cluster: its row, and for each of its nodes
   * (after the cluster's) its install deployment as insertCluster makes it and its row, phase
   * installing until `stepDeadlineMs`.
   * @throws HeraldError unknown_node | cluster_busy (field `nodes.<i>`), unknown_config
   */
  insertNodegroup(
    clusterId: string,
    g: NewNodegroup,
    rows: Pick<ClusterRows, 'installActions' | 'stepDeadlineMs'>,
    nowMs: number,
  ): Promise<void>;
  /** Removes group `name`: its node rows, every deployment of the cluster on its nodes, and its row. */
  removeNodegroup(clusterId: string, name: string): Promise<void>;
  /** The cluster's node groups in creation order. */
  nodegroups(clusterId: string): Promise<NodegroupRecord[]>;
  /**
   * Makes a health deployment (role `health`, actions `["CHECK"]`, a triggered `CHECK` revision
   * with no input values) of config `configId` on `node`, for the cluster, waking the node with
   * `restart`; removes the one it replaces (a former restart's), if any.
   * @returns the new deployment's id
   */
  newHealthDeployment(clusterId: string, node: string, configId: string, replaces: string | null): Promise<string>;
  /**
   * Makes the uninstall deployment of `node`, a member of the cluster with none yet (role
   * `uninstall`, named `<cluster>-uninstall`, with `actions`): `source` when given (the node's
   * revision's, when the cluster's revision moved on: clusters/revisions.ts), else its group's
   * uninstall config and input values, resolved as the cluster's creation resolved its install's
   * (the group's over the cluster's), and a first revision with `action`, waking the node with
   * `reason` when `action` is among `actions`. The step's start (setNodeStep) names it on the node's row.
   * @returns the new deployment's id and config
   */
  newUninstallDeployment(
    clusterId: string,
    node: string,
    actions: DeployAction[],
    action: DeployAction,
    reason: WakeReason,
    source?: DeploymentSource,
  ): Promise<{ id: string; configId: string }>;
  /**
   * Adds revision `d.current.revision + 1` of cluster deployment `d` with `action`, its config now
   * `to.configId` and its input values `to.inputValues` (coerced to that config's inputs), and
   * makes it current: Heat's update of a deployment whose config changed. Wakes `d.node` with
   * `reason` when `action` is among its actions.
   */
  reviseDeployment(d: DeploymentRecord, to: DeploymentSource, action: DeployAction, reason: WakeReason): Promise<void>;
  /**
   * Removes the node's uninstall deployment (its last revision has its result), so the node's
   * next uninstall makes one of its revision's configs; its row names none until then.
   */
  dropUninstallDeployment(clusterId: string, node: string): Promise<void>;

  // ---- revisions and rollouts (docs/api.md "Revisions", "Rollouts") ----------------------------
  /**
   * Revision `revision` of the cluster; a cluster made before revisions has its first one read
   * from its rows (written by addClusterRevision before the next is).
   */
  clusterRevision(clusterId: string, revision: number): Promise<ClusterRevisionRecord | undefined>;
  /** Every revision of the cluster, oldest first. */
  clusterRevisions(clusterId: string): Promise<ClusterRevisionRecord[]>;
  /**
   * Records `r` as the cluster's next revision (made by `who`), and makes its configs and input
   * values the cluster's own and its groups' (the rows views and new node groups read).
   * @returns its number
   */
  addClusterRevision(clusterId: string, r: NewClusterRevision, who: string, nowMs: number): Promise<number>;
  /** Marks the revision stable, once (a rollout to it completed on every node). */
  markRevisionStable(clusterId: string, revision: number, nowMs: number): Promise<void>;
  /** Replaces the running operation's rollout (its state moved on); nothing else of the cluster. */
  setRollout(clusterId: string, rollout: Rollout): Promise<void>;
  /** The node's install deployment has revision `revision`'s configs now (bookkeeping: nothing runs). */
  setNodeRevision(clusterId: string, node: string, revision: number): Promise<void>;
  /** The nodes are made pending, their marks cleared (a revert's nodes, before they go back). */
  resetNodes(clusterId: string, nodes: readonly string[]): Promise<void>;
  /** The node has nothing to do in this operation: phase complete, its marks cleared, no end time. */
  settleNode(clusterId: string, node: string): Promise<void>;
  /** Ends the operation in `status` with `reason`. */
  finishCluster(clusterId: string, status: ClusterStatus, reason: string, nowMs: number): Promise<void>;
  /** Removes the cluster, its node rows and every deployment it made (touching their nodes). */
  removeCluster(clusterId: string): Promise<void>;
}
