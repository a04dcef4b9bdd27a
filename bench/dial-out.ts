/**
 * `npm run bench -- --dial-out [--n 10000] [--runs 3] [--quick]`: agents that dial out
 * (docs/dial-out.md) beside listener mode, every figure in the same run: PATCH → hook started,
 * one node back to back (bench/dial-out-latency.ts); one change to N agents, and N agents after a
 * controller restart with acks timed while they reconnect (bench/dial-out-fanout.ts); idle traffic
 * per agent (bench/idle.ts, window 1 and 1b, in network namespaces of their own when it can).
 * Writes BENCHMARKS-dial-out.json (every raw figure) and replaces its section of BENCHMARKS.md,
 * after each part (marked partial until the end). Exits non-zero when a check failed (an agent
 * that did not connect, ack or fetch).
 *
 * Order: the idle windows start first and run beside the fan-out (they only wait, and count
 * bytes); the latency comes last, on a machine the fleets no longer load.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PROBE_AGENTS } from './ack-probe.js';
import { dialOutLatencyPhase, type DialOutLatency } from './dial-out-latency.js';
import { fanoutPairs, type FanoutMode, type FanoutPair } from './dial-out-fanout.js';
import { DIAL_OUT_MARKER, dialOutMarkdown, type DialOutReport } from './dial-out-report.js';
import { idlePhase, type IdlePart } from './idle.js';
import { benchPki, slot } from './pki-cache.js';
import { replaceKeptSection } from './report.js';
import { formatLikeTheTree, gitCommit } from './several-main.js';
import { loadAvg, say } from './util.js';

/** Between two ack probes in a crash run's window (bench/ack-probe.ts). */
const PROBE_EVERY_MS = 200;
/** Changes per mode in the latency part (quick: half). */
const LATENCY_CHANGES = 100;
/** Agents the idle windows use at most (bench/idle.ts: window 1's, then 1b's past twice as many). */
const IDLE_SLOTS = 600;

export interface DialOutMainOptions {
  ns: number[];
  runs: number | null;
  quick: boolean;
  pushWorkers: number | undefined;
  out: string;
  root: string;
  inNs: boolean;
  /** The latency at `port` and `port + 1`; the fan-out's beds at `port + 1` to `port + 3`; idle, without namespaces, at `port + 5`. */
  port: number;
  command: string;
  /**
   * Runs idle window 1 of a mode in a child process in a network namespace of its own (main.ts),
   * beside the fan-out; null: in this process, after the fan-out (its loopback is then shared).
   */
  idleChild: ((mode: FanoutMode) => Promise<IdlePart>) | null;
  /** `--profile`: the fan-out's processes get these node flags (bench/prof-preload.ts). */
  profArgs?: string[];
}

export async function dialOutMain(o: DialOutMainOptions): Promise<number> {
  const started = new Date();
  const loadStart = loadAvg();
  const tmp = path.join(o.root, 'tmp');
  const runDir = path.join(tmp, 'bench-run');
  fs.rmSync(runDir, { recursive: true, force: true });
  fs.mkdirSync(runDir, { recursive: true });
  const ns = o.ns.length > 0 ? o.ns : o.quick ? [1_000] : [10_000];
  const maxN = Math.max(...ns, IDLE_SLOTS);
  say(`dial-out beside listener mode: fan-out N ${ns.join(', ')}; load average ${loadStart.join(' ')}`);
  const slots = [
    ...Array.from({ length: maxN }, (_, i) => slot('b', i)),
    ...Array.from({ length: PROBE_AGENTS }, (_, i) => slot('a', i)),
    slot('l', 1),
    slot('l', 2),
  ];
  const { pki, issued, issueMs } = await benchPki(path.join(tmp, 'bench-pki'), slots);
  say(`PKI ready (${issued} agent certificates issued in ${issueMs} ms)`);

  let latency: DialOutLatency | null = null;
  let fanout: FanoutPair[] = [];
  const idle: DialOutReport['idle'] = { listener: null, dialOut: null };
  const problems: string[] = [];
  const write = (final: boolean): DialOutReport => {
    const report: DialOutReport = {
      date: started.toISOString(),
      command: o.command,
      elapsedS: (Date.now() - started.getTime()) / 1000,
      machine: `${os.cpus().length} cores (${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}, Linux ${os.release()}`,
      loadStart,
      loadEnd: loadAvg(),
      isolation: o.inNs
        ? 'The run had its own network and PID namespaces; each idle window a network namespace of its own.'
        : 'The run shared the network namespace of the machine (idle bytes approximate).',
      commit: gitCommit(o.root),
      latency,
      fanout,
      idle,
      problems: [
        ...problems,
        ...fanout.flatMap((x) => [
          ...x.listener.problems.map((q) => `fan-out N=${x.n} listener: ${q}`),
          ...x.dialOut.problems.map((q) => `fan-out N=${x.n} dial-out: ${q}`),
        ]),
        ...(latency?.problems ?? []).map((q) => `latency: ${q}`),
        ...[idle.listener, idle.dialOut].flatMap((x) => x?.problems ?? []).map((q) => `idle: ${q}`),
      ],
      ...(final ? {} : { partial: true }),
    };
    fs.mkdirSync(o.out, { recursive: true });
    const jsonPath = path.join(o.out, 'BENCHMARKS-dial-out.json');
    fs.writeFileSync(jsonPath, `${JSON.stringify(report, null, 2)}\n`);
    formatLikeTheTree(jsonPath);
    const md = path.join(o.out, 'BENCHMARKS.md');
    const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
    fs.writeFileSync(md, replaceKeptSection(old, DIAL_OUT_MARKER, dialOutMarkdown(report)));
    return report;
  };
  const failedIdle = (why: string): IdlePart => ({ exact: false, agents: 0, problems: [why] });
  const idleRuns = o.idleChild
    ? (['listener', 'dialOut'] as const).map((m) =>
        o.idleChild!(m).then(
          (x) => (idle[m] = x),
          (err: Error) => (idle[m] = failedIdle(`${m}: ${err.message}`)),
        ),
      )
    : [];
  try {
    fanout = await fanoutPairs({
      pki,
      runDir,
      port: o.port + 1,
      ns,
      runsFor: () => o.runs ?? (o.quick ? 1 : 3),
      crashFor: () => true,
      pushWorkers: o.pushWorkers,
      probeEveryMs: PROBE_EVERY_MS,
      ...(o.profArgs ? { profArgs: o.profArgs } : {}),
      onStep: (pairs) => {
        fanout = pairs;
        write(false);
      },
    });
    await Promise.all(idleRuns);
    if (!o.idleChild)
      for (const m of ['listener', 'dialOut'] as const)
        idle[m] = await idlePhase({
          pki,
          runDir,
          port: o.port + 5,
          quick: o.quick,
          exactLo: false,
          part: 'push',
          ...(m === 'dialOut' ? { dialOutPort: o.port + 6 } : {}),
        });
    write(false);
    latency = await dialOutLatencyPhase({
      pki,
      runDir,
      port: o.port,
      count: o.quick ? LATENCY_CHANGES / 2 : LATENCY_CHANGES,
    });
  } catch (err) {
    problems.push(`the benchmark stopped: ${(err as Error).message}`);
    say(`dial-out: ${(err as Error).stack ?? String(err)}`);
  }
  await Promise.all(idleRuns);
  const report = write(true);
  say(
    `dial-out: done in ${Math.round(report.elapsedS)} s; ${report.problems.length === 0 ? 'all checks passed' : `${report.problems.length} check(s) FAILED`}`,
  );
  for (const q of report.problems) say(`FAILED: ${q}`);
  return report.problems.length === 0 ? 0 : 1;
}
