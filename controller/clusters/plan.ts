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
}

export type ClusterAction =
  | { type: 'timeout'; node: string }
  | { type: 'start'; node: string; step: 'uninstall' | 'install' }
  | {
      type: 'finish';
      status: ClusterStatus;
      reason: string;
      remove: boolean;
      /** A node group to remove (its nodes' uninstall succeeded), then finish in `status`. */
      removeNodegroup?: string;
    };

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

/**
 * The next actions of a restart with node groups (docs/api.md), given every node of the cluster:
 * only the nodes of `r.groups` take part. Timeouts first (as planCluster); then, unless more
 * than `r.maxFailures` nodes failed, window starts in the first group not yet done (groups go
 * one after another in `r.groups`' order); a node holds its group's slot from the start of its
 * uninstall until `r.pauseS` seconds after its end, and a group is done when none of its nodes
 * is pending or holds a slot (the last group's pauses delay nothing). `finish` when nothing is in flight and nothing may start:
 * RESTART_FAILED if any node failed (within the budget too: the restart did not restart it),
 * else RESTART_COMPLETE. An empty plan with slots held by pauses waits for a later tick.
 */
export function planRollout(r: Rollout, nodes: readonly PlanNode[], nowMs: number): ClusterAction[] {
  const inScope = new Set(r.groups.map((g) => g.name));
  const mine = nodes.filter((n) => inScope.has(n.nodegroup ?? ''));
  const timeouts = mine.filter((n) => isInFlight(n.phase) && n.stepDeadlineMs !== null && n.stepDeadlineMs <= nowMs);
  if (timeouts.length > 0) return timeouts.map((n) => ({ type: 'timeout', node: n.node }));

  const failed = mine.filter((n) => n.phase === 'failed').sort((a, b) => a.position - b.position);
  const pauseMs = r.pauseS * 1000;
  const holdsSlot = (n: PlanNode): boolean =>
    isInFlight(n.phase) ||
    ((n.phase === 'complete' || n.phase === 'failed') &&
      n.endedAtMs !== null &&
      n.endedAtMs !== undefined &&
      n.endedAtMs + pauseMs > nowMs);
  if (failed.length <= r.maxFailures) {
    for (const [gi, g] of r.groups.entries()) {
      const members = mine.filter((n) => n.nodegroup === g.name);
      const pending = members.filter((n) => n.phase === 'pending').sort((a, b) => a.position - b.position);
      const held = members.filter(holdsSlot).length;
      // done: the next group may start (the last pause of the last group delays nothing)
      const later = r.groups.slice(gi + 1).map((x) => x.name);
      const laterWork = mine.some((n) => n.phase === 'pending' && later.includes(n.nodegroup ?? ''));
      if (pending.length === 0 && (held === 0 || (!laterWork && !members.some((n) => isInFlight(n.phase))))) continue;
      const room = Math.max(0, g.window - held);
      return pending.slice(0, room).map((n) => ({ type: 'start', node: n.node, step: 'uninstall' }));
    }
  }
  if (mine.some((n) => isInFlight(n.phase))) return [];
  if (failed.length > 0) {
    const untouched = mine.filter((n) => n.phase === 'pending').length;
    const why = failed.map((n) => `${n.node}: ${n.reason ?? 'failed'}`).join('; ');
    return [
      {
        type: 'finish',
        status: 'RESTART_FAILED',
        reason: `restart failed on ${why}${untouched > 0 ? ` (${untouched} node(s) not started)` : ''}`,
        remove: false,
      },
    ];
  }
  return [
    {
      type: 'finish',
      status: 'RESTART_COMPLETE',
      reason: `restart complete on ${mine.length} node(s) in ${r.groups.length} group(s)`,
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
