/**
 * How the controller logs the refusals of an agent's or operator's requests, whichever way they
 * came (the HTTPS API, or a frame on a push connection): those a peer can repeat in bulk (403,
 * 413, 429, 503) as a summary, at most one line per key per REFUSAL_LOG_INTERVAL_MS with the
 * count (protocol/refusal-summary.ts, docs/api.md), the rest one line each.
 */
import type { Logger } from 'pino';
import { ERROR_CODES, type ErrorCode } from '../protocol/errors.js';
import { REFUSAL_LOG_INTERVAL_MS } from '../protocol/limits.js';
import { RefusalSummary } from '../protocol/refusal-summary.js';

/** Where a request was refused: its status, who asked, and what (`PUSH` for a push frame). */
export interface RefusalAt {
  status: number;
  peer: string;
  method: string;
  route: string;
  field?: string | undefined;
}

export class RefusalLog {
  readonly #log: Logger;
  readonly #summary: RefusalSummary;
  readonly #timer: NodeJS.Timeout;

  /** @param now clock in ms */
  constructor(log: Logger, now: () => number = Date.now) {
    this.#log = log;
    this.#summary = new RefusalSummary(
      ({ code, count, fields }) =>
        log.warn(
          { event: 'refused', code, count, ...fields },
          `refused ${count} time(s) in the last ${REFUSAL_LOG_INTERVAL_MS / 1000} s: ${ERROR_CODES[code as ErrorCode] ?? code}`,
        ),
      now,
    );
    this.#timer = setInterval(() => this.#summary.flush(), REFUSAL_LOG_INTERVAL_MS);
    this.#timer.unref();
  }

  /**
   * Counts a refusal anyone can cause in bulk, summarised per `key` (default the code; never
   * something an unauthenticated peer can vary: RefusalSummary.record).
   */
  record(code: string, fields: Record<string, unknown> = {}, key: string = code): void {
    this.#summary.record(code, fields, key);
  }

  /**
   * One refusal's log: those a peer can repeat in bulk are summarised, the rest are one line each
   * (per identity and route once authenticated; per code alone before, see RefusalSummary).
   */
  refused(
    code: ErrorCode,
    message: string,
    at: RefusalAt,
    spiffeId: string | undefined,
    detail?: { key: string; fields: Record<string, unknown> },
  ): void {
    const { status, peer, method, route, field } = at;
    if (status === 403 || status === 413 || status === 429 || status === 503) {
      this.#summary.record(
        code,
        { status, peer, method, route, ...detail?.fields },
        detail?.key ?? (spiffeId !== undefined ? `${code} ${spiffeId} ${method} ${route}` : code),
      );
    } else this.#log.info({ event: 'refused', code, status, peer, method, route, field }, message);
  }

  /** Logs what is counted and not yet logged, and stops the timer. Idempotent. */
  close(): void {
    clearInterval(this.#timer);
    this.#summary.flush(true);
  }
}
