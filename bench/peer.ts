/**
 * `--peer`: the incumbent, os-collect-config, measured in the same run on the same machine as
 * Herald's latency and idle phases, with the same yardsticks.
 *
 * Debian's os-collect-config runs unmodified (its own `/usr/bin/os-collect-config`, its polling
 * loop, no `--one-time`) against bench/peer-server.ts, a Heat-shaped metadata server on
 * 127.0.0.1 playing Swift behind a temp URL (Heat's POLL_TEMP_URL transport: its `request`
 * collector; why that one is in peer-server.ts). Its config file, cache and backup cache live
 * in the run directory; `/etc` and `/var/lib` are never read or written (`--config-file`
 * replaces oslo.config's default files).
 *
 * - change → command started: the bench publishes a new revision of the document at a random
 *   phase of the poll cycle; os-collect-config's `--command` is a script whose first line creates
 *   a marker file (a shell builtin, as Herald's latency hook does), timed by inotify. Also: the
 *   poll that saw it → command started, from the server's request times.
 * - idle: over a window with nothing changing, the loopback's IP bytes (exact when main.ts runs
 *   this in a network namespace of its own, as it does Herald's idle parts), the TCP payload at
 *   the server's sockets (always exact), and the CPU (schedstat) and RSS of the
 *   os-collect-config process from /proc.
 * - its default 30 s interval, computed: the loop's measured overhead on top of 30 s gives the
 *   period; traffic and CPU per poll times polls per hour; latency = a uniformly random wait
 *   over one period plus the measured poll → command cost.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { PeerMetadataServer } from './peer-server.js';
import { stopProc, tail, track } from './procs.js';
import { dist, loCounters, median, nowMs, procSample, round, roundDist, say, sleep, type Dist } from './util.js';

export const PEER_PACKAGE = 'python3-os-collect-config';
const PEER_BIN = 'os-collect-config';
/** os-collect-config's own default `--polling-interval`, seconds. */
export const PEER_DEFAULT_INTERVAL_S = 30;
/** The interval it is run at here, seconds (the same 2 s as Herald's measured polling row). */
const PEER_INTERVAL_S = 2;
const MARK_TIMEOUT_MS = 20_000;

export interface PeerResult {
  version: string;
  collector: 'request';
  pollingIntervalS: number;
  /** The metadata document's size (the GET's body), bytes. */
  documentBytes: number;
  /** Median time from one poll (HEAD) to the next while idle: the interval plus the loop's own cost. */
  periodMs: number;
  latency: {
    samples: number;
    /** Revision published → `--command`'s first line ran. */
    commandStartMs: Dist;
    /** The poll (HEAD) that first saw the revision → command started. */
    afterPollMs: Dist;
    samplesMs: number[];
    /** The model used for the default interval, applied to the measured one, to check it. */
    modelP50Ms: number;
    modelP99Ms: number;
  };
  idle: {
    windowS: number;
    /** Loopback counted in a network namespace of the phase's own (every byte is the peer's). */
    exact: boolean;
    ipBytes: number;
    packets: number;
    payloadBytes: number;
    polls: number;
    connections: number;
    /** Commands run in the window (0: nothing changed, nothing ran). */
    commands: number;
    ipBytesPerPoll: number;
    payloadBytesPerPoll: number;
    cpuS: number;
    cpuSPerPoll: number;
    rssKb: number;
    rssMaxKb: number;
  };
  perHour: {
    /** Measured at `pollingIntervalS`. */
    measured: { ipBytes: number; payloadBytes: number; cpuS: number; polls: number };
    /** At the default 30 s, computed from the per-poll figures. */
    atDefault: { intervalS: number; ipBytes: number; payloadBytes: number; cpuS: number; polls: number };
  };
  /** Change → command started at the default 30 s, computed. */
  atDefault: { intervalS: number; p50Ms: number; p99Ms: number; maxMs: number; meanMs: number };
  problems: string[];
}

export type PeerInstall = { ok: true; version: string } | { ok: false; line: string };

function peerVersion(): string | null {
  const r = spawnSync(PEER_BIN, ['--version'], { encoding: 'utf8' });
  return r.status === 0 ? `${r.stdout}${r.stderr}`.trim() : null;
}

/**
 * os-collect-config on PATH, installed from Debian's `python3-os-collect-config` when missing
 * (as root, with apt-get; an `apt-get update` and one retry if the first install fails).
 * Never throws: a failure comes back as one line telling the operator how to install it.
 */
export function ensurePeerInstalled(): PeerInstall {
  const have = peerVersion();
  if (have) return { ok: true, version: have };
  const how = `install it (as root: apt-get install -y ${PEER_PACKAGE}) and rerun`;
  if (process.getuid?.() !== 0) return { ok: false, line: `--peer needs ${PEER_BIN}, which is missing: ${how}` };
  say(`--peer: ${PEER_BIN} missing; apt-get install -y ${PEER_PACKAGE}`);
  const apt = (args: string[]): ReturnType<typeof spawnSync> =>
    spawnSync('apt-get', args, {
      encoding: 'utf8',
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    });
  let r = apt(['install', '-y', PEER_PACKAGE]);
  if (r.status !== 0 && !r.error) {
    apt(['update']);
    r = apt(['install', '-y', PEER_PACKAGE]);
  }
  const v = r.status === 0 ? peerVersion() : null;
  if (v) return { ok: true, version: v };
  const why = r.error
    ? r.error.message
    : (String(r.stderr ?? '')
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('E:'))
        .pop() ?? `apt-get exited ${r.status}`);
  return { ok: false, line: `--peer needs ${PEER_BIN}; apt-get install -y ${PEER_PACKAGE} failed (${why}): ${how}` };
}

export interface PeerOptions {
  runDir: string;
  quick: boolean;
  /** The phase runs in a network namespace of its own: the loopback's counters are its alone. */
  exactLo: boolean;
}

/** The marker directory, watched: the time each new file appeared, in order. */
class Marks {
  readonly times: number[] = [];
  readonly #seen = new Set<string>();
  readonly #watcher: fs.FSWatcher;
  #wake: (() => void) | null = null;

  constructor(dir: string) {
    this.#watcher = fs.watch(dir, (_ev, f) => {
      const t = nowMs();
      if (!f || this.#seen.has(f)) return;
      this.#seen.add(f);
      this.times.push(t);
      this.#wake?.();
    });
  }

  /** The time of marker number `i` (0-based), waiting up to `ms` for it. */
  async nth(i: number, ms: number): Promise<number> {
    const until = Date.now() + ms;
    while (this.times.length <= i) {
      const left = until - Date.now();
      if (left <= 0) throw new Error(`os-collect-config's command did not run within ${ms} ms (run ${i + 1})`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.#wake = () => {
          clearTimeout(t);
          r();
        };
      });
      this.#wake = null;
    }
    return this.times[i]!;
  }

  close(): void {
    this.#watcher.close();
  }
}

export async function peerPhase(o: PeerOptions): Promise<PeerResult> {
  const dir = path.join(o.runDir, 'peer');
  fs.rmSync(dir, { recursive: true, force: true });
  const markDir = path.join(dir, 'marks');
  fs.mkdirSync(markDir, { recursive: true });
  const problems: string[] = [];
  const result = emptyResult(problems);
  const version = peerVersion();
  if (!version) {
    problems.push(`${PEER_BIN} not found (apt-get install -y ${PEER_PACKAGE})`);
    return result;
  }
  result.version = version;
  const server = await PeerMetadataServer.start();
  result.documentBytes = server.body.length;
  const marks = new Marks(markDir);
  const log = path.join(dir, 'os-collect-config.log');
  let proc: ChildProcess | null = null;
  try {
    proc = startPeer(dir, markDir, server.url, log);
    say(`peer: ${PEER_BIN} ${version} (request collector) polling every ${PEER_INTERVAL_S} s`);
    // its first collection stores the document (no cache yet) and runs the command
    await marks.nth(0, MARK_TIMEOUT_MS);
    // the first sleeps are shorter (1 s, doubling up to the interval): past them
    await sleep(2 * PEER_INTERVAL_S * 1000 + 500);
    await idleWindow(o, server, marks, proc.pid!, result);
    const after = await latencyRuns(o, server, marks, result);
    const m = pollModel(result.periodMs, after);
    result.latency.modelP50Ms = round(m.p50Ms, 0);
    result.latency.modelP99Ms = round(m.p99Ms, 0);
    const periodDefaultMs = result.periodMs + (PEER_DEFAULT_INTERVAL_S - PEER_INTERVAL_S) * 1000;
    const d = pollModel(periodDefaultMs, after);
    result.atDefault = {
      intervalS: PEER_DEFAULT_INTERVAL_S,
      p50Ms: round(d.p50Ms, 0),
      p99Ms: round(d.p99Ms, 0),
      maxMs: round(d.maxMs, 0),
      meanMs: round(d.meanMs, 0),
    };
    const pollsDefault = 3_600_000 / periodDefaultMs;
    result.perHour.atDefault = {
      intervalS: PEER_DEFAULT_INTERVAL_S,
      polls: round(pollsDefault, 1),
      ipBytes: Math.round(pollsDefault * result.idle.ipBytesPerPoll),
      payloadBytes: Math.round(pollsDefault * result.idle.payloadBytesPerPoll),
      cpuS: round(pollsDefault * result.idle.cpuSPerPoll, 3),
    };
    say(
      `peer: change → command p50 ${result.latency.commandStartMs.p50} ms, p99 ${result.latency.commandStartMs.p99} ms; idle ${result.idle.ipBytesPerPoll} B and ${round(result.idle.cpuSPerPoll * 1000, 1)} ms CPU per poll, RSS ${result.idle.rssKb} kB`,
    );
  } catch (err) {
    problems.push((err as Error).message);
    say(tail(log));
  } finally {
    marks.close();
    if (proc) await stopProc(proc, 'SIGTERM', 5_000);
    await server.close();
  }
  return result;
}

/** os-collect-config, unmodified, with a config file of the run's own. */
function startPeer(dir: string, markDir: string, url: string, log: string): ChildProcess {
  const mark = path.join(dir, 'mark.sh');
  fs.writeFileSync(mark, `#!/bin/sh\n: > "${markDir}/m$$"\n`, { mode: 0o755 });
  const conf = path.join(dir, 'os-collect-config.conf');
  fs.writeFileSync(
    conf,
    [
      '[DEFAULT]',
      `command = ${mark}`,
      `cachedir = ${path.join(dir, 'cache')}`,
      `backup_cachedir = ${path.join(dir, 'backup-cache')}`,
      // the request collector alone: Heat's POLL_TEMP_URL also lists ec2 (which caches its first
      // answer) and local (files); neither polls the deployment metadata
      'collectors = request',
      `polling_interval = ${PEER_INTERVAL_S}`,
      `log_file = ${log}`,
      '[request]',
      `metadata_url = ${url}`,
      '',
    ].join('\n'),
  );
  return track(spawn(PEER_BIN, ['--config-file', conf], { stdio: ['ignore', 'ignore', fs.openSync(log, 'a')] }));
}

/** Nothing changes: what polling alone costs. */
async function idleWindow(
  o: PeerOptions,
  server: PeerMetadataServer,
  marks: Marks,
  pid: number,
  r: PeerResult,
): Promise<void> {
  const windowS = o.quick ? 20 : 60;
  const cmd0 = marks.times.length;
  const q0 = server.requests.length;
  const c0 = server.counters();
  const l0 = loCounters();
  const p0 = procSample(pid);
  const t0 = nowMs();
  let rssMax = p0?.rssKb ?? 0;
  const sampler = setInterval(() => {
    const x = procSample(pid);
    if (x) rssMax = Math.max(rssMax, x.rssKb);
  }, 1_000);
  await sleep(windowS * 1000);
  clearInterval(sampler);
  const p1 = procSample(pid);
  const l1 = loCounters();
  const c1 = server.counters();
  const w = (nowMs() - t0) / 1000;
  if (!p0 || !p1) throw new Error(`${PEER_BIN} exited during the idle window`);
  const reqs = server.requests.slice(q0);
  const polls = reqs.filter((x) => x.method === 'GET').length;
  const heads = reqs.filter((x) => x.method === 'HEAD').map((x) => x.atMs);
  r.periodMs = round(median(heads.slice(1).map((t, i) => t - heads[i]!)), 1);
  const payload = c1.bytesIn + c1.bytesOut - c0.bytesIn - c0.bytesOut;
  const ipBytes = l0 && l1 ? l1.bytes - l0.bytes : NaN;
  const cpuS = (p1.cpuPreciseS ?? p1.cpuS) - (p0.cpuPreciseS ?? p0.cpuS);
  r.idle = {
    windowS: round(w, 1),
    exact: o.exactLo && l0 !== null,
    ipBytes,
    packets: l0 && l1 ? l1.packets - l0.packets : NaN,
    payloadBytes: payload,
    polls,
    connections: c1.connections - c0.connections,
    commands: marks.times.length - cmd0,
    ipBytesPerPoll: round(ipBytes / Math.max(1, polls), 1),
    payloadBytesPerPoll: round(payload / Math.max(1, polls), 1),
    cpuS: round(cpuS, 4),
    cpuSPerPoll: round(cpuS / Math.max(1, polls), 5),
    rssKb: p1.rssKb,
    rssMaxKb: Math.max(rssMax, p1.rssKb),
  };
  r.perHour.measured = {
    polls: round((polls * 3600) / w, 0),
    ipBytes: Math.round((ipBytes * 3600) / w),
    payloadBytes: Math.round((payload * 3600) / w),
    cpuS: round((cpuS * 3600) / w, 3),
  };
  if (polls === 0) r.problems.push('no poll in the idle window');
  if (r.idle.commands !== 0) r.problems.push(`the command ran ${r.idle.commands} times with nothing changed`);
  say(
    `peer idle: ${polls} polls over ${r.idle.connections} connections in ${r.idle.windowS} s, ${ipBytes} B on the loopback${r.idle.exact ? '' : ' (host: approximate)'}, ${payload} B TCP payload, ${round(cpuS, 3)} s CPU`,
  );
}

/**
 * Changes published one at a time, each at a random phase of the poll cycle; returns the
 * poll → command started samples (the model's cost after the poll).
 */
async function latencyRuns(o: PeerOptions, server: PeerMetadataServer, marks: Marks, r: PeerResult): Promise<number[]> {
  const n = o.quick ? 20 : 40;
  const lat: number[] = [];
  const after: number[] = [];
  for (let k = 0; k < n; k++) {
    await sleep(Math.random() * r.periodMs);
    const before = marks.times.length;
    const t0 = server.change();
    const rev = server.revision;
    const tm = await marks.nth(before, MARK_TIMEOUT_MS);
    lat.push(tm - t0);
    const seen = server.requests.find((x) => x.revision === rev && x.atMs <= tm);
    if (seen) after.push(tm - seen.atMs);
  }
  // the command ran once per change, never more
  await sleep(r.periodMs + 500);
  const extra = marks.times.length - 1 - r.idle.commands - n;
  if (extra !== 0) r.problems.push(`the command ran ${extra} more times than there were changes`);
  r.latency.samples = lat.length;
  r.latency.commandStartMs = roundDist(dist(lat), 1);
  r.latency.afterPollMs = roundDist(dist(after), 1);
  r.latency.samplesMs = lat.map((x) => round(x, 1));
  return after;
}

/**
 * os-collect-config's loop has no jitter: it collects, runs the command if something changed,
 * sleeps the interval. A change lands at a uniformly random moment of one period and is seen
 * at the next poll, then costs what the measured poll → command did. Deterministic: every one of
 * 1,000 evenly spaced phases with every measured cost.
 */
export function pollModel(
  periodMs: number,
  afterPollMs: readonly number[],
): { p50Ms: number; p99Ms: number; maxMs: number; meanMs: number } {
  const costs = afterPollMs.length > 0 ? afterPollMs : [0];
  const xs: number[] = [];
  const PHASES = 1_000;
  for (let i = 0; i < PHASES; i++) for (const c of costs) xs.push(((i + 0.5) / PHASES) * periodMs + c);
  const d = dist(xs);
  return { p50Ms: d.p50, p99Ms: d.p99, maxMs: d.max, meanMs: d.mean };
}

function emptyResult(problems: string[]): PeerResult {
  return {
    version: '',
    collector: 'request',
    pollingIntervalS: PEER_INTERVAL_S,
    documentBytes: NaN,
    periodMs: NaN,
    latency: {
      samples: 0,
      commandStartMs: dist([]),
      afterPollMs: dist([]),
      samplesMs: [],
      modelP50Ms: NaN,
      modelP99Ms: NaN,
    },
    idle: {
      windowS: 0,
      exact: false,
      ipBytes: NaN,
      packets: NaN,
      payloadBytes: NaN,
      polls: 0,
      connections: 0,
      commands: 0,
      ipBytesPerPoll: NaN,
      payloadBytesPerPoll: NaN,
      cpuS: NaN,
      cpuSPerPoll: NaN,
      rssKb: NaN,
      rssMaxKb: NaN,
    },
    perHour: {
      measured: { ipBytes: NaN, payloadBytes: NaN, cpuS: NaN, polls: NaN },
      atDefault: { intervalS: PEER_DEFAULT_INTERVAL_S, ipBytes: NaN, payloadBytes: NaN, cpuS: NaN, polls: NaN },
    },
    atDefault: { intervalS: PEER_DEFAULT_INTERVAL_S, p50Ms: NaN, p99Ms: NaN, maxMs: NaN, meanMs: NaN },
    problems,
  };
}
