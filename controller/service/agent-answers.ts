/**
 * The answers to an agent's two requests, the fetch of its metadata and the signal of a result,
 * whichever way they come (docs/architecture.md, "Scale"): over HTTPS, where the API
 * (controller/api/server.ts) reads the request, checks the caller and writes this answer in HTTP,
 * or as a frame on the agent's push connection, handed over by the push dialer in this process
 * or from a worker (controller/push/pool.ts) and answered here whole. One home, so an agent gets
 * the same answer for the same node state either way: the same status, ETag and body, the body
 * built once per generation (service.ts `metadata`), a metadata signature per answer.
 *
 * The answer to a signal frame is signed where the frame came in (the dialer's `signalled`
 * frame, protocol/signal-answer.ts): that signature binds the frame's nonce, which only the
 * connection holds, and leaves the signing to the push workers.
 */
import type { Logger } from 'pino';
import { codeOf, HeraldError, type ErrorCode } from '../../protocol/errors.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import type { Signer } from '../../protocol/jws.js';
import { MAX_SIGNAL_BODY_BYTES, STORE_UNAVAILABLE_RETRY_AFTER_S } from '../../protocol/limits.js';
import { isValidNonce, signMetadata } from '../../protocol/metadata.js';
import { statusOf } from '../error-status.js';
import type { ControllerMetrics } from '../metrics.js';
import type { PushFetchRequest, PushReply, PushRequest, PushSignalRequest } from '../push/types.js';
import { RefusalLog } from '../refusal-log.js';
import type { KnownGenerations } from '../model/records.js';
import type { ControllerService } from './service.js';

/** The signal route; a signal over the push connection stands for it (in logs too). */
export const SIGNAL_ROUTE = '/v1/nodes/:node/deployments/:deployment/signal';

/** A per-identity token bucket (controller/api/rate-limit.ts `RateLimiter`). */
export interface RateGate {
  take(key: string): { ok: true } | { ok: false; retryAfterS: number };
}

/** The answer to a metadata fetch: 304 (the agent holds `etag`) or 200 with the document. */
export type MetadataReply =
  | { status: 304; etag: string; signature: string }
  | {
      status: 200;
      /** The generation, quoted. */
      etag: string;
      /** The compact JWS of the answer (protocol/metadata.ts): for this agent, this nonce, this body. */
      signature: string;
      /** The exact bytes the signature's `sha256` covers. */
      body: Buffer;
    };

/** How a fetch came, for the metrics. */
export type FetchChannel = 'https' | 'push';

export interface AgentAnswersOptions {
  service: ControllerService;
  /** The current metadata signing key (a function, so a rotated key is taken at once). */
  signer: () => Signer;
  /** This controller's SPIFFE id: the `iss` of every metadata answer. */
  issuer: string;
  /** The trust domain of the agents' identities (a push frame's node is `agent/<node>` in it). */
  trustDomain: string;
  /**
   * The routes' rate limits, the buckets the API takes from too: an agent's fetches and signals
   * count against one budget whichever way they come.
   */
  limits: { fetch: RateGate; signal: RateGate };
  metrics: ControllerMetrics;
  logger: Logger;
  now?: () => number;
  /** The signal body limit in bytes (default MAX_SIGNAL_BODY_BYTES; tests lower it). */
  signalBodyBytes?: number;
}

export class AgentAnswers {
  readonly #o: AgentAnswersOptions;
  readonly #now: () => number;
  readonly #signalBodyBytes: number;
  readonly #refusals: RefusalLog;

  constructor(o: AgentAnswersOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
    this.#signalBodyBytes = o.signalBodyBytes ?? MAX_SIGNAL_BODY_BYTES;
    this.#refusals = new RefusalLog(o.logger, this.#now);
  }

  /**
   * The metadata answer for `node`'s agent (`audience`, its SPIFFE id): 304 when `ifNoneMatch`
   * names the current generation, else 200 with the body built once per generation and kept for
   * the 2,000 asked for last; a signature per answer; the fetch recorded (the agent holds that
   * generation) and counted by channel. Who asks and the rate limit are checked before.
   * @throws HeraldError node_deleted | not_found, and the store's errors
   */
  async metadata(
    node: string,
    audience: string,
    nonce: string | undefined,
    ifNoneMatch: string | string[] | undefined,
    channel: FetchChannel,
  ): Promise<MetadataReply> {
    const { service } = this.#o;
    const { generation, built } = await service.metadata(node, heldGenerations(ifNoneMatch));
    const signature = signMetadata(this.#o.signer(), {
      iss: this.#o.issuer,
      aud: audience,
      gen: generation,
      nonce,
      sha256: built?.sha256,
      nowS: this.#now() / 1000,
    });
    service.recordFetch(node, generation);
    this.#o.metrics.fetches.inc({ status: built === null ? '304' : '200', channel });
    const etag = etagOf(generation);
    return built === null ? { status: 304, etag, signature } : { status: 200, etag, signature, body: built.body };
  }

  /**
   * Records `node`'s result for its deployment (the body as read, unchecked) and answers the
   * route's small summary; `who` is the caller's SPIFFE id, for the audit log.
   * @throws HeraldError invalid_request | not_found | stale_revision | unknown_revision, and the
   *   store's errors
   */
  signal(node: string, deploymentId: string, body: unknown, who: string): Promise<Record<string, unknown>> {
    return this.#o.service.signal(node, deploymentId, body, who);
  }

  /**
   * An agent's request on its push connection (docs/protocol.md), answered as its HTTPS route
   * would be. The push connection has already proven the agent to be `agent/<node>` (the dialer
   * checked the listener's certificate), so only the rate limit and the route itself remain.
   * Never rejects: an error becomes its status and code.
   */
  answerPush(r: PushRequest): Promise<PushReply> {
    return r.kind === 'fetch' ? this.answerPushFetch(r) : this.answerPushSignal(r);
  }

  /**
   * A fetch frame, as `GET /v1/nodes/{node}/metadata`: the route's rate limit, except for a fetch
   * that answers a wake-up sent lately (`wokeRecently`, docs/api.md), then `metadata`.
   */
  async answerPushFetch(r: PushFetchRequest): Promise<PushReply> {
    const { service, metrics } = this.#o;
    const audience = spiffeIdOf(this.#o.trustDomain, 'agent', r.node);
    try {
      if (!isValidNonce(r.nonce)) throw new HeraldError('invalid_request', 'the fetch frame nonce');
      if (!service.wokeRecently(r.node)) {
        const decision = this.#o.limits.fetch.take(audience);
        if (!decision.ok) {
          metrics.fetches.inc({ status: '429', channel: 'push' });
          return { status: 429, error: 'rate_limited', retryAfterS: decision.retryAfterS };
        }
      }
      return await this.metadata(r.node, audience, r.nonce, r.ifNoneMatch ?? undefined, 'push');
    } catch (err) {
      const code = codeOf(err);
      if (code === undefined || code === 'internal') {
        this.#o.logger.error({ err, node: r.node }, 'answering a fetch over the push connection failed');
        metrics.fetches.inc({ status: '500', channel: 'push' });
        return { status: 500, error: 'internal' };
      }
      const status = statusOf(code);
      metrics.fetches.inc({ status: String(status), channel: 'push' });
      return { status, error: code };
    }
  }

  /**
   * A signal frame, as `POST /v1/nodes/{node}/deployments/{id}/signal`: the route's rate limit
   * (the signals a wake-up asked for not counted: `takeWakeCredit`), its body limit and JSON
   * reading, then `signal`. A refusal is logged as the API logs one (method `PUSH`).
   */
  async answerPushSignal(r: PushSignalRequest): Promise<PushReply> {
    const { service, metrics } = this.#o;
    const who = spiffeIdOf(this.#o.trustDomain, 'agent', r.node);
    const route = SIGNAL_ROUTE;
    const refused = (code: ErrorCode, message: string, status: number, field?: string): void =>
      this.#refusals.refused(code, message, { status, peer: who, method: 'PUSH', route, field }, who);
    try {
      const decision = service.takeWakeCredit(r.node, 'signal') ? null : this.#o.limits.signal.take(who);
      if (decision !== null && !decision.ok) {
        metrics.refusals.inc({ code: 'rate_limited' });
        refused('rate_limited', 'too many requests', 429);
        return { status: 429, error: 'rate_limited', retryAfterS: decision.retryAfterS };
      }
      const limit = this.#signalBodyBytes;
      if (r.body.length > limit) throw new HeraldError('body_too_large', `the body is over ${limit} bytes`);
      let body: unknown;
      try {
        body =
          r.body.length === 0
            ? undefined
            : JSON.parse(Buffer.from(r.body.buffer, r.body.byteOffset, r.body.byteLength).toString('utf8'));
      } catch {
        throw new HeraldError('invalid_json', 'the body is not valid JSON');
      }
      await this.signal(r.node, r.deploymentId, body, who);
      return { status: 200 };
    } catch (err) {
      const code = codeOf(err);
      if (code === undefined || code === 'internal') {
        this.#o.logger.error({ err, node: r.node, route }, 'answering a signal over the push connection failed');
        return { status: 500, error: 'internal' };
      }
      const status = statusOf(code);
      metrics.refusals.inc({ code });
      const field = err instanceof HeraldError ? err.field : undefined;
      refused(code, (err as Error).message, status, field);
      return status === 503 && code === 'store_unavailable'
        ? { status, error: code, retryAfterS: STORE_UNAVAILABLE_RETRY_AFTER_S }
        : { status, error: code };
    }
  }

  /** Logs the refusals counted and not yet logged. Idempotent. */
  close(): void {
    this.#refusals.close();
  }
}

/** A metadata document's ETag: its generation, quoted. */
export function etagOf(generation: number): string {
  return `"${generation}"`;
}

/**
 * The generations an `If-None-Match` names (lists, weak tags), or `all` for `*`: a generation is
 * among them exactly when `matchesEtag(header, etagOf(generation))`. A tag that is no
 * generation's ETag (not a decimal number without leading zeros) names none.
 */
export function heldGenerations(header: string | string[] | undefined): KnownGenerations {
  if (header === undefined) return [];
  const value = Array.isArray(header) ? header.join(',') : header;
  const out: number[] = [];
  for (const raw of value.split(',')) {
    const t = raw.trim();
    if (t === '*') return 'all';
    const strong = t.startsWith('W/') ? t.slice(2) : t;
    const m = /^"(0|[1-9][0-9]*)"$/.exec(strong);
    if (m === null) continue;
    const gen = Number(m[1]);
    if (Number.isSafeInteger(gen)) out.push(gen);
  }
  return out;
}

/** `If-None-Match` with lists, weak tags and `*` (RFC 9110, section 13.1.2). */
export function matchesEtag(header: string | string[] | undefined, etag: string): boolean {
  if (header === undefined) return false;
  const value = Array.isArray(header) ? header.join(',') : header;
  for (const raw of value.split(',')) {
    const t = raw.trim();
    if (t === '*') return true;
    const strong = t.startsWith('W/') ? t.slice(2) : t;
    if (strong === etag) return true;
  }
  return false;
}
