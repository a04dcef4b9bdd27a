import { describe, expect, it } from 'vitest';
import { tlsCodeOf } from '../../certs/tls-codes.js';
import { refusalCodeOf } from '../../certs/tls.js';
import { pushCodeOf } from '../../controller/push/errors.js';
import { RefusalError } from '../../protocol/errors.js';

/** Every OpenSSL / Node TLS code Herald names, and the Herald code it maps to (undefined: none). */
const TABLE: Array<[string, string | undefined]> = [
  // X509 verification results (X509_V_ERR_*, as Node spells them)
  ['CERT_HAS_EXPIRED', 'certificate_expired'],
  ['CERT_NOT_YET_VALID', 'certificate_expired'],
  ['UNABLE_TO_GET_ISSUER_CERT', 'untrusted_certificate'],
  ['UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'untrusted_certificate'],
  ['UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'untrusted_certificate'],
  ['UNABLE_TO_DECRYPT_CERT_SIGNATURE', 'untrusted_certificate'],
  ['UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY', 'untrusted_certificate'],
  ['UNABLE_TO_GET_CRL', 'untrusted_certificate'],
  ['CERT_SIGNATURE_FAILURE', 'untrusted_certificate'],
  ['DEPTH_ZERO_SELF_SIGNED_CERT', 'untrusted_certificate'],
  ['SELF_SIGNED_CERT_IN_CHAIN', 'untrusted_certificate'],
  ['CERT_CHAIN_TOO_LONG', 'untrusted_certificate'],
  ['PATH_LENGTH_EXCEEDED', 'untrusted_certificate'],
  ['INVALID_CA', 'untrusted_certificate'],
  ['INVALID_PURPOSE', 'untrusted_certificate'],
  ['CERT_UNTRUSTED', 'untrusted_certificate'],
  ['CERT_REJECTED', 'untrusted_certificate'],
  ['ERROR_IN_CERT_NOT_BEFORE_FIELD', 'untrusted_certificate'],
  ['ERROR_IN_CERT_NOT_AFTER_FIELD', 'untrusted_certificate'],
  ['HOSTNAME_MISMATCH', 'untrusted_certificate'],
  ['CERT_REVOKED', 'revoked'],
  // Node's own certificate check
  ['ERR_TLS_CERT_ALTNAME_INVALID', 'untrusted_certificate'],
  // OpenSSL handshake errors about the protocol version
  ['ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION', 'tls_version'],
  ['ERR_SSL_UNSUPPORTED_PROTOCOL', 'tls_version'],
  ['ERR_SSL_NO_PROTOCOLS_AVAILABLE', 'tls_version'],
  ['ERR_SSL_WRONG_VERSION_NUMBER', 'tls_version'],
  // handshake failures Herald has no specific name for: each caller picks its fallback
  ['ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE', undefined],
  ['ERR_SSL_TLSV1_ALERT_UNKNOWN_CA', undefined],
  ['ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE', undefined],
  ['ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED', undefined],
  ['ERR_SSL_PACKET_LENGTH_TOO_LONG', undefined],
  ['ERR_SSL_HTTP_REQUEST', undefined],
  ['ERR_TLS_HANDSHAKE_TIMEOUT', undefined],
  ['ECONNRESET', undefined],
  ['ECONNREFUSED', undefined],
];

const err = (code: string): Error => Object.assign(new Error(code), { code });

describe('the one OpenSSL → Herald code mapping', () => {
  it.each(TABLE)('%s → %s', (openssl, herald) => {
    expect(tlsCodeOf(openssl)).toBe(herald);
  });

  it('refusalCodeOf (listeners, fetcher) answers the table, keeping a Herald error its code', () => {
    for (const [openssl, herald] of TABLE) expect(refusalCodeOf(err(openssl))).toBe(herald);
    expect(refusalCodeOf(new RefusalError('wrong_peer', 'x'))).toBe('wrong_peer');
  });

  it('the push dialer (controller/push/errors.ts) answers the table too, else its network codes, else tls_error', () => {
    for (const [openssl, herald] of TABLE) {
      if (herald !== undefined) expect(pushCodeOf(err(openssl))).toBe(herald);
    }
    expect(pushCodeOf(err('ECONNRESET'))).toBe('connection_reset');
    expect(pushCodeOf(err('ECONNREFUSED'))).toBe('connection_refused');
    expect(pushCodeOf(err('ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE'))).toBe('tls_error');
    expect(pushCodeOf(err('ERR_TLS_HANDSHAKE_TIMEOUT'))).toBe('tls_error');
  });
});
