/**
 * Which chains Herald accepts (docs/configuration.md): a leaf signed by the cluster CA directly, or through
 * exactly one Herald issuer, an intermediate CA that the cluster CA signed, with pathLen 0 and
 * the single URI SAN `spiffe://<trust domain>/issuer/<name>`, that signs agent certificates
 * only. OpenSSL verifies the chain at the handshake; this module re-checks it against the
 * current CA and revocation list on every connection (a resumed session skips verification)
 * and adds what OpenSSL does not know: the issuer's identity, its one level, and its subtree's
 * revocation. node:crypto only, no node-forge.
 */
import crypto from 'node:crypto';
import type tls from 'node:tls';
import type { ErrorCode } from '../protocol/errors.js';
import { isValidName } from '../protocol/identity.js';
import { normalizeSerial, parseSubjectAltName } from './identity.js';
import { x509Of } from './x509-parse.js';

/** The SPIFFE path segment of an issuing CA: `spiffe://<td>/issuer/<name>`. Never a peer's role. */
export const ISSUER_ROLE = 'issuer';

/** Issuers remembered from full handshakes, for resumed sessions that do not show the chain. */
export const MAX_REMEMBERED_ISSUERS = 64;

export type ChainResult =
  | { ok: true; issuer: crypto.X509Certificate | undefined; issuerName: string | undefined }
  | { ok: false; code: ErrorCode; message: string };

export interface ChainContext {
  /** The trusted cluster CA certificates (several during a CA rotation). */
  roots: readonly crypto.X509Certificate[];
  trustDomain: string;
  /** Lowercase hex serials. */
  revokedSerials: ReadonlySet<string>;
  /** Issuers seen (and checked) before, for a session whose chain is not shown. */
  remembered?: Iterable<crypto.X509Certificate>;
  now: number;
}

/**
 * The name in an issuer certificate's single `spiffe://<trustDomain>/issuer/<name>` URI SAN.
 * @returns the name, or a reason it is not one
 */
export function issuerNameOf(x: crypto.X509Certificate, trustDomain: string): { name: string } | { why: string } {
  let uris: string[];
  try {
    uris = parseSubjectAltName(x.subjectAltName)
      .filter((e) => e.type === 'URI')
      .map((e) => e.value);
  } catch {
    return { why: 'its subjectAltName does not parse' };
  }
  if (uris.length !== 1) return { why: `it has ${uris.length} URI SANs, not one spiffe://<td>/issuer/<name>` };
  const m = /^spiffe:\/\/([^/]*)\/([^/]*)\/([^/]*)$/.exec(uris[0]!);
  if (!m || m[2] !== ISSUER_ROLE)
    return { why: `its URI SAN ${JSON.stringify(uris[0]!.slice(0, 200))} is not an issuer id` };
  if (m[1] !== trustDomain) return { why: `it is an issuer of trust domain ${JSON.stringify(m[1]!.slice(0, 100))}` };
  if (!isValidName(m[3]!)) return { why: `its name ${JSON.stringify(m[3]!.slice(0, 80))} is not a valid name` };
  return { name: m[3]! };
}

/** The certificates above `leaf` as the peer presented them (Node links them by `issuerCertificate`). */
export function presentedAbove(leaf: crypto.X509Certificate | tls.PeerCertificate): crypto.X509Certificate[] {
  const out: crypto.X509Certificate[] = [];
  const seen = new Set<unknown>([leaf]);
  let c = (leaf as { issuerCertificate?: unknown }).issuerCertificate;
  while (c && !seen.has(c) && out.length < 8) {
    seen.add(c);
    const x = asX509(c);
    if (x === undefined) break;
    out.push(x);
    c = (c as { issuerCertificate?: unknown }).issuerCertificate;
  }
  return out;
}

function asX509(c: unknown): crypto.X509Certificate | undefined {
  if (c instanceof crypto.X509Certificate) return c;
  const raw = (c as { raw?: unknown }).raw;
  if (!Buffer.isBuffer(raw)) return undefined;
  try {
    return x509Of(raw);
  } catch {
    return undefined;
  }
}

const signs = (parent: crypto.X509Certificate, child: crypto.X509Certificate): boolean =>
  child.checkIssued(parent) && child.verify(parent.publicKey);

/**
 * Checks that `leaf` is signed by one of the roots, or by one Herald issuer (found among
 * `above`, else among `remembered`) that a root signed and that is valid now and not revoked.
 * Does not check the leaf's own dates, revocation or identity (`authorizeCertificate` does), but
 * the caller must refuse a leaf under an issuer whose role is not agent (`leafRoleAllowed`).
 * Codes: `untrusted_certificate` (no such chain, or a deeper one), `bad_issuer`,
 * `certificate_expired` (the issuer), `revoked` (the issuer).
 */
export function checkChain(
  leaf: crypto.X509Certificate,
  above: readonly crypto.X509Certificate[],
  ctx: ChainContext,
): ChainResult {
  if (ctx.roots.some((r) => signs(r, leaf))) return { ok: true, issuer: undefined, issuerName: undefined };
  const candidates = [...above, ...(ctx.remembered ?? [])];
  const issuer = candidates.find((c) => signs(c, leaf));
  if (issuer === undefined)
    return fail('untrusted_certificate', 'the certificate is not signed by the current cluster CA or a Herald issuer');
  if (!ctx.roots.some((r) => signs(r, issuer))) {
    const deeper = candidates.some((c) => c !== issuer && signs(c, issuer));
    return fail(
      'untrusted_certificate',
      deeper
        ? 'the chain has more than one intermediate; Herald accepts one issuer at most'
        : "the certificate's issuer is not signed by the current cluster CA",
    );
  }
  const bc = basicConstraintsOf(issuer);
  if (!bc.ca || bc.pathLen !== 0)
    return fail('bad_issuer', 'the intermediate is not a CA with pathLen 0, so not a Herald issuer');
  const named = issuerNameOf(issuer, ctx.trustDomain);
  if ('why' in named) return fail('bad_issuer', `the intermediate is not a Herald issuer: ${named.why}`);
  const from = Date.parse(issuer.validFrom);
  const to = Date.parse(issuer.validTo);
  if (!(ctx.now >= from && ctx.now <= to))
    return fail('certificate_expired', `issuer ${named.name} is valid from ${issuer.validFrom} to ${issuer.validTo}`);
  const serial = normalizeSerial(issuer.serialNumber);
  if (ctx.revokedSerials.has(serial))
    return fail(
      'revoked',
      `issuer ${named.name} (serial ${serial}) is revoked, and with it every certificate it signed`,
    );
  return { ok: true, issuer, issuerName: named.name };
}

/** Herald issuers sign agent certificates only. */
export function leafRoleAllowed(role: string, issuerName: string | undefined): ChainResult | undefined {
  if (issuerName === undefined || role === 'agent') return undefined;
  return fail('bad_issuer', `issuer ${issuerName} signed a ${role} certificate; issuers sign agent certificates only`);
}

function fail(code: ErrorCode, message: string): ChainResult {
  return { ok: false, code, message };
}

// ---- basicConstraints, read from the DER (node:crypto does not expose pathLen) ------------------

interface Tlv {
  tag: number;
  start: number;
  end: number;
}

function tlv(b: Buffer, at: number, limit: number): Tlv {
  if (at + 2 > limit) throw new RangeError('truncated DER');
  const tag = b[at]!;
  let len = b[at + 1]!;
  let start = at + 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    if (n === 0 || n > 4 || start + n > limit) throw new RangeError('bad DER length');
    len = 0;
    for (let i = 0; i < n; i++) len = len * 256 + b[start + i]!;
    start += n;
  }
  if (start + len > limit) throw new RangeError('truncated DER');
  return { tag, start, end: start + len };
}

function children(b: Buffer, parent: Tlv): Tlv[] {
  const out: Tlv[] = [];
  for (let at = parent.start; at < parent.end; ) {
    const t = tlv(b, at, parent.end);
    out.push(t);
    at = t.end;
  }
  return out;
}

const OID_BASIC_CONSTRAINTS = Buffer.from([0x55, 0x1d, 0x13]);

/**
 * A certificate's basicConstraints: `ca`, and `pathLen` when present. A certificate that does
 * not parse, or has no such extension, reads as `{ ca: false }`.
 */
export function basicConstraintsOf(x: crypto.X509Certificate): { ca: boolean; pathLen?: number } {
  try {
    const der = x.raw;
    const cert = tlv(der, 0, der.length);
    const tbs = children(der, cert)[0]!;
    const ext = children(der, tbs).find((t) => t.tag === 0xa3);
    if (!ext) return { ca: false };
    const seq = children(der, ext)[0]!;
    for (const e of children(der, seq)) {
      const parts = children(der, e);
      const oid = parts[0]!;
      if (oid.tag !== 0x06 || !der.subarray(oid.start, oid.end).equals(OID_BASIC_CONSTRAINTS)) continue;
      const octets = parts[parts.length - 1]!;
      const bcSeq = tlv(der, octets.start, octets.end);
      const fields = children(der, bcSeq);
      let ca = false;
      let pathLen: number | undefined;
      for (const f of fields) {
        if (f.tag === 0x01) ca = der[f.start] !== 0;
        else if (f.tag === 0x02) pathLen = der.subarray(f.start, f.end).reduce((n, byte) => n * 256 + byte, 0);
      }
      return pathLen === undefined ? { ca } : { ca, pathLen };
    }
    return { ca: false };
  } catch {
    return { ca: false };
  }
}
