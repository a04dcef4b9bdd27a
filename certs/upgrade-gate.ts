/**
 * What a mutually authenticated TLS WebSocket listener does before it knows who is calling: the
 * agent's wake-up listener (agent/listener.ts) and the controller's listener for dialled-in
 * agents (controller/push/connect-listener.ts) both take their TLS server and their pending set
 * from here, so the two ports refuse strangers in the same way (SECURITY.md).
 *
 * - `upgradeServer`: an HTTPS server whose TLS session tickets are resumable with this process
 *   and keyed by a key of its own, replaced every PUSH_TLS_SESSION_LIFETIME_S (a stolen session
 *   cannot chain for as long as the process lives; a resumed connection is authorized as a full
 *   one), that follows a renewed certificate, and whose HTTP timeouts only back up the pending
 *   set's own timer.
 * - `PendingSockets`: every TCP connection is counted from its first byte on and destroyed when
 *   its TLS handshake plus WebSocket upgrade take longer than the handshake timeout, or when too
 *   many are pending already. A socket it cut was refused once, and its TLS layer's hang-up is
 *   not counted again (`wasCut`).
 * - `abortHandshake`: an HTTP refusal with a code, written before any WebSocket frame is read.
 */
import { randomBytes } from 'node:crypto';
import https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import {
  LISTENER_HTTP_CHECK_INTERVAL_MS,
  PUSH_TLS_SESSION_LIFETIME_S,
  TLS_TICKET_KEY_BYTES,
} from '../protocol/limits.js';
import { tlsServerOptions, watchServer, type PkiMaterial } from './tls.js';

/** Node's own handshake bound sits this far behind the pending set's timer, which fires first. */
const NODE_HANDSHAKE_SLACK_MS = 1_000;

export interface UpgradeServer {
  server: https.Server;
  /** Stops the ticket-key timer and stops following the certificate. Idempotent. */
  release(): void;
}

/** The HTTPS server of an upgrade-only listener (see the module's comment). */
export function upgradeServer(material: PkiMaterial, handshakeTimeoutMs: number): UpgradeServer {
  const sessions = { sessionTimeout: PUSH_TLS_SESSION_LIFETIME_S, ticketKeys: randomBytes(TLS_TICKET_KEY_BYTES) };
  const server = https.createServer({
    ...tlsServerOptions(material),
    ...sessions,
    handshakeTimeout: handshakeTimeoutMs + NODE_HANDSHAKE_SLACK_MS,
    // Node's check of headersTimeout and requestTimeout: a backstop behind the pending set's
    // timer, which would otherwise wake an idle process every 30 s
    connectionsCheckingInterval: LISTENER_HTTP_CHECK_INTERVAL_MS,
  });
  // keep-alive would let a peer hold a pending slot between requests; nothing here wants it
  server.keepAliveTimeout = 1;
  server.headersTimeout = handshakeTimeoutMs;
  server.requestTimeout = handshakeTimeoutMs;
  const ticketTimer = setInterval(() => {
    sessions.ticketKeys = randomBytes(TLS_TICKET_KEY_BYTES);
    server.setTicketKeys(sessions.ticketKeys);
  }, PUSH_TLS_SESSION_LIFETIME_S * 1000);
  ticketTimer.unref();
  const stopWatching = watchServer(server, material, () => sessions);
  return {
    server,
    release() {
      clearInterval(ticketTimer);
      stopWatching();
    },
  };
}

/** Why the pending set cut a socket: the refusal codes it reports. */
export type PendingCut = 'too_many_connections' | 'handshake_timeout';

export interface PendingSocketsOptions {
  /** Sockets that may wait for their upgrade at once; one more is cut. */
  maxPending: number;
  /** How long a socket may take from TCP to an upgraded WebSocket (ms). */
  handshakeTimeoutMs: number;
  /** A socket was cut: count and log it as refused. */
  onCut: (code: PendingCut, peer: string, message: string) => void;
  /** The number pending changed (for a gauge). */
  onSize?: (size: number) => void;
}

interface Pending {
  raw: net.Socket;
  timer: NodeJS.Timeout;
}

/** Sockets between their TCP accept and their WebSocket upgrade (see the module's comment). */
export class PendingSockets {
  readonly #o: PendingSocketsOptions;
  readonly #pending = new Map<string, Pending>();
  readonly #cut = new WeakSet<net.Socket>();

  constructor(o: PendingSocketsOptions) {
    this.#o = o;
  }

  get size(): number {
    return this.#pending.size;
  }

  /** Counts a new TCP connection; over the cap it is cut (and reported) at once. */
  admit(raw: net.Socket): void {
    const peer = peerOf(raw);
    if (this.#pending.size >= this.#o.maxPending) {
      this.drop(raw);
      this.#o.onCut('too_many_connections', peer, `${this.#pending.size} connections already pending authentication`);
      return;
    }
    const key = socketKey(raw);
    const timer = setTimeout(() => {
      if (this.#pending.get(key)?.raw !== raw) return;
      this.#pending.delete(key);
      this.#o.onSize?.(this.#pending.size);
      this.drop(raw);
      this.#o.onCut('handshake_timeout', peer, `no WebSocket upgrade within ${this.#o.handshakeTimeoutMs} ms`);
    }, this.#o.handshakeTimeoutMs);
    timer.unref();
    this.#pending.set(key, { raw, timer });
    this.#o.onSize?.(this.#pending.size);
    raw.once('close', () => this.#settle(key, raw));
  }

  /** The socket (raw or its TLS socket) upgraded: it is no longer pending. */
  upgraded(sock: net.Socket): void {
    this.#settle(socketKey(sock));
  }

  /** Destroys a raw socket as refused, so its TLS layer's hang-up is not counted again. */
  drop(raw: net.Socket): void {
    this.#cut.add(raw);
    raw.destroy();
  }

  /** Whether this set cut the TLS socket's raw socket (its refusal was counted already). */
  wasCut(sock: tls.TLSSocket): boolean {
    // `_parent` is the raw socket under Node's TLSSocket
    const raw = (sock as unknown as { _parent?: net.Socket })._parent;
    return raw !== undefined && this.#cut.has(raw);
  }

  /** Destroys every pending socket (a drain or a close), without reporting them. */
  dropAll(): void {
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      this.drop(p.raw);
    }
    this.#pending.clear();
    this.#o.onSize?.(0);
  }

  #settle(key: string, raw?: net.Socket): void {
    const p = this.#pending.get(key);
    if (p === undefined || (raw !== undefined && p.raw !== raw)) return;
    clearTimeout(p.timer);
    this.#pending.delete(key);
    this.#o.onSize?.(this.#pending.size);
  }
}

const REASONS: Record<number, string> = { 403: 'Forbidden', 404: 'Not Found', 503: 'Service Unavailable' };

/** Answers an upgrade request with `status` and `{"error":{code,message}}`, then closes: nothing of the peer is read. */
export function abortHandshake(sock: Duplex, status: number, code: string, message: string): void {
  const body = JSON.stringify({ error: { code, message } });
  if (sock.writable) {
    sock.once('finish', () => sock.destroy());
    sock.end(
      `HTTP/1.1 ${status} ${REASONS[status] ?? 'Error'}\r\nConnection: close\r\nContent-Type: application/json\r\n` +
        `Cache-Control: no-store\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  } else {
    sock.destroy();
  }
}

/** Answers a request that is not an upgrade with `status` and its code, and closes the connection. */
export function refuseRequest(res: http.ServerResponse, status: number, code: string, message: string): void {
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

/** A request target without its query. */
export function pathOf(url: string | undefined): string {
  const u = url ?? '';
  const q = u.indexOf('?');
  return q < 0 ? u : u.slice(0, q);
}

/** `address:port` of a socket's peer, for logs. */
export function peerOf(sock: net.Socket | undefined): string {
  return `${sock?.remoteAddress ?? '?'}:${sock?.remotePort ?? '?'}`;
}

/** One key per TCP connection, the same for the raw socket and the TLS socket over it. */
function socketKey(s: net.Socket): string {
  return `${s.remoteAddress ?? ''}|${s.remotePort ?? ''}|${s.localPort ?? ''}`;
}
