/**
 * Fan-out: N simulated agents (the agent's own modules, in several harness processes) beside a
 * real controller process. One change to every node: one `POST /v1/clusters` naming all N nodes
 * (one operator request, one transaction, one wake-up per node). Per run: time from the request
 * to every agent having acked its wake-up and to every agent holding the new metadata (a 200
 * whose signature, nonce, audience and digest it checked).
 *
 * One controller and one fleet serve every N: the fleet grows (100 → 1,000 → 5,000 → 10,000)
 * and the agents it has stay connected, so connecting agents (full mutual TLS handshakes, the
 * dearest set-up on two cores) is paid once per agent. Hooks are held during a measuring window
 * (a no-op that ends when released), so no signal reaches the controller inside it; between
 * windows they end at once and each run's cluster is completed and deleted, so the next run's
 * nodes are free again (a node belongs to one cluster at a time). Hooks are timed in latency.ts.
 *
 * Crash run: the controller commits a change to every node (a restart of the cluster: every
 * node's uninstall deployment made, its first revision the restart's) and dies (SIGKILL) before any wake-up went out;
 * started again on the same database it must reconnect all N agents and deliver the change to
 * each one: the time to do so, and whether any was lost.
 */
import fs from 'node:fs';
import path from 'node:path';
import { AGENT_API_IDLE_CLOSE_MS } from '../protocol/limits.js';
import { type AckProbeResult, type AckProbeSpec, pendAckProbes, prepareAckProbe, startAckProbe } from './ack-probe.js';
import { histogramShares, metricSum, type HistogramShares } from './api-client.js';
import { Fleet } from './fleet.js';
import { FLOOR_AGENT_PROCS } from './floor.js';
import type { AgentRunReport } from './harness.js';
import { slot, type AgentSlot, type BenchPki } from './pki-cache.js';
import { exited, startController, stopController, type ControllerProc } from './procs.js';
import {
  addResident,
  childrenOf,
  diffCounters,
  dist,
  heapNote,
  median,
  nowMs,
  profileFromStart,
  round,
  residentByKind,
  residentText,
  roundDist,
  say,
  sleep,
  splitByProcess,
  tcpTroubles,
  treeSample,
  waitFor,
  type Dist,
  type ProcessSplit,
  type ResidentKinds,
} from './util.js';

/**
 * Agents per harness process at most: a fleet of 10,000 made in one step is four processes, as
 * the floor spreads its own (bench/floor.ts FLOOR_AGENT_PROCS), so both sides' agents share the
 * cores among as many event loops (the full run's fleet, grown from 100, is six). Each agent holds
 * a listener and a push connection (its API connection closes while push is healthy). Eight
 * processes of 1,250 had cost the simulated agents 7.5-8.8 CPU-s a fan-out at 10,000 against
 * 6.9-7.6 with four (2026-12-06 12:14-12:27 UTC), and growing the fleet 122-133 s against 97 s.
 * The limit that once kept it at 1,250 (agents answering pings and wake-ups past the controller's
 * 1 s while others handshook, then dropped as half-open) did not show at 2,500: every check passed
 * and no agent was dropped while the fleet grew, in one step or in the full run's three.
 */
const AGENTS_PER_HARNESS = 2_500;
/** How long the controller's CPU is sampled, quiet, before each change (its background rate). */
export const FANOUT_IDLE_SAMPLE_MS = 5_000;

export interface FanoutRun {
  run: number;
  /** Growing the fleet to N: the agents added (N minus the previous N), until the controller's gauge showed N connected. */
  connectAllMs: number;
  agentsAdded: number;
  controllerCpuConnectS: number;
  controllerRssKb: ControllerRss;
  agentsConnected: number;
  metricsConnected: number;
  /** POST /v1/clusters answered (the change committed and every wake-up handed to push). */
  commitMs: number;
  allAckedMs: number;
  allFetchedMs: number;
  ackMs: Dist;
  fetchMs: Dist;
  acked: number;
  fetched: number;
  fetchedByPoll: number;
  wakesVerifiedAgents: number;
  controllerCpuS: number;
  /**
   * The controller's CPU per second while nothing changes, sampled for FANOUT_IDLE_SAMPLE_MS just
   * before the change (its pings and the agents' healthy polls; absent in older results).
   */
  controllerIdleCpuPerS?: number;
  /** CPU of the simulated agents' harness processes over the same window (absent in older results). */
  harnessCpuS?: number;
  /**
   * controllerCpuS by process: the main process and its push workers, each with its kernel time
   * (absent in results before 2026-12-06 12:30 UTC).
   */
  controllerSplit?: ProcessSplit;
  metricsAckedDelta: number;
  metricsFetch200Delta: number;
  timedOut: boolean;
  harnessWarns: number;
  harnessLast: string[];
  /** TCP trouble counters of the namespace during the run (listen overflows, resets, ...). */
  tcp: Record<string, number>;
}

export interface CrashRun {
  /** SIGKILL of the controller (its push workers stopped, the change committed, no wake-up sent) → new process answers. */
  restartMs: number;
  /** New process answering → every agent connected again (controller gauge). */
  connectAllMs: number;
  /** New process answering → every agent acked / holds the change. */
  allAckedMs: number;
  allFetchedMs: number;
  acked: number;
  fetched: number;
  fetchedByPoll: number;
  metricsConnected: number;
  controllerCpuS: number;
  /** CPU of the simulated agents' processes over the same window (they share the two cores). */
  harnessCpuS?: number;
  /** controllerCpuS by process: the main process and its push workers (absent in older results). */
  controllerSplit?: ProcessSplit;
  /** Failed dials and lost push connections of the restarted controller, by code. */
  dialFailures?: Record<string, number>;
  /** Agents connected (controller gauge) every 5 s after the restarted controller answered. */
  connectedEvery5s?: number[];
  /** Push connections the agents accepted in the window, and how many of them resumed a TLS session. */
  reconnections?: number;
  resumed?: number;
  /**
   * What the agents did in the window, summed over the fleet: polls made, fetches answered 200 or
   * 304 (over push or HTTPS), fetches that failed, items run and signals delivered.
   */
  agentActivity?: {
    polls: number;
    fetch200: number;
    fetch304: number;
    fetchErrors: number;
    runs: number;
    signals: number;
  };
  /** Every agent got the change committed before the crash: nothing lost. */
  noneLost: boolean;
  timedOut: boolean;
  /**
   * The restarted controller's wake-up → ack latency over the window, every ack counted
   * (herald_wake_ack_latency_seconds; absent in results before the dial-out benchmark).
   */
  ackLatency?: HistogramShares;
  /** Dialled-in connections the restarted controller refused at or before their upgrade, by code. */
  connectRefusals?: Record<string, number>;
  /** Changes made to single nodes while the fleet reconnected, and how fast their agents acked (bench/ack-probe.ts). */
  ackProbe?: AckProbeResult;
  /** The longest any harness process's event loop was late in the window (ms): the simulated agents' own delay. */
  harnessLoopDelayMaxMs?: number;
}

/**
 * The first change after the fleet grew, not counted in the runs: the agents added (their harness
 * processes new) run the wake-up's code for the first time, as the floor's warm-up change does
 * (bench/floor.ts). Kept so the cold figure stays in the report.
 */
export type WarmupRun = Pick<FanoutRun, 'allAckedMs' | 'allFetchedMs' | 'controllerCpuS' | 'harnessCpuS'>;

export interface FanoutResult {
  n: number;
  harnessProcs: number;
  pushWorkers: number | 'default';
  /** Absent in results before commit de11ede (2026-12-04 21:15 UTC), and when no agent was added for this N. */
  warmup?: WarmupRun;
  runs: FanoutRun[];
  crash: CrashRun | null;
  checksOk: boolean;
  problems: string[];
}

export interface FanoutOptions {
  pki: BenchPki;
  runDir: string;
  port: number;
  /** The N to measure, ascending. */
  ns: number[];
  runsFor: (n: number) => number;
  crashFor: (n: number) => boolean;
  pushWorkers?: number | undefined;
  /** Called after each N is done (the caller starts side phases after the first). */
  onStep?: (i: number) => void;
  harnessExecArgv?: string[];
  controllerExtra?: string[];
  controllerNodeArgs?: string[] | undefined;
  /** Bracket each measured window with SIGUSR2 to every process (see prof-preload.ts). */
  profile?: boolean;
  /**
   * Called once the fleet has grown to N, before its warm-up change: the floor dials its agents
   * here, so the warm-up, not a measured run, comes after that storm of handshakes.
   */
  afterGrow?: (n: number) => Promise<void>;
  /** Called just before each measured run at N (`run` from 1), the fleet settled: the floor's turn. */
  beforeRun?: (n: number, run: number) => Promise<void>;
  /** Called after the measured runs at N, before its crash run (the floor stops there). */
  afterRuns?: (n: number) => Promise<void>;
  /** The bed's name: its run directory and what its lines say (default `fanout`). */
  label?: string;
  /**
   * Dial-out mode (docs/dial-out.md): every agent dials this connect URL and listens on nothing;
   * `controllerExtra` must give the controller the `--connect-listen` it names.
   */
  dialOut?: string;
  /**
   * Agents besides the fan-out's, in a harness process of their own (`a00000`, ...), for the crash
   * run's ack probes (bench/ack-probe.ts): their acks are not held up by thousands of other
   * simulated agents in their event loop. Not counted in the fan-out's figures.
   */
  probeAgents?: number;
}

/**
 * How long a crash run watches the restarted controller deliver the change: long enough for
 * small N to finish many times over; at 10,000 it bounds the run (the goal is 30 s) and the
 * report says how many agents had the change when the window closed.
 */
export const CRASH_WINDOW_MS = (n: number): number => Math.min(90_000, 60_000 + n * 10);

/**
 * How often a bench waits on a cluster's status: every poll is a `GET /v1/clusters/{id}`, which
 * builds the whole cluster's view (every node twice, 9 MB at 10,000: ~0.25 s of the controller's
 * CPU). Polled every 100 ms, those views took most of the ~21 CPU-s the main process used between
 * two runs at 10,000 (2026-12-06 11:51 UTC), against ~3.5 CPU-s for the signals and fetches of
 * completing and deleting the cluster. A poll every n/10 ms (1 s at 10,000) is ~20 % of a core
 * while waiting: 8-8.6 CPU-s between runs. Never used inside a measured window.
 */
function clusterPollMs(n: number): number {
  return Math.max(100, Math.round(n / 10));
}

/**
 * Harness processes to add when the fleet grows by `added` agents: at most as many as the floor's
 * agents run in (FLOOR_AGENT_PROCS). A step of more than 10,000 agents puts more than
 * AGENTS_PER_HARNESS in each; at 10,000 a step has 2,500 a process, two or three descriptors
 * each, far from the 20,000 a process may open.
 */
export function harnessProcsFor(added: number): number {
  if (added <= 200) return 1;
  return Math.min(FLOOR_AGENT_PROCS, Math.max(Math.ceil(added / AGENTS_PER_HARNESS), 1));
}

/** A cluster's status, or null once it is gone (404). */
async function clusterStatus(op: ControllerProc['op'], id: string): Promise<string | null> {
  const r = await op.request<{ status: string }>('GET', `/v1/clusters/${id}`);
  return r.status === 404 ? null : (r.json?.status ?? '?');
}

/** Waits, every clusterPollMs(n), until cluster `id` of `n` nodes ends its operation `_COMPLETE`. */
async function waitClusterComplete(
  op: ControllerProc['op'],
  id: string,
  what: string,
  n: number,
  limitMs: number,
): Promise<void> {
  await waitFor(what, async () => (await clusterStatus(op, id))?.endsWith('_COMPLETE'), limitMs, clusterPollMs(n));
}

/**
 * Between runs: waits until cluster `c` of `n` nodes ends its operation, deletes it and waits
 * until it is gone (its nodes are free for the next run's cluster), polling every clusterPollMs(n).
 * @throws Error when it does not end, or the DELETE is refused, within `limitMs`
 */
export async function finishAndDeleteCluster(
  op: ControllerProc['op'],
  c: { id: string; name: string },
  n: number,
  limitMs: number,
  deleteTimeoutMs: number,
): Promise<void> {
  const pollMs = clusterPollMs(n);
  await waitFor(
    `cluster ${c.name} to finish`,
    async () => !(await clusterStatus(op, c.id))?.endsWith('_IN_PROGRESS'),
    limitMs,
    pollMs,
  );
  const del = await op.request('DELETE', `/v1/clusters/${c.id}`, undefined, deleteTimeoutMs);
  if (del.status !== 202 && del.status !== 204)
    throw new Error(`DELETE /v1/clusters/${c.id} → ${del.status}: ${del.raw.slice(0, 200)}`);
  await waitFor(
    `cluster ${c.name} to be deleted`,
    async () => (await clusterStatus(op, c.id)) === null,
    limitMs,
    pollMs,
  );
}

/**
 * Where simulated agents keep their state: tmpfs when there is one (on a fleet each agent has a
 * disk of its own; here thousands would queue on one), else under the run directory.
 */
export function agentStateRoot(runDir: string, label: string): string {
  const shm = '/dev/shm';
  try {
    fs.accessSync(shm, fs.constants.W_OK);
    return path.join(shm, `herald-bench-${process.pid}-${label}`);
  } catch {
    return path.join(runDir, label, 'agents');
  }
}

/** What growing the fleet to N took (`FanoutBed.grow`). */
export interface Grown {
  connectAllMs: number;
  agentsAdded: number;
  cpuConnectS: number;
  rss: ControllerRss;
  agentsConnected: number;
  metricsConnected: number;
}

/** What a window of RSS samples gives per agent (rssPerAgent). */
export interface RssWindow {
  baseline: number;
  connected: number;
  /** (connected − baseline) / N, KB */
  perAgent: number;
  connectedMax: number;
  samples: number;
  /** (connectedMax − baseline) / N, KB */
  perAgentMax: number;
}

/**
 * The controller's RSS with N agents connected. RSS under a garbage collector is a sawtooth, so
 * it is sampled over a quiet window (FANOUT_RSS_WINDOW_MS, a sample every FANOUT_RSS_EVERY_MS):
 * `connected` is the window's median, `connectedMax` its highest sample.
 * A BENCHMARKS.json written before the window (2026-12-06) has one sample and none of its extremes.
 */
export interface ControllerRss
  extends Pick<RssWindow, 'baseline' | 'connected' | 'perAgent'>,
    Partial<Pick<RssWindow, 'connectedMax' | 'samples' | 'perAgentMax'>> {
  /** The window's last sample split: the main process, and its push workers together (KB). */
  mainKb?: number;
  workersKb?: number;
  /** The same moment by kind (bench/util.ts ResidentKinds): which kind of memory holds a level. */
  mainParts?: ResidentKinds;
  workersParts?: ResidentKinds;
  /** The push worker processes the controller ran in the window (its default follows the cores). */
  workers?: number;
  /** The main process's V8 heap right after the window (its /metrics, KB): taken, used, and external. */
  mainHeap?: { totalKb: number; usedKb: number; externalKb: number };
}

/**
 * The push workers a fan-out's controller ran: counted in its windows; results from before
 * 2026-12-06 did not count them (the default was then one).
 */
export function workersOf(f: Pick<FanoutResult, 'runs' | 'pushWorkers'>): number {
  const counted = f.runs.find((x) => x.controllerRssKb.workers !== undefined)?.controllerRssKb.workers;
  return counted ?? (f.pushWorkers === 'default' ? 1 : f.pushWorkers);
}

/** The quiet window the controller's RSS is sampled over once the fleet has grown, and how often. */
export const FANOUT_RSS_WINDOW_MS = 10_000;
export const FANOUT_RSS_EVERY_MS = 500;

/** Per agent from a window of RSS samples (KB): its median and its highest, over the empty controller's. */
export function rssPerAgent(baselineKb: number, samplesKb: readonly number[], n: number): RssWindow {
  if (samplesKb.length === 0 || n <= 0) throw new Error('rssPerAgent: no samples or no agents');
  const connected = median(samplesKb);
  const connectedMax = Math.max(...samplesKb);
  return {
    baseline: baselineKb,
    connected,
    connectedMax,
    samples: samplesKb.length,
    perAgent: round((connected - baselineKb) / n, 1),
    perAgentMax: round((connectedMax - baselineKb) / n, 1),
  };
}

/** One controller and the fleet it serves, grown from one N to the next (`fanoutAll`, bench/dial-out.ts). */
export class FanoutBed {
  ctl!: ControllerProc;
  fleet: Fleet | null = null;
  baselineRssKb = 0;
  configId = '';
  /** The cluster the last run left (completed before the next change). */
  cluster: { id: string; name: string } | null = null;
  readonly dir: string;
  readonly stateRoot: string;
  /** What its lines start with: `fan-out`, or `fan-out (<label>)`. */
  readonly says: string;
  /** The probe deployments' config, made at the first crash run that probes (bench/ack-probe.ts). */
  probeConfigId = '';
  /** The probe agents (`probeAgents`), or null. */
  probeFleet: Fleet | null = null;
  readonly probeSlots: AgentSlot[];
  #harnessCpuS = 0;
  constructor(readonly o: FanoutOptions) {
    const label = o.label ?? 'fanout';
    this.dir = path.join(o.runDir, label);
    this.stateRoot = agentStateRoot(o.runDir, label);
    this.says = o.label === undefined ? 'fan-out' : `fan-out (${o.label})`;
    this.probeSlots = Array.from({ length: o.probeAgents ?? 0 }, (_, i) => slot('a', i));
  }

  /** Push connections the controller holds besides the fan-out's agents (the probe agents'). */
  get extra(): number {
    return this.probeSlots.length;
  }

  async start(): Promise<void> {
    fs.rmSync(this.dir, { recursive: true, force: true });
    fs.rmSync(this.stateRoot, { recursive: true, force: true });
    fs.mkdirSync(this.dir, { recursive: true });
    const o = this.o;
    this.ctl = await startController({
      pki: o.pki,
      dir: this.dir,
      port: o.port,
      pushWorkers: o.pushWorkers,
      extra: o.controllerExtra,
      nodeArgs: o.controllerNodeArgs,
    });
    await sleep(300);
    this.baselineRssKb = treeSample(this.ctl.pid).rssKb;
    const cfg = await this.ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'fanout',
      group: 'script',
      config: '#!/bin/sh\ntrue\n',
    });
    this.configId = cfg.id;
    if (this.probeSlots.length > 0) {
      const r = await Fleet.start({
        pki: o.pki,
        slots: this.probeSlots,
        controllerUrl: this.ctl.url,
        stateRoot: path.join(this.stateRoot, 'probes'),
        hook: 'noop',
        procs: 1,
        ...(o.dialOut !== undefined ? { dialOut: o.dialOut } : {}),
      });
      this.probeFleet = r.fleet;
      if (r.failed.length > 0) throw new Error(`probe agents failed to start: ${r.failed.slice(0, 3).join('; ')}`);
      const ctl = this.ctl;
      const k = this.probeSlots.length;
      await waitFor(
        `${k} probe agents connected`,
        async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= k,
        60_000,
        200,
      );
    }
  }

  /** Adds agents up to `n`, all connected and past their start-up fetch. */
  async grow(n: number, problems: string[]): Promise<Grown> {
    const o = this.o;
    const have = this.fleet?.size ?? 0;
    const slots = Array.from({ length: n - have }, (_, i) => slot('b', have + i));
    const profiled = o.profile ? [this.ctl.pid, ...childrenOf(this.ctl.pid)] : [];
    for (const p of profiled) killQuietly(p, 'SIGUSR2');
    const cpu0 = treeSample(this.ctl.pid).cpuS;
    const t0 = Date.now();
    const fo = {
      pki: o.pki,
      slots,
      controllerUrl: this.ctl.url,
      stateRoot: this.stateRoot,
      hook: 'hold' as const,
      procs: harnessProcsFor(slots.length),
      execArgv: o.harnessExecArgv,
      startConcurrency: 8,
      ...(o.dialOut !== undefined ? { dialOut: o.dialOut } : {}),
    };
    let failed: string[];
    let startMs: number;
    if (this.fleet === null) {
      const r = await Fleet.start(fo);
      this.fleet = r.fleet;
      failed = r.failed;
      startMs = r.startMs;
    } else {
      ({ failed, startMs } = await this.fleet.grow(fo));
    }
    say(`${this.says}: ${slots.length} agents started in ${startMs} ms`);
    if (failed.length > 0)
      problems.push(`growing to ${n}: ${failed.length} agents failed to start: ${failed.slice(0, 3).join('; ')}`);
    const ctl = this.ctl;
    await waitFor(
      `${n} agents connected`,
      async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n + this.extra,
      60_000 + (n - have) * 30,
      200,
    ).catch((err: Error) => problems.push(`growing to ${n}: ${err.message}`));
    const connectAllMs = Date.now() - t0;
    for (const p of profiled) killQuietly(p, 'SIGUSR2');
    const fleet = this.fleet;
    // not a check: an agent whose start-up fetch is still retrying fetches on its wake-up like any other
    await waitFor('start-up fetches', async () => (await fleet.counters()).fetch200 >= n, 30_000, 200).catch(
      () => undefined,
    );
    // steady state: the start-up's API connections close once idle while push is healthy
    // (AGENT_API_IDLE_CLOSE_MS); what a connected agent costs is its push connection
    await sleep(AGENT_API_IDLE_CLOSE_MS + (n >= 5000 ? 2_000 : 500));
    // the CPU to connect them, before the window the RSS is sampled over
    const now = treeSample(ctl.pid);
    const harnessCpuS = fleet.pids().reduce((a, pid) => a + treeSample(pid).cpuS, 0);
    const rssKb: number[] = [];
    let last = now;
    for (const end = Date.now() + FANOUT_RSS_WINDOW_MS; ; await sleep(FANOUT_RSS_EVERY_MS)) {
      last = treeSample(ctl.pid);
      rssKb.push(last.rssKb);
      if (Date.now() + FANOUT_RSS_EVERY_MS > end) break;
    }
    // by kind right after the last sample (reading smaps takes a few ms: the two differ by that)
    const mainKb = last.byPid[ctl.pid]?.rssKb ?? 0;
    const workerPids = last.pids.filter((p) => p !== ctl.pid);
    const mainParts = residentByKind(ctl.pid);
    const workersParts = addResident(workerPids.map(residentByKind));
    const rss: ControllerRss = {
      ...rssPerAgent(this.baselineRssKb, rssKb, n),
      mainKb,
      workersKb: last.rssKb - mainKb,
      workers: workerPids.length,
      ...(mainParts ? { mainParts } : {}),
      ...(workersParts ? { workersParts } : {}),
    };
    const c0 = await fleet.counters();
    const m0 = await ctl.op.metrics();
    // a controller from before 2026-12-06 serves no heap gauges
    if (m0.has('nodejs_heap_size_total_bytes'))
      rss.mainHeap = {
        totalKb: Math.round(metricSum(m0, 'nodejs_heap_size_total_bytes') / 1024),
        usedKb: Math.round(metricSum(m0, 'nodejs_heap_size_used_bytes') / 1024),
        externalKb: Math.round(metricSum(m0, 'nodejs_external_memory_bytes') / 1024),
      };
    say(
      `${this.says}: grown to ${n} agents (+${n - have}); ${c0.agentsConnected} connected (controller: ${metricSum(m0, 'herald_push_connected_agents') - this.extra}) in ${connectAllMs} ms (CPU: controller ${round(now.cpuS - cpu0, 1)} s, harness processes ${round(harnessCpuS - this.#harnessCpuS, 1)} s)`,
    );
    say(
      `${this.says}: controller RSS over ${rssKb.length} samples: median ${round(rss.connected / 1024, 1)} MB, max ${round((rss.connectedMax ?? 0) / 1024, 1)} MB (${rssKb.map((k) => round(k / 1024)).join(' ')}); main process ${round(mainKb / 1024, 1)} MB (${mainParts ? residentText(mainParts, heapNote(rss.mainHeap)) : 'gone'}), ${workerPids.length} push worker(s) ${round((rss.workersKb ?? 0) / 1024, 1)} MB (${workersParts ? residentText(workersParts) : 'none'})`,
    );
    this.#harnessCpuS = harnessCpuS;
    return {
      connectAllMs,
      agentsAdded: n - have,
      cpuConnectS: round(now.cpuS - cpu0, 2),
      rss,
      agentsConnected: c0.agentsConnected,
      metricsConnected: metricSum(m0, 'herald_push_connected_agents') - this.extra,
    };
  }

  /**
   * Lets the held hooks end (and later ones end at once), waits for the last cluster's
   * operation to finish, deletes it and waits until it is gone: its nodes are free again.
   */
  async settle(n: number, problems: string[]): Promise<void> {
    const c = this.cluster;
    const fleet = this.fleet;
    if (fleet === null) return;
    await fleet.hold(false);
    await fleet.release();
    if (c === null) return;
    try {
      await finishAndDeleteCluster(this.ctl.op, c, n, 60_000 + n * 20, 120_000);
    } catch (err) {
      problems.push(`settling ${c.name}: ${(err as Error).message}`);
    }
    this.cluster = null;
  }

  async stop(): Promise<void> {
    // SIGKILL first: the held hooks end when the agents stop, and their signals should find no one
    await stopController(this.ctl, 'SIGKILL');
    for (const p of childrenOf(this.ctl.pid)) killQuietly(p);
    await this.fleet?.stop();
    await this.probeFleet?.stop();
    fs.rmSync(this.stateRoot, { recursive: true, force: true });
  }
}

function killQuietly(pid: number, sig: NodeJS.Signals = 'SIGKILL'): void {
  try {
    process.kill(pid, sig);
  } catch {
    // gone
  }
}

/** Every N in turn on one controller and one growing fleet. */
export async function fanoutAll(o: FanoutOptions): Promise<FanoutResult[]> {
  const bed = new FanoutBed(o);
  const results: FanoutResult[] = [];
  await bed.start();
  try {
    for (const [i, n] of o.ns.entries()) {
      const problems: string[] = [];
      const result: FanoutResult = {
        n,
        harnessProcs: 0,
        pushWorkers: o.pushWorkers ?? 'default',
        runs: [],
        crash: null,
        checksOk: false,
        problems,
      };
      results.push(result);
      await bed.settle(n, problems);
      const g = await bed.grow(n, problems);
      result.harnessProcs = bed.fleet!.members.length;
      await o.afterGrow?.(n);
      const nodes = fanoutNodes(n);
      if (g.agentsAdded > 0) await warmupRun(bed, nodes, result);
      for (let r = 1; r <= o.runsFor(n); r++) result.runs.push(await measuredRun(bed, nodes, r, g, result.problems));
      await o.afterRuns?.(n);
      if (o.crashFor(n)) {
        result.crash = await crashRun(bed, n, nodes, CRASH_WINDOW_MS(n), problems);
        sayCrash(bed, n, result.crash);
      }
      result.problems.push(...fanoutChecks(result));
      result.checksOk = result.problems.length === 0;
      o.onStep?.(i);
    }
  } finally {
    await bed.stop();
  }
  return results;
}

/** The nodes of a fan-out at N: the first N agents of the fleet. */
export function fanoutNodes(n: number): string[] {
  return Array.from({ length: n }, (_, k) => slot('b', k).node);
}

/** A run's time limit at N. */
function runTimeoutMs(n: number): number {
  return 60_000 + n * 10;
}

/**
 * The first change after the fleet grew (not counted): the agents just added run the wake-up's
 * code for the first time, as the floor warms its code up, so the runs compare with it; its
 * figures are kept apart, in `result.warmup`.
 */
export async function warmupRun(bed: FanoutBed, nodes: string[], result: FanoutResult): Promise<void> {
  const n = nodes.length;
  await bed.fleet!.hold(true);
  const w = await oneRun(bed, nodes, `fan${n}warm`, 0, runTimeoutMs(n));
  const { allAckedMs, allFetchedMs, controllerCpuS, harnessCpuS } = w;
  result.warmup = { allAckedMs, allFetchedMs, controllerCpuS, harnessCpuS };
  say(
    `${bed.says} N=${n} warm-up (first change after growing, not counted): all acked ${round(w.allAckedMs)} ms, all fetched ${round(w.allFetchedMs)} ms, controller CPU ${w.controllerCpuS} s`,
  );
  await bed.settle(n, result.problems);
}

/**
 * Measured run `r` at N (from 1): the last run's cluster settled first (when there was one), then
 * one change to every node; `g` is the fleet's growth to N, reported beside each run.
 */
export async function measuredRun(
  bed: FanoutBed,
  nodes: string[],
  r: number,
  g: Grown,
  problems: string[],
): Promise<FanoutRun> {
  const n = nodes.length;
  const o = bed.o;
  await bed.settle(n, problems);
  await bed.fleet!.hold(true);
  await o.beforeRun?.(n, r);
  const fleet = bed.fleet!;
  const profiled = o.profile ? [bed.ctl.pid, ...childrenOf(bed.ctl.pid), ...fleet.pids()] : [];
  for (const p of profiled) killQuietly(p, 'SIGUSR2');
  const run = await oneRun(bed, nodes, `fan${n}r${r}`, r, runTimeoutMs(n));
  for (const p of profiled) killQuietly(p, 'SIGUSR2');
  if (profiled.length) await sleep(2_000);
  const c = await fleet.counters();
  say(
    `${bed.says} N=${n} run ${r}: commit ${round(run.commitMs)} ms, all acked ${round(run.allAckedMs)} ms, all fetched ${round(run.allFetchedMs)} ms${run.timedOut ? ' (TIMED OUT)' : ''}`,
  );
  return {
    ...run,
    connectAllMs: g.connectAllMs,
    agentsAdded: g.agentsAdded,
    controllerCpuConnectS: g.cpuConnectS,
    controllerRssKb: g.rss,
    agentsConnected: g.agentsConnected,
    metricsConnected: g.metricsConnected,
    harnessWarns: c.warns,
    harnessLast: c.lastLog.slice(-4),
  };
}

/** The crash run's line. */
export function sayCrash(bed: FanoutBed, n: number, c: CrashRun): void {
  const probe = c.ackProbe;
  const parts = [
    `restarted in ${c.restartMs} ms, all connected ${round(c.connectAllMs)} ms, all fetched ${round(c.allFetchedMs)} ms after`,
    `dial failures ${JSON.stringify(c.dialFailures)}`,
    `connect refusals ${JSON.stringify(c.connectRefusals ?? {})}`,
    `connected every 5 s ${c.connectedEvery5s?.join(',')}`,
    `${c.resumed} of ${c.reconnections} push connections resumed`,
    `harness event loop late at most ${c.harnessLoopDelayMaxMs} ms`,
    `agents: ${JSON.stringify(c.agentActivity)}`,
    ...(probe
      ? [`probes acked ${probe.acked}/${probe.sent}, p50 ${probe.ackMs.p50} ms, max ${probe.ackMs.max} ms`]
      : []),
  ];
  say(`${bed.says} N=${n} crash: ${parts.join('; ')}`);
}

/** The checks a run must pass: for this N, all connected, all verified, all fetched (200, checked). */
export function fanoutChecks(result: FanoutResult): string[] {
  const n = result.n;
  const bad: string[] = [];
  for (const r of result.runs) {
    if (r.agentsConnected !== n) bad.push(`run ${r.run}: agents connected ${r.agentsConnected}/${n}`);
    if (r.metricsConnected !== n) bad.push(`run ${r.run}: controller connected gauge ${r.metricsConnected}/${n}`);
    if (r.wakesVerifiedAgents !== n)
      bad.push(`run ${r.run}: wake-ups verified by ${r.wakesVerifiedAgents}/${n} agents`);
    if (r.acked !== n) bad.push(`run ${r.run}: acked ${r.acked}/${n}`);
    if (r.fetched !== n) bad.push(`run ${r.run}: fetched (200, signature checked) ${r.fetched}/${n}`);
    if (r.metricsAckedDelta < n) bad.push(`run ${r.run}: controller counted ${r.metricsAckedDelta} acks`);
    if (r.metricsFetch200Delta < n)
      bad.push(`run ${r.run}: controller answered ${r.metricsFetch200Delta} fetches with 200`);
  }
  // a crash run that had not delivered to every agent when its window closed is a missed goal
  // (reported), not a failed check: the changes are committed and still being delivered
  return bad;
}

/**
 * The controller dies right after committing a change to every node, before any wake-up left
 * (its push workers are stopped with SIGSTOP first, then everything gets SIGKILL). Started again
 * on the same database, it must reconnect every agent and deliver the change to each. The
 * change: a restart of the last run's cluster (every node's uninstall deployment is made, its
 * first revision the restart's). With `probe`, changes to single nodes are made while the fleet
 * reconnects, and their acks timed (bench/ack-probe.ts).
 */
export async function crashRun(
  bed: FanoutBed,
  n: number,
  nodes: string[],
  timeoutMs: number,
  problems: string[],
  probe?: AckProbeSpec,
): Promise<CrashRun> {
  const fleet = bed.fleet!;
  // the last run's cluster must be complete for a restart; keep it (not deleted)
  const c = bed.cluster;
  await fleet.hold(false);
  await fleet.release();
  let cluster = c;
  if (cluster !== null) {
    const id = cluster.id;
    await waitClusterComplete(bed.ctl.op, id, `cluster ${cluster.name} to finish`, n, 60_000 + n * 20).catch(
      (err: Error) => problems.push(`crash: ${err.message}`),
    );
  } else {
    const created = await bed.ctl.op.must<{ id: string }>(
      201,
      'POST',
      '/v1/clusters',
      { name: `fan${n}crash`, nodes, install_config_id: bed.configId, uninstall_config_id: bed.configId },
      120_000,
    );
    cluster = { id: created.id, name: `fan${n}crash` };
    bed.cluster = cluster;
    const id = created.id;
    await waitClusterComplete(bed.ctl.op, id, 'crash cluster to be created', n, 60_000 + n * 20).catch((err: Error) =>
      problems.push(`crash: ${err.message}`),
    );
  }
  // the probes' deployments made and signalled before the crash, their hooks not held
  const probes = probe
    ? await prepareAckProbe(bed, probe).catch((err: Error) => {
        problems.push(`crash: probes: ${err.message}`);
        return null;
      })
    : null;
  // the run's signals all answered before the crash: a signal whose answer the kill cut off would
  // be sent again in the window, and the window measures the pending change alone
  await fleet.settle(60_000).catch((err: Error) => problems.push(`crash: ${err.message}`));
  await bed.probeFleet?.settle(60_000).catch((err: Error) => problems.push(`crash: probe agents: ${err.message}`));
  await fleet.hold(true);
  const before = await fleet.counters();
  const workers = childrenOf(bed.ctl.pid);
  for (const p of workers) killQuietly(p, 'SIGSTOP');
  // the probe nodes behind too, so that the restarted controller dials them as it does the fleet
  if (probes)
    await pendAckProbes(bed.ctl, probes).catch((err: Error) => problems.push(`crash: probes: ${err.message}`));
  // (its first revision: a node's uninstall deployment is made by its first uninstall)
  await fleet.arm(`${cluster.name}-uninstall`, 1);
  await bed.ctl.op.must(204, 'PATCH', `/v1/clusters/${cluster.id}/actions/restart`, undefined, 120_000);
  const tKill = nowMs();
  bed.ctl.op.close();
  bed.ctl.proc.kill('SIGKILL');
  for (const p of workers) killQuietly(p);
  await exited(bed.ctl.proc);
  const o = bed.o;
  // --profile: the new controller and its push workers profile from their first line (they start
  // dialling at once), the harness processes from the moment it answers; all stop at the window's end
  const fromStart = `${path.sep}dist${path.sep}`;
  if (o.profile) process.env.HERALD_BENCH_PROFILE_FROM_START = fromStart;
  const ctl = await startController({
    pki: o.pki,
    dir: bed.dir,
    port: o.port,
    pushWorkers: o.pushWorkers,
    db: bed.ctl.db,
    extra: o.controllerExtra,
    // its push workers inherit its node flags, not its environment
    nodeArgs: o.profile ? profileFromStart(o.controllerNodeArgs ?? [], fromStart) : o.controllerNodeArgs,
    label: `controller-after-crash-${n}`,
  });
  delete process.env.HERALD_BENCH_PROFILE_FROM_START;
  bed.ctl = ctl;
  const tUp = nowMs();
  if (o.profile) for (const p of fleet.pids()) killQuietly(p, 'SIGUSR2');
  const tree0 = treeSample(ctl.pid);
  const cpu0 = tree0.cpuS;
  const harnessCpu = (): number => fleet.pids().reduce((a, pid) => a + treeSample(pid).cpuS, 0);
  const harnessCpu0 = harnessCpu();
  let tConnected = NaN;
  const connectedEvery5s: number[] = [];
  const sampler = setInterval(() => {
    ctl.op
      .metrics()
      .then((mm) => connectedEvery5s.push(metricSum(mm, 'herald_push_connected_agents') - bed.extra))
      .catch(() => undefined);
  }, 5_000);
  // not a check: how many were connected when the window closed is reported (metricsConnected)
  const connected = waitFor(
    'all agents connected again',
    async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n + bed.extra,
    timeoutMs,
    50,
  )
    .then(() => {
      tConnected = nowMs();
    })
    .catch(() => undefined);
  const prober = probes && bed.probeFleet ? startAckProbe(ctl, bed.probeFleet, probes) : null;
  const w = await fleet.waitRun(n, timeoutMs);
  const ackProbe = await prober?.stop();
  await connected;
  clearInterval(sampler);
  if (o.profile) {
    for (const p of [ctl.pid, ...childrenOf(ctl.pid), ...fleet.pids()]) killQuietly(p, 'SIGUSR2');
    await sleep(2_000);
  }
  const tree1 = treeSample(ctl.pid);
  const cpu1 = tree1.cpuS;
  const harnessCpu1 = harnessCpu();
  const reports = (await fleet.report()).slice(0, fleet.size);
  const after = await fleet.counters();
  const m = await ctl.op.metrics();
  const mine = new Set(nodes);
  const ours = reports.filter((r) => mine.has(r.node));
  const acks = ours
    .map((r) => r.tAck)
    .filter((t): t is number => t !== null)
    .map((t) => t - tUp);
  const fetches = ours
    .map((r) => r.tFetch)
    .filter((t): t is number => t !== null)
    .map((t) => t - tUp);
  return {
    restartMs: round(tUp - tKill, 1),
    connectAllMs: round(tConnected - tUp, 1),
    allAckedMs: round(dist(acks).max, 1),
    allFetchedMs: round(dist(fetches).max, 1),
    acked: acks.length,
    fetched: fetches.length,
    fetchedByPoll: ours.filter((r) => r.fetchWasPoll).length,
    metricsConnected: metricSum(m, 'herald_push_connected_agents') - bed.extra,
    controllerCpuS: round(cpu1 - cpu0, 2),
    controllerSplit: roundSplit(splitByProcess(tree0, tree1, ctl.pid)),
    harnessCpuS: round(harnessCpu1 - harnessCpu0, 2),
    dialFailures: dialFailuresOf(m),
    connectedEvery5s,
    reconnections: after.accepted - before.accepted,
    resumed: after.resumed - before.resumed,
    agentActivity: {
      polls: after.polls - before.polls,
      fetch200: after.fetch200 - before.fetch200,
      fetch304: after.fetch304 - before.fetch304,
      fetchErrors: after.fetchErrors - before.fetchErrors,
      runs: after.runs - before.runs,
      signals: after.signalsDelivered - before.signalsDelivered,
    },
    noneLost: fetches.length === n,
    timedOut: w.timedOut,
    ackLatency: histogramShares(m, 'herald_wake_ack_latency_seconds'),
    connectRefusals: countersByCode(m, 'herald_push_connect_refusals_total'),
    ...(ackProbe ? { ackProbe } : {}),
    harnessLoopDelayMaxMs: after.loopDelayMaxMs,
  };
}

function roundSplit(x: ProcessSplit): ProcessSplit {
  return {
    mainS: round(x.mainS, 3),
    mainSysS: round(x.mainSysS, 3),
    childrenS: round(x.childrenS, 3),
    childrenSysS: round(x.childrenSysS, 3),
  };
}

/** herald_push_dial_failures_total by its code label. */
function dialFailuresOf(m: Map<string, number>): Record<string, number> {
  return countersByCode(m, 'herald_push_dial_failures_total');
}

/** A counter's series by their `code` label (those above zero). */
function countersByCode(m: Map<string, number>, name: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of m) {
    if (!k.startsWith(`${name}{`)) continue;
    const code = /code="([^"]+)"/.exec(k)?.[1];
    if (code !== undefined && v > 0) out[code] = (out[code] ?? 0) + v;
  }
  return out;
}

type RunCore = Omit<
  FanoutRun,
  | 'connectAllMs'
  | 'agentsAdded'
  | 'controllerCpuConnectS'
  | 'controllerRssKb'
  | 'agentsConnected'
  | 'metricsConnected'
  | 'harnessWarns'
  | 'harnessLast'
>;

async function oneRun(bed: FanoutBed, nodes: string[], name: string, run: number, timeoutMs: number): Promise<RunCore> {
  const n = nodes.length;
  const ctl = bed.ctl;
  const fleet = bed.fleet!;
  const idle0 = treeSample(ctl.pid).cpuS;
  const idleT0 = nowMs();
  await sleep(FANOUT_IDLE_SAMPLE_MS);
  const idleCpuPerS = (treeSample(ctl.pid).cpuS - idle0) / ((nowMs() - idleT0) / 1000);
  const m0 = await ctl.op.metrics();
  const tree0 = treeSample(ctl.pid);
  const cpu0 = tree0.cpuS;
  const harness0 = fleet.pids().reduce((a, pid) => a + treeSample(pid).cpuS, 0);
  const tcp0 = tcpTroubles();
  await fleet.arm(`${name}-install`);
  const t0 = nowMs();
  // as a client creating a large cluster asks: the 201 without the members (~9 MB at 10,000)
  const created = await ctl.op.must<{ id: string }>(
    201,
    'POST',
    '/v1/clusters',
    { name, nodes, install_config_id: bed.configId, uninstall_config_id: bed.configId },
    120_000,
    { prefer: 'return=minimal' },
  );
  const tCommit = nowMs();
  bed.cluster = { id: created.id, name };
  const w = await fleet.waitRun(n, timeoutMs);
  const tree1 = treeSample(ctl.pid);
  const cpu1 = tree1.cpuS;
  const harness1 = fleet.pids().reduce((a, pid) => a + treeSample(pid).cpuS, 0);
  await sleep(100);
  const reports: AgentRunReport[] = await fleet.report();
  const m1 = await ctl.op.metrics();
  const acks = reports
    .map((r) => r.tAck)
    .filter((t): t is number => t !== null)
    .map((t) => t - t0);
  const fetches = reports
    .map((r) => r.tFetch)
    .filter((t): t is number => t !== null)
    .map((t) => t - t0);
  return {
    run,
    commitMs: round(tCommit - t0, 2),
    allAckedMs: round(dist(acks).max, 2),
    allFetchedMs: round(dist(fetches).max, 2),
    ackMs: roundDist(dist(acks)),
    fetchMs: roundDist(dist(fetches)),
    acked: acks.length,
    fetched: fetches.length,
    fetchedByPoll: reports.filter((r) => r.fetchWasPoll).length,
    wakesVerifiedAgents: reports.filter((r) => r.wakes > 0).length,
    controllerCpuS: round(cpu1 - cpu0, 2),
    controllerSplit: roundSplit(splitByProcess(tree0, tree1, ctl.pid)),
    controllerIdleCpuPerS: round(idleCpuPerS, 4),
    harnessCpuS: round(harness1 - harness0, 2),
    metricsAckedDelta: metricSum(m1, 'herald_wakeups_acked_total') - metricSum(m0, 'herald_wakeups_acked_total'),
    metricsFetch200Delta:
      metricSum(m1, 'herald_metadata_fetches_total', 'status="200"') -
      metricSum(m0, 'herald_metadata_fetches_total', 'status="200"'),
    timedOut: w.timedOut,
    tcp: diffCounters(tcp0, tcpTroubles()),
  };
}
