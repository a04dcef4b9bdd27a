/**
 * Signed answers to signals over the push connection (docs/protocol.md, "Signals over the push
 * connection"). A `signalled` frame decides what the agent does with a result: a 2xx, 404, 409,
 * 400, 413 or 422 removes it from the outbox for good. So, like a metadata answer, it is signed
 * with the controller's signing key, per answer, and bound to the request it answers: the agent's
 * fresh nonce, the deployment, the revision and the SHA-256 of the exact body the agent sent. A
 * peer that holds a controller's TLS key but not its signing key cannot make a result count as
 * delivered or refused; an answer that fails these checks sends the signal over HTTPS.
 */
import { RefusalError } from './errors.js';
import { checkKeyIssuer, type KeySet, SIGNALLED_TYP, type Signer, verifyCompact } from './jws.js';
import { sha256b64url } from './metadata.js';

export interface SignalledClaims {
  iss: string;
  aud: string;
  nonce: string;
  deployment: string;
  /** The signal body's `revision`; null when the body carried none the controller could read. */
  revision: number | null;
  /** base64url SHA-256 of the exact signal body the controller received. */
  sha256: string;
  status: number;
  error?: string;
  retry_after_s?: number;
  iat: number;
}

export interface SignSignalledInput {
  /** The controller's SPIFFE id. */
  iss: string;
  /** The agent's SPIFFE id (the push connection's verified peer). */
  aud: string;
  nonce: string;
  deployment: string;
  /** The signal frame's body, exactly as received. */
  body: Uint8Array;
  status: number;
  error?: string | undefined;
  retryAfterS?: number | undefined;
  nowS: number;
}

/** Signs the answer to one signal (controller side); the `signature` member of its `signalled` frame. */
export function signSignalled(signer: Signer, s: SignSignalledInput): string {
  const claims: SignalledClaims = {
    iss: s.iss,
    aud: s.aud,
    nonce: s.nonce,
    deployment: s.deployment,
    revision: revisionOf(s.body),
    sha256: sha256b64url(s.body),
    status: s.status,
    iat: Math.floor(s.nowS),
  };
  if (s.error !== undefined) claims.error = s.error;
  if (s.retryAfterS !== undefined) claims.retry_after_s = s.retryAfterS;
  return signer.sign(SIGNALLED_TYP, claims);
}

/** A signal body's `revision`, or null when it is not a JSON object with an integer one. */
export function revisionOf(body: Uint8Array): number | null {
  try {
    const r = (
      JSON.parse(Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8')) as {
        revision?: unknown;
      }
    )?.revision;
    return Number.isSafeInteger(r) ? (r as number) : null;
  } catch {
    return null;
  }
}

export interface VerifySignalledInput {
  /** The frame's `signature`, if any. */
  signature: string | undefined;
  /** What the frame says, which must be what was signed. */
  status: number;
  error: string | undefined;
  retryAfterS: number | undefined;
  /** The request it answers, as the agent sent it. */
  nonce: string;
  deployment: string;
  revision: number;
  body: Uint8Array;
  /** The agent's own SPIFFE id. */
  audience: string;
  /** The SPIFFE id of the push connection's controller: `iss` must be it, and the key its own. */
  issuer: string;
  keys: KeySet;
}

/**
 * Verifies the answer to a signal (agent side): signed by a trusted key of the connection's
 * controller, for this agent, this request and exactly what the frame says.
 * @throws RefusalError missing_signature | malformed | bad_algorithm | bad_header | missing_kid |
 *   unknown_kid | wrong_type | bad_signature | wrong_issuer | wrong_audience | nonce_mismatch |
 *   digest_mismatch | bad_response
 */
export function verifySignalled(v: VerifySignalledInput): void {
  if (!v.signature) throw new RefusalError('missing_signature', 'a signalled frame without a signature');
  const { kid, claims: c } = verifyCompact(v.signature, SIGNALLED_TYP, v.keys);
  if (c.iss !== v.issuer) throw new RefusalError('wrong_issuer');
  checkKeyIssuer(v.keys, kid, c.iss);
  if (c.aud !== v.audience) throw new RefusalError('wrong_audience');
  if (c.nonce !== v.nonce) throw new RefusalError('nonce_mismatch');
  if (c.sha256 !== sha256b64url(v.body)) throw new RefusalError('digest_mismatch', 'signed for another signal body');
  if (c.deployment !== v.deployment || c.revision !== v.revision)
    throw new RefusalError('bad_response', 'signed for another deployment or revision');
  if (c.status !== v.status || c.error !== v.error || c.retry_after_s !== v.retryAfterS)
    throw new RefusalError('bad_response', 'the frame says another status than the signed one');
}
