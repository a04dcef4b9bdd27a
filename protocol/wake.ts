/**
 * Wake-ups (docs/protocol.md): the controller signs one small token per push; the agent verifies it
 * completely before it does anything, cheapest checks first.
 */
import { RefusalError } from './errors.js';
import { checkKeyIssuer, type KeySet, type Signer, verifyCompact, WAKE_TYP } from './jws.js';
import { CLOCK_SKEW_S, MAX_WAKE_FRAME_BYTES, MAX_WAKE_LIFETIME_S, WAKE_LIFETIME_S } from './limits.js';
import { randomToken128 } from './random-token.js';
import { ReplayCache } from './replay-cache.js';

export const WAKE_REASONS = ['deployment', 'restart', 'ping'] as const;
export type WakeReason = (typeof WAKE_REASONS)[number];

export interface WakeClaims {
  iss: string;
  aud: string;
  iat: number;
  exp: number;
  jti: string;
  gen: number;
  reason: WakeReason;
}

const JTI_RE = /^[A-Za-z0-9_-]{22,64}$/;

/** A fresh 128-bit random `jti`, base64url. */
export function newJti(): string {
  return randomToken128();
}

export interface SignWakeInput {
  iss: string;
  aud: string;
  gen: number;
  reason: WakeReason;
  nowS: number;
  lifetimeS?: number;
  jti?: string;
}

/** Signs a wake-up (controller side). */
export function signWake(signer: Signer, w: SignWakeInput): string {
  const iat = Math.floor(w.nowS);
  const claims: WakeClaims = {
    iss: w.iss,
    aud: w.aud,
    iat,
    exp: iat + (w.lifetimeS ?? WAKE_LIFETIME_S),
    jti: w.jti ?? newJti(),
    gen: w.gen,
    reason: w.reason,
  };
  return signer.sign(WAKE_TYP, claims);
}

export interface WakeVerifierOptions {
  /** The agent's own SPIFFE id: `aud` must equal it. */
  audience: string;
  /** The keys trusted now (called per token, so a reloaded JWKS takes effect at once). */
  keys: () => KeySet;
  /** When the agent started, in seconds: tokens issued before it minus the skew are refused. */
  startedAtS: number;
  /** Clock in seconds; injectable for tests. */
  nowS?: () => number;
  replayCache?: ReplayCache;
  skewS?: number;
  maxLifetimeS?: number;
  maxFrameBytes?: number;
}

/** Verifies wake-up frames (agent side). One instance per agent: it owns the replay cache. */
export class WakeVerifier {
  readonly replayCache: ReplayCache;
  readonly #o: Required<Omit<WakeVerifierOptions, 'replayCache'>>;

  constructor(opts: WakeVerifierOptions) {
    this.#o = {
      nowS: () => Date.now() / 1000,
      skewS: CLOCK_SKEW_S,
      maxLifetimeS: MAX_WAKE_LIFETIME_S,
      maxFrameBytes: MAX_WAKE_FRAME_BYTES,
      ...opts,
    };
    this.replayCache = opts.replayCache ?? new ReplayCache();
  }

  /** The agent's own SPIFFE id: the `aud` of every token signed for it. */
  get audience(): string {
    return this.#o.audience;
  }

  /** The signing keys the agent trusts now, for the other signed answers it takes. */
  keys(): KeySet {
    return this.#o.keys();
  }

  /**
   * Verifies one frame from the TLS peer `peerSpiffeId` and records its `jti`.
   * @throws RefusalError with one of the wake-up codes of docs/protocol.md
   */
  verify(frame: string, peerSpiffeId: string): WakeClaims {
    const o = this.#o;
    if (Buffer.byteLength(frame, 'utf8') > o.maxFrameBytes) throw new RefusalError('too_large');
    const keys = o.keys();
    const { kid, claims: c } = verifyCompact(frame, WAKE_TYP, keys);
    if (typeof c.gen !== 'number' || !Number.isSafeInteger(c.gen) || c.gen < 0) throw new RefusalError('bad_gen');
    if (typeof c.iss !== 'string' || typeof c.aud !== 'string' || typeof c.jti !== 'string' || !JTI_RE.test(c.jti)) {
      throw new RefusalError('bad_claims', 'iss, aud and jti must be strings; jti 128-bit base64url');
    }
    if (!Number.isSafeInteger(c.iat) || !Number.isSafeInteger(c.exp))
      throw new RefusalError('bad_claims', 'iat and exp must be integers');
    if (!(WAKE_REASONS as readonly unknown[]).includes(c.reason))
      throw new RefusalError('bad_claims', 'reason is not deployment, restart or ping');
    if (c.aud !== o.audience) throw new RefusalError('wrong_audience');
    if (c.iss !== peerSpiffeId) throw new RefusalError('wrong_issuer');
    checkKeyIssuer(keys, kid, c.iss);
    const iat = c.iat as number;
    const exp = c.exp as number;
    const now = o.nowS();
    if (exp - iat > o.maxLifetimeS || exp < iat) throw new RefusalError('lifetime_too_long');
    if (iat > now + o.skewS) throw new RefusalError('not_yet_valid');
    if (exp < now - o.skewS) throw new RefusalError('expired');
    if (iat < o.startedAtS - o.skewS) throw new RefusalError('issued_before_start');
    this.replayCache.use(c.jti, exp + o.skewS, now);
    return c as unknown as WakeClaims;
  }
}

/**
 * The `kid` in the header of a frame that `WakeVerifier.verify` accepted: the key it verified
 * with. Read from the header, so meaningful only for a verified frame.
 */
export function verifiedKid(frame: string): string {
  const h = JSON.parse(Buffer.from(frame.split('.')[0] ?? '', 'base64url').toString('utf8')) as { kid?: unknown };
  if (typeof h?.kid !== 'string') throw new RefusalError('malformed', 'the header names no kid');
  return h.kid;
}

/**
 * The `jti` of an unverified token, for correlating a nack only (never trusted for anything).
 */
export function peekJti(frame: string): string | null {
  if (frame.length > MAX_WAKE_FRAME_BYTES) return null;
  const p = frame.split('.')[1];
  if (!p) return null;
  try {
    const c = JSON.parse(Buffer.from(p, 'base64url').toString('utf8')) as { jti?: unknown };
    return typeof c?.jti === 'string' && JTI_RE.test(c.jti) ? c.jti : null;
  } catch {
    return null;
  }
}
