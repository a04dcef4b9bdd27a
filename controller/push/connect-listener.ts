/**
 * The controller's listener for dialled-in push connections (docs/protocol.md, "Dialled-in
 * connections"): `wss://<--connect-listen>/v1/connect`, TLS 1.3, mutual auth. An agent that
 * cannot be dialled (behind NAT) opens its push connection here and keeps it; from the upgrade
 * on, the dialer (controller/push/dialer.ts `attach`) holds it as that node's push connection,
 * with the frames of a dialled one.
 *
 * It refuses early and cheaply, as the agent's listener does: a socket is counted from the TCP
 * level on and destroyed when its TLS handshake plus upgrade take over
 * CONNECT_HANDSHAKE_TIMEOUT_MS or MAX_CONNECT_PENDING_CONNECTIONS are pending already; a peer
 * that is not a valid, unrevoked `agent/<node>` of the trust domain (`authorizePeer`, role agent:
 * chain, dates, revocation, identity floors, EKUs) gets HTTP 403 with a code before the upgrade,
 * so no frame is ever read from it. The upgrade's response offers what a dialling controller
 * offers in its request (`Herald-Features: fetch, signal`).
 *
 * In a push worker it listens on nothing: the main process accepts each TCP connection without
 * reading it and hands the socket over (`accept`, controller/push/pool.ts); with no workers it
 * listens itself (`listen`). Either way the TLS, and so the connection, lives where it is served.
 */
import type https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import type { Logger } from 'pino';
import { WebSocketServer, type WebSocket } from 'ws';
import { authorizePeer, chainSerialsOf, refusalCodeOf } from '../../certs/tls.js';
import type { PkiMaterial } from '../../certs/tls.js';
import {
  abortHandshake,
  pathOf,
  peerOf,
  PendingSockets,
  refuseRequest,
  upgradeServer,
} from '../../certs/upgrade-gate.js';
import { ERROR_CODES, type ErrorCode } from '../../protocol/errors.js';
import { FEATURE_FETCH, FEATURE_SIGNAL, FEATURES_HEADER } from '../../protocol/frames.js';
import {
  CONNECT_HANDSHAKE_TIMEOUT_MS,
  MAX_CONNECT_CONNECTIONS,
  MAX_CONNECT_PENDING_CONNECTIONS,
  MAX_WS_PAYLOAD_BYTES,
} from '../../protocol/limits.js';
import { RefusalLog } from '../refusal-log.js';
import type { PushMetricsSink } from './metrics.js';
import type { DialledIn } from './types.js';

/** The one route: a WebSocket upgrade. */
export const CONNECT_PATH = '/v1/connect';

export interface ConnectListenerOptions {
  /** The controller's TLS material (its certificate, the CA, revoked.json and the identity floors), followed on change. */
  material: PkiMaterial;
  logger: Logger;
  /** Where refusals are counted (`connectRefused`). */
  metrics: PushMetricsSink;
  /** An authorized, upgraded connection: the dialer holds it from now on. */
  onConnection: (c: DialledIn) => void;
  /** The dialled-in connections held now (MAX_CONNECT_CONNECTIONS caps them). */
  held: () => number;
  /** Default CONNECT_HANDSHAKE_TIMEOUT_MS. */
  handshakeTimeoutMs?: number;
  /** Default MAX_CONNECT_PENDING_CONNECTIONS. */
  maxPending?: number;
  /** Default MAX_CONNECT_CONNECTIONS. */
  maxConnections?: number;
}

/** The Herald-Features header of the upgrade's response: what the controller answers on this connection. */
const FEATURES_LINE = `${FEATURES_HEADER}: ${FEATURE_FETCH}, ${FEATURE_SIGNAL}`;

export class ConnectListener {
  readonly #o: Required<Omit<ConnectListenerOptions, 'material' | 'logger' | 'metrics' | 'onConnection' | 'held'>>;
  readonly #material: PkiMaterial;
  readonly #log: Logger;
  readonly #metrics: PushMetricsSink;
  readonly #onConnection: (c: DialledIn) => void;
  readonly #held: () => number;
  readonly #server: https.Server;
  readonly #wss: WebSocketServer;
  readonly #refusals: RefusalLog;
  readonly #pending: PendingSockets;
  /** Stops the server's ticket-key timer and its following of the certificate. */
  readonly #releaseServer: () => void;
  /** No new connection is taken (a drain, or closed). */
  #stopped = false;
  #closing: Promise<void> | null = null;

  constructor(opts: ConnectListenerOptions) {
    this.#o = {
      handshakeTimeoutMs: opts.handshakeTimeoutMs ?? CONNECT_HANDSHAKE_TIMEOUT_MS,
      maxPending: opts.maxPending ?? MAX_CONNECT_PENDING_CONNECTIONS,
      maxConnections: opts.maxConnections ?? MAX_CONNECT_CONNECTIONS,
    };
    this.#material = opts.material;
    this.#log = opts.logger;
    this.#metrics = opts.metrics;
    this.#onConnection = opts.onConnection;
    this.#held = opts.held;
    this.#refusals = new RefusalLog(this.#log);
    // sessions resume with this process (the agent's client keeps them), under a key of its own
    const made = upgradeServer(this.#material, this.#o.handshakeTimeoutMs);
    this.#server = made.server;
    this.#releaseServer = made.release;
    this.#pending = new PendingSockets({
      maxPending: this.#o.maxPending,
      handshakeTimeoutMs: this.#o.handshakeTimeoutMs,
      onCut: (code, peer) => this.#refusedBeforeAuth(code, peer),
    });
    // the same WebSocket settings as the dialer's: no compression, its message limit
    this.#wss = new WebSocketServer({
      noServer: true,
      perMessageDeflate: false,
      maxPayload: MAX_WS_PAYLOAD_BYTES,
      clientTracking: false,
    });
    this.#wss.on('headers', (headers: string[]) => headers.push(FEATURES_LINE));

    this.#server.on('connection', (raw: net.Socket) => this.#onTcp(raw));
    this.#server.on('tlsClientError', (err: Error, sock: tls.TLSSocket) => {
      if (this.#pending.wasCut(sock)) return;
      this.#refusedBeforeAuth(refusalCodeOf(err) ?? 'tls_handshake_failed', peerOf(sock));
    });
    this.#server.on('clientError', (_err: Error, sock: Duplex) => sock.destroy());
    this.#server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => this.#onRequest(req, res));
    this.#server.on('upgrade', (req: http.IncomingMessage, sock: Duplex, head: Buffer) =>
      this.#onUpgrade(req, sock as tls.TLSSocket, head),
    );
  }

  /** Listens on `host:port` itself (no push workers). @throws the listen error (EADDRINUSE, ...) */
  listen(host: string, port: number): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => reject(err);
      this.#server.once('error', onError);
      this.#server.listen(port, host, () => {
        this.#server.off('error', onError);
        this.#server.on('error', (err) => this.#log.error({ err }, 'connect listener error'));
        resolve(this.#server.address() as AddressInfo);
      });
    });
  }

  /** Serves a TCP connection the main process accepted (paused: not a byte read there). */
  accept(raw: net.Socket): void {
    this.#server.emit('connection', raw);
    raw.resume();
  }

  /** Sockets pending authentication now. */
  get pendingConnections(): number {
    return this.#pending.size;
  }

  /**
   * Takes no new connection from now on: pending ones are destroyed, new ones refused (a drain;
   * `listen`'s port is closed). The connections held are the dialer's. Idempotent.
   */
  stopAccepting(): void {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#pending.dropAll();
    if (this.#server.listening) this.#server.close();
  }

  /** Stops accepting and releases the listener (its held connections are the dialer's to close). Idempotent. */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.stopAccepting();
    this.#releaseServer();
    this.#refusals.close();
    this.#closing = new Promise<void>((resolve) => {
      this.#wss.close(() => resolve());
    });
    return this.#closing;
  }

  // ---- before authentication ---------------------------------------------------------------

  #onTcp(raw: net.Socket): void {
    if (!this.#stopped) {
      this.#pending.admit(raw);
      return;
    }
    this.#pending.drop(raw);
    this.#refusedBeforeAuth('shutting_down', peerOf(raw));
  }

  /** A request without an upgrade: 403 to whoever is not an agent, else 426 on the route and 404 elsewhere. */
  #onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    const sock = req.socket as tls.TLSSocket;
    const auth = authorizePeer(sock, 'agent', this.#material);
    let status: number;
    let code: ErrorCode;
    let message: string;
    if (!auth.ok) [status, code, message] = [403, auth.code, auth.message];
    else if (pathOf(req.url) === CONNECT_PATH)
      [status, code, message] = [426, 'upgrade_required', ERROR_CODES.upgrade_required];
    else [status, code, message] = [404, 'not_found', `the only route is GET ${CONNECT_PATH} with a WebSocket upgrade`];
    this.#refused(code, status, peerOf(sock), message, auth.ok ? auth.identity.spiffeId : undefined);
    refuseRequest(res, status, code, message);
  }

  #onUpgrade(req: http.IncomingMessage, sock: tls.TLSSocket, head: Buffer): void {
    const peer = peerOf(sock);
    if (this.#stopped) {
      this.#refused('shutting_down', 503, peer, 'the controller is stopping');
      abortHandshake(sock, 503, 'shutting_down', 'the controller is stopping');
      return;
    }
    const auth = authorizePeer(sock, 'agent', this.#material);
    if (!auth.ok) {
      this.#refused(auth.code, 403, peer, auth.message);
      abortHandshake(sock, 403, auth.code, auth.message);
      return;
    }
    const id = auth.identity;
    if (pathOf(req.url) !== CONNECT_PATH) {
      this.#refused('not_found', 404, peer, `no route ${String(req.url).slice(0, 100)}`, id.spiffeId);
      abortHandshake(sock, 404, 'not_found', `the only route is ${CONNECT_PATH}`);
      return;
    }
    if (this.#held() >= this.#o.maxConnections) {
      const message = `${this.#held()} dialled-in connections are held here`;
      this.#refused('too_many_connections', 503, peer, message, id.spiffeId);
      abortHandshake(sock, 503, 'too_many_connections', message);
      return;
    }
    // after authorizePeer's read of the presented chain, this is the leaf alone; the issuer's
    // serial comes from the issuers that read remembered
    const cert = sock.getPeerX509Certificate();
    if (!cert) {
      abortHandshake(sock, 403, 'no_client_certificate', ERROR_CODES.no_client_certificate);
      return;
    }
    const serials = chainSerialsOf(cert, this.#material);
    this.#wss.handleUpgrade(req, sock, head, (ws: WebSocket) => {
      this.#pending.upgraded(sock);
      if (this.#stopped) {
        ws.close(1012, 'shutting_down');
        return;
      }
      this.#onConnection({
        node: id.name,
        ws,
        peer,
        serials,
        notBeforeMs: id.validFrom.getTime(),
        notAfterMs: id.validTo.getTime(),
      });
    });
  }

  /** Before authentication anyone can cause these: counted, and logged as a summary per code. */
  #refusedBeforeAuth(code: ErrorCode, peer: string): void {
    this.#metrics.connectRefused(code);
    this.#refusals.record(code, { peer, route: CONNECT_PATH });
  }

  /** A refusal with an HTTP answer: counted, and logged (summarised per code, or per code and identity). */
  #refused(code: ErrorCode, status: number, peer: string, message: string, spiffeId?: string): void {
    this.#metrics.connectRefused(code);
    this.#refusals.refused(code, message, { status, peer, method: 'GET', route: CONNECT_PATH }, spiffeId);
  }
}
