import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { addResident, heapNote, residentByKind, residentByKindOf, residentText } from '../../bench/util.js';

const SMAPS = `00400000-04e00000 r-xp 00000000 fd:00 123 /usr/bin/node
Size:              75776 kB
Rss:               40000 kB
05a00000-1d000000 rw-p 00000000 00:00 0                                  [heap]
Size:             382976 kB
Rss:              300000 kB
7f0000000000-7f0000040000 rw-p 00000000 00:00 0
Size:                256 kB
Rss:                 200 kB
7f0000100000-7f0000200000 rw-p 00000000 00:00 0                          [anon:v8]
Rss:                1000 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  64 kB
7f0000300000-7f0000301000 r--p 00000000 fd:00 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                   4 kB
7f0000400000-7f0000500000 rw-s 00000000 00:01 789 /memfd:pool (deleted)
Rss:                 500 kB
7f0000600000-7f0000700000 rw-s 00000000 00:01 790 /dev/zero (deleted)
Rss:                  30 kB
7f0000800000-7f0000801000 r--p 00000000 fd:00 457 /var/lib/a dir with spaces/lib.so (deleted)
Rss:                   8 kB
`;

describe('residentByKindOf', () => {
  it("puts each mapping's Rss under the malloc heap, other anonymous memory or files", () => {
    // shared anonymous memory (memfd, /dev/zero) is memory; a deleted file is still a file
    expect(residentByKindOf(SMAPS)).toEqual({ brk: 300_000, anon: 1_794, file: 40_012 });
  });

  it("adds up several processes' kinds, skipping the ones gone, and says so when none was read", () => {
    const a = residentByKindOf(SMAPS);
    expect(addResident([a, null, a])).toEqual({ brk: 600_000, anon: 3_588, file: 80_024 });
    expect(addResident([null])).toBeNull();
    expect(residentText({ brk: 485_776, anon: 135_744, file: 44_032 })).toBe(
      'malloc heap 474, other anonymous 133, files 43 MiB',
    );
    expect(
      residentText({ brk: 75_776, anon: 130_048, file: 47_104 }, heapNote({ totalKb: 104_448, usedKb: 92_160 })),
    ).toBe("malloc heap 74, other anonymous 127 (V8's heap 102, 90 used), files 46 MiB");
    expect(heapNote(undefined)).toBe('');
  });

  it("reads a live process's kinds, which add up to its resident set", () => {
    const p = residentByKind(process.pid);
    expect(p).not.toBeNull();
    const vmRss = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'))?.[1]);
    expect(p!.brk).toBeGreaterThan(0);
    expect(p!.anon).toBeGreaterThan(0);
    expect(p!.file).toBeGreaterThan(0);
    expect(Math.abs(p!.brk + p!.anon + p!.file - vmRss) / vmRss).toBeLessThan(0.1);
    expect(residentByKind(2 ** 22 + 12_345)).toBeNull();
  });
});
