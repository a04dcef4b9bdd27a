/**
 * The controller's CPU per agent in a fan-out, set against its goal and against the floor
 * measured beside it (bench/floor.ts): the computations behind the figures of BENCHMARKS.md's
 * goals and fan-out tables. What the figures mean, and what limits them, is written by hand in
 * BENCHMARKS.md's kept sections.
 */
import type { BenchResults } from './results.js';
import { median, round, type ProcessSplit } from './util.js';

/** The goal for the controller's CPU per agent in a fan-out of 10,000 (ms). */
export const CPU_PER_AGENT_GOAL_MS = 0.4;
/** The "floor seen here" for it: its prototype, with the fetch (ms). */
export const PROTOTYPE_CPU_PER_AGENT_MS = 0.29;
/**
 * A window's controller CPU per agent (ms) less what the controller spends with nothing changing
 * (`idleCpuPerS`, sampled quiet just before; pings and healthy polls for Herald, ~0 for the
 * floor) over the window's length: the change's own cost. A run measured before the background
 * was sampled counts in full.
 */
export function netCpuPerAgentMs(
  r: { controllerCpuS: number; allFetchedMs: number },
  idleCpuPerS: number | undefined,
  n: number,
): number {
  const background = (idleCpuPerS ?? 0) * (r.allFetchedMs / 1000);
  return (1000 * Math.max(0, r.controllerCpuS - background)) / n;
}

/**
 * Herald's controller CPU per agent over the floor's at the floor's N, each net of its own
 * background (netCpuPerAgentMs): the median of each run's ratio to the floor run measured just
 * before it when the two took turns (this host's CPU speed moves within minutes), else the
 * ratio of the medians. `gross`: the windows' CPU in full, background included.
 */
export function ratioToFloor(
  big: BenchResults['fanout'][number],
  fl: NonNullable<BenchResults['floor']>,
  gross = false,
): number {
  const herald = big.runs.map((x) =>
    gross ? (1000 * x.controllerCpuS) / big.n : netCpuPerAgentMs(x, x.controllerIdleCpuPerS, big.n),
  );
  const floorOf = (x: FloorRunLike): number => (gross ? x.cpuPerAgentMs : netCpuPerAgentMs(x, x.idleCpuPerS, fl.n));
  const floors = fl.runs ?? [];
  if (floors.length === herald.length && floors.length > 0)
    return median(herald.map((h, i) => h / floorOf(floors[i]!)));
  return median(herald) / floorOf(fl);
}
type FloorRunLike = { controllerCpuS: number; allFetchedMs: number; cpuPerAgentMs: number; idleCpuPerS?: number };

const f = (x: number | undefined, d = 1): string =>
  x === undefined || !Number.isFinite(x) ? 'n/a' : round(x, d).toLocaleString('en-US');

/**
 * The controller's CPU an agent by process (medians of the runs) and each side's kernel share
 * (summed over the runs: stime is read in 10 ms ticks, so one run's share is coarse).
 */
export function byProcessText(splits: readonly ProcessSplit[], n: number, workers: number, floorMs: number): string {
  const perAgent = (pick: (x: ProcessSplit) => number): string => f((1000 * median(splits.map(pick))) / n, 3);
  const kernel = (cpu: (x: ProcessSplit) => number, sys: (x: ProcessSplit) => number): string => {
    const total = splits.reduce((a, x) => a + cpu(x), 0);
    return total > 0 ? `${f((100 * splits.reduce((a, x) => a + sys(x), 0)) / total, 0)} %` : 'n/a';
  };
  const main = `the main process ${perAgent((x) => x.mainS)} ms an agent (${kernel(
    (x) => x.mainS,
    (x) => x.mainSysS,
  )} of it in the kernel)`;
  const floor = `against the floor's one process's ${f(floorMs, 2)} ms`;
  const runs = `medians of ${splits.length} run${splits.length === 1 ? '' : 's'}, gross`;
  if (workers === 0)
    return `By process, this run (${runs}): ${main}, which also dials (\`--push-workers 0\`), ${floor}.`;
  const who = workers === 1 ? 'the push worker' : `the ${workers} push workers together`;
  return `By process, this run (${runs}): ${main}, ${who} ${perAgent((x) => x.childrenS)} ms (${kernel(
    (x) => x.childrenS,
    (x) => x.childrenSysS,
  )}), ${floor}.`;
}
