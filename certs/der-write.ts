/**
 * DER writing for the few structures Herald builds byte by byte (a CSR; the benchmarks' hostile
 * requests): a length in its shortest definite form, an element, an object identifier. The
 * reader of what peers send is certs/der.ts.
 */

/** A definite length, in its shortest form (lengths past 2^31 use the byte loop, not shifts). */
export function len(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

/** One element: tag, length, the contents concatenated. */
export function tlv(tag: number, ...content: Buffer[]): Buffer {
  const body = Buffer.concat(content);
  return Buffer.concat([Buffer.from([tag]), len(body.length), body]);
}

/** An OBJECT IDENTIFIER from its dotted form. */
export function oid(dotted: string): Buffer {
  const parts = dotted.split('.').map(Number);
  const out: number[] = [40 * parts[0]! + parts[1]!];
  for (const p of parts.slice(2)) {
    const chunk: number[] = [p & 0x7f];
    for (let v = p >>> 7; v > 0; v >>>= 7) chunk.unshift((v & 0x7f) | 0x80);
    out.push(...chunk);
  }
  return tlv(0x06, Buffer.from(out));
}

export const seq = (...c: Buffer[]): Buffer => tlv(0x30, ...c);
export const set = (...c: Buffer[]): Buffer => tlv(0x31, ...c);
