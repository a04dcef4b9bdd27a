/**
 * The agent's answers to wake-up frames (SPEC §2): one JSON text frame per frame received.
 */
import { RefusalError, type ErrorCode } from './errors.js';
import { MAX_WAKE_FRAME_BYTES } from './limits.js';

/** The codes a nack may carry. */
export const NACK_CODES = [
  'malformed',
  'too_large',
  'binary_frame',
  'bad_algorithm',
  'bad_header',
  'missing_kid',
  'unknown_kid',
  'wrong_type',
  'bad_signature',
  'expired',
  'not_yet_valid',
  'lifetime_too_long',
  'issued_before_start',
  'wrong_audience',
  'wrong_issuer',
  'replayed',
  'replay_cache_full',
  'bad_gen',
  'bad_claims',
] as const satisfies readonly ErrorCode[];
export type NackCode = (typeof NACK_CODES)[number];

export type FetchState = 'started' | 'queued' | 'current';

export interface AckFrame {
  type: 'ack';
  jti: string;
  /** The last generation the agent fetched. */
  gen: number;
  fetch: FetchState;
}
export interface NackFrame {
  type: 'nack';
  jti: string | null;
  error: NackCode;
}
export type AnswerFrame = AckFrame | NackFrame;

export function isNackCode(x: unknown): x is NackCode {
  return (NACK_CODES as readonly unknown[]).includes(x);
}

export function encodeAck(jti: string, gen: number, fetch: FetchState): string {
  return JSON.stringify({ type: 'ack', jti, gen, fetch } satisfies AckFrame);
}

export function encodeNack(jti: string | null, error: NackCode): string {
  return JSON.stringify({ type: 'nack', jti, error } satisfies NackFrame);
}

/**
 * Decodes an answer frame (controller side).
 * @throws RefusalError malformed | too_large
 */
export function decodeAnswer(data: string): AnswerFrame {
  if (data.length > MAX_WAKE_FRAME_BYTES) throw new RefusalError('too_large');
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(data) as Record<string, unknown>;
  } catch {
    throw new RefusalError('malformed', 'answer is not JSON');
  }
  if (typeof v !== 'object' || v === null) throw new RefusalError('malformed', 'answer is not an object');
  if (v.type === 'ack') {
    if (
      typeof v.jti !== 'string' ||
      !Number.isSafeInteger(v.gen) ||
      (v.gen as number) < 0 ||
      !['started', 'queued', 'current'].includes(v.fetch as string)
    ) {
      throw new RefusalError('malformed', 'ack needs jti, gen and fetch');
    }
    return { type: 'ack', jti: v.jti, gen: v.gen as number, fetch: v.fetch as FetchState };
  }
  if (v.type === 'nack') {
    if ((v.jti !== null && typeof v.jti !== 'string') || !isNackCode(v.error))
      throw new RefusalError('malformed', 'nack needs jti and a known error');
    return { type: 'nack', jti: v.jti as string | null, error: v.error };
  }
  throw new RefusalError('malformed', 'answer type is neither ack nor nack');
}

/** @throws RefusalError too_large when `bytes` is over the wake-up frame limit */
export function checkFrameSize(bytes: number, max: number = MAX_WAKE_FRAME_BYTES): void {
  if (bytes > max) throw new RefusalError('too_large');
}
