/**
 * The controller's push dialer (docs/protocol.md): one persistent mutual-TLS WebSocket per agent, a signed
 * wake-up per change (coalesced per node, bounded in flight globally), a `ping` wake-up on every
 * (re)connect, WebSocket pings from one shared timer wheel, reconnects with exponential backoff
 * and full jitter, and half-open detection when an answer does not come within 1 s.
 *
 * An agent that dialled in (`--connect-listen`, controller/push/connect-listener.ts) is held the
 * same way once `attach`ed: the same wake-ups, answers and requests on its connection, which is
 * never redialled and never pinged (the agent pings; silence for CONNECT_SILENCE_MAX_MS is
 * half-open). While a node has one, the dialer does not dial it; when it ends, the dialer dials
 * the node's announced endpoint if it has one (docs/protocol.md, "Dialled-in connections").
 *
 * This is the only module of the controller that dials agents (`ws`, `node:tls`). It runs in the
 * controller process for small setups and tests, or inside push worker processes
 * (controller/push/worker.ts) behind the PushPool facade: see docs/architecture-push.md.
 */
import crypto from 'node:crypto';
import dns from 'node:dns';
import { EventEmitter } from 'node:events';
import type net from 'node:net';
import tls from 'node:tls';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import WebSocket from 'ws';
import {
  checkServerCertificate,
  connectResumingX509,
  forgetResumedSession,
  tlsClientOptions,
  type PkiMaterial,
} from '../../certs/tls.js';
import { identityKey } from '../../certs/revoked.js';
import { SessionFile } from '../../certs/session-file.js';
import { TlsSessionStore } from '../../certs/session-store.js';
import { addressRefusal, parseIp } from '../../protocol/address.js';
import { fullJitterMs } from '../../protocol/backoff.js';
import { ConfigError, isErrorCode, RefusalError } from '../../protocol/errors.js';
import {
  type AgentFrame,
  decodeAgentFrame,
  encodeMetadataFrame,
  encodeSignalled,
  FEATURE_FETCH,
  FEATURE_SIGNAL,
  FEATURES_HEADER,
  type MetadataFrameHead,
} from '../../protocol/frames.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { fastEd25519 } from '../ed25519.js';
import {
  CONNECT_SILENCE_MAX_MS,
  DIAL_TIMEOUT_MS,
  FRAME_ANSWER_TIMEOUT_MS,
  MAX_DIALS_IN_FLIGHT,
  MAX_PUSH_ANSWER_BUFFERED_BYTES,
  MAX_PUSH_REFUSED_REQUESTS,
  MAX_PUSH_METADATA_FRAME_BYTES,
  MAX_WAKE_FRAME_BYTES,
  MAX_WAKES_IN_FLIGHT,
  MAX_WS_PAYLOAD_BYTES,
  PING_INTERVAL_MS,
  PUSH_CLOSE_GRACE_MS,
  PUSH_TLS_SESSION_LIFETIME_S,
  PUSH_TLS_SESSION_STORE_ENTRIES,
  RECONNECT_BACKOFF_BASE_MS,
  RECONNECT_BACKOFF_MAX_MS,
} from '../../protocol/limits.js';
import { signSignalled } from '../../protocol/signal-answer.js';
import { newJti, signWake, type WakeReason } from '../../protocol/wake.js';
import type { AddressInfo } from 'node:net';
import { ConnectListener } from './connect-listener.js';
import { OldestFirstTimer } from './oldest-first-timer.js';
import { pushCodeOf, type PushErrorCode } from './errors.js';
import { promPushMetrics, type PushMetricsSink } from './metrics.js';
import { PingWheel, type WheelMember } from './ping-wheel.js';
import {
  type AckEvent,
  type ConnectListen,
  type DialledIn,
  IDLE_PUSH_STATE,
  type PushEvents,
  type PushRequest,
  type PushRequestHandler,
  type PushSignalRequest,
  type PushReply,
  type PushService,
  type PushState,
  type PushTarget,
  unavailableReply,
} from './types.js';
import type { PushTuning } from './ipc.js';

/** Timeouts and bounds (`PushTuning`, shared with the worker processes) default to protocol/limits.ts. */
export interface PushDialerOptions extends PushTuning {
  signer: Signer;
  /** The controller's SPIFFE id: the wake-ups' `iss`. */
  issuer: string;
  trustDomain: string;
  /** The controller's TLS material (client certificate, CA, revoked serials), watched for changes. */
  material: PkiMaterial;
  logger: Logger;
  /** Registers the push metrics here; a private registry when absent. */
  metrics?: Registry;
  /** Instead of `metrics`: where to count (a push worker counts deltas to report). */
  metricsSink?: PushMetricsSink;
  /** Wall clock in ms (timestamps, `iat`). Timers use the platform's. */
  clock?: () => number;
  /** [0, 1) source for the backoff jitter. */
  random?: () => number;
  /**
   * Resolves an endpoint's DNS name to every address it has (default `dns.lookup` with
   * `all: true`). Each address is checked by protocol/address.ts before the socket connects to it.
   */
  lookup?: DialLookup;
  /**
   * Keeps the TLS sessions with the agents in this file too (certs/session-file.ts), so a
   * restarted controller resumes its push connections; absent, in memory only.
   */
  sessionFile?: string;
}

/** The resolver the dialer asks for a name's addresses (the shape of `dns.lookup(..., {all: true})`). */
export type DialLookup = (
  hostname: string,
  options: dns.LookupAllOptions,
  callback: (err: NodeJS.ErrnoException | null, addresses: dns.LookupAddress[]) => void,
) => void;

const systemLookup: DialLookup = (hostname, options, callback) => dns.lookup(hostname, options, callback);

type Resolved = Required<
  Omit<PushDialerOptions, 'metrics' | 'metricsSink' | 'sessionFile' | 'connectHandshakeTimeoutMs' | 'connectMaxPending'>
> &
  Pick<PushDialerOptions, 'connectHandshakeTimeoutMs' | 'connectMaxPending'>;

interface InFlight {
  jti: string;
  gen: number;
  /** The dialer's clock when sent (the ack's latency). */
  sentAtMs: number;
  /** performance.now() when sent: its answer is overdue `answerTimeoutMs` later (see #answersDue). */
  at: number;
}

/** One node. Kept small: there are 10,000 of these, each with a live socket. */
class NodeEntry implements WheelMember {
  wheelSlot = -1;
  readonly node: string;
  /** `spiffe://<td>/agent/<node>`: the wake-ups' `aud` and the identity the listener must show. */
  readonly spiffeId: string;
  url: string | null;
  generation: number;
  readonly ps: PushState;
  ws: WebSocket | null = null;
  /** `ws` is a connection the agent dialled in (never redialled, never pinged: see `attach`). */
  inbound = false;
  /** performance.now() when anything (a frame, a ping) last came on the dialled-in connection. */
  heardAt = 0;
  /** A connection to this node is to be kept (it was needed once). */
  active = false;
  attempt = 0;
  retryTimer: NodeJS.Timeout | null = null;
  dialTimer: NodeJS.Timeout | null = null;
  dialQueued = false;
  /** Failure code found during the current dial, preferred over the socket error's. */
  failCode: PushErrorCode | null = null;
  peerSerial: string | null = null;
  /** The serial of the Herald issuer under which the peer's certificate was made, if any. */
  peerIssuerSerial: string | null = null;
  /** When the peer's certificate expires (ms): past it, its fetches are refused and it is closed. */
  peerNotAfterMs = 0;
  /** When the peer's certificate was issued (ms): under its identity's floor, it is closed (#closeRevoked). */
  peerNotBeforeMs = 0;
  /** Requests of this connection refused 429 in a row (MAX_PUSH_REFUSED_REQUESTS closes it). */
  requestRefusals = 0;
  inflight: InFlight | null = null;
  /** A wake-up is wanted (with this reason) once the one in flight is answered. */
  wantReason: WakeReason | null = null;
  queued = false;
  awaitingPong = false;
  /** The connection whose fetch / signal the handler is answering now (at most one of each per node). */
  serving: Record<PushRequest['kind'], WebSocket | null> = { fetch: null, signal: null };

  constructor(node: string, spiffeId: string, url: string | null, generation: number, acked: number | null) {
    this.node = node;
    this.spiffeId = spiffeId;
    this.url = url;
    this.generation = generation;
    this.ps = {
      state: 'idle',
      connected: false,
      via: null,
      generation_pushed: null,
      generation_acked: acked,
      last_ack_at: null,
      last_error: null,
      last_error_at: null,
    };
  }
}

/** A deployment or restart reason wins over `ping` when wake-ups are coalesced. */
function mergeReason(a: WakeReason | null, b: WakeReason): WakeReason {
  if (a === null || a === 'ping') return b;
  return b === 'ping' ? a : b;
}

const GOING_AWAY = 1001;
const POLICY_VIOLATION = 1008;
/** The controller is restarting: its drain closes the dialled-in connections with it (RFC 6455 "Service Restart"). */
const SERVICE_RESTART = 1012;
/** A newer connection of the same node took this one's place. */
const REPLACED = 4000;
/** How often, within CONNECT_SILENCE_MAX_MS, each dialled-in connection's silence is checked. */
const SILENCE_CHECKS = 5;
/** Buckets of the silence wheel (see the constructor). */
const SILENCE_WHEEL_SLOTS = 15;

/** The masking key of every frame the dialer sends: zero, so none is masked (see the dial's options). */
function zeroMask(mask: Buffer): void {
  mask.fill(0);
}

export class PushDialer implements PushService {
  readonly #o: Resolved;
  #signer: Signer;
  readonly #log: Logger;
  #requestHandler: PushRequestHandler | null = null;
  readonly #metrics: PushMetricsSink;
  readonly #events = new EventEmitter();
  readonly #nodes = new Map<string, NodeEntry>();
  readonly #wheel: PingWheel<NodeEntry>;
  /** The dialled-in connections, each visited SILENCE_CHECKS times per silence limit (never pinged). */
  readonly #silence: PingWheel<NodeEntry>;
  /** Dialled-in connections held now. */
  #dialledIn = 0;
  #connect: ConnectListener | null = null;
  /** A drain has begun: dialled-in connections are being closed, none is taken, a lost one is not replaced by a dial. */
  #draining = false;
  /** Nodes waiting for a wake-up slot, in arrival order (fair). */
  readonly #waiting = new Set<NodeEntry>();
  readonly #dialWaiting = new Set<NodeEntry>();
  /**
   * Nodes with a wake-up in flight, in the order they were sent: so also in the order their
   * answers fall due, which one timer watches (#answersDue), not a timer per wake-up.
   */
  readonly #inFlight = new Set<NodeEntry>();
  readonly #answersDue: OldestFirstTimer;
  #dialsInFlight = 0;
  #connected = 0;
  #context: tls.SecureContext;
  /** Client sessions with the agents, one per node (resumed on the next dial, after a restart too). */
  readonly #sessions: TlsSessionStore;
  readonly #sessionFile: SessionFile | undefined;
  #started = false;
  #closed = false;
  #closing: Promise<void> | null = null;
  readonly #onTlsChange = (): void => {
    // a session made with our old certificate would present it again
    this.#sessions.clear();
    this.#rebuildContext();
    this.#closeUntrusted();
  };
  /** The CA certificates the live connections were verified against (their fingerprints). */
  #caPrint = '';
  readonly #onRevokedChange = (): void => this.#closeRevoked();

  /** @throws ConfigError naming a bad option */
  constructor(opts: PushDialerOptions) {
    const o: Resolved = {
      clock: Date.now,
      random: Math.random,
      lookup: systemLookup,
      pingIntervalMs: PING_INTERVAL_MS,
      answerTimeoutMs: FRAME_ANSWER_TIMEOUT_MS,
      dialTimeoutMs: DIAL_TIMEOUT_MS,
      backoffBaseMs: RECONNECT_BACKOFF_BASE_MS,
      backoffMaxMs: RECONNECT_BACKOFF_MAX_MS,
      maxWakesInFlight: MAX_WAKES_IN_FLIGHT,
      maxDialsInFlight: MAX_DIALS_IN_FLIGHT,
      closeGraceMs: PUSH_CLOSE_GRACE_MS,
      connectSilenceMaxMs: CONNECT_SILENCE_MAX_MS,
      ...stripUndefined(opts),
    } as Resolved;
    if (!o.signer) throw new ConfigError('signer is required');
    if (!o.material) throw new ConfigError('material is required');
    if (!o.logger) throw new ConfigError('logger is required');
    if (typeof o.issuer !== 'string' || !o.issuer.startsWith(`spiffe://${o.trustDomain}/controller/`)) {
      throw new ConfigError(`issuer must be spiffe://${o.trustDomain}/controller/<name>`, { field: 'issuer' });
    }
    for (const k of [
      'pingIntervalMs',
      'answerTimeoutMs',
      'dialTimeoutMs',
      'backoffBaseMs',
      'backoffMaxMs',
      'maxWakesInFlight',
      'maxDialsInFlight',
      'closeGraceMs',
      'connectSilenceMaxMs',
    ] as const) {
      if (!Number.isFinite(o[k]) || o[k] <= 0) throw new ConfigError(`${k} must be a positive number`, { field: k });
    }
    this.#o = o;
    this.#caPrint = caPrintOf(o.material);
    this.#signer = o.signer;
    this.#log = o.logger.child({ component: 'push' });
    this.#metrics = opts.metricsSink ?? promPushMetrics(opts.metrics);
    this.#wheel = new PingWheel<NodeEntry>(o.pingIntervalMs, (e) => this.#ping(e));
    // 15 buckets: at the default limit one tick a second, as the ping wheel's
    this.#silence = new PingWheel<NodeEntry>(
      o.connectSilenceMaxMs / SILENCE_CHECKS,
      (e) => this.#checkSilence(e),
      SILENCE_WHEEL_SLOTS,
    );
    this.#answersDue = new OldestFirstTimer(
      o.answerTimeoutMs,
      () => this.#inFlight.values().next().value?.inflight?.at,
      (now) => this.#sweepUnanswered(now),
    );
    this.#context = this.#buildContext();
    this.#sessions = new TlsSessionStore(o.material, {
      maxAgeMs: PUSH_TLS_SESSION_LIFETIME_S * 1000,
      maxEntries: PUSH_TLS_SESSION_STORE_ENTRIES,
    });
    this.#sessionFile =
      opts.sessionFile === undefined
        ? undefined
        : new SessionFile(opts.sessionFile, this.#sessions, {
            logger: this.#log,
            binding: () => sessionBindingOf(o.material),
          });
    o.material.on('tls-change', this.#onTlsChange);
    o.material.on('revoked-change', this.#onRevokedChange);
  }

  /** Wake-ups awaiting their answer right now (for tests and the worker's reports). */
  get wakesInFlight(): number {
    return this.#inFlight.size;
  }

  get connectedCount(): number {
    return this.#connected;
  }

  /** Dialled-in connections held now. */
  get dialledInCount(): number {
    return this.#dialledIn;
  }

  async start(targets: PushTarget[]): Promise<void> {
    if (this.#closed) throw new ConfigError('the push dialer is closed');
    if (this.#started) throw new ConfigError('the push dialer was started already');
    this.#started = true;
    let behind = 0;
    for (const t of targets) {
      const e = this.#entry(t.node, t.url, t.generation, t.ackedGeneration);
      if (t.url !== null && (t.ackedGeneration === null || t.ackedGeneration < t.generation)) {
        behind++;
        this.#activate(e);
      }
    }
    this.#log.info({ nodes: targets.length, behind }, 'push dialer started');
  }

  notify(node: string, generation: number, reason: WakeReason): void {
    if (this.#closed) return;
    const e = this.#entry(node, null, generation, null);
    if (generation > e.generation) e.generation = generation;
    // a dialled-in connection has no URL; a dialled one is open only where there is one
    if (e.ws !== null && e.ws.readyState === WebSocket.OPEN) this.#requestWake(e, reason);
    else if (e.url !== null) this.#activate(e); // the wake-up on connect carries the newest generation
  }

  setSigningKey(jwk: Ed25519PrivateJwk): void {
    this.#signer = new Signer(jwk, fastEd25519);
  }

  serveRequests(handler: PushRequestHandler): void {
    this.#requestHandler = handler;
  }

  setEndpoint(node: string, url: string | null, generation: number): void {
    if (this.#closed) return;
    const e = this.#entry(node, null, generation, null);
    if (generation > e.generation) e.generation = generation;
    if (e.inbound) {
      // it dialled in: the endpoint is dialled only once that connection ends
      e.url = url;
      return;
    }
    if (e.url === url && e.ps.state !== 'idle') return;
    if (e.url === url && url === null) return;
    const wasActive = e.active;
    this.#retire(e, GOING_AWAY, 'endpoint changed');
    e.url = url;
    e.attempt = 0;
    this.#setState(e, 'idle');
    if (url === null) return;
    const acked = e.ps.generation_acked;
    if (wasActive || acked === null || acked < e.generation) this.#activate(e);
  }

  /**
   * Forgets the node: its dialled connection is closed (1001) and not redialled. A connection it
   * dialled in stays, with nothing to dial after it: the agent holds it by its certificate
   * (revocation closes it), and closing it would only make it dial again.
   */
  remove(node: string): void {
    const e = this.#nodes.get(node);
    if (!e) return;
    if (e.inbound) {
      this.#stopDialling(e);
      e.url = null;
      return;
    }
    this.#retire(e, GOING_AWAY, 'node removed');
    this.#nodes.delete(node);
  }

  /**
   * Another dialer holds the node's connection now (its agent dialled in at another push worker:
   * controller/push/pool.ts): this one closes its own, a dialled-in one with 4000
   * `connection_replaced`, a dialled one with 1001, and forgets the node.
   */
  heldElsewhere(node: string): void {
    const e = this.#nodes.get(node);
    if (!e) return;
    if (e.inbound) this.#retire(e, REPLACED, 'connection_replaced');
    else this.#retire(e, GOING_AWAY, 'agent dialled in elsewhere');
    this.#nodes.delete(node);
  }

  // ---- dialled-in connections ----------------------------------------------------------------

  /**
   * Serves the agents' dialled-in connections on `listen` from this process (no push workers).
   * @throws ConfigError `bad_option` (field `connect-listen`) when it cannot listen there
   */
  async serveConnect(listen: ConnectListen): Promise<AddressInfo> {
    const l = this.connectListener();
    try {
      return await l.listen(listen.host, listen.port);
    } catch (err) {
      throw new ConfigError(`--connect-listen ${listen.host}:${listen.port}: ${(err as Error).message}`, {
        cause: err,
        field: 'connect-listen',
      });
    }
  }

  /** The listener whose connections this dialer holds (made on first use: a push worker hands it sockets). */
  connectListener(): ConnectListener {
    this.#connect ??= new ConnectListener({
      material: this.#o.material,
      logger: this.#log,
      metrics: this.#metrics,
      onConnection: (c) => this.attach(c),
      held: () => this.#dialledIn,
      ...(this.#o.connectHandshakeTimeoutMs === undefined
        ? {}
        : { handshakeTimeoutMs: this.#o.connectHandshakeTimeoutMs }),
      ...(this.#o.connectMaxPending === undefined ? {} : { maxPending: this.#o.connectMaxPending }),
    });
    return this.#connect;
  }

  /**
   * Holds an agent's dialled-in connection as its node's push connection: a dialled one of that
   * node is closed (1001) and not redialled while this lasts, an older dialled-in one is replaced
   * (4000 `connection_replaced`). No wake-up goes on it before the node's next `notify` (the
   * service answers the `attach` event with the node's ping and current generation).
   */
  attach(c: DialledIn): void {
    const ws = c.ws;
    if (this.#closed || this.#draining) {
      void closeSocket(ws, SERVICE_RESTART, 'shutting_down', this.#o.closeGraceMs);
      return;
    }
    const e = this.#entry(c.node, null, 0, null);
    this.#stopDialling(e);
    if (e.ws !== null) {
      const old = this.#detach(e);
      if (e.ps.via === 'dialled-in') {
        this.#log.info({ node: e.node, peer: c.peer }, "a newer dialled-in connection replaces the node's older one");
        if (old) void closeSocket(old, REPLACED, 'connection_replaced', this.#o.closeGraceMs);
      } else if (old) void closeSocket(old, GOING_AWAY, 'agent dialled in', this.#o.closeGraceMs);
    }
    e.ws = ws;
    e.inbound = true;
    e.active = true; // once it ends, the announced endpoint (if any) is dialled
    e.attempt = 0;
    e.failCode = null;
    e.peerSerial = c.serials[0] ?? null;
    e.peerIssuerSerial = c.serials[1] ?? null;
    e.peerNotBeforeMs = c.notBeforeMs;
    e.peerNotAfterMs = c.notAfterMs;
    e.heardAt = performance.now();
    this.#connected++;
    this.#dialledIn++;
    this.#metrics.connected(this.#connected);
    this.#metrics.dialledIn(this.#dialledIn);
    this.#silence.add(e);
    e.ps.via = 'dialled-in';
    e.wantReason = null;
    ws.on('message', (data, isBinary) => {
      if (e.ws !== ws) return;
      e.heardAt = performance.now();
      this.#onMessage(e, data as Buffer, isBinary);
    });
    ws.on('ping', () => {
      e.heardAt = performance.now();
    });
    ws.on('pong', () => {
      e.heardAt = performance.now();
    });
    ws.on('error', (err) => {
      if (e.ws !== ws) return;
      if (e.failCode === null) e.failCode = pushCodeOf(err);
      this.#log.debug({ node: e.node, code: e.failCode, err: err.message }, 'dialled-in connection error');
    });
    ws.on('close', (closeCode, reason) => {
      if (e.ws !== ws) return;
      let code = e.failCode;
      if (code === null) {
        const r = reason.toString('utf8');
        code = isErrorCode(r) ? r : 'connection_closed';
      }
      this.#log.info({ node: e.node, code, closeCode }, 'dialled-in connection lost');
      this.#down(e, code);
    });
    // the pool learns where the node is held before its state says connected
    this.#events.emit('attach', e.node);
    this.#setState(e, 'connected');
    this.#log.debug({ node: e.node, peer: c.peer }, 'agent dialled in');
  }

  /**
   * The controller's stop: takes no dialled-in connection from now on and closes those held
   * (1012 `shutting_down`), spread evenly over `windowMs`, so their agents reconnect to other
   * controllers over the window and not all at once: the i-th of n at i/n of the window, or at
   * `slotsMs[i]` when given (the pool spreads all its workers' connections over one window: each
   * worker closes its own at the moments it was given), any beyond those at the window's end.
   * Resolves once all are closed. Idempotent in effect (a second call finds none).
   */
  async drainConnect(windowMs: number, slotsMs?: readonly number[]): Promise<void> {
    this.#draining = true;
    this.#connect?.stopAccepting();
    const held = [...this.#nodes.values()].filter((e) => e.inbound && e.ws !== null);
    if (held.length === 0) return;
    this.#log.info({ connections: held.length, windowMs }, 'closing the dialled-in connections');
    const at = (i: number): number => (slotsMs === undefined ? (i * windowMs) / held.length : (slotsMs[i] ?? windowMs));
    const closing: Promise<void>[] = [];
    const start = performance.now();
    await new Promise<void>((resolve) => {
      let next = 0;
      const due = (): void => {
        // every connection whose moment has come
        const elapsed = performance.now() - start;
        while (next < held.length && at(next) <= elapsed) {
          const e = held[next++]!;
          if (!e.inbound || e.ws === null) continue; // gone meanwhile
          const p = this.#retire(e, SERVICE_RESTART, 'shutting_down');
          if (p) closing.push(p);
        }
        if (next >= held.length) {
          resolve();
          return;
        }
        const t = setTimeout(due, Math.max(1, at(next) - (performance.now() - start)));
        t.unref();
      };
      due();
    });
    await Promise.all(closing);
  }

  /** The silence wheel's visit: nothing from a dialled-in connection for the silence limit is half-open. */
  #checkSilence(e: NodeEntry): void {
    if (!e.inbound || e.ws === null) return;
    if (performance.now() - e.heardAt < this.#o.connectSilenceMaxMs) return;
    this.#log.warn({ node: e.node }, 'nothing from the dialled-in connection: it is half-open');
    this.#halfOpen(e);
  }

  state(node: string): PushState {
    const e = this.#nodes.get(node);
    if (!e) return { ...IDLE_PUSH_STATE };
    return { ...e.ps };
  }

  on<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    this.#events.on(event, fn as (...args: unknown[]) => void);
  }

  off<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    this.#events.off(event, fn as (...args: unknown[]) => void);
  }

  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    this.#o.material.off('tls-change', this.#onTlsChange);
    this.#o.material.off('revoked-change', this.#onRevokedChange);
    this.#wheel.clear();
    this.#silence.clear();
    void this.#connect?.close();
    this.#answersDue.stop();
    this.#waiting.clear();
    this.#dialWaiting.clear();
    const closing: Promise<void>[] = [];
    for (const e of this.#nodes.values()) {
      const p = this.#retire(e, GOING_AWAY, 'controller shutting down');
      if (p) closing.push(p);
    }
    this.#sessionFile?.close();
    this.#closing = Promise.all(closing).then(() => {
      this.#log.info({ nodes: this.#nodes.size }, 'push dialer closed');
    });
    return this.#closing;
  }

  // ---- nodes ---------------------------------------------------------------------------------

  #entry(node: string, url: string | null, generation: number, acked: number | null): NodeEntry {
    let e = this.#nodes.get(node);
    if (!e) {
      e = new NodeEntry(node, spiffeIdOf(this.#o.trustDomain, 'agent', node), url, generation, acked);
      this.#nodes.set(node, e);
    }
    return e;
  }

  #setState(e: NodeEntry, state: PushState['state']): void {
    e.ps.state = state;
    e.ps.connected = state === 'connected';
    if (!e.ps.connected) e.ps.via = null;
    this.#emitState(e);
  }

  #emitState(e: NodeEntry): void {
    if (this.#events.listenerCount('state') > 0) this.#events.emit('state', e.node, { ...e.ps });
  }

  #fail(e: NodeEntry, code: PushErrorCode): void {
    e.ps.last_error = code;
    e.ps.last_error_at = new Date(this.#o.clock()).toISOString();
  }

  /** Keeps a connection to this node from now on, dialling now unless one is open or pending. */
  #activate(e: NodeEntry): void {
    e.active = true;
    if (e.url === null || e.ws !== null || e.retryTimer !== null || e.dialQueued) return;
    if (e.ps.state === 'idle') this.#setState(e, 'connecting');
    this.#queueDial(e);
  }

  // ---- dialling ------------------------------------------------------------------------------

  #queueDial(e: NodeEntry): void {
    if (this.#dialsInFlight < this.#o.maxDialsInFlight) {
      this.#dial(e);
    } else {
      e.dialQueued = true;
      this.#dialWaiting.add(e);
    }
  }

  #dialDone(): void {
    this.#dialsInFlight--;
    while (this.#dialsInFlight < this.#o.maxDialsInFlight && this.#dialWaiting.size > 0) {
      const next = this.#dialWaiting.values().next().value as NodeEntry;
      this.#dialWaiting.delete(next);
      next.dialQueued = false;
      if (!this.#closed && next.active && next.url !== null && next.ws === null) this.#dial(next);
    }
  }

  #dial(e: NodeEntry): void {
    const url = e.url;
    if (url === null || this.#closed) return;
    // an address stored before today's rules (or by an operator's POST) is checked here too
    const literal = literalRefusal(url);
    if (literal !== null) {
      this.#log.warn(
        { event: 'push.dial_refused', node: e.node, code: literal.code, address: literal.host },
        'push dial refused: the endpoint is an address the controller never dials',
      );
      this.#fail(e, literal.code);
      this.#metrics.dialFailed(literal.code);
      this.#setState(e, 'disconnected');
      return;
    }
    this.#dialsInFlight++;
    e.failCode = null;
    e.peerSerial = null;
    e.peerIssuerSerial = null;
    e.peerNotBeforeMs = 0;
    const { checkServerIdentity: _legacy, ...base } = tlsClientOptions(this.#o.material, e.spiffeId);
    let ws: WebSocket;
    try {
      const options: tls.ConnectionOptions & WebSocket.ClientOptions = {
        ...base,
        secureContext: this.#context,
        // the SPIFFE id in the URI SAN identifies the agent; SNI would only leak the host name
        servername: '',
        perMessageDeflate: false,
        maxPayload: MAX_WS_PAYLOAD_BYTES,
        // frames go unmasked (a zero masking key, which ws sends and the agent's ws reads without
        // the XOR pass): masking guards HTTP intermediaries against script-chosen bytes (RFC 6455
        // §10.3), and inside mutual TLS no intermediary sees them (docs/departures.md)
        generateMask: zeroMask,
        followRedirects: false,
        // this connection answers the agent's fetches and signals (docs/protocol.md): it needs no API connection
        headers: { [FEATURES_HEADER]: `${FEATURE_FETCH}, ${FEATURE_SIGNAL}` },
        // a name is resolved here and each address checked; the socket connects to exactly the
        // addresses checked, so a DNS answer that changes between check and connect cannot slip by
        lookup: this.#checkedLookup(e),
        // identity, trust domain, EKUs and revocation (certs/tls.ts) on the presented chain as
        // X509 objects, not the legacy ones Node would build for checkServerIdentity; the chain
        // itself is OpenSSL's
        // (`path` is the request's here; to tls.connect it would name a Unix socket, as ws knows too)
        // A session of an earlier connection (of an earlier process too) is offered: a resumed
        // handshake costs both ends far less CPU, which a reconnect storm is bound by
        createConnection: (o: tls.ConnectionOptions) =>
          connectResumingX509(
            { ...o, path: undefined },
            this.#sessions,
            e.node,
            e.spiffeId,
            this.#o.material,
            (cert) =>
              cert === undefined
                ? new RefusalError('untrusted_certificate', 'the agent presented no certificate')
                : checkServerCertificate(this.#o.material, e.spiffeId, cert),
            (peer) => {
              e.peerSerial = peer.serials[0] ?? null;
              e.peerIssuerSerial = peer.serials[1] ?? null;
              e.peerNotAfterMs = peer.notAfterMs;
              e.peerNotBeforeMs = peer.notBeforeMs ?? 0;
            },
          ),
      } as unknown as tls.ConnectionOptions & WebSocket.ClientOptions;
      // @types/ws types checkServerIdentity wrongly (as returning boolean); ws hands it to tls.connect
      ws = new WebSocket(url, options as WebSocket.ClientOptions);
    } catch (err) {
      // a URL ws cannot parse: the API validates endpoints, so this is a bug or a bad store row
      this.#dialDone();
      this.#log.error({ node: e.node, url, err }, 'push endpoint is not a usable URL');
      this.#fail(e, 'unreachable');
      this.#metrics.dialFailed('unreachable');
      this.#setState(e, 'disconnected');
      return;
    }
    e.ws = ws;
    let dialing = true;
    const timer = setTimeout(() => {
      if (e.ws !== ws || ws.readyState !== WebSocket.CONNECTING) return;
      e.failCode = 'dial_timeout';
      ws.terminate();
    }, this.#o.dialTimeoutMs);
    timer.unref();
    e.dialTimer = timer;
    // this dial's own timer only: a retired dial's socket closes after the node's next dial has
    // begun, and clearing `e.dialTimer` then would leave that next dial without a timeout
    const dialEnd = (): void => {
      if (!dialing) return;
      dialing = false;
      clearTimeout(timer);
      if (e.dialTimer === timer) e.dialTimer = null;
      this.#dialDone();
    };

    ws.on('unexpected-response', (req, res) => {
      // the listener refuses with a 403 and {"error":{"code":..}} (docs/protocol.md): keep its code
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        if (body.length < MAX_WAKE_FRAME_BYTES) body += chunk;
      });
      const finish = (): void => {
        if (e.ws === ws) e.failCode = refusalCodeOf(res.statusCode ?? 0, body);
        // a refusal on a resumed session: the session (and the ticket this connection brought) is
        // dropped, so the next dial is a full handshake, which shows the agent what we are now
        forgetResumedSession(req.socket as tls.TLSSocket);
        req.destroy();
        ws.terminate();
      };
      res.on('end', finish);
      res.on('error', finish);
    });
    ws.on('open', () => {
      dialEnd();
      if (e.ws !== ws) return;
      this.#onOpen(e);
    });
    ws.on('message', (data, isBinary) => {
      if (e.ws !== ws) return;
      this.#onMessage(e, data as Buffer, isBinary);
    });
    ws.on('pong', () => {
      e.awaitingPong = false;
    });
    ws.on('error', (err) => {
      if (e.ws !== ws) return;
      if (e.failCode === null) e.failCode = pushCodeOf(err);
      this.#log.debug({ node: e.node, code: e.failCode, err: err.message }, 'push connection error');
    });
    ws.on('close', (closeCode, reason) => {
      dialEnd();
      if (e.ws !== ws) return;
      const wasOpen = e.ps.state === 'connected';
      let code = e.failCode;
      if (code === null) {
        const r = reason.toString('utf8');
        code = isErrorCode(r) ? r : wasOpen ? 'connection_closed' : 'connection_reset';
      }
      this.#log.info({ node: e.node, code, closeCode }, wasOpen ? 'push connection lost' : 'push dial failed');
      this.#down(e, code);
    });
  }

  /** A `lookup` for the socket that refuses the dial when any resolved address is refused. */
  #checkedLookup(e: NodeEntry): net.LookupFunction {
    const resolve = this.#o.lookup;
    return (hostname, options, callback) => {
      resolve(hostname, { ...options, all: true }, (err, addresses) => {
        if (err) return callback(err, '');
        if (!Array.isArray(addresses) || addresses.length === 0) {
          return callback(Object.assign(new Error(`${hostname} has no address`), { code: 'ENOTFOUND' }), '');
        }
        for (const a of addresses) {
          const r = addressRefusal(a.address);
          if (r === null) continue;
          e.failCode = r.code;
          this.#log.warn(
            { event: 'push.dial_refused', node: e.node, code: r.code, host: hostname, address: a.address },
            'push dial refused: the endpoint name resolves to an address the controller never dials',
          );
          return callback(
            new RefusalError(r.code, `${hostname} resolves to ${a.address}, an address the controller never dials`),
            '',
          );
        }
        if (options.all) callback(null, addresses);
        else callback(null, addresses[0]!.address, addresses[0]!.family);
      });
    };
  }

  #onOpen(e: NodeEntry): void {
    this.#connected++;
    this.#metrics.connected(this.#connected);
    e.awaitingPong = false;
    this.#wheel.add(e);
    e.ps.via = 'dialled';
    this.#setState(e, 'connected');
    this.#log.debug({ node: e.node }, 'push connection open');
    // nothing is missed while the connection was down: the first wake-up carries the newest gen
    e.wantReason = null;
    this.#requestWake(e, 'ping');
  }

  /**
   * The connection is gone (or given up): clean up, record why, and reconnect with backoff (a
   * dialled-in one is not redialled: the node's announced endpoint is, if it has one).
   */
  #down(e: NodeEntry, code: PushErrorCode): void {
    const inbound = e.inbound;
    this.#detach(e);
    this.#fail(e, code);
    this.#metrics.dialFailed(code);
    this.#setState(e, code === 'half_open' ? 'half_open' : 'disconnected');
    if (inbound) this.#events.emit('detach', e.node);
    if (!e.active || this.#closed || e.url === null || (inbound && this.#draining)) return;
    const delay = fullJitterMs(e.attempt++, this.#o.backoffBaseMs, this.#o.backoffMaxMs, this.#o.random);
    e.retryTimer = setTimeout(() => {
      e.retryTimer = null;
      if (!this.#closed && e.active && e.ws === null && e.url !== null && this.#nodes.get(e.node) === e)
        this.#queueDial(e);
    }, delay);
    e.retryTimer.unref();
  }

  /**
   * Forgets the socket and everything tied to it; the socket itself is the caller's business, and
   * so is the `detach` event of a dialled-in one (after its state is set: the pool reads the
   * node's state from the worker that held it until then).
   */
  #detach(e: NodeEntry): WebSocket | null {
    const ws = e.ws;
    e.ws = null;
    if (e.dialTimer) clearTimeout(e.dialTimer);
    e.dialTimer = null;
    if (e.ps.connected) {
      this.#connected--;
      this.#metrics.connected(this.#connected);
    }
    if (e.inbound) {
      e.inbound = false;
      this.#dialledIn--;
      this.#metrics.dialledIn(this.#dialledIn);
      this.#silence.delete(e);
    } else this.#wheel.delete(e);
    if (e.queued) {
      this.#waiting.delete(e);
      e.queued = false;
    }
    e.wantReason = null;
    this.#release(e);
    return ws;
  }

  /**
   * Closes the node's connection on purpose (endpoint changed, node removed, shutdown) and stops
   * reconnecting. Resolves when the socket is closed (at most closeGraceMs later).
   */
  #retire(e: NodeEntry, code: number, reason: string): Promise<void> | null {
    e.active = false;
    this.#stopDialling(e);
    const wasConnected = e.ps.connected;
    const inbound = e.inbound;
    const ws = this.#detach(e);
    if (wasConnected) this.#setState(e, 'idle');
    if (inbound) this.#events.emit('detach', e.node);
    if (ws === null) return null;
    return closeSocket(ws, code, reason, this.#o.closeGraceMs);
  }

  /** No redial, no queued dial: the node's connection is to be something else, or none. */
  #stopDialling(e: NodeEntry): void {
    if (e.retryTimer) clearTimeout(e.retryTimer);
    e.retryTimer = null;
    if (e.dialQueued) {
      this.#dialWaiting.delete(e);
      e.dialQueued = false;
    }
  }

  // ---- wake-ups ------------------------------------------------------------------------------

  #requestWake(e: NodeEntry, reason: WakeReason): void {
    e.wantReason = mergeReason(e.wantReason, reason);
    if (e.inflight !== null || e.queued) return; // coalesced: sent with the newest gen when due
    if (this.#inFlight.size >= this.#o.maxWakesInFlight) {
      e.queued = true;
      this.#waiting.add(e);
      return;
    }
    this.#send(e);
  }

  #send(e: NodeEntry): void {
    const ws = e.ws;
    const reason = e.wantReason;
    if (ws === null || ws.readyState !== WebSocket.OPEN || reason === null) return;
    e.wantReason = null;
    const now = this.#o.clock();
    const gen = e.generation;
    const jti = newJti();
    const token = signWake(this.#signer, { iss: this.#o.issuer, aud: e.spiffeId, gen, reason, nowS: now / 1000, jti });
    e.inflight = { jti, gen, sentAtMs: now, at: performance.now() };
    this.#inFlight.add(e);
    this.#answersDue.arm();
    ws.send(token);
    this.#metrics.sent();
    if (e.ps.generation_pushed === null || gen > e.ps.generation_pushed) e.ps.generation_pushed = gen;
    this.#emitState(e);
  }

  /** Frees the node's wake-up slot, if it holds one, and hands free slots to waiting nodes. */
  #release(e: NodeEntry): void {
    if (e.inflight === null) return;
    e.inflight = null;
    this.#inFlight.delete(e);
    this.#pump();
  }

  #pump(): void {
    while (this.#inFlight.size < this.#o.maxWakesInFlight && this.#waiting.size > 0) {
      const next = this.#waiting.values().next().value as NodeEntry;
      this.#waiting.delete(next);
      next.queued = false;
      this.#send(next);
    }
  }

  #onMessage(e: NodeEntry, data: Buffer, isBinary: boolean): void {
    let answer: AgentFrame;
    try {
      if (isBinary) throw new RefusalError('binary_frame');
      answer = decodeAgentFrame(data);
    } catch (err) {
      // not an answer at all: the wake-up stays unanswered and the timeout handles the rest
      this.#log.warn({ node: e.node, code: pushCodeOf(err) }, 'push answer refused');
      return;
    }
    if (answer.type === 'fetch') {
      const inm = answer.if_none_match ?? null;
      this.#onRequest(e, answer.nonce, { kind: 'fetch', node: e.node, nonce: answer.nonce, ifNoneMatch: inm });
      return;
    }
    if (answer.type === 'signal') {
      const r = { kind: 'signal', node: e.node, deploymentId: answer.deployment, body: answer.body } as const;
      this.#onRequest(e, answer.nonce, r);
      return;
    }
    const f = e.inflight;
    if (f === null || (answer.jti !== f.jti && !(answer.type === 'nack' && answer.jti === null))) {
      this.#log.debug({ node: e.node, jti: answer.jti }, 'push answer for no wake-up in flight');
      return;
    }
    const now = this.#o.clock();
    const latencyMs = now - f.sentAtMs;
    e.inflight = null;
    this.#inFlight.delete(e);
    if (answer.type === 'ack') {
      e.attempt = 0; // an answered wake-up proves the connection healthy
      e.ps.generation_acked = answer.gen;
      e.ps.last_ack_at = new Date(now).toISOString();
      this.#metrics.acked(latencyMs / 1000);
      this.#emitState(e);
      const ev: AckEvent = { node: e.node, jti: answer.jti, gen: answer.gen, fetch: answer.fetch, latencyMs };
      this.#events.emit('ack', ev);
    } else {
      this.#fail(e, answer.error);
      this.#metrics.nacked(answer.error);
      this.#log.warn({ node: e.node, code: answer.error, gen: f.gen }, 'wake-up refused by the agent');
      this.#emitState(e);
      this.#events.emit('nack', { node: e.node, jti: answer.jti, code: answer.error });
    }
    // waiting nodes first, then this node's own next wake-up joins the queue behind them
    this.#pump();
    if (e.wantReason !== null && e.ws !== null) {
      const reason = e.wantReason;
      e.wantReason = null;
      this.#requestWake(e, reason);
    }
  }

  /**
   * The agent asks on this connection for its metadata (`fetch`) or to record a result
   * (`signal`): the handler (`AgentAnswers`, in the main process) answers as the route would, rate
   * limit included, for this connection's node (never one a frame names). One of each kind per
   * node at a time: another while one is answered is 503 at once, and the agent asks HTTPS.
   */
  #onRequest(e: NodeEntry, nonce: string, r: PushRequest): void {
    const ws = e.ws;
    if (ws === null) return;
    const reply = (a: PushReply, after?: () => void): void => {
      if (e.ws !== ws || ws.readyState !== WebSocket.OPEN) return;
      const frame = r.kind === 'fetch' ? metadataFrameOf(nonce, a) : this.#signalledFrame(e, nonce, r, a);
      ws.send(frame, { binary: false }, after);
    };
    if (this.#o.clock() > e.peerNotAfterMs) {
      // the agent's certificate expired since the dial: what HTTPS would refuse, this refuses
      reply({ status: 403, error: 'certificate_expired' });
      this.#log.warn({ node: e.node }, 'agent certificate expired: closing its push connection');
      this.#closeForPolicy(e, ws, 'certificate_expired');
      return;
    }
    const handler = this.#requestHandler;
    const unavailable = unavailableReply(r.kind);
    if (handler === null) {
      reply(unavailable);
      return;
    }
    if (e.serving[r.kind] === ws || ws.bufferedAmount > MAX_PUSH_ANSWER_BUFFERED_BYTES) {
      // one at a time, and not while the last answer is still being written: the agent asks
      // over HTTPS meanwhile (a 5xx), so a slow answer never reads as a rate limit
      reply(unavailable);
      return;
    }
    e.serving[r.kind] = ws;
    const done = (): void => {
      if (e.serving[r.kind] === ws) e.serving[r.kind] = null;
    };
    handler(r).then(
      (a) => {
        if (a.status === 429) e.requestRefusals++;
        else e.requestRefusals = 0;
        if (e.ws !== ws || ws.readyState !== WebSocket.OPEN) return done();
        // the slot is free once the answer is written out, not when it is queued
        reply(a, done);
        if (e.requestRefusals >= MAX_PUSH_REFUSED_REQUESTS) {
          this.#log.warn(
            { node: e.node, refusals: e.requestRefusals },
            'push requests refused again and again: closing the connection',
          );
          e.requestRefusals = 0;
          this.#closeForPolicy(e, ws, 'rate_limited');
        }
      },
      (err: unknown) => {
        done();
        this.#log.error({ node: e.node, err, kind: r.kind }, 'push request handler failed');
        reply({ status: 500, error: 'internal' });
      },
    );
  }

  /**
   * A signal's answer as a signalled frame: the route's status and error code, signed for this
   * agent and this very signal (nonce, deployment, revision, body digest), since the agent drops
   * or keeps the result on it and takes no unsigned one (protocol/signal-answer.ts).
   */
  #signalledFrame(e: NodeEntry, nonce: string, r: PushSignalRequest, a: PushReply): string {
    const signature = signSignalled(this.#signer, {
      iss: this.#o.issuer,
      aud: e.spiffeId,
      nonce,
      deployment: r.deploymentId,
      body: r.body,
      status: a.status,
      error: a.error,
      retryAfterS: a.retryAfterS,
      nowS: this.#o.clock() / 1000,
    });
    return encodeSignalled({
      nonce,
      status: a.status,
      ...(a.error === undefined ? {} : { error: a.error }),
      ...(a.retryAfterS === undefined ? {} : { retry_after_s: a.retryAfterS }),
      signature,
    });
  }

  /**
   * The wake-ups sent `answerTimeoutMs` ago or longer and still unanswered. Timers run before
   * the poll phase: after a busy stretch (a reconnect storm) the answer may be waiting unread in
   * the socket, so each is judged after the poll phase has read it (setImmediate). It stays in
   * flight until then; the timer is armed for the next one (the sweep stops at the first not due).
   */
  #sweepUnanswered(now: number): void {
    for (const e of this.#inFlight) {
      const f = e.inflight!;
      if (now - f.at < this.#o.answerTimeoutMs) break;
      const jti = f.jti;
      setImmediate(() => this.#answerOverdue(e, jti));
    }
  }

  #answerOverdue(e: NodeEntry, jti: string): void {
    if (e.inflight?.jti !== jti) return;
    this.#log.warn({ node: e.node, gen: e.inflight.gen }, 'no answer to a wake-up: push connection is half-open');
    this.#halfOpen(e);
  }

  #halfOpen(e: NodeEntry): void {
    const ws = e.ws;
    if (ws === null) return;
    // keep `e.ws` until #down has run so the connected count and state are updated once
    this.#down(e, 'half_open');
    ws.terminate();
  }

  /** The wheel's visit: a connection that did not pong since the last ping is half-open. */
  #ping(e: NodeEntry): void {
    const ws = e.ws;
    if (ws === null || ws.readyState !== WebSocket.OPEN) return;
    if (e.awaitingPong) {
      this.#log.warn({ node: e.node }, 'no pong since the last ping: push connection is half-open');
      this.#halfOpen(e);
      return;
    }
    e.awaitingPong = true;
    ws.ping();
  }

  // ---- TLS material --------------------------------------------------------------------------

  /** One client context for every connection: a context per connection costs ~1 ms and ~30 KB. */
  #buildContext(): tls.SecureContext {
    const m = this.#o.material.current();
    return tls.createSecureContext({
      ca: m.ca,
      cert: m.cert,
      key: m.key,
      minVersion: 'TLSv1.3',
      maxVersion: 'TLSv1.3',
    });
  }

  #rebuildContext(): void {
    try {
      this.#context = this.#buildContext();
      this.#log.info('push client certificate reloaded');
    } catch (err) {
      this.#log.error({ err }, 'reloaded TLS material is unusable; keeping the last good one');
    }
  }

  /**
   * Another CA (added, removed, replaced): every live connection was verified against the old one,
   * so each is closed and dialled again, verified against the new one. A renewal of the
   * controller's own certificate keeps the CA and closes nothing.
   */
  #closeUntrusted(): void {
    const print = caPrintOf(this.#o.material);
    if (print === this.#caPrint) return;
    this.#caPrint = print;
    for (const e of this.#nodes.values()) {
      if (e.ws === null || e.ps.state !== 'connected') continue;
      this.#closeForPolicy(e, e.ws, 'untrusted_certificate', 'ca_changed');
    }
  }

  /** The node's connection is down with `code` (its state says so) and `ws` is closed with 1008 `reason`. */
  #closeForPolicy(e: NodeEntry, ws: WebSocket, code: PushErrorCode, reason: string = code): void {
    this.#down(e, code);
    void closeSocket(ws, POLICY_VIOLATION, reason, this.#o.closeGraceMs);
  }

  /**
   * Closes every connection (open or being dialled) whose agent certificate is revoked now: its
   * serial or its issuer's, or its identity's floor (a revoked node: certs/tls.ts
   * `identityFloorRefusal`) above its notBefore. Its session goes too, so the redial is a full
   * handshake, refused `revoked` while the revocation stands.
   */
  #closeRevoked(): void {
    const m = this.#o.material.current();
    const revoked = m.revokedSerials;
    const floors = m.identityFloors;
    for (const e of this.#nodes.values()) {
      if (e.ws === null || e.peerSerial === null) continue;
      const floor = floors.size === 0 ? undefined : floors.get(identityKey('agent', e.node));
      if (
        !revoked.has(e.peerSerial) &&
        !(e.peerIssuerSerial !== null && revoked.has(e.peerIssuerSerial)) &&
        !(floor !== undefined && e.peerNotBeforeMs < floor)
      )
        continue;
      this.#log.warn({ node: e.node, serial: e.peerSerial }, 'agent certificate revoked: closing its push connection');
      this.#sessions.delete(e.node);
      this.#closeForPolicy(e, e.ws, 'revoked');
    }
  }
}

function caPrintOf(material: PkiMaterial): string {
  return material
    .current()
    .caCerts.map((c) => c.fingerprint256)
    .sort()
    .join(',');
}

/** Closes with `code`, destroying the socket if the peer does not finish the handshake in time. */
function closeSocket(ws: WebSocket, code: number, reason: string, graceMs: number): Promise<void> {
  return new Promise((resolve) => {
    if (ws.readyState === WebSocket.CLOSED) return resolve();
    const timer = setTimeout(() => ws.terminate(), graceMs);
    timer.unref();
    ws.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    // errors after we gave up on the socket are expected (reset by the peer) and of no interest
    ws.on('error', () => {});
    if (ws.readyState === WebSocket.CONNECTING) ws.terminate();
    else if (ws.readyState === WebSocket.OPEN) ws.close(code, reason);
  });
}

/** The code of a refused upgrade: the listener's `{"error":{"code":..}}`, else `upgrade_refused`. */
function refusalCodeOf(status: number, body: string): PushErrorCode {
  try {
    const code = (JSON.parse(body) as { error?: { code?: unknown } })?.error?.code;
    if (isErrorCode(code)) return code;
  } catch {
    // not JSON: fall through
  }
  return status === 0 ? 'connection_reset' : 'upgrade_refused';
}

/** The refusal of an endpoint whose host is an IP literal the controller never dials, else null. */
function literalRefusal(url: string): { code: PushErrorCode; host: string } | null {
  let host: string;
  try {
    host = new URL(url).hostname;
  } catch {
    return null; // ws reports an unusable URL itself
  }
  if (host.startsWith('[')) host = host.slice(1, -1);
  if (parseIp(host) === null) return null;
  const r = addressRefusal(host);
  return r === null ? null : { code: r.code, host };
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/** What push sessions are made under: the CA and our own certificate (certs/session-file.ts). */
function sessionBindingOf(material: PkiMaterial): string {
  const m = material.current();
  return crypto.createHash('sha256').update(m.ca).update('\n').update(m.cert).digest('base64url');
}

/** A fetch's answer as a metadata frame; one over the agent's frame limit is sent as 507. */
function metadataFrameOf(nonce: string, r: PushReply): Buffer {
  const head: MetadataFrameHead = { type: 'metadata', nonce, status: r.status };
  if (r.etag !== undefined) head.etag = r.etag;
  if (r.signature !== undefined) head.signature = r.signature;
  if (r.error !== undefined) head.error = r.error;
  if (r.retryAfterS !== undefined) head.retry_after_s = r.retryAfterS;
  const frame = encodeMetadataFrame(head, r.status === 200 ? r.body : undefined);
  // over the agent's message limit it would close the connection (1009): it is told, and
  // fetches over HTTPS, whose own limit answers `response_too_large`
  if (frame.length <= MAX_PUSH_METADATA_FRAME_BYTES) return frame;
  return encodeMetadataFrame({ type: 'metadata', nonce, status: 507, error: 'response_too_large' });
}
