/**
 * A stand-in for a controller's connect listener (`wss://host:port/v1/connect`, docs/dial-out.md),
 * for the tests of the agent dialling out: TLS 1.3 with a certificate from the test PKI (a
 * controller's, or any other a test wants refused), the client certificate required and
 * authorized by the real `authorizePeer` as `agent/<node>` (403 `{"error":{"code"}}` otherwise),
 * `Herald-Features` on the upgrade response, and a signed `ping` wake-up right after the upgrade,
 * as the contract says a controller does. It records what the agent sends (acks, nacks, fetches,
 * signals) and lets a test send wake-ups and answers. The controller itself is not re-implemented:
 * no store, no rate limits, no push state.
 */
import { EventEmitter, once } from 'node:events';
import https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import { WebSocketServer, type WebSocket } from 'ws';
import type { CertIdentity } from '../../certs/identity.js';
import { authorizePeer, tlsServerOptions, type PkiMaterial } from '../../certs/tls.js';
import {
  decodeAgentFrame,
  FEATURES_HEADER,
  type AnswerFrame,
  type FetchFrame,
  type SignalFrame,
} from '../../protocol/frames.js';
import type { Signer } from '../../protocol/jws.js';
import { signWake } from '../../protocol/wake.js';

export interface ConnectStandInOptions {
  /** The TLS material served (a controller's, or another to be refused). */
  material: PkiMaterial;
  /** Signs the wake-ups this stand-in sends (the controller's signing key). */
  signer: Signer;
  /** The wake-ups' `iss` (the controller's SPIFFE id). */
  issuer: string;
  /** The wake-ups' `aud` (the agent's SPIFFE id). */
  audience: string;
  /** `Herald-Features` on the upgrade response (default `fetch, signal`; null: none). */
  features?: string | null;
  /** The generation of the ping wake-up sent on every connect (default 1; null: no ping). */
  pingGen?: number | null;
  /** Refuse every upgrade with this status and code (after authorization). */
  refuse?: { status: number; code: string };
}

/** One agent connection: what the agent sent on it, in order. */
export class StandInConnection extends EventEmitter {
  readonly ws: WebSocket;
  /** The agent's certificate as authorized at the upgrade. */
  readonly identity: CertIdentity;
  readonly answers: AnswerFrame[] = [];
  readonly fetches: FetchFrame[] = [];
  readonly signals: SignalFrame[] = [];
  readonly closed: Promise<[number, string]>;
  #taken = { answers: 0, fetches: 0 };

  constructor(ws: WebSocket, identity: CertIdentity) {
    super();
    this.ws = ws;
    this.identity = identity;
    this.closed = once(ws, 'close').then(([code, reason]) => [code as number, String(reason)]);
    ws.on('error', () => undefined);
    ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d);
      if (f.type === 'fetch') this.fetches.push(f);
      else if (f.type === 'signal') this.signals.push(f);
      else this.answers.push(f);
      this.emit('frame', f);
    });
  }

  /** The next answer (ack or nack) not yet taken, waiting for it. */
  nextAnswer(): Promise<AnswerFrame> {
    return this.#next('answers', this.answers);
  }

  /** The next fetch frame not yet taken, waiting for it. */
  nextFetch(): Promise<FetchFrame> {
    return this.#next('fetches', this.fetches);
  }

  /** Sends a text frame (a wake-up, or an answer's bytes). */
  send(frame: string | Buffer): void {
    this.ws.send(frame, { binary: false });
  }

  async #next<T>(kind: 'answers' | 'fetches', list: T[]): Promise<T> {
    const i = this.#taken[kind]++;
    while (list.length <= i) await once(this, 'frame');
    return list[i]!;
  }
}

/** Events: 'connection' (StandInConnection), 'refused' (code). */
export class ConnectStandIn extends EventEmitter {
  readonly connections: StandInConnection[] = [];
  readonly refusals: string[] = [];
  /** TCP connections accepted (a dial refused in TLS counts too). */
  tcpConnections = 0;
  port = 0;
  readonly #o: ConnectStandInOptions;
  readonly #server: https.Server;
  readonly #wss: WebSocketServer;
  readonly #sockets = new Set<net.Socket>();

  private constructor(o: ConnectStandInOptions) {
    super();
    this.#o = o;
    this.#server = https.createServer(tlsServerOptions(o.material));
    this.#wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, clientTracking: false });
    const features = o.features === undefined ? 'fetch, signal' : o.features;
    if (features !== null)
      this.#wss.on('headers', (headers: string[]) => headers.push(`${FEATURES_HEADER}: ${features}`));
    this.#server.on('connection', (s: net.Socket) => {
      this.tcpConnections++;
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
    this.#server.on('tlsClientError', () => undefined);
    this.#server.on('upgrade', (req: http.IncomingMessage, sock: Duplex, head: Buffer) =>
      this.#onUpgrade(req, sock as tls.TLSSocket, head),
    );
  }

  static async start(o: ConnectStandInOptions): Promise<ConnectStandIn> {
    const s = new ConnectStandIn(o);
    s.#server.listen(0, '127.0.0.1');
    await once(s.#server, 'listening');
    s.port = (s.#server.address() as net.AddressInfo).port;
    return s;
  }

  get url(): string {
    return `wss://127.0.0.1:${this.port}/v1/connect`;
  }

  /** The `index`th connection accepted (default the first), waiting for it. */
  async connection(index = 0): Promise<StandInConnection> {
    while (this.connections.length <= index) await once(this, 'connection');
    return this.connections[index]!;
  }

  /** A wake-up signed for the agent at `gen`. */
  wake(gen: number, reason: 'deployment' | 'restart' | 'ping' = 'deployment'): string {
    return signWake(this.#o.signer, {
      iss: this.#o.issuer,
      aud: this.#o.audience,
      gen,
      reason,
      nowS: Date.now() / 1000,
    });
  }

  /** Stops listening and cuts every connection. Idempotent. */
  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #onUpgrade(req: http.IncomingMessage, sock: tls.TLSSocket, head: Buffer): void {
    const auth = authorizePeer(sock, 'agent', this.#o.material);
    const refusal = !auth.ok
      ? { status: 403, code: auth.code }
      : req.url !== '/v1/connect'
        ? { status: 404, code: 'not_found' }
        : this.#o.refuse;
    if (refusal !== undefined) {
      this.refusals.push(refusal.code);
      this.emit('refused', refusal.code);
      const body = JSON.stringify({ error: { code: refusal.code, message: refusal.code } });
      sock.end(
        `HTTP/1.1 ${refusal.status} Refused\r\nConnection: close\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      return;
    }
    this.#wss.handleUpgrade(req, sock, head, (ws) => {
      const c = new StandInConnection(ws, (auth as Extract<typeof auth, { ok: true }>).identity);
      this.connections.push(c);
      const gen = this.#o.pingGen === undefined ? 1 : this.#o.pingGen;
      if (gen !== null) c.send(this.wake(gen, 'ping'));
      this.emit('connection', c);
    });
  }
}
