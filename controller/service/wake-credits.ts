/**
 * What the controller asked a node for is not held back by the node's rate limits: each change
 * that gives a node work (a wake-up) grants its agent one signal (the work's result) and
 * EXEMPT_OUTPUT_PER_WAKE_REQUESTS live output chunks that the limits do not count. The agent
 * sends unpaced only a run's last chunk of each stream, which the signal waits for; the
 * controller cannot tell which chunk that is, so any chunk of the node's own agent spends a credit
 * while one is held, and takes a token only then (either way one unit of what the agent counts,
 * agent/output-sender.ts). A node holds at most EXEMPT_SIGNALS_CAPACITY and EXEMPT_OUTPUT_CAPACITY
 * of them, on each controller, so an agent banks no more than that over its burst, and what it
 * sends by itself meets the limits (docs/departures.md). Credits are in memory, as the limiters
 * are: a restarted controller holds none.
 */
import {
  EXEMPT_OUTPUT_CAPACITY,
  EXEMPT_OUTPUT_PER_WAKE_REQUESTS,
  EXEMPT_SIGNALS_CAPACITY,
} from '../../protocol/limits.js';

/** What a credit lets the agent send: its signal, or a chunk of its live output. */
export type WakeCreditKind = 'signal' | 'output';

/** Each node's credits, kept in place until the node is removed or has spent both kinds. */
export class WakeCredits {
  readonly #held = new Map<string, Record<WakeCreditKind, number>>();

  /** `node` was given work. */
  grant(node: string): void {
    const c = this.#held.get(node);
    if (c === undefined) {
      this.#held.set(node, { signal: 1, output: EXEMPT_OUTPUT_PER_WAKE_REQUESTS });
      return;
    }
    c.signal = Math.min(c.signal + 1, EXEMPT_SIGNALS_CAPACITY);
    c.output = Math.min(c.output + EXEMPT_OUTPUT_PER_WAKE_REQUESTS, EXEMPT_OUTPUT_CAPACITY);
  }

  /** Spends one of `node`'s credits of `kind`; false when none is left (the rate limit applies). */
  take(node: string, kind: WakeCreditKind): boolean {
    const c = this.#held.get(node);
    if (c === undefined || c[kind] === 0) return false;
    c[kind]--;
    if (c.signal === 0 && c.output === 0) this.#held.delete(node);
    return true;
  }

  /** `node` was removed. */
  forget(node: string): void {
    this.#held.delete(node);
  }
}
