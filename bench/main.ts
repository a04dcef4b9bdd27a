/**
 * `npm run bench [-- --quick] [--only latency,fanout,floor,restart,idle,peer] [--n 100,1000]`
 * `npm run bench -- --soak [minutes]`, `npm run bench -- --controllers [store,fanout,failover]`,
 * `npm run bench -- --pre-auth`, `npm run bench -- --heat`, `npm run bench -- --dial-out [--n 10000]`
 *
 * Herald's benchmark suite: push against polling, fan-out to 10,000 agents, idle
 * traffic and footprint, a cluster restart. Writes BENCHMARKS.md (tables) and BENCHMARKS.json
 * (every raw figure) at the top of the checkout and exits non-zero when a correctness check
 * fails (an agent not connected, a wake-up not verified, a fetch not answered 200 with a checked
 * signature, a restart that did not complete). Timing goals missed do not fail the run: the
 * report says by how much.
 *
 * Where it can (root, or unprivileged user namespaces), it runs inside its own network and PID
 * namespaces: loopback traffic is then Herald's alone and can be counted exactly from
 * /proc/net/dev, no port can clash with anything else on the machine, and every process it
 * started dies with it.
 */
import { spawnSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { dialOutMain } from './dial-out.js';
import { fanoutAll, type FanoutResult } from './fanout.js';
import { type FloorBed, type FloorResult, floorPhase, startFloor } from './floor.js';
import { combineIdle, idlePhase, type IdlePart, type IdleResult } from './idle.js';
import type { ChildProcess } from 'node:child_process';
import { latencyPhase, type LatencyResult } from './latency.js';
import { ensurePeerInstalled, peerPhase, type PeerResult } from './peer.js';
import { benchPki, slot, type AgentSlot } from './pki-cache.js';
import { freeLowPort, killAll, track } from './procs.js';
import {
  replaceKeptSection,
  ROLLOUTS_SECTION_MARKER,
  rolloutsMarkdown,
  type RolloutsResult,
  writeReport,
} from './report.js';
import { severalMain } from './several-main.js';
import { restartPhase, type RestartResult } from './restart.js';
import { heatPhase } from './heat.js';
import { HEAT_SECTION_MARKER, heatMarkdown } from './heat-report.js';
import { preAuthMarkdown, preAuthPhase } from './pre-auth.js';
import { levelGrowth, soakMarkdown, soakPhase } from './soak.js';
import { loadAvg, NO_HOOK_LAUNCHER_ENV, profilePreloadArgs, round, say } from './util.js';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The checkout: dist/bench/main.js → two levels up. */
export const ROOT = path.resolve(here, '..', '..');

export interface BenchArgs {
  quick: boolean;
  only: Set<string> | null;
  ns: Array<number>;
  runs: number | null;
  pushWorkers: number | undefined;
  out: string;
  noNamespace: boolean;
  profile: string | null;
  crash: boolean;
  /** Internal: run one phase as a child process and write its result to `result`. */
  child: string | null;
  result: string | null;
  /** Re-render BENCHMARKS.md from a stored BENCHMARKS.json (no measuring). */
  render: string | null;
  /** --soak [minutes]: the soak alone (a change every 50 ms over 4 nodes), its section in BENCHMARKS.md. */
  soakMinutes: number | null;
  /** --pre-auth: requests before authentication beside an operator's, alone; its section in BENCHMARKS.md. */
  preAuth: boolean;
  /** --heat: unmodified OpenStack Heat driving Herald and a stock node, alone; its section in BENCHMARKS.md. */
  heat: boolean;
  /** --rollouts: a 100-node restart and upgrade of one cluster, alone; its section in BENCHMARKS.md. */
  rollouts: boolean;
  /** --dial-out: agents that dial out beside listener mode, alone (bench/dial-out.ts); its section in BENCHMARKS.md. */
  dialOut: boolean;
  /** --controllers [store,fanout,failover]: several controllers on PostgreSQL alone, their section in BENCHMARKS.md. */
  controllers: Set<string> | null;
  /** --controller-ns: the fan-out N with 1, 2 and 3 controllers (default 1000,5000). */
  controllerNs: number[];
  /** --failover-ns: the N of the kill -9 of one controller of three (default 300,3000). */
  failoverNs: number[];
  /**
   * os-collect-config beside Herald in the same run (beside every phase, or the --only ones;
   * `--only peer`: alone). A full run has it unless `--no-peer`, when it is installed or can be
   * (as root); `--peer` insists (the run stops when it cannot be had).
   */
  peer: boolean;
  /** --peer given: not having the peer is an error. */
  peerRequired: boolean;
  /** --no-peer given. */
  noPeer: boolean;
}

const SEVERAL_PARTS = ['store', 'fanout', 'failover'];

function parseArgs(argv: string[]): BenchArgs {
  const a: BenchArgs = {
    quick: false,
    only: null,
    ns: [],
    runs: null,
    pushWorkers: undefined,
    out: ROOT,
    noNamespace: false,
    profile: null,
    crash: true,
    child: null,
    result: null,
    render: null,
    soakMinutes: null,
    preAuth: false,
    heat: false,
    rollouts: false,
    dialOut: false,
    controllers: null,
    controllerNs: [1_000, 5_000],
    failoverNs: [300, 3_000],
    peer: false,
    peerRequired: false,
    noPeer: false,
  };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i]!;
    const next = (): string => {
      const x = argv[++i];
      if (x === undefined) throw new Error(`${v} needs a value`);
      return x;
    };
    if (v === '--quick') a.quick = true;
    else if (v === '--only') a.only = new Set(next().split(','));
    else if (v === '--n') a.ns = next().split(',').map(Number);
    else if (v === '--runs') a.runs = Number(next());
    else if (v === '--push-workers') a.pushWorkers = Number(next());
    else if (v === '--out') a.out = path.resolve(next());
    else if (v === '--no-namespace') a.noNamespace = true;
    else if (v === '--no-crash') a.crash = false;
    else if (v === '--child') a.child = next();
    else if (v === '--result') a.result = next();
    else if (v === '--render') a.render = path.resolve(next());
    else if (v === '--profile') a.profile = path.resolve(next());
    else if (v === '--soak-gc') process.env.HERALD_BENCH_MEM_GC = '1';
    else if (v === '--pre-auth') a.preAuth = true;
    else if (v === '--rollouts') a.rollouts = true;
    else if (v === '--heat') a.heat = true;
    else if (v === '--dial-out') a.dialOut = true;
    else if (v === '--soak') {
      const m = argv[i + 1];
      a.soakMinutes = m !== undefined && /^\d+(\.\d+)?$/.test(m) ? Number(argv[++i]) : 9;
    } else if (v === '--controllers') {
      const m = argv[i + 1];
      a.controllers = new Set(m !== undefined && !m.startsWith('--') ? argv[++i]!.split(',') : SEVERAL_PARTS);
      for (const part of a.controllers)
        if (!SEVERAL_PARTS.includes(part))
          throw new Error(`--controllers takes ${SEVERAL_PARTS.join(',')}, not ${part}`);
    } else if (v === '--controller-ns') a.controllerNs = next().split(',').map(Number);
    else if (v === '--failover-ns') a.failoverNs = next().split(',').map(Number);
    else if (v === '--peer') a.peerRequired = a.peer = true;
    else if (v === '--no-peer') a.noPeer = true;
    // every agent the run starts (processes and harness agents) spawns its hooks itself: an A/B
    // of agent/hooks/launcher.ts in one hour (the environment reaches every process started)
    else if (v === '--no-hook-launcher') process.env[NO_HOOK_LAUNCHER_ENV] = '1';
    else if (v === '--help' || v === '-h') {
      const options = [
        '[-- --quick] [--only latency,fanout,floor,restart,idle,peer] [--n 100,1000] [--runs 3]',
        '[--push-workers N] [--no-crash] [--no-namespace] [--profile dir] [--out dir] [--render BENCHMARKS.json]',
        '[--soak [minutes]] [--soak-gc] [--pre-auth] [--heat] [--rollouts] [--dial-out] [--controllers [store,fanout,failover]] [--controller-ns 1000,5000]',
        '[--failover-ns 300,3000] [--peer | --no-peer] [--no-hook-launcher]',
      ];
      process.stdout.write(`usage: npm run bench ${options.join(' ')}\n`);
      process.exit(0);
    } else throw new Error(`unknown option ${v}`);
  }
  // --peer runs os-collect-config beside whatever else runs (every phase, unless --only);
  // `--only peer` runs it alone
  if (a.only !== null) {
    if (a.only.has('peer')) a.peerRequired = a.peer = true;
    a.only.delete('peer');
  }
  // a full run has the peer beside it by default (decided once on the host: HERALD_BENCH_PEER)
  if (
    !a.peerRequired &&
    !a.noPeer &&
    !a.quick &&
    a.only === null &&
    a.soakMinutes === null &&
    !a.preAuth &&
    !a.heat &&
    !a.dialOut &&
    a.controllers === null
  )
    a.peer = process.env.HERALD_BENCH_PEER !== '0';
  if (a.noPeer) a.peer = a.peerRequired = false;
  return a;
}

/** Re-runs this process inside new network + PID namespaces when the machine allows it. */
function maybeEnterNamespace(args: BenchArgs): boolean {
  if (args.noNamespace || process.env.HERALD_BENCH_NS === '1' || process.platform !== 'linux') return false;
  const probe = spawnSync('unshare', ['-n', '-p', '-f', '--kill-child', '--mount-proc', 'true'], { stdio: 'ignore' });
  if (probe.status !== 0) return false;
  const script = 'ip link set lo up 2>/dev/null || ifconfig lo up; exec "$0" "$@"';
  const child = spawn(
    'unshare',
    [
      '-n',
      '-p',
      '-f',
      '--kill-child',
      '--mount-proc',
      'sh',
      '-c',
      script,
      process.execPath,
      ...process.execArgv,
      fileURLToPath(import.meta.url),
      ...process.argv.slice(2),
    ],
    {
      stdio: 'inherit',
      env: { ...process.env, HERALD_BENCH_NS: '1' },
    },
  );
  const forward = (s: NodeJS.Signals): void => {
    child.kill(s);
  };
  process.on('SIGINT', forward);
  process.on('SIGTERM', forward);
  child.on('exit', (code, sig) => process.exit(code ?? (sig ? 128 + (os.constants.signals[sig] ?? 1) : 1)));
  return true;
}

/**
 * Runs a part of a phase in a child process inside a network namespace of its own (its loopback
 * counts only its own traffic, and its ports clash with nothing); resolves with its result.
 */
function runChild<T>(args: BenchArgs, runDir: string, child: string, fallback: (why: string) => T): Promise<T> {
  const resultFile = path.join(runDir, `${child}-result.json`);
  const script = 'ip link set lo up 2>/dev/null || ifconfig lo up; exec "$0" "$@"';
  const childArgs = [
    fileURLToPath(import.meta.url),
    '--child',
    child,
    '--result',
    resultFile,
    ...(args.quick ? ['--quick'] : []),
  ];
  return new Promise((resolve) => {
    const c: ChildProcess = track(
      spawn('unshare', ['-n', 'sh', '-c', script, process.execPath, ...childArgs], {
        stdio: ['ignore', 'inherit', 'inherit'],
      }),
    );
    c.once('exit', (code) => {
      try {
        resolve(JSON.parse(fs.readFileSync(resultFile, 'utf8')) as T);
      } catch {
        resolve(fallback(`the ${child} child exited ${code} without a result`));
      }
    });
  });
}

async function childMain(args: BenchArgs): Promise<number> {
  const tmp = path.join(ROOT, 'tmp');
  const { pki } = await benchPki(path.join(tmp, 'bench-pki'), []);
  const runDir = path.join(tmp, 'bench-run');
  let r: unknown;
  if (args.child === 'idle-push' || args.child === 'idle-poll' || args.child === 'idle-footprint') {
    r = await idlePhase({
      pki,
      runDir,
      port: 18443,
      quick: args.quick,
      exactLo: true,
      part: args.child === 'idle-push' ? 'push' : args.child === 'idle-poll' ? 'poll' : 'footprint',
    });
  } else if (args.child === 'idle-push-dial-out') {
    r = await idlePhase({
      pki,
      runDir,
      port: 18443,
      quick: args.quick,
      exactLo: true,
      part: 'push',
      dialOutPort: 18444,
    });
  } else if (args.child === 'peer') {
    r = await peerPhase({ runDir, quick: args.quick, exactLo: true });
  } else if (args.child === 'latency-poll') {
    r = (await latencyPhase({ pki, runDir, port: 18443, quick: args.quick, part: 'poll' })).result;
  } else {
    throw new Error(`unknown --child ${args.child}`);
  }
  fs.writeFileSync(args.result!, JSON.stringify(r));
  return 0;
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2));
  if (args.child) return childMain(args);
  if (args.render) {
    const j = JSON.parse(fs.readFileSync(args.render, 'utf8')) as {
      command: string;
      date: string;
      elapsedS: number;
      mode: string;
      machine: Record<string, unknown>;
      isolation: string;
      pki: { issued: number; issueMs: number };
      checks: { failures: string[] };
      results: Parameters<typeof writeReport>[0]['results'];
    };
    writeReport({
      out: args.out,
      started: new Date(j.date),
      elapsedS: j.elapsedS,
      quick: j.mode === 'quick',
      command: j.command,
      namespace: j.isolation.startsWith('own'),
      pkiIssued: j.pki.issued,
      pkiIssueMs: j.pki.issueMs,
      results: j.results,
      failures: j.checks.failures,
      machine: j.machine,
    });
    say(`BENCHMARKS.md re-rendered from ${args.render}`);
    return 0;
  }
  // before the namespace: apt-get needs the host's network
  if (args.peer && process.env.HERALD_BENCH_NS !== '1') {
    const peer = ensurePeerInstalled();
    if (!peer.ok && args.peerRequired) {
      process.stderr.write(`${peer.line}\n`);
      return 1;
    }
    if (!peer.ok) {
      // the default: say why, and measure Herald alone (the namespaced re-run reads the decision)
      say(`os-collect-config not run beside Herald: ${peer.line} (or pass --no-peer)`);
      args.peer = false;
      process.env.HERALD_BENCH_PEER = '0';
    }
  }
  // one benchmark at a time: each clears tmp/bench-run, which a running one still uses (taken in
  // the host's namespaces, before the re-run in private ones, where the other run's pid is invisible)
  if (process.env.HERALD_BENCH_NS !== '1' && !takeBenchLock(path.join(ROOT, 'tmp', 'bench.lock'))) return 1;
  if (maybeEnterNamespace(args)) return -1;
  const inNs = process.env.HERALD_BENCH_NS === '1';
  if (args.controllers !== null)
    return severalMain({
      parts: args.controllers,
      controllerNs: args.controllerNs,
      failoverNs: args.failoverNs,
      runs: args.runs,
      pushWorkers: args.pushWorkers,
      out: args.out,
      root: ROOT,
      inNs,
      port: inNs ? 18443 : await freeLowPort(),
      command: `npm run bench -- ${process.argv.slice(2).join(' ')}`,
    });
  if (args.heat) return heatMain(args);
  if (args.dialOut) {
    const runDir = path.join(ROOT, 'tmp', 'bench-run');
    const failed = (why: string): IdlePart => ({ exact: false, agents: 0, problems: [why] });
    if (args.profile) process.env.HERALD_BENCH_PROFILE_DIR = args.profile;
    return dialOutMain({
      ...(args.profile ? { profArgs: profilePreloadArgs(args.profile) } : {}),
      ns: args.ns,
      runs: args.runs,
      quick: args.quick,
      pushWorkers: args.pushWorkers,
      out: args.out,
      root: ROOT,
      inNs,
      port: inNs ? 18443 : await freeLowPort(),
      command: `npm run bench -- ${process.argv.slice(2).join(' ')}`,
      idleChild: inNs
        ? (mode) => runChild(args, runDir, mode === 'listener' ? 'idle-push' : 'idle-push-dial-out', failed)
        : null,
    });
  }
  const started = new Date();
  const t0 = Date.now();
  const want = (p: string): boolean => args.only === null || args.only.has(p);
  const ns = args.ns.length > 0 ? args.ns : args.quick ? [100, 1_000] : [100, 1_000, 5_000, 10_000];
  const tmp = path.join(ROOT, 'tmp');
  const runDir = path.join(tmp, 'bench-run');
  fs.rmSync(runDir, { recursive: true, force: true });
  fs.mkdirSync(runDir, { recursive: true });

  say(
    `Herald benchmark (${args.soakMinutes !== null ? 'soak' : args.preAuth ? 'pre-auth' : args.rollouts ? 'rollouts' : args.quick ? 'quick' : 'full'})${inNs ? ' in its own network and PID namespaces' : ''}; load average ${loadAvg().join(' ')}`,
  );
  const maxN = Math.max(...ns, 100);
  // --pre-auth starts no agent: its certificates would take minutes to issue for nothing
  const slots: AgentSlot[] = args.preAuth
    ? []
    : args.rollouts
      ? Array.from({ length: 100 }, (_, i) => slot('b', i))
      : [
          ...Array.from({ length: maxN }, (_, i) => slot('b', i)),
          ...Array.from({ length: 64 }, (_, i) => slot('l', i)),
          // the idle phase's push-off agents use names past the others
          ...Array.from({ length: 400 }, (_, i) => slot('b', i)),
        ];
  const { pki, issued, issueMs } = await benchPki(path.join(tmp, 'bench-pki'), slots);
  say(`PKI ready (${issued} certificates issued in ${issueMs} ms)`);

  const port = inNs ? 18443 : await freeLowPort();
  if (args.soakMinutes !== null) return soakMain(args, pki, runDir, port, args.soakMinutes);
  if (args.preAuth) return preAuthMain(args, pki, runDir, port);
  if (args.rollouts) return rolloutsMain(args, pki, runDir, port);
  // --profile: every process started gets the preload; SIGUSR2 brackets the measured windows
  const profArgs = args.profile ? profilePreloadArgs(args.profile) : [];
  if (args.profile) process.env.HERALD_BENCH_PROFILE_DIR = args.profile;
  const results: {
    latency?: LatencyResult;
    fanout: FanoutResult[];
    floor?: FloorResult;
    restart?: RestartResult;
    restartFast?: RestartResult;
    restartProcs?: RestartResult;
    idle?: IdleResult;
    peer?: PeerResult;
  } = { fanout: [] };
  const failures: string[] = [];

  // The idle phase mostly waits (for the controller's 30 s pings) and polling latency is counted
  // in seconds: inside our namespace both run beside the fan-out and restart phases, each part in
  // a network namespace of its own (its loopback counts only its own traffic). Without
  // namespaces they run alone, after the others.
  const idleParts: Array<Promise<IdlePart>> = [];
  let pollChild: Promise<LatencyResult | null> | null = null;
  let peerChild: Promise<PeerResult | null> | null = null;
  const failedPart = (why: string): IdlePart => ({ exact: false, agents: 0, problems: [why] });
  /** The latency agent's RSS after its hooks, for the idle footprint's table. */
  let afterHooksRssKb = Number.NaN;
  let launcherRssKb = Number.NaN;
  let childrenStarted = false;
  // started after the smallest fan-out, whose figures their own start-up would disturb most
  const startChildren = (): void => {
    if (childrenStarted) return;
    childrenStarted = true;
    if (want('idle') && inNs) {
      idleParts.push(runChild(args, runDir, 'idle-push', failedPart), runChild(args, runDir, 'idle-poll', failedPart));
    }
    if (args.peer && inNs)
      peerChild = runChild<PeerResult | null>(args, runDir, 'peer', (why) => {
        failures.push(`peer: ${why}`);
        return null;
      });
    if (want('latency') && inNs)
      pollChild = runChild<LatencyResult | null>(args, runDir, 'latency-poll', (why) => {
        failures.push(`latency (polling): ${why}`);
        return null;
      });
  };

  // set by the fan-out's first run at its largest N (see beforeRun)
  const floorAt = {
    bed: null as FloorBed | null,
    failed: false,
    result: undefined as FloorResult | undefined,
    /** Dials the floor's agents unless done (or failed) already. */
    async start(n: number): Promise<void> {
      if (this.bed !== null || this.failed) return;
      try {
        this.bed = await startFloor({ pki, runDir, n });
      } catch (err) {
        this.fail(err);
      }
    },
    fail(err: unknown): void {
      this.failed = true;
      failures.push(`floor: ${(err as Error).message}`);
      this.stop();
    },
    /** Keeps the floor's figures so far and ends its processes; idempotent. */
    stop(): void {
      if (this.bed === null) return;
      this.result = this.bed.runs > 0 ? this.bed.result() : undefined;
      this.bed.stop();
      this.bed = null;
    },
  };
  if (want('fanout')) {
    const sorted = [...ns].sort((a, b) => a - b);
    const rs = await fanoutAll({
      pki,
      runDir,
      port: port + 1,
      ns: sorted,
      pushWorkers: args.pushWorkers,
      // the goal's N five times: one tree's controller CPU moves by a fifth between runs an hour
      // apart and by as much between runs minutes apart (1.30-1.67× the floor in one full run, against
      // a goal margin of 1.38×: docs/performance.md, "Measured 2026-12-05"), and the goals table takes
      // the median; the smaller Ns three times
      runsFor: (n) => args.runs ?? (args.quick ? 1 : n >= 10_000 ? 5 : n >= 5_000 ? 1 : 3),
      // full: the smallest N and the goal's 10,000 (each crash run reconnects every agent)
      crashFor: (n) => args.crash && (args.quick ? n < 1_000 : n === 100 || n === 10_000),
      harnessExecArgv: profArgs,
      controllerExtra: [],
      controllerNodeArgs: profArgs,
      profile: args.profile !== null,
      // the side phases start after the smallest N, whose figures their own start-up would disturb most
      onStep: (i) => {
        if (i === 0) startChildren();
      },
      // the floor takes turns with Herald's runs at the largest N, each just before one: this host's
      // CPU speed moves within minutes, and a floor measured once, later, moved with it
      // a floor that fails is a problem of the run, not the end of the fan-out (the report then
      // compares with the floor runs it has, or none)
      // its agents dialled before Herald's warm-up: the first measured run after a storm of 10,000
      // handshakes on both cores was the slowest of every run (its controller's background CPU 3-4×
      // the later runs'; docs/performance.md, "Measured 2026-12-05 16:25-")
      afterGrow: async (n) => {
        if (n !== Math.max(...ns) || floorAt.failed) return;
        await floorAt.start(n);
      },
      beforeRun: async (n) => {
        if (n !== Math.max(...ns) || floorAt.failed) return;
        await floorAt.start(n);
        try {
          await floorAt.bed?.measure();
        } catch (err) {
          floorAt.fail(err);
        }
      },
      // its processes and connections gone before the crash run, which they would disturb
      afterRuns: async () => floorAt.stop(),
    });
    results.fanout.push(...rs);
    for (const r of rs) failures.push(...r.problems.map((p) => `fan-out N=${r.n}: ${p}`));
  }
  // the fan-out's floor on this run's CPU, at its largest N: a minimal controller of the same protocol
  floorAt.stop();
  if (floorAt.result !== undefined) {
    results.floor = floorAt.result;
    failures.push(...floorAt.result.problems);
  } else if (want('fanout') || want('floor')) {
    results.floor = await floorPhase({ pki, runDir, n: Math.max(...ns) });
    failures.push(...results.floor.problems);
  }
  startChildren();
  if (want('restart')) {
    const runs = args.runs ?? (args.quick ? 2 : 3);
    // the real hooks' runs once in a quick run: each spawns 200 hook processes
    const restart = async (
      label: string,
      o: Pick<Parameters<typeof restartPhase>[0], 'runner' | 'agents' | 'runs' | 'upgradeRuns'>,
    ): Promise<RestartResult> => {
      const x = await restartPhase({ pki, runDir, port: port + 2, pushWorkers: args.pushWorkers, profArgs, ...o });
      failures.push(...x.problems.map((p) => `${label}: ${p}`));
      return x;
    };
    const realRuns = args.quick ? 1 : runs;
    results.restart = await restart('restart', { runner: 'real', runs: realRuns, upgradeRuns: realRuns });
    results.restartProcs = await restart('restart (herald agent processes)', {
      runner: 'real',
      agents: 'processes',
      runs: realRuns,
    });
    results.restartFast = await restart('restart (no-op hooks)', { runner: 'noop', runs, upgradeRuns: runs });
  }
  if (want('idle')) {
    const parts = inNs
      ? await Promise.all(idleParts)
      : [
          await idlePhase({ pki, runDir, port: port + 3, quick: args.quick, exactLo: false, part: 'push' }),
          await idlePhase({ pki, runDir, port: port + 3, quick: args.quick, exactLo: false, part: 'poll' }),
        ];
    results.idle = combineIdle(parts);
    failures.push(...results.idle.problems.map((p) => `idle: ${p}`));
  }
  if (args.peer) {
    const pr = peerChild ? await peerChild : await peerPhase({ runDir, quick: args.quick, exactLo: false });
    if (pr) results.peer = pr;
    failures.push(...(pr?.problems ?? []).map((p) => `peer: ${p}`));
  }
  // push latency last, on a machine the other phases no longer load (the polling part too)
  if (want('latency')) {
    const polled = pollChild ? await pollChild : undefined;
    const r = await latencyPhase({
      pki,
      runDir,
      port,
      quick: args.quick,
      pushWorkers: args.pushWorkers,
      profArgs,
      part: 'push',
    });
    const poll =
      polled !== undefined
        ? polled
        : (await latencyPhase({ pki, runDir, port, quick: args.quick, part: 'poll' })).result;
    if (poll) {
      r.result.polling2s = {
        ...poll.polling2s,
        modelP50Ms: r.result.polling2s.modelP50Ms,
        modelP99Ms: r.result.polling2s.modelP99Ms,
      };
      r.result.problems.push(...poll.problems);
    }
    results.latency = r.result;
    afterHooksRssKb = r.afterHooksRssKb;
    launcherRssKb = r.launcherRssKb;
    failures.push(...r.result.problems.map((p) => `latency: ${p}`));
  }
  // the idle agent's footprint last and alone, so that nothing else of the benchmark runs in its window
  if (want('idle') && results.idle) {
    const f = inNs
      ? await runChild<IdlePart>(args, runDir, 'idle-footprint', failedPart)
      : await idlePhase({ pki, runDir, port: port + 3, quick: args.quick, exactLo: false, part: 'footprint' });
    results.idle.footprint = f.footprint ? { ...f.footprint, afterHooksRssKb, launcherRssKb } : null;
    failures.push(...f.problems.map((p) => `idle: ${p}`));
  }

  const elapsedS = (Date.now() - t0) / 1000;
  writeReport({
    out: args.out,
    started,
    elapsedS,
    quick: args.quick,
    command: `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`,
    namespace: inNs,
    pkiIssued: issued,
    pkiIssueMs: issueMs,
    results,
    failures,
  });
  say(
    `done in ${elapsedS.toFixed(0)} s; ${failures.length === 0 ? 'all checks passed' : `${failures.length} check(s) FAILED`}`,
  );
  for (const f of failures) say(`FAILED: ${f}`);
  return failures.length === 0 ? 0 : 1;
}

process.on('exit', () => killAll());
for (const s of ['SIGINT', 'SIGTERM'] as const) {
  process.on(s, () => {
    say(`interrupted by ${s}`);
    killAll();
    process.exit(130);
  });
}

main().then(
  (code) => {
    if (code >= 0) {
      killAll();
      process.exit(code);
    }
  },
  (err: unknown) => {
    say(`benchmark failed: ${(err as Error).stack ?? String(err)}`);
    killAll();
    process.exit(2);
  },
);

/**
 * `--rollouts`: a 100-node restart and a 100-node upgrade of one cluster in the same run, real
 * hooks then no-op ones (bench/restart.ts); the result replaces its section of BENCHMARKS.md and
 * BENCHMARKS-rollouts.json.
 */
async function rolloutsMain(
  args: BenchArgs,
  pki: Awaited<ReturnType<typeof benchPki>>['pki'],
  runDir: string,
  port: number,
): Promise<number> {
  const runs = args.runs ?? (args.quick ? 2 : 3);
  const results: RestartResult[] = [];
  const load0 = loadAvg();
  for (const runner of ['real', 'noop'] as const)
    results.push(
      await restartPhase({ pki, runDir, port, pushWorkers: args.pushWorkers, runner, runs, upgradeRuns: runs }),
    );
  const cpu = os.cpus();
  const r: RolloutsResult = {
    date: new Date().toISOString(),
    machine: `${cpu.length} cores (${cpu[0]?.model.trim()}), Node ${process.version}, load average at the end ${loadAvg().join(' ')}`,
    command: `npm run bench -- ${process.argv.slice(2).join(' ')}`,
    busy: Math.max(load0[0] ?? 0, ...loadAvg()) > cpu.length,
    results,
  };
  fs.mkdirSync(args.out, { recursive: true });
  fs.writeFileSync(path.join(args.out, 'BENCHMARKS-rollouts.json'), `${JSON.stringify(r, null, 2)}\n`);
  const md = path.join(args.out, 'BENCHMARKS.md');
  const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
  fs.writeFileSync(md, replaceKeptSection(old, ROLLOUTS_SECTION_MARKER, rolloutsMarkdown(r)));
  const problems = results.flatMap((x) => x.problems);
  for (const p of problems) say(`FAILED: rollouts: ${p}`);
  say(
    `rollouts: restart median ${results.map((x) => `${x.runner} ${round(x.medianMs, 0)} ms`).join(', ')}; upgrade median ${results.map((x) => `${x.runner} ${round(x.upgrades?.medianMs ?? NaN, 0)} ms`).join(', ')}; BENCHMARKS.md's section written`,
  );
  return problems.length === 0 ? 0 : 1;
}

/** `--pre-auth`: that phase alone; its result replaces its section of BENCHMARKS.md. */
async function preAuthMain(
  args: BenchArgs,
  pki: Awaited<ReturnType<typeof benchPki>>['pki'],
  runDir: string,
  port: number,
): Promise<number> {
  say('pre-auth: an operator /healthz idle, then beside extreme enrolment CSRs');
  const r = await preAuthPhase({ pki, runDir, port });
  fs.mkdirSync(args.out, { recursive: true });
  fs.writeFileSync(path.join(args.out, 'BENCHMARKS-pre-auth.json'), `${JSON.stringify(r, null, 2)}\n`);
  const md = path.join(args.out, 'BENCHMARKS.md');
  const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
  fs.writeFileSync(md, replaceKeptSection(old, '<!-- kept: pre-auth', preAuthMarkdown(r)));
  say(
    `pre-auth: /healthz p50/p99 ${r.idle.p50}/${r.idle.p99} ms idle, ${r.during.p50}/${r.during.p99} ms beside ${r.extremeCsrs} extreme CSRs (all answered in ${r.allAnsweredMs} ms)`,
  );
  return 0;
}

/** `--heat`: real Heat alone (bench/heat.ts); its result replaces its section of BENCHMARKS.md and BENCHMARKS-heat.json. */
async function heatMain(args: BenchArgs): Promise<number> {
  const runDir = path.join(ROOT, 'tmp', 'bench-run');
  fs.mkdirSync(runDir, { recursive: true });
  const machine = `${os.cpus().length} cores (${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}), Node ${process.version}, load average at the start ${loadAvg().join(' ')}`;
  say(
    `heat: ${args.quick ? 'quick: ' : ''}stack updates through a Herald agent and a stock node, then Heat's signal polls`,
  );
  const r = await heatPhase({
    runDir,
    quick: args.quick,
    heatAgentsDir: path.join(ROOT, 'test', 'fixtures', 'heat-agents'),
    machine,
    ownNetwork: process.env.HERALD_BENCH_NS === '1',
  });
  fs.mkdirSync(args.out, { recursive: true });
  fs.writeFileSync(path.join(args.out, 'BENCHMARKS-heat.json'), `${JSON.stringify(r, null, 2)}\n`);
  const md = path.join(args.out, 'BENCHMARKS.md');
  const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
  fs.writeFileSync(md, replaceKeptSection(old, HEAT_SECTION_MARKER, heatMarkdown(r)));
  for (const p of r.problems) say(`FAILED: heat: ${p}`);
  say(`heat: ${r.updates.length} updates measured; BENCHMARKS.md's Heat section written`);
  return r.problems.length === 0 ? 0 : 1;
}

/** `--soak`: the soak alone; its result replaces the soak section of BENCHMARKS.md. */
async function soakMain(
  args: BenchArgs,
  pki: Awaited<ReturnType<typeof benchPki>>['pki'],
  runDir: string,
  port: number,
  minutes: number,
): Promise<number> {
  const when = new Date();
  say(`soak: ${minutes} min, a change every 50 ms over 4 nodes`);
  const r = await soakPhase({ pki, runDir, port, minutes });
  fs.mkdirSync(args.out, { recursive: true });
  fs.writeFileSync(
    path.join(args.out, 'BENCHMARKS-soak.json'),
    `${JSON.stringify({ date: when.toISOString(), ...r }, null, 2)}\n`,
  );
  const machine = `${os.cpus().length} cores (${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}), Node ${process.version}, load average at the end ${loadAvg().join(' ')}`;
  const md = path.join(args.out, 'BENCHMARKS.md');
  const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
  fs.writeFileSync(md, replaceKeptSection(old, '<!-- kept: soak', soakMarkdown(r, when, machine)));
  const level = levelGrowth(r.samples);
  say(
    `soak: ${r.changesAnswered} changes; level growth controller ${level.controllerMain} %, workers ${level.pushWorkers} %, agents ${level.agentsMax} % (sample to sample ${r.growthPct.controllerMain} / ${r.growthPct.pushWorkers} / ${r.growthPct.agentsMax} %); converged ${r.converged}`,
  );
  return r.converged && r.problems.length === 0 ? 0 : 1;
}

/**
 * Takes `file` for this process (its pid inside), or says which benchmark holds it and returns
 * false. A lock whose process is gone is taken over. Released when this process exits.
 */
function takeBenchLock(file: string): boolean {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      fs.writeFileSync(file, String(process.pid), { flag: 'wx' });
      process.once('exit', () => {
        try {
          if (fs.readFileSync(file, 'utf8') === String(process.pid)) fs.rmSync(file, { force: true });
        } catch {
          // gone already
        }
      });
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const holder = Number(fs.readFileSync(file, 'utf8'));
    let alive = false;
    try {
      alive = Number.isSafeInteger(holder) && holder > 0 && process.kill(holder, 0);
    } catch {
      alive = false;
    }
    if (alive) {
      process.stderr.write(
        `bench: another benchmark (pid ${holder}) is running and uses tmp/bench-run; wait for it, or stop it (${file})\n`,
      );
      return false;
    }
    fs.rmSync(file, { force: true }); // its process is gone: take it over
  }
  return false;
}
