/**
 * Signed metadata responses (docs/api.md). The body (built once per generation) is covered by its
 * SHA-256 in a small JWS signed per response, bound to the request's nonce, so a middlebox can
 * neither alter a body, replay an old response, nor forge a 304.
 */
import { createHash } from 'node:crypto';
import { RefusalError } from './errors.js';
import { checkKeyIssuer, type KeySet, METADATA_TYP, type Signer, verifyCompact } from './jws.js';
import type { MetadataDocument } from './heat.js';
import { randomToken128 } from './random-token.js';

export const NONCE_HEADER = 'herald-nonce';
export const SIGNATURE_HEADER = 'herald-signature';
const NONCE_RE = /^[A-Za-z0-9_-]{16,128}$/;

export interface MetadataClaims {
  iss: string;
  aud: string;
  gen: number;
  nonce?: string;
  sha256?: string;
  iat: number;
}

/** A fresh request nonce (128-bit, base64url). */
export function newNonce(): string {
  return randomToken128();
}

export function isValidNonce(x: unknown): x is string {
  return typeof x === 'string' && NONCE_RE.test(x);
}

/** base64url SHA-256 of the exact body bytes. */
export function sha256b64url(body: Uint8Array | string): string {
  return createHash('sha256').update(body).digest('base64url');
}

export interface SignMetadataInput {
  iss: string;
  aud: string;
  gen: number;
  /** The request's nonce; absent only when the request carried none (a person with curl). */
  nonce?: string | undefined;
  /** On a 200: the body's digest; absent on a 304. */
  sha256?: string | undefined;
  nowS: number;
}

export function signMetadata(signer: Signer, m: SignMetadataInput): string {
  const claims: MetadataClaims = { iss: m.iss, aud: m.aud, gen: m.gen, iat: Math.floor(m.nowS) };
  if (m.nonce !== undefined) claims.nonce = m.nonce;
  if (m.sha256 !== undefined) claims.sha256 = m.sha256;
  return signer.sign(METADATA_TYP, claims);
}

export interface VerifyMetadataInput {
  status: 200 | 304;
  /** The Herald-Signature header, if any. */
  signature: string | undefined;
  /** The exact body bytes (200 only). */
  body?: Buffer;
  /** The nonce this request sent. */
  nonce: string;
  /** The agent's own SPIFFE id. */
  audience: string;
  /** The SPIFFE id of the controller that answered (the API server's TLS identity): `iss` must be it, and the signing key its own. */
  issuer: string;
  keys: KeySet;
  /** The last generation applied: a lower one is a rollback. */
  lastAppliedGen?: number;
}

export interface VerifiedMetadata {
  gen: number;
  /** The parsed body, on a 200. */
  document?: MetadataDocument;
}

/**
 * Verifies a metadata response (agent side).
 * @throws RefusalError missing_signature | malformed | bad_algorithm | bad_header | missing_kid |
 *   unknown_kid | wrong_type | bad_signature | wrong_issuer | wrong_audience | nonce_mismatch |
 *   bad_gen | digest_mismatch | bad_response | rollback
 */
export function verifyMetadataResponse(v: VerifyMetadataInput): VerifiedMetadata {
  if (!v.signature) throw new RefusalError('missing_signature');
  const { kid, claims: c } = verifyCompact(v.signature, METADATA_TYP, v.keys);
  if (c.iss !== v.issuer) throw new RefusalError('wrong_issuer');
  checkKeyIssuer(v.keys, kid, c.iss);
  if (c.aud !== v.audience) throw new RefusalError('wrong_audience');
  if (c.nonce !== v.nonce) throw new RefusalError('nonce_mismatch');
  if (typeof c.gen !== 'number' || !Number.isSafeInteger(c.gen) || c.gen < 0) throw new RefusalError('bad_gen');
  const gen = c.gen;
  let document: MetadataDocument | undefined;
  if (v.status === 200) {
    if (v.body === undefined || typeof c.sha256 !== 'string' || c.sha256 !== sha256b64url(v.body)) {
      throw new RefusalError('digest_mismatch');
    }
    try {
      document = JSON.parse(v.body.toString('utf8')) as MetadataDocument;
    } catch {
      throw new RefusalError('bad_response', 'metadata body is not JSON');
    }
    if (
      typeof document !== 'object' ||
      document === null ||
      document.generation !== gen ||
      !Array.isArray(document.deployments)
    ) {
      throw new RefusalError('bad_response', 'metadata body does not match its signed generation');
    }
  } else if (c.sha256 !== undefined) {
    // a 200's signature pasted onto a 304 (or the reverse) is not what was signed for this answer
    throw new RefusalError('bad_response', 'a 304 signature must not carry a digest');
  }
  if (v.lastAppliedGen !== undefined && gen < v.lastAppliedGen)
    throw new RefusalError('rollback', `generation ${gen} is older than ${v.lastAppliedGen}`);
  return document === undefined ? { gen } : { gen, document };
}
