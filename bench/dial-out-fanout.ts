/**
 * The fan-out (bench/fanout.ts) in listener mode and in dial-out mode side by side, in one run:
 * two beds, each a controller and its fleet of simulated agents (the agent's own modules): the
 * listener bed's agents listen and its controller dials them; the dial-out bed's controller has a
 * connect listener (`--connect-listen`) and its agents dial it and listen on nothing
 * (docs/dial-out.md). Both fleets stay connected throughout; the measured runs take turns (listener
 * then dial-out, then the other way round), so both modes share every minute of the machine.
 *
 * Per N: both fleets grown (one after the other: each growth's figures are its own), a warm-up
 * change each, the runs in turns, then each bed's crash run (SIGKILL with a change pending,
 * started again on the same database) with changes to single nodes made while its fleet
 * reconnects, their acks timed (bench/ack-probe.ts: PROBE_AGENTS agents of each bed's kind beside
 * its fleet, in a harness process of their own).
 */
import { PROBE_AGENTS, type AckProbeSpec } from './ack-probe.js';
import {
  CRASH_WINDOW_MS,
  crashRun,
  FanoutBed,
  fanoutChecks,
  fanoutNodes,
  measuredRun,
  sayCrash,
  warmupRun,
  type FanoutResult,
} from './fanout.js';
import type { BenchPki } from './pki-cache.js';
import { say } from './util.js';

export type FanoutMode = 'listener' | 'dialOut';

export interface FanoutPair {
  n: number;
  listener: FanoutResult;
  dialOut: FanoutResult;
}

export interface FanoutPairOptions {
  pki: BenchPki;
  runDir: string;
  /** The listener bed's API at `port`; the dial-out bed's at `port + 1`, its connect listener at `port + 2`. */
  port: number;
  ns: number[];
  runsFor: (n: number) => number;
  crashFor: (n: number) => boolean;
  pushWorkers?: number | undefined;
  /** The pause between two ack probes in a crash run's window. */
  probeEveryMs: number;
  /** Called after each N (the caller writes what it has so far). */
  onStep?: (pairs: FanoutPair[]) => void;
  /** `--profile`: node flags for every process (the preload), and its windows bracketed (bench/prof-preload.ts). */
  profArgs?: string[];
}

/** Every N in turn on the two beds; the fleets grow from one N to the next. */
export async function fanoutPairs(o: FanoutPairOptions): Promise<FanoutPair[]> {
  const connectPort = o.port + 2;
  const common = {
    pki: o.pki,
    runDir: o.runDir,
    ns: o.ns,
    runsFor: o.runsFor,
    crashFor: o.crashFor,
    pushWorkers: o.pushWorkers,
    probeAgents: PROBE_AGENTS,
    ...(o.profArgs?.length ? { harnessExecArgv: o.profArgs, controllerNodeArgs: o.profArgs, profile: true } : {}),
  };
  const beds: Record<FanoutMode, FanoutBed> = {
    listener: new FanoutBed({ ...common, port: o.port, label: 'fanout-listener' }),
    dialOut: new FanoutBed({
      ...common,
      port: o.port + 1,
      label: 'fanout-dial-out',
      controllerExtra: ['--connect-listen', `127.0.0.1:${connectPort}`],
      dialOut: `wss://127.0.0.1:${connectPort}/v1/connect`,
    }),
  };
  const modes: FanoutMode[] = ['listener', 'dialOut'];
  const pairs: FanoutPair[] = [];
  try {
    for (const m of modes) await beds[m].start();
    for (const n of [...o.ns].sort((a, b) => a - b)) {
      const result = (): FanoutResult => ({
        n,
        harnessProcs: 0,
        pushWorkers: o.pushWorkers ?? 'default',
        runs: [],
        crash: null,
        checksOk: false,
        problems: [],
      });
      const pair: FanoutPair = { n, listener: result(), dialOut: result() };
      pairs.push(pair);
      const nodes = fanoutNodes(n);
      const grown = {} as Record<FanoutMode, Awaited<ReturnType<FanoutBed['grow']>>>;
      for (const m of modes) {
        await beds[m].settle(n, pair[m].problems);
        grown[m] = await beds[m].grow(n, pair[m].problems);
        pair[m].harnessProcs = beds[m].fleet!.members.length;
      }
      for (const m of modes) if (grown[m].agentsAdded > 0) await warmupRun(beds[m], nodes, pair[m]);
      for (let r = 1; r <= o.runsFor(n); r++) {
        const order = r % 2 === 1 ? modes : [...modes].reverse();
        for (const m of order) pair[m].runs.push(await measuredRun(beds[m], nodes, r, grown[m], pair[m].problems));
      }
      if (o.crashFor(n)) {
        for (const m of modes) {
          const probe: AckProbeSpec = { nodes: beds[m].probeSlots.map((x) => x.node), everyMs: o.probeEveryMs };
          pair[m].crash = await crashRun(beds[m], n, nodes, CRASH_WINDOW_MS(n), pair[m].problems, probe);
          sayCrash(beds[m], n, pair[m].crash!);
        }
      }
      for (const m of modes) {
        pair[m].problems.push(...fanoutChecks(pair[m]));
        pair[m].checksOk = pair[m].problems.length === 0;
      }
      say(`fan-out pair N=${n} done`);
      o.onStep?.(pairs);
    }
  } finally {
    for (const m of modes) await beds[m].stop().catch(() => undefined);
  }
  return pairs;
}
