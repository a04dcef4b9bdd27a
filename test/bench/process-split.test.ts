import { describe, expect, it } from 'vitest';
import { byProcessText } from '../../bench/cpu-figures.js';
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
    // busy until this process has used 50 ms of CPU, however fast the machine
    const c0 = process.cpuUsage();
    let x = 0;
    while ((process.cpuUsage(c0).user + process.cpuUsage(c0).system) / 1000 < 50)
      for (let i = 0; i < 100_000; i++) x += i % 7;
    expect(x).toBeGreaterThan(0);
    const b = treeSample(process.pid);
    const s = splitByProcess(a, b, process.pid);
    expect(s.mainS).toBeGreaterThanOrEqual(0.045);
    expect(s.mainS).toBeLessThan(5);
    expect(s.mainSysS).toBeGreaterThanOrEqual(0);
    expect(s.mainSysS).toBeLessThanOrEqual(s.mainS + 0.011); // (stime's 10 ms ticks against schedstat's ns)
    expect(s.childrenS).toBe(0); // this process started no child in the window
  });

  it('says what each process is for as many push workers as the run had, and none when the main process dials', () => {
    const runs = [
      { mainS: 2, mainSysS: 0.1, childrenS: 2.5, childrenSysS: 0.5 },
      { mainS: 3, mainSysS: 0.2, childrenS: 3.5, childrenSysS: 0.5 },
    ];
    const one = byProcessText(runs, 10_000, 1, 0.34);
    expect(one).toContain('the main process 0.25 ms an agent (6 % of it in the kernel)'); // kernel: summed, 0.3 / 5
    expect(one).toContain('the push worker 0.3 ms (17 %)');
    expect(byProcessText(runs, 10_000, 2, 0.34)).toContain('the 2 push workers together 0.3 ms');
    const none = byProcessText([{ mainS: 4, mainSysS: 0.4, childrenS: 0, childrenSysS: 0 }], 10_000, 0, 0.34);
    expect(none).toContain('which also dials');
    expect(none).not.toContain('push worker');
  });
});
