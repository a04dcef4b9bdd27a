import { describe, expect, it } from 'vitest';
import { byThreadText, threadCpuDelta, threadSamples, type ThreadSample } from '../../bench/util.js';

const t = (tid: number, kind: string, ns: number, runs: number): ThreadSample => ({ tid, kind, ns, runs });

describe('the idle footprint by thread', () => {
  it('subtracts each thread from itself, then sums by kind: a thread born in the window counts from zero, one that ended is lost', () => {
    const before = [t(1, 'main', 1_000, 10), t(2, 'node', 500, 5), t(3, 'node', 400, 4), t(4, 'node', 9_000, 90)];
    // 4 ended in the window; 5 was born in it
    const after = [t(1, 'main', 4_000, 22), t(2, 'node', 700, 6), t(3, 'node', 400, 4), t(5, 'node', 300, 2)];
    expect(threadCpuDelta(before, after)).toEqual([
      { kind: 'main', ns: 3_000, runs: 12 },
      { kind: 'node', ns: 500, runs: 3 },
    ]);
    // a kind that did nothing is left out, not shown as zero or less
    expect(threadCpuDelta([t(1, 'main', 5, 1), t(2, 'node', 7, 1)], [t(1, 'main', 9, 2), t(2, 'node', 7, 1)])).toEqual([
      { kind: 'main', ns: 4, runs: 1 },
    ]);
    expect(byThreadText([{ kind: 'main', ns: 8_947_056, runs: 25 }])).toBe('main 8.9 ms in 25 runs');
    expect(byThreadText(undefined)).toBe('n/a');
  });

  // vitest's forks pool: the test runs on the process's main thread, whose tid is its pid
  it('reads this process: its main thread apart from the helpers', () => {
    const a = threadSamples(process.pid);
    let x = 0;
    for (let i = 0; i < 5_000_000; i++) x += i % 7;
    expect(x).toBeGreaterThan(0);
    const b = threadSamples(process.pid);
    if (a === null || b === null) throw new Error('no /proc here');
    expect(b.filter((s) => s.kind === 'main').map((s) => s.tid)).toEqual([process.pid]);
    expect(b.every((s) => !/\d$/.test(s.kind))).toBe(true); // numbered names are grouped
    const d = threadCpuDelta(a, b);
    expect(d[0]?.kind).toBe('main'); // the loop ran on it: the most, first
    expect(d[0]?.ns).toBeGreaterThan(0);
  });

  it('is null for a process that is gone', () => {
    expect(threadSamples(2 ** 22 + 1)).toBeNull();
  });
});
