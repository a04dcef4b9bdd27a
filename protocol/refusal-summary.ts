/**
 * Refusals that anyone can cause without authenticating (a TCP connect to the agent listener, a
 * TLS handshake at the API) are counted and logged as a summary: at most one line per code per
 * REFUSAL_LOG_INTERVAL_MS, carrying how many were refused since the last line (SPEC §3), so no
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

  /** Counts one refusal; logs it at once unless its code was logged within the interval. */
  record(code: string, fields: Record<string, unknown> = {}): void {
    const now = this.#now();
    let p = this.#byCode.get(code);
    if (!p) {
      p = { lastLoggedMs: -Infinity, count: 0, fields };
      this.#byCode.set(code, p);
    }
    if (p.count === 0) p.fields = fields;
    p.count++;
    if (now - p.lastLoggedMs >= this.#intervalMs) this.#log(code, p, now);
  }

  /** Logs what was counted and not yet logged, for codes whose interval has passed (all with `force`). */
  flush(force = false): void {
    const now = this.#now();
    for (const [code, p] of this.#byCode) {
      if (p.count > 0 && (force || now - p.lastLoggedMs >= this.#intervalMs)) this.#log(code, p, now);
      else if (p.count === 0 && now - p.lastLoggedMs >= this.#intervalMs) this.#byCode.delete(code);
    }
  }

  #log(code: string, p: Pending, now: number): void {
    this.#emit({ code, count: p.count, fields: p.fields });
    p.count = 0;
    p.lastLoggedMs = now;
  }
}
