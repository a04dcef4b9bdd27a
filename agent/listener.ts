/**
 * The agent's wake-up listener (docs/protocol.md): `wss://host:port/v1/wake`, TLS 1.3, mutual auth.
 *
 * It refuses early and cheaply: a socket is counted from the TCP level on and destroyed when
 * its TLS handshake plus WebSocket upgrade take too long or too many are pending; a peer that is
 * not a verified, unrevoked controller gets HTTP 403 with a code before the upgrade, so no frame
 * is ever read from it. After the upgrade every frame is answered at once (ack or nack), and the
 * only effect a valid wake-up can have is a coalesced fetch.
 *
 * Once a WebSocket exists, everything that happens on it (frames, wake-up verification, acks,
 * fetches and signals over the connection, the proof a signal needs, close handling) is
 * agent/push-connections.ts's, the same for the connection the agent dials out itself
 * (agent/dialer.ts). The listener hands each accepted connection over with what the controller
 * offered on its upgrade request (`Herald-Features: fetch, signal`).
 */
import { EventEmitter } from 'node:events';
import type https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import type { X509Certificate } from 'node:crypto';
import { createRequire } from 'node:module';
import type { WebSocket, WebSocketServer as WebSocketServerType } from 'ws';
import { ERROR_CODES, type ErrorCode } from '../protocol/errors.js';
import {
  FEATURE_FETCH,
  FEATURE_SIGNAL,
  FEATURES_HEADER,
  offersFeature,
  type FetchState,
  type SignalledFrame,
} from '../protocol/frames.js';
import {
  AGENT_IDLE_CLOSE_MS,
  LISTENER_HANDSHAKE_TIMEOUT_MS,
  MAX_AUTHENTICATED_CONNECTIONS,
  MAX_BAD_FRAMES,
  MAX_PENDING_CONNECTIONS,
  MAX_PUSH_METADATA_FRAME_BYTES,
  MAX_WS_PAYLOAD_BYTES,
  PUSH_HEALTHY_WINDOW_MS,
  REFUSAL_LOG_INTERVAL_MS,
} from '../protocol/limits.js';
import { RefusalSummary, type RefusalLine } from '../protocol/refusal-summary.js';
import type { WakeClaims, WakeVerifier } from '../protocol/wake.js';
import type { CertIdentity } from '../certs/identity.js';
import { authorizePeer, refusalCodeOf, type Logger, type PkiMaterial } from '../certs/tls.js';
import { abortHandshake, pathOf, peerOf, PendingSockets, refuseRequest, upgradeServer } from '../certs/upgrade-gate.js';
import {
  CLOSE_GOING_AWAY,
  PushConnections,
  type PushConnection,
  type PushConnectionStats,
  type PushFetchAnswer,
  type PushPeer,
} from './push-connections.js';

export {
  CLOSE_GOING_AWAY,
  CLOSE_NORMAL,
  CLOSE_POLICY,
  CLOSE_REPLACED,
  type PushFetchAnswer,
} from './push-connections.js';

// `ws` is CommonJS: require() it rather than import it. An ESM import of a CommonJS package
// runs Node's export lexer over it and keeps a module wrapper; measured here, that is ~3 MB of
// the agent's idle RSS for ws alone.
const { WebSocketServer } = createRequire(import.meta.url)('ws') as typeof import('ws');

export const WAKE_PATH = '/v1/wake';

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

/** Counters, for tests and metrics. */
export interface ListenerStats extends PushConnectionStats {
  pending: number;
  /** Authenticated connections accepted so far, and how many of them resumed a TLS session (no certificate exchange). */
  accepted: number;
  resumed: number;
  /**
   * Refusals before authentication (a TCP connect over the pending cap, a handshake timeout, a
   * failed TLS handshake, a 403): anyone can cause these, so they are counted here and logged as
   * a summary (at most one line per code per REFUSAL_LOG_INTERVAL_MS), never one line each.
   */
  refusedBeforeAuth: number;
  /** The same, by code. */
  refusedBeforeAuthByCode: Record<string, number>;
}

/**
 * Events: `'push-change'` () when a connection opened or closed (push health may have changed);
 * `'connected'` ({ identity, peer, resumed }) when a controller's WebSocket is accepted;
 * `'disconnected'` ({ identity, peer, code }) when one closed, with the close code it saw;
 * `'refused'` ({ code, peer, resumed? }) for every refusal, also logged (`resumed`: a refused
 *   upgrade's TLS session was resumed). The events of accepted connections are their
 *   `PushConnections`' (agent/push-connections.ts), passed on.
 */
export class WakeListener extends EventEmitter {
  readonly #o: Required<
    Omit<WakeListenerOptions, 'material' | 'verifier' | 'onWake' | 'lastFetchedGen' | 'log' | 'acceptController'>
  >;
  readonly #acceptController: (name: string) => boolean;
  readonly #material: PkiMaterial;
  readonly #log: Logger;
  readonly #server: https.Server;
  /** Stops the server's ticket-key timer and its following of the certificate. */
  readonly #releaseServer: () => void;
  readonly #wss: WebSocketServerType;
  /** For connections whose controller answers fetches: the message limit fits a metadata frame. */
  readonly #wssFetch: WebSocketServerType;
  readonly #pending: PendingSockets;
  /** Authenticated connections, one per controller identity: what happens on them is theirs. */
  readonly #push: PushConnections;
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
    this.#log = opts.log;
    this.#push = new PushConnections({
      material: this.#material,
      verifier: opts.verifier,
      onWake: opts.onWake,
      lastFetchedGen: opts.lastFetchedGen,
      log: opts.log,
      stats: this.stats,
      idleCloseMs: this.#o.idleCloseMs,
      maxBadFrames: this.#o.maxBadFrames,
      healthyWindowMs: this.#o.healthyWindowMs,
      now: this.#o.now,
    });
    for (const event of ['push-change', 'disconnected', 'refused'])
      this.#push.on(event, (...args: unknown[]) => this.emit(event, ...args));
    this.#summary = new RefusalSummary((line) => this.#logSummary(line), this.#o.now, this.#o.refusalLogIntervalMs);

    // Session tickets the controller resumes its push connections with, after its restart too
    // (certs/session-file.ts), under this process's key, kept across a renewal of our
    // certificate and replaced every PUSH_TLS_SESSION_LIFETIME_S (certs/upgrade-gate.ts).
    // A resumed connection is authorized as a full one (#authorize: CA, dates, revocation).
    const made = upgradeServer(this.#material, this.#o.handshakeTimeoutMs);
    this.#server = made.server;
    this.#releaseServer = made.release;
    this.#pending = new PendingSockets({
      maxPending: this.#o.maxPending,
      handshakeTimeoutMs: this.#o.handshakeTimeoutMs,
      onCut: (code, peer, message) => this.#refusedBeforeAuth(code, peer, message),
      onSize: (size) => {
        this.stats.pending = size;
      },
    });
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

    this.#server.on('connection', (raw: net.Socket) => this.#onTcp(raw));
    this.#server.on('tlsClientError', (err: Error, sock: tls.TLSSocket) => {
      // a socket this listener cut itself (over the pending cap, handshake timeout) was refused
      // and counted already; its TLS layer reports the cut as a hang-up
      if (this.#pending.wasCut(sock)) return;
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
    return this.#push.size;
  }

  /** Sockets counted as pending authentication now. */
  get pendingConnections(): number {
    return this.#pending.size;
  }

  /** Push is healthy: a connection is open and a ping or frame came within the window. */
  isPushHealthy(): boolean {
    return this.#push.isPushHealthy();
  }

  /** `PushConnections.fetchOverPush` on this listener's connections. */
  fetchOverPush(nonce: string, ifNoneMatch: string | undefined, timeoutMs: number): Promise<PushFetchAnswer> | null {
    return this.#push.fetchOverPush(nonce, ifNoneMatch, timeoutMs);
  }

  /** `PushConnections.signalOverPush` on this listener's connections. */
  signalOverPush(
    nonce: string,
    deployment: string,
    revision: number,
    body: Uint8Array,
    timeoutMs: number,
  ): Promise<SignalledFrame> | null {
    return this.#push.signalOverPush(nonce, deployment, revision, body, timeoutMs);
  }

  /** Closes every connection (1001) and stops listening. Idempotent. */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    if (this.#summaryTimer !== null) clearInterval(this.#summaryTimer);
    this.#summaryTimer = null;
    this.#summary.flush(true);
    this.#releaseServer();
    this.#pending.dropAll();
    this.#push.closeAll();
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
    if (this.#closed) raw.destroy();
    else this.#pending.admit(raw);
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
    refuseRequest(res, status, code, message);
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
    if (!this.#push.has(id.spiffeId) && this.#push.size >= this.#o.maxAuthenticated) {
      const message = `${this.#push.size} controller connections are open`;
      this.#refusedLog('too_many_connections', peer, message, id.spiffeId);
      abortHandshake(sock, 503, 'too_many_connections', message);
      return;
    }
    const cert = sock.getPeerX509Certificate();
    if (!cert) {
      abortHandshake(sock, 403, 'no_client_certificate', ERROR_CODES.no_client_certificate);
      return;
    }
    const offers: PushPeer['offers'] = {
      fetch: offersFeature(req.headers[FEATURES_HEADER], FEATURE_FETCH),
      signal: offersFeature(req.headers[FEATURES_HEADER], FEATURE_SIGNAL),
    };
    (offers.fetch ? this.#wssFetch : this.#wss).handleUpgrade(req, sock, head, (ws: WebSocket) => {
      this.#pending.upgraded(sock);
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
    offers: PushPeer['offers'],
    resumed: boolean,
  ): PushConnection {
    const c = this.#push.add({ ws, sock, identity, cert, peer, offers });
    this.stats.accepted++;
    if (resumed) this.stats.resumed++;
    this.#log.info({ peer, identity: identity.spiffeId, resumed }, 'controller connected');
    this.emit('connected', { identity: identity.spiffeId, peer, resumed });
    return c;
  }

  /** A refusal of an authenticated controller: one log line each (it has an identity to name). */
  #refusedLog(code: ErrorCode | string, peer: string, message: string, identity?: string): void {
    this.#push.refused(code, peer, message, identity);
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

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
