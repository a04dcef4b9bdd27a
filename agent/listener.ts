/**
 * The agent's wake-up listener (docs/protocol.md): `wss://host:port/v1/wake`, TLS 1.3, mutual auth.
 *
 * It refuses early and cheaply: a socket is counted from the TCP level on and destroyed when
 * its TLS handshake plus WebSocket upgrade take too long or too many are pending; a peer that is
 * not a verified, unrevoked controller gets HTTP 403 with a code before the upgrade, so no frame
 * is ever read from it. After the upgrade every frame is answered at once (ack or nack), and the
 * only effect a valid wake-up can have is a coalesced fetch.
 *
 * A controller that offers it (`Herald-Features: fetch` on its upgrade) also answers the agent's
 * fetches on the connection (`fetchOverPush`): a `metadata` frame is taken only as the answer to
 * the fetch this agent sent on that connection, with its nonce, and checked by the fetcher exactly
 * as an HTTPS answer (signature, nonce, audience, issuer = this connection's controller, digest).
 * One that offers `signal` takes the agent's signals there too (`signalOverPush`), answered by a
 * `signalled` frame with the route's status, taken likewise only for the signal it answers.
 *
 * A controller TLS certificate alone proves little: whoever holds that key (without the Ed25519
 * signing key) can connect here and be the connection heard from last. So a request that carries
 * data (a signal: results, stdout, outputs) goes only on a connection that has *proven* it
 * reaches the signing key's holder, by delivering a wake-up that verified (signed for this agent by
 * a trusted key of the connection's own controller, fresh, its `jti` never seen before). That
 * proof lasts only while its key is trusted: when revoked.json or the JWKS drops it, the
 * connection is proven no more until a wake-up signed by a key still trusted verifies on it. The
 * answer the agent acts on is itself signed for that one request (protocol/signal-answer.ts).
 * Without such a connection, or when the answer does not verify, the caller goes over HTTPS to its
 * configured controller, whose URI SAN it checks. Live output never uses the push connection.
 */
import { EventEmitter } from 'node:events';
import https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import { randomBytes, type X509Certificate } from 'node:crypto';
import { createRequire } from 'node:module';
import type { WebSocket, WebSocketServer as WebSocketServerType } from 'ws';
import { codeOf, ERROR_CODES, RefusalError, type ErrorCode } from '../protocol/errors.js';
import {
  decodeControllerAnswer,
  encodeAck,
  encodeFetch,
  encodeNack,
  encodeSignal,
  FEATURE_FETCH,
  FEATURE_SIGNAL,
  FEATURES_HEADER,
  isNackCode,
  offersFeature,
  type ControllerAnswer,
  type FetchState,
  type MetadataFrame,
  type NackCode,
  type SignalledFrame,
} from '../protocol/frames.js';
import {
  AGENT_IDLE_CLOSE_MS,
  LISTENER_HANDSHAKE_TIMEOUT_MS,
  LISTENER_HTTP_CHECK_INTERVAL_MS,
  MAX_AUTHENTICATED_CONNECTIONS,
  MAX_BAD_FRAMES,
  MAX_LATE_FETCH_ENTRIES,
  MAX_PENDING_CONNECTIONS,
  MAX_PUSH_METADATA_FRAME_BYTES,
  MAX_PUSH_SIGNAL_FRAME_BYTES,
  MAX_WAKE_FRAME_BYTES,
  MAX_WS_PAYLOAD_BYTES,
  PUSH_HEALTHY_WINDOW_MS,
  REFUSAL_LOG_INTERVAL_MS,
  PUSH_TLS_SESSION_LIFETIME_S,
  TLS_TICKET_KEY_BYTES,
} from '../protocol/limits.js';
import { RefusalSummary, type RefusalLine } from '../protocol/refusal-summary.js';
import { verifySignalled } from '../protocol/signal-answer.js';
import { checkKeyIssuer, type KeySet } from '../protocol/jws.js';
import { peekJti, verifiedKid, type WakeClaims, type WakeVerifier } from '../protocol/wake.js';
import type { CertIdentity } from '../certs/identity.js';
import {
  authorizeCertificate,
  authorizePeer,
  refusalCodeOf,
  tlsServerOptions,
  watchServer,
  type Logger,
  type PkiMaterial,
} from '../certs/tls.js';

// `ws` is CommonJS: require() it rather than import it. An ESM import of a CommonJS package
// runs Node's export lexer over it and keeps a module wrapper; measured here, that is ~3 MB of
// the agent's idle RSS for ws alone.
const { WebSocketServer } = createRequire(import.meta.url)('ws') as typeof import('ws');

export const WAKE_PATH = '/v1/wake';

/** WebSocket close codes the listener uses. */
export const CLOSE_NORMAL = 1000;
export const CLOSE_GOING_AWAY = 1001;
export const CLOSE_POLICY = 1008;
/** A newer connection from the same controller identity took this one's place. */
export const CLOSE_REPLACED = 4000;

/** `{`: the first byte of a metadata frame; a wake-up (compact JWS) never starts with it. */
const OPEN_BRACE = 0x7b;

/** How long a closing WebSocket may take its close handshake before it is cut. */
const CLOSE_HANDSHAKE_MS = 1_000;

export interface WakeListenerOptions {
  material: PkiMaterial;
  verifier: WakeVerifier;
  /**
   * Which controllers may connect, by name (`--controller-id`, docs/several-controllers.md); another controller of
   * the trust domain is refused 403 `wrong_peer` before the upgrade. Default: every controller.
   */
  acceptController?: (name: string) => boolean;
  /** A verified wake-up: start or queue a fetch (the coalescer). Must answer synchronously. */
  onWake: (claims: WakeClaims) => FetchState;
  /** The last generation fetched, for the ack's `gen`. */
  lastFetchedGen: () => number;
  log: Logger;
  /** Default LISTENER_HANDSHAKE_TIMEOUT_MS. */
  handshakeTimeoutMs?: number;
  /** Default MAX_PENDING_CONNECTIONS. */
  maxPending?: number;
  /** Default MAX_AUTHENTICATED_CONNECTIONS. */
  maxAuthenticated?: number;
  /** Default AGENT_IDLE_CLOSE_MS. */
  idleCloseMs?: number;
  /** Default MAX_BAD_FRAMES. */
  maxBadFrames?: number;
  /** Default PUSH_HEALTHY_WINDOW_MS. */
  healthyWindowMs?: number;
  /** Refusals before authentication: at most one log line per code per this long. Default REFUSAL_LOG_INTERVAL_MS. */
  refusalLogIntervalMs?: number;
  /** Clock in ms; injectable. */
  now?: () => number;
}

interface Pending {
  raw: net.Socket;
  timer: NodeJS.Timeout;
  peer: string;
}

interface Conn {
  ws: WebSocket;
  /** The TLS socket under `ws`: corked while a wake-up is answered (see #onFrame). */
  sock: tls.TLSSocket;
  identity: CertIdentity;
  cert: X509Certificate;
  peer: string;
  badFrames: number;
  lastHeard: number;
  idleTimer: NodeJS.Timeout | undefined;
  closing: boolean;
  /** What the controller answers on this connection (`Herald-Features: fetch, signal`). */
  offers: Record<PushRequestKind, boolean>;
  /** The fetch and the signal sent on this connection and not answered yet (at most one of each). */
  pending: Record<PushRequestKind, PendingRequest | null>;
  /** Nonces of this connection's requests given up on (timed out): their late answers are dropped. */
  lateNonces: string[];
  /**
   * The `kid` of the last wake-up that verified on this connection: its peer reaches that signing
   * key (see the module's comment). Null until one verified, and again once that key is no longer
   * trusted (revoked.json or the JWKS changed: #recheckAll); a later wake-up signed by a key still
   * trusted proves it anew.
   */
  provenBy: string | null;
}

/** What an agent may ask on a push connection. */
type PushRequestKind = 'fetch' | 'signal';

/**
 * Whether a request of this kind may go only on a proven connection. A fetch carries a nonce and
 * an ETag, and its answer is verified end to end (signature, nonce, digest); a signal carries the
 * result itself. Every new kind must say which it is.
 */
const NEEDS_PROOF: Record<PushRequestKind, boolean> = { fetch: false, signal: true };

interface PendingRequest {
  nonce: string;
  timer: NodeJS.Timeout;
  resolve: (a: ControllerAnswer) => void;
  reject: (err: Error) => void;
}

/** The code a request over the push connection fails with when it gets no answer there. */
const FAILED: Record<PushRequestKind, ErrorCode> = { fetch: 'push_fetch_failed', signal: 'push_signal_failed' };

/** A metadata frame that answered this agent's fetch, and the controller whose connection carried it. */
export interface PushFetchAnswer extends MetadataFrame {
  /** The SPIFFE id of the controller (this connection's verified peer): the metadata's `iss`. */
  issuer: string;
}

/** Counters, for tests and metrics. */
export interface ListenerStats {
  pending: number;
  authenticated: number;
  /** Authenticated connections accepted so far, and how many of them resumed a TLS session (no certificate exchange). */
  accepted: number;
  resumed: number;
  /** Every refusal, before and after authentication. */
  refused: number;
  /**
   * Refusals before authentication (a TCP connect over the pending cap, a handshake timeout, a
   * failed TLS handshake, a 403): anyone can cause these, so they are counted here and logged as
   * a summary (at most one line per code per REFUSAL_LOG_INTERVAL_MS), never one line each.
   */
  refusedBeforeAuth: number;
  /** The same, by code. */
  refusedBeforeAuthByCode: Record<string, number>;
  frames: number;
  acks: number;
  nacks: number;
  /** Fetches sent over push connections, and how many of them got their answer there. */
  pushFetches: number;
  pushFetchesAnswered: number;
  /** Signals sent over push connections, and how many of them got their answer there. */
  pushSignals: number;
  pushSignalsAnswered: number;
}

/**
 * Events: `'push-change'` () when a connection opened or closed (push health may have changed);
 * `'connected'` ({ identity, peer, resumed }) when a controller's WebSocket is accepted;
 * `'disconnected'` ({ identity, peer, code }) when one closed, with the close code it saw;
 * `'refused'` ({ code, peer, resumed? }) for every refusal, also logged (`resumed`: a refused
 *   upgrade's TLS session was resumed).
 */
export class WakeListener extends EventEmitter {
  readonly #o: Required<
    Omit<WakeListenerOptions, 'material' | 'verifier' | 'onWake' | 'lastFetchedGen' | 'log' | 'acceptController'>
  >;
  readonly #acceptController: (name: string) => boolean;
  readonly #material: PkiMaterial;
  readonly #verifier: WakeVerifier;
  readonly #onWake: (claims: WakeClaims) => FetchState;
  readonly #lastFetchedGen: () => number;
  readonly #log: Logger;
  readonly #server: https.Server;
  /** Replaces the session-ticket key (see the constructor). */
  readonly #ticketTimer: NodeJS.Timeout;
  readonly #wss: WebSocketServerType;
  /** For connections whose controller answers fetches: the message limit fits a metadata frame. */
  readonly #wssFetch: WebSocketServerType;
  readonly #pending = new Map<string, Pending>();
  /** Raw sockets this listener destroyed before authentication (already counted as refused). */
  readonly #cut = new WeakSet<net.Socket>();
  /** Authenticated connections by controller SPIFFE id. */
  readonly #conns = new Map<string, Conn>();
  readonly #stopWatching: () => void;
  /** Trust changed (CA, certificate, revoked.json, JWKS): every live connection is checked again. */
  readonly #onTrustChange = (): void => this.#recheckAll();
  #closed = false;
  #closing: Promise<void> | null = null;
  readonly #summary: RefusalSummary;
  /** Runs only while refusals may be waiting to be logged: an idle agent arms no timer for them. */
  #summaryTimer: NodeJS.Timeout | null = null;
  /** When the last refusal before authentication was counted (clock ms). */
  #lastRefusalAt = 0;
  readonly stats: ListenerStats = {
    pending: 0,
    authenticated: 0,
    accepted: 0,
    resumed: 0,
    refused: 0,
    refusedBeforeAuth: 0,
    refusedBeforeAuthByCode: Object.create(null) as Record<string, number>,
    frames: 0,
    acks: 0,
    nacks: 0,
    pushFetches: 0,
    pushFetchesAnswered: 0,
    pushSignals: 0,
    pushSignalsAnswered: 0,
  };

  constructor(opts: WakeListenerOptions) {
    super();
    this.#o = {
      handshakeTimeoutMs: LISTENER_HANDSHAKE_TIMEOUT_MS,
      maxPending: MAX_PENDING_CONNECTIONS,
      maxAuthenticated: MAX_AUTHENTICATED_CONNECTIONS,
      idleCloseMs: AGENT_IDLE_CLOSE_MS,
      maxBadFrames: MAX_BAD_FRAMES,
      healthyWindowMs: PUSH_HEALTHY_WINDOW_MS,
      refusalLogIntervalMs: REFUSAL_LOG_INTERVAL_MS,
      now: Date.now,
      ...stripUndefined({
        handshakeTimeoutMs: opts.handshakeTimeoutMs,
        maxPending: opts.maxPending,
        maxAuthenticated: opts.maxAuthenticated,
        idleCloseMs: opts.idleCloseMs,
        maxBadFrames: opts.maxBadFrames,
        healthyWindowMs: opts.healthyWindowMs,
        refusalLogIntervalMs: opts.refusalLogIntervalMs,
        now: opts.now,
      }),
    };
    this.#material = opts.material;
    this.#acceptController = opts.acceptController ?? (() => true);
    this.#verifier = opts.verifier;
    this.#onWake = opts.onWake;
    this.#lastFetchedGen = opts.lastFetchedGen;
    this.#log = opts.log;
    this.#summary = new RefusalSummary((line) => this.#logSummary(line), this.#o.now, this.#o.refusalLogIntervalMs);

    // Session tickets the controller resumes its push connections with, after its restart too
    // (certs/session-file.ts): they live PUSH_TLS_SESSION_LIFETIME_S, and their key is this
    // process's, kept across a renewal of our certificate (a new context would make a new one)
    // and replaced every PUSH_TLS_SESSION_LIFETIME_S: each resumption brings a new ticket, so
    // without it a stolen session would chain for as long as this process lives.
    // A resumed connection is authorized as a full one (#authorize: CA, dates, revocation).
    const sessions = { sessionTimeout: PUSH_TLS_SESSION_LIFETIME_S, ticketKeys: randomBytes(TLS_TICKET_KEY_BYTES) };
    this.#ticketTimer = setInterval(() => {
      sessions.ticketKeys = randomBytes(TLS_TICKET_KEY_BYTES);
      this.#server.setTicketKeys(sessions.ticketKeys);
    }, PUSH_TLS_SESSION_LIFETIME_S * 1000);
    this.#ticketTimer.unref();
    this.#server = https.createServer({
      ...tlsServerOptions(this.#material),
      ...sessions,
      // our own timer (TLS plus upgrade) destroys the socket first; this only bounds Node's wait
      handshakeTimeout: this.#o.handshakeTimeoutMs + 1_000,
      // Node's check of headersTimeout and requestTimeout: a backstop behind that timer, which
      // would otherwise wake an idle agent every 30 s
      connectionsCheckingInterval: LISTENER_HTTP_CHECK_INTERVAL_MS,
    });
    // keep-alive would let a peer hold a pending slot between requests; nothing here wants it
    this.#server.keepAliveTimeout = 1;
    this.#server.headersTimeout = this.#o.handshakeTimeoutMs;
    this.#server.requestTimeout = this.#o.handshakeTimeoutMs;
    this.#wss = new WebSocketServer({
      noServer: true,
      perMessageDeflate: false,
      maxPayload: MAX_WS_PAYLOAD_BYTES,
      clientTracking: false,
    });
    this.#wssFetch = new WebSocketServer({
      noServer: true,
      perMessageDeflate: false,
      maxPayload: MAX_PUSH_METADATA_FRAME_BYTES,
      clientTracking: false,
    });
    this.#stopWatching = watchServer(this.#server, this.#material, () => sessions);
    this.#material.on('revoked-change', this.#onTrustChange);
    this.#material.on('tls-change', this.#onTrustChange);
    this.#material.on('jwks-change', this.#onTrustChange);

    this.#server.on('connection', (raw: net.Socket) => this.#onTcp(raw));
    this.#server.on('tlsClientError', (err: Error, sock: tls.TLSSocket) => {
      // a socket this listener cut itself (over the pending cap, handshake timeout) was refused
      // and counted already; its TLS layer reports the cut as a hang-up (`_parent` is the raw
      // socket under Node's TLSSocket)
      const raw = (sock as unknown as { _parent?: net.Socket })._parent;
      if (raw !== undefined && this.#cut.has(raw)) return;
      this.#refusedBeforeAuth(refusalCodeOf(err) ?? 'tls_handshake_failed', peerOf(sock), err.message);
    });
    this.#server.on('clientError', (_err: Error, sock: Duplex) => sock.destroy());
    this.#server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => this.#onRequest(req, res));
    this.#server.on('upgrade', (req: http.IncomingMessage, sock: Duplex, head: Buffer) =>
      this.#onUpgrade(req, sock as tls.TLSSocket, head),
    );
  }

  /** Listens on `host:port` (port 0: any free port). Resolves with the bound port. */
  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => reject(err);
      this.#server.once('error', onError);
      this.#server.listen(port, host, () => {
        this.#server.off('error', onError);
        this.#server.on('error', (err) => this.#log.error({ err }, 'listener error'));
        resolve(this.port);
      });
    });
  }

  get port(): number {
    const a = this.#server.address();
    return typeof a === 'object' && a !== null ? a.port : 0;
  }

  /** Authenticated WebSocket connections open now. */
  get connections(): number {
    return this.#conns.size;
  }

  /** Sockets counted as pending authentication now. */
  get pendingConnections(): number {
    return this.#pending.size;
  }

  /** Push is healthy: a connection is open and a ping or frame came within the window. */
  isPushHealthy(): boolean {
    const now = this.#o.now();
    for (const c of this.#conns.values()) if (!c.closing && now - c.lastHeard < this.#o.healthyWindowMs) return true;
    return false;
  }

  /**
   * Sends a fetch on the push connection heard from last whose controller answers fetches, and
   * resolves with the metadata frame that answers it. Null when there is no such connection, or
   * it has a fetch in flight already (the caller fetches over HTTPS). Rejects with RefusalError
   * `push_fetch_failed` when the connection closes or no answer comes within `timeoutMs`, and
   * `malformed` for an answer that is not a metadata frame.
   */
  fetchOverPush(nonce: string, ifNoneMatch: string | undefined, timeoutMs: number): Promise<PushFetchAnswer> | null {
    const c = this.#pick('fetch');
    if (c === null) return null;
    this.stats.pushFetches++;
    return this.#ask(c, 'fetch', nonce, encodeFetch(nonce, ifNoneMatch), timeoutMs).then((a) => {
      if (a.type !== 'metadata') throw new RefusalError('malformed', 'a signalled frame answered a fetch');
      this.stats.pushFetchesAnswered++;
      return { head: a.head, body: a.body, issuer: c.identity.spiffeId };
    });
  }

  /**
   * Sends a signal (the signal route's JSON body, as bytes, for `deployment` at `revision`) on the
   * proven push connection heard from last whose controller takes signals, and resolves with the
   * `signalled` frame that answers it once its signature verified: the status the HTTPS route
   * would have answered. Null when there is no such connection, it has a signal in flight already,
   * or the frame would be over MAX_PUSH_SIGNAL_FRAME_BYTES (the caller signals over HTTPS).
   * Rejects with RefusalError `push_signal_failed` when the connection closes or no answer comes
   * within `timeoutMs`, `malformed` for an answer that is not a signalled frame, and the code of
   * protocol/signal-answer.ts's `verifySignalled` for one that is not signed for this request.
   */
  signalOverPush(
    nonce: string,
    deployment: string,
    revision: number,
    body: Uint8Array,
    timeoutMs: number,
  ): Promise<SignalledFrame> | null {
    const frame = encodeSignal(nonce, deployment, body);
    if (frame.length > MAX_PUSH_SIGNAL_FRAME_BYTES) return null;
    const c = this.#pick('signal');
    if (c === null) return null;
    this.stats.pushSignals++;
    return this.#ask(c, 'signal', nonce, frame, timeoutMs).then((a) => {
      if (a.type !== 'signalled') throw new RefusalError('malformed', 'a metadata frame answered a signal');
      try {
        verifySignalled({
          signature: a.signature,
          status: a.status,
          error: a.error,
          retryAfterS: a.retry_after_s,
          nonce,
          deployment,
          revision,
          body,
          audience: this.#verifier.audience,
          issuer: c.identity.spiffeId,
          keys: this.#verifier.keys(),
        });
      } catch (err) {
        this.#refusedLog(codeOf(err) ?? 'bad_response', c.peer, (err as Error).message, c.identity.spiffeId);
        throw err;
      }
      this.stats.pushSignalsAnswered++;
      return a;
    });
  }

  /**
   * The healthy connection heard from last whose controller answers `kind` (and, for a kind that
   * needs it, has proven to reach the signing key), if it has none in flight.
   */
  #pick(kind: PushRequestKind): Conn | null {
    const now = this.#o.now();
    let best: Conn | null = null;
    for (const c of this.#conns.values()) {
      if (NEEDS_PROOF[kind] && c.provenBy === null) continue;
      if (!c.offers[kind] || c.closing || now - c.lastHeard >= this.#o.healthyWindowMs) continue;
      if (best === null || c.lastHeard > best.lastHeard) best = c;
    }
    return best === null || best.pending[kind] !== null ? null : best;
  }

  #ask(
    c: Conn,
    kind: PushRequestKind,
    nonce: string,
    frame: string | Buffer,
    timeoutMs: number,
  ): Promise<ControllerAnswer> {
    return new Promise<ControllerAnswer>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (c.pending[kind]?.nonce !== nonce) return;
        c.pending[kind] = null;
        this.#noteLate(c, nonce);
        reject(new RefusalError(FAILED[kind], `no answer on the push connection within ${timeoutMs} ms`));
      }, timeoutMs);
      timer.unref();
      c.pending[kind] = { nonce, timer, resolve, reject };
      // a text frame, Buffer or not (ws sends a Buffer as binary unless told)
      c.ws.send(frame, { binary: false });
    });
  }

  /** Closes every connection (1001) and stops listening. Idempotent. */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    if (this.#summaryTimer !== null) clearInterval(this.#summaryTimer);
    this.#summaryTimer = null;
    this.#summary.flush(true);
    this.#stopWatching();
    clearInterval(this.#ticketTimer);
    this.#material.off('revoked-change', this.#onTrustChange);
    this.#material.off('tls-change', this.#onTrustChange);
    this.#material.off('jwks-change', this.#onTrustChange);
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      p.raw.destroy();
    }
    this.#pending.clear();
    for (const c of [...this.#conns.values()]) this.#closeConn(c, CLOSE_GOING_AWAY, 'shutting_down');
    this.#closing = new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections?.();
    }).then(() => {
      this.#wss.close();
      this.#wssFetch.close();
    });
    return this.#closing;
  }

  // ---- before authentication ---------------------------------------------------------------

  #onTcp(raw: net.Socket): void {
    const peer = `${raw.remoteAddress ?? '?'}:${raw.remotePort ?? '?'}`;
    if (this.#closed) {
      raw.destroy();
      return;
    }
    if (this.#pending.size >= this.#o.maxPending) {
      this.#cut.add(raw);
      raw.destroy();
      this.#refusedBeforeAuth(
        'too_many_connections',
        peer,
        `${this.#pending.size} connections already pending authentication`,
      );
      return;
    }
    const key = socketKey(raw);
    const timer = setTimeout(() => {
      if (this.#pending.get(key)?.raw !== raw) return;
      this.#pending.delete(key);
      this.stats.pending = this.#pending.size;
      this.#cut.add(raw);
      raw.destroy();
      this.#refusedBeforeAuth(
        'handshake_timeout',
        peer,
        `no WebSocket upgrade within ${this.#o.handshakeTimeoutMs} ms`,
      );
    }, this.#o.handshakeTimeoutMs);
    timer.unref();
    this.#pending.set(key, { raw, timer, peer });
    this.stats.pending = this.#pending.size;
    raw.once('close', () => this.#unpend(key, raw));
  }

  /** The socket left the pending set: upgraded (no `raw` given) or gone. */
  #unpend(key: string, raw?: net.Socket): void {
    const p = this.#pending.get(key);
    if (p === undefined || (raw !== undefined && p.raw !== raw)) return;
    clearTimeout(p.timer);
    this.#pending.delete(key);
    this.stats.pending = this.#pending.size;
  }

  #onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    const sock = req.socket as tls.TLSSocket;
    const peer = peerOf(sock);
    const auth = this.#authorize(sock);
    let status: number;
    let code: ErrorCode;
    let message: string;
    if (!auth.ok) {
      [status, code, message] = [403, auth.code, auth.message];
    } else if (pathOf(req.url) === WAKE_PATH) {
      [status, code, message] = [426, 'upgrade_required', ERROR_CODES.upgrade_required];
    } else {
      [status, code, message] = [404, 'not_found', 'the only route is GET /v1/wake with a WebSocket upgrade'];
    }
    if (auth.ok) this.#refusedLog(code, peer, message, auth.identity.spiffeId);
    else this.#refusedBeforeAuth(code, peer, message);
    const body = JSON.stringify({ error: { code, message } });
    res.shouldKeepAlive = false;
    res.writeHead(status, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
      'cache-control': 'no-store',
      connection: 'close',
      ...(status === 426 ? { upgrade: 'websocket' } : {}),
    });
    res.end(body);
  }

  #onUpgrade(req: http.IncomingMessage, sock: tls.TLSSocket, head: Buffer): void {
    const peer = peerOf(sock);
    if (this.#closed) {
      abortHandshake(sock, 503, 'shutting_down', ERROR_CODES.shutting_down);
      return;
    }
    const auth = this.#authorize(sock);
    if (!auth.ok) {
      this.#refusedBeforeAuth(auth.code, peer, auth.message, sock.isSessionReused());
      abortHandshake(sock, 403, auth.code, auth.message);
      return;
    }
    if (pathOf(req.url) !== WAKE_PATH) {
      this.#refusedLog('not_found', peer, `no route ${String(req.url).slice(0, 100)}`);
      abortHandshake(sock, 404, 'not_found', 'the only route is /v1/wake');
      return;
    }
    const id = auth.identity;
    if (!this.#conns.has(id.spiffeId) && this.#conns.size >= this.#o.maxAuthenticated) {
      const message = `${this.#conns.size} controller connections are open`;
      this.#refusedLog('too_many_connections', peer, message, id.spiffeId);
      abortHandshake(sock, 503, 'too_many_connections', message);
      return;
    }
    const cert = sock.getPeerX509Certificate();
    if (!cert) {
      abortHandshake(sock, 403, 'no_client_certificate', ERROR_CODES.no_client_certificate);
      return;
    }
    const offers: Conn['offers'] = {
      fetch: offersFeature(req.headers[FEATURES_HEADER], FEATURE_FETCH),
      signal: offersFeature(req.headers[FEATURES_HEADER], FEATURE_SIGNAL),
    };
    (offers.fetch ? this.#wssFetch : this.#wss).handleUpgrade(req, sock, head, (ws: WebSocket) => {
      this.#unpend(socketKey(sock));
      if (this.#closed) {
        ws.close(CLOSE_GOING_AWAY, 'shutting_down');
        return;
      }
      this.#accept(ws, sock, id, cert, peer, offers, sock.isSessionReused());
    });
  }

  /** A verified, unrevoked controller of the trust domain that `--controller-id` accepts. */
  #authorize(sock: tls.TLSSocket): ReturnType<typeof authorizePeer> {
    const auth = authorizePeer(sock, 'controller', this.#material);
    if (auth.ok && !this.#acceptController(auth.identity.name))
      return {
        ok: false,
        code: 'wrong_peer',
        message: `${auth.identity.spiffeId} is not among the controllers this agent accepts (--controller-id)`,
      };
    return auth;
  }

  // ---- authenticated -----------------------------------------------------------------------

  #accept(
    ws: WebSocket,
    sock: tls.TLSSocket,
    identity: CertIdentity,
    cert: X509Certificate,
    peer: string,
    offers: Conn['offers'],
    resumed: boolean,
  ): void {
    const old = this.#conns.get(identity.spiffeId);
    if (old) {
      this.#log.info(
        { code: 'connection_replaced', peer: old.peer, identity: identity.spiffeId },
        'a newer connection from the same controller replaces this one',
      );
      this.#closeConn(old, CLOSE_REPLACED, 'connection_replaced');
    }
    const c: Conn = {
      ws,
      sock,
      identity,
      cert,
      peer,
      badFrames: 0,
      lastHeard: this.#o.now(),
      idleTimer: undefined,
      closing: false,
      offers,
      pending: { fetch: null, signal: null },
      lateNonces: [],
      provenBy: null,
    };
    this.#conns.set(identity.spiffeId, c);
    this.stats.authenticated = this.#conns.size;
    this.stats.accepted++;
    if (resumed) this.stats.resumed++;
    this.#log.info({ peer, identity: identity.spiffeId, resumed }, 'controller connected');
    this.emit('connected', { identity: identity.spiffeId, peer, resumed });
    this.#armIdle(c, this.#o.idleCloseMs);

    ws.on('message', (data: Buffer | ArrayBuffer | Buffer[], isBinary: boolean) =>
      this.#onFrame(c, toBuffer(data), isBinary),
    );
    ws.on('ping', () => {
      c.lastHeard = this.#o.now();
    });
    ws.on('error', (err: Error) => {
      // ws closes the connection itself (1009 over the payload limit, 1007 bad UTF-8, ...)
      this.#log.info(
        { peer, identity: identity.spiffeId, err: err.message, code: (err as { code?: string }).code },
        'wake-up connection error',
      );
    });
    ws.on('close', (code: number, reason: Buffer) => {
      clearTimeout(c.idleTimer);
      this.#failRequests(c, `the push connection closed (${code})`);
      if (this.#conns.get(identity.spiffeId) === c) {
        this.#conns.delete(identity.spiffeId);
        this.stats.authenticated = this.#conns.size;
      }
      this.#log.info(
        { peer, identity: identity.spiffeId, close: code, reason: reason.toString().slice(0, 123) },
        'controller disconnected',
      );
      this.emit('disconnected', { identity: identity.spiffeId, peer, code });
      this.emit('push-change');
    });
    this.emit('push-change');
  }

  #onFrame(c: Conn, buf: Buffer, isBinary: boolean): void {
    if (c.closing) return;
    c.lastHeard = this.#o.now();
    this.stats.frames++;
    if (isBinary) {
      this.#nack(c, null, 'binary_frame');
      return;
    }
    // a wake-up is a compact JWS ("ey..."); a JSON object can only answer a fetch or a signal
    if ((c.offers.fetch || c.offers.signal) && buf[0] === OPEN_BRACE) {
      this.#onAnswerFrame(c, buf);
      return;
    }
    if (buf.length > MAX_WAKE_FRAME_BYTES) {
      this.#nack(c, null, 'too_large');
      return;
    }
    // the answer and the fetch this wake-up starts (sent from onWake, on this connection) leave
    // together: one TLS record and one write, not two, for the agent and the controller alike
    c.sock.cork();
    try {
      this.#onWakeFrame(c, buf);
    } finally {
      c.sock.uncork();
    }
  }

  #onWakeFrame(c: Conn, buf: Buffer): void {
    const text = buf.toString('utf8');
    let claims: WakeClaims;
    try {
      claims = this.#verifier.verify(text, c.identity.spiffeId);
    } catch (err) {
      const code = codeOf(err);
      if (code === undefined) this.#log.error({ err, peer: c.peer }, 'unexpected error verifying a wake-up');
      this.#nack(c, peekJti(text), isNackCode(code) ? code : 'malformed');
      return;
    }
    c.provenBy = verifiedKid(text);
    let fetch: FetchState;
    try {
      fetch = this.#onWake(claims);
    } catch (err) {
      this.#log.error({ err }, 'wake-up handler failed');
      fetch = 'queued';
    }
    this.stats.acks++;
    c.ws.send(encodeAck(claims.jti, this.#lastFetchedGen(), fetch));
    this.#log.info({ peer: c.peer, jti: claims.jti, gen: claims.gen, reason: claims.reason, fetch }, 'wake-up');
  }

  /**
   * The answer to this connection's fetch or signal. The late answer of a request given up on is
   * dropped. Anything else (nothing asked, another nonce) is refused `unexpected_frame` and closes
   * the connection (1008) at once: a metadata frame may be 16 MiB, so none is taken twice for
   * nothing. It is not nacked, since a nack answers a wake-up. A frame that does not decode fails
   * whatever this connection has in flight (`malformed`; the caller asks HTTPS).
   */
  #onAnswerFrame(c: Conn, buf: Buffer): void {
    let a: ControllerAnswer;
    try {
      a = decodeControllerAnswer(buf);
    } catch (err) {
      this.#badFrame(c, 'malformed', (err as Error).message);
      // which request it meant to answer is unknown: both fail, and their real answers are late ones
      for (const kind of ['fetch', 'signal'] as const)
        this.#settle(c, kind, (p) => {
          this.#noteLate(c, p.nonce);
          p.reject(err as Error);
        });
      return;
    }
    const nonce = a.type === 'metadata' ? a.head.nonce : a.nonce;
    const kind: PushRequestKind = a.type === 'metadata' ? 'fetch' : 'signal';
    const p = c.pending[kind];
    if (p === null || p.nonce !== nonce) {
      const late = c.lateNonces.indexOf(nonce);
      if (late >= 0) {
        c.lateNonces.splice(late, 1);
        this.#log.info(
          { peer: c.peer, identity: c.identity.spiffeId, kind },
          'a late answer to a request given up on: dropped',
        );
        return;
      }
      this.#refusedLog(
        'unexpected_frame',
        c.peer,
        `a ${a.type} frame that answers no ${kind} asked on this connection`,
        c.identity.spiffeId,
      );
      this.#closeConn(c, CLOSE_POLICY, 'unexpected_frame');
      return;
    }
    this.#settle(c, kind, (q) => q.resolve(a));
  }

  /** A request given up on: its answer, should it come, is dropped (the newest MAX_LATE_FETCH_ENTRIES). */
  #noteLate(c: Conn, nonce: string): void {
    c.lateNonces.push(nonce);
    if (c.lateNonces.length > MAX_LATE_FETCH_ENTRIES) c.lateNonces.shift();
  }

  /** Ends this connection's `kind` request in flight, if any, with `how`. */
  #settle(c: Conn, kind: PushRequestKind, how: (p: PendingRequest) => void): void {
    const p = c.pending[kind];
    if (p === null) return;
    c.pending[kind] = null;
    clearTimeout(p.timer);
    how(p);
  }

  #failRequests(c: Conn, why: string): void {
    for (const kind of ['fetch', 'signal'] as const)
      this.#settle(c, kind, (p) => p.reject(new RefusalError(FAILED[kind], why)));
  }

  #nack(c: Conn, jti: string | null, code: NackCode): void {
    this.stats.nacks++;
    c.ws.send(encodeNack(jti, code));
    this.#badFrame(c, code, 'refused wake-up');
  }

  /** A bad frame: logged, counted, and the connection closed with 1008 at MAX_BAD_FRAMES. */
  #badFrame(c: Conn, code: ErrorCode, what: string): void {
    c.badFrames++;
    this.#refusedLog(code, c.peer, `${what}: bad frame ${c.badFrames} of ${this.#o.maxBadFrames}`, c.identity.spiffeId);
    if (c.badFrames >= this.#o.maxBadFrames) {
      this.#refusedLog('too_many_bad_frames', c.peer, `${c.badFrames} bad frames`, c.identity.spiffeId);
      this.#closeConn(c, CLOSE_POLICY, 'too_many_bad_frames');
    }
  }

  #armIdle(c: Conn, ms: number): void {
    c.idleTimer = setTimeout(
      () => {
        if (c.closing) return;
        const quiet = this.#o.now() - c.lastHeard;
        if (quiet >= this.#o.idleCloseMs) {
          this.#log.info(
            { code: 'idle_timeout', peer: c.peer, identity: c.identity.spiffeId },
            'closing an idle wake-up connection',
          );
          this.#closeConn(c, CLOSE_NORMAL, 'idle_timeout');
        } else {
          this.#armIdle(c, this.#o.idleCloseMs - quiet);
        }
      },
      Math.max(1, ms),
    );
    c.idleTimer.unref();
  }

  /**
   * Re-checks every live connection: its certificate against the current CA and revocation list
   * (closed 1008 when it fails), and the key that proved it against the signing keys trusted now
   * (revoked.json's kids, the JWKS). A connection whose proving key is no longer trusted is proven
   * no more: its signal in flight fails (the caller asks HTTPS) and no later signal goes there
   * until a wake-up signed by a key still trusted verifies on it.
   */
  #recheckAll(): void {
    const keys = this.#verifier.keys();
    for (const c of [...this.#conns.values()]) {
      const r = authorizeCertificate(c.cert, 'controller', this.#material);
      if (!r.ok) {
        this.#refusedLog(r.code, c.peer, r.message, c.identity.spiffeId);
        this.#closeConn(c, CLOSE_POLICY, r.code);
        continue;
      }
      const kid = c.provenBy;
      if (kid === null || keyTrustedFor(keys, kid, c.identity.spiffeId)) continue;
      c.provenBy = null;
      this.#log.warn(
        { code: 'unknown_kid', kid, peer: c.peer, identity: c.identity.spiffeId },
        'the key that proved this push connection is no longer trusted: no signal goes there until a wake-up signed by a trusted key',
      );
      this.#settle(c, 'signal', (p) => {
        this.#noteLate(c, p.nonce);
        p.reject(
          new RefusalError('push_signal_failed', `the key ${kid} that proved the push connection is no longer trusted`),
        );
      });
    }
  }

  #closeConn(c: Conn, code: number, reason: string): void {
    if (c.closing) return;
    c.closing = true;
    clearTimeout(c.idleTimer);
    this.#failRequests(c, `the push connection was closed (${reason})`);
    if (this.#conns.get(c.identity.spiffeId) === c) {
      this.#conns.delete(c.identity.spiffeId);
      this.stats.authenticated = this.#conns.size;
      this.emit('push-change');
    }
    c.ws.close(code, reason);
    setTimeout(() => c.ws.terminate(), CLOSE_HANDSHAKE_MS).unref();
  }

  /** A refusal of an authenticated controller: one log line each (it has an identity to name). */
  #refusedLog(code: ErrorCode | string, peer: string, message: string, identity?: string): void {
    this.stats.refused++;
    this.#log.warn({ code, peer, ...(identity ? { identity } : {}) }, `refused: ${message}`);
    this.emit('refused', { code, peer });
  }

  /** A refusal anyone could cause: counted, and logged only as a summary (docs/api.md). */
  #refusedBeforeAuth(code: ErrorCode | string, peer: string, message: string, resumed = false): void {
    this.stats.refused++;
    this.stats.refusedBeforeAuth++;
    this.stats.refusedBeforeAuthByCode[code] = (this.stats.refusedBeforeAuthByCode[code] ?? 0) + 1;
    this.#summary.record(code, { peer, message });
    this.#lastRefusalAt = this.#o.now();
    this.#armSummary();
    this.emit('refused', { code, peer, resumed });
  }

  /**
   * What was counted after a code's line is logged when its interval has passed: a timer every
   * interval while refusals come in, stopped by the first flush a whole interval after the
   * last one (that flush logged everything still counted).
   */
  #armSummary(): void {
    if (this.#summaryTimer !== null || this.#closed) return;
    this.#summaryTimer = setInterval(() => {
      this.#summary.flush();
      if (this.#o.now() - this.#lastRefusalAt >= this.#o.refusalLogIntervalMs && this.#summaryTimer !== null) {
        clearInterval(this.#summaryTimer);
        this.#summaryTimer = null;
      }
    }, this.#o.refusalLogIntervalMs);
    this.#summaryTimer.unref();
  }

  #logSummary(line: RefusalLine): void {
    const { peer, message } = line.fields as { peer?: string; message?: string };
    this.#log.warn(
      { code: line.code, count: line.count, peer, beforeAuth: true },
      line.count === 1
        ? `refused: ${message ?? line.code}`
        : `refused: ${line.count} times since the last line (first: ${peer ?? '?'}: ${message ?? line.code})`,
    );
  }
}

/** Writes an HTTP error and closes the socket: the peer reads the code, nothing of it is read. */
function abortHandshake(sock: Duplex, status: number, code: string, message: string): void {
  const body = JSON.stringify({ error: { code, message } });
  const reason =
    status === 403 ? 'Forbidden' : status === 404 ? 'Not Found' : status === 503 ? 'Service Unavailable' : 'Error';
  if (sock.writable) {
    sock.once('finish', () => sock.destroy());
    sock.end(
      `HTTP/1.1 ${status} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\n` +
        `Cache-Control: no-store\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  } else {
    sock.destroy();
  }
}

/** Whether `kid` is a signing key trusted now, and the key of controller `spiffeId`. */
function keyTrustedFor(keys: KeySet, kid: string, spiffeId: string): boolean {
  try {
    checkKeyIssuer(keys, kid, spiffeId);
    return true;
  } catch {
    return false;
  }
}

function pathOf(url: string | undefined): string {
  const u = url ?? '';
  const q = u.indexOf('?');
  return q < 0 ? u : u.slice(0, q);
}

function peerOf(sock: net.Socket | undefined): string {
  return `${sock?.remoteAddress ?? '?'}:${sock?.remotePort ?? '?'}`;
}

/** One key per TCP connection, the same for the raw socket and the TLS socket over it. */
function socketKey(s: net.Socket): string {
  return `${s.remoteAddress ?? ''}|${s.remotePort ?? ''}|${s.localPort ?? ''}`;
}

function toBuffer(data: Buffer | ArrayBuffer | Buffer[]): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
