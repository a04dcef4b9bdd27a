/**
 * The cluster engine (docs/api.md "Clusters"): starts, advances and ends cluster operations inside
 * the caller's transaction, through the narrow `ClusterTx` (tx.ts). It plans with the pure
 * planner (plan.ts) and applies each plan in the same transaction that recorded the event (a
 * signal, an operator's request, a timer tick), so a controller killed at any point carries the
 * operation on from the database. Any store gets it by implementing `ClusterTx`.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { DeployAction } from '../../protocol/heat.js';
import { HOOK_TIMEOUT_S, RESTART_STEP_MARGIN_S, ROLLOUT_PROGRESS_DEADLINE_S } from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import { coerceInputValues } from '../model/inputs.js';
import type {
  ClusterNodeRecord,
  ClusterRecord,
  ConfigRecord,
  GateVerdict,
  NewCluster,
  NewClusterRevision,
  NewNodegroup,
  OnFailure,
  Rollout,
  RolloutCounts,
  RolloutGate,
  RolloutGroup,
  RolloutState,
} from '../model/records.js';
import {
  groupWindow,
  isInFlight,
  isTimeoutReason,
  planCluster,
  planGroupChange,
  planRollout,
  quorumCap,
  TIMEOUT_WORD,
  type ClusterAction,
  type PlanNode,
} from './plan.js';
import {
  changesAny,
  configsOf,
  lastStableBefore,
  nextRevision,
  sameConfigs,
  sameSource,
  undoRevision,
  type ConfigChange,
} from './revisions.js';
import type { ClusterHead, ClusterTx, NodeStepChange } from './tx.js';

/** Actions of a cluster's install deployments: made with CREATE, run again by a restart. */
export const CLUSTER_INSTALL_ACTIONS: DeployAction[] = ['CREATE', 'UPDATE', 'RESTART'];
/**
 * Actions of a cluster's uninstall deployments, run by a restart (RESTART), an upgrade (UPDATE) or
 * a delete (or a node group's removal: DELETE). A node's is made when its first uninstall starts, its first revision that step's
 * action: Heat makes no deployment for an action outside `actions` (a CREATE here), so a new
 * cluster writes none, and its nodes' documents carry their installs alone.
 */
export const CLUSTER_UNINSTALL_ACTIONS: DeployAction[] = ['RESTART', 'UPDATE', 'DELETE'];

/**
 * Safety stop for the plan/apply loop of one cluster in one transaction. Each round applies a
 * whole plan, so a handful of rounds act whatever the cluster's size (timeouts; a deadline's
 * expiry; a promotion, a gate's answer or a revert; window starts; the timeouts of steps started
 * with no budget left; finish), and one more finds nothing to do.
 */
export const MAX_PLAN_ROUNDS = 16;

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

type StepCluster = Pick<ClusterHead, 'id' | 'operation' | 'rollout' | 'revision'>;

/** A rollout's options (docs/api.md "Rollouts"), as the API checked them; each absent one takes its default. */
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
  /** Canary nodes per group: a count, or a percentage of the group's nodes the rollout changes ("10%"). */
  canary?: number | string | null;
  /** Seconds after the canaries completed before they are promoted; null: an operator promotes. */
  autoPromoteS?: number | null;
  /** Default `abort`; `revert` only for an upgrade. */
  onFailure?: OnFailure;
  nodeDeadlineS?: number | null;
  progressDeadlineS?: number | null;
  gate?: RolloutGate | null;
  /** Lift the quorum rule of master groups. */
  force?: boolean;
}

/** What a rollout will do: its limits, and each group's nodes (those it changes) in the order they go. */
export interface RestartPlan {
  rollout: Rollout;
  nodes: Map<string, string[]>;
}

/** What an upgrade will do (docs/api.md): its rollout, and the revision it makes (none when the configs stay). */
export interface UpgradePlan extends RestartPlan {
  /** The revision the nodes go to: new when the change changes anything, else the cluster's. */
  revision: NewClusterRevision;
  /** Whether a new revision is made. */
  newRevision: boolean;
  /** Each node's revision after the upgrade begins, for nodes whose configs stay (bookkeeping). */
  settled: string[];
}

/** A gate the engine wants read before nodes start (docs/api.md `gate`); the caller reads it outside the transaction. */
export interface GateRequest {
  clusterId: string;
  gate: RolloutGate;
}

/** An operator's control of a running rollout (docs/api.md). */
export type RolloutControl = 'pause' | 'resume' | 'abort' | 'promote';

/** A rollout's counters (docs/api.md `counters`). */
export interface RolloutCounters {
  targeted: number;
  completed: number;
  failed: number;
  timedOut: number;
  inFlight: number;
  reverted: number;
}

/** The canaries of a group whose nodes the rollout changes are `changed`: a count, or a percentage of them (at least 1). */
export function canaryCount(spec: number | string | null | undefined, changed: number): number {
  if (spec === null || spec === undefined || changed === 0) return 0;
  const n = typeof spec === 'number' ? spec : Math.max(1, Math.floor((Number(spec.slice(0, -1)) * changed) / 100));
  return Math.min(changed, Math.max(0, n));
}

/** How the nodes of a rollout fared (docs/api.md `counters`), from its nodes and what its state kept. */
export function rolloutCounters(r: Rollout | null, nodes: readonly ClusterNodeRecord[]): RolloutCounters {
  const scope = r ? new Set(r.groups.map((g) => g.name)) : null;
  const mine = scope ? nodes.filter((n) => scope.has(n.nodegroup)) : nodes;
  // a node an upgrade left alone is complete with no step run
  const ran = (n: ClusterNodeRecord) => n.endedAtMs !== null || n.uninstallStartedAt !== null || n.phase !== 'complete';
  const revert = r?.state?.revert ?? null;
  const back = revert ? new Set(revert.nodes) : null;
  const counts = (xs: readonly ClusterNodeRecord[]): RolloutCounts => ({
    completed: xs.filter((n) => n.phase === 'complete' && ran(n)).length,
    failed: xs.filter((n) => n.phase === 'failed').length,
    timedOut: xs.filter((n) => n.phase === 'failed' && isTimeoutReason(n.reason)).length,
  });
  let now = counts(mine);
  if (revert && back) {
    // the upgrade's own outcomes were frozen when the revert began; its nodes' phases are the revert's now
    const again = counts(mine.filter((n) => back.has(n.node)));
    now = {
      completed: revert.before.completed,
      failed: revert.before.failed + again.failed,
      timedOut: revert.before.timedOut + again.timedOut,
    };
  }
  return {
    targeted: r?.targeted ?? mine.length,
    ...now,
    inFlight: mine.filter((n) => isInFlight(n.phase)).length,
    reverted: back ? mine.filter((n) => back.has(n.node) && n.phase === 'complete').length : 0,
  };
}

/** A new rollout's state: nothing happened yet. */
function newState(nowMs: number): RolloutState {
  return {
    progressAtMs: nowMs,
    paused: null,
    forgiven: 0,
    aborted: null,
    expired: null,
    promoted: null,
    gate: null,
    gateWantedAtMs: null,
    revert: null,
  };
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

/** A restart or an upgrade: each node uninstalls, then installs (then its health check). */
function isRolling(h: Pick<ClusterHead, 'operation' | 'rollout'>): boolean {
  return h.operation === 'restart' || (h.operation === 'update' && h.rollout?.upgrade !== undefined);
}

/** The rollout the full planner plans (planRollout), else null (a create, a delete, a group change, a plain restart). */
function fullRollout(h: Pick<ClusterHead, 'operation' | 'rollout'>): Rollout | null {
  const r = h.rollout;
  if (!r || r.change !== undefined || !isRolling(h)) return null;
  return r.upgrade !== undefined || !r.plain ? r : null;
}

export class ClusterEngine {
  readonly #marginS: number;

  constructor(o: ClusterEngineOptions = {}) {
    const marginS = o.stepMarginS ?? RESTART_STEP_MARGIN_S;
    if (!Number.isFinite(marginS)) throw new TypeError('stepMarginS must be a finite number of seconds');
    this.#marginS = marginS;
  }

  /**
   * Creates a cluster: every node installs at once. Its configs and input values are its
   * revision 1 (docs/api.md "Revisions"), stable once the create completed.
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
        createdBy: who,
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
   *   | unknown_config (field `health_config_id`) | invalid_request (field `on_failure`: nothing to revert to)
   */
  async planRestart(tx: ClusterTx, id: string, o: RestartOptions = {}): Promise<RestartPlan> {
    await this.#mustIdle(tx, id);
    if (o.onFailure === 'revert')
      throw new HeraldError('invalid_request', 'a restart changes no configs: it has nothing to revert to', {
        field: 'on_failure',
      });
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
    const all = await tx.clusterNodes(id);
    const nodes = new Map<string, string[]>();
    for (const g of chosen) nodes.set(g.name, []);
    for (const n of all) nodes.get(n.nodegroup)?.push(n.node);
    const sizes = new Map([...nodes].map(([g, ns]) => [g, ns.length]));
    const rollout = await this.#rollout(tx, id, chosen, sizes, nodes, o, null);
    rollout.plain =
      chosen.length === 1 &&
      nodes.get(chosen[0]!.name)!.length === all.length &&
      rollout.pauseS === 0 &&
      rollout.maxFailures === 0 &&
      rollout.healthConfigId === null &&
      (rollout.canaries ?? []).length === 0 &&
      !rollout.gate &&
      (o.onFailure ?? 'abort') === 'abort' &&
      o.nodeDeadlineS == null &&
      o.progressDeadlineS == null;
    if (rollout.plain) {
      // the fast path plans on phases alone: none of the options it ignores is set
      delete rollout.state;
      delete rollout.progressDeadlineS;
    }
    return { rollout, nodes: ordered(nodes, rollout.groups) };
  }

  /**
   * A rollout's limits for `groups` (sizes: each group's node count; changed: the nodes it
   * changes, in order), masters first: each group's window under the quorum rule, its canaries,
   * the deadlines (the progress deadline's default: ROLLOUT_PROGRESS_DEADLINE_S, or its steps'
   * budgets end to end when longer) and a new state.
   */
  async #rollout(
    tx: ClusterTx,
    id: string,
    groups: ReadonlyArray<{ name: string; role: 'master' | 'worker'; installConfigId?: string | null }>,
    sizes: ReadonlyMap<string, number>,
    changed: ReadonlyMap<string, string[]>,
    o: RestartOptions,
    budgets: { installMs: number; uninstallMs: number } | null,
  ): Promise<Rollout> {
    const order = [...groups.filter((g) => g.role === 'master'), ...groups.filter((g) => g.role !== 'master')];
    const rolloutGroups: RolloutGroup[] = [];
    const canaries: string[] = [];
    for (const g of order) {
      const size = sizes.get(g.name) ?? 0;
      const asked = groupWindow(g.role, size, o.maxUnavailable ?? null);
      const quorum = g.role === 'master' && o.force !== true ? quorumCap(size) : undefined;
      const window = quorum === undefined ? asked : Math.min(asked, quorum);
      const mine = changed.get(g.name) ?? [];
      const canary = canaryCount(o.canary, mine.length);
      canaries.push(...mine.slice(0, canary));
      const rg: RolloutGroup = { name: g.name, role: g.role, window };
      if (quorum !== undefined) rg.quorum = quorum;
      if (canary > 0) rg.canary = canary;
      rolloutGroups.push(rg);
    }
    const pauseS = o.pauseS ?? 0;
    const healthConfigId = o.healthConfigId ?? null;
    // steps end to end: the longest uninstall and install of the rollout's configs, and its health check
    let stepsMs = budgets ? budgets.installMs + budgets.uninstallMs : 0;
    if (!budgets) {
      const c = await tx.clusterRevision(id, (await tx.clusterHead(id))!.revision);
      let install = 0;
      let uninstall = 0;
      for (const g of order) {
        const cf = c ? configsOf(c, g.name) : null;
        const i = cf ? await tx.config(cf.install.configId) : undefined;
        const u = cf ? await tx.config(cf.uninstall.configId) : undefined;
        install = Math.max(install, i ? stepBudgetMs(i, this.#marginS) : 0);
        uninstall = Math.max(uninstall, u ? stepBudgetMs(u, this.#marginS) : 0);
      }
      stepsMs = install + uninstall;
    }
    if (healthConfigId) {
      const h = await tx.config(healthConfigId);
      stepsMs += h ? stepBudgetMs(h, this.#marginS) : 0;
    }
    const r: Rollout = {
      groups: rolloutGroups,
      pauseS,
      maxFailures: o.maxFailures ?? 0,
      healthConfigId,
      plain: false,
      onFailure: o.onFailure ?? 'abort',
      nodeDeadlineS: o.nodeDeadlineS ?? null,
      progressDeadlineS:
        o.progressDeadlineS ?? Math.max(ROLLOUT_PROGRESS_DEADLINE_S, Math.ceil(stepsMs / 1000) + pauseS),
      autoPromoteS: o.autoPromoteS ?? null,
      canaries,
      gate: o.gate ?? null,
      force: o.force === true,
      targeted: [...changed.values()].reduce((a, ns) => a + ns.length, 0),
      state: newState(0),
    };
    return r;
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
    if (rollout.state) rollout.state = newState(nowMs);
    const window = Math.max(...rollout.groups.map((g) => g.window), 1);
    await tx.beginOperation(id, 'restart', window, nowMs, rollout);
    await tx.audit(who, 'cluster.restart', id, {
      max_unavailable: window,
      from: c.status,
      nodegroups: rollout.groups.map((g) => ({ name: g.name, max_unavailable: g.window, nodes: nodes.get(g.name) })),
      pause_s: rollout.pauseS,
      max_failures: rollout.maxFailures,
      health_config_id: rollout.healthConfigId,
      ...rolloutAudit(rollout),
    });
    await this.#advance(tx, id, nowMs);
  }

  /**
   * What an upgrade (a change of configs or input values: `PATCH /v1/clusters/{id}`, of one group
   * with `change.nodegroup`) or an undo (`undoTo`: an earlier revision) would do, changing
   * nothing (docs/api.md "Upgrades"): the revision it makes, and the nodes whose configs or
   * values it changes (and any failed node of its groups: an upgrade repairs it), by group.
   * @throws HeraldError not_found | restart_in_progress | unknown_config | bad_input_value |
   *   unknown_cluster_revision | no_change | no_stable_revision | unknown_config (`health_config_id`)
   */
  async planUpgrade(
    tx: ClusterTx,
    id: string,
    change: ConfigChange & { undoTo?: number },
    o: RestartOptions = {},
  ): Promise<UpgradePlan> {
    const head = await this.#mustIdle(tx, id);
    const groups = await tx.nodegroups(id);
    const names = groups.map((g) => g.name);
    if (change.nodegroup !== undefined && !names.includes(change.nodegroup))
      throw new HeraldError('not_found', `cluster ${id} has no node group ${change.nodegroup}`);
    const cur = await tx.clusterRevision(id, head.revision);
    if (!cur) throw new HeraldError('internal', `cluster ${id} has no revision ${head.revision}`);
    let next: NewClusterRevision;
    if (change.undoTo !== undefined) {
      const src = change.undoTo === head.revision ? cur : await tx.clusterRevision(id, change.undoTo);
      if (!src)
        throw new HeraldError('unknown_cluster_revision', `cluster ${id} has no revision ${change.undoTo}`, {
          field: 'revision',
        });
      next = undoRevision(cur, src, names);
    } else next = nextRevision(cur, change, names);
    for (const [key, cid] of [
      ['install_config_id', change.installConfigId],
      ['uninstall_config_id', change.uninstallConfigId],
    ] as const)
      if (cid !== undefined && !(await tx.config(cid)))
        throw new HeraldError('unknown_config', `no config ${cid}`, { field: key });
    if (o.healthConfigId && !(await tx.config(o.healthConfigId)))
      throw new HeraldError('unknown_config', `no config ${o.healthConfigId}`, { field: 'health_config_id' });
    // every group's values checked against its configs now, as a create checks them
    let installMs = 0;
    let uninstallMs = 0;
    for (const g of names) {
      const cf = configsOf(next, g);
      const install = await tx.config(cf.install.configId);
      const uninstall = await tx.config(cf.uninstall.configId);
      if (!install || !uninstall) throw new HeraldError('internal', `cluster ${id} lost a config`);
      coerceInputValues(install, cf.install.inputValues);
      coerceInputValues(uninstall, cf.uninstall.inputValues);
      installMs = Math.max(installMs, stepBudgetMs(install, this.#marginS));
      uninstallMs = Math.max(uninstallMs, stepBudgetMs(uninstall, this.#marginS));
    }
    const newRevision = changesAny(cur, next, names);
    const revision = newRevision ? head.revision + 1 : head.revision;
    // the nodes it changes: those whose configs or values differ, and the failed ones of its groups
    const scope = new Set(change.nodegroup !== undefined && change.undoTo === undefined ? [change.nodegroup] : names);
    const nodes = await tx.clusterNodes(id);
    const revs = new Map<number, NewClusterRevision>([[head.revision, cur]]);
    const changed = new Map<string, string[]>();
    const settled: string[] = [];
    for (const n of nodes) {
      let at = revs.get(n.revision);
      if (!at) {
        at = await tx.clusterRevision(id, n.revision);
        if (!at) throw new HeraldError('internal', `cluster ${id} has no revision ${n.revision}`);
        revs.set(n.revision, at);
      }
      if (scope.has(n.nodegroup) && (n.phase === 'failed' || !sameConfigs(at, next, n.nodegroup))) {
        const m = changed.get(n.nodegroup) ?? [];
        m.push(n.node);
        changed.set(n.nodegroup, m);
      } else if (sameConfigs(at, next, n.nodegroup)) settled.push(n.node);
    }
    if (changed.size === 0)
      throw new HeraldError(
        'no_change',
        newRevision
          ? `the change gives no node of cluster ${id} other configs or values`
          : `every node of cluster ${id} has revision ${head.revision}'s configs and values already`,
      );
    const stable = lastStableBefore(await tx.clusterRevisions(id), revision);
    if (o.onFailure === 'revert' && stable === null)
      throw new HeraldError(
        'no_stable_revision',
        `cluster ${id} has no stable revision before ${revision} to revert to`,
        {
          field: 'on_failure',
        },
      );
    const rolled = groups.filter((g) => changed.has(g.name));
    const sizes = new Map(groups.map((g) => [g.name, nodes.filter((n) => n.nodegroup === g.name).length]));
    const rollout = await this.#rollout(tx, id, rolled, sizes, changed, o, { installMs, uninstallMs });
    rollout.upgrade = {
      revision,
      from: head.revision,
      stable,
      ...(change.undoTo !== undefined ? { undoOf: change.undoTo } : {}),
    };
    return { rollout, nodes: ordered(changed, rollout.groups), revision: next, newRevision, settled };
  }

  /**
   * The revision an undo goes to: `revision` when given, else the last stable one before the
   * cluster's (docs/api.md "Revisions").
   * @throws HeraldError not_found | restart_in_progress | no_stable_revision
   */
  async undoTarget(tx: ClusterTx, id: string, revision?: number): Promise<number> {
    const head = await this.#mustIdle(tx, id);
    if (revision !== undefined) return revision;
    const stable = lastStableBefore(await tx.clusterRevisions(id), head.revision);
    if (stable === null)
      throw new HeraldError('no_stable_revision', `cluster ${id} has no stable revision before ${head.revision}`, {
        field: 'revision',
      });
    return stable;
  }

  /**
   * Starts an upgrade (docs/api.md "Upgrades"): records the new revision (when the change
   * changes anything), then an `update` operation rolls it over the nodes whose configs or values
   * it changes, as a restart rolls (groups, windows, pauses, health check, failure budget), each
   * node uninstalling its old configs and installing the new ones; the others have the new
   * revision at once, nothing run.
   * @returns the revision the nodes go to
   * @throws HeraldError as planUpgrade
   */
  async upgrade(
    tx: ClusterTx,
    id: string,
    change: ConfigChange & { undoTo?: number },
    o: RestartOptions,
    who: string,
    nowMs: number,
  ): Promise<number> {
    const c = await this.#mustIdle(tx, id);
    const plan = await this.planUpgrade(tx, id, change, o);
    const { rollout, nodes } = plan;
    const revision = plan.newRevision ? await tx.addClusterRevision(id, plan.revision, who, nowMs) : c.revision;
    rollout.upgrade!.revision = revision;
    rollout.state = newState(nowMs);
    const window = Math.max(...rollout.groups.map((g) => g.window), 1);
    await tx.beginOperation(id, 'update', window, nowMs, rollout);
    const inRollout = new Set(rollout.groups.map((g) => g.name));
    const changing = new Set([...nodes.values()].flat());
    for (const n of await tx.clusterNodes(id)) {
      if (changing.has(n.node)) continue;
      // a node whose configs stay: its group's other nodes roll, it has nothing to do
      if (inRollout.has(n.nodegroup)) await tx.settleNode(id, n.node);
      if (plan.settled.includes(n.node) && n.revision !== revision) await tx.setNodeRevision(id, n.node, revision);
    }
    await tx.audit(who, change.undoTo !== undefined ? 'cluster.undo' : 'cluster.upgrade', id, {
      from: c.status,
      revision,
      from_revision: c.revision,
      ...(change.undoTo !== undefined ? { undo_of: change.undoTo } : {}),
      ...(change.nodegroup !== undefined ? { nodegroup: change.nodegroup } : {}),
      ...(change.installConfigId !== undefined ? { install_config_id: change.installConfigId } : {}),
      ...(change.uninstallConfigId !== undefined ? { uninstall_config_id: change.uninstallConfigId } : {}),
      ...(change.inputValues !== undefined ? { input_values: Object.keys(change.inputValues) } : {}),
      nodegroups: rollout.groups.map((g) => ({ name: g.name, max_unavailable: g.window, nodes: nodes.get(g.name) })),
      pause_s: rollout.pauseS,
      max_failures: rollout.maxFailures,
      health_config_id: rollout.healthConfigId,
      ...rolloutAudit(rollout),
    });
    await this.#advance(tx, id, nowMs);
    return revision;
  }

  /**
   * An operator's control of the running restart or upgrade (docs/api.md "Rollouts"): `pause`
   * (no node starts; those in flight finish), `resume` (after a pause of `on_failure`, the failed
   * nodes so far are forgiven), `abort` (no node starts; the operation ends failed once none is
   * in flight), `promote` (the canaries' rollout goes on). Pausing a paused rollout, resuming a
   * running one or aborting an aborted one changes nothing. Recorded in the audit with `who`.
   * @throws HeraldError not_found | no_operation (nothing runs, or not a restart or an upgrade) |
   *   not_promotable (no canaries waiting for promotion)
   */
  async control(tx: ClusterTx, id: string, what: RolloutControl, who: string, nowMs: number): Promise<void> {
    const head = await tx.clusterHead(id);
    if (!head) throw new HeraldError('not_found', `no cluster ${id}`);
    const r = head.rollout;
    if (!inProgress(head) || !r || r.change !== undefined || !isRolling(head))
      throw new HeraldError('no_operation', `cluster ${id} runs no restart or upgrade (it is ${head.status})`);
    const st: RolloutState = r.state ?? newState(nowMs);
    let changed = true;
    let detail: Record<string, unknown> = {};
    switch (what) {
      case 'pause':
        if (st.paused) changed = false;
        else st.paused = { by: who, atMs: nowMs, reason: `paused by ${who}`, failure: false };
        break;
      case 'resume':
        if (!st.paused) changed = false;
        else {
          if (st.paused.failure) {
            const scope = new Set(r.groups.map((g) => g.name));
            const back = st.revert ? new Set(st.revert.nodes) : null;
            st.forgiven = (await tx.clusterNodes(id)).filter(
              (n) => scope.has(n.nodegroup) && (!back || back.has(n.node)) && n.phase === 'failed',
            ).length;
            detail = { forgiven: st.forgiven };
          }
          st.paused = null;
          st.progressAtMs = nowMs;
        }
        break;
      case 'abort':
        if (st.aborted) changed = false;
        else st.aborted = { by: who, atMs: nowMs };
        break;
      case 'promote':
        if ((r.canaries ?? []).length === 0 || st.revert || st.promoted)
          throw new HeraldError(
            'not_promotable',
            st.promoted
              ? `cluster ${id}'s canaries are promoted already`
              : `cluster ${id}'s rollout has no canaries to promote`,
          );
        st.promoted = { by: who, atMs: nowMs };
        st.progressAtMs = nowMs;
        break;
    }
    if (changed) {
      const next: Rollout = { ...r, plain: false, state: st };
      if (r.plain) {
        // a plain restart had no state: the full planner takes it over with what it ignored
        next.progressDeadlineS = null;
        next.canaries = [];
      }
      await tx.setRollout(id, next);
    }
    await tx.audit(who, `cluster.${what}`, id, { operation: head.operation, status: head.status, changed, ...detail });
    if (changed) await this.#advance(tx, id, nowMs);
  }

  /**
   * The gate's answer (docs/api.md `gate`), read outside any transaction by the caller: kept with
   * the rollout, so a controller killed after this commit does not ask again, then the rollout
   * advances (a `go` admits the starts of one plan). An answer for a rollout that no longer
   * waits for one is dropped.
   */
  async recordGate(tx: ClusterTx, id: string, v: Omit<GateVerdict, 'used'>, nowMs: number): Promise<void> {
    const head = await tx.clusterHead(id);
    if (!inProgress(head)) return;
    const r = fullRollout(head);
    if (!r?.gate || !r.state || r.state.gateWantedAtMs === null) return;
    // a stop leaves the rollout waiting (asked again GATE_RETRY_INTERVAL_MS later); a go ends the wait
    const wanted = v.verdict === 'go' ? null : r.state.gateWantedAtMs;
    const next: Rollout = { ...r, state: { ...r.state, gate: { ...v, used: false }, gateWantedAtMs: wanted } };
    await tx.setRollout(id, next);
    await this.#advance(tx, id, nowMs, { ...head, rollout: next });
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
    const head = await this.#mustIdle(tx, id);
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
    const step: StepCluster = { id, operation: 'update', rollout, revision: head.revision };
    for (const n of members) await this.#startStep(tx, step, n, 'uninstall', nowMs);
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
    const head: StepCluster = { id, operation: 'delete', revision: c.revision };
    for (const n of nodes) await this.#startStep(tx, head, n, 'uninstall', nowMs);
    await this.#advance(tx, id, nowMs);
  }

  /**
   * Fails steps past their deadline and fills rollout windows, for every cluster this transaction
   * claims. @returns the gates to read before some rollout's nodes may start (recordGate takes the answers)
   */
  async tick(tx: ClusterTx, nowMs: number): Promise<GateRequest[]> {
    const gates: GateRequest[] = [];
    for (const id of await tx.claimActiveClusters()) await this.#advance(tx, id, nowMs, undefined, gates);
    return gates;
  }

  /**
   * A deployment's result ended the step of `o.node`: records it on the node, then advances.
   * A result for a step no longer in flight (late, or its operation ended) changes nothing.
   * Reads the cluster's head and this node's row only, never the whole cluster: a cluster step
   * gets one signal per node, so anything O(nodes) here is O(nodes²) per operation.
   */
  async onStepResult(tx: ClusterTx, o: StepOutcome, nowMs: number): Promise<void> {
    let head = await tx.clusterHead(o.clusterId);
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
    let completed = false;
    if (!o.ok) {
      await this.#failStep(tx, head, n, o.reason, nowMs);
    } else if (n.phase === 'uninstalling') {
      await tx.setNodeStep(head.id, n.node, { type: 'uninstalled' }, nowMs);
      // the install revision is made in the transaction that records the uninstall's success:
      // the two are never pending at once, and a crash cannot fall between them
      if (isRolling(head)) await this.#startStep(tx, head, n, 'install', nowMs);
      else await tx.setNodeStep(head.id, n.node, { type: 'complete', installFinished: false }, nowMs);
    } else if (n.phase === 'installing' && isRolling(head) && head.rollout?.healthConfigId) {
      await this.#startCheck(tx, head, n, head.rollout.healthConfigId, nowMs);
    } else {
      await tx.setNodeStep(head.id, n.node, { type: 'complete', installFinished: n.phase === 'installing' }, nowMs);
      completed = true;
    }
    const r = fullRollout(head);
    if (completed && r?.state) {
      // progress: the progress deadline counts from here
      const next: Rollout = { ...r, state: { ...r.state, progressAtMs: nowMs } };
      await tx.setRollout(head.id, next);
      head = { ...head, rollout: next };
    }
    // (nothing above changes the cluster's own row but its rollout, passed on: the head read under its lock is still the head)
    await this.#advance(tx, head.id, nowMs, head);
  }

  async #mustIdle(tx: ClusterTx, id: string): Promise<ClusterHead> {
    const c = await tx.clusterHead(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    if (inProgress(c)) throw new HeraldError('restart_in_progress', `cluster ${id} is ${c.status}`);
    return c;
  }

  /** The revision a rolling node goes to now: an upgrade's, or its revert's; null for a restart. */
  #targetRevision(c: StepCluster): number | null {
    if (c.operation !== 'update' || !c.rollout?.upgrade) return null;
    return c.rollout.state?.revert?.revision ?? c.rollout.upgrade.revision;
  }

  /**
   * Starts a node's step: a new revision of its uninstall or install deployment, or, at its
   * first uninstall, its uninstall deployment made with that revision. Returns its deadline (epoch ms).
   * In an upgrade (or its revert) the uninstall runs the node's configs (`deploy_action` UPDATE)
   * and the install has the target revision's: the install deployment's config and values change
   * with its new revision, and an uninstall deployment of other configs is dropped (the next
   * uninstall makes one of the node's new revision).
   */
  async #startStep(
    tx: ClusterTx,
    c: StepCluster,
    n: ClusterNodeRecord,
    step: 'uninstall' | 'install',
    nowMs: number,
  ): Promise<number> {
    const removing = c.operation === 'delete' || (c.operation === 'update' && c.rollout?.change?.type === 'remove');
    const target = this.#targetRevision(c);
    const reason: WakeReason = c.operation === 'restart' ? 'restart' : 'deployment';
    const depId = step === 'install' ? n.installDeploymentId : n.uninstallDeploymentId;
    const current = depId === null ? undefined : await tx.deployment(depId);
    const wanted: DeployAction = removing ? 'DELETE' : target !== null ? 'UPDATE' : 'RESTART';
    // an uninstall deployment made before upgrades has no UPDATE among its actions: it runs as a restart's
    const action: DeployAction = current && !current.actions.includes(wanted) ? 'RESTART' : wanted;
    let d = current;
    if (step === 'install' && target !== null && current) {
      const [now, to] = await Promise.all([tx.clusterRevision(c.id, n.revision), tx.clusterRevision(c.id, target)]);
      if (!now || !to) throw new HeraldError('internal', `cluster ${c.id} lost revision ${n.revision} or ${target}`);
      const into = configsOf(to, n.nodegroup);
      if (n.uninstallDeploymentId !== null && !sameSource(configsOf(now, n.nodegroup).uninstall, into.uninstall))
        await tx.dropUninstallDeployment(c.id, n.node);
      await tx.reviseDeployment(current, into.install, action, reason);
      if (n.revision !== target) await tx.setNodeRevision(c.id, n.node, target);
      d = { ...current, configId: into.install.configId };
    } else if (current) await tx.newRevision(current, action, reason);
    if (depId === null) {
      // its first uninstall (or its first since an upgrade changed its configs): of the node's revision
      let source: { configId: string; inputValues: Record<string, unknown> } | undefined;
      if (n.revision !== c.revision) {
        const rev = await tx.clusterRevision(c.id, n.revision);
        if (!rev) throw new HeraldError('internal', `cluster ${c.id} has no revision ${n.revision}`);
        source = configsOf(rev, n.nodegroup).uninstall;
      }
      const made = await tx.newUninstallDeployment(c.id, n.node, CLUSTER_UNINSTALL_ACTIONS, wanted, reason, source);
      d = { id: made.id, configId: made.configId } as typeof d;
    }
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

  /** Fails node `n`'s step in flight with `why`, recorded as its deployment's result (a late signal is then a duplicate). */
  async #timeOut(tx: ClusterTx, c: ClusterHead, n: ClusterNodeRecord, why: string, nowMs: number): Promise<void> {
    const depId =
      n.phase === 'installing'
        ? n.installDeploymentId
        : n.phase === 'checking'
          ? (n.healthDeploymentId ?? '')
          : (n.uninstallDeploymentId ?? '');
    const d = await tx.deployment(depId);
    if (!d) throw new HeraldError('not_found', `no deployment ${depId}`);
    if (!d.current.signalled)
      await tx.recordResult(d, { status: 'FAILED', statusReason: why, outputValues: null }, nowMs);
    await this.#failStep(tx, c, n, why, nowMs);
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
   * `gates`: where a rollout waiting for its gate's answer is noted (the tick's), else only
   * its wait is recorded.
   */
  async #advance(
    tx: ClusterTx,
    clusterId: string,
    nowMs: number,
    head?: ClusterHead,
    gates?: GateRequest[],
  ): Promise<void> {
    for (let round = 0; round < MAX_PLAN_ROUNDS; round++) {
      const c = round === 0 && head !== undefined ? head : await tx.clusterHead(clusterId);
      if (!inProgress(c)) return;
      // a rollout with groups, pauses, a failure budget, a health check (or any of its options) plans on every node
      const rollout = fullRollout(c);
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
        startedAtMs: n.uninstallStartedAt === null ? null : Date.parse(n.uninstallStartedAt),
      }));
      const actions = change
        ? planGroupChange(change, plan, nowMs)
        : rollout
          ? planRollout(rollout, plan, nowMs)
          : planCluster(c.operation, c.maxUnavailable, plan, nowMs);
      if (actions.length === 0) return;
      const first = actions[0]!;
      const byNode = new Map(nodes.map((n) => [n.node, n]));
      if (first.type === 'finish') {
        if (first.remove) await tx.removeCluster(clusterId);
        else {
          if (first.removeNodegroup !== undefined) await tx.removeNodegroup(clusterId, first.removeNodegroup);
          await tx.finishCluster(clusterId, first.status, first.reason, nowMs);
          // a revision is stable once an operation completed with every node at it
          const left = nodes.filter((n) => n.nodegroup !== first.removeNodegroup);
          if (first.status.endsWith('_COMPLETE') && left.every((n) => n.revision === c.revision))
            await tx.markRevisionStable(clusterId, c.revision, nowMs);
        }
        return;
      }
      if (rollout && first.type !== 'timeout' && first.type !== 'start') {
        await this.#applyRolloutAction(tx, c, rollout, first, nodes, nowMs, gates);
        if (first.type === 'gate') return; // (the answer comes in another transaction)
        continue;
      }
      let started = false;
      for (const a of actions) {
        if (a.type !== 'timeout' && a.type !== 'start') break;
        if (a.type !== first.type) break; // (a plan is all timeouts or all starts)
        const n = byNode.get(a.node);
        if (!n) throw new HeraldError('internal', `cluster ${clusterId}: plan names an unknown node`);
        if (a.type === 'timeout') {
          let why: string;
          if (a.why === 'node') why = `node ${TIMEOUT_WORD} (${rollout?.nodeDeadlineS ?? 0} s) passed`;
          else {
            const started =
              n.phase === 'installing'
                ? n.installStartedAt
                : n.phase === 'checking'
                  ? n.checkStartedAt
                  : n.uninstallStartedAt;
            const startedAt = Date.parse(started ?? c.updatedAt);
            why = `no result within the step ${TIMEOUT_WORD} (${Math.round((n.stepDeadlineMs! - startedAt) / 1000)} s)`;
          }
          await this.#timeOut(tx, c, n, why, nowMs);
        } else {
          started = true;
          if ((await this.#startStep(tx, c, n, a.step, nowMs)) <= nowMs) {
            // a step started with no budget left times out before any other node starts (the next
            // plan's timeouts come first): stop here and plan again, as one start at a time would
            break;
          }
        }
      }
      // a gate's go admits one plan's starts
      if (started && rollout?.gate && rollout.state?.gate && !rollout.state.gate.used)
        await tx.setRollout(clusterId, {
          ...rollout,
          state: { ...rollout.state, gate: { ...rollout.state.gate, used: true } },
        });
    }
    throw new HeraldError('internal', `cluster ${clusterId} did not settle`);
  }

  /** Applies a rollout's plan other than timeouts and starts (planRollout): its state moves on. */
  async #applyRolloutAction(
    tx: ClusterTx,
    c: ClusterHead,
    r: Rollout,
    a: ClusterAction,
    nodes: readonly ClusterNodeRecord[],
    nowMs: number,
    gates: GateRequest[] | undefined,
  ): Promise<void> {
    const st: RolloutState = { ...(r.state ?? newState(nowMs)) };
    switch (a.type) {
      case 'expire': {
        const scope = new Set(r.groups.map((g) => g.name));
        const back = st.revert ? new Set(st.revert.nodes) : null;
        for (const n of nodes)
          if (scope.has(n.nodegroup) && (!back || back.has(n.node)) && isInFlight(n.phase))
            await this.#timeOut(tx, c, n, a.reason, nowMs);
        st.expired = { atMs: nowMs, reason: a.reason };
        break;
      }
      case 'pause':
        st.paused = { by: 'on_failure', atMs: nowMs, reason: a.reason, failure: true };
        break;
      case 'promote':
        st.promoted = { by: 'auto', atMs: nowMs };
        st.progressAtMs = nowMs;
        break;
      case 'gate':
        gates?.push({ clusterId: c.id, gate: r.gate! });
        if (st.gateWantedAtMs !== null) return; // (already waiting: nothing to write)
        st.gateWantedAtMs = nowMs;
        break;
      case 'revert': {
        const scope = new Set(r.groups.map((g) => g.name));
        // the nodes it changed: every node of its groups whose pass started (an upgrade leaves the others alone)
        const changed = nodes.filter(
          (n) =>
            scope.has(n.nodegroup) &&
            (n.phase === 'failed' ||
              (n.phase === 'complete' && (n.endedAtMs !== null || n.uninstallStartedAt !== null))),
        );
        const before = rolloutCounters(r, nodes);
        st.revert = {
          revision: r.upgrade!.stable!,
          atMs: nowMs,
          nodes: changed.map((n) => n.node),
          before: { completed: before.completed, failed: before.failed, timedOut: before.timedOut },
          why: a.reason,
        };
        st.paused = null;
        st.expired = null;
        st.progressAtMs = nowMs;
        await tx.resetNodes(c.id, st.revert.nodes);
        break;
      }
      default:
        throw new HeraldError('internal', `cluster ${c.id}: unexpected plan ${a.type}`);
    }
    await tx.setRollout(c.id, { ...r, state: st });
  }
}

/** `nodes` in the order of `groups` (the order they go). */
function ordered(nodes: ReadonlyMap<string, string[]>, groups: readonly RolloutGroup[]): Map<string, string[]> {
  return new Map(groups.map((g) => [g.name, nodes.get(g.name) ?? []]));
}

/** A rollout's options beyond a restart's first ones, for its audit row. */
function rolloutAudit(r: Rollout): Record<string, unknown> {
  return {
    canaries: r.canaries ?? [],
    auto_promote_s: r.autoPromoteS ?? null,
    on_failure: r.onFailure ?? 'abort',
    node_deadline_s: r.nodeDeadlineS ?? null,
    progress_deadline_s: r.progressDeadlineS ?? null,
    gate: r.gate ? { kind: r.gate.kind, url: r.gate.url, fail_open: r.gate.failOpen } : null,
    force: r.force === true,
  };
}
