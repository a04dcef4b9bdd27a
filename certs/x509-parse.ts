/**
 * Parses a certificate (DER or PEM bytes) once: `new crypto.X509Certificate(bytes)` costs
 * ~200 µs here (OpenSSL 3 decoding), and one connection's checks read the same certificate
 * several times (its identity, its chain, its serials), while every connection presents the
 * same CA and issuers. Results are kept by the exact bytes, so the same input always gives the
 * same (immutable) object; the least recently used go first beyond X509_PARSE_CACHE_ENTRIES.
 * Bytes that do not parse throw, and are not kept.
 */
import crypto from 'node:crypto';
import { X509_PARSE_CACHE_ENTRIES } from '../protocol/limits.js';

export class X509ParseCache {
  readonly #max: number;
  readonly #parsed = new Map<string, crypto.X509Certificate>();

  constructor(maxEntries = X509_PARSE_CACHE_ENTRIES) {
    this.#max = maxEntries;
  }

  get size(): number {
    return this.#parsed.size;
  }

  /** @throws whatever `new crypto.X509Certificate` throws for bytes that are not a certificate */
  parse(bytes: Buffer): crypto.X509Certificate {
    const key = bytes.toString('base64');
    const hit = this.#parsed.get(key);
    if (hit !== undefined) {
      // most recently used last: the CA and issuers, read on every connection, stay
      this.#parsed.delete(key);
      this.#parsed.set(key, hit);
      return hit;
    }
    const x = new crypto.X509Certificate(bytes);
    this.#parsed.set(key, x);
    if (this.#parsed.size > this.#max) this.#parsed.delete(this.#parsed.keys().next().value!);
    return x;
  }
}

const shared = new X509ParseCache();

/** The process's parse of `bytes` (see X509ParseCache). */
export function x509Of(bytes: Buffer): crypto.X509Certificate {
  return shared.parse(bytes);
}
