/**
 * Follows a cluster restart to its end: `GET /v1/events` for speed (events are best-effort),
 * and `GET /v1/clusters/{id}` every second as the authority. Emits one `WatchEvent` per node
 * phase change (filling in phases that happened between two looks, so every node shows
 * uninstalling → installing → complete in order) and one per wake-up the events report.
 * Renderers (plain lines, a progress bar, the demo's timeline) only consume these.
 */
import type { ApiClient, EventStream, SseEvent } from './operator-client.js';

/** How often the cluster is read while a restart runs. */
export const WATCH_POLL_INTERVAL_MS = 1_000;

export const NODE_PHASES = ['pending', 'uninstalling', 'installing', 'complete', 'failed'] as const;
export type NodePhase = (typeof NODE_PHASES)[number];

/** One node's state in a cluster, normalized from whatever shape the controller sends. */
export interface NodeState {
  node: string;
  phase: string;
  reason: string | undefined;
  /** Times the controller recorded, as epoch ms, when it sent them. */
  uninstallStartedMs: number | undefined;
  uninstallDoneMs: number | undefined;
  installStartedMs: number | undefined;
  installDoneMs: number | undefined;
}

export interface ClusterState {
  id: string;
  name: string | undefined;
  status: string;
  statusReason: string | undefined;
  nodes: NodeState[];
}

export type WatchEvent =
  | { kind: 'phase'; at: Date; node: string; phase: string; reason?: string; uninstallMs?: number; installMs?: number }
  | { kind: 'woken'; at: Date; node: string; detail: string }
  | { kind: 'status'; at: Date; status: string; reason?: string };

export interface WatchResult {
  ok: boolean;
  timedOut: boolean;
  cluster: ClusterState | undefined;
  /** Nodes in phase `failed`, with their reasons. */
  failed: { node: string; reason: string }[];
}

function str(v: unknown): string | undefined {
  return typeof v === 'string' && v.length > 0 ? v : undefined;
}

function timeMs(...vs: unknown[]): number | undefined {
  for (const v of vs) {
    if (typeof v === 'number' && Number.isFinite(v)) return v > 1e12 ? v : v * 1000;
    if (typeof v === 'string') {
      const t = Date.parse(v);
      if (Number.isFinite(t)) return t;
    }
  }
  return undefined;
}

function pick(o: Record<string, unknown>, ...paths: string[]): unknown[] {
  return paths.map((p) => p.split('.').reduce<unknown>((acc, k) => (acc && typeof acc === 'object' ? (acc as Record<string, unknown>)[k] : undefined), o));
}

/** Normalizes one node entry of a cluster (an object, or a bare id). */
export function normalizeNode(entry: unknown, key?: string): NodeState | undefined {
  if (typeof entry === 'string') return { node: entry, phase: 'pending', reason: undefined, uninstallStartedMs: undefined, uninstallDoneMs: undefined, installStartedMs: undefined, installDoneMs: undefined };
  if (!entry || typeof entry !== 'object') return undefined;
  const o = entry as Record<string, unknown>;
  const node = str(o.node) ?? str(o.node_id) ?? str(o.id) ?? str(o.name) ?? key;
  if (!node) return undefined;
  return {
    node,
    phase: str(o.phase) ?? str(o.status)?.toLowerCase() ?? 'pending',
    reason: str(o.reason) ?? str(o.status_reason) ?? str(o.error) ?? str(o.failure_reason),
    uninstallStartedMs: timeMs(...pick(o, 'uninstall_started_at', 'uninstall.started_at', 'times.uninstall_started_at', 'times.uninstalling', 'uninstalling_at')),
    uninstallDoneMs: timeMs(...pick(o, 'uninstall_finished_at', 'uninstall_completed_at', 'uninstall_done_at', 'uninstall.finished_at', 'uninstall.completed_at', 'times.uninstall_finished_at', 'times.uninstall_completed_at')),
    installStartedMs: timeMs(...pick(o, 'install_started_at', 'install.started_at', 'times.install_started_at', 'times.installing', 'installing_at')),
    installDoneMs: timeMs(...pick(o, 'install_finished_at', 'install_completed_at', 'install_done_at', 'install.finished_at', 'install.completed_at', 'times.install_finished_at', 'times.install_completed_at', 'times.complete', 'completed_at')),
  };
}

/** Normalizes a cluster resource; tolerant of node lists as arrays, maps or bare ids. */
export function normalizeCluster(body: unknown): ClusterState {
  const o = (body && typeof body === 'object' ? body : {}) as Record<string, unknown>;
  const nodes: NodeState[] = [];
  const lists = [o.members, o.node_states, o.phases, o.nodes];
  const list = lists.find((l) => Array.isArray(l) && l.some((x) => x && typeof x === 'object'))
    ?? lists.find((l) => l && typeof l === 'object' && !Array.isArray(l))
    ?? lists.find((l) => Array.isArray(l));
  if (Array.isArray(list)) {
    for (const e of list) {
      const n = normalizeNode(e);
      if (n) nodes.push(n);
    }
  } else if (list && typeof list === 'object') {
    for (const [k, v] of Object.entries(list as Record<string, unknown>)) {
      const n = normalizeNode(typeof v === 'string' ? { phase: v } : v, k);
      if (n) nodes.push(n);
    }
  }
  return {
    id: str(o.id) ?? str(o.cluster_id) ?? '',
    name: str(o.name),
    status: str(o.status) ?? 'UNKNOWN',
    statusReason: str(o.status_reason) ?? str(o.reason),
    nodes,
  };
}

const ORDER: Record<string, number> = { pending: 0, uninstalling: 1, installing: 2, complete: 3, failed: 3 };

/** Which node an event is about, and whether it is a push acknowledgement. */
function eventFacts(e: SseEvent): { node?: string; cluster?: string; ack: boolean; detail: string; lastAckMs?: number } {
  const d = (e.data && typeof e.data === 'object' ? e.data : {}) as Record<string, unknown>;
  const inner = (d.data && typeof d.data === 'object' ? d.data : d.payload && typeof d.payload === 'object' ? d.payload : {}) as Record<string, unknown>;
  const kind = [e.event, str(d.type), str(d.kind), str(d.event)].filter(Boolean).join(' ').toLowerCase();
  const node = str(d.node) ?? str(d.node_id) ?? str(inner.node) ?? str(inner.node_id);
  const isCluster = /cluster/.test(kind);
  const cluster = str(d.cluster_id) ?? str(d.cluster) ?? str(inner.cluster_id) ?? str(inner.cluster) ?? (isCluster ? str(inner.id) ?? str(d.id) : undefined);
  const fetch = str(d.fetch) ?? str(inner.fetch);
  const latency = d.latency_ms ?? d.latencyMs ?? inner.latency_ms ?? inner.latencyMs;
  const gen = d.gen ?? d.generation ?? inner.gen ?? inner.generation;
  // an acknowledged wake-up: named so, or a push event carrying the ack's `fetch` field
  const ack = !/nack/.test(kind) && (/(^|[\s._-])ack($|[\s._-])/.test(kind) || (/push/.test(kind) && fetch !== undefined));
  const parts: string[] = [];
  if (typeof gen === 'number') parts.push(`gen ${gen}`);
  if (fetch) parts.push(`fetch ${fetch}`);
  if (typeof latency === 'number') parts.push(`ack in ${Math.round(latency)} ms`);
  // the controller's push-state events carry the time of the node's last acknowledged wake-up
  const lastAckMs = /push/.test(kind) ? timeMs(d.last_ack_at, inner.last_ack_at) : undefined;
  const facts: { node?: string; cluster?: string; ack: boolean; detail: string; lastAckMs?: number } = { ack, detail: parts.join(', ') };
  if (node) facts.node = node;
  if (cluster) facts.cluster = cluster;
  if (lastAckMs !== undefined) facts.lastAckMs = lastAckMs;
  return facts;
}

export interface WatchOptions {
  clusterId: string;
  /** When the restart was accepted: durations are measured from here when the controller gives none. */
  startedAt: Date;
  timeoutMs: number;
  onEvent: (e: WatchEvent) => void;
  /** Called once with the first cluster state read. */
  onStart?: (c: ClusterState) => void;
  /** Follow `/v1/events` (default true). */
  useEvents?: boolean;
  pollIntervalMs?: number;
}

/** Follows one cluster until its restart is complete, failed, or the timeout passes. */
export async function watchRestart(client: ApiClient, opts: WatchOptions): Promise<WatchResult> {
  const seen = new Map<string, { phase: string; at: number; uninstallStart?: number; uninstallDone?: number; installStart?: number; installDone?: number }>();
  let lastStatus = '';
  let started = false;
  let stream: EventStream | undefined;
  let fetching: Promise<void> | undefined;
  let refetch = false;
  let done: ((r: WatchResult) => void) | undefined;
  const finished = new Promise<WatchResult>((resolve) => (done = resolve));
  let settled = false;
  const emit = opts.onEvent;

  const finish = (r: WatchResult): void => {
    if (settled) return;
    settled = true;
    done?.(r);
  };

  const apply = (c: ClusterState): void => {
    const now = Date.now();
    if (!started) {
      started = true;
      opts.onStart?.(c);
    }
    for (const n of c.nodes) {
      const prev = seen.get(n.node) ?? { phase: 'pending', at: opts.startedAt.getTime() };
      const from = ORDER[prev.phase] ?? 0;
      const to = ORDER[n.phase] ?? 0;
      if (n.phase !== prev.phase && to >= from) {
        // fill in the phases that passed between two looks, so every node's story reads in order
        const steps: string[] = [];
        if (from < 1 && to >= 2 && n.phase !== 'failed') steps.push('uninstalling');
        if (from < 2 && to >= 3 && n.phase === 'complete') steps.push('installing');
        steps.push(n.phase);
        for (const phase of steps) {
          const s = seen.get(n.node) ?? { phase: 'pending', at: opts.startedAt.getTime() };
          const at = phaseTime(n, phase) ?? now;
          if (phase === 'uninstalling') s.uninstallStart = n.uninstallStartedMs ?? at;
          if (phase === 'installing') {
            s.uninstallDone = n.uninstallDoneMs ?? at;
            s.installStart = n.installStartedMs ?? s.uninstallDone;
          }
          if (phase === 'complete') s.installDone = n.installDoneMs ?? at;
          s.phase = phase;
          s.at = at;
          seen.set(n.node, s);
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
          emit(ev);
        }
      }
    }
    if (c.status !== lastStatus) {
      lastStatus = c.status;
      const ev: WatchEvent = { kind: 'status', at: new Date(now), status: c.status };
      if (c.statusReason) ev.reason = c.statusReason;
      emit(ev);
    }
    const failed = c.nodes.filter((n) => n.phase === 'failed').map((n) => ({ node: n.node, reason: n.reason ?? 'no reason given' }));
    if (c.status === 'RESTART_COMPLETE') finish({ ok: true, timedOut: false, cluster: c, failed });
    else if (c.status === 'RESTART_FAILED' || (c.status.endsWith('_FAILED') && !c.status.startsWith('RESTART'))) finish({ ok: false, timedOut: false, cluster: c, failed });
  };

  let lastCluster: ClusterState | undefined;
  const lastAck = new Map<string, number>();
  let lastError: Error | undefined;
  const fetchOnce = (): Promise<void> => {
    if (fetching) {
      refetch = true;
      return fetching;
    }
    fetching = (async () => {
      do {
        refetch = false;
        try {
          lastCluster = normalizeCluster(await client.get(`/v1/clusters/${encodeURIComponent(opts.clusterId)}`));
          lastError = undefined;
          apply(lastCluster);
        } catch (err) {
          lastError = err as Error;
          // 404 means the cluster is gone; anything else is retried by the next poll
          if ((err as { status?: number }).status === 404) finish({ ok: false, timedOut: false, cluster: lastCluster, failed: [] });
        }
      } while (refetch && !settled);
    })().finally(() => (fetching = undefined));
    return fetching;
  };

  if (opts.useEvents !== false) {
    stream = client.events((e) => {
      if (settled) return;
      const f = eventFacts(e);
      const members = lastCluster?.nodes.map((n) => n.node) ?? [];
      if (f.node && members.includes(f.node)) {
        if (f.ack) {
          emit({ kind: 'woken', at: new Date(), node: f.node, detail: f.detail });
        } else if (f.lastAckMs !== undefined && f.lastAckMs >= opts.startedAt.getTime() && f.lastAckMs !== lastAck.get(f.node)) {
          lastAck.set(f.node, f.lastAckMs);
          emit({ kind: 'woken', at: new Date(f.lastAckMs), node: f.node, detail: f.detail });
        }
      }
      if (f.cluster === opts.clusterId || (f.node && members.includes(f.node)) || (!f.cluster && !f.node)) void fetchOnce();
    });
  }
  const poll = setInterval(() => void fetchOnce(), opts.pollIntervalMs ?? WATCH_POLL_INTERVAL_MS);
  const timeout = setTimeout(() => finish({ ok: false, timedOut: true, cluster: lastCluster, failed: [] }), opts.timeoutMs);
  void fetchOnce();
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

function phaseTime(n: NodeState, phase: string): number | undefined {
  if (phase === 'uninstalling') return n.uninstallStartedMs;
  if (phase === 'installing') return n.installStartedMs ?? n.uninstallDoneMs;
  if (phase === 'complete') return n.installDoneMs;
  return undefined;
}
