/**
 * Token buckets per key (an identity and a route class): `burst` requests at once, then `perS`
 * a second. Bounded: when the map grows past its cap, buckets that have refilled (so hold no
 * information) are dropped.
 */
import {
  ANNOUNCE_RATE_BURST,
  ANNOUNCE_RATE_PER_S,
  API_RATE_BURST,
  API_RATE_PER_S,
  ENROLL_NETWORK_RATE_BURST,
  ENROLL_NETWORK_RATE_PER_S,
  ENROLL_RATE_BURST,
  ENROLL_RATE_PER_S,
  FETCH_RATE_BURST,
  FETCH_RATE_PER_S,
  MAX_RATE_BUCKETS,
  OUTPUT_RATE_BURST,
  OUTPUT_RATE_PER_S,
  SIGNAL_RATE_BURST,
  SIGNAL_RATE_PER_S,
} from '../../protocol/limits.js';
import type { RateClass } from './router.js';

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

/** Rate rules by route class, and `enrollNetwork`: enrolment attempts per source network. */
export type RateOverrides = Partial<Record<RateClass | 'enrollNetwork', RateRule>>;

/**
 * The API's limiters: one per route class (per identity; `enroll` per source address), and
 * `enrollNetwork` per source network. The `fetch` and `signal` ones are shared with the answers
 * to the same requests over a push connection (controller/service/agent-answers.ts).
 */
export type ApiRateLimiters = Record<RateClass | 'enrollNetwork', RateLimiter>;

/** The API's limiters with the default rules of protocol/limits.ts, or the given ones (tests). */
export function apiRateLimiters(r: RateOverrides = {}, now: () => number = Date.now): ApiRateLimiters {
  return {
    announce: new RateLimiter(r.announce ?? { burst: ANNOUNCE_RATE_BURST, perS: ANNOUNCE_RATE_PER_S }, now),
    fetch: new RateLimiter(r.fetch ?? { burst: FETCH_RATE_BURST, perS: FETCH_RATE_PER_S }, now),
    signal: new RateLimiter(r.signal ?? { burst: SIGNAL_RATE_BURST, perS: SIGNAL_RATE_PER_S }, now),
    output: new RateLimiter(r.output ?? { burst: OUTPUT_RATE_BURST, perS: OUTPUT_RATE_PER_S }, now),
    enroll: new RateLimiter(r.enroll ?? { burst: ENROLL_RATE_BURST, perS: ENROLL_RATE_PER_S }, now),
    other: new RateLimiter(r.other ?? { burst: API_RATE_BURST, perS: API_RATE_PER_S }, now),
    enrollNetwork: new RateLimiter(
      r.enrollNetwork ?? { burst: ENROLL_NETWORK_RATE_BURST, perS: ENROLL_NETWORK_RATE_PER_S },
      now,
    ),
  };
}
