/**
 * Follows a cluster restart (or upgrade) to its end: `GET /v1/events` for speed (events are best-effort),
 * and `GET /v1/clusters/{id}` every second as the authority. Emits one `WatchEvent` per node
 * phase change (filling in phases that happened between two looks, so every node shows
 * uninstalling → installing → complete in order), one per wake-up the events report, and one
 * per live output chunk of a member (its last line, docs/api.md: a stuck node is seen while stuck).
 * Renderers (plain lines, a progress bar, the demo's timeline) only consume these. Text in them
 * that a node supplied (its reason, its output line) has its terminal control characters made
 * visible here, before any renderer draws it (terminal-text.ts), unless `raw`.
 */
import type { ClusterNodePhase, ClusterStatus, ClusterView, EventData, RolloutPhase } from '../../protocol/rest.js';
import { lastLineOf, type OutputEventView } from '../../protocol/output.js';
import type { ApiClient, SseEvent } from './client.js';
import { visibleDeep } from '../terminal-text.js';

/** How often the cluster is read while a restart runs. */
export const WATCH_POLL_INTERVAL_MS = 1_000;

/** One node's state in a cluster, its times as epoch ms. */
export interface NodeState {
  node: string;
  phase: ClusterNodePhase;
  reason: string | undefined;
  uninstallStartedMs: number | undefined;
  uninstallDoneMs: number | undefined;
  installStartedMs: number | undefined;
  installDoneMs: number | undefined;
  /** The health check's start (phase `checking`). */
  checkStartedMs: number | undefined;
  /** When the step in flight must have its result. */
  stepDeadlineMs: number | undefined;
}

/** What a rollout (a restart or an upgrade, docs/api.md "Rollouts") met, as the watcher reports it. */
export interface RolloutState {
  phase: RolloutPhase;
  canaries: string[];
  autoPromoteS: number | null;
  promotedBy: string | undefined;
  pausedReason: string | undefined;
  /** The gate's last answer: `stop (HTTP 503)`. */
  gate: string | undefined;
  revert: { revision: number; nodes: string[]; reason: string } | undefined;
}

export interface ClusterState {
  id: string;
  name: string;
  status: ClusterStatus;
  statusReason: string | undefined;
  nodes: NodeState[];
  /** The running (or last) rollout's state, when it has one. */
  rollout?: RolloutState | undefined;
  revision?: number | undefined;
}

export type WatchEvent =
  | {
      kind: 'phase';
      at: Date;
      node: string;
      phase: ClusterNodePhase;
      reason?: string;
      uninstallMs?: number;
      installMs?: number;
    }
  | { kind: 'woken'; at: Date; node: string; detail: string }
  | { kind: 'output'; at: Date; node: string; line: string }
  | { kind: 'status'; at: Date; status: ClusterStatus; reason?: string }
  /** The rollout moved on: its canaries, a promotion, a pause, the gate, a revert (`detail` says what). */
  | { kind: 'rollout'; at: Date; phase: RolloutPhase | 'promoted' | 'gate'; detail: string };

export interface WatchResult {
  ok: boolean;
  timedOut: boolean;
  cluster: ClusterState | undefined;
  /** Nodes in phase `failed`, with their reasons. */
  failed: { node: string; reason: string }[];
}

function msOf(iso: string | null): number | undefined {
  if (iso === null) return undefined;
  const t = Date.parse(iso);
  return Number.isFinite(t) ? t : undefined;
}

/** A cluster as the API shows it, with its times as epoch ms. */
export function clusterStateOf(c: ClusterView): ClusterState {
  return {
    id: c.id,
    name: c.name,
    status: c.status,
    statusReason: c.status_reason || undefined,
    nodes: c.nodes.map((n) => ({
      node: n.node,
      phase: n.phase,
      reason: n.reason ?? undefined,
      uninstallStartedMs: msOf(n.uninstall_started_at),
      uninstallDoneMs: msOf(n.uninstall_finished_at),
      installStartedMs: msOf(n.install_started_at),
      installDoneMs: msOf(n.install_finished_at),
      checkStartedMs: msOf(n.check_started_at ?? null),
      stepDeadlineMs: msOf(n.step_deadline_at),
    })),
    rollout: rolloutStateOf(c),
    revision: c.revision,
  };
}

function rolloutStateOf(c: ClusterView): RolloutState | undefined {
  const r = c.rollout;
  const st = r?.state;
  if (!r || !st) return undefined;
  return {
    phase: st.phase,
    canaries: r.canaries ?? [],
    autoPromoteS: r.auto_promote_s ?? null,
    promotedBy: st.promoted?.by,
    pausedReason: st.paused?.reason,
    gate: st.gate ? `${st.gate.verdict} (${st.gate.detail})` : undefined,
    revert: st.revert ? { revision: st.revert.revision, nodes: st.revert.nodes, reason: st.revert.reason } : undefined,
  };
}

// (checking, the health check of docs/api.md, comes between the install and the end)
const ORDER: Record<ClusterNodePhase, number> = {
  pending: 0,
  uninstalling: 1,
  installing: 2,
  checking: 2.5,
  complete: 3,
  failed: 3,
};

interface Seen {
  phase: ClusterNodePhase;
  uninstallStart?: number;
  uninstallDone?: number;
  installStart?: number;
  installDone?: number;
}

/**
 * Turns successive looks at a cluster into events: each node's phase changes in order (the
 * phases that passed between two looks filled in), and the cluster's status changes. Pure.
 */
export class PhaseTracker {
  readonly #seen = new Map<string, Seen>();
  #lastStatus = '';
  #rollout: { phase?: string; promoted?: string; gate?: string; reverting: boolean } = { reverting: false };

  /** The events between the previous look and `c`, seen at `now` (epoch ms). */
  next(c: ClusterState, now: number): WatchEvent[] {
    const out: WatchEvent[] = [];
    out.push(...this.#rolloutEvents(c, now));
    for (const n of c.nodes) out.push(...this.#nodeEvents(n, now));
    if (c.status !== this.#lastStatus) {
      this.#lastStatus = c.status;
      const ev: WatchEvent = { kind: 'status', at: new Date(now), status: c.status };
      if (c.statusReason) ev.reason = c.statusReason;
      out.push(ev);
    }
    return out;
  }

  /** The rollout's moves since the last look: canaries, promotion, a pause, the gate, a revert. */
  #rolloutEvents(c: ClusterState, now: number): WatchEvent[] {
    const r = c.rollout;
    if (!r) return [];
    const out: WatchEvent[] = [];
    const at = new Date(now);
    const was = this.#rollout;
    if (r.promotedBy !== undefined && was.promoted === undefined && was.phase !== undefined)
      out.push({
        kind: 'rollout',
        at,
        phase: 'promoted',
        detail: `canaries promoted ${r.promotedBy === 'auto' ? `automatically (auto_promote_s ${r.autoPromoteS})` : `by ${r.promotedBy}`}`,
      });
    if (r.gate !== undefined && r.gate !== was.gate && r.phase !== 'done')
      out.push({ kind: 'rollout', at, phase: 'gate', detail: `gate says ${r.gate}` });
    if (r.phase !== was.phase && r.phase !== 'done' && !(was.phase === undefined && r.phase === 'rolling')) {
      const detail: Record<string, string> = {
        rolling: 'rolling on',
        canary: `canary phase: ${r.canaries.join(', ')} first`,
        awaiting_promotion:
          r.autoPromoteS === null
            ? `canaries healthy; waiting for promotion (herald cluster rollout promote ${c.id})`
            : `canaries healthy; promoted in ${r.autoPromoteS} s`,
        waiting_for_gate: 'waiting for the gate',
        paused: `paused: ${r.pausedReason ?? ''} (herald cluster rollout resume ${c.id})`,
        aborting: 'stopping: no node starts any more; the nodes in flight finish',
        reverting: r.revert
          ? `reverting ${r.revert.nodes.join(', ')} to revision ${r.revert.revision}: ${r.revert.reason}`
          : 'reverting',
      };
      out.push({ kind: 'rollout', at, phase: r.phase, detail: detail[r.phase] ?? r.phase });
    }
    // a revert runs its nodes again: their phases start over
    if (r.revert && !was.reverting) for (const n of r.revert.nodes) this.#seen.delete(n);
    this.#rollout = { phase: r.phase, promoted: r.promotedBy, gate: r.gate, reverting: r.revert !== undefined };
    return out;
  }

  #nodeEvents(n: NodeState, now: number): WatchEvent[] {
    const s = this.#seen.get(n.node) ?? { phase: 'pending' };
    const from = ORDER[s.phase];
    const to = ORDER[n.phase];
    if (n.phase === s.phase || to < from) return [];
    const steps: ClusterNodePhase[] = [];
    if (from < 1 && to >= 2 && n.phase !== 'failed') steps.push('uninstalling');
    if (from < 2 && to >= 3 && n.phase === 'complete') steps.push('installing');
    steps.push(n.phase);
    this.#seen.set(n.node, s);
    return steps.map((phase) => this.#step(n, s, phase, now));
  }

  #step(n: NodeState, s: Seen, phase: ClusterNodePhase, now: number): WatchEvent {
    const at = phaseTime(n, phase) ?? now;
    if (phase === 'uninstalling') s.uninstallStart = n.uninstallStartedMs ?? at;
    if (phase === 'installing') {
      s.uninstallDone = n.uninstallDoneMs ?? at;
      s.installStart = n.installStartedMs ?? s.uninstallDone;
    }
    if (phase === 'complete') s.installDone = n.installDoneMs ?? at;
    s.phase = phase;
    const ev: WatchEvent = { kind: 'phase', at: new Date(at), node: n.node, phase };
    if (phase === 'failed' && n.reason) ev.reason = n.reason;
    if (phase === 'complete' || phase === 'failed') {
      // the controller's times when it gives them, else what this watcher saw
      const us = n.uninstallStartedMs ?? s.uninstallStart;
      const ud = n.uninstallDoneMs ?? s.uninstallDone;
      const is = n.installStartedMs ?? s.installStart;
      const id = n.installDoneMs ?? s.installDone;
      if (us !== undefined && ud !== undefined) ev.uninstallMs = ud - us;
      if (is !== undefined && id !== undefined) ev.installMs = id - is;
    }
    return ev;
  }
}

function phaseTime(n: NodeState, phase: ClusterNodePhase): number | undefined {
  if (phase === 'uninstalling') return n.uninstallStartedMs;
  if (phase === 'installing') return n.installStartedMs ?? n.uninstallDoneMs;
  if (phase === 'complete') return n.installDoneMs;
  return undefined;
}

/** How a restart ended, or undefined while it runs. */
export function outcomeOf(c: ClusterState): WatchResult | undefined {
  const failed = c.nodes
    .filter((n) => n.phase === 'failed')
    .map((n) => ({ node: n.node, reason: n.reason ?? 'no reason given' }));
  if (c.status === 'RESTART_COMPLETE' || c.status === 'UPDATE_COMPLETE')
    return { ok: true, timedOut: false, cluster: c, failed };
  if (
    c.status === 'RESTART_FAILED' ||
    c.status === 'UPDATE_FAILED' ||
    c.status === 'CREATE_FAILED' ||
    c.status === 'DELETE_FAILED'
  )
    return { ok: false, timedOut: false, cluster: c, failed };
  return undefined;
}

/**
 * A member's live output chunk as one event with its last non-empty line (hidden values come
 * masked from the agent), or undefined for any other event.
 */
export function outputEventOf(e: SseEvent, members: ReadonlySet<string>): WatchEvent | undefined {
  if (e.event !== 'output') return undefined;
  const d = e.data as Partial<OutputEventView> | null;
  if (typeof d?.node !== 'string' || typeof d.text !== 'string' || !members.has(d.node)) return undefined;
  const line = lastLineOf(d.text);
  return line === null ? undefined : { kind: 'output', at: new Date(), node: d.node, line };
}

/** The `/v1/events` payload, or undefined for an event that is not the controller's JSON. */
function eventDataOf(e: SseEvent): EventData | undefined {
  const d = e.data as { type?: unknown } | null;
  return typeof d === 'object' && d !== null && typeof d.type === 'string' ? (d as EventData) : undefined;
}

/** Does the event touch the watched cluster (so its state is worth reading now)? */
function touches(d: EventData, clusterId: string, members: ReadonlySet<string>): boolean {
  switch (d.type) {
    case 'cluster':
      return d.id === clusterId;
    case 'deployment':
      return 'deleted' in d ? false : d.cluster_id === clusterId || members.has(d.node);
    case 'node':
      return members.has(d.id);
    case 'push':
      return members.has(d.node);
  }
}

/**
 * Wake-ups seen in the push-state events: a member's `last_ack_at` that moved, after the
 * restart was accepted. Pure apart from its memory of the last ack per node.
 */
export class WakeTracker {
  readonly #lastAck = new Map<string, number>();
  constructor(readonly startedAtMs: number) {}

  woken(d: EventData, members: ReadonlySet<string>): WatchEvent | undefined {
    if (d.type !== 'push' || !members.has(d.node)) return undefined;
    const ackMs = msOf(d.last_ack_at);
    if (ackMs === undefined || ackMs < this.startedAtMs || ackMs === this.#lastAck.get(d.node)) return undefined;
    this.#lastAck.set(d.node, ackMs);
    return {
      kind: 'woken',
      at: new Date(ackMs),
      node: d.node,
      detail: d.generation_acked === null ? '' : `gen ${d.generation_acked}`,
    };
  }
}

/**
 * `fn` made single-flight: a call while one runs does not start a second, it asks for one more
 * run after the current one (so the last call always sees fresh state).
 */
function coalesced(fn: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | undefined;
  let again = false;
  return () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        await fn();
      } while (again);
    })().finally(() => (running = undefined));
    return running;
  };
}

export interface WatchOptions {
  clusterId: string;
  /** When the restart was accepted: durations are measured from here when the controller gives none. */
  startedAt: Date;
  timeoutMs: number;
  onEvent: (e: WatchEvent) => void;
  /** Called once with the first cluster state read. */
  onStart?: (c: ClusterState) => void;
  /** Called with every cluster state read (step times and deadlines for a live view). */
  onLook?: (c: ClusterState) => void;
  /** Follow `/v1/events` (default true). */
  useEvents?: boolean;
  pollIntervalMs?: number;
  /** Pass a node's text on as it came, terminal control bytes included (`--raw`, or JSON output). */
  raw?: boolean;
}

/** Follows one cluster until its restart is complete, failed, or the timeout passes. */
export async function watchRestart(client: ApiClient, opts: WatchOptions): Promise<WatchResult> {
  let settle!: (r: WatchResult) => void;
  const finished = new Promise<WatchResult>((resolve) => (settle = resolve));
  let settled = false;
  const finish = (r: WatchResult): void => {
    if (!settled) settle(r);
    settled = true;
  };
  const phases = new PhaseTracker();
  const wakes = new WakeTracker(opts.startedAt.getTime());
  let last: ClusterState | undefined;
  let members: ReadonlySet<string> = new Set();
  let lastError: Error | undefined;
  // the one place the watch takes data in: what a renderer draws is already safe for a terminal
  const shown = <T>(v: T): T => (opts.raw === true ? v : visibleDeep(v));

  const look = coalesced(async () => {
    if (settled) return;
    try {
      const c = shown(
        clusterStateOf(await client.get<ClusterView>(`/v1/clusters/${encodeURIComponent(opts.clusterId)}`)),
      );
      if (last === undefined) opts.onStart?.(c);
      last = c;
      opts.onLook?.(c);
      members = new Set(c.nodes.map((n) => n.node));
      lastError = undefined;
      for (const e of phases.next(c, Date.now())) opts.onEvent(e);
      const end = outcomeOf(c);
      if (end) finish(end);
    } catch (err) {
      lastError = err as Error;
      // 404 means the cluster is gone; anything else is retried by the next poll
      if ((err as { status?: number }).status === 404)
        finish({ ok: false, timedOut: false, cluster: last, failed: [] });
    }
  });

  const stream =
    opts.useEvents === false
      ? undefined
      : client.events((e) => {
          const out = settled ? undefined : shown(outputEventOf(e, members));
          if (out) return opts.onEvent(out);
          const d = eventDataOf(e);
          if (settled || !d) return;
          const woken = shown(wakes.woken(d, members));
          if (woken) opts.onEvent(woken);
          if (touches(d, opts.clusterId, members)) void look();
        });
  const poll = setInterval(() => void look(), opts.pollIntervalMs ?? WATCH_POLL_INTERVAL_MS);
  const timeout = setTimeout(() => finish({ ok: false, timedOut: true, cluster: last, failed: [] }), opts.timeoutMs);
  void look();
  try {
    const r = await finished;
    if (!r.cluster && lastError) throw lastError;
    return r;
  } finally {
    clearInterval(poll);
    clearTimeout(timeout);
    stream?.close();
  }
}
