/**
 * The agent's live push connections to controllers (docs/protocol.md), whoever opened them: the
 * listener's accepted ones (agent/listener.ts) and the one the agent dials out (agent/dialer.ts).
 * Everything that happens once a WebSocket exists and its controller is authorized is here, once:
 * every frame is answered at once (ack or nack), and the only effect a valid wake-up can have is a
 * coalesced fetch. Who opened the TCP connection changes nothing about what is accepted on it.
 *
 * A controller that offers it (`Herald-Features: fetch`, on its upgrade request or on the upgrade
 * response of a connection the agent dialled) also answers the agent's fetches on the connection
 * (`fetchOverPush`): a `metadata` frame is taken only as the answer to the fetch this agent sent on
 * that connection, with its nonce, and checked by the fetcher exactly as an HTTPS answer (signature,
 * nonce, audience, issuer = this connection's controller, digest). One that offers `signal` takes
 * the agent's signals there too (`signalOverPush`), answered by a `signalled` frame with the route's
 * status, taken likewise only for the signal it answers.
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
import type { X509Certificate } from 'node:crypto';
import type tls from 'node:tls';
import type { WebSocket } from 'ws';
import { codeOf, RefusalError, type ErrorCode } from '../protocol/errors.js';
import {
  decodeControllerAnswer,
  encodeAck,
  encodeFetch,
  encodeNack,
  encodeSignal,
  isNackCode,
  type ControllerAnswer,
  type FetchState,
  type MetadataFrame,
  type NackCode,
  type SignalledFrame,
} from '../protocol/frames.js';
import { checkKeyIssuer, type KeySet } from '../protocol/jws.js';
import {
  AGENT_IDLE_CLOSE_MS,
  MAX_BAD_FRAMES,
  MAX_LATE_FETCH_ENTRIES,
  MAX_PUSH_SIGNAL_FRAME_BYTES,
  MAX_WAKE_FRAME_BYTES,
  PUSH_HEALTHY_WINDOW_MS,
} from '../protocol/limits.js';
import { verifySignalled } from '../protocol/signal-answer.js';
import { peekJti, verifiedKid, type WakeClaims, type WakeVerifier } from '../protocol/wake.js';
import type { CertIdentity } from '../certs/identity.js';
import { authorizeCertificate, type Logger, type PkiMaterial } from '../certs/tls.js';

/** WebSocket close codes the agent uses on a push connection. */
export const CLOSE_NORMAL = 1000;
export const CLOSE_GOING_AWAY = 1001;
export const CLOSE_POLICY = 1008;
/** A newer connection from the same controller identity took this one's place. */
export const CLOSE_REPLACED = 4000;

/** `{`: the first byte of a metadata frame; a wake-up (compact JWS) never starts with it. */
const OPEN_BRACE = 0x7b;

/** How long a closing WebSocket may take its close handshake before it is cut. */
const CLOSE_HANDSHAKE_MS = 1_000;

/** What an agent may ask on a push connection. */
export type PushRequestKind = 'fetch' | 'signal';

/**
 * Whether a request of this kind may go only on a proven connection. A fetch carries a nonce and
 * an ETag, and its answer is verified end to end (signature, nonce, digest); a signal carries the
 * result itself. Every new kind must say which it is.
 */
const NEEDS_PROOF: Record<PushRequestKind, boolean> = { fetch: false, signal: true };

/** The code a request over the push connection fails with when it gets no answer there. */
const FAILED: Record<PushRequestKind, ErrorCode> = { fetch: 'push_fetch_failed', signal: 'push_signal_failed' };

interface PendingRequest {
  nonce: string;
  timer: NodeJS.Timeout;
  resolve: (a: ControllerAnswer) => void;
  reject: (err: Error) => void;
}

/** A metadata frame that answered this agent's fetch, and the controller whose connection carried it. */
export interface PushFetchAnswer extends MetadataFrame {
  /** The SPIFFE id of the controller (this connection's verified peer): the metadata's `iss`. */
  issuer: string;
}

/** One authorized WebSocket to a controller, as its owner (listener or dialer) handed it over. */
export interface PushPeer {
  ws: WebSocket;
  /** The TLS socket under `ws`: corked while a wake-up is answered (see #onFrame). */
  sock: tls.TLSSocket;
  identity: CertIdentity;
  /** The controller's certificate, re-checked whenever trust changes. */
  cert: X509Certificate;
  /** `address:port`, for the log. */
  peer: string;
  /** What the controller answers on this connection (`Herald-Features: fetch, signal`). */
  offers: Record<PushRequestKind, boolean>;
}

/** A live push connection: a handle its owner closes, or tells of a pong, through `PushConnections`. */
export interface PushConnection extends PushPeer {
  badFrames: number;
  lastHeard: number;
  idleTimer: NodeJS.Timeout | undefined;
  closing: boolean;
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

/** The counters of frames and requests on push connections, for tests and metrics. */
export interface PushConnectionStats {
  /** Authenticated connections open now. */
  authenticated: number;
  /** Every refusal (the owner's before authentication too, when it shares this object). */
  refused: number;
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

export interface PushConnectionsOptions {
  material: PkiMaterial;
  verifier: WakeVerifier;
  /** A verified wake-up: start or queue a fetch (the coalescer). Must answer synchronously. */
  onWake: (claims: WakeClaims) => FetchState;
  /** The last generation fetched, for the ack's `gen`. */
  lastFetchedGen: () => number;
  log: Logger;
  /** The counters to keep (the owner's, so that its stats show them); default a fresh set. */
  stats?: PushConnectionStats;
  /** Default AGENT_IDLE_CLOSE_MS. */
  idleCloseMs?: number;
  /** Default MAX_BAD_FRAMES. */
  maxBadFrames?: number;
  /** Default PUSH_HEALTHY_WINDOW_MS. */
  healthyWindowMs?: number;
  /** Clock in ms; injectable. */
  now?: () => number;
}

/** A fresh set of counters. */
export function newPushConnectionStats(): PushConnectionStats {
  return {
    authenticated: 0,
    refused: 0,
    frames: 0,
    acks: 0,
    nacks: 0,
    pushFetches: 0,
    pushFetchesAnswered: 0,
    pushSignals: 0,
    pushSignalsAnswered: 0,
  };
}

/**
 * Events: `'push-change'` () when a connection opened or closed (push health may have changed);
 * `'disconnected'` ({ identity, peer, code }) when one closed, with the close code it saw;
 * `'refused'` ({ code, peer }) for every refusal of an authenticated controller, also logged.
 */
export class PushConnections extends EventEmitter {
  readonly #material: PkiMaterial;
  readonly #verifier: WakeVerifier;
  readonly #onWake: (claims: WakeClaims) => FetchState;
  readonly #lastFetchedGen: () => number;
  readonly #log: Logger;
  readonly #idleCloseMs: number;
  readonly #maxBadFrames: number;
  readonly #healthyWindowMs: number;
  readonly #now: () => number;
  /** Live connections by controller SPIFFE id. */
  readonly #conns = new Map<string, PushConnection>();
  /** Trust changed (CA, certificate, revoked.json, JWKS): every live connection is checked again. */
  readonly #onTrustChange = (): void => this.#recheckAll();
  #closed = false;
  readonly stats: PushConnectionStats;

  constructor(o: PushConnectionsOptions) {
    super();
    this.#material = o.material;
    this.#verifier = o.verifier;
    this.#onWake = o.onWake;
    this.#lastFetchedGen = o.lastFetchedGen;
    this.#log = o.log;
    this.#idleCloseMs = o.idleCloseMs ?? AGENT_IDLE_CLOSE_MS;
    this.#maxBadFrames = o.maxBadFrames ?? MAX_BAD_FRAMES;
    this.#healthyWindowMs = o.healthyWindowMs ?? PUSH_HEALTHY_WINDOW_MS;
    this.#now = o.now ?? Date.now;
    this.stats = o.stats ?? newPushConnectionStats();
    this.#material.on('revoked-change', this.#onTrustChange);
    this.#material.on('tls-change', this.#onTrustChange);
    this.#material.on('jwks-change', this.#onTrustChange);
  }

  /** Connections open now. */
  get size(): number {
    return this.#conns.size;
  }

  /** Whether a connection of controller `spiffeId` is open now. */
  has(spiffeId: string): boolean {
    return this.#conns.has(spiffeId);
  }

  /** The audience wake-ups and answers must name (this agent's SPIFFE id). */
  get audience(): string {
    return this.#verifier.audience;
  }

  /**
   * Takes an authorized WebSocket: from now on its frames are answered here. A connection of the
   * same controller identity already open is replaced (closed 4000 `connection_replaced`).
   */
  add(p: PushPeer): PushConnection {
    const id = p.identity.spiffeId;
    const old = this.#conns.get(id);
    if (old) {
      this.#log.info(
        { code: 'connection_replaced', peer: old.peer, identity: id },
        'a newer connection from the same controller replaces this one',
      );
      this.close(old, CLOSE_REPLACED, 'connection_replaced');
    }
    const c: PushConnection = {
      ...p,
      badFrames: 0,
      lastHeard: this.#now(),
      idleTimer: undefined,
      closing: false,
      pending: { fetch: null, signal: null },
      lateNonces: [],
      provenBy: null,
    };
    this.#conns.set(id, c);
    this.stats.authenticated = this.#conns.size;
    this.#armIdle(c, this.#idleCloseMs);
    const { ws, peer } = c;
    ws.on('message', (data: Buffer | ArrayBuffer | Buffer[], isBinary: boolean) =>
      this.#onFrame(c, toBuffer(data), isBinary),
    );
    ws.on('ping', () => this.heard(c));
    ws.on('error', (err: Error) => {
      // ws closes the connection itself (1009 over the payload limit, 1007 bad UTF-8, ...)
      this.#log.info(
        { peer, identity: id, err: err.message, code: (err as { code?: string }).code },
        'wake-up connection error',
      );
    });
    ws.on('close', (code: number, reason: Buffer) => {
      clearTimeout(c.idleTimer);
      this.#failRequests(c, `the push connection closed (${code})`);
      if (this.#conns.get(id) === c) {
        this.#conns.delete(id);
        this.stats.authenticated = this.#conns.size;
      }
      this.#log.info(
        { peer, identity: id, close: code, reason: reason.toString().slice(0, 123) },
        'controller disconnected',
      );
      this.emit('disconnected', { identity: id, peer, code });
      this.emit('push-change');
    });
    this.emit('push-change');
    return c;
  }

  /** Something came from the controller that is not a frame (a pong): the connection is alive. */
  heard(c: PushConnection): void {
    c.lastHeard = this.#now();
  }

  /** Push is healthy: a connection is open and a ping, pong or frame came within the window. */
  isPushHealthy(): boolean {
    const now = this.#now();
    for (const c of this.#conns.values()) if (!c.closing && now - c.lastHeard < this.#healthyWindowMs) return true;
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
        this.refused(codeOf(err) ?? 'bad_response', c.peer, (err as Error).message, c.identity.spiffeId);
        throw err;
      }
      this.stats.pushSignalsAnswered++;
      return a;
    });
  }

  /**
   * Closes `c` with `code` and `reason`: its requests in flight fail (the caller asks HTTPS), it
   * leaves the set at once, and it is cut if the peer does not finish the close handshake in time.
   * Idempotent.
   */
  close(c: PushConnection, code: number, reason: string): void {
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

  /** Closes every connection (1001 `shutting_down`) and stops following trust changes. Idempotent. */
  closeAll(): void {
    if (!this.#closed) {
      this.#closed = true;
      this.#material.off('revoked-change', this.#onTrustChange);
      this.#material.off('tls-change', this.#onTrustChange);
      this.#material.off('jwks-change', this.#onTrustChange);
    }
    for (const c of [...this.#conns.values()]) this.close(c, CLOSE_GOING_AWAY, 'shutting_down');
  }

  /** A refusal of an authenticated controller: one log line each (it has an identity to name). */
  refused(code: ErrorCode | string, peer: string, message: string, identity?: string): void {
    this.stats.refused++;
    this.#log.warn({ code, peer, ...(identity ? { identity } : {}) }, `refused: ${message}`);
    this.emit('refused', { code, peer });
  }

  // ---- frames ------------------------------------------------------------------------------

  #onFrame(c: PushConnection, buf: Buffer, isBinary: boolean): void {
    if (c.closing) return;
    c.lastHeard = this.#now();
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

  #onWakeFrame(c: PushConnection, buf: Buffer): void {
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
  #onAnswerFrame(c: PushConnection, buf: Buffer): void {
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
      this.refused(
        'unexpected_frame',
        c.peer,
        `a ${a.type} frame that answers no ${kind} asked on this connection`,
        c.identity.spiffeId,
      );
      this.close(c, CLOSE_POLICY, 'unexpected_frame');
      return;
    }
    this.#settle(c, kind, (q) => q.resolve(a));
  }

  /** A request given up on: its answer, should it come, is dropped (the newest MAX_LATE_FETCH_ENTRIES). */
  #noteLate(c: PushConnection, nonce: string): void {
    c.lateNonces.push(nonce);
    if (c.lateNonces.length > MAX_LATE_FETCH_ENTRIES) c.lateNonces.shift();
  }

  /** Ends this connection's `kind` request in flight, if any, with `how`. */
  #settle(c: PushConnection, kind: PushRequestKind, how: (p: PendingRequest) => void): void {
    const p = c.pending[kind];
    if (p === null) return;
    c.pending[kind] = null;
    clearTimeout(p.timer);
    how(p);
  }

  #failRequests(c: PushConnection, why: string): void {
    for (const kind of ['fetch', 'signal'] as const)
      this.#settle(c, kind, (p) => p.reject(new RefusalError(FAILED[kind], why)));
  }

  #nack(c: PushConnection, jti: string | null, code: NackCode): void {
    this.stats.nacks++;
    c.ws.send(encodeNack(jti, code));
    this.#badFrame(c, code, 'refused wake-up');
  }

  /** A bad frame: logged, counted, and the connection closed with 1008 at MAX_BAD_FRAMES. */
  #badFrame(c: PushConnection, code: ErrorCode, what: string): void {
    c.badFrames++;
    this.refused(code, c.peer, `${what}: bad frame ${c.badFrames} of ${this.#maxBadFrames}`, c.identity.spiffeId);
    if (c.badFrames >= this.#maxBadFrames) {
      this.refused('too_many_bad_frames', c.peer, `${c.badFrames} bad frames`, c.identity.spiffeId);
      this.close(c, CLOSE_POLICY, 'too_many_bad_frames');
    }
  }

  // ---- requests ----------------------------------------------------------------------------

  /**
   * The healthy connection heard from last whose controller answers `kind` (and, for a kind that
   * needs it, has proven to reach the signing key), if it has none in flight.
   */
  #pick(kind: PushRequestKind): PushConnection | null {
    const now = this.#now();
    let best: PushConnection | null = null;
    for (const c of this.#conns.values()) {
      if (NEEDS_PROOF[kind] && c.provenBy === null) continue;
      if (!c.offers[kind] || c.closing || now - c.lastHeard >= this.#healthyWindowMs) continue;
      if (best === null || c.lastHeard > best.lastHeard) best = c;
    }
    return best === null || best.pending[kind] !== null ? null : best;
  }

  #ask(
    c: PushConnection,
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

  // ---- liveness and trust ------------------------------------------------------------------

  #armIdle(c: PushConnection, ms: number): void {
    c.idleTimer = setTimeout(
      () => {
        if (c.closing) return;
        const quiet = this.#now() - c.lastHeard;
        if (quiet >= this.#idleCloseMs) {
          this.#log.info(
            { code: 'idle_timeout', peer: c.peer, identity: c.identity.spiffeId },
            'closing an idle wake-up connection',
          );
          this.close(c, CLOSE_NORMAL, 'idle_timeout');
        } else {
          this.#armIdle(c, this.#idleCloseMs - quiet);
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
        this.refused(r.code, c.peer, r.message, c.identity.spiffeId);
        this.close(c, CLOSE_POLICY, r.code);
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

function toBuffer(data: Buffer | ArrayBuffer | Buffer[]): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}
