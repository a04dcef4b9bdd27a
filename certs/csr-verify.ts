/**
 * The controller's side of a certificate signing request (docs/adding-nodes.md): parse a PKCS#10 request,
 * check its self-signature (proof that the sender holds the key), and read what it asks for.
 * What it asks for is only compared with what the caller may have: the certificate Herald
 * issues carries the token's (or the current certificate's) identity and SANs, never the CSR's.
 *
 * A CSR arrives before its sender is known (`POST /v1/enroll`), so reading one must cost little
 * whatever its shape (SECURITY.md, "Enrolment"): the DER is walked in a fixed shape by the strict
 * reader of der.ts, the key is admitted by key-policy.ts before any signature work, and the
 * signature is checked by OpenSSL (node:crypto), never by JavaScript big-number code.
 */
import crypto from 'node:crypto';
import { expandedIp } from '../protocol/address.js';
import { HeraldError } from '../protocol/errors.js';
import { bytesOf, childrenOf, contentOf, DerError, oidOf, readWhole, TAG, type Tlv } from './der.js';
import { admitSpki, type KeyFamily } from './key-policy.js';

export interface ReadCsr {
  /** SPKI PEM of the requested key. */
  publicKeyPem: string;
  commonName: string | undefined;
  uris: string[];
  dns: string[];
  /** In expandedIp form, so spellings compare equal. */
  ips: string[];
}

/** Longest CSR PEM read. */
const MAX_CSR_CHARS = 8 * 1024;
/** The keys a CSR may carry: the issuer certifies RSA keys only (certs/pki.ts, node-forge). */
const CSR_KEY_FAMILIES: readonly KeyFamily[] = ['rsa'];
/** The signature algorithms read, by OID: the digest and the key family that signs with them. */
const SIGNATURE_ALGORITHMS: Record<string, { hash: string; family: KeyFamily }> = {
  '1.2.840.113549.1.1.11': { hash: 'sha256', family: 'rsa' },
  '1.2.840.113549.1.1.12': { hash: 'sha384', family: 'rsa' },
  '1.2.840.113549.1.1.13': { hash: 'sha512', family: 'rsa' },
};
const OID_CN = '2.5.4.3';
const OID_EXTENSION_REQUEST = '1.2.840.113549.1.9.14';
const OID_SUBJECT_ALT_NAME = '2.5.29.17';
const PEM_RE = /^-----BEGIN CERTIFICATE REQUEST-----\r?\n([A-Za-z0-9+/=\r\n]+)-----END CERTIFICATE REQUEST-----\s*$/;

function bad(message: string, cause?: unknown): never {
  throw new HeraldError('bad_csr', message, cause === undefined ? undefined : { cause });
}

/**
 * Parses and verifies a CSR.
 * @throws HeraldError `bad_csr` when it does not parse or its signature fails, `bad_key` when
 *   its key is not one Herald certifies (key-policy.ts; checked before the signature)
 */
export function readCsr(pem: unknown): ReadCsr {
  if (typeof pem !== 'string' || pem.length > MAX_CSR_CHARS) bad('csr must be a PEM certificate request');
  const m = PEM_RE.exec(`${pem.trim()}\n`);
  if (!m) bad('csr must be a PEM certificate request');
  const der = Buffer.from(m[1]!.replace(/\s/g, ''), 'base64');
  let info: Tlv;
  let spki: Buffer;
  let sigAlg: { hash: string; family: KeyFamily };
  let signature: Buffer;
  try {
    const outer = readWhole(der, TAG.sequence, 'CertificationRequest');
    const parts = childrenOf(der, outer);
    if (parts.length !== 3) bad('the CSR is not a CertificationRequest (three parts)');
    info = parts[0]!;
    if (info.tag !== TAG.sequence) bad('the CSR has no request info');
    const algParts = expectSequence(der, parts[1]!, 'signature algorithm');
    const alg = algParts[0] ? SIGNATURE_ALGORITHMS[oidOf(der, algParts[0])] : undefined;
    // sha*WithRSAEncryption: NULL or absent parameters (RFC 4055)
    const params = algParts[1];
    if (alg === undefined || algParts.length > 2 || (params && (params.tag !== TAG.null || params.end !== params.body)))
      bad('the CSR is signed with an algorithm Herald does not read (only SHA-256/384/512 with RSA)');
    sigAlg = alg;
    const sigBits = parts[2]!;
    if (sigBits.tag !== TAG.bitString || sigBits.end === sigBits.body || der[sigBits.body] !== 0)
      bad('the CSR signature is not a whole-byte bit string');
    signature = der.subarray(sigBits.body + 1, sigBits.end);
    const infoParts = childrenOf(der, info);
    const [version, , spkiTlv] = infoParts;
    if (version?.tag !== TAG.integer || contentOf(der, version).toString('hex') !== '00')
      bad('the CSR is not a version 1 request');
    if (spkiTlv?.tag !== TAG.sequence) bad('the CSR carries no key');
    spki = bytesOf(der, spkiTlv);
  } catch (err) {
    if (err instanceof DerError) bad(`the CSR does not parse (${err.message})`, err);
    throw err;
  }
  // the policy before the signature: what a verification costs is the key's
  const { key, family } = admitSpki(spki, CSR_KEY_FAMILIES);
  if (family !== sigAlg.family) bad("the CSR's signature algorithm is not one of its key");
  let ok = false;
  try {
    ok = crypto.verify(sigAlg.hash, bytesOf(der, info), key, signature);
  } catch {
    ok = false;
  }
  if (!ok) bad("the CSR's signature does not verify with its key");
  try {
    return { publicKeyPem: key.export({ type: 'spki', format: 'pem' }) as string, ...namesOf(der, info) };
  } catch (err) {
    if (err instanceof DerError) bad(`the CSR's names do not parse (${err.message})`, err);
    throw err;
  }
}

function expectSequence(der: Buffer, t: Tlv, what: string): Tlv[] {
  if (t.tag !== TAG.sequence) throw new DerError(`${what} is not a SEQUENCE`);
  return childrenOf(der, t);
}

/** A directory string's text: UTF-8 for UTF8String, one byte a character for the others. */
function textOf(der: Buffer, t: Tlv): string {
  const b = contentOf(der, t);
  return t.tag === TAG.utf8String ? b.toString('utf8') : b.toString('latin1');
}

/** The subject's CN and the SANs of the extensionRequest attribute (the signed part only). */
function namesOf(der: Buffer, info: Tlv): Omit<ReadCsr, 'publicKeyPem'> {
  const [, subject, , attributes] = childrenOf(der, info);
  let commonName: string | undefined;
  for (const rdn of expectSequence(der, subject!, 'subject')) {
    if (rdn.tag !== TAG.set) throw new DerError('a subject RDN is not a SET');
    for (const atv of childrenOf(der, rdn)) {
      const [type, value] = expectSequence(der, atv, 'a subject attribute');
      if (type && value && oidOf(der, type) === OID_CN) commonName = textOf(der, value);
    }
  }
  const uris: string[] = [];
  const dns: string[] = [];
  const ips: string[] = [];
  // attributes are [0] IMPLICIT SET OF Attribute
  if (attributes !== undefined) {
    if (attributes.tag !== 0xa0) throw new DerError('the attributes are not [0]');
    for (const attr of childrenOf(der, attributes)) {
      const [type, values] = expectSequence(der, attr, 'an attribute');
      if (!type || oidOf(der, type) !== OID_EXTENSION_REQUEST) continue;
      if (values?.tag !== TAG.set) throw new DerError('extensionRequest values are not a SET');
      for (const exts of childrenOf(der, values)) {
        for (const ext of expectSequence(der, exts, 'extensions')) {
          const e = expectSequence(der, ext, 'an extension');
          if (!e[0] || oidOf(der, e[0]) !== OID_SUBJECT_ALT_NAME) continue;
          const value = e[e.length - 1]!;
          if (value.tag !== TAG.octetString) throw new DerError('an extension value is not an OCTET STRING');
          const inner = contentOf(der, value);
          const names = readWhole(inner, TAG.sequence, 'subjectAltName');
          for (const n of childrenOf(inner, names)) {
            const v = contentOf(inner, n);
            if (n.tag === 0x86) uris.push(v.toString('latin1'));
            else if (n.tag === 0x82) dns.push(v.toString('latin1').toLowerCase());
            else if (n.tag === 0x87) ips.push(ipOf(v) ?? `unreadable:${v.toString('hex')}`);
            // anything else (an email, a directory name, ...) is more than Herald issues
            else uris.push(`other-name-type-${n.tag & 0x1f}`);
          }
        }
      }
    }
  }
  return { commonName, uris, dns, ips };
}

function ipOf(b: Buffer): string | null {
  if (b.length === 4) return expandedIp(Array.from(b).join('.'));
  if (b.length === 16) return expandedIp((b.toString('hex').match(/..../g) ?? []).join(':'));
  return null;
}
