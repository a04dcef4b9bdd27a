import { describe, expect, it } from 'vitest';
import { byThreadText, threadCpu, threadCpuDelta } from '../../bench/util.js';

describe('the idle footprint by thread', () => {
  it('reads the main thread apart from the helpers, and the window is the difference of two samples', () => {
    const a = threadCpu(process.pid);
    expect(a?.find((t) => t.kind === 'main')?.ns).toBeGreaterThan(0);
    let x = 0;
    for (let i = 0; i < 5_000_000; i++) x += i % 7;
    expect(x).toBeGreaterThan(0);
    const b = threadCpu(process.pid);
    if (a === null || b === null) throw new Error('no /proc here');
    const d = threadCpuDelta(a, b);
    expect(d[0]?.kind).toBe('main'); // the loop ran on it: the most, first
    expect(d[0]?.ns).toBeGreaterThan(0);
    expect(byThreadText(d)).toMatch(/^main [\d.]+ ms in \d+ runs/);
    expect(byThreadText(undefined)).toBe('n/a');
  });

  it('is null for a process that is gone', () => {
    expect(threadCpu(2 ** 22 + 1)).toBeNull();
  });
});
