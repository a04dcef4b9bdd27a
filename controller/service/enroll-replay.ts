/**
 * Enrolment answers that can be asked for again. A join token is spent once; if the answer to the
 * enrolment that spent it is lost (the connection cut after the request, a proxy's timeout), the
 * node could never enrol with that token. So the token is bound to the CSR key it was spent with:
 * the same token, node and key within ENROLL_REPLAY_WINDOW_MS get the same certificate again
 * (still being made, the same pending answer). Another key is refused as before: only the holder
 * of the private key the certificate is for can ask, and what it gets is its own certificate.
 * Kept in memory, on the controller that spent the token (docs/adding-nodes.md).
 */
import { ENROLL_REPLAY_MAX_ENTRIES, ENROLL_REPLAY_WINDOW_MS } from '../../protocol/limits.js';
import type { CertificateBundle } from '../../protocol/enroll.js';

interface Entry {
  node: string;
  keySha256: string;
  /** The id of the token spent (logs name it; the token itself is never kept). */
  tokenId: string;
  answer: Promise<CertificateBundle>;
  atMs: number;
}

/** An answer that may be given again, and the token it spent. */
export interface Replayed {
  tokenId: string;
  answer: Promise<CertificateBundle>;
}

export class EnrollReplay {
  readonly #now: () => number;
  readonly #windowMs: number;
  readonly #max: number;
  /** By token hash, oldest first (a Map keeps insertion order). */
  readonly #entries = new Map<string, Entry>();

  constructor(now: () => number = Date.now, windowMs = ENROLL_REPLAY_WINDOW_MS, max = ENROLL_REPLAY_MAX_ENTRIES) {
    this.#now = now;
    this.#windowMs = windowMs;
    this.#max = max;
  }

  /** The answer given for this token to this node and key within the window, else undefined. */
  find(tokenHash: string, node: string, keySha256: string): Replayed | undefined {
    const e = this.#entries.get(tokenHash);
    if (e === undefined) return undefined;
    if (this.#now() - e.atMs > this.#windowMs) {
      this.#entries.delete(tokenHash);
      return undefined;
    }
    return e.node === node && e.keySha256 === keySha256 ? { tokenId: e.tokenId, answer: e.answer } : undefined;
  }

  /**
   * Keeps the answer of the enrolment that has just spent `tokenHash`; forgotten again if it
   * fails (nothing was issued, so there is nothing to give again).
   */
  remember(
    tokenHash: string,
    node: string,
    keySha256: string,
    tokenId: string,
    answer: Promise<CertificateBundle>,
  ): void {
    const now = this.#now();
    for (const [k, e] of this.#entries) {
      if (this.#entries.size < this.#max && now - e.atMs <= this.#windowMs) break;
      this.#entries.delete(k);
    }
    this.#entries.set(tokenHash, { node, keySha256, tokenId, answer, atMs: now });
    answer.catch(() => {
      if (this.#entries.get(tokenHash)?.answer === answer) this.#entries.delete(tokenHash);
    });
  }

  get size(): number {
    return this.#entries.size;
  }
}
