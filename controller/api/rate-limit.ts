/**
 * Token buckets per key (an identity and a route class): `burst` requests at once, then `perS`
 * a second. Bounded: when the map grows past its cap, buckets that have refilled (so hold no
 * information) are dropped.
 */
import { MAX_RATE_BUCKETS } from '../../protocol/limits.js';

export interface RateRule {
  burst: number;
  perS: number;
}

export type RateDecision = { ok: true } | { ok: false; retryAfterS: number };

interface Bucket {
  tokens: number;
  atMs: number;
}

export class RateLimiter {
  readonly #rule: RateRule;
  readonly #now: () => number;
  readonly #max: number;
  readonly #buckets = new Map<string, Bucket>();

  constructor(rule: RateRule, now: () => number = Date.now, maxBuckets = MAX_RATE_BUCKETS) {
    if (!(rule.burst >= 1) || !(rule.perS > 0)) throw new TypeError('a rate rule needs burst >= 1 and perS > 0');
    this.#rule = rule;
    this.#now = now;
    this.#max = maxBuckets;
  }

  /** Takes one token for `key`, or says how many whole seconds until one is free. */
  take(key: string): RateDecision {
    const now = this.#now();
    let b = this.#buckets.get(key);
    if (b === undefined) {
      if (this.#buckets.size >= this.#max) this.#sweep(now);
      b = { tokens: this.#rule.burst, atMs: now };
      this.#buckets.set(key, b);
    } else {
      b.tokens = Math.min(this.#rule.burst, b.tokens + ((now - b.atMs) / 1000) * this.#rule.perS);
      b.atMs = now;
    }
    if (b.tokens >= 1) {
      b.tokens -= 1;
      return { ok: true };
    }
    return { ok: false, retryAfterS: Math.max(1, Math.ceil((1 - b.tokens) / this.#rule.perS)) };
  }

  get size(): number {
    return this.#buckets.size;
  }

  #sweep(now: number): void {
    for (const [k, b] of this.#buckets) {
      if (b.tokens + ((now - b.atMs) / 1000) * this.#rule.perS >= this.#rule.burst) this.#buckets.delete(k);
    }
    // all busy: forget the oldest rather than grow without bound
    while (this.#buckets.size >= this.#max) {
      const first = this.#buckets.keys().next();
      if (first.done) break;
      this.#buckets.delete(first.value);
    }
  }
}
