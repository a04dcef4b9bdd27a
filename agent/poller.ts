/**
 * Fallback polling (docs/architecture.md): every `intervalMs` (jittered ±10 %) the agent fetches with
 * If-None-Match whether or not push works; while push is healthy the interval stretches to
 * `healthyIntervalMs`, and drops back the moment the push connection closes. When the short
 * interval has already passed then, or would pass within the first quarter of one, the poll
 * comes at a random moment within one interval but not in its first quarter, so a fleet that
 * loses its controller does not poll it all at once, nor while it redials them. The interval
 * stretches again when push is healthy again before that poll came. A failed poll is retried
 * sooner, with backoff and full jitter, never later than the normal interval. A wake-up's fetch
 * that got an answer counts as a poll: the interval runs from the last answer, whichever path
 * brought it.
 */
import { fullJitterMs, jittered } from '../protocol/backoff.js';
import {
  POLL_AFTER_PUSH_LOSS_MIN_FRACTION,
  POLL_INTERVAL_HEALTHY_MS,
  POLL_INTERVAL_MS,
  POLL_JITTER_FRACTION,
} from '../protocol/limits.js';

/** Timers and clock, injectable so tests run without waiting. */
export interface Timers {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realTimers: Timers = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** First retry ceiling after a failed poll (doubles per failure, capped at the interval). */
export const POLL_RETRY_BASE_MS = 1_000;

export interface PollerOptions {
  /** One poll: resolves true when the fetch succeeded (200 or 304), false otherwise. */
  poll: () => Promise<boolean>;
  /** Is push healthy right now (a connection open and heard from recently)? */
  isPushHealthy: () => boolean;
  /** Default POLL_INTERVAL_MS. */
  intervalMs?: number;
  /** Default POLL_INTERVAL_HEALTHY_MS. */
  healthyIntervalMs?: number;
  /** Default POLL_JITTER_FRACTION. */
  jitterFraction?: number;
  timers?: Timers;
  random?: () => number;
}

export class Poller {
  readonly #poll: () => Promise<boolean>;
  readonly #healthy: () => boolean;
  readonly #interval: number;
  readonly #healthyInterval: number;
  readonly #jitter: number;
  readonly #t: Timers;
  readonly #random: () => number;
  #timer: unknown = null;
  /** When the pending timer fires, and whether it was planned with the long interval. */
  #dueAt = 0;
  #dueLong = false;
  #lastPollEnd = 0;
  #failures = 0;
  /** The least delay of the next retry (a Retry-After), used once. */
  #floorMs = 0;
  #polling = false;
  #running = false;
  #stopped = false;
  #polls = 0;

  constructor(opts: PollerOptions) {
    const o = {
      intervalMs: POLL_INTERVAL_MS,
      healthyIntervalMs: POLL_INTERVAL_HEALTHY_MS,
      jitterFraction: POLL_JITTER_FRACTION,
      ...opts,
    };
    if (!(o.intervalMs > 0) || !(o.healthyIntervalMs > 0)) throw new RangeError('poll intervals must be positive');
    if (!(o.jitterFraction >= 0 && o.jitterFraction < 1)) throw new RangeError('jitterFraction must be in [0, 1)');
    this.#poll = o.poll;
    this.#healthy = o.isPushHealthy;
    this.#interval = o.intervalMs;
    // never poll less often while healthy than while not
    this.#healthyInterval = Math.max(o.intervalMs, o.healthyIntervalMs);
    this.#jitter = o.jitterFraction;
    this.#t = o.timers ?? realTimers;
    this.#random = o.random ?? Math.random;
  }

  /** Polls done so far. */
  get polls(): number {
    return this.#polls;
  }

  /** When the next poll is due (clock ms), or null when none is planned. */
  get nextDueAt(): number | null {
    return this.#timer === null ? null : this.#dueAt;
  }

  /**
   * Starts polling. With `immediately`, the first poll runs now (start-up fetch); otherwise
   * after one interval.
   */
  start(immediately = false): void {
    if (this.#running) return;
    this.#stopped = false;
    this.#running = true;
    this.#lastPollEnd = this.#t.now();
    if (immediately) void this.#tick();
    else this.#schedule();
  }

  /**
   * Starts polling (the first poll at once) when `ready` settles, or after `maxWaitMs`, whichever
   * comes first; not if `stop()` came meanwhile. The agent's start-up fetch waits so for its
   * endpoint announcement: a node the announcement registers does not exist before it.
   */
  startAfter(ready: Promise<unknown>, maxWaitMs: number): void {
    let timer: unknown = null;
    const go = (): void => {
      if (timer !== null) this.#t.clearTimeout(timer);
      timer = null;
      if (!this.#stopped) this.start(true);
    };
    timer = this.#t.setTimeout(go, maxWaitMs);
    void ready.then(go, go);
  }

  /**
   * Push health may have changed (a connection opened or closed). When it is no longer healthy
   * and the next poll was planned with the long interval, it is moved to the short one. When it
   * is healthy again and the next poll was planned with the short interval (not a retry after a
   * failure), it is planned anew with the long one, from the last poll: a fleet whose controller
   * came back within the short interval does not poll it anyway (docs/architecture.md, "while push is healthy
   * the interval stretches").
   */
  pushChanged(): void {
    if (!this.#running || this.#polling || this.#timer === null) return;
    const healthy = this.#healthy();
    if (this.#dueLong === healthy || (healthy && this.#failures > 0)) return;
    this.#replan(!healthy);
  }

  /**
   * A fetch outside a poll failed (the one a wake-up started): the next poll comes as after a
   * failed poll (backoff with full jitter), not after the long interval, and not before
   * `notBeforeMs` (a Retry-After). During a poll only the floor is noted: the poll's own
   * result reschedules.
   */
  fetchFailed(notBeforeMs = 0): void {
    // a Retry-After never holds polling back beyond the normal interval
    this.#floorMs = Math.min(this.#interval, Math.max(this.#floorMs, notBeforeMs));
    if (!this.#running || this.#polling) return;
    this.#failures++;
    this.#lastPollEnd = this.#t.now();
    this.#replan();
  }

  /**
   * A fetch outside a poll got its answer (the one a wake-up started, over either channel): the
   * agent holds the metadata as of now, as a poll would have left it, so the next poll is planned
   * anew, one interval (jittered afresh) from now, as after a poll (docs/architecture.md: the agent fetches every interval; this fetch
   * was one). Without it, a fleet that had just fetched a change polled again on the poll's old
   * schedule, and when the controller died those polls fell inside its redial. During a poll
   * nothing changes here: the poll's own result reschedules.
   */
  fetched(): void {
    if (!this.#running || this.#polling) return;
    this.#failures = 0;
    this.#floorMs = 0;
    this.#lastPollEnd = this.#t.now();
    this.#replan();
  }

  /** Stops polling; a poll in flight finishes. Idempotent. */
  stop(): void {
    this.#stopped = true;
    this.#running = false;
    this.#cancel();
  }

  /** Drops the planned poll, if any. */
  #cancel(): void {
    if (this.#timer !== null) this.#t.clearTimeout(this.#timer);
    this.#timer = null;
  }

  /** Drops the planned poll and plans the next one anew (`spread`: see #schedule). */
  #replan(spread = false): void {
    this.#cancel();
    this.#schedule(spread);
  }

  /**
   * Plans the next poll. `spread`: push was just lost; when the short interval has already
   * passed since the last poll, or would pass within the first POLL_AFTER_PUSH_LOSS_MIN_FRACTION
   * of one from now, the poll comes at a random moment within one interval from now, not in
   * that first part of it. A controller that dies drops every agent's push connection at the
   * same moment, and 10,000 agents polling it at once while it restarts, or while it redials
   * them, would only delay the redial that delivers their changes (`npm run bench`, crash run).
   * The second case matters because a change to the whole fleet plans every agent's next poll
   * an interval from the same moment (`fetched`): a controller dying most of an interval later
   * would otherwise meet those polls during its redial.
   */
  #schedule(spread = false): void {
    if (!this.#running) return;
    let delay: number;
    if (this.#failures > 0) {
      delay = Math.max(
        1,
        this.#floorMs,
        fullJitterMs(this.#failures - 1, POLL_RETRY_BASE_MS, this.#interval, this.#random),
      );
      this.#dueLong = false;
    } else {
      const long = this.#healthy();
      delay = jittered(long ? this.#healthyInterval : this.#interval, this.#jitter, this.#random);
      this.#dueLong = long;
    }
    this.#floorMs = 0;
    const now = this.#t.now();
    const least = Math.floor(delay * POLL_AFTER_PUSH_LOSS_MIN_FRACTION);
    if (spread && this.#lastPollEnd + delay < now + least) {
      this.#dueAt = now + least + Math.floor(this.#random() * (delay - least));
    } else {
      this.#dueAt = Math.max(now, this.#lastPollEnd + delay);
    }
    this.#timer = this.#t.setTimeout(() => {
      this.#timer = null;
      void this.#tick();
    }, this.#dueAt - now);
  }

  async #tick(): Promise<void> {
    if (!this.#running || this.#polling) return;
    this.#polling = true;
    this.#polls++;
    let ok = false;
    try {
      ok = await this.#poll();
    } catch {
      ok = false;
    }
    this.#polling = false;
    this.#failures = ok ? 0 : this.#failures + 1;
    if (ok) this.#floorMs = 0;
    this.#lastPollEnd = this.#t.now();
    this.#replan(); // (a stop() and start() while the poll ran planned one already)
  }
}
