/**
 * When a batch of queued messages is posted: at the end of the event loop's turn (setImmediate),
 * so what many callbacks queued in one turn travels in one message, but at the latest
 * `maxDelayMs` after the first of them was queued. A turn is not short when a process reads
 * thousands of sockets: libuv runs up to 48 rounds of 1,024 ready sockets in one poll phase
 * before the check phase, so a push worker answering a fan-out's acks held the fetches it had
 * read for seconds while the main process, which answers them, sat idle. The bound is checked
 * each time something is queued, so a turn that queues nothing more is flushed by the immediate.
 */
export class TurnFlusher {
  readonly #flush: () => void;
  readonly #maxDelayMs: number;
  readonly #now: () => number;
  /** When the first message not yet flushed was queued (the monotonic clock), or null. */
  #pendingSince: number | null = null;
  #immediate = false;

  /**
   * @param flush posts what is queued (an empty queue is the caller's to skip)
   * @param now the monotonic clock in ms (a test's fake)
   */
  constructor(flush: () => void, maxDelayMs: number, now: () => number = () => performance.now()) {
    this.#flush = flush;
    this.#maxDelayMs = maxDelayMs;
    this.#now = now;
  }

  /** Call after queueing a message. */
  queued(): void {
    const now = this.#now();
    if (this.#pendingSince === null) this.#pendingSince = now;
    else if (now - this.#pendingSince >= this.#maxDelayMs) {
      this.flushNow();
      return;
    }
    if (this.#immediate) return;
    this.#immediate = true;
    setImmediate(() => {
      this.#immediate = false;
      this.flushNow();
    });
  }

  /** Posts what is queued at once (also the end of the turn's job). */
  flushNow(): void {
    this.#pendingSince = null;
    this.#flush();
  }
}
