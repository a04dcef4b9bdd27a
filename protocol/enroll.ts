/**
 * The wire of enrolment and renewal (docs/adding-nodes.md), shared by the controller and the agent: the
 * bodies of `POST /v1/enroll` and `POST /v1/nodes/{node}/certificate`, the certificate bundle
 * both answer, the CA fingerprint form, and when an agent renews and warns. Pure: no I/O.
 */
import { HeraldError } from './errors.js';
import { RENEWAL_AT_FRACTION, RENEWAL_WARN_FRACTION } from './limits.js';

/** `POST /v1/enroll`: a join token, the node it was made for, and a PKCS#10 CSR (PEM). */
export interface EnrollRequest {
  token: string;
  node: string;
  csr: string;
}

/** `POST /v1/nodes/{node}/certificate` (over mTLS with the current certificate). */
export interface RenewRequest {
  /** A CSR for a new key, same identity and SANs as the current certificate. */
  csr: string;
  /** Renewal attempts that failed since the last success (the controller shows them). */
  failed_attempts?: number;
  /** The code of the last failure, when there was one. */
  last_error?: string;
}

/** What enrolment and renewal answer: everything the PKI layout (docs/configuration.md) needs on the node. */
export interface CertificateBundle {
  node: string;
  /** The agent certificate followed by its issuer (PEM), the node's `agent/<node>.crt`. */
  certificate: string;
  /** `ca.crt` */
  ca: string;
  /** `wake-signing.jwks` */
  jwks: { keys: Array<Record<string, unknown>> };
  /** `revoked.json` */
  revoked: { serials: string[]; kids: string[] };
  /** ISO 8601 */
  not_after: string;
}

/** A join token's public view (never its secret). */
export interface EnrollmentTokenView {
  id: string;
  node: string;
  dns: string[];
  ips: string[];
  created_at: string;
  created_by: string;
  expires_at: string;
  used_at: string | null;
  revoked_at: string | null;
  /** `active`, `used`, `revoked` or `expired`, at the time of the answer. */
  state: 'active' | 'used' | 'revoked' | 'expired';
}

/** The node's certificate as the controller last saw it, and its renewal (GET /v1/nodes/{id}). */
export interface NodeCertificateView {
  serial: string;
  not_before: string;
  not_after: string;
  /** When the agent is due to renew (two thirds of the lifetime). */
  renew_at: string;
  /** `ok` before renew_at, `due` after, `overdue` past 90 %, `expired` past not_after. */
  renewal: 'ok' | 'due' | 'overdue' | 'expired';
  /** When the controller issued it (enrolment or renewal); null for a certificate made on the CA host. */
  issued_at: string | null;
  renewal_failures: number;
  last_renewal_error: string | null;
  last_renewal_attempt_at: string | null;
}

/**
 * A CA fingerprint as `openssl x509 -noout -fingerprint -sha256` prints it (colons, any case) or
 * as plain hex, to 64 lowercase hex digits.
 * @throws HeraldError `bad_option`
 */
export function normalizeFingerprint(fp: string): string {
  const hex = fp
    .trim()
    .replace(/^sha256\s*fingerprint\s*=\s*/i, '')
    .replace(/:/g, '')
    .toLowerCase();
  if (!/^[0-9a-f]{64}$/.test(hex))
    throw new HeraldError('bad_option', '--ca-sha256 must be 64 hex digits (colons allowed): the SHA-256 of ca.crt');
  return hex;
}

/** When a certificate valid from `notBeforeMs` to `notAfterMs` is renewed (epoch ms). */
export function renewAtMs(notBeforeMs: number, notAfterMs: number): number {
  return notBeforeMs + (notAfterMs - notBeforeMs) * RENEWAL_AT_FRACTION;
}

/** From when an agent whose renewal has not succeeded warns (epoch ms). */
export function renewalWarnAtMs(notBeforeMs: number, notAfterMs: number): number {
  return notBeforeMs + (notAfterMs - notBeforeMs) * RENEWAL_WARN_FRACTION;
}

/** The renewal state of a certificate at `nowMs`. */
export function renewalState(notBeforeMs: number, notAfterMs: number, nowMs: number): NodeCertificateView['renewal'] {
  if (nowMs > notAfterMs) return 'expired';
  if (nowMs >= renewalWarnAtMs(notBeforeMs, notAfterMs)) return 'overdue';
  if (nowMs >= renewAtMs(notBeforeMs, notAfterMs)) return 'due';
  return 'ok';
}
