/**
 * revoked.json (SPEC §1): `{"serials":[hex..],"kids":[kid..]}`, the certificates and signing
 * keys no party may use any more. Parsed here only: `herald certs revoke` (certs/pki.ts) writes
 * it and every party's `PkiMaterial` (certs/tls.ts) reads it. No node-forge here, so loading
 * the TLS helper never loads it.
 */
import { HeraldError } from '../protocol/errors.js';
import { normalizeSerial } from './identity.js';

export type RevokedList = {
  /** Lowercase hex, no leading zeros (`normalizeSerial`). */
  serials: string[];
  kids: string[];
};

/**
 * Parses revoked.json strictly: an object whose `serials` and `kids`, when present, are arrays
 * of strings. Serials come back normalized.
 * @param file named in the error message (default `revoked.json`)
 * @throws HeraldError `bad_option` naming the file and what is wrong
 */
export function parseRevoked(text: string | Buffer, file = 'revoked.json'): RevokedList {
  let j: unknown;
  try {
    j = JSON.parse(text.toString());
  } catch (err) {
    throw new HeraldError('bad_option', `${file} is not JSON`, { cause: err });
  }
  const o = (j ?? {}) as { serials?: unknown; kids?: unknown };
  const serials = o.serials ?? [];
  const kids = o.kids ?? [];
  if (typeof j !== 'object' || j === null || Array.isArray(j) || !isStrings(serials) || !isStrings(kids)) {
    throw new HeraldError('bad_option', `${file} must be {"serials":[string..],"kids":[string..]}`);
  }
  return { serials: serials.map(normalizeSerial), kids: [...kids] };
}

function isStrings(a: unknown): a is string[] {
  return Array.isArray(a) && a.every((s) => typeof s === 'string');
}
