/**
 * A minimal agent-like wake-up listener for the controller's push tests, built only on
 * `protocol/` and `certs/tls.ts`: TLS 1.3 mutual auth, `authorizePeer` for a controller before the
 * upgrade (403 + code otherwise), wake-ups verified with `WakeVerifier`, each answered with an
 * ack (gen = the wake-up's gen, as if fetched at once) or a nack. Modes for the failures the
 * dialer must survive: `silent` accepts TLS and the upgrade but never answers a frame (and never
 * pongs: a half-open peer), and `stop()`/`listen()` take the port down and up again.
 */
import { EventEmitter, once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino, { type Logger } from 'pino';
import { pkiPaths } from '../../certs/paths.js';
import { initPki, issueCert } from '../../certs/pki.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import https from 'node:https';
import type net from 'node:net';
import type tls from 'node:tls';
import { WebSocketServer, type WebSocket } from 'ws';
import { materialPaths } from '../../certs/paths.js';
import { authorizePeer, PkiMaterial, tlsServerOptions } from '../../certs/tls.js';
import { codeOf } from '../../protocol/errors.js';
import { encodeAck, encodeNack, isNackCode } from '../../protocol/frames.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { KeySet } from '../../protocol/jws.js';
import { MAX_WS_PAYLOAD_BYTES } from '../../protocol/limits.js';
import { peekJti, WakeVerifier, type WakeClaims } from '../../protocol/wake.js';

export type ListenerMode = 'answer' | 'silent';

export interface TestWakeListenerOptions {
  pkiDir: string;
  trustDomain?: string;
  /** The node this listener serves: the wake-ups' audience. */
  node: string;
  /** Present the certificate `agent/<certName>` (default `node`): another name tests wrong_peer. */
  certName?: string;
  mode?: ListenerMode;
  /** 0 (default) picks a free port; give the old port to come back after stop(). */
  port?: number;
}

export interface ReceivedWake {
  claims: WakeClaims;
  /** The `kid` that signed it. */
  kid: string;
  at: number;
}

/**
 * Events: 'wake' (ReceivedWake), 'nack' (code), 'connection' (), 'close' (code: number),
 * 'refused' (code).
 */
export class TestWakeListener extends EventEmitter {
  readonly node: string;
  readonly material: PkiMaterial;
  readonly wakes: ReceivedWake[] = [];
  readonly nacks: string[] = [];
  readonly closeCodes: number[] = [];
  readonly refusals: string[] = [];
  /** Authenticated WebSocket connections accepted so far. */
  connections = 0;
  /** TLS handshakes completed (including ones the client then aborts). */
  tlsConnections = 0;
  mode: ListenerMode;
  port: number;
  readonly #verifier: WakeVerifier;
  readonly #wss: WebSocketServer;
  #server: https.Server | null = null;
  readonly #sockets = new Set<net.Socket>();
  readonly #clients = new Set<WebSocket>();

  private constructor(opts: TestWakeListenerOptions) {
    super();
    const td = opts.trustDomain ?? 'herald.local';
    this.node = opts.node;
    this.mode = opts.mode ?? 'answer';
    this.port = opts.port ?? 0;
    this.material = new PkiMaterial({ ...materialPaths(opts.pkiDir, 'agent', opts.certName ?? opts.node), trustDomain: td, watch: false });
    const keys = new KeySet(this.material.current().jwks, this.material.current().revokedKids);
    this.#verifier = new WakeVerifier({ audience: spiffeIdOf(td, 'agent', opts.node), keys: () => keys, startedAtS: Date.now() / 1000 });
    this.#wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: MAX_WS_PAYLOAD_BYTES, autoPong: false });
  }

  static async start(opts: TestWakeListenerOptions): Promise<TestWakeListener> {
    const l = new TestWakeListener(opts);
    await l.listen();
    return l;
  }

  get url(): string {
    return `wss://127.0.0.1:${this.port}/v1/wake`;
  }

  /** Starts listening (again, on the same port after stop()). */
  async listen(): Promise<void> {
    const server = https.createServer(tlsServerOptions(this.material));
    server.on('connection', (s: net.Socket) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
    server.on('secureConnection', () => this.tlsConnections++);
    server.on('tlsClientError', () => {});
    server.on('request', (_req, res) => {
      res.writeHead(426, { 'content-type': 'application/json' }).end('{"error":{"code":"upgrade_required"}}');
    });
    server.on('upgrade', (req, socket, head) => this.#upgrade(req, socket as tls.TLSSocket, head));
    server.listen(this.port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as net.AddressInfo).port;
    this.#server = server;
  }

  /** Takes the port down: no new connections, and every open one is destroyed. */
  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    for (const ws of this.#clients) ws.terminate();
    for (const s of this.#sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Destroys every open WebSocket without a close frame (the dialer sees a lost connection). */
  dropConnections(): void {
    for (const ws of this.#clients) ws.terminate();
  }

  async close(): Promise<void> {
    await this.stop();
    this.#wss.close();
    this.material.close();
  }

  /** Resolves with the first event `event` whose arguments satisfy `pred`, or rejects after `timeoutMs`. */
  waitFor<T = unknown>(event: string, pred: (arg: T) => boolean = () => true, timeoutMs = 5_000): Promise<T> {
    return waitForEvent<T>(this, event, pred, timeoutMs);
  }

  #upgrade(req: import('node:http').IncomingMessage, socket: tls.TLSSocket, head: Buffer): void {
    const auth = authorizePeer(socket, 'controller', this.material);
    if (!auth.ok) {
      this.refusals.push(auth.code);
      this.emit('refused', auth.code);
      const body = JSON.stringify({ error: { code: auth.code, message: auth.message } });
      socket.end(`HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      return;
    }
    const peer = auth.identity.spiffeId;
    this.#wss.handleUpgrade(req, socket, head, (ws) => {
      this.connections++;
      this.#clients.add(ws);
      // a half-open peer does not pong either
      ws.on('ping', (d) => {
        if (this.mode !== 'silent') ws.pong(d);
      });
      ws.on('close', (code) => {
        this.#clients.delete(ws);
        this.closeCodes.push(code);
        this.emit('close', code);
      });
      ws.on('error', () => {});
      ws.on('message', (data, isBinary) => {
        if (this.mode === 'silent') return;
        const frame = isBinary ? '' : (data as Buffer).toString('utf8');
        try {
          const claims = this.#verifier.verify(frame, peer);
          const kid = (JSON.parse(Buffer.from(frame.split('.')[0]!, 'base64url').toString()) as { kid: string }).kid;
          const w = { claims, kid, at: Date.now() };
          this.wakes.push(w);
          ws.send(encodeAck(claims.jti, claims.gen, 'started'));
          this.emit('wake', w);
        } catch (err) {
          const code = codeOf(err);
          const nack = isNackCode(code) ? code : 'malformed';
          this.nacks.push(nack);
          ws.send(encodeNack(peekJti(frame), nack));
          this.emit('nack', nack);
        }
      });
      this.emit('connection');
    });
  }
}

/** The first `event` on `emitter` whose first argument satisfies `pred`, within `timeoutMs`. */
export function waitForEvent<T = unknown>(emitter: EventEmitter, event: string, pred: (arg: T) => boolean = () => true, timeoutMs = 5_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.off(event, on);
      reject(new Error(`no matching '${event}' event within ${timeoutMs} ms`));
    }, timeoutMs);
    const on = (arg: T): void => {
      if (!pred(arg)) return;
      clearTimeout(timer);
      emitter.off(event, on);
      resolve(arg);
    };
    emitter.on(event, on);
  });
}

// ---- a PKI for push tests ----------------------------------------------------------------------

/*
 * Made by `certs/` in a temporary directory: the CA, the controller's certificate and signing
 * key, and agent certificates for the nodes asked for (one RSA key shared by all of them, so a
 * test does not spend seconds making keys).
 */
export const TD = 'herald.local';
export const CONTROLLER_ID = `spiffe://${TD}/controller/controller`;

export interface PushPki {
  dir: string;
  signingJwk: Ed25519PrivateJwk;
  signer: () => Signer;
  controllerMaterial: () => PkiMaterial;
  logger: Logger;
  cleanup: () => void;
}

export async function makePushPki(nodes: string[]): Promise<PushPki> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-push-'));
  const init = await initPki({ dir, trustDomain: TD });
  const keyPem = fs.readFileSync(init.controller.keyPath, 'utf8');
  for (const n of nodes) await issueCert({ dir, role: 'agent', name: n, ip: ['127.0.0.1'], keyPem });
  const signingJwk = JSON.parse(fs.readFileSync(pkiPaths(dir).signingJwk, 'utf8')) as Ed25519PrivateJwk;
  const materials: PkiMaterial[] = [];
  return {
    dir,
    signingJwk,
    signer: () => new Signer(signingJwk),
    controllerMaterial: () => {
      const m = new PkiMaterial({ ...materialPaths(dir, 'controller', 'controller'), trustDomain: TD, watch: false });
      materials.push(m);
      return m;
    },
    logger: pino({ level: process.env.HERALD_TEST_LOG ?? 'silent' }),
    cleanup: () => {
      for (const m of materials) m.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
