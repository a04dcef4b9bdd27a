/**
 * revoked.json (docs/configuration.md): `{"serials":[hex..],"kids":[kid..],"identities":{"agent/<name>":iso}}`,
 * the certificates and signing keys no party may use any more. `identities` revokes an identity
 * whatever issued its certificates: every certificate of it whose notBefore is earlier than the
 * time given is refused (docs/certificates-over-time.md, "Revoking a node"). Parsed here only:
 * `herald certs revoke` (certs/pki.ts) writes it and every party's `PkiMaterial` (certs/tls.ts)
 * reads it. No node-forge here, so loading the TLS helper never loads it.
 */
import { HeraldError } from '../protocol/errors.js';
import { normalizeSerial } from './identity.js';

export type RevokedList = {
  /** Lowercase hex, no leading zeros (`normalizeSerial`). */
  serials: string[];
  kids: string[];
  /** `role/name` -> ISO 8601 floor: certificates of it with an earlier notBefore are revoked. */
  identities?: Record<string, string>;
};

/** `role/name` of an identity, the key of `RevokedList.identities`. */
export function identityKey(role: string, name: string): string {
  return `${role}/${name}`;
}

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
  const o = (j ?? {}) as { serials?: unknown; kids?: unknown; identities?: unknown };
  const serials = o.serials ?? [];
  const kids = o.kids ?? [];
  const identities = o.identities ?? {};
  if (
    typeof j !== 'object' ||
    j === null ||
    Array.isArray(j) ||
    !isStrings(serials) ||
    !isStrings(kids) ||
    !isFloors(identities)
  ) {
    throw new HeraldError(
      'bad_option',
      `${file} must be {"serials":[string..],"kids":[string..],"identities"?:{"role/name":ISO time..}}`,
    );
  }
  const list: RevokedList = { serials: serials.map(normalizeSerial), kids: [...kids] };
  if (Object.keys(identities).length > 0) list.identities = { ...identities };
  return list;
}

function isFloors(o: unknown): o is Record<string, string> {
  if (typeof o !== 'object' || o === null || Array.isArray(o)) return false;
  return Object.entries(o).every(
    ([k, v]) =>
      /^[a-z]+\/[a-z0-9][a-z0-9._-]{0,62}$/.test(k) && typeof v === 'string' && Number.isFinite(Date.parse(v)),
  );
}

function isStrings(a: unknown): a is string[] {
  return Array.isArray(a) && a.every((s) => typeof s === 'string');
}
