import { afterEach, describe, expect, it, vi } from 'vitest';
import { OldestFirstTimer } from '../../controller/push/oldest-first-timer.js';
import { MAX_TIMER_DELAY_MS } from '../../protocol/limits.js';

describe('OldestFirstTimer: one timer for deadlines set in order', () => {
  it('is due at the oldest deadline, then armed again for the next one, until none is left', async () => {
    const timeoutMs = 20;
    const t0 = performance.now();
    // two deadlines, the second set 30 ms after the first: one firing cannot settle both
    const starts = [t0, t0 + 30];
    const settled: number[] = [];
    const lateness: number[] = [];
    const all = new Promise<void>((resolve) => {
      const timer = new OldestFirstTimer(
        timeoutMs,
        () => starts[0],
        (now) => {
          // a timer may fire a little early (Node counts from its loop's cached time): then nothing
          // is settled and it is armed again
          while (starts.length > 0 && now - starts[0]! >= timeoutMs) {
            lateness.push(now - starts[0]! - timeoutMs);
            settled.push(starts.shift()!);
          }
          if (starts.length === 0) resolve();
        },
      );
      timer.arm();
      timer.arm(); // armed already: still one timer
    });
    await all;
    expect(settled).toEqual([t0, t0 + 30]);
    // each settled at or after its own deadline, never before
    expect(lateness.every((l) => l >= 0)).toBe(true);
  });

  it('arms nothing when no deadline is set, and nothing once stopped', () => {
    let oldestAsked = 0;
    const timer = new OldestFirstTimer(
      10,
      () => {
        oldestAsked++;
        return undefined;
      },
      () => {
        throw new Error('never due');
      },
    );
    timer.arm();
    expect(oldestAsked).toBe(1);
    timer.stop();
    timer.arm();
    expect(oldestAsked).toBe(1); // stopped: not even asked
  });

  describe('with a timeout past the longest Node timer', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    it('waits the longest timer and arms again, never firing at once', () => {
      vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
      const start = performance.now();
      const due: number[] = [];
      const timer = new OldestFirstTimer(
        MAX_TIMER_DELAY_MS + 60_000,
        () => (due.length < 2 ? start : undefined),
        (now) => due.push(now - start),
      );
      timer.arm();
      // unclamped, Node would take the delay as 1 ms: due at once, and again every millisecond
      vi.advanceTimersByTime(1_000);
      expect(due).toEqual([]);
      vi.advanceTimersByTime(MAX_TIMER_DELAY_MS - 1_000);
      expect(due).toEqual([MAX_TIMER_DELAY_MS]); // not yet past the deadline: armed for the rest
      vi.advanceTimersByTime(60_000);
      expect(due).toEqual([MAX_TIMER_DELAY_MS, MAX_TIMER_DELAY_MS + 60_000]);
      timer.stop();
    });
  });
});
