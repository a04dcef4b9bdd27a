/**
 * Live output at the agent (docs/api.md): turns what a running hook writes on one stream into masked
 * chunks of text. Hidden values are masked here, before a chunk leaves the node (docs/architecture.md), and a
 * value the pipe delivered in two pieces, or that two flushes would split, is still caught whole:
 * the chunker keeps back the text where a hidden value may still be completing (at most the
 * longest form's length minus one characters, never the middle of a complete value) and sends
 * it with the next chunk, or at the end. The forms are every spelling hidden-forms.ts makes of a
 * value, so the hold-back covers the longest one (a JSON-escaped value may be six times as long).
 *
 * Pure: bytes in, text out; the caller owns the timer (OUTPUT_FLUSH_INTERVAL_MS) and decides
 * when to take what is ready.
 */
import { StringDecoder } from 'node:string_decoder';
import { OUTPUT_CHUNK_MAX_BYTES } from '../../protocol/limits.js';
import { hiddenSpans, maskText } from './mask.js';

export class OutputChunker {
  readonly #values: readonly string[];
  readonly #keep: number;
  readonly #decoder = new StringDecoder('utf8');
  /** Decoded, unmasked text not sent yet. */
  #pending = '';

  /** `hidden`: the values to mask, every form of each, longest first (`hiddenValues()` of mask.ts). */
  constructor(hidden: readonly string[]) {
    this.#values = hidden;
    this.#keep = Math.max(0, (hidden[0]?.length ?? 0) - 1);
  }

  write(b: Buffer): void {
    this.#pending += this.#decoder.write(b);
  }

  /** Bytes (about: UTF-16 code units) waiting; the caller flushes once it reaches OUTPUT_CHUNK_MAX_BYTES. */
  get pendingLength(): number {
    return this.#pending.length;
  }

  /**
   * The masked text that is final now, split into pieces of at most OUTPUT_CHUNK_MAX_BYTES bytes
   * each; `end`: the stream is over, so nothing is kept back.
   */
  take(end = false): string[] {
    if (end) this.#pending += this.#decoder.end();
    const t = this.#pending;
    const cut = end ? t.length : this.#safeCut(t);
    if (cut <= 0) return [];
    this.#pending = t.slice(cut);
    return splitUtf8(maskText(t.slice(0, cut), this.#values), OUTPUT_CHUNK_MAX_BYTES);
  }

  /**
   * Where `t` can be cut with no hidden value split: keep back the last `keep` characters (a value
   * starting there may not be complete yet), and move the cut left to the start of any complete
   * occurrence it would fall inside of (occurrences that overlap are one span, so one move does).
   */
  #safeCut(t: string): number {
    let cut = t.length - this.#keep;
    if (cut <= 0 || this.#values.length === 0) return cut;
    for (const [start, end] of hiddenSpans(t, this.#values)) if (start < cut && end > cut) cut = start;
    return cut;
  }
}

/** `s` in pieces of at most `maxBytes` UTF-8 bytes, never splitting a character. */
export function splitUtf8(s: string, maxBytes: number): string[] {
  if (s === '') return [];
  const b = Buffer.from(s, 'utf8');
  if (b.length <= maxBytes) return [s];
  const out: string[] = [];
  for (let at = 0; at < b.length; ) {
    let end = Math.min(b.length, at + maxBytes);
    // back up over continuation bytes (10xxxxxx) so the piece ends on a character boundary
    while (end < b.length && end > at && (b[end]! & 0xc0) === 0x80) end--;
    out.push(b.toString('utf8', at, end));
    at = end;
  }
  return out;
}
