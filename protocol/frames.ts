/**
 * The frames of the push connection besides the wake-up itself (docs/protocol.md):
 * - the agent's answers to wake-up frames: one JSON text frame per frame received;
 * - a fetch over the push connection: the agent asks for its metadata on the connection the
 *   wake-up came on (`fetch`), and the controller answers with a `metadata` frame that carries
 *   exactly what the HTTPS route would (status, ETag, Herald-Signature, body). The metadata is
 *   signed end to end, so the agent checks it as it checks an HTTPS answer (protocol/metadata.ts).
 *   A controller offers this by sending `Herald-Features: fetch` on its upgrade request.
 * - a signal over the push connection: the agent posts a deployment's result on the connection
 *   (`signal`: a JSON head, a newline, then the exact body the HTTPS signal route would take), and
 *   the controller answers with a `signalled` frame carrying the status that route would have
 *   answered, signed. Offered with `Herald-Features: signal`. The connection has proven the agent
 *   to be `agent/<node>`, so the node is the connection's, never the frame's. The agent sends a
 *   signal only on a connection that has proven to hold the signing key (agent/push-connections.ts).
 */
import { RefusalError, type ErrorCode } from './errors.js';
import { MAX_WAKE_FRAME_BYTES } from './limits.js';
import { isValidNonce } from './metadata.js';

/** The upgrade request header in which the controller names what its push connection offers. */
export const FEATURES_HEADER = 'herald-features';
/** The feature: the controller answers `fetch` frames on this connection. */
export const FEATURE_FETCH = 'fetch';
/** The feature: the controller answers `signal` frames on this connection. */
export const FEATURE_SIGNAL = 'signal';

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
/**
 * Agent → controller: a deployment's result, the HTTPS signal route's request on the push
 * connection. On the wire a JSON head (without `body`), a newline, then the body's exact bytes.
 */
export interface SignalFrame {
  type: 'signal';
  /** Names the request; the `signalled` frame that answers it repeats it. */
  nonce: string;
  /** The deployment whose result this is (as the route's `{deployment}`). */
  deployment: string;
  /** The signal route's JSON body, as bytes. */
  body: Buffer;
}
/** Every frame an agent may send on the push connection. */
export type AgentFrame = AnswerFrame | FetchFrame | SignalFrame;

/**
 * Controller → agent: the answer to a signal frame, the status the HTTPS route would have answered,
 * signed by the controller's signing key for exactly this request (protocol/signal-answer.ts).
 */
export interface SignalledFrame {
  type: 'signalled';
  nonce: string;
  status: number;
  /** An error's code (any status but 2xx). */
  error?: string;
  /** A 429's Retry-After, in seconds. */
  retry_after_s?: number;
  /** A compact JWS over all of the above, the signal's deployment, revision and body digest. */
  signature?: string;
}
/** Every frame that answers an agent's request on the push connection. */
export type ControllerAnswer = ({ type: 'metadata' } & MetadataFrame) | SignalledFrame;

/** The longest ETag a fetch frame or metadata frame may carry. */
const MAX_ETAG_CHARS = 200;
/** The longest deployment id a signal frame may name. */
const MAX_DEPLOYMENT_ID_CHARS = 200;
/** The longest error code an answer frame may carry. */
const MAX_ERROR_CODE_CHARS = 64;
/** The longest Retry-After an answer frame may carry, in seconds. */
const MAX_RETRY_AFTER_S = 3_600;
/** The longest signature a metadata or signalled frame may carry (a compact JWS of a few claims). */
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

/** One signal frame: the head, a newline, the body's exact bytes. */
export function encodeSignal(nonce: string, deployment: string, body: Uint8Array): Buffer {
  const h = Buffer.from(`${JSON.stringify({ type: 'signal', nonce, deployment })}\n`);
  return Buffer.concat([h, body], h.length + body.length);
}

export function encodeSignalled(f: Omit<SignalledFrame, 'type'>): string {
  return JSON.stringify({ type: 'signalled', ...f } satisfies SignalledFrame);
}

/** One metadata frame: the head, a newline, the body (a 200's; empty otherwise). */
export function encodeMetadataFrame(head: MetadataFrameHead, body?: Uint8Array): Buffer {
  const h = Buffer.from(`${JSON.stringify(head)}\n`);
  return body === undefined || body.length === 0 ? h : Buffer.concat([h, body], h.length + body.length);
}

const NEWLINE = 0x0a;

/**
 * Decodes a frame that answers one of the agent's requests (agent side): a `metadata` frame (a
 * head line, then a 200's body) or a `signalled` frame (a head line alone). Its size was bounded
 * by the WebSocket layer; the head must fit in MAX_WAKE_FRAME_BYTES.
 * @throws RefusalError malformed
 */
export function decodeControllerAnswer(buf: Buffer): ControllerAnswer {
  const newline = buf.indexOf(NEWLINE);
  // a signalled frame is its head alone; a metadata frame's head always ends in a newline
  const end = newline < 0 ? buf.length : newline;
  if (end > MAX_WAKE_FRAME_BYTES) throw new RefusalError('malformed', 'answer frame has no head line');
  let v: Record<string, unknown>;
  try {
    v = JSON.parse(buf.toString('utf8', 0, end)) as Record<string, unknown>;
  } catch {
    throw new RefusalError('malformed', 'answer frame head is not JSON');
  }
  if (typeof v !== 'object' || v === null || (v.type !== 'metadata' && v.type !== 'signalled'))
    throw new RefusalError('malformed', 'neither a metadata nor a signalled frame');
  const { nonce, status, error, retry_after_s: retry } = v;
  if (!isValidNonce(nonce)) throw new RefusalError('malformed', `${v.type} frame nonce`);
  if (!Number.isInteger(status) || (status as number) < 200 || (status as number) > 599)
    throw new RefusalError('malformed', `${v.type} frame status`);
  if (error !== undefined && (typeof error !== 'string' || error.length > MAX_ERROR_CODE_CHARS))
    throw new RefusalError('malformed', `${v.type} frame error`);
  if (retry !== undefined && !(typeof retry === 'number' && retry >= 0 && retry <= MAX_RETRY_AFTER_S))
    throw new RefusalError('malformed', `${v.type} frame retry_after_s`);
  const body = buf.subarray(Math.min(end + 1, buf.length));
  const { signature } = v;
  if (signature !== undefined && (typeof signature !== 'string' || signature.length > MAX_SIGNATURE_CHARS))
    throw new RefusalError('malformed', `${v.type} frame signature`);
  if (v.type === 'signalled') {
    if (body.length > 0) throw new RefusalError('malformed', 'a signalled frame with a body');
    const f: SignalledFrame = { type: 'signalled', nonce, status: status as number };
    if (error !== undefined) f.error = error as string;
    if (retry !== undefined) f.retry_after_s = retry as number;
    if (signature !== undefined) f.signature = signature as string;
    return f;
  }
  if (newline < 0) throw new RefusalError('malformed', 'metadata frame has no head line');
  const { etag } = v;
  if (etag !== undefined && (typeof etag !== 'string' || etag.length > MAX_ETAG_CHARS))
    throw new RefusalError('malformed', 'metadata frame etag');
  if (status !== 200 && body.length > 0) throw new RefusalError('malformed', `a ${status} metadata frame with a body`);
  const head: MetadataFrameHead = { type: 'metadata', nonce, status: status as number };
  if (etag !== undefined) head.etag = etag as string;
  if (signature !== undefined) head.signature = signature as string;
  if (error !== undefined) head.error = error as string;
  if (retry !== undefined) head.retry_after_s = retry as number;
  return { type: 'metadata', head, body };
}

/**
 * Decodes a metadata frame (agent side).
 * @throws RefusalError malformed (also for a signalled frame)
 */
export function decodeMetadataFrame(buf: Buffer): MetadataFrame {
  const a = decodeControllerAnswer(buf);
  if (a.type !== 'metadata') throw new RefusalError('malformed', 'not a metadata frame');
  return { head: a.head, body: a.body };
}

/**
 * Decodes an answer frame (controller side).
 * @throws RefusalError malformed | too_large
 */
export function decodeAnswer(data: string): AnswerFrame {
  const f = decodeAgentFrame(data);
  if (f.type === 'fetch' || f.type === 'signal')
    throw new RefusalError('malformed', `a ${f.type} frame where an answer was expected`);
  return f;
}

/**
 * Decodes any frame an agent sends on the push connection (controller side). A frame that is one
 * JSON value (of at most MAX_WAKE_FRAME_BYTES, whitespace and newlines anywhere) is that value;
 * otherwise it can only be a signal frame: a head line (JSON.stringify never writes a raw
 * newline), then the body. The head must fit in MAX_WAKE_FRAME_BYTES; the whole frame was bounded
 * by the WebSocket layer.
 * @throws RefusalError malformed | too_large
 */
export function decodeAgentFrame(data: string | Buffer): AgentFrame {
  let v: Record<string, unknown> | undefined;
  let body: Buffer | null = null;
  if (typeof data === 'string') {
    if (data.length > MAX_WAKE_FRAME_BYTES) throw new RefusalError('too_large');
    v = parseFrameJson(data);
  } else {
    if (data.length <= MAX_WAKE_FRAME_BYTES) {
      try {
        v = JSON.parse(data.toString('utf8')) as Record<string, unknown>;
      } catch {
        v = undefined; // two values: perhaps a signal's head and body
      }
    }
    if (v === undefined) {
      const newline = data.indexOf(NEWLINE);
      const end = newline < 0 ? data.length : newline;
      if (end > MAX_WAKE_FRAME_BYTES) throw new RefusalError('too_large');
      v = parseFrameJson(data.toString('utf8', 0, end));
      if (newline >= 0) body = data.subarray(newline + 1);
      if (v?.type !== 'signal') throw new RefusalError('malformed', 'neither one JSON value nor a signal frame');
    }
  }
  if (typeof v !== 'object' || v === null) throw new RefusalError('malformed', 'answer is not an object');
  if (v.type === 'signal') {
    if (body === null) throw new RefusalError('malformed', 'a signal frame needs a body after its head line');
    if (!isValidNonce(v.nonce)) throw new RefusalError('malformed', 'signal needs a nonce');
    const d = v.deployment;
    if (typeof d !== 'string' || d.length === 0 || d.length > MAX_DEPLOYMENT_ID_CHARS)
      throw new RefusalError('malformed', 'signal needs a deployment');
    return { type: 'signal', nonce: v.nonce, deployment: d, body };
  }
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
  throw new RefusalError('malformed', 'frame type is neither ack, nack, fetch nor signal');
}

/** @throws RefusalError malformed when `text` is not JSON */
function parseFrameJson(text: string): Record<string, unknown> {
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw new RefusalError('malformed', 'answer is not JSON');
  }
}

/** @throws RefusalError too_large when `bytes` is over the wake-up frame limit */
export function checkFrameSize(bytes: number, max: number = MAX_WAKE_FRAME_BYTES): void {
  if (bytes > max) throw new RefusalError('too_large');
}
