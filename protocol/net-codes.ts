/**
 * THE mapping from the codes Node puts on a socket error (`err.code`) to Herald's codes, for
 * every client that reports why a connection failed: the push dialer (controller/push/errors.ts)
 * and `herald agent enroll` (agent/enroll.ts). Pure: codes in, codes out.
 */
import type { ErrorCode } from './errors.js';

export type NetFailureCode = 'connection_refused' | 'connection_reset' | 'dial_timeout' | 'unreachable';

export const NET_ERROR_CODES: Readonly<Record<string, NetFailureCode & ErrorCode>> = {
  ECONNREFUSED: 'connection_refused',
  ECONNRESET: 'connection_reset',
  EPIPE: 'connection_reset',
  ETIMEDOUT: 'dial_timeout',
  EHOSTUNREACH: 'unreachable',
  ENETUNREACH: 'unreachable',
  EHOSTDOWN: 'unreachable',
  ENOTFOUND: 'unreachable',
  EAI_AGAIN: 'unreachable',
};

/**
 * The Herald code of a socket error (a closed connection without a code, Node's "socket hang
 * up", is `connection_reset`), or undefined when `err` is not one.
 */
export function netCodeOf(err: unknown): NetFailureCode | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && Object.hasOwn(NET_ERROR_CODES, code)) return NET_ERROR_CODES[code];
  if (err instanceof Error && /socket hang up/i.test(err.message)) return 'connection_reset';
  return undefined;
}
