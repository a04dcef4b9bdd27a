/**
 * Row ids are UUIDv7: version and variant bits right, the time in the first 48 bits, and each
 * id greater than the one before it, within a millisecond, past a millisecond's counter and
 * when the clock steps back.
 */
import { beforeEach, describe, expect, it, vi } from 'vitest';

// each test with a fresh module: its last time and counter are module state
let newId: (nowMs?: number) => string;
beforeEach(async () => {
  vi.resetModules();
  ({ newId } = await import('../../controller/store/ids.js'));
});

const V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const msOf = (id: string): number => Number.parseInt(id.replace(/-/g, '').slice(0, 12), 16);

describe('newId', () => {
  it('is a UUIDv7 carrying the time it was made', () => {
    const before = Date.now();
    const id = newId();
    expect(id).toMatch(V7);
    expect(msOf(id)).toBeGreaterThanOrEqual(before);
    expect(msOf(id)).toBeLessThanOrEqual(Date.now());
  });

  it('increases within one millisecond, past its 4,096 counter values, and when the clock steps back', () => {
    const t = Date.now() + 60_000; // ahead of every id made so far
    const ids: string[] = [];
    for (let i = 0; i < 10_000; i++) ids.push(newId(t)); // more than a millisecond's counter holds
    ids.push(newId(t - 5_000)); // the clock stepped back
    ids.push(newId(t + 10_000));
    for (const id of ids) expect(id).toMatch(V7);
    for (let i = 1; i < ids.length; i++) expect(ids[i]! > ids[i - 1]!).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    // the spent counters borrowed the next milliseconds; a step back kept the time where it was
    expect(msOf(ids[9_999]!)).toBeGreaterThan(t);
    expect(msOf(ids[10_000]!)).toBeGreaterThan(t);
    expect(msOf(ids[10_001]!)).toBe(t + 10_000);
  });

  it('draws its last 62 bits at random', () => {
    const t = Date.now() + 120_000;
    const tails = new Set(Array.from({ length: 1_000 }, () => newId(t).slice(19)));
    expect(tails.size).toBe(1_000);
  });
});
