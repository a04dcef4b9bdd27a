/**
 * Reads a certificate into a Herald identity (docs/configuration.md): its single URI SAN, in SPIFFE form, of
 * the configured trust domain, with the extended key usages its role needs. The CN is never
 * read. Uses node:crypto's X509Certificate (OpenSSL), never node-forge: forge only issues.
 */
import crypto from 'node:crypto';
import type tls from 'node:tls';
import { RefusalError } from '../protocol/errors.js';
import { parseSpiffeId, type Identity, type Role } from '../protocol/identity.js';
import { x509Of } from './x509-parse.js';

export const OID_SERVER_AUTH = '1.3.6.1.5.5.7.3.1';
export const OID_CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';

/** What each role's certificate must allow (docs/configuration.md). */
export const ROLE_EKUS: Readonly<Record<Role, readonly string[]>> = {
  agent: [OID_SERVER_AUTH, OID_CLIENT_AUTH],
  controller: [OID_SERVER_AUTH, OID_CLIENT_AUTH],
  operator: [OID_CLIENT_AUTH],
};

export interface CertIdentity extends Identity {
  /** Lowercase hex, no leading zeros, no colons: the form revoked.json holds. */
  serial: string;
  validFrom: Date;
  validTo: Date;
  /** DNS SANs: they locate a party, they never authorize it. */
  dns: string[];
  /** IP SANs as OpenSSL prints them. */
  ips: string[];
}

export type CertInput = tls.PeerCertificate | crypto.X509Certificate | string | Buffer;

/** Lowercase hex without `0x`, colons or leading zeros, so serials compare as strings. */
export function normalizeSerial(serial: string): string {
  const s = serial
    .trim()
    .toLowerCase()
    .replace(/^0x/, '')
    .replace(/:/g, '')
    .replace(/^0+(?=.)/, '');
  return s;
}

/** @throws RefusalError `no_identity` when the input is not a certificate at all. */
export function toX509(cert: CertInput): crypto.X509Certificate {
  if (cert instanceof crypto.X509Certificate) return cert;
  try {
    if (typeof cert === 'string') return new crypto.X509Certificate(cert);
    if (Buffer.isBuffer(cert)) return x509Of(cert);
    if (cert && Buffer.isBuffer(cert.raw)) return x509Of(cert.raw);
  } catch (err) {
    throw new RefusalError('no_identity', 'not a parsable X.509 certificate', { cause: err });
  }
  throw new RefusalError('no_identity', 'no certificate');
}

export interface SanEntry {
  type: string;
  value: string;
}

/**
 * Parses Node's `subjectAltName` string (`DNS:a, IP Address:1.2.3.4, URI:spiffe://..`). Since
 * Node 17.3 a value holding a comma, quote or other special character is printed as a JSON
 * string (`URI:"spiffe://x/a, URI:y"`), so a crafted name cannot pose as a second entry.
 * @throws RefusalError `bad_identity` on a string it cannot read unambiguously
 */
export function parseSubjectAltName(s: string | undefined): SanEntry[] {
  const out: SanEntry[] = [];
  if (!s) return out;
  let i = 0;
  while (i < s.length) {
    const colon = s.indexOf(':', i);
    if (colon < 0) throw new RefusalError('bad_identity', 'unreadable subjectAltName');
    const type = s.slice(i, colon);
    i = colon + 1;
    let value: string;
    if (s[i] === '"') {
      let j = i + 1;
      while (j < s.length && s[j] !== '"') j += s[j] === '\\' ? 2 : 1;
      if (j >= s.length) throw new RefusalError('bad_identity', 'unterminated quoted subjectAltName entry');
      try {
        value = JSON.parse(s.slice(i, j + 1)) as string;
      } catch (err) {
        throw new RefusalError('bad_identity', 'unreadable quoted subjectAltName entry', { cause: err });
      }
      i = j + 1;
    } else {
      const end = s.indexOf(', ', i);
      value = end < 0 ? s.slice(i) : s.slice(i, end);
      i = end < 0 ? s.length : end;
    }
    if (i < s.length) {
      if (!s.startsWith(', ', i)) throw new RefusalError('bad_identity', 'unreadable subjectAltName');
      i += 2;
    }
    out.push({ type, value });
  }
  return out;
}

/**
 * The single URI SAN of a certificate, unchecked against any trust domain.
 * @throws RefusalError `no_identity` or `multiple_identities`
 */
export function uriSanOf(cert: CertInput): string {
  const x = toX509(cert);
  const uris = parseSubjectAltName(x.subjectAltName).filter((e) => e.type === 'URI');
  if (uris.length === 0) throw new RefusalError('no_identity', 'the certificate has no URI SAN');
  if (uris.length > 1) throw new RefusalError('multiple_identities', `the certificate has ${uris.length} URI SANs`);
  return uris[0]!.value;
}

/**
 * The trust domain a certificate names in its single `spiffe://` URI SAN (a CA's
 * `spiffe://<domain>`, or a party's), without checking it against a configured one.
 * @throws RefusalError `no_identity`, `multiple_identities`
 */
export function trustDomainOf(cert: CertInput): string {
  const m = /^spiffe:\/\/([^/]+)(\/|$)/.exec(uriSanOf(cert));
  if (!m) throw new RefusalError('no_identity', 'the URI SAN is not a spiffe:// id');
  return m[1]!;
}

/**
 * A certificate's Herald identity, checked against `trustDomain` and its role's EKUs.
 * Does not check the chain, dates or revocation: `authorizePeer` (certs/tls.ts) does.
 * @throws RefusalError `no_identity`, `multiple_identities`, `wrong_trust_domain`,
 *   `bad_identity`, `wrong_eku`
 */
export function identityOf(cert: CertInput, trustDomain: string): CertIdentity {
  const x = toX509(cert);
  const sans = parseSubjectAltName(x.subjectAltName);
  const uris = sans.filter((e) => e.type === 'URI');
  if (uris.length === 0) throw new RefusalError('no_identity', 'the certificate has no URI SAN');
  if (uris.length > 1) throw new RefusalError('multiple_identities', `the certificate has ${uris.length} URI SANs`);
  const uri = uris[0]!.value;
  if (!uri.startsWith('spiffe://')) throw new RefusalError('no_identity', 'the URI SAN is not a spiffe:// id');
  if (uri.includes('%'))
    throw new RefusalError('bad_identity', 'percent-escapes are not allowed in a Herald SPIFFE id');
  const id = parseSpiffeId(uri, trustDomain);
  const ekus = x.keyUsage ?? [];
  const missing = ROLE_EKUS[id.role].filter((oid) => !ekus.includes(oid));
  if (missing.length > 0) {
    throw new RefusalError(
      'wrong_eku',
      `a ${id.role} certificate needs ${ekuNames(ROLE_EKUS[id.role])}; this one has ${ekuNames(ekus) || 'none'}`,
    );
  }
  return {
    ...id,
    serial: normalizeSerial(x.serialNumber),
    validFrom: new Date(x.validFrom),
    validTo: new Date(x.validTo),
    dns: sans.filter((e) => e.type === 'DNS').map((e) => e.value),
    ips: sans.filter((e) => e.type === 'IP Address').map((e) => e.value),
  };
}

function ekuNames(oids: readonly string[]): string {
  return oids.map((o) => (o === OID_SERVER_AUTH ? 'serverAuth' : o === OID_CLIENT_AUTH ? 'clientAuth' : o)).join('+');
}
