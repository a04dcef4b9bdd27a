import { describe, expect, it } from 'vitest';
import { splitByProcess, treeSample, type TreeSample } from '../../bench/util.js';

const tree = (byPid: TreeSample['byPid']): TreeSample => ({
  cpuS: Object.values(byPid).reduce((a, x) => a + x.cpuS, 0),
  rssKb: 0,
  pids: Object.keys(byPid).map(Number),
  byPid,
});

describe("the fan-out's controller CPU by process", () => {
  it('gives the root apart from its children, each with its kernel time; a child not alive at both ends is left out', () => {
    const before = tree({
      10: { cpuS: 1.0, sysS: 0.1, rssKb: 0 },
      11: { cpuS: 2.0, sysS: 0.5, rssKb: 0 },
      12: { cpuS: 7.0, sysS: 1.0, rssKb: 0 }, // ended in the window
    });
    const after = tree({
      10: { cpuS: 1.5, sysS: 0.15, rssKb: 0 },
      11: { cpuS: 2.75, sysS: 0.75, rssKb: 0 },
      13: { cpuS: 3.0, sysS: 0.3, rssKb: 0 }, // started in the window
    });
    const s = splitByProcess(before, after, 10);
    expect(s.mainS).toBeCloseTo(0.5, 9);
    expect(s.mainSysS).toBeCloseTo(0.05, 9);
    expect(s.childrenS).toBeCloseTo(0.75, 9);
    expect(s.childrenSysS).toBeCloseTo(0.25, 9);
  });

  it("reads this process's own CPU and kernel time from /proc", () => {
    const a = treeSample(process.pid);
    let x = 0;
    for (let i = 0; i < 5_000_000; i++) x += i % 7;
    expect(x).toBeGreaterThan(0);
    const b = treeSample(process.pid);
    const s = splitByProcess(a, b, process.pid);
    expect(s.mainS).toBeGreaterThan(0);
    expect(s.mainSysS).toBeGreaterThanOrEqual(0);
    expect(s.mainSysS).toBeLessThanOrEqual(s.mainS + 0.02); // ticks of 10 ms against ns
  });
});
