/**
 * The agent dialling out (`--dial-out`, docs/dial-out.md): for a node that cannot accept the
 * controller's push dial (behind NAT, no inbound port), the agent opens the push connection
 * itself, `wss://<controller>/v1/connect`, and keeps it. Over it flow exactly the frames of the
 * listener's connections, handled by the same code (agent/push-connections.ts): who opened the TCP
 * connection changes nothing about what is accepted on it.
 *
 * - TLS 1.3 with the agent's own certificate; the server must be a valid, unrevoked controller of
 *   the trust domain that `--controller-id` accepts, checked on the presented chain before a byte
 *   is sent (`wrong_peer`, `untrusted_certificate`, `certificate_expired`, `revoked`, ...), as the
 *   agent's API client checks its controller. A refused upgrade keeps the controller's own code
 *   (its 403 `{"error":{"code"}}`), else `upgrade_refused`.
 * - What the controller answers on the connection is on its upgrade RESPONSE
 *   (`Herald-Features: fetch, signal`).
 * - One connection at a time. It starts at URL index FNV-1a(node) mod n, so a fleet spreads over
 *   the controllers and each agent prefers the same one, and moves to the next URL on a failed dial
 *   or a lost connection, after a full-jitter backoff (AGENT_DIAL_BACKOFF_BASE_MS doubling to
 *   AGENT_DIAL_BACKOFF_MAX_MS, reset by a connection that lived AGENT_DIAL_STABLE_MS). A close with
 *   1012 (the controller restarts and drains its connections) moves to the next URL after a
 *   random delay below AGENT_DIAL_RESTART_DELAY_MAX_MS.
 * - Liveness is the agent's: the controller does not ping a dialled-in connection. The agent pings
 *   every AGENT_DIAL_PING_INTERVAL_MS and drops the connection (`half_open`) when no pong came
 *   within AGENT_DIAL_PONG_TIMEOUT_MS, so a silently dropped NAT mapping shows within 40 s.
 * - Through an HTTP CONNECT proxy when `HTTPS_PROXY` says so and `NO_PROXY` does not exempt the
 *   host (agent/dial-proxy.ts): the TLS inside the tunnel is checked end to end all the same.
 *
 * A failed dial is logged with its code (connection_refused, dial_timeout, tls_error,
 * upgrade_refused, wrong_peer, proxy_refused, ...), at most one line per code and URL per
 * REFUSAL_LOG_INTERVAL_MS with the count since the last, so a controller that stays down does not
 * fill the log. No TLS session is resumed: the agent holds one connection and redials rarely.
 * Every dial uses one TLS context, made again when the PKI material changes (a renewed
 * certificate): a context per dial would parse the key and certificates each time, most of a
 * client's handshake (~3 ms; `npm run bench -- --dial-out`, a fleet redialling).
 */
import { EventEmitter } from 'node:events';
import type { X509Certificate } from 'node:crypto';
import { createRequire } from 'node:module';
import net from 'node:net';
import tls from 'node:tls';
import type { WebSocket as WebSocketType } from 'ws';
import { fullJitterMs } from '../protocol/backoff.js';
import { RefusalError, isErrorCode, type ErrorCode } from '../protocol/errors.js';
import { fnv1a32 } from '../protocol/fnv.js';
import {
  FEATURE_FETCH,
  FEATURE_SIGNAL,
  FEATURES_HEADER,
  offersFeature,
  type FetchState,
  type SignalledFrame,
} from '../protocol/frames.js';
import type { ControllerIds } from '../protocol/identity.js';
import {
  AGENT_DIAL_BACKOFF_BASE_MS,
  AGENT_DIAL_BACKOFF_MAX_MS,
  AGENT_DIAL_PING_INTERVAL_MS,
  AGENT_DIAL_PONG_TIMEOUT_MS,
  AGENT_DIAL_RESTART_DELAY_MAX_MS,
  AGENT_DIAL_STABLE_MS,
  AGENT_DIAL_TIMEOUT_MS,
  MAX_PUSH_METADATA_FRAME_BYTES,
  MAX_WAKE_FRAME_BYTES,
  REFUSAL_LOG_INTERVAL_MS,
} from '../protocol/limits.js';
import { netCodeOf } from '../protocol/net-codes.js';
import { RefusalSummary } from '../protocol/refusal-summary.js';
import type { WakeClaims, WakeVerifier } from '../protocol/wake.js';
import { identityOf, type CertIdentity } from '../certs/identity.js';
import {
  checkServerCertificate,
  connectCheckingX509,
  refusalCodeOf,
  tlsClientOptions,
  type Logger,
  type PkiMaterial,
} from '../certs/tls.js';
import { openTunnel, proxyFor, type DialProxy } from './dial-proxy.js';
import { realTimers, type Timers } from './poller.js';
import {
  CLOSE_GOING_AWAY,
  newPushConnectionStats,
  PushConnections,
  type PushConnection,
  type PushConnectionStats,
  type PushFetchAnswer,
} from './push-connections.js';

// CommonJS, so require()d: see the note in listener.ts (idle RSS)
const { WebSocket } = createRequire(import.meta.url)('ws') as typeof import('ws');

/** The period of the handle that keeps a dialling agent's process alive: any long one does. */
const KEEP_ALIVE_TICK_MS = 2 ** 30;

/** The path of a controller's connect listener. */
export const CONNECT_PATH = '/v1/connect';

/** WebSocket close code of a server that restarts (RFC 6455 registry: "Service Restart"). */
export const CLOSE_SERVICE_RESTART = 1012;

export interface DialerOptions {
  /** The controllers' connect URLs (`--dial-out`, from `parseDialOutUrls`): at least one. */
  urls: readonly URL[];
  /** This agent's node id: where in `urls` it starts. */
  node: string;
  material: PkiMaterial;
  /** The controllers accepted as the server (`--controller-id`). */
  controllers: ControllerIds;
  verifier: WakeVerifier;
  /** A verified wake-up: start or queue a fetch (the coalescer). Must answer synchronously. */
  onWake: (claims: WakeClaims) => FetchState;
  /** The last generation fetched, for the ack's `gen`. */
  lastFetchedGen: () => number;
  log: Logger & { debug?(obj: object, msg?: string): void };
  /** The proxy of `HTTPS_PROXY`/`NO_PROXY` (agent/dial-proxy.ts); none when undefined. */
  proxy?: DialProxy | undefined;
  /** Timers and clock (default real ones): the backoff, the pings, the dial timeout. */
  timers?: Timers;
  /** Uniform in [0, 1) (default Math.random): the backoff's jitter and the delay after 1012. */
  random?: () => number;
  /** Default AGENT_DIAL_PING_INTERVAL_MS. */
  pingIntervalMs?: number;
  /** Default AGENT_DIAL_PONG_TIMEOUT_MS. */
  pongTimeoutMs?: number;
  /** Default AGENT_DIAL_BACKOFF_BASE_MS. */
  backoffBaseMs?: number;
  /** Default AGENT_DIAL_BACKOFF_MAX_MS. */
  backoffMaxMs?: number;
  /** Default AGENT_DIAL_STABLE_MS. */
  stableMs?: number;
  /** Default AGENT_DIAL_TIMEOUT_MS. */
  dialTimeoutMs?: number;
  /** Default AGENT_DIAL_RESTART_DELAY_MAX_MS. */
  restartDelayMaxMs?: number;
  /**
   * Every dial runs through this (default: runs it at once): `dial` starts it and resolves once it
   * is over, the connection up or the dial failed. The benchmark's simulated agents, thousands to
   * a process, pass a gate that bounds how many of them handshake at once (a real agent has its
   * machine to itself). The dial's timeout starts when `dial` is called.
   */
  runDial?: (dial: () => Promise<void>) => Promise<void>;
}

/** Counters, for tests and metrics. */
export interface DialerStats extends PushConnectionStats {
  /** Dials started, and how many of them failed before the upgrade. */
  dials: number;
  dialFailures: number;
  /** Connections established so far. */
  connected: number;
  /** Pongs received (answers to the agent's pings). */
  pongs: number;
}

/** What a dial or a connection ended with, as the 'down' event tells it. */
export interface DialEnd {
  url: string;
  code: ErrorCode;
  /** Whether the connection was up (else the dial failed). */
  wasOpen: boolean;
  /** The close code the connection ended with, when it was up. */
  closeCode?: number;
  /** The URL redialled next, and after how long. */
  next: string;
  delayMs: number;
}

/**
 * Events: `'connected'` ({ url, identity, peer, offers }) when a dialled connection is up;
 * `'down'` (DialEnd) when a dial failed or a connection ended, with the redial planned;
 * `'push-change'` () when push health may have changed; `'refused'` ({ code, peer }) for a
 * refusal on an established connection (a nack, an unexpected frame), also logged.
 */
export class Dialer extends EventEmitter {
  readonly #o: Required<
    Pick<
      DialerOptions,
      | 'pingIntervalMs'
      | 'pongTimeoutMs'
      | 'backoffBaseMs'
      | 'backoffMaxMs'
      | 'stableMs'
      | 'dialTimeoutMs'
      | 'restartDelayMaxMs'
      | 'timers'
      | 'random'
    >
  >;
  readonly #urls: readonly URL[];
  readonly #material: PkiMaterial;
  readonly #controllers: ControllerIds;
  readonly #proxy: DialProxy | undefined;
  readonly #log: DialerOptions['log'];
  readonly #push: PushConnections;
  readonly #summary: RefusalSummary;
  #summaryTimer: NodeJS.Timeout | null = null;
  /** Holds the process while the dialer runs (start() to close()). */
  #keepAlive: NodeJS.Timeout | null = null;
  /** The URL dialled now, or next. */
  #index: number;
  /** Failed dials and short-lived connections since the last stable one: the backoff's exponent. */
  #attempt = 0;
  /** The dial in progress or the connection up, and what belongs to it. */
  #ws: WebSocketType | null = null;
  #tunnel: net.Socket | null = null;
  #conn: PushConnection | null = null;
  #openedAt = 0;
  /** Why the current dial or connection ended, when this side knows better than the close event. */
  #failCode: ErrorCode | null = null;
  #failMessage = '';
  #retryTimer: unknown = null;
  #dialTimer: unknown = null;
  /** Resolves the promise of the dial in progress (`runDial`): it is over. */
  #dialOver: (() => void) | null = null;
  readonly #runDial: DialerOptions['runDial'];
  /** The TLS context of every dial, and the material it was made of (#secureContext). */
  #context: tls.SecureContext | null = null;
  #contextOf: unknown = null;
  #pingTimer: unknown = null;
  #pongTimer: unknown = null;
  #started = false;
  #closed = false;
  #closing: Promise<void> | null = null;
  readonly stats: DialerStats = { ...newPushConnectionStats(), dials: 0, dialFailures: 0, connected: 0, pongs: 0 };

  /** @throws RefusalError `bad_option` when `urls` is empty */
  constructor(o: DialerOptions) {
    super();
    if (o.urls.length === 0) throw new RefusalError('bad_option', '--dial-out names no URL');
    this.#o = {
      pingIntervalMs: o.pingIntervalMs ?? AGENT_DIAL_PING_INTERVAL_MS,
      pongTimeoutMs: o.pongTimeoutMs ?? AGENT_DIAL_PONG_TIMEOUT_MS,
      backoffBaseMs: o.backoffBaseMs ?? AGENT_DIAL_BACKOFF_BASE_MS,
      backoffMaxMs: o.backoffMaxMs ?? AGENT_DIAL_BACKOFF_MAX_MS,
      stableMs: o.stableMs ?? AGENT_DIAL_STABLE_MS,
      dialTimeoutMs: o.dialTimeoutMs ?? AGENT_DIAL_TIMEOUT_MS,
      restartDelayMaxMs: o.restartDelayMaxMs ?? AGENT_DIAL_RESTART_DELAY_MAX_MS,
      timers: o.timers ?? realTimers,
      random: o.random ?? Math.random,
    };
    this.#urls = [...o.urls];
    this.#index = fnv1a32(o.node) % this.#urls.length;
    this.#material = o.material;
    this.#controllers = o.controllers;
    this.#proxy = o.proxy;
    this.#log = o.log;
    this.#runDial = o.runDial;
    this.#push = new PushConnections({
      material: o.material,
      verifier: o.verifier,
      onWake: o.onWake,
      lastFetchedGen: o.lastFetchedGen,
      log: o.log,
      stats: this.stats,
      now: this.#o.timers.now,
    });
    for (const event of ['push-change', 'refused'])
      this.#push.on(event, (...args: unknown[]) => this.emit(event, ...args));
    this.#summary = new RefusalSummary(
      (line) => {
        const { url, message } = line.fields as { url?: string; message?: string };
        this.#log.warn(
          { code: line.code, url, count: line.count },
          line.count === 1
            ? `dialling a controller failed: ${message ?? line.code}`
            : `dialling a controller failed ${line.count} times since the last line (${message ?? line.code})`,
        );
      },
      this.#o.timers.now,
      REFUSAL_LOG_INTERVAL_MS,
    );
  }

  /** The URL dialled now (or next, while waiting to redial). */
  get url(): URL {
    return this.#urls[this.#index]!;
  }

  /** Whether the dialled connection is up now. */
  get connected(): boolean {
    return this.#conn !== null && !this.#conn.closing;
  }

  /** Starts dialling. Idempotent. */
  start(): void {
    if (this.#started || this.#closed) return;
    this.#started = true;
    // The agent's timers are unref'd (they never hold a stopping process). An agent that only
    // dials out holds no listener: between a lost connection and the redial nothing else keeps
    // the process, which would then end quietly with code 0. This handle keeps it until close().
    this.#keepAlive = setInterval(() => {}, KEEP_ALIVE_TICK_MS);
    this.#dial();
  }

  /** Push is healthy on the dialled connection: it is up and a pong or frame came within the window. */
  isPushHealthy(): boolean {
    return this.#push.isPushHealthy();
  }

  /** `PushConnections.fetchOverPush` on the dialled connection. */
  fetchOverPush(nonce: string, ifNoneMatch: string | undefined, timeoutMs: number): Promise<PushFetchAnswer> | null {
    return this.#push.fetchOverPush(nonce, ifNoneMatch, timeoutMs);
  }

  /** `PushConnections.signalOverPush` on the dialled connection. */
  signalOverPush(
    nonce: string,
    deployment: string,
    revision: number,
    body: Uint8Array,
    timeoutMs: number,
  ): Promise<SignalledFrame> | null {
    return this.#push.signalOverPush(nonce, deployment, revision, body, timeoutMs);
  }

  /** Closes the connection (1001 `shutting_down`) or gives up the dial, and dials no more. Idempotent. */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    if (this.#keepAlive !== null) clearInterval(this.#keepAlive);
    this.#keepAlive = null;
    const t = this.#o.timers;
    for (const timer of [this.#retryTimer, this.#dialTimer, this.#pingTimer, this.#pongTimer])
      if (timer !== null) t.clearTimeout(timer);
    if (this.#summaryTimer !== null) clearInterval(this.#summaryTimer);
    this.#summary.flush(true);
    this.#endDial();
    const ws = this.#ws;
    this.#tunnel?.destroy();
    this.#push.closeAll();
    this.#closing = new Promise<void>((resolve) => {
      if (ws === null || ws.readyState === WebSocket.CLOSED) return resolve();
      ws.once('close', () => resolve());
      if (ws.readyState === WebSocket.CONNECTING) ws.terminate();
    });
    return this.#closing;
  }

  // ---- dialling ------------------------------------------------------------------------------

  #dial(): void {
    if (this.#closed) return;
    const run = this.#runDial;
    if (run === undefined) {
      this.#dialNow();
      return;
    }
    void run(
      () =>
        new Promise<void>((resolve) => {
          if (this.#closed) return resolve();
          this.#dialOver = resolve;
          this.#dialNow();
        }),
    );
  }

  /** The dial in progress is over (up, failed, or given up): `runDial` may start another. */
  #endDial(): void {
    const over = this.#dialOver;
    this.#dialOver = null;
    over?.();
  }

  #dialNow(): void {
    const url = this.url;
    this.stats.dials++;
    this.#failCode = null;
    this.#failMessage = '';
    const t = this.#o.timers;
    this.#dialTimer = t.setTimeout(() => {
      this.#dialTimer = null;
      this.#failCode = 'dial_timeout';
      this.#tunnel?.destroy();
      if (this.#ws === null) this.#down(null);
      else this.#ws.terminate();
    }, this.#o.dialTimeoutMs);
    const port = Number(url.port || 443);
    const via = proxyFor(url, this.#proxy);
    if (via === undefined) {
      this.#upgrade(url, { host: url.hostname.replace(/^\[|\]$/g, ''), port });
      return;
    }
    const tunnel = openTunnel(via, url.hostname, port);
    this.#tunnel = tunnel.socket;
    tunnel.ready.then(
      (socket) => {
        if (this.#tunnel !== socket || this.#closed) return;
        this.#upgrade(url, { socket });
      },
      (err: unknown) => {
        if (this.#tunnel !== tunnel.socket || this.#closed) return;
        this.#tunnel = null;
        this.#failCode ??= dialCodeOf(err);
        this.#failMessage ||= (err as Error).message;
        this.#down(null);
      },
    );
  }

  /** TLS to the controller (over `to.socket`, a proxy's tunnel, or to host:port), then the upgrade. */
  #upgrade(url: URL, to: { host: string; port: number } | { socket: net.Socket }): void {
    const {
      checkServerIdentity: _byX509,
      ca: _ca,
      cert: _cert,
      key: _key,
      ...base
    } = tlsClientOptions(this.#material, {
      controllers: this.#controllers,
    });
    const secureContext = this.#secureContext();
    const host = url.hostname.replace(/^\[|\]$/g, '');
    let peer: { identity: CertIdentity; cert: X509Certificate } | null = null;
    let sock: tls.TLSSocket | null = null;
    let offers = { fetch: false, signal: false };
    const ws = new WebSocket(url.href, {
      perMessageDeflate: false,
      // the controller offers fetches on this connection: a metadata frame is its largest message
      maxPayload: MAX_PUSH_METADATA_FRAME_BYTES,
      followRedirects: false,
      // identity, trust domain, EKUs and revocation (certs/tls.ts) on the presented chain as X509
      // objects; the chain itself is OpenSSL's (`rejectUnauthorized`). `path` is the request's to
      // ws; to tls.connect it would name a Unix socket.
      createConnection: (o: tls.ConnectionOptions) => {
        sock = connectCheckingX509(
          {
            ...o,
            ...base,
            secureContext,
            path: undefined,
            ...('socket' in to ? { socket: to.socket } : { host: to.host, port: to.port }),
            // as ws itself does: SNI for a name, none for an address
            servername: net.isIP(host) ? '' : host,
          },
          (cert) => {
            if (cert === undefined)
              return new RefusalError('untrusted_certificate', 'the server presented no certificate');
            const refused = checkServerCertificate(this.#material, { controllers: this.#controllers }, cert);
            if (refused !== undefined) return refused;
            peer = { identity: identityOf(cert, this.#material.current().trustDomain), cert };
            return undefined;
          },
        );
        return sock;
      },
    } as unknown as import('ws').ClientOptions);
    this.#ws = ws;
    ws.on('upgrade', (res) => {
      offers = {
        fetch: offersFeature(res.headers[FEATURES_HEADER], FEATURE_FETCH),
        signal: offersFeature(res.headers[FEATURES_HEADER], FEATURE_SIGNAL),
      };
    });
    ws.on('unexpected-response', (req, res) => {
      // the controller refuses with a status and {"error":{"code":..}} before the upgrade: keep its code
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        if (body.length < MAX_WAKE_FRAME_BYTES) body += chunk;
      });
      const finish = (): void => {
        if (this.#ws === ws) {
          this.#failCode ??= upgradeRefusalOf(body);
          this.#failMessage ||= `the controller answered the upgrade with ${res.statusCode}`;
        }
        req.destroy();
        ws.terminate();
      };
      res.on('end', finish);
      res.on('error', finish);
    });
    ws.on('open', () => {
      if (this.#ws !== ws || this.#closed || peer === null || sock === null) {
        ws.terminate();
        return;
      }
      this.#opened(url, ws, sock, peer, offers);
    });
    ws.on('pong', () => {
      if (this.#ws !== ws || this.#conn === null) return;
      this.stats.pongs++;
      this.#push.heard(this.#conn);
      if (this.#pongTimer !== null) this.#o.timers.clearTimeout(this.#pongTimer);
      this.#pongTimer = null;
    });
    ws.on('error', (err: Error) => {
      if (this.#ws !== ws) return;
      this.#failCode ??= dialCodeOf(err);
      this.#failMessage ||= err.message;
      this.#log.debug?.({ url: url.href, code: this.#failCode, err: err.message }, 'dialled connection error');
    });
    ws.on('close', (code: number, reason: Buffer) => {
      if (this.#ws !== ws) return;
      this.#down(code, reason.toString('utf8'));
    });
  }

  /** The context for a dial: the last one made, unless the PKI material changed since. */
  #secureContext(): tls.SecureContext {
    const m = this.#material.current();
    if (this.#context === null || this.#contextOf !== m) {
      this.#context = tls.createSecureContext({
        ca: m.ca,
        cert: m.cert,
        key: m.key,
        minVersion: 'TLSv1.3',
        maxVersion: 'TLSv1.3',
      });
      this.#contextOf = m;
    }
    return this.#context;
  }

  #opened(
    url: URL,
    ws: WebSocketType,
    sock: tls.TLSSocket,
    peer: { identity: CertIdentity; cert: X509Certificate },
    offers: { fetch: boolean; signal: boolean },
  ): void {
    const t = this.#o.timers;
    if (this.#dialTimer !== null) t.clearTimeout(this.#dialTimer);
    this.#dialTimer = null;
    this.#tunnel = null;
    this.#openedAt = t.now();
    this.#endDial();
    const label = url.host;
    this.#conn = this.#push.add({ ws, sock, identity: peer.identity, cert: peer.cert, peer: label, offers });
    this.stats.connected++;
    const via = proxyFor(url, this.#proxy);
    this.#log.info(
      {
        url: url.href,
        identity: peer.identity.spiffeId,
        offers: Object.keys(offers).filter((k) => offers[k as keyof typeof offers]),
        ...(via ? { proxy: via.host } : {}),
      },
      'dialled a controller: push connection up',
    );
    this.#armPing();
    this.emit('connected', { url: url.href, identity: peer.identity.spiffeId, peer: label, offers });
  }

  /** The next ping in AGENT_DIAL_PING_INTERVAL_MS; its pong must come within AGENT_DIAL_PONG_TIMEOUT_MS. */
  #armPing(): void {
    const t = this.#o.timers;
    this.#pingTimer = t.setTimeout(() => {
      this.#pingTimer = null;
      const ws = this.#ws;
      if (ws === null || this.#conn === null || ws.readyState !== WebSocket.OPEN) return;
      ws.ping();
      if (this.#pongTimer === null)
        this.#pongTimer = t.setTimeout(() => {
          this.#pongTimer = null;
          if (this.#ws !== ws || this.#conn === null) return;
          this.#failCode = 'half_open';
          this.#log.warn(
            { code: 'half_open', url: this.url.href, pongTimeoutMs: this.#o.pongTimeoutMs },
            'no pong from the controller in time: the dialled connection is dropped',
          );
          // nothing gets through: no close handshake to wait for
          this.#push.close(this.#conn, CLOSE_GOING_AWAY, 'half_open');
          ws.terminate();
        }, this.#o.pongTimeoutMs);
      this.#armPing();
    }, this.#o.pingIntervalMs);
  }

  /**
   * The dial failed or the connection ended (`closeCode` null: before any WebSocket): record why,
   * move to the next URL and plan the redial.
   */
  #down(closeCode: number | null, reason = ''): void {
    const t = this.#o.timers;
    for (const timer of [this.#dialTimer, this.#pingTimer, this.#pongTimer]) if (timer !== null) t.clearTimeout(timer);
    this.#dialTimer = this.#pingTimer = this.#pongTimer = null;
    const url = this.url.href;
    const conn = this.#conn;
    const wasOpen = conn !== null;
    this.#ws = null;
    this.#conn = null;
    this.#tunnel?.destroy();
    this.#tunnel = null;
    this.#endDial();
    if (this.#closed) return;
    let code: ErrorCode;
    if (this.#failCode !== null) code = this.#failCode;
    else if (isErrorCode(reason)) code = reason;
    else code = wasOpen ? (closeCode === 1006 ? 'connection_reset' : 'connection_closed') : 'connection_reset';
    const restart = wasOpen && closeCode === CLOSE_SERVICE_RESTART;
    if (wasOpen && t.now() - this.#openedAt >= this.#o.stableMs) this.#attempt = 0;
    this.#index = (this.#index + 1) % this.#urls.length;
    const delayMs = restart
      ? Math.floor(this.#o.random() * this.#o.restartDelayMaxMs)
      : fullJitterMs(this.#attempt++, this.#o.backoffBaseMs, this.#o.backoffMaxMs, this.#o.random);
    const next = this.url.href;
    if (wasOpen) {
      this.#log.info(
        { url, code, close: closeCode, reason: reason.slice(0, 123), next, delayMs },
        restart ? 'the controller restarts: dialling the next one' : 'dialled connection lost: dialling again',
      );
    } else {
      this.stats.dialFailures++;
      this.#summary.record(code, { url, message: this.#failMessage || reason || code }, `${code} ${url}`);
      this.#armSummary();
    }
    const end: DialEnd = { url, code, wasOpen, next, delayMs };
    if (closeCode !== null && wasOpen) end.closeCode = closeCode;
    this.emit('down', end);
    this.#retryTimer = t.setTimeout(() => {
      this.#retryTimer = null;
      this.#dial();
    }, delayMs);
  }

  /** Flushes the failure summary while failures come in (its lines are otherwise logged only at the next failure). */
  #armSummary(): void {
    if (this.#summaryTimer !== null || this.#closed) return;
    this.#summaryTimer = setInterval(() => {
      this.#summary.flush();
      if (this.#conn !== null && this.#summaryTimer !== null) {
        clearInterval(this.#summaryTimer);
        this.#summaryTimer = null;
      }
    }, REFUSAL_LOG_INTERVAL_MS);
    this.#summaryTimer.unref();
  }
}

/**
 * Parses `--dial-out`: one `wss://host:port/v1/connect` or several separated by commas.
 * @throws RefusalError `bad_option` naming `--dial-out`
 */
export function parseDialOutUrls(value: string): URL[] {
  const parts = value.split(',').map((u) => u.trim());
  return parts.map((u) => {
    let url: URL | undefined;
    try {
      url = new URL(u);
    } catch {
      url = undefined;
    }
    if (
      url === undefined ||
      url.protocol !== 'wss:' ||
      url.hostname === '' ||
      url.pathname !== CONNECT_PATH ||
      url.search ||
      url.hash ||
      url.username ||
      url.password
    ) {
      throw new RefusalError(
        'bad_option',
        `--dial-out must be wss://host:port${CONNECT_PATH}, or several separated by commas, not ${JSON.stringify(u.slice(0, 200))}`,
      );
    }
    return url;
  });
}

/** The code of a dial's error: Herald's own, a TLS one, a network one, else `tls_error`. */
function dialCodeOf(err: unknown): ErrorCode {
  const code = refusalCodeOf(err) ?? netCodeOf(err);
  if (code !== undefined) return code;
  if (err instanceof Error && /Unexpected server response/i.test(err.message)) return 'upgrade_refused';
  return 'tls_error';
}

/** The code of a refused upgrade: the controller's `{"error":{"code":..}}`, else `upgrade_refused`. */
function upgradeRefusalOf(body: string): ErrorCode {
  try {
    const code = (JSON.parse(body) as { error?: { code?: unknown } })?.error?.code;
    if (isErrorCode(code)) return code;
  } catch {
    // not JSON: fall through
  }
  return 'upgrade_refused';
}
