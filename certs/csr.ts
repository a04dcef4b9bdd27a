/**
 * A PKCS#10 certificate signing request (RFC 2986), made on the node for enrolment and renewal
 * (docs/adding-nodes.md): its key never leaves the node, only this request does. Encoded here by hand (a few
 * DER structures) and signed by Node, so the agent's bundle carries no node-forge; the
 * controller reads and verifies requests in csr-verify.ts. Also the SHA-256 fingerprint of a CA
 * certificate, as `openssl x509 -noout -fingerprint -sha256` prints it.
 */
import crypto from 'node:crypto';
import { parseIp } from '../protocol/address.js';
import { HeraldError } from '../protocol/errors.js';
import { oid, seq, set, tlv } from './der-write.js';

export interface CsrOptions {
  /** The private key (PKCS#8 PEM, RSA) whose public half the request carries. */
  keyPem: string;
  /** Informational only: Herald never trusts the CN. */
  commonName: string;
  uris?: string[];
  dns?: string[];
  ips?: string[];
}

const OID_CN = '2.5.4.3';
const OID_EXTENSION_REQUEST = '1.2.840.113549.1.9.14';
const OID_SUBJECT_ALT_NAME = '2.5.29.17';
const OID_SHA256_WITH_RSA = '1.2.840.113549.1.1.11';

/**
 * Makes a CSR signed with `keyPem` (SHA-256 with RSA), asking for the given SANs.
 * @throws HeraldError `bad_option` for an IP SAN that is not an address
 */
export function makeCsr(o: CsrOptions): string {
  const key = crypto.createPrivateKey(o.keyPem);
  const spki = crypto.createPublicKey(key).export({ type: 'spki', format: 'der' });
  const names: Buffer[] = [
    ...(o.uris ?? []).map((u) => tlv(0x86, Buffer.from(u, 'ascii'))),
    ...(o.dns ?? []).map((d) => tlv(0x82, Buffer.from(d, 'ascii'))),
    ...(o.ips ?? []).map((ip) => {
      const b = parseIp(ip);
      if (b === null) throw new HeraldError('bad_option', `${JSON.stringify(ip)} is not an IP address`);
      return tlv(0x87, Buffer.from(b));
    }),
  ];
  const attributes =
    names.length === 0
      ? tlv(0xa0)
      : tlv(0xa0, seq(oid(OID_EXTENSION_REQUEST), set(seq(seq(oid(OID_SUBJECT_ALT_NAME), tlv(0x04, seq(...names)))))));
  const info = seq(
    tlv(0x02, Buffer.from([0])),
    seq(set(seq(oid(OID_CN), tlv(0x0c, Buffer.from(o.commonName, 'utf8'))))),
    spki,
    attributes,
  );
  const signature = crypto.sign('sha256', info, key);
  const der = seq(info, seq(oid(OID_SHA256_WITH_RSA), tlv(0x05)), tlv(0x03, Buffer.from([0]), signature));
  const b64 = der.toString('base64').replace(/(.{64})/g, '$1\n');
  return `-----BEGIN CERTIFICATE REQUEST-----\n${b64.trimEnd()}\n-----END CERTIFICATE REQUEST-----\n`;
}

/** SHA-256 of a certificate's DER, 64 lowercase hex digits. */
export function certificateSha256(cert: crypto.X509Certificate | Buffer): string {
  const raw = Buffer.isBuffer(cert) ? cert : cert.raw;
  return crypto.createHash('sha256').update(raw).digest('hex');
}
