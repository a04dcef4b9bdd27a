import { describe, expect, it } from 'vitest';
import { netCpuPerAgentMs, ratioToFloor } from '../../bench/cpu-figures.js';
import type { BenchResults } from '../../bench/results.js';

type Fanout = BenchResults['fanout'][number];
type Floor = NonNullable<BenchResults['floor']>;

/** Only what the verdict reads; the rest of a run does not enter it. */
const herald = (runs: Array<{ cpuS: number; fetchedMs: number; idle?: number }>): Fanout =>
  ({
    n: 1_000,
    runs: runs.map((r) => ({ controllerCpuS: r.cpuS, allFetchedMs: r.fetchedMs, controllerIdleCpuPerS: r.idle })),
  }) as unknown as Fanout;
const floor = (runs: Array<{ cpuS: number; fetchedMs: number; idle?: number }>): Floor =>
  ({
    n: 1_000,
    cpuPerAgentMs: runs[0]!.cpuS,
    controllerCpuS: runs[0]!.cpuS,
    allFetchedMs: runs[0]!.fetchedMs,
    runs: runs.map((r) => ({
      controllerCpuS: r.cpuS,
      allFetchedMs: r.fetchedMs,
      cpuPerAgentMs: r.cpuS,
      idleCpuPerS: r.idle,
    })),
  }) as unknown as Floor;

describe("the fan-out's verdict against the floor beside it", () => {
  it('takes off each side its background over its own window: CPU per agent less the quiet rate times the window', () => {
    // 1.0 s over a 10 s window with 0.03 s/s in the background: 0.7 s is the change's, 0.7 ms an agent of 1,000
    expect(netCpuPerAgentMs({ controllerCpuS: 1, allFetchedMs: 10_000 }, 0.03, 1_000)).toBeCloseTo(0.7, 9);
    // none sampled (an older result): counted in full; never below zero
    expect(netCpuPerAgentMs({ controllerCpuS: 1, allFetchedMs: 10_000 }, undefined, 1_000)).toBeCloseTo(1, 9);
    expect(netCpuPerAgentMs({ controllerCpuS: 0.1, allFetchedMs: 10_000 }, 0.5, 1_000)).toBe(0);
  });

  it('is the median of each run over the floor run before it, net by default and gross on request', () => {
    const h = herald([
      { cpuS: 0.8, fetchedMs: 10_000, idle: 0.02 }, // net 0.6
      { cpuS: 0.9, fetchedMs: 10_000, idle: 0.03 }, // net 0.6
      { cpuS: 2.0, fetchedMs: 10_000, idle: 0.05 }, // net 1.5
    ]);
    const f = floor([
      { cpuS: 0.4, fetchedMs: 5_000, idle: 0 },
      { cpuS: 0.5, fetchedMs: 5_000, idle: 0 },
      { cpuS: 0.4, fetchedMs: 5_000, idle: 0 },
    ]);
    // net ratios 1.5, 1.2, 3.75: the median 1.5; gross 2, 1.8, 5: 2
    expect(ratioToFloor(h, f)).toBeCloseTo(1.5, 9);
    expect(ratioToFloor(h, f, true)).toBeCloseTo(2, 9);
  });
});
