/**
 * controller/idle-collector.ts: a full collection once the main process is quiet with garbage in
 * its heap, and only then.
 */
import { describe, expect, it } from 'vitest';
import { IdleCollector, type IdleCollectorProbe, v8Probe } from '../../controller/idle-collector.js';

const MiB = 2 ** 20;

/** A probe whose load and heap the test sets; a collection brings the heap down to `live`. */
function fakeProbe(): IdleCollectorProbe & { busy: number; used: number; live: number; collections: number } {
  const p = {
    busy: 0,
    used: 10 * MiB,
    live: 10 * MiB,
    collections: 0,
    utilization: () => p.busy,
    usedHeapBytes: () => p.used,
    collect: async () => {
      p.collections++;
      p.used = p.live;
    },
  };
  return p;
}

const options = { everyMs: 5_000, maxUtilization: 0.25, minGarbageBytes: 32 * MiB };

describe('IdleCollector', () => {
  it('collects when the loop was quiet and the heap grew by the threshold, and reports before and after', async () => {
    const p = fakeProbe();
    const seen: Array<[number, number]> = [];
    const c = new IdleCollector(p, { ...options, onCollected: (b, a) => seen.push([b, a]) });
    p.used = 111 * MiB;
    p.live = 25 * MiB;
    expect(await c.check()).toBe(true);
    expect(p.collections).toBe(1);
    expect(seen).toEqual([[111 * MiB, 25 * MiB]]);
    // nothing new since: no second collection
    expect(await c.check()).toBe(false);
    expect(p.collections).toBe(1);
  });

  it('leaves a busy loop alone, and a heap that grew by less than the threshold', async () => {
    const p = fakeProbe();
    const c = new IdleCollector(p, options);
    p.used = 200 * MiB;
    p.busy = 0.5;
    expect(await c.check()).toBe(false);
    p.busy = 0.05;
    p.used = 10 * MiB + 31 * MiB;
    expect(await c.check()).toBe(false);
    expect(p.collections).toBe(0);
  });

  it('counts from the lowest heap it has seen, busy or not (V8 collected on its own)', async () => {
    const p = fakeProbe();
    p.used = 60 * MiB;
    const c = new IdleCollector(p, options); // started at 60 MiB
    p.busy = 0.9;
    p.used = 15 * MiB; // a mark-compact of V8's own, seen while busy
    expect(await c.check()).toBe(false);
    p.busy = 0;
    p.used = 15 * MiB + 33 * MiB; // 48 MiB: under 60 + 32, over 15 + 32
    expect(await c.check()).toBe(true);
  });

  it('runs one collection at a time', async () => {
    const p = fakeProbe();
    let release = (): void => undefined;
    p.collect = () =>
      new Promise<void>((resolve) => {
        p.collections++;
        release = resolve;
      });
    const c = new IdleCollector(p, options);
    p.used = 100 * MiB;
    const first = c.check();
    expect(await c.check()).toBe(false);
    release();
    expect(await first).toBe(true);
    expect(p.collections).toBe(1);
  });
});

describe('v8Probe', () => {
  it("collects what this process's old generation holds and no longer uses", async () => {
    const probe = v8Probe();
    const seen: Array<[number, number]> = [];
    // this loop is busy, so any load counts as quiet here; the baseline is the heap before the garbage
    const c = new IdleCollector(probe, { ...options, maxUtilization: 1, onCollected: (b, a) => seen.push([b, a]) });
    // ~64 MiB kept across several scavenges (promoted to the old generation), then let go; the
    // check follows at once, before V8 could collect it on its own
    let kept: number[][] | null = [];
    for (let i = 0; i < 16 * 1024; i++) kept.push(new Array(512).fill(i));
    for (let i = 0; i < 64; i++) new Array(64 * 1024).fill(i); // more allocation: scavenges promote `kept`
    expect(kept.length).toBe(16 * 1024);
    kept = null;
    expect(await c.check()).toBe(true);
    const [before, after] = seen[0]!;
    expect(before - after).toBeGreaterThan(32 * MiB);
  });

  it('reads the event loop as busy a fraction of the time since the last read', async () => {
    const probe = v8Probe();
    const u = probe.utilization();
    expect(u).toBeGreaterThanOrEqual(0);
    expect(u).toBeLessThanOrEqual(1);
  });
});
