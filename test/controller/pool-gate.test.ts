/**
 * The bounded wait in front of the PostgreSQL pool (controller/store/pg/pool-gate.ts), with a fake clock:
 * a place per connection, a queue of bounded length whose callers wait a bounded time, and a
 * stall seen by one holder refused at once to everyone queued behind it. The real database
 * behind it: test/controller/pg-store.test.ts "a stalled database" and
 * test/controller/pg-stall.test.ts.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { HeraldError } from '../../protocol/errors.js';
import { PoolGate } from '../../controller/store/pg/pool-gate.js';
import { rejectedCode } from '../helpers/controller-codes.js';

/** A holder that runs until `finish()` (or `fail()`) is called. */
function holder(): { run: () => Promise<string>; started: boolean; finish(): void; fail(err: unknown): void } {
  let resolve!: (v: string) => void;
  let reject!: (e: unknown) => void;
  const h = {
    started: false,
    run: () => {
      h.started = true;
      return new Promise<string>((res, rej) => {
        resolve = res;
        reject = rej;
      });
    },
    finish: () => resolve('done'),
    fail: (err: unknown) => reject(err),
  };
  return h;
}

/** Lets the promise callbacks queued so far run. */
const settle = () => vi.advanceTimersByTimeAsync(0);

describe('PoolGate: a bounded wait for a pooled connection', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('runs up to `permits` at once and hands a freed place to the first in line', async () => {
    const gate = new PoolGate({ permits: 2, waitMs: 1_000, maxWaiting: 10 });
    const [a, b, c, d] = [holder(), holder(), holder(), holder()];
    const runs = [a, b, c, d].map((h) => gate.run(h.run));
    await settle();
    expect([a.started, b.started, c.started, d.started]).toEqual([true, true, false, false]);
    expect(gate.waiting).toBe(2);
    b.finish();
    await settle();
    expect([c.started, d.started]).toEqual([true, false]);
    a.finish();
    c.finish();
    await settle();
    expect(d.started).toBe(true);
    d.finish();
    expect(await Promise.all(runs)).toEqual(['done', 'done', 'done', 'done']);
    expect(gate.waiting).toBe(0);
  });

  it('refuses store_unavailable a caller that got no place within waitMs, without running it', async () => {
    const gate = new PoolGate({ permits: 1, waitMs: 1_000, maxWaiting: 10 });
    const a = holder();
    const b = holder();
    void gate.run(a.run);
    const late = rejectedCode(gate.run(b.run));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(await late).toBe('store_unavailable');
    expect(b.started).toBe(false);
    expect(gate.waiting).toBe(0);
    // the place is still the holder's; once it lets go, the next caller runs at once
    a.finish();
    await settle();
    expect(await gate.run(() => Promise.resolve('next'))).toBe('next');
  });

  it('refuses store_unavailable at once a caller beyond maxWaiting', async () => {
    const gate = new PoolGate({ permits: 1, waitMs: 1_000, maxWaiting: 2 });
    const a = holder();
    void gate.run(a.run);
    const queued = [gate.run(() => Promise.resolve(1)), gate.run(() => Promise.resolve(2))];
    const over = holder();
    // no time passes: the refusal does not wait for waitMs
    expect(await rejectedCode(gate.run(over.run))).toBe('store_unavailable');
    expect(over.started).toBe(false);
    expect(gate.waiting).toBe(2);
    a.finish();
    expect(await Promise.all(queued)).toEqual([1, 2]);
  });

  it("a holder's store_unavailable refuses every caller waiting then, at once; a later caller runs", async () => {
    const gate = new PoolGate({ permits: 1, waitMs: 60_000, maxWaiting: 10 });
    const a = holder();
    const first = gate.run(a.run);
    const waiting = [holder(), holder(), holder()];
    const refused = waiting.map((h) => rejectedCode(gate.run(h.run)));
    await settle();
    a.fail(new HeraldError('store_unavailable', 'statement timeout'));
    expect(await rejectedCode(first)).toBe('store_unavailable');
    expect(await Promise.all(refused)).toEqual(['store_unavailable', 'store_unavailable', 'store_unavailable']);
    expect(waiting.some((h) => h.started)).toBe(false);
    expect(gate.waiting).toBe(0);
    expect(await gate.run(() => Promise.resolve('after'))).toBe('after');
  });

  it('another error of a holder is its own: the next caller gets the place', async () => {
    const gate = new PoolGate({ permits: 1, waitMs: 60_000, maxWaiting: 10 });
    const a = holder();
    const first = gate.run(a.run);
    const next = gate.run(() => Promise.resolve('next'));
    await settle();
    a.fail(new HeraldError('not_found', 'no such row'));
    expect(await rejectedCode(first)).toBe('not_found');
    expect(await next).toBe('next');
  });

  it('refuses options that are not positive integers', () => {
    expect(() => new PoolGate({ permits: 0, waitMs: 1, maxWaiting: 0 })).toThrow(RangeError);
    expect(() => new PoolGate({ permits: 1, waitMs: 0.5, maxWaiting: 0 })).toThrow(RangeError);
    expect(() => new PoolGate({ permits: 1, waitMs: 1, maxWaiting: -1 })).toThrow(RangeError);
  });
});
