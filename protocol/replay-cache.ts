/**
 * Remembers accepted `jti`s until they expire, in bounded memory. When it is full of unexpired
 * entries it refuses (`replay_cache_full`) instead of forgetting one early: forgetting would let
 * a captured wake-up be replayed.
 *
 * Expiry is kept in a binary min-heap so that making room costs O(log n) per entry dropped,
 * never a scan of the whole cache (a scan per token would make a flood quadratic).
 */
import { RefusalError } from './errors.js';
import { REPLAY_CACHE_CAPACITY } from './limits.js';

export class ReplayCache {
  readonly capacity: number;
  readonly #expiry = new Map<string, number>();
  readonly #heap: Array<{ at: number; jti: string }> = [];

  constructor(capacity: number = REPLAY_CACHE_CAPACITY) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError('capacity must be a positive integer');
    this.capacity = capacity;
  }

  get size(): number {
    return this.#expiry.size;
  }

  /**
   * Records `jti` as used until `forgetAtS` (seconds). Throws if it is already recorded and not
   * yet forgettable, or if there is no room.
   * @throws RefusalError replayed | replay_cache_full
   */
  use(jti: string, forgetAtS: number, nowS: number): void {
    this.#evict(nowS);
    const at = this.#expiry.get(jti);
    if (at !== undefined) throw new RefusalError('replayed', 'this jti was already accepted');
    if (this.#expiry.size >= this.capacity) throw new RefusalError('replay_cache_full');
    this.#expiry.set(jti, forgetAtS);
    this.#push({ at: forgetAtS, jti });
  }

  /** Would `jti` be refused as a replay right now? (Does not record it.) */
  has(jti: string, nowS: number): boolean {
    this.#evict(nowS);
    return this.#expiry.has(jti);
  }

  #evict(nowS: number): void {
    const h = this.#heap;
    while (h.length > 0 && h[0]!.at < nowS) {
      const top = this.#pop()!;
      if (this.#expiry.get(top.jti) === top.at) this.#expiry.delete(top.jti);
    }
  }

  #push(e: { at: number; jti: string }): void {
    const h = this.#heap;
    h.push(e);
    let i = h.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (h[parent]!.at <= h[i]!.at) break;
      [h[parent], h[i]] = [h[i]!, h[parent]!];
      i = parent;
    }
  }

  #pop(): { at: number; jti: string } | undefined {
    const h = this.#heap;
    const top = h[0];
    const last = h.pop();
    if (h.length > 0 && last !== undefined) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && h[l]!.at < h[m]!.at) m = l;
        if (r < h.length && h[r]!.at < h[m]!.at) m = r;
        if (m === i) break;
        [h[m], h[i]] = [h[i]!, h[m]!];
        i = m;
      }
    }
    return top;
  }
}
