import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { addRssParts, rssParts, rssPartsOf } from '../../bench/util.js';

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
`;

describe('rssPartsOf', () => {
  it("puts each mapping's Rss under the malloc heap, other anonymous memory or files", () => {
    expect(rssPartsOf(SMAPS)).toEqual({ heapKb: 300_000, anonKb: 1_264, fileKb: 40_004 });
  });

  it('adds up the parts of several processes, skipping the ones gone', () => {
    const a = rssPartsOf(SMAPS);
    expect(addRssParts([a, null, a])).toEqual({ heapKb: 600_000, anonKb: 2_528, fileKb: 80_008 });
  });

  it("reads a live process's parts, which add up to its resident set", () => {
    const p = rssParts(process.pid);
    expect(p).not.toBeNull();
    const vmRss = Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'))?.[1]);
    const sum = p!.heapKb + p!.anonKb + p!.fileKb;
    expect(p!.fileKb).toBeGreaterThan(0);
    expect(p!.anonKb).toBeGreaterThan(0);
    expect(Math.abs(sum - vmRss) / vmRss).toBeLessThan(0.1);
    expect(rssParts(2 ** 22 + 12_345)).toBeNull();
  });
});
