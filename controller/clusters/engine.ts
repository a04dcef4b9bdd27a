/**
 * The cluster engine (docs/api.md "Clusters"): starts, advances and ends cluster operations inside
 * the caller's transaction, through the narrow `ClusterTx` (tx.ts). It plans with the pure
 * planner (plan.ts) and applies each plan in the same transaction that recorded the event (a
 * signal, an operator's request, a timer tick), so a controller killed at any point carries the
 * operation on from the database. Any store gets it by implementing `ClusterTx`.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { DeployAction } from '../../protocol/heat.js';
import { HOOK_TIMEOUT_S, RESTART_STEP_MARGIN_S } from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import type {
  ClusterNodeRecord,
  ClusterRecord,
  ConfigRecord,
  NewCluster,
  NewNodegroup,
  Rollout,
} from '../model/records.js';
import { groupWindow, planCluster, planGroupChange, planRollout, type PlanNode } from './plan.js';
import type { ClusterHead, ClusterTx, NodeStepChange } from './tx.js';

/** Actions of a cluster's install deployments: made with CREATE, run again by a restart. */
export const CLUSTER_INSTALL_ACTIONS: DeployAction[] = ['CREATE', 'UPDATE', 'RESTART'];
/**
 * Actions of a cluster's uninstall deployments, run by a restart or a delete (or a node group's
 * removal). A node's is made when its first uninstall starts, its first revision that step's
 * action: Heat makes no deployment for an action outside `actions` (a CREATE here), so a new
 * cluster writes none, and its nodes' documents carry their installs alone.
 */
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

type StepCluster = Pick<ClusterHead, 'id' | 'operation' | 'rollout'>;

/** A restart's options (docs/api.md), as the API checked them; each absent one takes its default. */
export interface RestartOptions {
  /** A count, or a percentage of each group's nodes ("25%"); default 1 in a master group, all in the others. */
  maxUnavailable?: number | string | null;
  /** The groups to restart (default: all); they still go masters first, then in creation order. */
  nodegroups?: string[] | null;
  /** Seconds a node's slot stays taken after its end (default 0). */
  pauseS?: number;
  /** Failed nodes tolerated before no other node starts (default 0). */
  maxFailures?: number;
  /** A config run on each node (`deploy_action` CHECK) after its install; the node ends when it succeeded. */
  healthConfigId?: string | null;
}

/** What a restart will do: its limits, and each group's nodes in the order they restart. */
export interface RestartPlan {
  rollout: Rollout;
  nodes: Map<string, string[]>;
}

function timeoutSOf(config: ConfigRecord): number {
  const t = config.options.timeout;
  return typeof t === 'number' && Number.isFinite(t) && t > 0 ? t : HOOK_TIMEOUT_S;
}

/** A step's budget in ms: the config's hook timeout (`options.timeout`, else HOOK_TIMEOUT_S) plus the margin (docs/api.md). */
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
   * @returns the cluster as written (what a read of it after the commit gives back)
   * @throws HeraldError unknown_config | unknown_node | cluster_busy (with the field)
   */
  async create(tx: ClusterTx, c: NewCluster, who: string, nowMs: number): Promise<ClusterRecord> {
    const groups: NewNodegroup[] = c.nodegroups ?? [
      {
        name: 'default-worker',
        role: 'worker',
        nodes: c.nodes,
        ownInstallConfigId: null,
        ownUninstallConfigId: null,
        ownInputValues: null,
        installConfigId: c.installConfigId,
        uninstallConfigId: c.uninstallConfigId,
        installInputValues: c.installInputValues,
      },
    ];
    // every install starts at once: the step's deadline is the longest of the groups' budgets
    let budgetMs = 0;
    for (const [i, g] of [{ installConfigId: c.installConfigId }, ...groups].entries()) {
      const install = await tx.config(g.installConfigId);
      if (!install)
        throw new HeraldError('unknown_config', `no config ${g.installConfigId}`, {
          field: i === 0 ? 'install_config_id' : `nodegroups.${i - 1}.install_config_id`,
        });
      budgetMs = Math.max(budgetMs, stepBudgetMs(install, this.#marginS));
    }
    const cluster = await tx.insertCluster(
      {
        ...c,
        nodes: groups.flatMap((g) => g.nodes),
        nodegroups: groups,
        installActions: CLUSTER_INSTALL_ACTIONS,
        stepDeadlineMs: nowMs + budgetMs,
      },
      nowMs,
    );
    await tx.audit(who, 'cluster.create', cluster.id, {
      name: c.name,
      nodes: c.nodes,
      nodegroups: groups.map((g) => ({ name: g.name, role: g.role, nodes: g.nodes })),
    });
    return cluster;
  }

  /**
   * What a restart with `o` would do (docs/api.md), changing nothing: the groups in the order they
   * restart (masters first, then the others in creation order), each with its window.
   * @throws HeraldError not_found | restart_in_progress | unknown_nodegroup (field `nodegroups.<i>`)
   *   | unknown_config (field `health_config_id`)
   */
  async planRestart(tx: ClusterTx, id: string, o: RestartOptions = {}): Promise<RestartPlan> {
    await this.#mustIdle(tx, id);
    const groups = await tx.nodegroups(id);
    const names = new Set(groups.map((g) => g.name));
    for (const [i, name] of (o.nodegroups ?? []).entries())
      if (!names.has(name))
        throw new HeraldError('unknown_nodegroup', `cluster ${id} has no node group ${name}`, {
          field: `nodegroups.${i}`,
        });
    if (o.healthConfigId && !(await tx.config(o.healthConfigId)))
      throw new HeraldError('unknown_config', `no config ${o.healthConfigId}`, { field: 'health_config_id' });
    const chosen = o.nodegroups ? groups.filter((g) => o.nodegroups!.includes(g.name)) : groups;
    const ordered = [...chosen.filter((g) => g.role === 'master'), ...chosen.filter((g) => g.role !== 'master')];
    const all = await tx.clusterNodes(id);
    const nodes = new Map<string, string[]>();
    for (const g of ordered) nodes.set(g.name, []);
    for (const n of all) nodes.get(n.nodegroup)?.push(n.node);
    const rolloutGroups = ordered.map((g) => ({
      name: g.name,
      role: g.role,
      window: groupWindow(g.role, nodes.get(g.name)!.length, o.maxUnavailable ?? null),
    }));
    const pauseS = o.pauseS ?? 0;
    const maxFailures = o.maxFailures ?? 0;
    const healthConfigId = o.healthConfigId ?? null;
    const plain =
      ordered.length === 1 &&
      nodes.get(ordered[0]!.name)!.length === all.length &&
      pauseS === 0 &&
      maxFailures === 0 &&
      healthConfigId === null;
    return { rollout: { groups: rolloutGroups, pauseS, maxFailures, healthConfigId, plain }, nodes };
  }

  /**
   * Starts a restart (docs/api.md): `o` a window (the form before node groups: a count, or null
   * for the default) or the full options.
   * @throws HeraldError as planRestart
   */
  async restart(
    tx: ClusterTx,
    id: string,
    o: number | null | RestartOptions,
    who: string,
    nowMs: number,
  ): Promise<void> {
    const opts: RestartOptions = typeof o === 'number' || o === null ? { maxUnavailable: o } : o;
    const c = await this.#mustIdle(tx, id);
    const { rollout, nodes } = await this.planRestart(tx, id, opts);
    const window = Math.max(...rollout.groups.map((g) => g.window), 1);
    await tx.beginOperation(id, 'restart', window, nowMs, rollout);
    await tx.audit(who, 'cluster.restart', id, {
      max_unavailable: window,
      from: c.status,
      nodegroups: rollout.groups.map((g) => ({ name: g.name, max_unavailable: g.window, nodes: nodes.get(g.name) })),
      pause_s: rollout.pauseS,
      max_failures: rollout.maxFailures,
      health_config_id: rollout.healthConfigId,
    });
    await this.#advance(tx, id, nowMs);
  }

  /**
   * Adds node group `g` to an idle cluster (docs/api.md): an `update` in which the group's nodes
   * install at once; UPDATE_COMPLETE when all did, else UPDATE_FAILED (the group stays).
   * @throws HeraldError not_found | restart_in_progress | invalid_request (field `name`: the
   *   cluster has that group) | unknown_node | cluster_busy (field `nodes.<i>`) | unknown_config
   */
  async addNodegroup(tx: ClusterTx, id: string, g: NewNodegroup, who: string, nowMs: number): Promise<void> {
    await this.#mustIdle(tx, id);
    if ((await tx.nodegroups(id)).some((x) => x.name === g.name))
      throw new HeraldError('invalid_request', `cluster ${id} has a node group ${g.name} already`, { field: 'name' });
    const install = await tx.config(g.installConfigId);
    if (!install)
      throw new HeraldError('unknown_config', `no config ${g.installConfigId}`, { field: 'install_config_id' });
    // begun before the group's nodes exist: an update makes only its group's nodes pending
    await tx.beginOperation(id, 'update', g.nodes.length, nowMs, {
      groups: [{ name: g.name, role: g.role, window: g.nodes.length }],
      pauseS: 0,
      maxFailures: 0,
      healthConfigId: null,
      plain: false,
      change: { type: 'add', nodegroup: g.name },
    });
    await tx.insertNodegroup(
      id,
      g,
      {
        installActions: CLUSTER_INSTALL_ACTIONS,
        stepDeadlineMs: nowMs + stepBudgetMs(install, this.#marginS),
      },
      nowMs,
    );
    await tx.audit(who, 'cluster.nodegroup.add', id, { name: g.name, role: g.role, nodes: g.nodes });
  }

  /**
   * Removes node group `name` (docs/api.md): an `update` in which its nodes uninstall at once
   * (`deploy_action` DELETE); once all did, the group, its nodes' rows and their deployments go
   * (UPDATE_COMPLETE); if one fails, UPDATE_FAILED and the group stays. The last group stays
   * (delete the cluster instead).
   * @throws HeraldError not_found | restart_in_progress | invalid_request
   */
  async deleteNodegroup(tx: ClusterTx, id: string, name: string, who: string, nowMs: number): Promise<void> {
    await this.#mustIdle(tx, id);
    const groups = await tx.nodegroups(id);
    const g = groups.find((x) => x.name === name);
    if (!g) throw new HeraldError('not_found', `cluster ${id} has no node group ${name}`);
    if (groups.length === 1)
      throw new HeraldError('invalid_request', `node group ${name} is the cluster's last; delete the cluster instead`);
    const members = (await tx.clusterNodes(id)).filter((n) => n.nodegroup === name);
    const rollout: Rollout = {
      groups: [{ name, role: g.role, window: Math.max(1, members.length) }],
      pauseS: 0,
      maxFailures: 0,
      healthConfigId: null,
      plain: false,
      change: { type: 'remove', nodegroup: name },
    };
    await tx.beginOperation(id, 'update', Math.max(1, members.length), nowMs, rollout);
    await tx.audit(who, 'cluster.nodegroup.delete', id, { name, nodes: members.map((n) => n.node) });
    const head: StepCluster = { id, operation: 'update', rollout };
    for (const n of members) await this.#startStep(tx, head, n, 'uninstall', nowMs);
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
        (n.uninstallDeploymentId === o.deploymentId && n.phase === 'uninstalling') ||
        (n.healthDeploymentId === o.deploymentId && n.phase === 'checking')
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
    } else if (n.phase === 'installing' && head.operation === 'restart' && head.rollout?.healthConfigId) {
      await this.#startCheck(tx, head, n, head.rollout.healthConfigId, nowMs);
    } else {
      await tx.setNodeStep(head.id, n.node, { type: 'complete', installFinished: n.phase === 'installing' }, nowMs);
    }
    // (nothing above changes the cluster's own row: the head read under its lock is still the head)
    await this.#advance(tx, head.id, nowMs, head);
  }

  async #mustIdle(tx: ClusterTx, id: string): Promise<ClusterHead> {
    const c = await tx.clusterHead(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    if (inProgress(c)) throw new HeraldError('restart_in_progress', `cluster ${id} is ${c.status}`);
    return c;
  }

  /**
   * Starts a node's step: a new revision of its uninstall or install deployment, or, at its
   * first uninstall, its uninstall deployment made with that revision. Returns its deadline (epoch ms).
   */
  async #startStep(
    tx: ClusterTx,
    c: StepCluster,
    n: ClusterNodeRecord,
    step: 'uninstall' | 'install',
    nowMs: number,
  ): Promise<number> {
    const removing = c.operation === 'delete' || (c.operation === 'update' && c.rollout?.change?.type === 'remove');
    const action: DeployAction = removing ? 'DELETE' : 'RESTART';
    const reason: WakeReason = c.operation === 'restart' ? 'restart' : 'deployment';
    const depId = step === 'install' ? n.installDeploymentId : n.uninstallDeploymentId;
    const current = depId === null ? undefined : await tx.deployment(depId);
    if (current) await tx.newRevision(current, action, reason);
    const d =
      depId === null
        ? await tx.newUninstallDeployment(c.id, n.node, CLUSTER_UNINSTALL_ACTIONS, action, reason)
        : current;
    if (!d) throw new HeraldError('not_found', `no deployment ${depId}`);
    const config = await tx.config(d.configId);
    if (!config) throw new HeraldError('internal', `deployment ${d.id} has no config ${d.configId}`);
    const deadlineMs = nowMs + stepBudgetMs(config, this.#marginS);
    const start: NodeStepChange = { type: 'start', step, deadlineMs };
    if (depId === null) start.uninstallDeploymentId = d.id;
    await tx.setNodeStep(c.id, n.node, start, nowMs);
    return deadlineMs;
  }

  /** The install succeeded: the health check starts on the node, a new health deployment (docs/api.md). */
  async #startCheck(
    tx: ClusterTx,
    c: StepCluster,
    n: ClusterNodeRecord,
    healthConfigId: string,
    nowMs: number,
  ): Promise<void> {
    const config = await tx.config(healthConfigId);
    if (!config) throw new HeraldError('internal', `no health config ${healthConfigId}`);
    const depId = await tx.newHealthDeployment(c.id, n.node, config.id, n.healthDeploymentId);
    const deadlineMs = nowMs + stepBudgetMs(config, this.#marginS);
    await tx.setNodeStep(c.id, n.node, { type: 'check', deadlineMs, healthDeploymentId: depId }, nowMs);
  }

  async #failStep(tx: ClusterTx, c: StepCluster, n: ClusterNodeRecord, reason: string, nowMs: number): Promise<void> {
    const step = n.phase === 'uninstalling' ? 'uninstall' : n.phase === 'checking' ? 'check' : 'install';
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
   * than the window's nodes. `head`: the cluster's head as the caller read it in this
   * transaction, when nothing since has changed the cluster's row (one read less per signal).
   */
  async #advance(tx: ClusterTx, clusterId: string, nowMs: number, head?: ClusterHead): Promise<void> {
    for (let round = 0; round < MAX_PLAN_ROUNDS; round++) {
      const c = round === 0 && head !== undefined ? head : await tx.clusterHead(clusterId);
      if (!inProgress(c)) return;
      // a rollout with groups, pauses, a failure budget or a health check plans on every node
      const rollout = c.operation === 'restart' && c.rollout && !c.rollout.plain ? c.rollout : null;
      const change = c.operation === 'update' ? (c.rollout?.change ?? null) : null;
      const g = rollout || change ? 'all' : await this.#glance(tx, c, nowMs);
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
        nodegroup: n.nodegroup,
        endedAtMs: n.endedAtMs,
      }));
      const actions = change
        ? planGroupChange(change, plan, nowMs)
        : rollout
          ? planRollout(rollout, plan, nowMs)
          : planCluster(c.operation, c.maxUnavailable, plan, nowMs);
      if (actions.length === 0) return;
      const first = actions[0]!;
      if (first.type === 'finish') {
        if (first.remove) await tx.removeCluster(clusterId);
        else {
          if (first.removeNodegroup !== undefined) await tx.removeNodegroup(clusterId, first.removeNodegroup);
          await tx.finishCluster(clusterId, first.status, first.reason, nowMs);
        }
        return;
      }
      const byNode = new Map(nodes.map((n) => [n.node, n]));
      for (const a of actions) {
        if (a.type === 'finish' || a.type !== first.type) break; // (a plan is all timeouts or all starts)
        const n = byNode.get(a.node);
        if (!n) throw new HeraldError('internal', `cluster ${clusterId}: plan names an unknown node`);
        if (a.type === 'timeout') {
          const [depId, started] =
            n.phase === 'installing'
              ? [n.installDeploymentId, n.installStartedAt]
              : n.phase === 'checking'
                ? [n.healthDeploymentId ?? '', n.checkStartedAt]
                : [n.uninstallDeploymentId ?? '', n.uninstallStartedAt];
          const d = await tx.deployment(depId);
          if (!d) throw new HeraldError('not_found', `no deployment ${depId}`);
          const startedAt = Date.parse(started ?? c.updatedAt);
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
