/**
 * A harness process (forked by fleet.ts): runs many SimAgents and answers the benchmark's
 * questions over IPC. It exits when its parent goes away.
 */
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { RunItem, RunResult } from '../agent/hooks/types.js';
import type { AgentSlot } from './pki-cache.js';
import { setDialConcurrency, setFetchConcurrency, SimAgent, type SimCounters, type SimPkiPaths } from './sim-agent.js';
import { CountingLogger, nowMs } from './util.js';

export type HookMode = 'noop' | 'hold' | 'real';

export interface HarnessStart {
  t: 'start';
  index: number;
  slots: AgentSlot[];
  pki: Omit<SimPkiPaths, 'certPath'>;
  controllerUrl: string;
  /**
   * Several controllers (docs/several-controllers.md): each agent gets every URL, starting at a different one (agent
   * i at URL i mod the count), as a load balancer would spread them; replaces `controllerUrl`.
   */
  controllerUrls?: string[];
  /** `--controller-id` of every agent (default `controller`). */
  controllerId?: string;
  /** `--dial-out` of every agent: it dials this connect URL and listens on nothing. */
  dialOut?: string;
  stateRoot: string;
  hook: HookMode;
  pollIntervalMs: number;
  pollIntervalHealthyMs: number;
  announce: boolean;
  /** Agents started at once. */
  startConcurrency: number;
  /** Metadata fetches in flight at once in this process (0: no limit); see sim-agent.ts. */
  fetchConcurrency: number;
  /** Dials out in flight at once in this process (0: no limit); see sim-agent.ts. */
  dialConcurrency: number;
}

export type ToHarness =
  | HarnessStart
  | { t: 'counters'; id: number }
  | { t: 'arm'; id: number; target: string; minRevision: number }
  | { t: 'hold'; id: number; on: boolean }
  | { t: 'progress'; id: number }
  | { t: 'wakesSince'; id: number; since: number; notFrom: string }
  | { t: 'wakesAtLeast'; id: number; asks: WakeAsk[] }
  | { t: 'report'; id: number }
  | { t: 'release'; id: number }
  | { t: 'settle'; id: number }
  | { t: 'stop'; id: number };

export interface AgentRunReport {
  node: string;
  /** Epoch ms: the agent acked the wake-up of this run's change (verified it, answered). */
  tAck: number | null;
  /** Epoch ms: a 200 with a checked signature carrying this run's change. */
  tFetch: number | null;
  fetchWasPoll: boolean;
  wakes: number;
  fetches200: number;
}

export interface HarnessCounters extends SimCounters {
  agents: number;
  /** Agents whose listener holds an authenticated connection now. */
  agentsConnected: number;
  warns: number;
  errors: number;
  lastLog: string[];
  rssKb: number;
  pings: number;
  /**
   * The longest this process's event loop was late since the last `arm` (ms; perf_hooks): how long
   * an agent of it may have waited to read a frame. Summed over the fleet as the largest.
   */
  loopDelayMaxMs: number;
}

/** An agent's first wake-up after a moment, from a controller other than a given one. */
export interface FirstWake {
  node: string;
  /** Epoch ms, or null when none came. */
  t: number | null;
  iss: string | null;
  reason: string | null;
}

/** A node's first wake-up at or after `since` (epoch ms) announcing generation `gen` or later. */
export interface WakeAsk {
  node: string;
  since: number;
  gen: number;
}

export type FromHarness = { t: 'started'; ms: number; failed: string[] } | { t: 'reply'; id: number; data: unknown };

const log = new CountingLogger(process.env.HERALD_BENCH_ECHO === '1');

// Count the WebSocket pings the listeners receive (idle traffic per ping): every ws instance in
// this process is a listener's connection, and the listener requires the same `ws` module.
let pings = 0;
{
  const ws = createRequire(import.meta.url)('ws') as {
    WebSocket: { prototype: { emit: (ev: string | symbol, ...a: unknown[]) => boolean } };
  };
  const emit = ws.WebSocket.prototype.emit;
  ws.WebSocket.prototype.emit = function (this: unknown, ev: string | symbol, ...rest: unknown[]): boolean {
    if (ev === 'ping') pings++;
    return emit.call(this, ev, ...rest);
  };
}
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
const agents: SimAgent[] = [];
let releaseHeld: (() => void) | null = null;
/** Hooks started while this is false end at once (between measuring windows). */
let holding = true;
let held: Promise<void> = new Promise((r) => (releaseHeld = r));

function send(m: FromHarness): void {
  // with a callback, a parent that has just died is an EPIPE here, not an unhandled 'error'
  // event that would crash this process before its 'disconnect' handler runs
  if (process.connected) process.send?.(m, undefined, {}, () => undefined);
}

const OK: RunResult = { deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} };

async function hookOf(mode: HookMode): Promise<RunItem> {
  if (mode === 'real') return (await import('../agent/hooks/run-item.js')).runItem;
  if (mode === 'noop') return () => Promise.resolve({ ...OK });
  // held: the run ends only when the benchmark releases it (or the agent stops), so its signal
  // does not reach the controller inside a measuring window
  return (_item, opts) =>
    new Promise<RunResult>((resolve) => {
      const done = (): void => {
        opts.signal?.removeEventListener('abort', done);
        resolve({ ...OK });
      };
      if (!holding) {
        done();
        return;
      }
      void held.then(done);
      opts.signal?.addEventListener('abort', done, { once: true });
    });
}

async function start(m: HarnessStart): Promise<void> {
  const t0 = Date.now();
  const runItem = await hookOf(m.hook);
  setFetchConcurrency(m.fetchConcurrency);
  setDialConcurrency(m.dialConcurrency);
  const failed: string[] = [];
  fs.mkdirSync(m.stateRoot, { recursive: true });
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < m.slots.length) {
      const s = m.slots[next++]!;
      const a = new SimAgent({
        slot: s,
        pki: { ...m.pki, certPath: path.join(m.pki.dir, 'agent', `${s.node}.crt`) },
        controllerUrl: urlsOf(m, s),
        ...(m.controllerId !== undefined ? { controllerId: m.controllerId } : {}),
        ...(m.dialOut !== undefined ? { dialOut: m.dialOut } : {}),
        stateDir: path.join(m.stateRoot, s.node),
        runItem,
        pollIntervalMs: m.pollIntervalMs,
        pollIntervalHealthyMs: m.pollIntervalHealthyMs,
        announce: m.announce,
        log,
      });
      try {
        await a.start();
        agents.push(a);
      } catch (err) {
        failed.push(`${s.node}: ${(err as Error).message}`);
        await a.stop().catch(() => undefined);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, m.startConcurrency) }, worker));
  send({ t: 'started', ms: Date.now() - t0, failed });
}

function urlsOf(m: HarnessStart, s: AgentSlot): string {
  const list = m.controllerUrls;
  if (!list || list.length === 0) return m.controllerUrl;
  const i = Number(s.node.replace(/^\D+/, '')) % list.length;
  return [...list.slice(i), ...list.slice(0, i)].join(',');
}

function counters(): HarnessCounters {
  const sum: HarnessCounters = {
    agents: agents.length,
    agentsConnected: 0,
    connected: 0,
    wakesVerified: 0,
    acks: 0,
    nacks: 0,
    fetch200: 0,
    fetch304: 0,
    fetchErrors: 0,
    polls: 0,
    runs: 0,
    signalsDelivered: 0,
    refused: 0,
    accepted: 0,
    resumed: 0,
    pongs: 0,
    dialFailures: 0,
    warns: log.warns,
    errors: log.errors,
    lastLog: log.last.slice(-5),
    rssKb: Math.round(process.memoryUsage.rss() / 1024),
    pings,
    loopDelayMaxMs: Math.round(loopDelay.max / 1e6),
  };
  for (const a of agents) {
    const c = a.counters();
    if (c.connected > 0) sum.agentsConnected++;
    for (const k of Object.keys(c) as Array<keyof SimCounters>) sum[k] += c[k];
  }
  return sum;
}

/** Agents whose ack and fetch of the armed change were seen (runReport's tAck and tFetch, both set). */
const progressDone = new Set<SimAgent>();

function runReport(a: SimAgent): AgentRunReport {
  const f = a.fetches.find((x) => x.status === 200 && x.hit);
  let tAck: number | null = null;
  if (f) {
    // the wake-up that carried this change (or a later one, when a poll fetched it first)
    tAck = a.wakes.find((w) => w.gen >= f.gen)?.t ?? null;
  } else {
    tAck = a.wakes.find((w) => w.fetch !== 'current')?.t ?? null;
  }
  return {
    node: a.slot.node,
    tAck,
    tFetch: f?.t ?? null,
    fetchWasPoll: f?.poll ?? false,
    wakes: a.wakes.length,
    fetches200: a.fetches.filter((x) => x.status === 200).length,
  };
}

process.on('message', (m: ToHarness) => {
  void (async () => {
    switch (m.t) {
      case 'start':
        await start(m);
        return;
      case 'counters':
        send({ t: 'reply', id: m.id, data: counters() });
        return;
      case 'arm':
        // the log ring shows the run's own warnings from now on, not the start-up's
        log.last.length = 0;
        loopDelay.reset();
        progressDone.clear();
        for (const a of agents) a.mark(m.target, m.minRevision);
        send({ t: 'reply', id: m.id, data: nowMs() });
        return;
      case 'progress': {
        // asked every 100 ms while a run lasts: an agent that acked and fetched stays so until the
        // next arm, so only the others are walked (all of them cost ~1.5 % of this process)
        let acked = progressDone.size;
        let fetched = progressDone.size;
        for (const a of agents) {
          if (progressDone.has(a)) continue;
          const r = runReport(a);
          if (r.tAck !== null) acked++;
          if (r.tFetch !== null) fetched++;
          if (r.tAck !== null && r.tFetch !== null) progressDone.add(a);
        }
        send({ t: 'reply', id: m.id, data: { acked, fetched, agents: agents.length } });
        return;
      }
      case 'wakesSince': {
        const notFrom = `/controller/${m.notFrom}`;
        const out: FirstWake[] = agents.map((a) => {
          const w = a.wakes.find((x) => x.t >= m.since && !x.iss.endsWith(notFrom));
          return { node: a.slot.node, t: w?.t ?? null, iss: w?.iss ?? null, reason: w?.reason ?? null };
        });
        send({ t: 'reply', id: m.id, data: out });
        return;
      }
      case 'wakesAtLeast': {
        // null for a node this process does not run, or that had no such wake-up
        const byNode = new Map(agents.map((a) => [a.slot.node, a]));
        const out = m.asks.map((q) => {
          const a = byNode.get(q.node);
          return a?.wakes.find((w) => w.t >= q.since && w.gen >= q.gen)?.t ?? null;
        });
        send({ t: 'reply', id: m.id, data: out });
        return;
      }
      case 'report':
        send({ t: 'reply', id: m.id, data: agents.map(runReport) });
        return;
      case 'hold':
        holding = m.on;
        send({ t: 'reply', id: m.id, data: true });
        return;
      case 'settle':
        // every agent's signals answered (none waiting in its outbox): a crash then cuts no answer off
        await Promise.all(agents.map((a) => a.outboxIdle()));
        send({ t: 'reply', id: m.id, data: true });
        return;
      case 'release': {
        const r = releaseHeld;
        held = new Promise((res) => (releaseHeld = res));
        r?.();
        send({ t: 'reply', id: m.id, data: true });
        return;
      }
      case 'stop':
        releaseHeld?.();
        await Promise.all(agents.map((a) => a.stop().catch(() => undefined)));
        send({ t: 'reply', id: m.id, data: true });
        setTimeout(() => process.exit(0), 50);
        return;
    }
  })().catch((err: unknown) => {
    process.stderr.write(`harness: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
});

process.on('disconnect', () => process.exit(0));
