/**
 * Fallback polling with an injected clock (no real waiting), and the coalescer that wake-ups and
 * polls share.
 */
import { describe, expect, it } from 'vitest';
import { FetchCoalescer } from '../../agent/coalescer.js';
import { Poller } from '../../agent/poller.js';
import { FakeClock } from './fake-clock.js';

/** A poller on a fake clock; `held`: each poll stays in flight until `release()`. */
function poller(o: { healthy?: () => boolean; ok?: () => boolean; random?: () => number; held?: boolean } = {}) {
  const clock = new FakeClock();
  const at: number[] = [];
  let releaseHeld: (() => void) | undefined;
  const p = new Poller({
    intervalMs: 120_000,
    healthyIntervalMs: 600_000,
    timers: clock,
    random: o.random ?? (() => 0.5),
    isPushHealthy: o.healthy ?? (() => false),
    poll: async () => {
      at.push(clock.t);
      if (o.held) await new Promise<void>((r) => (releaseHeld = r));
      return o.ok ? o.ok() : true;
    },
  });
  return { clock, p, at, release: () => releaseHeld?.() };
}

describe('poller', () => {
  it('polls at once on start, then every interval', async () => {
    const { clock, p, at } = poller();
    p.start(true);
    await clock.advance(0);
    await clock.advance(360_000);
    expect(at).toEqual([0, 120_000, 240_000, 360_000]);
  });

  it('jitters each interval by at most ±10 %', async () => {
    let r = 0;
    const seq = [0, 1, 0.25, 0.999];
    const { clock, p, at } = poller({ random: () => seq[r++ % seq.length]! });
    p.start(false);
    await clock.advance(1_000_000);
    const gaps = at.map((t, i) => t - (at[i - 1] ?? 0));
    for (const g of gaps) {
      expect(g).toBeGreaterThanOrEqual(108_000);
      expect(g).toBeLessThanOrEqual(132_000);
    }
    expect(new Set(gaps).size).toBeGreaterThan(1);
  });

  it('stretches to the healthy interval while push is healthy and drops back the moment it closes', async () => {
    let healthy = true;
    const { clock, p, at } = poller({ healthy: () => healthy });
    p.start(true);
    await clock.advance(0);
    expect(p.nextDueAt).toBe(600_000);
    await clock.advance(50_000);
    healthy = false;
    p.pushChanged();
    expect(p.nextDueAt).toBe(120_000);
    await clock.advance(50_000);
    await clock.advance(20_000);
    expect(at).toEqual([0, 120_000]);
    expect(p.nextDueAt).toBe(240_000);
  });

  it('retries a failed poll sooner, with backoff, never later than the interval', async () => {
    let ok = false;
    const { clock, p, at } = poller({ ok: () => ok, random: () => 0.999 });
    p.start(true);
    await clock.advance(0);
    await clock.advance(8_000);
    // ceilings 1 s, 2 s, 4 s: three retries within 8 s
    expect(at.length).toBeGreaterThanOrEqual(4);
    ok = true;
    await clock.advance(200_000);
    const last = at.slice(-2);
    expect(last[1]! - last[0]!).toBeGreaterThan(100_000);
  });

  it("a failed fetch outside a poll (a wake-up's) brings the next poll forward, as a failed poll would", async () => {
    const { clock, p, at } = poller({ healthy: () => true, random: () => 0.999 });
    p.start(true);
    await clock.advance(0);
    expect(p.nextDueAt).toBeGreaterThan(500_000);
    await clock.advance(50_000);
    p.fetchFailed();
    // first retry ceiling 1 s (full jitter), not the 600 s healthy interval
    expect(p.nextDueAt).toBeLessThanOrEqual(51_000);
    await clock.advance(1_000);
    expect(at.length).toBe(2);
    expect(at[1]).toBeGreaterThan(50_000);
    expect(at[1]).toBeLessThanOrEqual(51_000);
    // that poll succeeded: back to the long interval
    expect(p.nextDueAt! - at[1]!).toBeGreaterThan(500_000);
  });

  it("a wake-up's fetch that got an answer counts as a poll: the next poll comes one interval after it", async () => {
    const { clock, p, at } = poller();
    p.start(true);
    await clock.advance(0);
    expect(p.nextDueAt).toBe(120_000);
    await clock.advance(100_000);
    p.fetched();
    expect(p.nextDueAt).toBe(220_000);
    await clock.advance(119_999);
    expect(at).toEqual([0]);
    await clock.advance(1);
    expect(at).toEqual([0, 220_000]);
  });

  it('push lost soon after a fetched wake-up: the poll keeps its time, an interval after that fetch, and does not fall inside the redial', async () => {
    let healthy = true;
    const { clock, p, at } = poller({ healthy: () => healthy, random: () => 0 });
    p.start(true);
    await clock.advance(0);
    await clock.advance(400_000);
    p.fetched();
    // healthy: the long interval from the fetch (600 s × 0.9 at this random value)
    expect(p.nextDueAt).toBe(400_000 + 540_000);
    await clock.advance(10_000);
    healthy = false;
    p.pushChanged();
    // not overdue: the short interval (120 s × 0.9) from the fetch, not a spread poll from 410 s
    // (which would come at 410 s + 27 s)
    expect(p.nextDueAt).toBe(400_000 + 108_000);
    await clock.advance(97_999);
    expect(at).toEqual([0]);
    await clock.advance(1);
    expect(at).toEqual([0, 508_000]);
  });

  it('push lost most of an interval after a fetched wake-up: the poll due in the redial is spread over the interval after it', async () => {
    // a change to the whole fleet plans every agent's next poll an interval from the same moment
    let healthy = false;
    const { clock, p, at } = poller({ healthy: () => healthy });
    p.start(true);
    await clock.advance(0);
    await clock.advance(100_000);
    p.fetched();
    expect(p.nextDueAt).toBe(220_000);
    healthy = true;
    p.pushChanged(); // the long interval, from the fetch
    expect(p.nextDueAt).toBe(700_000);
    await clock.advance(102_000);
    healthy = false;
    p.pushChanged(); // lost at 202 s: the short interval from the fetch would poll at 220 s, 18 s later
    const least = 120_000 * 0.25;
    expect(p.nextDueAt).toBe(202_000 + least + 0.5 * (120_000 - least));
    await clock.advance(least + 44_999);
    expect(at).toEqual([0]);
    await clock.advance(1);
    expect(at).toEqual([0, 277_000]);
  });

  it('a poll that ends after a stop() and start() leaves one poll planned, not two', async () => {
    const { clock, p, at, release } = poller({ held: true });
    p.start(true);
    await clock.advance(1_000);
    p.stop();
    p.start(); // plans a poll an interval from now, while the first one is still running
    await clock.advance(1_000);
    release();
    await clock.advance(0);
    expect(p.nextDueAt).toBe(122_000);
    await clock.advance(300_000);
    // one poll at 122 s and, that one never ending, none after it
    expect(at).toEqual([0, 122_000]);
  });

  it('a fetch answered before start, after stop or during a poll plans nothing of its own', async () => {
    let release: (() => void) | undefined;
    const clock = new FakeClock();
    const p = new Poller({
      intervalMs: 120_000,
      healthyIntervalMs: 600_000,
      timers: clock,
      random: () => 0.5,
      isPushHealthy: () => false,
      poll: () =>
        new Promise<boolean>((r) => {
          release = () => r(true);
        }),
    });
    p.fetched();
    expect(p.nextDueAt).toBeNull();
    await clock.advance(200_000);
    expect(p.polls).toBe(0);
    p.start(true);
    await clock.advance(0);
    await clock.advance(5_000);
    // the start-up poll is still in flight: its own end plans the next one
    p.fetched();
    expect(p.nextDueAt).toBeNull();
    release?.();
    await clock.advance(0);
    expect(p.nextDueAt).toBe(200_000 + 5_000 + 120_000);
    p.stop();
    p.fetched();
    expect(p.nextDueAt).toBeNull();
    await clock.advance(600_000);
    expect(p.polls).toBe(1);
  });

  it('honours a Retry-After floor on the retry, once', async () => {
    let ok = false;
    const { clock, p, at } = poller({ ok: () => ok, random: () => 0 });
    p.start(true);
    await clock.advance(0);
    p.fetchFailed(7_000);
    expect(p.nextDueAt).toBe(7_000);
    ok = true;
    await clock.advance(7_000);
    expect(at).toEqual([0, 7_000]);
    expect(p.nextDueAt).toBe(7_000 + 108_000);
  });

  it('when push is lost long after the last poll, polls at a random moment within one interval, not at once (no herd)', async () => {
    let healthy = true;
    let r = 0.25;
    const { clock, p, at } = poller({ healthy: () => healthy, random: () => r });
    p.start(true);
    await clock.advance(0);
    await clock.advance(400_000);
    // the controller died: every agent's push drops now; the short interval passed long ago
    healthy = false;
    r = 0.75;
    p.pushChanged();
    // the jittered interval is 126 s at this random value (120 s × 1.05); the poll comes past its
    // first quarter (31.5 s), at 0.75 of the rest (70.875 s)
    expect(p.nextDueAt).toBe(400_000 + 31_500 + 70_875);
    await clock.advance(102_375);
    expect(at).toEqual([0, 502_375]);
  });

  it('when push is lost long after the last poll, no poll comes in the first quarter of the interval (the controller redials first)', async () => {
    let healthy = true;
    const { clock, p, at } = poller({ healthy: () => healthy, random: () => 0 });
    p.start(true);
    await clock.advance(0);
    await clock.advance(400_000);
    healthy = false;
    p.pushChanged();
    // the earliest moment: a quarter of the jittered interval (108 s at this random value)
    expect(p.nextDueAt).toBe(400_000 + 27_000);
    await clock.advance(26_999);
    expect(at).toEqual([0]);
    await clock.advance(1);
    expect(at).toEqual([0, 427_000]);
  });

  it('stretches a poll planned while push was down once push is healthy again before it came', async () => {
    let healthy = true;
    const { clock, p, at } = poller({ healthy: () => healthy, random: () => 0.5 });
    const push = (up: boolean): void => {
      healthy = up;
      p.pushChanged();
    };
    p.start(true);
    await clock.advance(0);
    await clock.advance(400_000);
    // the controller died: the overdue poll comes within one interval, past its first quarter
    // (30 s, then 0.5 of the 90 s left)
    push(false);
    expect(p.nextDueAt).toBe(475_000);
    // it came back and dialled this agent before that poll: the poll goes back to the long
    // interval from the last one (600 s at this random value)
    await clock.advance(10_000);
    push(true);
    expect(p.nextDueAt).toBe(600_000);
    await clock.advance(60_000);
    expect(at).toEqual([0]);
    await clock.advance(130_000);
    expect(at).toEqual([0, 600_000]);
    // lost again just after that poll, back 30 s later: the short poll (at 720 s) becomes a long one
    push(false);
    expect(p.nextDueAt).toBe(720_000);
    await clock.advance(30_000);
    push(true);
    expect(p.nextDueAt).toBe(1_200_000);
    await clock.advance(200_000);
    expect(at).toEqual([0, 600_000]);
  });

  it('a retry after a failed poll is not stretched when push is healthy again', async () => {
    let healthy = false;
    let ok = false;
    const { clock, p, at } = poller({ healthy: () => healthy, ok: () => ok, random: () => 0.999 });
    p.start(true);
    await clock.advance(0);
    const retryAt = p.nextDueAt!;
    expect(retryAt).toBeLessThanOrEqual(1_000);
    healthy = true;
    ok = true;
    p.pushChanged();
    expect(p.nextDueAt).toBe(retryAt);
    await clock.advance(1_000);
    expect(at.length).toBe(2);
  });

  it('stop() cancels the next poll', async () => {
    const { clock, p, at } = poller();
    p.start(true);
    await clock.advance(0);
    p.stop();
    await clock.advance(1_000_000);
    expect(at).toEqual([0]);
    expect(p.nextDueAt).toBeNull();
  });
});

describe('coalescer', () => {
  function make(initial?: number) {
    const release: Array<(gen: number) => void> = [];
    let fetches = 0;
    const c = new FetchCoalescer({
      initialFetchedGen: initial,
      fetch: () => {
        fetches++;
        return new Promise((resolve) => release.push((gen) => resolve({ gen })));
      },
    });
    return { c, release, fetches: () => fetches };
  }

  it('one fetch in flight, at most one queued, whatever the number of requests', async () => {
    const { c, release, fetches } = make();
    expect(c.wake(1)).toBe('started');
    for (let i = 2; i < 500; i++) expect(c.wake(i)).toBe('queued');
    expect(c.poll()).toBe('queued');
    expect(fetches()).toBe(1);
    release.shift()!(10);
    await Promise.resolve();
    await new Promise((r) => setImmediate(r));
    expect(fetches()).toBe(2);
    release.shift()!(499);
    await c.idle();
    expect(fetches()).toBe(2);
    expect(c.lastFetchedGen).toBe(499);
    expect(c.wake(499)).toBe('current');
  });

  it('drops a queued wake-up that the fetch in flight already covered', async () => {
    const { c, release, fetches } = make();
    c.wake(1);
    c.wake(5);
    release.shift()!(5);
    await c.idle();
    expect(fetches()).toBe(1);
  });

  it('a claimed gen never covers a later wake-up: only the fetched generation does', async () => {
    const { c, release, fetches } = make(10);
    expect(c.wake(Number.MAX_SAFE_INTEGER)).toBe('started');
    release.shift()!(11);
    await c.idle();
    expect(c.lastFetchedGen).toBe(11);
    expect(c.wake(12)).toBe('started');
    expect(fetches()).toBe(2);
    release.shift()!(12);
    await c.idle();
    expect(c.wake(12)).toBe('current');
  });

  it('still runs the queued fetch when the one in flight failed', async () => {
    let n = 0;
    const c = new FetchCoalescer({
      fetch: async () => {
        n++;
        if (n === 1) throw new Error('down');
        return { gen: 3 };
      },
    });
    c.wake(3);
    c.wake(3);
    await c.idle();
    expect(n).toBe(2);
    expect(c.lastFetchedGen).toBe(3);
  });
});
