/**
 * Fan-out: N simulated agents (the agent's own modules, in several harness processes) beside a
 * real controller process. One change to every node: one `POST /v1/clusters` naming all N nodes
 * (one operator request, one transaction, one wake-up per node). Per run: time from the request
 * to every agent having acked its wake-up and to every agent holding the new metadata (a 200
 * whose signature, nonce, audience and digest it checked).
 *
 * Every run starts from scratch (a new controller database, N new agents): a node belongs to one
 * cluster at a time, and completing a cluster operation costs the controller O(N) per signal
 * (see the findings in BENCHMARKS.md), so a cluster cannot be reused cheaply between runs.
 * The hooks of these runs are held (a no-op that ends when the agents stop), so no signal
 * reaches the controller inside a measuring window; hooks are timed in latency.ts.
 *
 * Crash run: the controller commits a change to every node and dies (SIGKILL) before any
 * wake-up went out; started again on the same database it must reconnect all N agents and
 * deliver the change to each one: the time to do so, and whether any was lost.
 */
import fs from 'node:fs';
import path from 'node:path';
import { metricSum } from './api-client.js';
import { Fleet } from './fleet.js';
import type { AgentRunReport } from './harness.js';
import { slot, type BenchPki } from './pki-cache.js';
import { exited, startController, stopController, type ControllerProc } from './procs.js';
import { childrenOf, diffCounters, dist, nowMs, round, say, sleep, tcpTroubles, treeSample, waitFor, type Dist } from './util.js';

export interface FanoutRun {
  run: number;
  /** Setup of this run: N fresh agents started, until the controller's gauge showed N connected. */
  connectAllMs: number;
  controllerCpuConnectS: number;
  controllerRssKb: { baseline: number; connected: number; perAgent: number };
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
  /** Every agent got the change committed before the crash: nothing lost. */
  noneLost: boolean;
  timedOut: boolean;
}

export interface FanoutResult {
  n: number;
  harnessProcs: number;
  pushWorkers: number | 'default';
  runs: FanoutRun[];
  crash: CrashRun | null;
  checksOk: boolean;
  problems: string[];
}

export interface FanoutOptions {
  pki: BenchPki;
  runDir: string;
  port: number;
  n: number;
  runs: number;
  pushWorkers?: number | undefined;
  crash: boolean;
  harnessExecArgv?: string[];
  controllerExtra?: string[];
  controllerNodeArgs?: string[] | undefined;
  /** Bracket each measured window with SIGUSR2 to every process (see prof-preload.ts). */
  profile?: boolean;
}

export function harnessProcsFor(n: number): number {
  if (n <= 200) return 1;
  if (n <= 2000) return 2;
  return Math.min(4, Math.ceil(n / 2500));
}

interface Setup {
  ctl: ControllerProc;
  fleet: Fleet;
  dir: string;
  connectAllMs: number;
  cpuConnectS: number;
  rss: { baseline: number; connected: number; perAgent: number };
  agentsConnected: number;
  metricsConnected: number;
  configId: string;
}

/** A fresh controller (new database) and N fresh agents, all connected and past their first fetch. */
async function setUp(o: FanoutOptions, label: string, problems: string[]): Promise<Setup> {
  const dir = path.join(o.runDir, `fanout-${o.n}`, label);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const n = o.n;
  const ctl = await startController({ pki: o.pki, dir, port: o.port, pushWorkers: o.pushWorkers, extra: o.controllerExtra, nodeArgs: o.controllerNodeArgs });
  await sleep(300);
  const base = treeSample(ctl.pid);
  const slots = Array.from({ length: n }, (_, i) => slot('b', i));
  const t0 = Date.now();
  const { fleet, failed } = await Fleet.start({
    pki: o.pki, slots, controllerUrl: ctl.url, stateRoot: path.join(dir, 'agents'), hook: 'hold', procs: harnessProcsFor(n), execArgv: o.harnessExecArgv,
  });
  if (failed.length > 0) problems.push(`${label}: ${failed.length} agents failed to start: ${failed.slice(0, 3).join('; ')}`);
  await waitFor(`${n} agents connected`, async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n, 60_000 + n * 15, 200)
    .catch((err: Error) => problems.push(`${label}: ${err.message}`));
  const connectAllMs = Date.now() - t0;
  // not a check: an agent whose start-up fetch is still retrying (its first one raced its
  // announcement) fetches on its wake-up like any other
  await waitFor('start-up fetches', async () => (await fleet.counters()).fetch200 >= n, 30_000, 200).catch(() => undefined);
  await sleep(n >= 5000 ? 3_000 : 500);
  const connected = treeSample(ctl.pid);
  const c0 = await fleet.counters();
  const m0 = await ctl.op.metrics();
  const cfg = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', { name: 'fanout', group: 'script', config: '#!/bin/sh\ntrue\n' });
  say(`fan-out N=${n} ${label}: ${c0.agentsConnected} agents connected (controller: ${metricSum(m0, 'herald_push_connected_agents')}) in ${connectAllMs} ms`);
  return {
    ctl, fleet, dir, connectAllMs, cpuConnectS: round(connected.cpuS - base.cpuS, 2),
    rss: { baseline: base.rssKb, connected: connected.rssKb, perAgent: round((connected.rssKb - base.rssKb) / n, 1) },
    agentsConnected: c0.agentsConnected, metricsConnected: metricSum(m0, 'herald_push_connected_agents'), configId: cfg.id,
  };
}

async function tearDown(s: Setup): Promise<void> {
  // SIGKILL first: the held hooks end when the agents stop, and their signals should find no one
  await stopController(s.ctl, 'SIGKILL');
  for (const p of childrenOf(s.ctl.pid)) killQuietly(p);
  await s.fleet.stop();
  fs.rmSync(path.join(s.dir, 'agents'), { recursive: true, force: true });
}

function killQuietly(pid: number, sig: NodeJS.Signals = 'SIGKILL'): void {
  try {
    process.kill(pid, sig);
  } catch {
    // gone
  }
}

export async function fanout(o: FanoutOptions): Promise<FanoutResult> {
  const problems: string[] = [];
  const n = o.n;
  const nodes = Array.from({ length: n }, (_, i) => slot('b', i).node);
  const result: FanoutResult = { n, harnessProcs: harnessProcsFor(n), pushWorkers: o.pushWorkers ?? 'default', runs: [], crash: null, checksOk: false, problems };
  const runTimeout = 60_000 + n * 10;
  for (let r = 1; r <= o.runs; r++) {
    const s = await setUp(o, `run-${r}`, problems);
    try {
      const profiled = o.profile ? [s.ctl.pid, ...childrenOf(s.ctl.pid), ...s.fleet.pids()] : [];
      for (const p of profiled) killQuietly(p, 'SIGUSR2');
      const run = await oneRun(s.ctl, s.fleet, nodes, s.configId, `fan${r}`, r, runTimeout);
      for (const p of profiled) killQuietly(p, 'SIGUSR2');
      if (profiled.length) await sleep(2_000);
      const c = await s.fleet.counters();
      result.runs.push({
        ...run, connectAllMs: s.connectAllMs, controllerCpuConnectS: s.cpuConnectS, controllerRssKb: s.rss, agentsConnected: s.agentsConnected,
        metricsConnected: s.metricsConnected, harnessWarns: c.warns, harnessLast: c.lastLog.slice(-4),
      });
      say(`fan-out N=${n} run ${r}: commit ${round(run.commitMs)} ms, all acked ${round(run.allAckedMs)} ms, all fetched ${round(run.allFetchedMs)} ms${run.timedOut ? ' (TIMED OUT)' : ''}`);
    } finally {
      await tearDown(s);
    }
  }
  if (o.crash) {
    const s = await setUp(o, 'crash', problems);
    try {
      result.crash = await crashRun(o, s, nodes, runTimeout, problems);
      say(`fan-out N=${n} crash: restarted in ${result.crash.restartMs} ms, all connected ${round(result.crash.connectAllMs)} ms, all fetched ${round(result.crash.allFetchedMs)} ms after`);
    } finally {
      await tearDown(s);
    }
  }
  // the checks the issue asks for: for this N, all connected, all verified, all fetched (200, checked)
  const bad: string[] = [];
  for (const r of result.runs) {
    if (r.agentsConnected !== n) bad.push(`run ${r.run}: agents connected ${r.agentsConnected}/${n}`);
    if (r.metricsConnected !== n) bad.push(`run ${r.run}: controller connected gauge ${r.metricsConnected}/${n}`);
    if (r.wakesVerifiedAgents !== n) bad.push(`run ${r.run}: wake-ups verified by ${r.wakesVerifiedAgents}/${n} agents`);
    if (r.acked !== n) bad.push(`run ${r.run}: acked ${r.acked}/${n}`);
    if (r.fetched !== n) bad.push(`run ${r.run}: fetched (200, signature checked) ${r.fetched}/${n}`);
    if (r.metricsAckedDelta < n) bad.push(`run ${r.run}: controller counted ${r.metricsAckedDelta} acks`);
    if (r.metricsFetch200Delta < n) bad.push(`run ${r.run}: controller answered ${r.metricsFetch200Delta} fetches with 200`);
  }
  if (result.crash && !result.crash.noneLost) bad.push(`after the crash: acked ${result.crash.acked}/${n}, fetched ${result.crash.fetched}/${n}`);
  if (result.crash && result.crash.metricsConnected !== n) bad.push(`after the crash: connected gauge ${result.crash.metricsConnected}/${n}`);
  problems.push(...bad);
  result.checksOk = bad.length === 0;
  return result;
}

/**
 * The controller dies right after committing a change to every node, before any wake-up left
 * (its push workers are stopped with SIGSTOP first, then everything gets SIGKILL). Started again
 * on the same database, it must reconnect every agent and deliver the change to each.
 */
async function crashRun(o: FanoutOptions, s: Setup, nodes: string[], timeoutMs: number, problems: string[]): Promise<CrashRun> {
  const n = nodes.length;
  const workers = childrenOf(s.ctl.pid);
  for (const p of workers) killQuietly(p, 'SIGSTOP');
  await s.fleet.arm('fancrash-install');
  await s.ctl.op.must(201, 'POST', '/v1/clusters', { name: 'fancrash', nodes, install_config_id: s.configId, uninstall_config_id: s.configId }, 120_000);
  const tKill = nowMs();
  s.ctl.op.close();
  s.ctl.proc.kill('SIGKILL');
  for (const p of workers) killQuietly(p);
  await exited(s.ctl.proc);
  const ctl = await startController({ pki: o.pki, dir: s.dir, port: o.port, pushWorkers: o.pushWorkers, db: s.ctl.db, extra: o.controllerExtra, label: 'controller-2' });
  s.ctl = ctl;
  const tUp = nowMs();
  const cpu0 = treeSample(ctl.pid).cpuS;
  let tConnected = NaN;
  const connected = waitFor('all agents connected again', async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n, timeoutMs, 50)
    .then(() => {
      tConnected = nowMs();
    })
    .catch((err: Error) => problems.push(`crash: ${err.message}`));
  const w = await s.fleet.waitRun(n, timeoutMs);
  await connected;
  const cpu1 = treeSample(ctl.pid).cpuS;
  const reports = await s.fleet.report();
  const m = await ctl.op.metrics();
  const acks = reports.map((r) => r.tAck).filter((t): t is number => t !== null).map((t) => t - tUp);
  const fetches = reports.map((r) => r.tFetch).filter((t): t is number => t !== null).map((t) => t - tUp);
  return {
    restartMs: round(tUp - tKill, 1),
    connectAllMs: round(tConnected - tUp, 1),
    allAckedMs: round(dist(acks).max, 1),
    allFetchedMs: round(dist(fetches).max, 1),
    acked: acks.length,
    fetched: fetches.length,
    fetchedByPoll: reports.filter((r) => r.fetchWasPoll).length,
    metricsConnected: metricSum(m, 'herald_push_connected_agents'),
    controllerCpuS: round(cpu1 - cpu0, 2),
    noneLost: fetches.length === n,
    timedOut: w.timedOut,
  };
}

type RunCore = Omit<FanoutRun, 'connectAllMs' | 'controllerCpuConnectS' | 'controllerRssKb' | 'agentsConnected' | 'metricsConnected' | 'harnessWarns' | 'harnessLast'>;

async function oneRun(ctl: ControllerProc, fleet: Fleet, nodes: string[], configId: string, name: string, run: number, timeoutMs: number): Promise<RunCore> {
  const n = nodes.length;
  const m0 = await ctl.op.metrics();
  const cpu0 = treeSample(ctl.pid).cpuS;
  const tcp0 = tcpTroubles();
  await fleet.arm(`${name}-install`);
  const t0 = nowMs();
  await ctl.op.must(201, 'POST', '/v1/clusters', { name, nodes, install_config_id: configId, uninstall_config_id: configId }, 120_000);
  const tCommit = nowMs();
  const w = await fleet.waitRun(n, timeoutMs);
  const cpu1 = treeSample(ctl.pid).cpuS;
  await sleep(100);
  const reports: AgentRunReport[] = await fleet.report();
  const m1 = await ctl.op.metrics();
  const acks = reports.map((r) => r.tAck).filter((t): t is number => t !== null).map((t) => t - t0);
  const fetches = reports.map((r) => r.tFetch).filter((t): t is number => t !== null).map((t) => t - t0);
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
    metricsAckedDelta: metricSum(m1, 'herald_wakeups_acked_total') - metricSum(m0, 'herald_wakeups_acked_total'),
    metricsFetch200Delta: metricSum(m1, 'herald_metadata_fetches_total', 'status="200"') - metricSum(m0, 'herald_metadata_fetches_total', 'status="200"'),
    timedOut: w.timedOut,
    tcp: diffCounters(tcp0, tcpTroubles()),
  };
}

function roundDist(d: Dist): Dist {
  return { n: d.n, p50: round(d.p50, 2), p99: round(d.p99, 2), min: round(d.min, 2), max: round(d.max, 2), mean: round(d.mean, 2) };
}
