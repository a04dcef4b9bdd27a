/**
 * Swift's TempURLs as Herald's object store accepts them (docs/heat.md, "TempURLs"): the query
 * `temp_url_sig=<hex HMAC>&temp_url_expires=<epoch s>`, the HMAC over
 * `"<METHOD>\n<EXPIRES>\n<PATH>"` with the account's temp-url key. SHA-256 and SHA-512 are
 * accepted; SHA-1 is refused (`tempurl_sha1_refused`). A signature grants exactly its method and
 * its object, except that one for GET also grants HEAD (a node's collector HEADs, then GETs).
 * Prefix TempURLs (`temp_url_prefix`) and ISO 8601 expiries are refused. Pure.
 */
import crypto from 'node:crypto';

export type TempUrlRefusal = 'tempurl_invalid' | 'tempurl_expired' | 'tempurl_sha1_refused';

export interface TempUrlRequest {
  method: string;
  /** The decoded path, `/v1/AUTH_<project>/<container>/<object>`. */
  path: string;
  sig: string;
  expires: string;
  /** The query had `temp_url_prefix`. */
  prefix: boolean;
}

const DIGESTS: Record<number, 'sha256' | 'sha512'> = { 64: 'sha256', 128: 'sha512' };
const HEX = /^[0-9a-f]+$/;
const EPOCH_S = /^[0-9]{1,12}$/;

/** The HMAC Heat (python-swiftclient) signs with: hex SHA-256. */
export function signTempUrl(key: string, method: string, expires: number, path: string): string {
  return crypto.createHmac('sha256', key).update(`${method}\n${expires}\n${path}`).digest('hex');
}

/**
 * Whether `r` is signed with `key` and still valid at `nowS` (epoch seconds).
 * @returns null when it is, else the refusal's code
 */
export function checkTempUrl(r: TempUrlRequest, key: string | null, nowS: number): TempUrlRefusal | null {
  if (r.prefix || !EPOCH_S.test(r.expires)) return 'tempurl_invalid';
  const sig = r.sig.toLowerCase();
  if (sig.length === 40 && HEX.test(sig)) return 'tempurl_sha1_refused';
  const digest = DIGESTS[sig.length];
  if (!digest || !HEX.test(sig) || key === null) return 'tempurl_invalid';
  const methods = r.method === 'HEAD' ? ['GET', 'HEAD'] : [r.method];
  const given = Buffer.from(sig, 'hex');
  const ok = methods.some((m) =>
    crypto.timingSafeEqual(given, crypto.createHmac(digest, key).update(`${m}\n${r.expires}\n${r.path}`).digest()),
  );
  if (!ok) return 'tempurl_invalid';
  return Number(r.expires) > nowS ? null : 'tempurl_expired';
}
