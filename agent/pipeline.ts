/**
 * The agent's pipeline (docs/architecture.md, "The agent's pipeline"): the way a change takes
 * through the agent, in the order it happens. A verified wake-up (`onWake`, from the listener) or
 * a due poll (`onPoll`, from the poller) asks the fetch coalescer for a fetch; the coalescer runs
 * one at a time, at most one more queued (`#fetch`): the fetcher gets the signed metadata, over the
 * push connection when the controller offers it, else over HTTPS. An answer (`#apply`) lets the
 * outbox retry at once, hands a new document to the apply loop (whose hooks' signals go out
 * through the outbox) and, when a wake-up brought it, tells the poller the agent holds the
 * metadata as of now; a failure (`#failed`) brings the next poll forward when its reason may pass.
 *
 * The parts are made by agent/assemble.ts and handed in; the coalescer is the pipeline's own, its
 * one job being to schedule this pipeline's fetches. Nothing here touches a socket or a file.
 */
import { codeOf } from '../protocol/errors.js';
import type { FetchState } from '../protocol/frames.js';
import type { WakeClaims } from '../protocol/wake.js';
import { refusalCodeOf, type Logger } from '../certs/tls.js';
import type { ApplyLoop } from './apply.js';
import { FetchCoalescer, type FetchOutcome } from './coalescer.js';
import { earlyRetryDelayMs, type Fetcher, type FetchResult } from './fetcher.js';
import type { OutboxSender } from './outbox.js';
import type { OutputSender } from './output-sender.js';
import type { Poller } from './poller.js';

/** What the pipeline saw, for a caller that counts or times it; none of these changes what it does. */
export interface PipelineObserver {
  /** A wake-up was verified and answered with `fetch`. */
  wake?(claims: WakeClaims, fetch: FetchState): void;
  /** A metadata fetch succeeded; `poll`: a poll started it (else a wake-up, or a queued request). */
  fetched?(result: FetchResult, poll: boolean): void;
  /** A metadata fetch failed (already logged). */
  fetchFailed?(err: unknown): void;
}

/** The parts the pipeline drives: only what it calls of each, so a test can hand in fakes. */
export interface PipelineParts {
  /** Gets and verifies the metadata (`agent/fetcher.ts`). */
  fetcher: Pick<Fetcher, 'fetchMetadata'>;
  /**
   * Every metadata fetch runs through this (default: runs it). The benchmark bounds how many of
   * one harness process's simulated agents fetch at once.
   */
  runFetch?: <T>(fetch: () => Promise<T>) => Promise<T>;
  /** Runs a fetched document's items (`agent/apply.ts`). */
  apply: Pick<ApplyLoop, 'submit'>;
  /** Delivers the signals; a fetch that got an answer shows the controller reachable again. */
  outbox: Pick<OutboxSender, 'retryNow'>;
  /** Streams hooks' live output; a wake-up grants its last chunks past the rate limit. */
  output: Pick<OutputSender, 'granted'>;
  /** Plans the polls (`agent/poller.ts`); told of fetches a wake-up made. */
  poller: Pick<Poller, 'fetched' | 'fetchFailed'>;
  log: Logger & { debug?(obj: object, msg?: string): void };
  observe?: PipelineObserver;
}

export class AgentPipeline {
  readonly #p: PipelineParts;
  readonly #runFetch: <T>(fetch: () => Promise<T>) => Promise<T>;
  /** One fetch in flight, at most one queued; wake-ups and polls share it. */
  readonly coalescer: FetchCoalescer;
  /** Whether the last fetch that ended got an answer: what a poll reports. */
  #lastFetchOk = false;
  /** True while a poll asks the coalescer, whose fetch starts synchronously within that call. */
  #polling = false;

  constructor(parts: PipelineParts) {
    this.#p = parts;
    this.#runFetch = parts.runFetch ?? ((f) => f());
    // no initial generation: a fresh process has not fetched anything yet, whatever it did before
    this.coalescer = new FetchCoalescer({ fetch: () => this.#fetch() });
  }

  /** The last generation a fetch saw (0 before any): what the listener answers a wake-up with. */
  get lastFetchedGen(): number {
    return this.coalescer.lastFetchedGen;
  }

  /**
   * A verified wake-up (the listener's `onWake`): `current` when a fetch already saw its
   * generation, else a fetch is `started` or `queued`. The listener sends this in its answer.
   */
  onWake(claims: WakeClaims): FetchState {
    // the controller granted this work's last output chunks past its limit (a ping is no work)
    if (claims.reason !== 'ping') this.#p.output.granted();
    const fetch = this.coalescer.wake(claims.gen);
    this.#p.observe?.wake?.(claims, fetch);
    return fetch;
  }

  /**
   * A poll is due (the poller's `poll`): a fetch, coalesced with whatever is pending. Resolves
   * when no fetch is left in flight or queued: true when the last of them got an answer.
   */
  async onPoll(): Promise<boolean> {
    this.#polling = true;
    try {
      this.coalescer.poll();
    } finally {
      this.#polling = false;
    }
    await this.coalescer.idle();
    return this.#lastFetchOk;
  }

  /** Starts no more fetches; one in flight finishes. Idempotent. */
  close(): void {
    this.coalescer.close();
  }

  /** One fetch, run by the coalescer (never two at once); rejects when it failed. */
  async #fetch(): Promise<FetchOutcome> {
    // read before the first await: a poll's fetch starts within its call to the coalescer
    const poll = this.#polling;
    try {
      const result = await this.#runFetch(() => this.#p.fetcher.fetchMetadata());
      this.#apply(result, poll);
      return { gen: result.gen };
    } catch (err) {
      this.#failed(err);
      throw err;
    }
  }

  /** A fetch got its answer: a 200's document goes to the apply loop; a 304 changes nothing. */
  #apply(result: FetchResult, poll: boolean): void {
    const { apply, outbox, poller, log, observe } = this.#p;
    this.#lastFetchOk = true;
    outbox.retryNow();
    if (result.status === 200) {
      log.info({ gen: result.gen, items: result.document.deployments.length }, 'metadata fetched');
      apply.submit(result.document);
    } else {
      log.debug?.({ gen: result.gen }, 'metadata not modified');
    }
    // a wake-up's answer is as fresh as a poll's: the next poll is an interval from now
    if (!poll) poller.fetched();
    observe?.fetched?.(result, poll);
  }

  /** A fetch failed: logged; the poller retries it soon when the reason may pass. */
  #failed(err: unknown): void {
    this.#lastFetchOk = false;
    const code = codeOf(err) ?? refusalCodeOf(err) ?? (err as { code?: string }).code;
    this.#p.log.warn({ code, err: (err as Error).message }, 'metadata fetch failed');
    this.#p.observe?.fetchFailed?.(err);
    // a wake-up's fetch that failed for a passing reason is retried by the poller soon, not at
    // the next interval; a refused answer waits for the next poll
    const retryMs = earlyRetryDelayMs(err);
    if (retryMs !== null) this.#p.poller.fetchFailed(retryMs);
  }
}
