/**
 * A fake clock for the agent's timers (agent/poller.ts `Timers`): time moves only when a test
 * calls `advance`, which fires the due timers in order and lets their promises settle.
 */
import type { Timers } from '../../agent/poller.js';

export class FakeClock implements Timers {
  t = 0;
  #seq = 0;
  readonly #q = new Map<number, { at: number; fn: () => void }>();
  now = (): number => this.t;
  setTimeout = (fn: () => void, ms: number): unknown => {
    const id = ++this.#seq;
    this.#q.set(id, { at: this.t + ms, fn });
    return id;
  };
  clearTimeout = (h: unknown): void => {
    this.#q.delete(h as number);
  };
  /** When the next timer fires, or null. */
  next(): number | null {
    let min: number | null = null;
    for (const e of this.#q.values()) if (min === null || e.at < min) min = e.at;
    return min;
  }
  /** Moves time forward by `ms`, firing due timers (and letting their promises settle). */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      let due: [number, { at: number; fn: () => void }] | undefined;
      for (const e of this.#q.entries()) if (e[1].at <= end && (!due || e[1].at < due[1].at)) due = e;
      if (!due) break;
      this.#q.delete(due[0]);
      this.t = due[1].at;
      due[1].fn();
      for (let i = 0; i < 10; i++) await Promise.resolve();
    }
    this.t = end;
    for (let i = 0; i < 10; i++) await Promise.resolve();
  }
}
