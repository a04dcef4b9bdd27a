/**
 * THE mapping from the codes OpenSSL and Node put on a TLS error (`err.code`, or a socket's
 * `authorizationError`) to Herald's codes. Every dialer and listener that reports why a TLS
 * connection failed asks here (certs/tls.ts `refusalCodeOf`, controller/push/errors.ts), so one
 * failure has one name everywhere. `test/certs/tls-codes.test.ts` lists every code in a table.
 */
import type { ErrorCode } from '../protocol/errors.js';

/** OpenSSL's certificate-verification results (X509_V_ERR_*, as Node names them) that mean "not now". */
const NOT_VALID_NOW = ['CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID'] as const;

/**
 * OpenSSL's verification results, and Node's own certificate checks, that mean "does not chain
 * to (or is not usable under) the CA we trust".
 */
const UNTRUSTED = [
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_DECRYPT_CERT_SIGNATURE',
  'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY',
  'CERT_SIGNATURE_FAILURE',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'CERT_CHAIN_TOO_LONG',
  'PATH_LENGTH_EXCEEDED',
  'INVALID_CA',
  'INVALID_PURPOSE',
  'CERT_UNTRUSTED',
  'CERT_REJECTED',
  'ERROR_IN_CERT_NOT_BEFORE_FIELD',
  'ERROR_IN_CERT_NOT_AFTER_FIELD',
  'HOSTNAME_MISMATCH',
  'ERR_TLS_CERT_ALTNAME_INVALID',
] as const;

const TABLE: ReadonlyMap<string, ErrorCode> = new Map<string, ErrorCode>([
  ...NOT_VALID_NOW.map((c) => [c, 'certificate_expired'] as const),
  ...UNTRUSTED.map((c) => [c, 'untrusted_certificate'] as const),
  ['CERT_REVOKED', 'revoked'],
]);

/**
 * The Herald code of an OpenSSL or Node TLS error code, or undefined when the code says nothing
 * Herald names (a reset, a generic handshake failure: the caller picks its own fallback).
 * - the verification results above: `certificate_expired`, `untrusted_certificate`, `revoked`
 *   (CRLs are not used, so the last comes only from a foreign peer);
 * - any other `UNABLE_TO_*`, `CERT_*` or `ERR_TLS_CERT_*`: `untrusted_certificate`;
 * - an `ERR_SSL_*` about the protocol version (`..._PROTOCOL_VERSION`, `UNSUPPORTED_PROTOCOL`,
 *   `NO_PROTOCOLS_AVAILABLE`, `WRONG_VERSION_NUMBER`): `tls_version`.
 */
export function tlsCodeOf(code: string): ErrorCode | undefined {
  const known = TABLE.get(code);
  if (known !== undefined) return known;
  if (/^(UNABLE_TO_|CERT_|ERR_TLS_CERT_)/.test(code)) return 'untrusted_certificate';
  if (code.startsWith('ERR_SSL_') && /VERSION|PROTOCOL/.test(code)) return 'tls_version';
  return undefined;
}
