/**
 * Refusals that anyone can cause without authenticating (a TCP connect to the agent listener, a
 * TLS handshake at the API) are counted and logged as a summary: at most one line per code per
 * REFUSAL_LOG_INTERVAL_MS, carrying how many were refused since the last line (docs/api.md), so no
 * peer can fill a disk with log lines. Pure: the clock and the log line are the caller's.
 */
import { REFUSAL_LOG_INTERVAL_MS } from './limits.js';

export interface RefusalLine {
  code: string;
  /** Refusals of this code since the previous line (this one included). */
  count: number;
  /** Fields of the first refusal of the period (peer address and the like). */
  fields: Record<string, unknown>;
}

interface Pending {
  code: string;
  lastLoggedMs: number;
  count: number;
  fields: Record<string, unknown>;
}

export class RefusalSummary {
  readonly #emit: (line: RefusalLine) => void;
  readonly #now: () => number;
  readonly #intervalMs: number;
  readonly #byCode = new Map<string, Pending>();

  /**
   * @param emit writes one log line (called synchronously from `record` or `flush`)
   * @param now clock in ms
   */
  constructor(emit: (line: RefusalLine) => void, now: () => number = Date.now, intervalMs = REFUSAL_LOG_INTERVAL_MS) {
    this.#emit = emit;
    this.#now = now;
    this.#intervalMs = intervalMs;
  }

  /**
   * Counts one refusal; logs it at once unless one of the same `key` was logged within the
   * interval. The key is the code unless given: a caller that knows who asked (an
   * authenticated identity) can summarise per identity, but a key must never be something an
   * unauthenticated peer can vary at will, or the summary is no bound.
   */
  record(code: string, fields: Record<string, unknown> = {}, key: string = code): void {
    const now = this.#now();
    let p = this.#byCode.get(key);
    if (!p) {
      p = { code, lastLoggedMs: -Infinity, count: 0, fields };
      this.#byCode.set(key, p);
    }
    if (p.count === 0) p.fields = fields;
    p.count++;
    if (now - p.lastLoggedMs >= this.#intervalMs) this.#log(p, now);
  }

  /** Logs what was counted and not yet logged, for codes whose interval has passed (all with `force`). */
  flush(force = false): void {
    const now = this.#now();
    for (const [key, p] of this.#byCode) {
      if (p.count > 0 && (force || now - p.lastLoggedMs >= this.#intervalMs)) this.#log(p, now);
      else if (p.count === 0 && now - p.lastLoggedMs >= this.#intervalMs) this.#byCode.delete(key);
    }
  }

  #log(p: Pending, now: number): void {
    this.#emit({ code: p.code, count: p.count, fields: p.fields });
    p.count = 0;
    p.lastLoggedMs = now;
  }
}
