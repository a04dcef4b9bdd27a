/**
 * The frames of the push connection besides the wake-up itself (SPEC §2):
 * - the agent's answers to wake-up frames: one JSON text frame per frame received;
 * - a fetch over the push connection: the agent asks for its metadata on the connection the
 *   wake-up came on (`fetch`), and the controller answers with a `metadata` frame that carries
 *   exactly what the HTTPS route would (status, ETag, Herald-Signature, body). The metadata is
 *   signed end to end, so the agent checks it as it checks an HTTPS answer (protocol/metadata.ts).
 *   A controller offers this by sending `Herald-Features: fetch` on its upgrade request.
 */
import { RefusalError, type ErrorCode } from './errors.js';
import { MAX_WAKE_FRAME_BYTES } from './limits.js';
import { isValidNonce } from './metadata.js';

/** The upgrade request header in which the controller names what its push connection offers. */
export const FEATURES_HEADER = 'herald-features';
/** The feature: the controller answers `fetch` frames on this connection. */
export const FEATURE_FETCH = 'fetch';

/** Whether a `Herald-Features` header value offers `feature` (a comma-separated list). */
export function offersFeature(header: string | string[] | undefined, feature: string): boolean {
  if (header === undefined) return false;
  const all = Array.isArray(header) ? header.join(',') : header;
  return all.split(',').some((f) => f.trim().toLowerCase() === feature);
}

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

/** Agent → controller: "send me my metadata", the HTTPS fetch's request on the push connection. */
export interface FetchFrame {
  type: 'fetch';
  /** The request's nonce (as `Herald-Nonce`); the answer names it and its signature covers it. */
  nonce: string;
  /** As `If-None-Match`: the ETag of the document the agent holds. */
  if_none_match?: string;
}
/** Every frame an agent may send on the push connection. */
export type AgentFrame = AnswerFrame | FetchFrame;

/** The longest ETag a fetch frame or metadata frame may carry. */
const MAX_ETAG_CHARS = 200;
/** The longest Herald-Signature a metadata frame may carry (a compact JWS of a few claims). */
const MAX_SIGNATURE_CHARS = 2_048;

/**
 * Controller → agent: the answer to a fetch frame. On the wire a JSON head, a newline, then the
 * body's exact bytes (a 200 only; the signed `sha256` covers exactly them). A head never holds a
 * raw newline (JSON.stringify escapes it), so the first newline ends it.
 */
export interface MetadataFrameHead {
  type: 'metadata';
  nonce: string;
  /** The HTTP status the route would have answered: 200, 304, or an error's. */
  status: number;
  etag?: string;
  signature?: string;
  /** An error's code (any status but 200 and 304). */
  error?: string;
  /** A 429's Retry-After, in seconds. */
  retry_after_s?: number;
}
export interface MetadataFrame {
  head: MetadataFrameHead;
  body: Buffer;
}

export function isNackCode(x: unknown): x is NackCode {
  return (NACK_CODES as readonly unknown[]).includes(x);
}

export function encodeAck(jti: string, gen: number, fetch: FetchState): string {
  return JSON.stringify({ type: 'ack', jti, gen, fetch } satisfies AckFrame);
}

export function encodeNack(jti: string | null, error: NackCode): string {
  return JSON.stringify({ type: 'nack', jti, error } satisfies NackFrame);
}

export function encodeFetch(nonce: string, ifNoneMatch?: string): string {
  const f: FetchFrame = { type: 'fetch', nonce };
  if (ifNoneMatch !== undefined) f.if_none_match = ifNoneMatch;
  return JSON.stringify(f);
}

/** One metadata frame: the head, a newline, the body (a 200's; empty otherwise). */
export function encodeMetadataFrame(head: MetadataFrameHead, body?: Uint8Array): Buffer {
  const h = Buffer.from(`${JSON.stringify(head)}\n`);
  return body === undefined || body.length === 0 ? h : Buffer.concat([h, body], h.length + body.length);
}

const NEWLINE = 0x0a;

/**
 * Decodes a metadata frame (agent side). Its size was bounded by the WebSocket layer; the head
 * must fit in MAX_WAKE_FRAME_BYTES.
 * @throws RefusalError malformed
 */
export function decodeMetadataFrame(buf: Buffer): MetadataFrame {
  const end = buf.indexOf(NEWLINE);
  if (end < 0 || end > MAX_WAKE_FRAME_BYTES) throw new RefusalError('malformed', 'metadata frame has no head line');
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(buf.toString('utf8', 0, end)) as Record<string, unknown>;
  } catch {
    throw new RefusalError('malformed', 'metadata frame head is not JSON');
  }
  if (typeof v !== 'object' || v === null || v.type !== 'metadata')
    throw new RefusalError('malformed', 'not a metadata frame');
  const { nonce, status, etag, signature, error, retry_after_s: retry } = v;
  if (!isValidNonce(nonce)) throw new RefusalError('malformed', 'metadata frame nonce');
  if (!Number.isInteger(status) || (status as number) < 200 || (status as number) > 599)
    throw new RefusalError('malformed', 'metadata frame status');
  if (etag !== undefined && (typeof etag !== 'string' || etag.length > MAX_ETAG_CHARS))
    throw new RefusalError('malformed', 'metadata frame etag');
  if (signature !== undefined && (typeof signature !== 'string' || signature.length > MAX_SIGNATURE_CHARS))
    throw new RefusalError('malformed', 'metadata frame signature');
  if (error !== undefined && (typeof error !== 'string' || error.length > 64))
    throw new RefusalError('malformed', 'metadata frame error');
  if (retry !== undefined && !(typeof retry === 'number' && retry >= 0 && retry <= 3600))
    throw new RefusalError('malformed', 'metadata frame retry_after_s');
  const body = buf.subarray(end + 1);
  if (status !== 200 && body.length > 0) throw new RefusalError('malformed', `a ${status} metadata frame with a body`);
  const head: MetadataFrameHead = { type: 'metadata', nonce, status: status as number };
  if (etag !== undefined) head.etag = etag as string;
  if (signature !== undefined) head.signature = signature as string;
  if (error !== undefined) head.error = error as string;
  if (retry !== undefined) head.retry_after_s = retry as number;
  return { head, body };
}

/**
 * Decodes an answer frame (controller side).
 * @throws RefusalError malformed | too_large
 */
export function decodeAnswer(data: string): AnswerFrame {
  const f = decodeAgentFrame(data);
  if (f.type === 'fetch') throw new RefusalError('malformed', 'a fetch frame where an answer was expected');
  return f;
}

/**
 * Decodes any frame an agent sends on the push connection (controller side).
 * @throws RefusalError malformed | too_large
 */
export function decodeAgentFrame(data: string): AgentFrame {
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
  if (v.type === 'fetch') {
    if (!isValidNonce(v.nonce)) throw new RefusalError('malformed', 'fetch needs a nonce');
    const inm = v.if_none_match;
    if (inm !== undefined && (typeof inm !== 'string' || inm.length > MAX_ETAG_CHARS))
      throw new RefusalError('malformed', 'fetch if_none_match');
    return inm === undefined
      ? { type: 'fetch', nonce: v.nonce }
      : { type: 'fetch', nonce: v.nonce, if_none_match: inm };
  }
  throw new RefusalError('malformed', 'frame type is neither ack, nack nor fetch');
}

/** @throws RefusalError too_large when `bytes` is over the wake-up frame limit */
export function checkFrameSize(bytes: number, max: number = MAX_WAKE_FRAME_BYTES): void {
  if (bytes > max) throw new RefusalError('too_large');
}
