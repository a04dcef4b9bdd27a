import { MAX_TIMER_DELAY_MS } from '../../protocol/limits.js';

/**
 * One timer for many deadlines that are set in the order they fall due (each `timeoutMs` after
 * its start, on the monotonic clock `performance.now()`): it is due at the oldest's deadline,
 * hands `onDue` the time, and arms itself again for whatever is oldest then. A push worker and
 * the pool in the main process each watch their requests with one (a fan-out answers thousands
 * a second: a timer per request was most of what answering one allocated).
 */
export class OldestFirstTimer {
  readonly #timeoutMs: number;
  readonly #oldestAt: () => number | undefined;
  readonly #onDue: (now: number) => void;
  #timer: NodeJS.Timeout | null = null;
  #stopped = false;

  /**
   * @param oldestAt the start (performance.now()) of the oldest deadline still set, if any
   * @param onDue called when the oldest may be due: settles every deadline past `now - timeoutMs`
   */
  constructor(timeoutMs: number, oldestAt: () => number | undefined, onDue: (now: number) => void) {
    this.#timeoutMs = timeoutMs;
    this.#oldestAt = oldestAt;
    this.#onDue = onDue;
  }

  /** Makes sure the timer is set for the oldest deadline (call after setting one). */
  arm(): void {
    if (this.#timer !== null || this.#stopped) return;
    const at = this.#oldestAt();
    if (at === undefined) return;
    this.#timer = setTimeout(
      () => {
        this.#timer = null;
        this.#onDue(performance.now());
        this.arm();
      },
      // (a deadline past Node's longest timer is reached by arming again: nothing is due before it)
      Math.min(MAX_TIMER_DELAY_MS, Math.max(0, at + this.#timeoutMs - performance.now())),
    );
    this.#timer.unref();
  }

  /** Clears the timer for good. */
  stop(): void {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }
}
