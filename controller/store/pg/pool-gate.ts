/**
 * The bounded wait in front of the PostgreSQL pool. The client (postgres.js) queues a query
 * while every pooled connection is busy, without a bound and without a deadline: while the
 * database stalled (a table lock, a slow disk), every request that came meanwhile waited with
 * it, in memory, and was answered only when the database recovered. Here every use of the pool
 * first takes one of `permits` places (one per pooled connection, so the client's own queue
 * stays empty); a caller finding none waits at most `waitMs`, behind at most `maxWaiting`
 * others, first come first served, and is otherwise refused `store_unavailable` (the API's 503
 * with Retry-After): at once when the queue is full. docs/limits.md: PG_POOL_WAIT_MS,
 * PG_POOL_QUEUE_ENTRIES.
 *
 * When a holder fails `store_unavailable` (its statement timed out, its lock wait gave up, its
 * connection broke), every caller waiting at that moment is refused too, at once: each would
 * otherwise be handed the place and wait out the same timeout again, and the last of a queue
 * would be answered only after several timeouts in a row. Callers that come later try again.
 *
 * A holder must not use the gate again before it lets go (a nested use can wait for itself).
 */
import { codeOf, HeraldError } from '../../../protocol/errors.js';

export interface PoolGateOptions {
  /** Places: the pooled connections. */
  permits: number;
  /** Longest wait for a place (ms). */
  waitMs: number;
  /** Callers waiting at most; one more is refused at once. */
  maxWaiting: number;
}

interface Waiter {
  grant: () => void;
  refuse: (err: HeraldError) => void;
  timer: NodeJS.Timeout;
}

export class PoolGate {
  #free: number;
  readonly #waitMs: number;
  readonly #maxWaiting: number;
  /** In arrival order (a Set keeps it, and a waiter that gave up leaves in O(1)). */
  readonly #waiting = new Set<Waiter>();

  /** @throws RangeError when an option is not a positive integer (maxWaiting may be 0) */
  constructor(o: PoolGateOptions) {
    for (const [name, v, min] of [
      ['permits', o.permits, 1],
      ['waitMs', o.waitMs, 1],
      ['maxWaiting', o.maxWaiting, 0],
    ] as const)
      if (!Number.isInteger(v) || v < min) throw new RangeError(`PoolGate: ${name} must be an integer >= ${min}`);
    this.#free = o.permits;
    this.#waitMs = o.waitMs;
    this.#maxWaiting = o.maxWaiting;
  }

  /** Callers waiting for a place now. */
  get waiting(): number {
    return this.#waiting.size;
  }

  /**
   * Runs `fn` holding a place; lets go when it settles.
   * @throws HeraldError store_unavailable when no place came within `waitMs`, at once when
   *   `maxWaiting` callers wait already, or when the holder before it failed store_unavailable
   *   (`fn` is not run then)
   */
  run<T>(fn: () => Promise<T>): Promise<T> {
    // a free place is taken and `fn` started in this same turn, as without the gate (a caller
    // that checks its own state first sees it as it is now, not a turn later)
    if (this.#free > 0) {
      this.#free--;
      return this.#hold(fn);
    }
    return this.#wait().then(() => this.#hold(fn));
  }

  async #hold<T>(fn: () => Promise<T>): Promise<T> {
    let stalled = false;
    try {
      return await fn();
    } catch (err) {
      stalled = codeOf(err) === 'store_unavailable';
      throw err;
    } finally {
      if (stalled) this.#refuseWaiting();
      this.#release();
    }
  }

  /** Waits for a place handed over by a holder that lets go. */
  #wait(): Promise<void> {
    if (this.#waiting.size >= this.#maxWaiting)
      return Promise.reject(
        new HeraldError(
          'store_unavailable',
          `the database is not answering: ${this.#waiting.size} requests wait for a connection already`,
        ),
      );
    return new Promise<void>((resolve, reject) => {
      const w: Waiter = {
        grant: resolve,
        refuse: reject,
        timer: setTimeout(() => {
          this.#waiting.delete(w);
          reject(
            new HeraldError(
              'store_unavailable',
              `the database is not answering: no connection within ${this.#waitMs} ms`,
            ),
          );
        }, this.#waitMs),
      };
      this.#waiting.add(w);
    });
  }

  #refuseWaiting(): void {
    const err = new HeraldError(
      'store_unavailable',
      'the database is not answering: the request before this one timed out',
    );
    for (const w of this.#waiting) {
      clearTimeout(w.timer);
      w.refuse(err);
    }
    this.#waiting.clear();
  }

  #release(): void {
    const next = this.#waiting.values().next();
    if (next.done) {
      this.#free++;
      return;
    }
    // handed over: the place stays taken
    this.#waiting.delete(next.value);
    clearTimeout(next.value.timer);
    next.value.grant();
  }
}
