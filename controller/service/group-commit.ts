/**
 * Group commit: changes that arrive together (signals and announcements from many agents after
 * a fan-out) share one transaction and so one fsync, instead of one each. Each change keeps its
 * own all-or-nothing (a savepoint inside the shared transaction), its own generation and its
 * own result or error; the promises settle only after the shared commit, so nothing is
 * acknowledged before it is durable.
 */
import type { Committed, Store, TxFn, UnitOutcome } from '../store/store.js';

/** Changes gathered into one commit at most. */
export const MAX_GROUP_COMMIT = 256;

interface Pending {
  fn: TxFn<unknown>;
  resolve: (v: Committed<unknown>) => void;
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

  /**
   * Runs `fn` in the next shared transaction (in its own savepoint); resolves after the commit
   * with its result and change set, or rejects with its error (or the shared commit's).
   */
  run<T>(fn: TxFn<T>): Promise<Committed<T>> {
    return new Promise<Committed<T>>((resolve, reject) => {
      this.#queue.push({ fn, resolve: resolve as (v: Committed<unknown>) => void, reject });
      if (this.#queue.length >= this.#max) void this.flush();
      else if (!this.#scheduled) {
        this.#scheduled = true;
        setImmediate(() => void this.flush());
      }
    });
  }

  /** Commits what is queued now; resolves once its promises are settled. Never rejects. */
  async flush(): Promise<void> {
    this.#scheduled = false;
    const batch = this.#queue;
    this.#queue = [];
    if (batch.length === 0) return;
    let outcomes: Array<UnitOutcome<unknown>>;
    try {
      outcomes = await this.#store.group(batch.map((p) => p.fn));
    } catch (err) {
      for (const p of batch) p.reject(err);
      return;
    }
    batch.forEach((p, i) => {
      const o = outcomes[i]!;
      if (o.ok) p.resolve(o.value);
      else p.reject(o.error);
    });
  }
}
