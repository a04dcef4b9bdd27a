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
 * 2. push off (nodes without an endpoint, agents that never announce one) polling every 8 s: each
 *    poll is a GET with If-None-Match and a signed 304 on the agent's kept-alive API connection
 *    (opened by its start-up fetch before the window; the API keeps idle connections 15 min, so
 *    at the real 30 s, 120 s and 600 s intervals too). Bytes per poll = window bytes / polls.
 * Per agent-hour: push healthy = 120 pings + 6 polls (the 600 s healthy interval); push off =
 * 120 polls (30 s) or 30 polls (120 s). The intervals are shortened only to fill the window
 * with events; each event is the same bytes at any interval under the 15 min keep-alive.
 *
 * Window 1 opens 32 s after the last agent connected: the controller pings a connection first a
 * whole interval (30 s) after it opened, and the start-up connections' closes are over by then.
 * Window 2's agents have names no agent ever announced here, so nothing dials them.
 *
 * The agent footprint is measured here too: a real `herald agent` connected to this controller
 * that never gets work, sampled from /proc over window 1 and, in full runs, 90 s more.
 *
 * This phase only waits most of its time, so main.ts runs it in a child process in a network
 * namespace of its own, beside the fan-out and restart phases.
 */
import fs from 'node:fs';
import path from 'node:path';
import { metricSum } from './api-client.js';
import { Fleet } from './fleet.js';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc, type ControllerProc } from './procs.js';
import { loCounters, procSample, round, say, sleep, waitFor } from './util.js';

export interface FootprintResult {
  /** A `herald agent` that never got work: RSS at the end of the window (and the most seen). */
  freshRssKb: number;
  freshRssMaxKb: number;
  /** CPU seconds per hour while idle, push healthy, from schedstat over `windowS`. */
  freshCpuSPerHour: number;
  windowS: number;
  pushConnected: boolean;
  /** The latency agent after running its hooks (execa and the hook runner loaded); latency.ts. */
  afterHooksRssKb: number;
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
        pushHealthy: Math.round(120 * ping.bytesPerPing + 6 * poll.bytesPerPoll),
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
  /** `push`: window 1 and the footprint; `poll`: window 2. Each in a namespace of its own. */
  part: 'push' | 'poll';
}

export async function idlePhase(o: IdleOptions): Promise<IdlePart> {
  const dir = path.join(o.runDir, `idle-${o.part}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const problems: string[] = [];
  const m = o.quick ? 100 : 200;
  // one whole ping interval: start-up connections open within seconds of each other, so their
  // pings come in clusters, and only a full interval holds exactly one per connection
  const w1 = 30;
  const w2 = o.quick ? 8 : 16;
  const out: IdlePart = { exact: o.exactLo, agents: m, problems };
  const ctl = await startController({ pki: o.pki, dir, port: o.port });
  try {
    if (!loCounters()) throw new Error('no loopback counters in /proc/net/dev');
    if (o.part === 'push') await pushWindow(o, ctl, dir, m, w1, out);
    else await pollWindow(o, ctl, dir, m, w2, out);
  } catch (err) {
    problems.push((err as Error).message);
  } finally {
    await stopController(ctl);
  }
  fs.rmSync(path.join(dir, 'agents'), { recursive: true, force: true });
  return out;
}

/** Full runs: the footprint agent is sampled this much longer than the 30 s ping window. */
const FOOTPRINT_EXTRA_MS = 90_000;

/** Window 1 (push healthy, pings only) and the footprint of a real idle agent. */
async function pushWindow(
  o: IdleOptions,
  ctl: ControllerProc,
  dir: string,
  m: number,
  w1: number,
  out: IdlePart,
): Promise<void> {
  const problems = out.problems;
  const foot = slot('l', 0);
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
    pushConnected: false,
    afterHooksRssKb: NaN,
  };
  out.footprint = fp;
  let foot0: ReturnType<typeof procSample> = null;
  let tFoot0 = 0;
  let footDone = false;
  const footEnd = (): void => {
    if (footDone) return;
    footDone = true;
    clearInterval(sampler);
    const x = footProc.pid ? procSample(footProc.pid) : null;
    if (x && foot0) {
      const w = (Date.now() - tFoot0) / 1000;
      fp.windowS = round(w, 1);
      fp.freshRssKb = x.rssKb;
      fp.freshCpuSPerHour = round((((x.cpuPreciseS ?? x.cpuS) - (foot0.cpuPreciseS ?? foot0.cpuS)) * 3600) / w, 3);
    }
  };
  const sampler = setInterval(() => {
    const x = footProc.pid ? procSample(footProc.pid) : null;
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
    const slots = Array.from({ length: m }, (_, i) => slot('b', i));
    const a = await Fleet.start({
      pki: o.pki,
      slots,
      controllerUrl: ctl.url,
      stateRoot: path.join(dir, 'agents'),
      hook: 'noop',
      procs: 1,
    });
    await waitFor(
      `${m} agents connected`,
      async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= m + 1,
      60_000,
      200,
    );
    await sleep(32_000);
    // the footprint window is the ping window: its agent's start-up (lazy compilation, the
    // first GCs) is long over, and it holds exactly one ping
    foot0 = footProc.pid ? procSample(footProc.pid) : null;
    tFoot0 = Date.now();
    const c0 = await a.fleet.counters();
    const l0 = loCounters()!;
    await sleep(w1 * 1000);
    const l1 = loCounters()!;
    const c1 = await a.fleet.counters();
    await a.fleet.stop();
    // the footprint goes on alone for a few more pings (full runs: this child waits for the
    // fan-out anyway), so the agent's start-up tail weighs less in its CPU per hour
    if (!o.quick) await sleep(FOOTPRINT_EXTRA_MS);
    footEnd();
    // the footprint agent's pings are in the window too: counted as one more agent's share
    const pings = c1.pings - c0.pings;
    const polls1 = c1.polls - c0.polls;
    if (polls1 !== 0) problems.push(`${polls1} polls fell into the ping window`);
    if (pings === 0) problems.push('no ping in the ping window');
    const share = Math.max(1, (pings * (m + 1)) / m);
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
  } finally {
    footEnd();
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
