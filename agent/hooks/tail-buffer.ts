/**
 * Keeps the last `maxBytes` of a stream without ever holding much more: the end of a log is
 * where the error is (docs/architecture.md).
 */

import { cutMarker } from '../../protocol/heat.js';

export { cutMarker };

export class TailBuffer {
  private chunks: Buffer[] = [];
  private held = 0;
  private total = 0;

  constructor(readonly maxBytes: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    if (chunk.length >= this.maxBytes) {
      this.chunks = [chunk.subarray(chunk.length - this.maxBytes)];
      this.held = this.maxBytes;
      return;
    }
    this.chunks.push(chunk);
    this.held += chunk.length;
    // Drop whole chunks from the front while the rest still covers maxBytes: held stays below
    // maxBytes + one chunk.
    let first = this.chunks[0];
    while (first !== undefined && this.held - first.length >= this.maxBytes) {
      this.chunks.shift();
      this.held -= first.length;
      first = this.chunks[0];
    }
  }

  /** Bytes seen in all. */
  get totalBytes(): number {
    return this.total;
  }

  /**
   * The kept text: the last maxBytes as UTF-8, preceded by the cut marker when bytes were dropped.
   * A character split by the cut is dropped whole rather than shown as a replacement character.
   */
  text(): string {
    let buf = Buffer.concat(this.chunks);
    if (buf.length > this.maxBytes) buf = buf.subarray(buf.length - this.maxBytes);
    const cut = this.total - buf.length;
    if (cut === 0) return buf.toString('utf8');
    let skip = 0;
    while (skip < 3 && skip < buf.length && ((buf[skip] ?? 0) & 0xc0) === 0x80) skip++;
    return cutMarker(cut + skip) + buf.subarray(skip).toString('utf8');
  }
}
