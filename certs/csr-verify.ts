/**
 * The controller's side of a certificate signing request (SPEC §9): parse a PKCS#10 request,
 * check its self-signature (proof that the sender holds the key), and read what it asks for.
 * What it asks for is only compared with what the caller may have: the certificate Herald
 * issues carries the token's (or the current certificate's) identity and SANs, never the CSR's.
 */
import crypto from 'node:crypto';
import forge from 'node-forge';
import { expandedIp } from '../protocol/address.js';
import { HeraldError } from '../protocol/errors.js';

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

/**
 * Parses and verifies a CSR.
 * @throws HeraldError `bad_csr` when it does not parse, is not RSA, or its signature fails
 */
export function readCsr(pem: unknown): ReadCsr {
  if (typeof pem !== 'string' || pem.length > MAX_CSR_CHARS || !pem.includes('-----BEGIN CERTIFICATE REQUEST-----'))
    throw new HeraldError('bad_csr', 'csr must be a PEM certificate request');
  let csr: forge.pki.CertificateSigningRequest;
  try {
    csr = forge.pki.certificationRequestFromPem(pem, true);
  } catch (err) {
    throw new HeraldError('bad_csr', 'the CSR does not parse (or its key is not RSA)', { cause: err });
  }
  let ok = false;
  try {
    ok = csr.verify();
  } catch {
    ok = false;
  }
  if (!ok) throw new HeraldError('bad_csr', "the CSR's signature does not verify with its key");
  const publicKeyPem = forge.pki.publicKeyToPem(csr.publicKey as forge.pki.rsa.PublicKey);
  // Node must read the key too (it is what the certificate will carry)
  try {
    crypto.createPublicKey(publicKeyPem);
  } catch (err) {
    throw new HeraldError('bad_csr', "the CSR's key does not parse", { cause: err });
  }
  const cnField = csr.subject.getField('CN') as { value?: unknown } | null;
  const uris: string[] = [];
  const dns: string[] = [];
  const ips: string[] = [];
  const req = csr.getAttribute({ name: 'extensionRequest' }) as { extensions?: unknown[] } | null;
  for (const ext of (req?.extensions ?? []) as Array<{ name?: string; altNames?: unknown[] }>) {
    if (ext.name !== 'subjectAltName') continue;
    for (const a of (ext.altNames ?? []) as Array<{ type: number; value: string; ip?: string }>) {
      if (a.type === 6) uris.push(String(a.value));
      else if (a.type === 2) dns.push(String(a.value).toLowerCase());
      else if (a.type === 7)
        ips.push(expandedIp(a.ip ?? '') ?? `unreadable:${Buffer.from(a.value, 'binary').toString('hex')}`);
      else uris.push(`other-name-type-${a.type}`);
    }
  }
  return {
    publicKeyPem,
    commonName: typeof cnField?.value === 'string' ? cnField.value : undefined,
    uris,
    dns,
    ips,
  };
}
