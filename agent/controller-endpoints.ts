/**
 * The controller API URLs an agent may use (`--controller a,b,..`, docs/several-controllers.md) and which one it uses
 * now. Every request the agent makes to the controller API (metadata fetches, the endpoint
 * announcement, signals, live output) runs through `request()`: it goes to the current URL, and
 * when that controller fails (the connection is refused, reset or times out, TLS fails, or it
 * answers 5xx) the next one becomes current and the request is tried there, each URL at most once
 * per request. What is still failing after that is the caller's, as it was with one URL: the
 * outbox keeps the signal and retries with backoff, through whichever URL is current by then.
 *
 * The agent stays on a URL while it works; it does not go back to the first. A switch is logged
 * (from, to, why), at most one line per CONTROLLER_SWITCH_LOG_INTERVAL_MS with the count of
 * switches since the previous line, so a flapping pair of controllers cannot flood the log.
 */
import { HeraldError } from '../protocol/errors.js';
import { CONTROLLER_SWITCH_LOG_INTERVAL_MS } from '../protocol/limits.js';
import { RefusalSummary } from '../protocol/refusal-summary.js';
import type { Logger } from '../certs/tls.js';

/**
 * Parses `--controller`: one `https://host:port` or several separated by commas.
 * @throws HeraldError `bad_option` naming `--controller`
 */
export function parseControllerUrls(value: string): URL[] {
  const parts = value.split(',').map((u) => u.trim());
  const urls = parts.map((u) => {
    let url: URL | undefined;
    try {
      url = new URL(u);
    } catch {
      url = undefined;
    }
    if (
      url === undefined ||
      !/^https:\/\/[^/?#@]+\/?$/.test(u) ||
      url.protocol !== 'https:' ||
      url.pathname.replace(/\/+$/, '') !== '' ||
      url.search ||
      url.hash ||
      url.username
    ) {
      throw new HeraldError(
        'bad_option',
        `--controller must be https://host:port, or several separated by commas, not ${JSON.stringify(u.slice(0, 200))}`,
      );
    }
    return url;
  });
  return urls;
}

/**
 * Why a request's failure is the controller's (move to the next URL), or null when it is not: a
 * refused answer (response too large), or the agent shutting down.
 */
export function failoverReasonOf(err: unknown): string | null {
  if (err instanceof HeraldError) {
    if (err.code === 'shutting_down' || err.code === 'response_too_large') return null;
    return err.code;
  }
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : 'request_failed';
}

export interface ControllerEndpointsOptions {
  /** At least one; from `parseControllerUrls`. */
  urls: readonly URL[];
  log: Logger;
  /** Clock in ms, for the log summary. Default Date.now. */
  now?: () => number;
  /** Default CONTROLLER_SWITCH_LOG_INTERVAL_MS. */
  logIntervalMs?: number;
}

/** The outcome of one attempt, as `request()` sees it. */
export interface AttemptResult {
  status: number;
}

export class ControllerEndpoints {
  readonly urls: readonly URL[];
  #current = 0;
  readonly #log: Logger;
  readonly #summary: RefusalSummary;
  /** Switches made, for tests and metrics. */
  switches = 0;

  constructor(o: ControllerEndpointsOptions) {
    if (o.urls.length === 0) throw new HeraldError('bad_option', '--controller names no URL');
    this.urls = [...o.urls];
    this.#log = o.log;
    this.#summary = new RefusalSummary(
      (line) =>
        this.#log.warn(
          { ...line.fields, switches: line.count },
          line.count > 1
            ? 'controller failed; switched to the next (several times)'
            : 'controller failed; switched to the next',
        ),
      o.now ?? Date.now,
      o.logIntervalMs ?? CONTROLLER_SWITCH_LOG_INTERVAL_MS,
    );
  }

  /** The URL requests go to now. */
  get current(): URL {
    return this.urls[this.#current]!;
  }

  /**
   * Runs `attempt` against the current URL; when it throws a controller's failure
   * (`failoverReasonOf`) or resolves with a 5xx, and other URLs are left, switches to the next
   * and runs it there, each URL at most once. Resolves with the first answer that is not a 5xx,
   * else the last 5xx; rejects with the last error when every URL failed so, or at once with an
   * error that is not the controller's.
   */
  async request<T extends AttemptResult>(attempt: (base: URL) => Promise<T>): Promise<T> {
    for (let tried = 1; ; tried++) {
      const index = this.#current;
      const base = this.urls[index]!;
      let reason: string | null;
      try {
        const res = await attempt(base);
        if (res.status < 500 || tried >= this.urls.length) return res;
        reason = `status_${res.status}`;
      } catch (err) {
        reason = failoverReasonOf(err);
        if (reason === null || tried >= this.urls.length) throw err;
      }
      this.#switchFrom(index, reason);
    }
  }

  /** Logs what the summary still holds back (at stop). */
  flushLog(): void {
    this.#summary.flush(true);
  }

  /** Moves on from `index`, unless a concurrent request already did. */
  #switchFrom(index: number, reason: string): void {
    if (this.#current !== index) return;
    this.#current = (index + 1) % this.urls.length;
    this.switches++;
    this.#summary.record(
      'controller_switch',
      { from: this.urls[index]!.origin, to: this.current.origin, reason },
      'controller_switch',
    );
  }
}
