import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { PingWheel, type WheelMember } from '../../controller/push/ping-wheel.js';

interface M extends WheelMember {
  id: number;
}

describe('ping wheel', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('visits every member once per interval, spread over the slots, with one timer', () => {
    const seen: number[] = [];
    const wheel = new PingWheel<M>(30_000, (m) => seen.push(m.id), 30);
    const members = Array.from({ length: 90 }, (_, id) => ({ id, wheelSlot: -1 }));
    for (const m of members) wheel.add(m);
    expect(vi.getTimerCount()).toBe(1);
    vi.advanceTimersByTime(29_999);
    expect(seen).toHaveLength(0); // added just now: first visit a whole interval later
    vi.advanceTimersByTime(1);
    expect(new Set(seen).size).toBe(90);
    seen.length = 0;
    vi.advanceTimersByTime(30_000);
    expect(seen.sort((a, b) => a - b)).toEqual(members.map((m) => m.id));
    wheel.clear();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('members added over time are spread over the slots, and deleted ones are not visited', () => {
    const seen: Array<[number, number]> = [];
    const wheel = new PingWheel<M>(3_000, (m) => seen.push([m.id, Date.now()]), 3);
    const a = { id: 1, wheelSlot: -1 };
    const b = { id: 2, wheelSlot: -1 };
    const c = { id: 3, wheelSlot: -1 };
    wheel.add(a);
    vi.advanceTimersByTime(1_000);
    wheel.add(b);
    wheel.add(c);
    wheel.delete(c);
    expect(c.wheelSlot).toBe(-1);
    expect(wheel.size).toBe(2);
    const t0 = Date.now();
    vi.advanceTimersByTime(3_000);
    expect(seen.map(([id, at]) => [id, at - t0])).toEqual([
      [1, 2_000],
      [2, 3_000],
    ]);
    wheel.clear();
  });

  it('lets a visit delete members while the bucket is being visited', () => {
    const wheel: PingWheel<M> = new PingWheel<M>(1_000, (m) => wheel.delete(m), 1);
    for (let id = 0; id < 5; id++) wheel.add({ id, wheelSlot: -1 });
    vi.advanceTimersByTime(1_000);
    expect(wheel.size).toBe(0);
    wheel.clear();
  });
});
