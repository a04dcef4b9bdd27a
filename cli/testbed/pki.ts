/**
 * The testbed's PKI (docs/development.md, "The testbed"): a CA, the first controller's
 * certificate and signing key, `operator/admin` (what `herald certs init` makes), and the
 * controller, agent and issuer certificates asked for, made by certs/ in a directory of the
 * layout every `--pki` reads (docs/configuration.md). Certificates of controllers and agents
 * carry the SANs 127.0.0.1 and localhost, where the testbed's processes listen.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import { FIRST_CONTROLLER, pkiPaths, type CertDir, type PkiPaths } from '../../certs/paths.js';
import { initPki, issueCert, type IssueResult } from '../../certs/pki.js';
import { readTrustDomain } from '../../certs/trust-domain.js';

/** The SANs of the testbed's controller and agent certificates: where its processes listen. */
export const LOOPBACK_SANS = { ip: ['127.0.0.1'], dns: ['localhost'] } as const;

/** A certificate, its key and the CA: what `https`/`tls` options take. */
export interface Cred {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
}

export interface PkiOptions {
  /** Default `herald.local`. */
  trustDomain?: string | undefined;
  /** Controllers beside `controller` (which the PKI always has): each gets a certificate and a signing key. */
  controllers?: readonly string[] | undefined;
  agents?: readonly string[] | undefined;
  /** Issuing CAs under the cluster CA (docs/adding-nodes.md), for enrolment. */
  issuers?: readonly string[] | undefined;
  /**
   * One private key (PKCS#8 PEM) for every certificate issued after the CA's own set: key
   * making is the slow part. Default: a new key each.
   */
  keyPem?: string | undefined;
}

export interface IssueOptions {
  dns?: string[];
  ip?: string[];
  notBefore?: Date;
  notAfter?: Date;
  /** Default: the PKI's `keyPem`, else a new key. */
  keyPem?: string;
}

export interface TestbedPki {
  readonly dir: string;
  readonly trustDomain: string;
  readonly paths: PkiPaths;
  /** The credentials of `role/name` in the layout, read now. */
  cred(role: CertDir, name: string): Cred;
  /** `operator/admin`'s credentials. */
  operator(): Cred;
  /** The CA certificate's SHA-256 (lowercase hex), what `herald agent enroll --ca-sha256` checks. */
  caSha256(): string;
  /** Issues (or issues again) `role/name`, with the loopback SANs unless given (an issuer has none). */
  issue(role: CertDir, name: string, o?: IssueOptions): Promise<IssueResult>;
}

/**
 * Makes a PKI in `dir` (which must not hold one), with what `o` asks for.
 * @throws HeraldError from certs/ (`pki_exists`, `bad_identity`, `bad_option`)
 */
export async function makePki(dir: string, o: PkiOptions = {}): Promise<TestbedPki> {
  await initPki({ dir, ...(o.trustDomain !== undefined ? { trustDomain: o.trustDomain } : {}) });
  const pki = openPki(dir, o.keyPem);
  await Promise.all([
    ...(o.controllers ?? []).filter((n) => n !== FIRST_CONTROLLER).map((n) => pki.issue('controller', n)),
    ...(o.agents ?? []).map((n) => pki.issue('agent', n)),
  ]);
  for (const n of o.issuers ?? []) await pki.issue('issuer', n);
  return pki;
}

/** The TestbedPki view of the PKI already in `dir` (made by `makePki`, `herald certs init` or a cache). */
export function openPki(dir: string, keyPem?: string): TestbedPki {
  const paths = pkiPaths(dir);
  let trustDomain: string | undefined;
  const cred = (role: CertDir, name: string): Cred => ({
    ca: fs.readFileSync(paths.caCrt),
    cert: fs.readFileSync(paths.cert(role, name)),
    key: fs.readFileSync(paths.key(role, name)),
  });
  return {
    dir,
    get trustDomain() {
      trustDomain ??= readTrustDomain(dir);
      return trustDomain;
    },
    paths,
    cred,
    operator: () => cred('operator', 'admin'),
    caSha256: () =>
      crypto
        .createHash('sha256')
        .update(new crypto.X509Certificate(fs.readFileSync(paths.caCrt)).raw)
        .digest('hex'),
    issue: (role, name, i = {}) => {
      const key = i.keyPem ?? keyPem;
      // an issuer has no SANs
      const sans = role === 'issuer' ? {} : { ip: i.ip ?? [...LOOPBACK_SANS.ip], dns: i.dns ?? [...LOOPBACK_SANS.dns] };
      return issueCert({
        dir,
        role,
        name,
        ...sans,
        ...(i.notBefore !== undefined ? { notBefore: i.notBefore } : {}),
        ...(i.notAfter !== undefined ? { notAfter: i.notAfter } : {}),
        ...(key !== undefined ? { keyPem: key } : {}),
      });
    },
  };
}
