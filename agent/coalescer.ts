/**
 * Coalesces fetch requests (docs/protocol.md): one fetch in flight, at most one queued, so a flood of
 * wake-ups of any size costs at most two fetches. Wake-ups and polls take the same path.
 * Pure: the fetch itself is a function handed in.
 */
import type { FetchState } from '../protocol/frames.js';

export interface FetchOutcome {
  /** The generation the fetch saw (the controller's, on a 200 or a 304). */
  gen: number;
}

export interface CoalescerOptions {
  /** Runs one fetch; resolves with the generation seen. Never called twice at once. */
  fetch: () => Promise<FetchOutcome>;
  /** The last generation fetched before this process started (from the state dir), if any. */
  initialFetchedGen?: number | undefined;
  /** Told about every failed fetch (already logged by the fetcher, usually). */
  onError?: (err: unknown) => void;
}

/**
 * Schedules fetches. `wake(gen)` answers what a wake-up ack says; `poll()` always fetches (with
 * If-None-Match, so a poll that finds nothing costs a 304).
 */
export class FetchCoalescer {
  readonly #o: CoalescerOptions;
  #lastFetchedGen: number | undefined;
  #inFlight: Promise<void> | null = null;
  /** A fetch is queued behind the one in flight; the generation that asked for it, if any. */
  #queued = false;
  #queuedGen: number | undefined;
  #queuedForce = false;
  #fetches = 0;
  #closed = false;
  readonly #idleWaiters: Array<() => void> = [];

  constructor(opts: CoalescerOptions) {
    this.#o = opts;
    this.#lastFetchedGen = opts.initialFetchedGen;
  }

  /** The last generation a fetch saw (0 before any). */
  get lastFetchedGen(): number {
    return this.#lastFetchedGen ?? 0;
  }

  /** Fetches started so far. */
  get fetchCount(): number {
    return this.#fetches;
  }

  get busy(): boolean {
    return this.#inFlight !== null;
  }

  /**
   * A verified wake-up for generation `gen`: `current` when a fetch already saw it (nothing
   * fetched), else `started` or `queued`.
   *
   * `gen` is a hint, never a fact (docs/protocol.md): it is compared only with the generation last
   * fetched and verified, never with what other wake-ups claimed. So no wake-up, however high
   * its claimed `gen`, can make a later one look `current`: a claim above what was fetched always
   * leads to a (coalesced) fetch. A flood of such claims still costs one fetch in flight and at
   * most one queued at any time.
   */
  wake(gen: number): FetchState {
    if (this.#covers(gen)) return 'current';
    return this.#request(gen, false);
  }

  /** A poll (or start-up fetch): always fetches, coalesced with whatever is pending. */
  poll(): FetchState {
    return this.#request(undefined, true);
  }

  /** Resolves when no fetch is in flight or queued. */
  idle(): Promise<void> {
    if (this.#inFlight === null) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /** Stops starting fetches; one in flight finishes. Idempotent. */
  close(): void {
    this.#closed = true;
    this.#queued = false;
  }

  #request(gen: number | undefined, force: boolean): FetchState {
    if (this.#closed) return 'current';
    if (this.#inFlight === null) {
      this.#start();
      return 'started';
    }
    this.#queued = true;
    if (force) this.#queuedForce = true;
    if (gen !== undefined && (this.#queuedGen === undefined || gen > this.#queuedGen)) this.#queuedGen = gen;
    return 'queued';
  }

  /** A fetch already saw `gen`: only a fetched (and verified) generation counts. */
  #covers(gen: number): boolean {
    return this.#lastFetchedGen !== undefined && gen <= this.#lastFetchedGen;
  }

  #start(): void {
    this.#fetches++;
    const run = async (): Promise<void> => {
      try {
        const { gen } = await this.#o.fetch();
        if (this.#lastFetchedGen === undefined || gen > this.#lastFetchedGen) this.#lastFetchedGen = gen;
      } catch (err) {
        this.#o.onError?.(err);
      }
    };
    this.#inFlight = run().finally(() => {
      this.#inFlight = null;
      const again =
        this.#queued &&
        !this.#closed &&
        (this.#queuedForce || this.#queuedGen === undefined || !this.#covers(this.#queuedGen));
      this.#queued = false;
      this.#queuedForce = false;
      this.#queuedGen = undefined;
      if (again) {
        this.#start();
        return;
      }
      for (const w of this.#idleWaiters.splice(0)) w();
    });
  }
}
