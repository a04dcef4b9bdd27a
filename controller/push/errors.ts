/**
 * Why a push connection failed, as the stable codes shown in a node's push state
 * (`last_error`) and in `herald_push_dial_failures_total{code}`. TLS identity refusals reuse the
 * protocol's codes (`wrong_peer`, `revoked`, `untrusted_certificate`, ...); a 403 from the agent
 * listener carries its own code (docs/protocol.md), which is kept as is.
 */
import { codeOf, ERROR_CODES, isErrorCode, type ErrorCode } from '../../protocol/errors.js';
import { tlsCodeOf } from '../../certs/tls-codes.js';
import { NET_ERROR_CODES } from '../../protocol/net-codes.js';

const PUSH_FAILURE_CODE_LIST = [
  'connection_refused',
  'connection_reset',
  'connection_closed',
  'dial_timeout',
  'unreachable',
  'tls_error',
  'upgrade_refused',
  'half_open',
  'protocol_error',
] as const satisfies readonly ErrorCode[];

/** The dialer's own failure codes, with their documented meanings (protocol/errors.ts). */
export const PUSH_FAILURE_CODES = Object.fromEntries(PUSH_FAILURE_CODE_LIST.map((c) => [c, ERROR_CODES[c]])) as {
  [K in (typeof PUSH_FAILURE_CODE_LIST)[number]]: string;
};

export type PushFailureCode = keyof typeof PUSH_FAILURE_CODES;
export type PushErrorCode = PushFailureCode | ErrorCode;

const NET_CODES: Readonly<Record<string, PushFailureCode>> = NET_ERROR_CODES;

/**
 * The code of a dial or connection error (never throws): Herald's own, a network code, the TLS
 * mapping of certs/tls-codes.ts, else `tls_error` (any other `ERR_SSL_*` included).
 */
export function pushCodeOf(err: unknown): PushErrorCode {
  const herald = codeOf(err);
  if (herald !== undefined) return herald;
  const code = (err as { code?: unknown })?.code;
  if (typeof code === 'string') {
    if (isErrorCode(code)) return code; // e.g. a checkServerIdentity error that kept its code
    const net = NET_CODES[code];
    if (net !== undefined) return net;
    const tls = tlsCodeOf(code);
    if (tls !== undefined) return tls;
  }
  const msg = err instanceof Error ? err.message : '';
  if (/socket hang up/i.test(msg)) return 'connection_reset';
  if (/Unexpected server response/i.test(msg)) return 'upgrade_refused';
  return 'tls_error';
}
