/**
 * The cluster engine (SPEC §3 "Clusters"): starts, advances and ends cluster operations inside
 * the caller's transaction, through the narrow `ClusterTx` (tx.ts). It plans with the pure
 * planner (plan.ts) and applies each plan in the same transaction that recorded the event (a
 * signal, an operator's request, a timer tick), so a controller killed at any point carries the
 * operation on from the database. Any store gets it by implementing `ClusterTx`.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { DeployAction } from '../../protocol/heat.js';
import { HOOK_TIMEOUT_S, RESTART_STEP_MARGIN_S } from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { ClusterNodeRecord, ConfigRecord, NewCluster } from '../records.js';
import { planCluster, type PlanNode } from './plan.js';
import type { ClusterHead, ClusterTx } from './tx.js';

/** Actions of a cluster's install deployments: made with CREATE, run again by a restart. */
export const CLUSTER_INSTALL_ACTIONS: DeployAction[] = ['CREATE', 'UPDATE', 'RESTART'];
/** Actions of a cluster's uninstall deployments: made with CREATE (not triggered), run by a restart or a delete. */
export const CLUSTER_UNINSTALL_ACTIONS: DeployAction[] = ['RESTART', 'DELETE'];

/**
 * Safety stop for the plan/apply loop of one cluster in one transaction. Each round applies a
 * whole plan, so at most three rounds act whatever the cluster's size (window starts; the
 * timeouts of steps started with no budget left; finish), and a fourth finds nothing to do.
 */
export const MAX_PLAN_ROUNDS = 8;

/** A deployment's result that ends a cluster node's step (see signal.ts). */
export interface StepOutcome {
  clusterId: string;
  node: string;
  deploymentId: string;
  ok: boolean;
  reason: string;
}

export interface ClusterEngineOptions {
  /** Added to a step's hook timeout to make its deadline (seconds; may be negative in tests). Default RESTART_STEP_MARGIN_S. */
  stepMarginS?: number;
}

type StepCluster = Pick<ClusterHead, 'id' | 'operation'>;

function timeoutSOf(config: ConfigRecord): number {
  const t = config.options.timeout;
  return typeof t === 'number' && Number.isFinite(t) && t > 0 ? t : HOOK_TIMEOUT_S;
}

/** A step's budget in ms: the config's hook timeout (`options.timeout`, else HOOK_TIMEOUT_S) plus the margin (SPEC §3). */
export function stepBudgetMs(config: ConfigRecord, marginS: number): number {
  return Math.round((timeoutSOf(config) + marginS) * 1000);
}

function inProgress(h: ClusterHead | undefined): h is ClusterHead {
  return h?.status.endsWith('_IN_PROGRESS') === true;
}

export class ClusterEngine {
  readonly #marginS: number;

  constructor(o: ClusterEngineOptions = {}) {
    const marginS = o.stepMarginS ?? RESTART_STEP_MARGIN_S;
    if (!Number.isFinite(marginS)) throw new TypeError('stepMarginS must be a finite number of seconds');
    this.#marginS = marginS;
  }

  /**
   * Creates a cluster: every node installs at once.
   * @returns the cluster's id
   * @throws HeraldError unknown_config | unknown_node | cluster_busy (with the field)
   */
  async create(tx: ClusterTx, c: NewCluster, who: string, nowMs: number): Promise<string> {
    const install = await tx.config(c.installConfigId);
    if (!install)
      throw new HeraldError('unknown_config', `no config ${c.installConfigId}`, { field: 'install_config_id' });
    const id = await tx.insertCluster(
      {
        ...c,
        installActions: CLUSTER_INSTALL_ACTIONS,
        uninstallActions: CLUSTER_UNINSTALL_ACTIONS,
        stepDeadlineMs: nowMs + stepBudgetMs(install, this.#marginS),
      },
      nowMs,
    );
    await tx.audit(who, 'cluster.create', id, { name: c.name, nodes: c.nodes });
    return id;
  }

  /**
   * Starts a restart with window `maxUnavailable` (default, and at most, every node).
   * @throws HeraldError not_found | restart_in_progress
   */
  async restart(tx: ClusterTx, id: string, maxUnavailable: number | null, who: string, nowMs: number): Promise<void> {
    const c = await this.#mustIdle(tx, id);
    const size = (await tx.clusterNodes(id)).length;
    const window = Math.min(size, maxUnavailable ?? size);
    await tx.beginOperation(id, 'restart', window, nowMs);
    await tx.audit(who, 'cluster.restart', id, { max_unavailable: window, from: c.status });
    await this.#advance(tx, id, nowMs);
  }

  /**
   * Starts a delete: every node uninstalls; the cluster and its deployments go once all did.
   * @throws HeraldError not_found | restart_in_progress
   */
  async delete(tx: ClusterTx, id: string, who: string, nowMs: number): Promise<void> {
    const c = await this.#mustIdle(tx, id);
    const nodes = await tx.clusterNodes(id);
    await tx.beginOperation(id, 'delete', nodes.length, nowMs);
    await tx.audit(who, 'cluster.delete', id, { from: c.status });
    const head: StepCluster = { id, operation: 'delete' };
    for (const n of nodes) await this.#startStep(tx, head, n, 'uninstall', nowMs);
    await this.#advance(tx, id, nowMs);
  }

  /** Fails steps past their deadline and fills restart windows, for every cluster this transaction claims. */
  async tick(tx: ClusterTx, nowMs: number): Promise<void> {
    for (const id of await tx.claimActiveClusters()) await this.#advance(tx, id, nowMs);
  }

  /**
   * A deployment's result ended the step of `o.node`: records it on the node, then advances.
   * A result for a step no longer in flight (late, or its operation ended) changes nothing.
   * Reads the cluster's head and this node's row only, never the whole cluster: a cluster step
   * gets one signal per node, so anything O(nodes) here is O(nodes²) per operation.
   */
  async onStepResult(tx: ClusterTx, o: StepOutcome, nowMs: number): Promise<void> {
    const head = await tx.clusterHead(o.clusterId);
    if (!inProgress(head)) return;
    const n = await tx.clusterNode(o.clusterId, o.node);
    // (a cluster's deployments are on its node, so `node` is the one whose deployment is `deploymentId`)
    if (
      !n ||
      !(
        (n.installDeploymentId === o.deploymentId && n.phase === 'installing') ||
        (n.uninstallDeploymentId === o.deploymentId && n.phase === 'uninstalling')
      )
    ) {
      return;
    }
    if (!o.ok) {
      await this.#failStep(tx, head, n, o.reason, nowMs);
    } else if (n.phase === 'uninstalling') {
      await tx.setNodeStep(head.id, n.node, { type: 'uninstalled' }, nowMs);
      // the install revision is made in the transaction that records the uninstall's success:
      // the two are never pending at once, and a crash cannot fall between them
      if (head.operation === 'restart') await this.#startStep(tx, head, n, 'install', nowMs);
      else await tx.setNodeStep(head.id, n.node, { type: 'complete', installFinished: false }, nowMs);
    } else {
      await tx.setNodeStep(head.id, n.node, { type: 'complete', installFinished: true }, nowMs);
    }
    await this.#advance(tx, head.id, nowMs);
  }

  async #mustIdle(tx: ClusterTx, id: string): Promise<ClusterHead> {
    const c = await tx.clusterHead(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    if (inProgress(c)) throw new HeraldError('restart_in_progress', `cluster ${id} is ${c.status}`);
    return c;
  }

  /** Starts a node's step: a new revision of its uninstall or install deployment. Returns its deadline (epoch ms). */
  async #startStep(
    tx: ClusterTx,
    c: StepCluster,
    n: ClusterNodeRecord,
    step: 'uninstall' | 'install',
    nowMs: number,
  ): Promise<number> {
    const depId = step === 'install' ? n.installDeploymentId : n.uninstallDeploymentId;
    const d = await tx.deployment(depId);
    if (!d) throw new HeraldError('not_found', `no deployment ${depId}`);
    const action: DeployAction = c.operation === 'delete' ? 'DELETE' : 'RESTART';
    const reason: WakeReason = c.operation === 'restart' ? 'restart' : 'deployment';
    await tx.newRevision(d, action, reason);
    const config = await tx.config(d.configId);
    if (!config) throw new HeraldError('internal', `deployment ${depId} has no config ${d.configId}`);
    const deadlineMs = nowMs + stepBudgetMs(config, this.#marginS);
    await tx.setNodeStep(c.id, n.node, { type: 'start', step, deadlineMs }, nowMs);
    return deadlineMs;
  }

  async #failStep(tx: ClusterTx, c: StepCluster, n: ClusterNodeRecord, reason: string, nowMs: number): Promise<void> {
    const step = n.phase === 'uninstalling' ? 'uninstall' : 'install';
    await tx.setNodeStep(c.id, n.node, { type: 'fail', step, reason: `${step}: ${reason}` }, nowMs);
  }

  /**
   * What the cluster's indexes tell of its next plan, without loading its nodes:
   * - 'quiet': the plan is certainly empty (a step in flight, none past its deadline, and none
   *   can start: not a restart, a node failed, none pending, or the window is full);
   * - `{ room }`: the plan is certainly "start the first `room` pending nodes" (a restart, no
   *   failure, none past its deadline, room in the window), so the planner needs only the nodes
   *   in flight (fewer than the window) and those `room` nodes to make it;
   * - 'all': anything else (timeouts, finishing): the planner needs every node.
   */
  async #glance(tx: ClusterTx, c: ClusterHead, nowMs: number): Promise<'quiet' | 'all' | { room: number }> {
    const q = await tx.glance(c.id);
    if (
      (q.dueUninstallMs !== null && q.dueUninstallMs <= nowMs) ||
      (q.dueInstallMs !== null && q.dueInstallMs <= nowMs)
    )
      return 'all'; // timeouts
    const idle = q.inFlight ? 'quiet' : 'all'; // when nothing can start: finishing, or waiting
    if (c.operation !== 'restart' || q.failed || !q.pending) return idle;
    const inFlight = await tx.countInFlight(c.id, c.maxUnavailable);
    return inFlight >= c.maxUnavailable ? idle : { room: c.maxUnavailable - inFlight };
  }

  /**
   * Plans and applies until the cluster has nothing more to do right now. All the actions of
   * one plan are applied before planning again (they are independent: see planCluster), so the
   * number of rounds does not depend on the cluster's size; all in the caller's transaction.
   * A signal that leaves the plan empty (the common case) or fills a window slot reads no more
   * than the window's nodes.
   */
  async #advance(tx: ClusterTx, clusterId: string, nowMs: number): Promise<void> {
    for (let round = 0; round < MAX_PLAN_ROUNDS; round++) {
      const c = await tx.clusterHead(clusterId);
      if (!inProgress(c)) return;
      const g = await this.#glance(tx, c, nowMs);
      if (g === 'quiet') return;
      // for a window to fill, the nodes in flight and the next pending ones give the same plan as all
      const nodes =
        g === 'all'
          ? await tx.clusterNodes(clusterId)
          : [...(await tx.nodesInFlight(clusterId)), ...(await tx.firstPending(clusterId, g.room))];
      const plan: PlanNode[] = nodes.map((n) => ({
        node: n.node,
        position: n.position,
        phase: n.phase,
        stepDeadlineMs: n.stepDeadlineMs,
        reason: n.reason,
      }));
      const actions = planCluster(c.operation, c.maxUnavailable, plan, nowMs);
      if (actions.length === 0) return;
      const first = actions[0]!;
      if (first.type === 'finish') {
        if (first.remove) await tx.removeCluster(clusterId);
        else await tx.finishCluster(clusterId, first.status, first.reason, nowMs);
        return;
      }
      const byNode = new Map(nodes.map((n) => [n.node, n]));
      for (const a of actions) {
        if (a.type === 'finish' || a.type !== first.type) break; // (a plan is all timeouts or all starts)
        const n = byNode.get(a.node);
        if (!n) throw new HeraldError('internal', `cluster ${clusterId}: plan names an unknown node`);
        if (a.type === 'timeout') {
          const installing = n.phase === 'installing';
          const depId = installing ? n.installDeploymentId : n.uninstallDeploymentId;
          const d = await tx.deployment(depId);
          if (!d) throw new HeraldError('not_found', `no deployment ${depId}`);
          const startedAt = Date.parse((installing ? n.installStartedAt : n.uninstallStartedAt) ?? c.updatedAt);
          const why = `no result within the step deadline (${Math.round((n.stepDeadlineMs! - startedAt) / 1000)} s)`;
          // recorded as the revision's result: a late signal for it is then a duplicate
          if (!d.current.signalled)
            await tx.recordResult(d, { status: 'FAILED', statusReason: why, outputValues: null }, nowMs);
          await this.#failStep(tx, c, n, why, nowMs);
        } else if ((await this.#startStep(tx, c, n, a.step, nowMs)) <= nowMs) {
          // a step started with no budget left times out before any other node starts (the next
          // plan's timeouts come first): stop here and plan again, as one start at a time would
          break;
        }
      }
    }
    throw new HeraldError('internal', `cluster ${clusterId} did not settle`);
  }
}
