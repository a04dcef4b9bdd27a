/**
 * Certificate requests a hostile peer may send before it is known, built byte by byte (no
 * library makes an RSA key of any modulus and exponent): the bench's pre-authentication phase
 * sends them beside an operator's requests, and test/helpers/odd-keys.ts builds its extreme
 * shapes from these.
 */
import crypto from 'node:crypto';

import { oid, seq, set, tlv } from '../certs/der-write.js';

export { oid, seq, set, tlv };
/** A positive INTEGER of these magnitude bytes. */
export const uint = (b: Buffer): Buffer => tlv(0x02, b[0]! & 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b);
export const bitString = (b: Buffer): Buffer => tlv(0x03, Buffer.from([0]), b);
export const NULL = Buffer.from([0x05, 0x00]);
export const OID_RSA = '1.2.840.113549.1.1.1';
const OID_SHA256_RSA = '1.2.840.113549.1.1.11';

/** An odd random number of `bytes` bytes, top bit set (a plausible modulus or exponent). */
export function oddNumber(bytes: number, seed = 1): Buffer {
  const b = crypto.createHash('sha512').update(`odd-${bytes}-${seed}`).digest();
  const out = Buffer.alloc(bytes);
  for (let i = 0; i < bytes; i++) out[i] = b[i % b.length]! ^ (i & 0xff);
  out[0]! |= 0x80;
  out[bytes - 1]! |= 1;
  return out;
}

/** An RSA SubjectPublicKeyInfo with this modulus and exponent, whatever they are. */
export function rsaSpki(n: Buffer, e: Buffer): Buffer {
  return seq(seq(oid(OID_RSA), NULL), bitString(seq(uint(n), uint(e))));
}

/**
 * A CSR carrying `spki`, signed (SHA-256 with RSA) with `signWith` when given, else with a
 * signature of `sigBytes` random-looking bytes (the size of the key's modulus, as a real one).
 */
export function csrWithSpki(
  spki: Buffer,
  o: { signWith?: crypto.KeyObject; sigBytes?: number; sigOid?: string; node?: string } = {},
): string {
  const node = o.node ?? 'odd1';
  const info = seq(
    tlv(0x02, Buffer.from([0])),
    seq(set(seq(oid('2.5.4.3'), tlv(0x0c, Buffer.from(node))))),
    spki,
    tlv(0xa0),
  );
  const sig = o.signWith ? crypto.sign('sha256', info, o.signWith) : oddNumber(o.sigBytes ?? 256, 7);
  return pemOf(seq(info, seq(oid(o.sigOid ?? OID_SHA256_RSA), NULL), bitString(sig)));
}

export function pemOf(der: Buffer): string {
  const b64 = der.toString('base64').replace(/(.{64})/g, '$1\n');
  return `-----BEGIN CERTIFICATE REQUEST-----\n${b64.trimEnd()}\n-----END CERTIFICATE REQUEST-----\n`;
}

export function derOf(pem: string): Buffer {
  return Buffer.from(pem.replace(/-----[^-]+-----|\s/g, ''), 'base64');
}

/** The review's case: an RSA key with a 1,024-byte modulus and a 1,024-byte exponent. */
export function hugeExponentCsr(seed = 1): string {
  return csrWithSpki(rsaSpki(oddNumber(1024, seed), oddNumber(1024, seed + 1)), { sigBytes: 1024 });
}
