/**
 * A strict, flat DER reader for the few structures Herald reads from a peer before it knows who
 * the peer is (a CSR's request info, its key, its names). Definite lengths only, each in its
 * shortest form, never past its parent; one-byte tags. It never recurses on its own: callers
 * walk a fixed shape, so no nesting depth a peer chooses costs more than the bytes it sent.
 * Any deviation throws DerError, which callers turn into their own coded refusal.
 */

export class DerError extends Error {}

/** One element: its tag, where its content starts and where the element ends (exclusive). */
export interface Tlv {
  tag: number;
  /** Offset of the first element byte (the tag). */
  start: number;
  /** Offset of the first content byte. */
  body: number;
  /** Offset just past the element. */
  end: number;
}

export const TAG = {
  boolean: 0x01,
  integer: 0x02,
  bitString: 0x03,
  octetString: 0x04,
  null: 0x05,
  oid: 0x06,
  utf8String: 0x0c,
  sequence: 0x30,
  set: 0x31,
} as const;

/** The longest OID content read (the longest OID Herald names is 9 bytes). */
const MAX_OID_BYTES = 32;

/** Reads the element at `at`, which must end by `limit`. */
export function readTlv(buf: Buffer, at: number, limit: number = buf.length): Tlv {
  if (at + 2 > limit) throw new DerError('truncated element');
  const tag = buf[at]!;
  if ((tag & 0x1f) === 0x1f) throw new DerError('multi-byte tags are not read');
  let len = buf[at + 1]!;
  let body = at + 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    // 0x80 is BER's indefinite length; more than 3 length bytes is more than any input here
    if (n === 0 || n > 3) throw new DerError('indefinite or oversized length');
    if (body + n > limit) throw new DerError('truncated length');
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + buf[body + i]!;
    if (len < 0x80 || buf[body] === 0) throw new DerError('length not in its shortest form');
    body += n;
  }
  const end = body + len;
  if (end > limit) throw new DerError('element longer than its container');
  return { tag, start: at, body, end };
}

/** Reads the element at `at` and checks its tag. */
export function expectTlv(buf: Buffer, at: number, limit: number, tag: number, what: string): Tlv {
  const t = readTlv(buf, at, limit);
  if (t.tag !== tag) throw new DerError(`${what}: tag 0x${t.tag.toString(16)}, not 0x${tag.toString(16)}`);
  return t;
}

/** The elements directly inside a constructed element, in order. */
export function childrenOf(buf: Buffer, parent: Tlv): Tlv[] {
  const out: Tlv[] = [];
  for (let at = parent.body; at < parent.end; ) {
    const t = readTlv(buf, at, parent.end);
    out.push(t);
    at = t.end;
  }
  return out;
}

/** The content bytes of an element. */
export function contentOf(buf: Buffer, t: Tlv): Buffer {
  return buf.subarray(t.body, t.end);
}

/** The whole element's bytes. */
export function bytesOf(buf: Buffer, t: Tlv): Buffer {
  return buf.subarray(t.start, t.end);
}

/** An OBJECT IDENTIFIER's dotted form. */
export function oidOf(buf: Buffer, t: Tlv): string {
  if (t.tag !== TAG.oid) throw new DerError('not an OID');
  const b = contentOf(buf, t);
  if (b.length === 0 || b.length > MAX_OID_BYTES) throw new DerError('OID of an unread length');
  const first = b[0]!;
  const parts: number[] = first < 80 ? [Math.floor(first / 40), first % 40] : [2, first - 80];
  if (first & 0x80) throw new DerError('OID first arc too large');
  let v = 0;
  for (let i = 1; i < b.length; i++) {
    if (v === 0 && b[i] === 0x80) throw new DerError('OID arc not in its shortest form');
    v = v * 128 + (b[i]! & 0x7f);
    if (v > Number.MAX_SAFE_INTEGER / 128) throw new DerError('OID arc too large');
    if (!(b[i]! & 0x80)) {
      parts.push(v);
      v = 0;
    }
  }
  if (b[b.length - 1]! & 0x80) throw new DerError('OID ends inside an arc');
  return parts.join('.');
}

/** Reads `der` as exactly one element (nothing after it). */
export function readWhole(der: Buffer, tag: number, what: string): Tlv {
  const t = expectTlv(der, 0, der.length, tag, what);
  if (t.end !== der.length) throw new DerError(`${what}: bytes after the end`);
  return t;
}
