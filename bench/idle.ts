/**
 * Idle traffic per agent, counted on the wire: the loopback interface's own counters
 * (/proc/net/dev: IP bytes and packets), inside the benchmark's private network namespace so
 * that every byte on it is Herald's. Outside a namespace the host's loopback carries other
 * traffic too, and the figures are marked approximate.
 *
 * Two windows, each with M harness agents (the agent's own modules) and a real controller:
 * 1. push healthy, nothing to do, for one ping interval (30 s): the controller's WebSocket pings;
 *    the pings the agents received are counted (ws 'ping' events in the harness) and bytes per
 *    ping derived;
 *    1b. push healthy, polling every 8 s: each poll is a fetch frame and a signed 304 on the push
 *    connection (the agent closed its API connection when push became healthy);
 * 2. push off (nodes without an endpoint, agents that never announce one) polling every 8 s: each
 *    poll is a GET with If-None-Match and a signed 304 on the agent's kept-alive API connection
 *    (opened by its start-up fetch before the window; while push is down the agent keeps it and
 *    the API keeps idle connections 15 min, so at the real 30 s and 120 s intervals too). Bytes
 *    per poll = window bytes / polls.
 * Per agent-hour: push healthy = 120 pings + 6 polls of 1b (the 600 s healthy interval); push off =
 * 120 polls (30 s) or 30 polls (120 s). The intervals are shortened only to fill the window
 * with events; each event is the same bytes at any interval under the 15 min keep-alive.
 *
 * Window 1 opens 32 s after the last agent connected: the controller pings a connection first a
 * whole interval (30 s) after it opened, and the start-up connections' closes are over by then.
 * Window 2's agents have names no agent ever announced here, so nothing dials them.
 *
 * This phase only waits most of its time, so main.ts runs windows 1 and 2 in child processes in
 * network namespaces of their own, beside the fan-out and restart phases.
 *
 * The agent footprint is a part of its own (`footprint`), which main.ts runs last and alone, with
 * nothing else of the benchmark running (in its own namespace too): a real `herald agent`
 * connected to a controller, that never gets work, left alone for a warm-up after its push
 * connection (its start-up, the first GCs and V8's idle-time shrinking are over by then), then
 * sampled from /proc over a window of FOOTPRINT_WINDOW_S (full runs; shorter with --quick). The
 * window's length, the load average at both ends and how busy the whole machine was in it are
 * reported with the figures: a figure from a busy machine says so.
 */
import fs from 'node:fs';
import path from 'node:path';
import { PING_INTERVAL_MS, POLL_INTERVAL_HEALTHY_MS } from '../protocol/limits.js';
import { metricSum } from './api-client.js';
import { Fleet } from './fleet.js';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc, type ControllerProc } from './procs.js';
import {
  byThreadText,
  loadAvg,
  loCounters,
  procSample,
  round,
  say,
  sleep,
  threadCpuDelta,
  threadSamples,
  type ThreadCpu,
  waitFor,
} from './util.js';

export interface FootprintResult {
  /** A `herald agent` that never got work: RSS at the end of the window (and the most seen). */
  freshRssKb: number;
  freshRssMaxKb: number;
  /** CPU seconds per hour while idle, push healthy, from schedstat over `windowS`. */
  freshCpuSPerHour: number;
  windowS: number;
  /** Seconds between the push connection and the window's start. */
  warmupS: number;
  /** /proc/loadavg (1, 5, 15 min) when the window opened and when it closed. */
  loadAvgStart: number[];
  loadAvgEnd: number[];
  /** The whole machine's CPU in the window (/proc/stat, every core), % busy: the agent's, its controller's and anything else's. */
  machineBusyPct: number;
  pushConnected: boolean;
  /** The latency agent after running its hooks (execa and the hook runner loaded); latency.ts. */
  afterHooksRssKb: number;
  /** Its hook launcher's RSS then (agent/hooks/launcher.ts); absent in results before 2026-12-06. */
  launcherRssKb?: number;
  /**
   * The window's CPU by kind of thread (the main thread's wake-ups against V8's collector and
   * compiler threads and libuv's pool), most first; absent in results before 2026-12-06 10:00 UTC.
   */
  byThread?: ThreadCpu[];
}

export interface TrafficResult {
  exact: boolean;
  agents: number;
  ping: {
    windowS: number;
    bytes: number;
    packets: number;
    pings: number;
    polls: number;
    bytesPerPing: number;
    packetsPerPing: number;
    /**
     * Window 1b: push healthy, polling every 8 s; each poll is a fetch frame and a signed 304 on
     * the push connection (absent in older results: a poll was an HTTPS request then).
     */
    pushPoll?: {
      windowS: number;
      bytes: number;
      packets: number;
      polls: number;
      overPush: number;
      bytesPerPoll: number;
    };
  };
  poll: {
    windowS: number;
    bytes: number;
    packets: number;
    polls: number;
    bytesPerPoll: number;
    packetsPerPoll: number;
    status304: number;
  };
  perAgentHourBytes: { pushHealthy: number; pushOff30s: number; pushOff120s: number };
}

export interface IdleResult {
  traffic: TrafficResult | null;
  footprint: FootprintResult | null;
  problems: string[];
}

/** What one part of the phase measured (main.ts runs the parts side by side and combines them). */
export interface IdlePart {
  exact: boolean;
  agents: number;
  ping?: TrafficResult['ping'];
  poll?: TrafficResult['poll'];
  footprint?: FootprintResult;
  problems: string[];
}

/**
 * Bytes an hour of one idle agent whose push connection is healthy: a ping exchange every
 * `pingIntervalMs` (PING_INTERVAL_MS, the controller's; AGENT_DIAL_PING_INTERVAL_MS dialling out)
 * and a poll every POLL_INTERVAL_HEALTHY_MS, over the push connection when window 1b measured it,
 * else at `pollFallbackBytes` (an HTTPS poll).
 */
export function pushHealthyBytesPerHour(
  ping: Pick<TrafficResult['ping'], 'bytesPerPing' | 'pushPoll'>,
  pollFallbackBytes: number,
  pingIntervalMs: number,
): number {
  const hourMs = 3_600_000;
  const poll = ping.pushPoll?.bytesPerPoll ?? pollFallbackBytes;
  return Math.round((hourMs / pingIntervalMs) * ping.bytesPerPing + (hourMs / POLL_INTERVAL_HEALTHY_MS) * poll);
}

export function combineIdle(parts: IdlePart[]): IdleResult {
  const ping = parts.find((x) => x.ping)?.ping;
  const poll = parts.find((x) => x.poll)?.poll;
  const footprint = parts.find((x) => x.footprint)?.footprint ?? null;
  const problems = parts.flatMap((x) => x.problems);
  if (!ping || !poll) return { traffic: null, footprint, problems };
  return {
    traffic: {
      exact: parts.every((x) => x.exact),
      agents: parts[0]!.agents,
      ping,
      poll,
      perAgentHourBytes: {
        // the healthy interval's polls go over the push connection (window 1b)
        pushHealthy: pushHealthyBytesPerHour(ping, poll.bytesPerPoll, PING_INTERVAL_MS),
        pushOff30s: Math.round(120 * poll.bytesPerPoll),
        pushOff120s: Math.round(30 * poll.bytesPerPoll),
      },
    },
    footprint,
    problems,
  };
}

export interface IdleOptions {
  pki: BenchPki;
  runDir: string;
  port: number;
  quick: boolean;
  exactLo: boolean;
  /**
   * `push` only: the agents dial out to the controller's connect listener at this port (docs/dial-out.md),
   * so the pings are theirs and the controller's pongs answer them; counted as pongs.
   */
  dialOutPort?: number;
  /** `push`: window 1; `poll`: window 2; `footprint`: the idle agent alone. Each in a namespace of its own. */
  part: 'push' | 'poll' | 'footprint';
}

export async function idlePhase(o: IdleOptions): Promise<IdlePart> {
  const dir = path.join(o.runDir, `idle-${o.part}${o.dialOutPort === undefined ? '' : '-dial-out'}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const problems: string[] = [];
  const m = o.quick ? 100 : 200;
  // one whole ping interval: start-up connections open within seconds of each other, so their
  // pings come in clusters, and only a full interval holds exactly one per connection
  const w1 = 30;
  const w2 = o.quick ? 8 : 16;
  const out: IdlePart = { exact: o.exactLo, agents: m, problems };
  const ctl = await startController({
    pki: o.pki,
    dir,
    port: o.port,
    ...(o.dialOutPort === undefined ? {} : { extra: ['--connect-listen', `127.0.0.1:${o.dialOutPort}`] }),
  });
  try {
    if (o.part === 'footprint') await footprintWindow(o, ctl, dir, out);
    else if (!loCounters()) throw new Error('no loopback counters in /proc/net/dev');
    else if (o.part === 'push') await pushWindow(o, ctl, dir, m, w1, out);
    else await pollWindow(o, ctl, dir, m, w2, out);
  } catch (err) {
    problems.push((err as Error).message);
  } finally {
    await stopController(ctl);
  }
  fs.rmSync(path.join(dir, 'agents'), { recursive: true, force: true });
  return out;
}

/**
 * Window 1: push healthy, pings only. Dialling out, the agents ping (every
 * AGENT_DIAL_PING_INTERVAL_MS, first that long after their connection opened, as the controller
 * pings a connection it dialled) and the controller only answers: the pongs are counted.
 */
async function pushWindow(
  o: IdleOptions,
  ctl: ControllerProc,
  dir: string,
  m: number,
  w1: number,
  out: IdlePart,
): Promise<void> {
  const problems = out.problems;
  const slots = Array.from({ length: m }, (_, i) => slot('b', i));
  const dialOut = o.dialOutPort === undefined ? {} : { dialOut: `wss://127.0.0.1:${o.dialOutPort}/v1/connect` };
  const pingsOf = (c: { pings: number; pongs: number }): number => (o.dialOutPort === undefined ? c.pings : c.pongs);
  const a = await Fleet.start({
    pki: o.pki,
    slots,
    controllerUrl: ctl.url,
    stateRoot: path.join(dir, 'agents'),
    hook: 'noop',
    procs: 1,
    ...dialOut,
  });
  await waitFor(
    `${m} agents connected`,
    async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= m,
    60_000,
    200,
  );
  await sleep(32_000);
  const c0 = await a.fleet.counters();
  const l0 = loCounters()!;
  await sleep(w1 * 1000);
  const l1 = loCounters()!;
  const c1 = await a.fleet.counters();
  await a.fleet.stop();
  const pings = pingsOf(c1) - pingsOf(c0);
  const polls1 = c1.polls - c0.polls;
  if (polls1 !== 0) problems.push(`${polls1} polls fell into the ping window`);
  if (pings === 0) problems.push('no ping in the ping window');
  const share = Math.max(1, pings);
  out.ping = {
    windowS: w1,
    bytes: l1.bytes - l0.bytes,
    packets: l1.packets - l0.packets,
    pings,
    polls: polls1,
    bytesPerPing: round((l1.bytes - l0.bytes) / share, 1),
    packetsPerPing: round((l1.packets - l0.packets) / share, 2),
  };
  say(`idle traffic: ${pings} pings, ${out.ping.bytes} B in ${w1} s → ${out.ping.bytesPerPing} B per ping`);

  // 1b: push healthy, polls every 8 s over the push connection, in the 30 s before the first ping
  const pollers = Array.from({ length: m }, (_, i) => slot('b', 2 * m + i));
  const c = await Fleet.start({
    pki: o.pki,
    slots: pollers,
    controllerUrl: ctl.url,
    stateRoot: path.join(dir, 'agents-1b'),
    hook: 'noop',
    procs: 1,
    pollIntervalMs: 8_000,
    pollIntervalHealthyMs: 8_000,
    ...dialOut,
  });
  await waitFor(
    `${m} polling agents connected`,
    async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= m,
    60_000,
    200,
  );
  await waitFor('start-up fetches', async () => (await c.fleet.counters()).fetch200 >= m, 30_000, 200);
  // the start-up's API connections close as push becomes healthy; a first poll has come by then
  await sleep(9_000);
  const e0 = await c.fleet.counters();
  // the channel check compares counts of one scrape with counts of the same scrape: the agents'
  // own counters and the controller's are read moments apart, and a poll answered in between
  // was counted by one side only (a check that failed once so, 2026-12-04 08:37 UTC)
  const m0 = await ctl.op.metrics();
  const j0 = loCounters()!;
  const w1b = 16;
  await sleep(w1b * 1000);
  const j1 = loCounters()!;
  const e1 = await c.fleet.counters();
  const m1 = await ctl.op.metrics();
  await c.fleet.stop();
  const answered = (m: Map<string, number>, channel?: string): number =>
    metricSum(m, 'herald_metadata_fetches_total', channel === undefined ? undefined : `channel="${channel}"`);
  const p0 = answered(m0, 'push');
  const p1 = answered(m1, 'push');
  const allAnswered = answered(m1) - answered(m0);
  const polls = e1.fetch304 + e1.fetch200 - e0.fetch304 - e0.fetch200;
  const pingBytes = (pingsOf(e1) - pingsOf(e0)) * out.ping.bytesPerPing;
  out.ping.pushPoll = {
    windowS: w1b,
    bytes: j1.bytes - j0.bytes,
    packets: j1.packets - j0.packets,
    polls,
    overPush: p1 - p0,
    bytesPerPoll: round((j1.bytes - j0.bytes - pingBytes) / Math.max(1, polls), 1),
  };
  if (polls === 0) problems.push('no poll in the push-healthy poll window');
  if (p1 - p0 < allAnswered)
    problems.push(
      `${allAnswered - (p1 - p0)} of ${allAnswered} push-healthy polls did not go over the push connection`,
    );
  say(
    `idle traffic: push healthy, ${polls} polls (${p1 - p0} over the push connection), ${out.ping.pushPoll.bytes} B in ${w1b} s → ${out.ping.pushPoll.bytesPerPoll} B per poll`,
  );
}

/** The footprint window (full runs): at least 300 s, so a few pings and V8's idle work average out. */
const FOOTPRINT_WINDOW_S = 300;
const FOOTPRINT_WINDOW_QUICK_S = 60;
/** From the push connection to the window: start-up, its GCs and V8's memory reducer are over. */
const FOOTPRINT_WARMUP_S = 60;
const FOOTPRINT_WARMUP_QUICK_S = 30;

/** Busy and total jiffies of the whole machine (/proc/stat's first line). */
function machineJiffies(): { busy: number; total: number } | null {
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
    const total = f.reduce((x, y) => x + y, 0);
    // idle and iowait
    return { busy: total - f[3]! - (f[4] ?? 0), total };
  } catch {
    return null;
  }
}

/** A real idle `herald agent`, alone: warm-up after its push connection, then the window. */
async function footprintWindow(o: IdleOptions, ctl: ControllerProc, dir: string, out: IdlePart): Promise<void> {
  const foot = slot('l', 0);
  const window = o.quick ? FOOTPRINT_WINDOW_QUICK_S : FOOTPRINT_WINDOW_S;
  const warmup = o.quick ? FOOTPRINT_WARMUP_QUICK_S : FOOTPRINT_WARMUP_S;
  const footProc = startAgentProc({
    pki: o.pki,
    node: foot.node,
    controllerUrl: ctl.url,
    listen: `${foot.ip}:${foot.port}`,
    stateDir: path.join(dir, 'state-foot'),
    logFile: path.join(dir, 'agent-foot.log'),
  });
  const fp: FootprintResult = {
    freshRssKb: NaN,
    freshRssMaxKb: NaN,
    freshCpuSPerHour: NaN,
    windowS: 0,
    warmupS: warmup,
    loadAvgStart: [],
    loadAvgEnd: [],
    machineBusyPct: NaN,
    pushConnected: false,
    afterHooksRssKb: NaN,
  };
  out.footprint = fp;
  // the most seen, over the window only: the start-up's peak is not the idle agent's
  let sampling = false;
  const sampler = setInterval(() => {
    const x = sampling && footProc.pid ? procSample(footProc.pid) : null;
    if (x) fp.freshRssMaxKb = Number.isFinite(fp.freshRssMaxKb) ? Math.max(fp.freshRssMaxKb, x.rssKb) : x.rssKb;
  }, 1_000);
  try {
    await waitFor(
      'the footprint agent push-connected',
      async () => {
        const r = await ctl.op.request<{ push?: { connected?: boolean } }>('GET', `/v1/nodes/${foot.node}`);
        return r.json?.push?.connected === true;
      },
      30_000,
      100,
    );
    fp.pushConnected = true;
    say(`idle footprint: ${warmup} s warm-up, then a ${window} s window with nothing else running`);
    await sleep(warmup * 1000);
    const x0 = footProc.pid ? procSample(footProc.pid) : null;
    const th0 = footProc.pid ? threadSamples(footProc.pid) : null;
    const j0 = machineJiffies();
    const t0 = Date.now();
    fp.loadAvgStart = loadAvg();
    sampling = true;
    await sleep(window * 1000);
    const x1 = footProc.pid ? procSample(footProc.pid) : null;
    const th1 = footProc.pid ? threadSamples(footProc.pid) : null;
    const j1 = machineJiffies();
    fp.loadAvgEnd = loadAvg();
    if (!x0 || !x1) throw new Error('the footprint agent is gone');
    const w = (Date.now() - t0) / 1000;
    fp.windowS = round(w, 1);
    fp.freshRssKb = x1.rssKb;
    fp.freshRssMaxKb = Math.max(Number.isFinite(fp.freshRssMaxKb) ? fp.freshRssMaxKb : 0, x1.rssKb);
    fp.freshCpuSPerHour = round((((x1.cpuPreciseS ?? x1.cpuS) - (x0.cpuPreciseS ?? x0.cpuS)) * 3600) / w, 3);
    if (th0 && th1) fp.byThread = threadCpuDelta(th0, th1);
    if (j0 && j1 && j1.total > j0.total)
      fp.machineBusyPct = round((100 * (j1.busy - j0.busy)) / (j1.total - j0.total), 1);
    say(
      `idle footprint: ${round(fp.freshRssKb / 1024, 1)} MB RSS, ${fp.freshCpuSPerHour} CPU-s per hour over ${fp.windowS} s (load ${fp.loadAvgStart.join(' ')} → ${fp.loadAvgEnd.join(' ')}, machine ${fp.machineBusyPct} % busy; by thread: ${byThreadText(fp.byThread)})`,
    );
  } finally {
    clearInterval(sampler);
    await stopProc(footProc, 'SIGTERM', 5_000);
  }
}

/** Window 2: push off, polling every 8 s. */
async function pollWindow(
  o: IdleOptions,
  ctl: ControllerProc,
  dir: string,
  m: number,
  w2: number,
  out: IdlePart,
): Promise<void> {
  // nodes an operator added without an endpoint, whose agents never announce one: nothing
  // dials them, and their metadata exists to be polled
  const quiet = Array.from({ length: m }, (_, i) => slot('b', m + i));
  for (const q of quiet) await ctl.op.must(201, 'POST', '/v1/nodes', { id: q.node });
  const b = await Fleet.start({
    pki: o.pki,
    slots: quiet,
    controllerUrl: ctl.url,
    stateRoot: path.join(dir, 'agents'),
    hook: 'noop',
    procs: 1,
    announce: false,
    pollIntervalMs: 8_000,
    pollIntervalHealthyMs: 8_000,
  });
  await waitFor('start-up fetches', async () => (await b.fleet.counters()).fetch200 >= m, 30_000, 200);
  await sleep(9_000);
  const d0 = await b.fleet.counters();
  const k0 = loCounters()!;
  await sleep(w2 * 1000);
  const k1 = loCounters()!;
  const d1 = await b.fleet.counters();
  await b.fleet.stop();
  // the exchanges the window saw answered (a poll that began before the window and ended in it
  // counts; one that began in it and ended after does not): the bytes on the wire are theirs
  const polls = d1.fetch304 + d1.fetch200 - d0.fetch304 - d0.fetch200;
  out.poll = {
    windowS: w2,
    bytes: k1.bytes - k0.bytes,
    packets: k1.packets - k0.packets,
    polls,
    bytesPerPoll: round((k1.bytes - k0.bytes) / Math.max(1, polls), 1),
    packetsPerPoll: round((k1.packets - k0.packets) / Math.max(1, polls), 2),
    status304: d1.fetch304 - d0.fetch304,
  };
  if (polls === 0) out.problems.push('no poll in the poll window');
  say(
    `idle traffic: ${polls} polls (${out.poll.status304} answered 304), ${out.poll.bytes} B in ${w2} s → ${out.poll.bytesPerPoll} B per poll`,
  );
}
