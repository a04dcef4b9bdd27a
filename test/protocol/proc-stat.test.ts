import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { isLiveState, parseProcStat } from '../../protocol/proc-stat.js';

const LINE =
  '24728 (cat) R 24725 24725 15215 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 1 0 238151 3133440 389 18446744073709551615 0 0 0\n';

describe('parseProcStat', () => {
  it('reads state, parents, group, minor faults, CPU ticks and start time', () => {
    expect(parseProcStat(LINE)).toEqual({
      pid: 24728,
      comm: 'cat',
      state: 'R',
      ppid: 24725,
      pgrp: 24725,
      minorFaults: 100,
      utimeTicks: 7,
      stimeTicks: 3,
      startTimeTicks: '238151',
    });
  });

  it('counts fields from the last parenthesis, whatever the command name holds', () => {
    const s = parseProcStat(LINE.replace('(cat)', '(a) Z 1 (b c)'));
    expect(s).toMatchObject({ comm: 'a) Z 1 (b c', state: 'R', ppid: 24725, startTimeTicks: '238151' });
  });

  it('refuses what is not a stat line', () => {
    for (const bad of ['', 'garbage', '1 (x) R 1 2', LINE.replace('24725 24725', 'x y')])
      expect(parseProcStat(bad)).toBeUndefined();
  });

  it('parses this process as the kernel writes it', () => {
    if (!fs.existsSync('/proc/self/stat')) return;
    const s = parseProcStat(fs.readFileSync(`/proc/${process.pid}/stat`, 'latin1'))!;
    expect(s).toMatchObject({ pid: process.pid, ppid: process.ppid });
    expect(isLiveState(s.state)).toBe(true);
  });

  it('takes zombies and dead processes for gone', () => {
    expect(['R', 'S', 'D', 'T', 'I'].every(isLiveState)).toBe(true);
    expect(['Z', 'X', 'x'].some(isLiveState)).toBe(false);
  });
});
