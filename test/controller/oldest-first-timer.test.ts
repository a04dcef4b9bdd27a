import { describe, expect, it } from 'vitest';
import { OldestFirstTimer } from '../../controller/oldest-first-timer.js';

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
});
