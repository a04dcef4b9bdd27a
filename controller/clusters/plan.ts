/**
 * The cluster operations' state machine (docs/api.md "Clusters"), as a pure planner: given a
 * cluster's operation and its nodes' phases, what happens next. The engine (engine.ts) applies
 * the plan in the same transaction that recorded the event (a signal or a timer tick), so the
 * plan is never only in memory: a controller killed at any point carries the operation on from the database.
 *
 * - create: every node installs at once; CREATE_COMPLETE when all did, else CREATE_FAILED.
 * - restart: a sliding window of at most `maxUnavailable` nodes; each runs its uninstall step,
 *   then (started by the engine in the transaction that records the uninstall's success) its
 *   install step. After a failure no new node starts; the operation ends RESTART_FAILED once the
 *   nodes in flight finish. Nodes never started stay `pending`, untouched.
 * - delete: every node uninstalls at once; a node whose uninstall succeeded loses its
 *   deployments; the cluster is removed when all did, else DELETE_FAILED.
 */
import { GATE_RETRY_INTERVAL_MS } from '../../protocol/limits.js';
import type { ClusterNodePhase, ClusterOperation, ClusterStatus, Rollout } from '../model/records.js';

export interface PlanNode {
  node: string;
  position: number;
  phase: ClusterNodePhase;
  stepDeadlineMs: number | null;
  reason: string | null;
  /** The node's group (docs/api.md); only planRollout reads it. */
  nodegroup?: string;
  /** When the node's step ended (epoch ms), else null; only planRollout reads it (pause_s). */
  endedAtMs?: number | null;
  /** When the node's pass began (its uninstall's start, epoch ms), else null; only planRollout reads it (node_deadline_s). */
  startedAtMs?: number | null;
}

export type ClusterAction =
  /** A step past its deadline (`why` `node`: the node past `nodeDeadlineS`). */
  | { type: 'timeout'; node: string; why?: 'node' }
  | { type: 'start'; node: string; step: 'uninstall' | 'install' }
  | {
      type: 'finish';
      status: ClusterStatus;
      reason: string;
      remove: boolean;
      /** A node group to remove (its nodes' uninstall succeeded), then finish in `status`. */
      removeNodegroup?: string;
    }
  /** The progress deadline passed: the nodes in flight fail, none starts any more (planRollout). */
  | { type: 'expire'; reason: string }
  /** `on_failure: pause`: the rollout waits for an operator (or its progress deadline). */
  | { type: 'pause'; reason: string }
  /** The canaries completed `auto_promote_s` ago. */
  | { type: 'promote' }
  /** Nodes would start: the external gate must answer first (the engine asks it, outside the transaction). */
  | { type: 'gate' }
  /** `on_failure: revert`: the nodes the rollout changed go back to the last stable revision. */
  | { type: 'revert'; reason: string };

export function isInFlight(phase: ClusterNodePhase): boolean {
  return phase === 'uninstalling' || phase === 'installing' || phase === 'checking';
}

/**
 * The next actions for one cluster. Timeouts come first (the caller applies them and plans
 * again); then window starts; `finish` only when nothing is in flight or startable.
 * `maxUnavailable` is the window of a restart (≥ 1).
 *
 * A plan is all timeouts, all starts, or one `finish`, and its actions are independent: each
 * names a different node, and the starts together fit the room left in the window. So the
 * caller applies every action of a plan before planning again, which gives the same result as
 * applying them one at a time, with one exception it must honour: a start whose deadline has
 * already passed (no budget) is timed out by the next plan before any other node starts.
 */
export function planCluster(
  op: ClusterOperation,
  maxUnavailable: number,
  nodes: readonly PlanNode[],
  nowMs: number,
): ClusterAction[] {
  const timeouts = nodes.filter((n) => isInFlight(n.phase) && n.stepDeadlineMs !== null && n.stepDeadlineMs <= nowMs);
  if (timeouts.length > 0) return timeouts.map((n) => ({ type: 'timeout', node: n.node }));

  const inFlight = nodes.filter((n) => isInFlight(n.phase)).length;
  const failed = nodes.filter((n) => n.phase === 'failed');
  const actions: ClusterAction[] = [];
  if (op === 'restart' && failed.length === 0) {
    const room = Math.max(0, maxUnavailable - inFlight);
    const pending = nodes
      .filter((n) => n.phase === 'pending')
      .sort((a, b) => a.position - b.position)
      .slice(0, room);
    for (const n of pending) actions.push({ type: 'start', node: n.node, step: 'uninstall' });
  }
  if (actions.length > 0 || inFlight > 0) return actions;

  const OP = op.toUpperCase() as 'CREATE' | 'RESTART' | 'DELETE';
  if (failed.length > 0) {
    const reason = failed
      .sort((a, b) => a.position - b.position)
      .map((n) => `${n.node}: ${n.reason ?? 'failed'}`)
      .join('; ');
    return [
      {
        type: 'finish',
        status: `${OP}_FAILED` as ClusterStatus,
        reason: `${OP.toLowerCase()} failed on ${reason}`,
        remove: false,
      },
    ];
  }
  if (op === 'delete') return [{ type: 'finish', status: 'DELETE_IN_PROGRESS', reason: 'deleted', remove: true }];
  const untouched = nodes.filter((n) => n.phase === 'pending').length;
  if (untouched > 0) return []; // cannot happen for create; a restart with room starts them above
  return [
    {
      type: 'finish',
      status: `${OP}_COMPLETE` as ClusterStatus,
      reason: `${OP.toLowerCase()} complete on ${nodes.length} node(s)`,
      remove: false,
    },
  ];
}

/** The most of a master group of `size` nodes that may be unavailable at once (docs/api.md, quorum): max(1, ⌊(n−1)/2⌋). */
export function quorumCap(size: number): number {
  return Math.max(1, Math.floor((size - 1) / 2));
}

/** A timed-out step's reason says so with this word: the counters count them (docs/api.md, `timed_out`). */
export const TIMEOUT_WORD = 'deadline';

/** Is `reason` (a failed node's) a deadline's? */
export function isTimeoutReason(reason: string | null): boolean {
  return reason?.includes(TIMEOUT_WORD) === true;
}

/** What the group loop found: nodes to start, or why none may. */
interface GroupStarts {
  starts: PlanNode[];
  /** Some group waits for a slot held by a pause (a later tick starts it). */
  waiting: boolean;
  /** A master group cannot go on without more of its nodes down than its quorum allows. */
  blocked: string | null;
}

/**
 * The nodes of `subset` (pending ones start) that may start now, groups one after another in
 * `r.groups`' order (`concurrent`: all groups at once, as a revert goes). A node holds its
 * group's slot from its start until `r.pauseS` after its end (`pauses` false: until its end); in
 * a master group (unless `r.force`) its nodes in flight and failed count against the quorum.
 */
function groupStarts(
  r: Rollout,
  subset: readonly PlanNode[],
  all: readonly PlanNode[],
  nowMs: number,
  o: { pauses: boolean; concurrent: boolean },
): GroupStarts {
  const pauseMs = o.pauses ? r.pauseS * 1000 : 0;
  const holdsSlot = (n: PlanNode): boolean =>
    isInFlight(n.phase) ||
    ((n.phase === 'complete' || n.phase === 'failed') &&
      n.endedAtMs !== null &&
      n.endedAtMs !== undefined &&
      n.endedAtMs + pauseMs > nowMs);
  const out: GroupStarts = { starts: [], waiting: false, blocked: null };
  for (const [gi, g] of r.groups.entries()) {
    const members = subset.filter((n) => n.nodegroup === g.name);
    const group = all.filter((n) => n.nodegroup === g.name);
    const pending = members.filter((n) => n.phase === 'pending').sort((a, b) => a.position - b.position);
    const held = group.filter(holdsSlot).length;
    if (!o.concurrent) {
      // done: the next group may start (the last pause of the last group delays nothing)
      const later = r.groups.slice(gi + 1).map((x) => x.name);
      const laterWork = subset.some((n) => n.phase === 'pending' && later.includes(n.nodegroup ?? ''));
      if (pending.length === 0 && (held === 0 || (!laterWork && !group.some((n) => isInFlight(n.phase))))) continue;
    } else if (pending.length === 0) continue;
    let room = g.window - held;
    if (g.role === 'master' && r.force !== true) {
      const down = group.filter((n) => isInFlight(n.phase) || n.phase === 'failed').length;
      room = Math.min(room, quorumCap(group.length) - down);
    }
    if (room > 0) out.starts.push(...pending.slice(0, room));
    else if (pending.length > 0) {
      if (group.some(holdsSlot)) out.waiting = true;
      else
        out.blocked = `the quorum of master group ${g.name} (at most ${quorumCap(group.length)} of ${group.length} down) lets no other node go down`;
    }
    if (!o.concurrent) break;
  }
  return out;
}

/**
 * The next actions of a rollout (a restart with node groups, or an upgrade: docs/api.md
 * "Rollouts"), given every node of the cluster: only the nodes of `r.groups` take part, and in a
 * revert only the nodes it brings back. In order:
 *
 * - timeouts: a step past its deadline, or a node past `r.nodeDeadlineS` from its start;
 * - `expire`: `r.progressDeadlineS` passed without progress (not while an operator holds the
 *   rollout: a pause of theirs, canaries waiting for promotion);
 * - starts, unless it is stopped (paused, aborted, expired, or more than `r.maxFailures` nodes
 *   failed beyond those a resume forgave; any failed canary is over the budget): the canaries
 *   first (`r.canaries`, in group order), then, once promoted, the others, groups one after
 *   another with their windows and pauses; a revert starts its nodes in every group at once, at
 *   each group's window, with no pause, gate or canary. A master group keeps its quorum unless
 *   `r.force`. With a gate, starts wait for its answer: `gate` asks for one;
 * - `promote` once the canaries completed `r.autoPromoteS` ago;
 * - once nothing is in flight and nothing may start: `revert`, `pause` (by `r.onFailure`) or
 *   `finish`: `<OP>_FAILED` naming the failed nodes, else `<OP>_COMPLETE` (OP is UPDATE for an
 *   upgrade, else RESTART).
 *
 * An empty plan waits for a later event or tick.
 */
export function planRollout(r: Rollout, nodes: readonly PlanNode[], nowMs: number): ClusterAction[] {
  const inScope = new Set(r.groups.map((g) => g.name));
  const st = r.state ?? null;
  const revert = st?.revert ?? null;
  const all = nodes.filter((n) => inScope.has(n.nodegroup ?? ''));
  const reverting = revert ? new Set(revert.nodes) : null;
  const mine = reverting ? all.filter((n) => reverting.has(n.node)) : all;

  const nodeMs = r.nodeDeadlineS ? r.nodeDeadlineS * 1000 : null;
  const timeouts: ClusterAction[] = [];
  for (const n of mine) {
    if (!isInFlight(n.phase)) continue;
    if (n.stepDeadlineMs !== null && n.stepDeadlineMs <= nowMs) timeouts.push({ type: 'timeout', node: n.node });
    else if (nodeMs !== null && typeof n.startedAtMs === 'number' && n.startedAtMs + nodeMs <= nowMs)
      timeouts.push({ type: 'timeout', node: n.node, why: 'node' });
  }
  if (timeouts.length > 0) return timeouts;

  const inFlight = mine.some((n) => isInFlight(n.phase));
  const failed = mine.filter((n) => n.phase === 'failed').sort((a, b) => a.position - b.position);
  const canaries = new Set(r.canaries ?? []);
  const canaryPhase = !revert && canaries.size > 0 && !st?.promoted;
  const canaryNodes = canaryPhase ? mine.filter((n) => canaries.has(n.node)) : [];
  const budget = canaryPhase ? 0 : r.maxFailures;
  const overBudget = !revert && failed.length - (st?.forgiven ?? 0) > budget;
  // every canary ended and none failed beyond what a resume forgave: an operator's promotion (or
  // auto_promote_s, when all are healthy) is awaited
  const awaitingPromotion =
    canaryPhase && !overBudget && canaryNodes.every((n) => n.phase === 'complete' || n.phase === 'failed');
  const healthy = awaitingPromotion && canaryNodes.every((n) => n.phase === 'complete');
  const operatorHolds = (st?.paused && !st.paused.failure) || awaitingPromotion;

  if (
    st &&
    !st.expired &&
    !operatorHolds &&
    typeof r.progressDeadlineS === 'number' &&
    nowMs >= st.progressAtMs + r.progressDeadlineS * 1000
  )
    return [{ type: 'expire', reason: `no progress within the progress ${TIMEOUT_WORD} (${r.progressDeadlineS} s)` }];

  const stopped = overBudget || Boolean(st?.aborted || st?.expired || st?.paused);
  let blocked: string | null = null;
  if (!stopped) {
    const g = revert
      ? groupStarts(r, mine, all, nowMs, { pauses: false, concurrent: true })
      : groupStarts(r, canaryPhase ? canaryNodes : mine, all, nowMs, { pauses: true, concurrent: false });
    if (g.starts.length > 0) {
      if (r.gate && !revert && !(st?.gate?.verdict === 'go' && !st.gate.used)) {
        // a stop (or an unreadable gate) is asked again after GATE_RETRY_INTERVAL_MS; meanwhile wait
        const asked = st?.gate;
        if (asked && !asked.used && nowMs < asked.atMs + GATE_RETRY_INTERVAL_MS) return [];
        return [{ type: 'gate' }];
      }
      return g.starts.map((n) => ({ type: 'start', node: n.node, step: 'uninstall' }));
    }
    if (awaitingPromotion) {
      const last = Math.max(...canaryNodes.map((n) => n.endedAtMs ?? 0));
      if (healthy && typeof r.autoPromoteS === 'number' && nowMs >= last + r.autoPromoteS * 1000)
        return [{ type: 'promote' }];
      return [];
    }
    if (g.waiting) return [];
    blocked = g.blocked;
  }
  if (inFlight) return [];

  const OP = r.upgrade ? 'UPDATE' : 'RESTART';
  const op = OP.toLowerCase();
  const named = (xs: readonly PlanNode[]) => xs.map((n) => `${n.node}: ${n.reason ?? 'failed'}`).join('; ');
  const fail = (why: string): ClusterAction => ({
    type: 'finish',
    status: `${OP}_FAILED`,
    reason: why,
    remove: false,
  });
  if (revert) {
    const back = mine.filter((n) => n.phase === 'complete').map((n) => n.node);
    const notBack = mine.filter((n) => n.phase === 'pending').map((n) => n.node);
    const parts = [revert.why, `reverted to revision ${revert.revision}: ${back.length ? back.join(', ') : 'none'}`];
    if (failed.length > 0) parts.push(`revert failed on ${named(failed)}`);
    if (notBack.length > 0) parts.push(`not reverted: ${notBack.join(', ')}${blocked ? ` (${blocked})` : ''}`);
    if (st?.aborted) parts.push(`revert aborted by ${st.aborted.by}`);
    return [fail(parts.join('; '))];
  }
  const untouched = mine.filter((n) => n.phase === 'pending').length;
  const notStarted = untouched > 0 ? ` (${untouched} node(s) not started)` : '';
  const failures = failed.length > 0 ? ` on ${named(failed)}` : '';
  const canRevert = r.onFailure === 'revert' && r.upgrade !== undefined && r.upgrade.stable !== null;
  if (st?.aborted) return [fail(`${op} aborted by ${st.aborted.by}${failures}${notStarted}`)];
  if (st?.expired) {
    const why = `${op} failed: ${st.expired.reason}${failures}${notStarted}`;
    return [canRevert ? { type: 'revert', reason: why } : fail(why)];
  }
  if (st?.paused) return [];
  if (overBudget || blocked) {
    const why = overBudget
      ? `${op} failed${failures}${notStarted}`
      : `${op} failed: ${blocked}${failures}${notStarted}`;
    if (canRevert) return [{ type: 'revert', reason: why }];
    if (r.onFailure === 'pause') return [{ type: 'pause', reason: why }];
    return [fail(why)];
  }
  if (failed.length > 0) return [fail(`${op} failed${failures}${notStarted}`)];
  if (untouched > 0) return []; // (cannot happen: a rollout with room starts them above)
  const count = r.targeted ?? mine.length;
  return [
    {
      type: 'finish',
      status: `${OP}_COMPLETE`,
      reason: r.upgrade
        ? `update complete on ${count} node(s) to revision ${r.upgrade.revision}`
        : `restart complete on ${mine.length} node(s) in ${r.groups.length} group(s)`,
      remove: false,
    },
  ];
}

/**
 * The window of one group (docs/api.md): `maxUnavailable` as a count, or a percentage ("25%") of the
 * group's nodes rounded down; at least 1 and at most the group's size. Default: 1 in a master
 * group, every node in the others.
 */
export function groupWindow(role: 'master' | 'worker', size: number, maxUnavailable: number | string | null): number {
  if (size === 0) return 1;
  let w: number;
  if (maxUnavailable === null) w = role === 'master' ? 1 : size;
  else if (typeof maxUnavailable === 'number') w = maxUnavailable;
  else w = Math.floor((Number(maxUnavailable.slice(0, -1)) * size) / 100);
  return Math.min(size, Math.max(1, w));
}

/**
 * The next actions of an `update` (docs/api.md): group `c.nodegroup` added (its nodes install at
 * once, started when it was added) or removed (its nodes uninstall at once). Only that group's
 * nodes count. Timeouts first; nothing while a node is in flight; then UPDATE_FAILED naming the
 * failed nodes (a removed group stays), else UPDATE_COMPLETE (a removed group goes).
 */
export function planGroupChange(
  c: { type: 'add' | 'remove'; nodegroup: string },
  nodes: readonly PlanNode[],
  nowMs: number,
): ClusterAction[] {
  const mine = nodes.filter((n) => n.nodegroup === c.nodegroup);
  const timeouts = mine.filter((n) => isInFlight(n.phase) && n.stepDeadlineMs !== null && n.stepDeadlineMs <= nowMs);
  if (timeouts.length > 0) return timeouts.map((n) => ({ type: 'timeout', node: n.node }));
  if (mine.some((n) => isInFlight(n.phase))) return [];
  const failed = mine.filter((n) => n.phase === 'failed').sort((a, b) => a.position - b.position);
  const what = `${c.type === 'add' ? 'adding' : 'removing'} node group ${c.nodegroup}`;
  if (failed.length > 0)
    return [
      {
        type: 'finish',
        status: 'UPDATE_FAILED',
        reason: `${what} failed on ${failed.map((n) => `${n.node}: ${n.reason ?? 'failed'}`).join('; ')}`,
        remove: false,
      },
    ];
  return [
    {
      type: 'finish',
      status: 'UPDATE_COMPLETE',
      reason: `${what} complete on ${mine.length} node(s)`,
      remove: false,
      ...(c.type === 'remove' ? { removeNodegroup: c.nodegroup } : {}),
    },
  ];
}
