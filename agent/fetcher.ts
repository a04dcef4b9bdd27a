/**
 * The agent's client side of the controller API (docs/api.md): signed metadata fetches,
 * endpoint announcements, signals and live output, over one keep-alive mutual-TLS agent that
 * dials only the controllers of `--controller-id`. Every request goes through one
 * `ControllerEndpoints` (agent/controller-endpoints.ts), which moves to the next `--controller`
 * URL when the current one fails.
 *
 * A metadata fetch goes over the push connection when one that offers it is open (docs/protocol.md, the
 * `fetch` frame; `pushFetch`), else over HTTPS, and over HTTPS again when the push connection
 * gives no answer. Either way a response is trusted only after `verifyMetadataResponse`
 * (signature, fresh nonce, audience, issuer, digest, no rollback), on the 200 and on the 304
 * alike; its body is counted while it is read and refused past MAX_METADATA_RESPONSE_BYTES.
 * While push is healthy, idle API connections are closed (at once when push becomes healthy, and
 * AGENT_API_IDLE_CLOSE_MS after a later request): fetches go over the push connection, so a kept
 * one would only cost the controller a second TLS connection per agent. While push is down they
 * are kept (the API's keep-alive), so each poll is a request, not a new TLS connection.
 */
import { AGENT_API_IDLE_CLOSE_MS, API_REQUEST_TIMEOUT_MS } from '../protocol/limits.js';
import https from 'node:https';
import type http from 'node:http';
import { HeraldError, RefusalError } from '../protocol/errors.js';
import { fullJitterMs } from '../protocol/backoff.js';
import type { MetadataDocument, SignalBody } from '../protocol/heat.js';
import type { OutputChunkBody } from '../protocol/output.js';
import type { RenewRequest } from '../protocol/enroll.js';
import { KeySet } from '../protocol/jws.js';
import { AGENT_API_MAX_CONNECTIONS, MAX_METADATA_RESPONSE_BYTES, MAX_REQUEST_BODY_BYTES } from '../protocol/limits.js';
import { newNonce, NONCE_HEADER, SIGNATURE_HEADER, verifyMetadataResponse } from '../protocol/metadata.js';
import type tls from 'node:tls';
import {
  HttpsAgentHolder,
  refusalCodeOf,
  forgetResumedSession,
  serverIdentityOf,
  type ExpectedServer,
  type Logger,
  type PkiMaterial,
} from '../certs/tls.js';
import { ControllerEndpoints, parseControllerUrls } from './controller-endpoints.js';
import { tunnelVia, type DialProxy } from './dial-proxy.js';
import type { SignalledFrame } from '../protocol/frames.js';
import type { PushFetchAnswer } from './listener.js';
import type { SignalAnswer } from './outbox.js';

/** Each API request must finish within this. */
/** Endpoint announcement retries: first ceiling and cap. */
export const ANNOUNCE_BACKOFF_BASE_MS = 500;
export const ANNOUNCE_BACKOFF_MAX_MS = 60_000;

export type FetchResult = { status: 200; gen: number; document: MetadataDocument } | { status: 304; gen: number };

export interface FetcherOptions {
  /** `https://host:port` of the controller API, or several separated by commas (tried in turn). */
  controllerUrl: string;
  node: string;
  material: PkiMaterial;
  /**
   * Whom the API server must be: one SPIFFE id, or the controllers of `--controller-id`. The
   * metadata's `iss` must be the identity of the server that answered.
   */
  controllerSpiffeId: ExpectedServer;
  /** The last generation applied, for the rollback check. */
  lastAppliedGen: () => number | undefined;
  log: Logger;
  /** Default API_REQUEST_TIMEOUT_MS. */
  requestTimeoutMs?: number;
  /** Default MAX_METADATA_RESPONSE_BYTES. */
  maxMetadataBytes?: number;
  /**
   * Sends a fetch on a push connection (WakeListener.fetchOverPush): null when none can take it.
   * Absent: every fetch goes over HTTPS.
   */
  pushFetch?: (nonce: string, ifNoneMatch: string | undefined, timeoutMs: number) => Promise<PushFetchAnswer> | null;
  /**
   * Sends a signal on a push connection (WakeListener.signalOverPush): null when none can take it;
   * resolves only with an answer signed for this signal. Absent: signals go over HTTPS only.
   */
  pushSignal?: (
    nonce: string,
    deploymentId: string,
    revision: number,
    body: Uint8Array,
    timeoutMs: number,
  ) => Promise<SignalledFrame> | null;
  /** Whether push is healthy now (WakeListener.isPushHealthy); absent: never (API connections kept). */
  pushHealthy?: () => boolean;
  /** Default AGENT_API_IDLE_CLOSE_MS. */
  apiIdleCloseMs?: number;
  /**
   * The HTTP CONNECT proxy of `HTTPS_PROXY` and `NO_PROXY` (docs/dial-out.md): a controller URL it
   * covers is reached through its tunnel. Absent: every connection is direct.
   */
  proxy?: DialProxy | undefined;
}

interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /** The SPIFFE id of the server that answered (its TLS certificate). */
  peer: string | undefined;
}

/**
 * The trusted signing keys, rebuilt only when the JWKS or revoked kids change (a material
 * snapshot is replaced, never mutated, on every change).
 */
export function keySetOf(material: PkiMaterial): () => KeySet {
  let snap: unknown = null;
  let keys: KeySet = new KeySet({ keys: [] });
  return () => {
    const m = material.current();
    if (m !== snap) {
      snap = m;
      try {
        keys = new KeySet(m.jwks ?? { keys: [] }, m.revokedKids);
      } catch {
        keys = new KeySet({ keys: [] });
      }
    }
    return keys;
  };
}

/** The controller answered the metadata request with a status other than 200 or 304. */
export class FetchStatusError extends RefusalError {
  readonly status: number;
  constructor(status: number, message: string, code: 'bad_response' | 'rate_limited' = 'bad_response') {
    super(code, message);
    this.name = 'FetchStatusError';
    this.status = status;
  }
}

/** The controller answered 429: try again, not before `retryAfterMs` when it said so. */
export class RateLimitedError extends FetchStatusError {
  readonly retryAfterMs: number | undefined;
  constructor(message: string, retryAfterMs: number | undefined) {
    super(429, message, 'rate_limited');
    this.name = 'RateLimitedError';
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * When a failed fetch is worth trying again soon: for a network error, a timeout, a 429 or a
 * 5xx, the least delay (a 429's Retry-After, else 0); null for a refused answer (signature,
 * nonce, audience, digest, rollback, ...), which waits for the next poll.
 */
export function earlyRetryDelayMs(err: unknown): number | null {
  if (err instanceof RateLimitedError) return err.retryAfterMs ?? 0;
  if (err instanceof FetchStatusError) return err.status >= 500 ? 0 : null;
  return err instanceof HeraldError ? null : 0;
}

/** Whether a failed fetch is worth trying again soon (see earlyRetryDelayMs). */
export function isTransientFetchError(err: unknown): boolean {
  return earlyRetryDelayMs(err) !== null;
}

export class Fetcher {
  readonly #o: FetcherOptions;
  /** The controller URLs and the current one; every request goes through it. */
  readonly endpoints: ControllerEndpoints;
  readonly #agent: HttpsAgentHolder;
  readonly #keys: () => KeySet;
  readonly #timeoutMs: number;
  readonly #maxBytes: number;
  /** ETag and generation of the last 200 this process holds: If-None-Match only with a document in hand. */
  #etag: string | undefined;
  #closed = false;
  readonly #requests = new Set<http.ClientRequest>();
  /** Fetches made, for tests. */
  fetches = 0;
  /** Of them, answered over a push connection. */
  pushFetches = 0;
  /** Signals answered (below 500) over a push connection. */
  pushSignals = 0;

  constructor(opts: FetcherOptions) {
    this.#o = opts;
    this.endpoints = new ControllerEndpoints({ urls: parseControllerUrls(opts.controllerUrl), log: opts.log });
    this.#agent = new HttpsAgentHolder(opts.material, opts.controllerSpiffeId, {
      keepAlive: true,
      maxSockets: AGENT_API_MAX_CONNECTIONS,
      idleTimeoutMs: () => (opts.pushHealthy?.() ? (opts.apiIdleCloseMs ?? AGENT_API_IDLE_CLOSE_MS) : 0),
      // a restarted controller resumes its agents' sessions instead of a full handshake each
      //; a resumed socket keeps the identity its full handshake checked (certs/tls.ts)
      resumeSessions: true,
      ...(opts.proxy !== undefined
        ? { via: tunnelVia(opts.proxy, opts.requestTimeoutMs ?? API_REQUEST_TIMEOUT_MS) }
        : {}),
    });
    this.#keys = keySetOf(opts.material);
    this.#timeoutMs = opts.requestTimeoutMs ?? API_REQUEST_TIMEOUT_MS;
    this.#maxBytes = opts.maxMetadataBytes ?? MAX_METADATA_RESPONSE_BYTES;
  }

  get #audience(): string {
    return this.#o.material.current().identity.spiffeId;
  }

  /** Forgets the ETag, so the next fetch gets a full body (a 304 would give nothing to apply). */
  forgetEtag(): void {
    this.#etag = undefined;
  }

  /**
   * Fetches this node's metadata and verifies it.
   * @throws RefusalError (signature codes, `nonce_mismatch`, `digest_mismatch`, `rollback`,
   *   `response_too_large`, `bad_response`, `wrong_peer`, ...) or a network error
   */
  async fetchMetadata(): Promise<FetchResult> {
    this.fetches++;
    const nonce = newNonce();
    const etag = this.#etag;
    const headers: Record<string, string> = { [NONCE_HEADER]: nonce, accept: 'application/json' };
    if (etag !== undefined) headers['if-none-match'] = etag;
    const res =
      (await this.#fetchOverPush(nonce, etag)) ??
      (await this.#request('GET', `/v1/nodes/${encodeURIComponent(this.#o.node)}/metadata`, {
        headers,
        maxBytes: this.#maxBytes,
      }));
    if (res.status === 429) {
      throw new RateLimitedError(
        `metadata fetch answered 429${errorCodeSuffix(res.body)}`,
        retryAfterMs(res.headers['retry-after']),
      );
    }
    if (res.status !== 200 && res.status !== 304) {
      throw new FetchStatusError(res.status, `metadata fetch answered ${res.status}${errorCodeSuffix(res.body)}`);
    }
    if (res.status === 304 && etag === undefined)
      throw new RefusalError('bad_response', 'a 304 to a request without If-None-Match');
    const sig = res.headers[SIGNATURE_HEADER];
    const lastApplied = this.#o.lastAppliedGen();
    const v = verifyMetadataResponse({
      status: res.status,
      signature: Array.isArray(sig) ? undefined : sig,
      ...(res.status === 200 ? { body: res.body } : {}),
      nonce,
      audience: this.#audience,
      // the controller that answered signed it, with its own key (checked against `iss`)
      issuer: res.peer ?? '',
      keys: this.#keys(),
      ...(lastApplied !== undefined ? { lastAppliedGen: lastApplied } : {}),
    });
    if (res.status === 304) return { status: 304, gen: v.gen };
    const document = v.document!;
    if (document.node !== this.#o.node)
      throw new RefusalError('bad_response', `the metadata is for node ${String(document.node).slice(0, 80)}`);
    const tag = res.headers.etag;
    this.#etag = typeof tag === 'string' && tag.length <= 200 ? tag : `"${v.gen}"`;
    return { status: 200, gen: v.gen, document };
  }

  /**
   * The fetch over a push connection, as the HTTPS response it stands for; null when no push
   * connection takes it, it failed (closed, no answer in time: logged) or the controller could not
   * answer there (5xx): then the caller fetches over HTTPS.
   * @throws RefusalError response_too_large
   */
  async #fetchOverPush(nonce: string, etag: string | undefined): Promise<RawResponse | null> {
    const pending = this.#o.pushFetch?.(nonce, etag, this.#timeoutMs) ?? null;
    if (pending === null) return null;
    let a: PushFetchAnswer;
    try {
      a = await pending;
    } catch (err) {
      this.#o.log.warn(
        { code: refusalCodeOf(err) ?? (err as { code?: string }).code, err: (err as Error).message },
        'fetch over the push connection failed; fetching over HTTPS',
      );
      return null;
    }
    const h = a.head;
    if (h.status >= 500) {
      this.#o.log.info(
        { status: h.status, code: h.error },
        'the push connection could not answer a fetch; fetching over HTTPS',
      );
      return null;
    }
    if (a.body.length > this.#maxBytes)
      throw new RefusalError('response_too_large', `metadata over the push connection: ${a.body.length} bytes`);
    this.pushFetches++;
    const headers: http.IncomingHttpHeaders = {};
    if (h.etag !== undefined) headers.etag = h.etag;
    if (h.signature !== undefined) headers[SIGNATURE_HEADER] = h.signature;
    if (h.retry_after_s !== undefined) headers['retry-after'] = String(h.retry_after_s);
    const body = h.error !== undefined ? Buffer.from(JSON.stringify({ error: { code: h.error } })) : a.body;
    return { status: h.status, headers, body, peer: a.issuer };
  }

  /**
   * Announces `url` (`wss://host:port/v1/wake`) as this node's endpoint, retrying with backoff
   * (honouring Retry-After on a 429) until the controller accepts it or `signal` aborts.
   * Resolves true when accepted, false when aborted.
   */
  async announce(url: string, signal?: AbortSignal): Promise<boolean> {
    const path = `/v1/nodes/${encodeURIComponent(this.#o.node)}/endpoint`;
    const body = Buffer.from(JSON.stringify({ url }));
    for (let attempt = 0; !signal?.aborted && !this.#closed; attempt++) {
      let waitMs = fullJitterMs(attempt, ANNOUNCE_BACKOFF_BASE_MS, ANNOUNCE_BACKOFF_MAX_MS);
      try {
        const res = await this.#request('PUT', path, { body, maxBytes: MAX_REQUEST_BODY_BYTES });
        if (res.status >= 200 && res.status < 300) {
          this.#o.log.info({ url }, 'endpoint announced');
          return true;
        }
        if (res.status === 429) {
          const ra = retryAfterMs(res.headers['retry-after']);
          if (ra !== undefined) waitMs = Math.min(ANNOUNCE_BACKOFF_MAX_MS, ra + Math.floor(Math.random() * 250));
        }
        this.#o.log.warn(
          { url, status: res.status, code: errorCodeOf(res.body), attempt, retryInMs: waitMs },
          'endpoint announcement refused; retrying',
        );
      } catch (err) {
        this.#o.log.warn(
          {
            url,
            code: refusalCodeOf(err) ?? (err as { code?: string }).code,
            err: (err as Error).message,
            attempt,
            retryInMs: waitMs,
          },
          'endpoint announcement failed; retrying',
        );
      }
      await sleep(Math.max(50, waitMs), signal);
    }
    return false;
  }

  /**
   * Sends one signal: over the push connection when one takes it (docs/protocol.md), else, or when that
   * gets no answer, an answer not signed for it, or cannot take it there (503
   * `signal_unavailable`), over HTTPS. Any other
   * answer is the route's (a database outage's 503 is retried by the outbox, not doubled here).
   * Resolves with the status and its Retry-After (the outbox decides what they mean). A signal
   * the push connection recorded but whose answer was lost is recorded once: the HTTPS retry is
   * answered as a repeat (the first result of a revision wins).
   * @throws a network or TLS error
   */
  async signal(path: string, body: SignalBody, deploymentId: string): Promise<SignalAnswer> {
    const bytes = Buffer.from(JSON.stringify(body));
    const overPush = await this.#signalOverPush(deploymentId, body.revision, bytes);
    if (overPush !== null) return overPush;
    const res = await this.#request('POST', path, { body: bytes, maxBytes: MAX_REQUEST_BODY_BYTES });
    const retryAfter = res.status === 429 ? retryAfterMs(res.headers['retry-after']) : undefined;
    return retryAfter === undefined ? { status: res.status } : { status: res.status, retryAfterMs: retryAfter };
  }

  /** The signal's answer over a push connection; null when none took it, it failed or could not take it there. */
  async #signalOverPush(deploymentId: string, revision: number, bytes: Buffer): Promise<SignalAnswer | null> {
    const pending = this.#o.pushSignal?.(newNonce(), deploymentId, revision, bytes, this.#timeoutMs) ?? null;
    if (pending === null) return null;
    try {
      const a = await pending;
      if (!(a.status === 503 && a.error === 'signal_unavailable')) {
        this.pushSignals++;
        return a.retry_after_s === undefined
          ? { status: a.status }
          : { status: a.status, retryAfterMs: a.retry_after_s * 1_000 };
      }
      this.#o.log.info(
        { status: a.status, code: a.error, deployment_id: deploymentId },
        'the push connection could not take a signal; signalling over HTTPS',
      );
    } catch (err) {
      this.#o.log.warn(
        { code: refusalCodeOf(err) ?? (err as { code?: string }).code, err: (err as Error).message },
        'signal over the push connection failed; signalling over HTTPS',
      );
    }
    return null;
  }

  /**
   * Posts one live output chunk (docs/api.md), over HTTPS only: a chunk is result data, and the push
   * connection's peer may be anyone holding a controller TLS key (agent/push-connections.ts). Resolves
   * with the HTTP status and a 429's Retry-After.
   * @throws a network or TLS error
   */
  async output(path: string, body: OutputChunkBody): Promise<{ status: number; retryAfterMs?: number }> {
    const res = await this.#request('POST', path, {
      body: Buffer.from(JSON.stringify(body)),
      maxBytes: MAX_REQUEST_BODY_BYTES,
    });
    const retryAfter = retryAfterMs(res.headers['retry-after'] as string | undefined);
    return retryAfter === undefined ? { status: res.status } : { status: res.status, retryAfterMs: retryAfter };
  }

  /**
   * Posts a certificate renewal (docs/adding-nodes.md) for this node. Resolves with the status and the body
   * (the renewer reads the bundle or the error code).
   * @throws a network or TLS error
   */
  async renewCertificate(body: RenewRequest): Promise<{ status: number; body: Buffer }> {
    const res = await this.#request('POST', `/v1/nodes/${encodeURIComponent(this.#o.node)}/certificate`, {
      body: Buffer.from(JSON.stringify(body)),
      maxBytes: MAX_REQUEST_BODY_BYTES,
    });
    return { status: res.status, body: res.body };
  }

  /** Push became healthy: the API connections idle now are not needed (fetches go over push). */
  closeIdleApiConnections(): void {
    if (!this.#closed) this.#agent.closeIdle();
  }

  /** Aborts requests in flight and closes the connections. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const r of this.#requests) r.destroy(new HeraldError('shutting_down'));
    this.#agent.close();
    this.endpoints.flushLog();
  }

  /** One request, to the current controller URL, moving to the next when it fails. */
  #request(
    method: string,
    path: string,
    o: { headers?: Record<string, string>; body?: Buffer; maxBytes: number },
  ): Promise<RawResponse> {
    return this.endpoints.request((base) => this.#requestTo(base, method, path, o));
  }

  #requestTo(
    base: URL,
    method: string,
    path: string,
    o: { headers?: Record<string, string>; body?: Buffer; maxBytes: number },
    retried = false,
  ): Promise<RawResponse> {
    if (this.#closed) return Promise.reject(new HeraldError('shutting_down'));
    return new Promise((resolve, reject) => {
      const headers: Record<string, string | number> = { ...(o.headers ?? {}) };
      if (o.body) {
        headers['content-type'] = 'application/json';
        headers['content-length'] = o.body.length;
      }
      const req = https.request({
        protocol: 'https:',
        hostname: base.hostname.replace(/^\[|\]$/g, ''),
        port: base.port || 443,
        method,
        path,
        headers,
        agent: this.#agent.agent,
      });
      this.#requests.add(req);
      let settled = false;
      const fail = (err: Error): void => {
        if (settled) return;
        settled = true;
        this.#requests.delete(req);
        reject(err);
      };
      req.setTimeout(this.#timeoutMs, () =>
        req.destroy(
          Object.assign(new Error(`${method} ${path} timed out after ${this.#timeoutMs} ms`), { code: 'ETIMEDOUT' }),
        ),
      );
      req.on('error', (err: NodeJS.ErrnoException) => {
        // A kept-alive socket the API closed (its 5 s idle timeout) just as we reused it: the
        // request never reached it. Once, on a new connection, for a GET; otherwise the fetch of
        // an acked wake-up would wait for the next poll (measured by `npm run bench` under load).
        if (
          !settled &&
          !retried &&
          method === 'GET' &&
          req.reusedSocket &&
          (err.code === 'ECONNRESET' || err.code === 'EPIPE')
        ) {
          settled = true;
          this.#requests.delete(req);
          resolve(this.#requestTo(base, method, path, o, true));
          return;
        }
        fail(err);
      });
      req.on('response', (res) => {
        // the socket now: a kept-alive one is detached from the response once it ends
        const socket = res.socket as tls.TLSSocket;
        const peer = serverIdentityOf(socket, this.#o.material);
        const declared = Number(res.headers['content-length']);
        if (Number.isFinite(declared) && declared > o.maxBytes) {
          req.destroy();
          return fail(new RefusalError('response_too_large', `${method} ${path}: ${declared} bytes declared`));
        }
        const chunks: Buffer[] = [];
        let n = 0;
        res.on('data', (d: Buffer) => {
          n += d.length;
          if (n > o.maxBytes) {
            req.destroy();
            fail(new RefusalError('response_too_large', `${method} ${path}: over ${o.maxBytes} bytes`));
            return;
          }
          chunks.push(d);
        });
        res.on('error', fail);
        res.on('aborted', () => fail(new Error('response aborted')));
        res.on('end', () => {
          if (settled) return;
          settled = true;
          this.#requests.delete(req);
          // a refusal on a resumed TLS session is asked again once on a full handshake: the
          // session shows the server our leaf alone, and a controller restarted since does not
          // know the Herald issuer above it until a full handshake presents the chain again
          if (res.statusCode === 403 && !retried && forgetResumedSession(socket)) {
            resolve(this.#requestTo(base, method, path, o, true));
            return;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks, n), peer });
        });
      });
      req.end(o.body);
    });
  }
}

function retryAfterMs(h: string | undefined): number | undefined {
  if (h === undefined) return undefined;
  const s = Number(h);
  if (Number.isFinite(s) && s >= 0) return s * 1000;
  const t = Date.parse(h);
  return Number.isNaN(t) ? undefined : Math.max(0, t - Date.now());
}

function errorCodeOf(body: Buffer): string | undefined {
  try {
    const c = (JSON.parse(body.toString('utf8')) as { error?: { code?: unknown } })?.error?.code;
    return typeof c === 'string' ? c.slice(0, 64) : undefined;
  } catch {
    return undefined;
  }
}

function errorCodeSuffix(body: Buffer): string {
  const c = errorCodeOf(body);
  return c ? ` (${c})` : '';
}

/** Waits `ms`, or less when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done(): void {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}
