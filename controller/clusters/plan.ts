/**
 * The cluster operations' state machine (SPEC §3 "Clusters"), as a pure planner: given a
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
import type { ClusterNodePhase, ClusterOperation, ClusterStatus } from '../records.js';

export interface PlanNode {
  node: string;
  position: number;
  phase: ClusterNodePhase;
  stepDeadlineMs: number | null;
  reason: string | null;
}

export type ClusterAction =
  | { type: 'timeout'; node: string }
  | { type: 'start'; node: string; step: 'uninstall' | 'install' }
  | { type: 'finish'; status: ClusterStatus; reason: string; remove: boolean };

export function isInFlight(phase: ClusterNodePhase): boolean {
  return phase === 'uninstalling' || phase === 'installing';
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
