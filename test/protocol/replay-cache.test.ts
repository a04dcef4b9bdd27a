import { describe, expect, it } from 'vitest';
import { ReplayCache } from '../../protocol/replay-cache.js';
import { thrownCode as code } from '../helpers/codes.js';

describe('ReplayCache', () => {
  it('stays bounded when fed 10x its capacity of unexpired tokens, refusing rather than forgetting', () => {
    const cap = 10_000;
    const c = new ReplayCache(cap);
    let refused = 0;
    for (let i = 0; i < cap * 10; i++) {
      if (code(() => c.use(`jti-${i}`, 1_000, 0)) === 'replay_cache_full') refused++;
    }
    expect(c.size).toBe(cap);
    expect(refused).toBe(cap * 9);
    // every remembered token is still refused as a replay, none forgotten early
    for (const i of [0, 1, cap / 2, cap - 1]) expect(code(() => c.use(`jti-${i}`, 1_000, 0))).toBe('replayed');
  });

  it('makes room as entries expire, oldest expiry first', () => {
    const c = new ReplayCache(3);
    c.use('a', 10, 0);
    c.use('b', 20, 0);
    c.use('c', 30, 0);
    expect(code(() => c.use('d', 40, 5))).toBe('replay_cache_full');
    c.use('d', 40, 11); // 'a' expired at 10
    expect(c.has('a', 11)).toBe(false);
    expect(c.has('b', 11)).toBe(true);
    expect(c.size).toBe(3);
  });

  it('keeps an entry until strictly after its forget time', () => {
    const c = new ReplayCache(10);
    c.use('x', 100, 0);
    expect(code(() => c.use('x', 200, 100))).toBe('replayed');
    expect(code(() => c.use('x', 200, 101))).toBeUndefined();
  });

  it('memory per entry stays small at capacity (heap and map only)', () => {
    const before = process.memoryUsage().heapUsed;
    const c = new ReplayCache(100_000);
    for (let i = 0; i < 100_000; i++) c.use(`${i}`.padStart(22, 'A'), i, 0);
    const perEntry = (process.memoryUsage().heapUsed - before) / 100_000;
    expect(c.size).toBe(100_000);
    // generous bound: a regression that kept whole tokens (~300 B each) or copies would show
    expect(perEntry).toBeLessThan(400);
  });

  it('refuses a non-positive capacity', () => {
    expect(() => new ReplayCache(0)).toThrow(RangeError);
  });
});
