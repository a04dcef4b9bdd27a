/**
 * Group commit: changes that arrive together (signals and announcements from many agents after
 * a fan-out) share one transaction and so one fsync, instead of one each. Each change keeps its
 * own all-or-nothing (a savepoint inside the shared transaction) and its own result or error;
 * the promises settle only after the shared commit, so nothing is acknowledged before it is
 * durable.
 */
import type { Store } from './store.js';

/** Changes gathered into one commit at most. */
export const MAX_GROUP_COMMIT = 256;

interface Pending {
  fn: () => unknown;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

export class GroupCommitter {
  readonly #store: Store;
  readonly #max: number;
  #queue: Pending[] = [];
  #scheduled = false;

  constructor(store: Store, max = MAX_GROUP_COMMIT) {
    this.#store = store;
    this.#max = max;
  }

  /** Runs `fn` (store calls) in the next shared transaction; settles after its commit. */
  run<T>(fn: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.#queue.push({ fn, resolve: resolve as (v: unknown) => void, reject });
      if (this.#queue.length >= this.#max) this.flush();
      else if (!this.#scheduled) {
        this.#scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  /** Commits what is queued now. */
  flush(): void {
    this.#scheduled = false;
    const batch = this.#queue;
    this.#queue = [];
    if (batch.length === 0) return;
    const outcomes: Array<{ ok: true; v: unknown } | { ok: false; e: unknown }> = [];
    try {
      this.#store.group(() => {
        for (const p of batch) {
          try {
            outcomes.push({ ok: true, v: p.fn() });
          } catch (e) {
            outcomes.push({ ok: false, e });
          }
        }
      });
    } catch (err) {
      for (const p of batch) p.reject(err);
      return;
    }
    batch.forEach((p, i) => {
      const o = outcomes[i]!;
      if (o.ok) p.resolve(o.v);
      else p.reject(o.e);
    });
  }
}
