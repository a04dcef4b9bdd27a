/**
 * The PushService of a controller whose push connections live in worker processes
 * (`--push-workers N`). Why: one process may hold 20,000 descriptors here, and 10,000 agents
 * need 10,000 push connections plus their kept-alive fetch connections to the API; with the
 * dialers in workers the main process keeps its descriptors for the API (docs/architecture-push.md).
 *
 * Nodes are sharded over the workers by a hash of the node id; commands go out (a change set's
 * wake-ups as soon as it is applied) and events come back batched (see #schedule). The facade
 * mirrors each node's push state and target, so `state()` is synchronous and a worker that dies
 * is restarted with its shard's targets.
 *
 * Dialled-in connections (`--connect-listen`): this process accepts each TCP connection, reads
 * nothing, and hands the socket to a worker in turn, which does the TLS and holds the
 * connection; the node's agent cannot be told from the first bytes, so it is held wherever it
 * landed. Each worker says which nodes it holds (`attach`, `detach`): a node's wake-ups go to the
 * worker holding its dialled-in connection, else to its shard's, whose dialled connection to the
 * node (if any) is closed meanwhile and dialled again once the dialled-in one ends.
 */
import { childEnv } from '../../protocol/child-env.js';
import { fork, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { MaterialPaths } from '../../certs/paths.js';
import { ConfigError } from '../../protocol/errors.js';
import type { Ed25519PrivateJwk } from '../../protocol/jws.js';
import {
  IPC_BATCH_MAX_DELAY_MS,
  MAX_CONNECT_PENDING_CONNECTIONS,
  PUSH_CLOSE_GRACE_MS,
  MAX_TIMER_DELAY_MS,
  MAX_PUSH_REQUESTS_IN_FLIGHT,
  MAX_PUSH_WORKER_PROCESSES,
  PUSH_REQUEST_ANSWER_TIMEOUT_MS,
  PUSH_WORKER_MMAP_THRESHOLD_BYTES,
  RECONNECT_BACKOFF_MAX_MS,
} from '../../protocol/limits.js';
import type { WakeReason } from '../../protocol/wake.js';
import {
  MalformedBatchError,
  readWorkerEvents,
  type FromWorker,
  type PushTuning,
  type ToWorker,
  type ToWorkerCommand,
  WorkerCommands,
} from './ipc.js';
import { OldestFirstTimer } from './oldest-first-timer.js';
import { promPushMetrics, type PushMetricsSink } from './metrics.js';
import { TurnFlusher } from './turn-flusher.js';
import {
  type ConnectListen,
  IDLE_PUSH_STATE,
  type PushEvents,
  type PushRequest,
  type PushRequestHandler,
  type PushReply,
  unavailableReply,
  type PushService,
  type PushState,
  type PushTarget,
} from './types.js';

/** Longest a worker gets to close its connections (1001) before it is killed. */
export const PUSH_WORKER_CLOSE_MS = 5_000;
/** First delay before a crashed worker is started again (doubling to RECONNECT_BACKOFF_MAX_MS). */
export const PUSH_WORKER_RESTART_BASE_MS = 500;

export interface PushPoolOptions {
  /** Worker processes (default 1; `herald controller` picks by the cores: controller/options.ts). */
  workers?: number;
  signingJwk: Ed25519PrivateJwk;
  issuer: string;
  trustDomain: string;
  /** The controller's PKI files; each worker loads and watches them itself. */
  material: MaterialPaths;
  logger: Logger;
  metrics?: Registry;
  /** Default: the compiled `dist/controller/push/worker.js`. */
  workerScript?: string;
  tuning?: PushTuning;
  /** The file worker `i` keeps its TLS sessions with the agents in (none: in memory only). */
  sessionFile?: (worker: number) => string;
  /** Requests answered at once (default MAX_PUSH_REQUESTS_IN_FLIGHT). */
  requestsInFlight?: number;
  /** How long a worker waits for a request's answer (default PUSH_REQUEST_ANSWER_TIMEOUT_MS; shorter in tests). */
  requestAnswerTimeoutMs?: number;
  /** Sockets of `--connect-listen` waiting here for each worker (default MAX_CONNECT_PENDING_CONNECTIONS). */
  connectMaxWaiting?: number;
}

interface Shard {
  index: number;
  child: ChildProcess | null;
  ready: boolean;
  /** Commands waiting for the next flush (or for the worker to be ready). */
  queue: WorkerCommands;
  /** Posts the queue at the end of the turn, or IPC_BATCH_MAX_DELAY_MS into a long one. */
  batches: TurnFlusher;
  /** A flush at the end of the current microtask checkpoint is pending (see #schedule). */
  flushSoon: boolean;
  restarts: number;
  connected: number;
  /** Of `connected`, the dialled-in connections. */
  dialledIn: number;
  closedWaiter: (() => void) | null;
  /** Called when the worker answers `drained` (or exits). */
  drainedWaiter: (() => void) | null;
  /** Sockets of `--connect-listen` waiting to be handed to this worker, oldest first (see #handOff). */
  handoffs: net.Socket[];
  /** A socket was sent and the worker has not said `took` yet. */
  handingOff: boolean;
}

/** Taken requests at the head of the queue past which it is copied down (see #pumpRequests). */
const REQUEST_QUEUE_COMPACT_AT = 4_096;

/** A worker's request waiting for the handler; `child` is the worker that asked. */
interface QueuedRequest {
  s: Shard;
  child: ChildProcess;
  id: number;
  r: PushRequest;
  /**
   * When it came (performance.now(): a wall clock stepped back must not hold a place longer):
   * past `requestAnswerTimeoutMs` the worker has answered it 503 itself.
   */
  at: number;
}

/** The compiled worker beside this module, or under dist/ when this module runs from source. */
export function defaultWorkerScript(): string {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith('.js')) return path.join(path.dirname(here), 'worker.js');
  return path.resolve(path.dirname(here), '..', '..', 'dist', 'controller', 'push', 'worker.js');
}

/** FNV-1a: a stable shard for a node id, the same in every run. */
export function shardOf(node: string, shards: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < node.length; i++) {
    h ^= node.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) % shards;
}

export class PushPool implements PushService {
  readonly #o: PushPoolOptions & {
    workers: number;
    workerScript: string;
    tuning: PushTuning;
    requestsInFlight: number;
    requestAnswerTimeoutMs: number;
    connectMaxWaiting: number;
  };
  readonly #log: Logger;
  readonly #metrics: PushMetricsSink;
  readonly #events = new EventEmitter();
  readonly #shards: Shard[];
  readonly #targets = new Map<string, PushTarget>();
  readonly #states = new Map<string, PushState>();
  /** Nodes whose dialled-in connection a worker holds, and which one. */
  readonly #held = new Map<string, Shard>();
  /** `--connect-listen`: accepts, and hands each socket to a worker (#handOff). */
  #connectServer: net.Server | null = null;
  /** The worker the next dialled-in socket goes to (round robin). */
  #nextHandOff = 0;
  #draining = false;
  /** The database's identity floors as last given (`setIdentityFloors`), for every worker started. */
  #floors: [string, number][] = [];
  #requestHandler: PushRequestHandler | null = null;
  /** Requests waiting for the handler, oldest first from `#requestsHead` (see MAX_PUSH_REQUESTS_IN_FLIGHT). */
  #requests: QueuedRequest[] = [];
  #requestsHead = 0;
  /** Requests being answered, in the order they were started (so oldest first: they start in arrival order). */
  readonly #answering = new Set<QueuedRequest>();
  /** One timer for all of them: due when the oldest's worker stops waiting (see #sweepAnswering). */
  readonly #overdue: OldestFirstTimer;
  #started = false;
  #closed = false;
  #closing: Promise<void> | null = null;

  /** @throws ConfigError naming a bad option (worker count, missing worker script) */
  constructor(opts: PushPoolOptions) {
    const o = {
      workers: 1,
      workerScript: defaultWorkerScript(),
      tuning: {},
      requestsInFlight: MAX_PUSH_REQUESTS_IN_FLIGHT,
      requestAnswerTimeoutMs: PUSH_REQUEST_ANSWER_TIMEOUT_MS,
      connectMaxWaiting: MAX_CONNECT_PENDING_CONNECTIONS,
      ...opts,
    };
    if (!Number.isInteger(o.workers) || o.workers < 1 || o.workers > MAX_PUSH_WORKER_PROCESSES) {
      throw new ConfigError(`--push-workers must be a whole number from 1 to ${MAX_PUSH_WORKER_PROCESSES}`, {
        field: 'workers',
      });
    }
    if (
      !Number.isInteger(o.requestAnswerTimeoutMs) ||
      o.requestAnswerTimeoutMs < 1 ||
      o.requestAnswerTimeoutMs > MAX_TIMER_DELAY_MS
    ) {
      throw new ConfigError(`requestAnswerTimeoutMs must be a whole number of ms from 1 to ${MAX_TIMER_DELAY_MS}`, {
        field: 'requestAnswerTimeoutMs',
      });
    }
    if (!fs.existsSync(o.workerScript))
      throw new ConfigError(`push worker ${o.workerScript} not found (run npm run build)`, { field: 'workerScript' });
    this.#o = o;
    this.#overdue = new OldestFirstTimer(
      o.requestAnswerTimeoutMs,
      () => this.#answering.values().next().value?.at,
      (now) => this.#sweepAnswering(now),
    );
    this.#log = o.logger.child({ component: 'push-pool' });
    this.#metrics = promPushMetrics(o.metrics);
    this.#shards = Array.from({ length: o.workers }, (_, index) => {
      const s: Shard = {
        index,
        child: null,
        ready: false,
        queue: new WorkerCommands(),
        batches: new TurnFlusher(() => this.#flush(s), IPC_BATCH_MAX_DELAY_MS),
        flushSoon: false,
        restarts: 0,
        connected: 0,
        dialledIn: 0,
        closedWaiter: null,
        drainedWaiter: null,
        handoffs: [],
        handingOff: false,
      };
      return s;
    });
  }

  async start(targets: PushTarget[]): Promise<void> {
    if (this.#closed) throw new ConfigError('the push pool is closed');
    if (this.#started) throw new ConfigError('the push pool was started already');
    this.#started = true;
    for (const t of targets) this.#targets.set(t.node, { ...t });
    await Promise.all(this.#shards.map((s) => this.#spawn(s)));
    this.#log.info({ workers: this.#shards.length, nodes: targets.length }, 'push workers started');
  }

  notify(node: string, generation: number, reason: WakeReason): void {
    if (this.#closed) return;
    const t = this.#target(node);
    if (generation > t.generation) t.generation = generation;
    const s = this.#holderOf(node);
    s.queue.notify(node, generation, reason);
    this.#schedule(s, true);
  }

  setEndpoint(node: string, url: string | null, generation: number): void {
    if (this.#closed) return;
    const t = this.#target(node);
    t.url = url;
    if (generation > t.generation) t.generation = generation;
    const held = this.#held.get(node);
    // held by another worker: its shard's worker is told once that connection ends (#detached)
    if (held !== undefined && held !== this.#shardOf(node)) return;
    this.#send(node, { t: 'endpoint', node, url, gen: generation });
  }

  setSigningKey(jwk: Ed25519PrivateJwk): void {
    if (this.#closed) return;
    // a worker restarted later is initialised with the new key; running ones get a command
    this.#o.signingJwk = jwk;
    for (const s of this.#shards) {
      s.queue.other({ t: 'signing-key', jwk });
      this.#schedule(s);
    }
  }

  /**
   * The workers load revoked.json themselves but not the database: each is sent these floors
   * when they change and at its start, and closes its connections to agents now under them.
   */
  setIdentityFloors(floors: ReadonlyMap<string, number>): void {
    if (this.#closed) return;
    const next = [...floors];
    const prev = new Map(this.#floors);
    if (next.length === prev.size && next.every(([k, v]) => prev.get(k) === v)) return;
    this.#floors = next;
    for (const s of this.#shards) {
      s.queue.other({ t: 'identity-floors', floors: next });
      this.#schedule(s);
    }
  }

  serveRequests(handler: PushRequestHandler): void {
    this.#requestHandler = handler;
  }

  remove(node: string): void {
    if (this.#closed) return;
    this.#targets.delete(node);
    // a dialled-in connection stays (PushDialer.remove), and so does its state
    if (!this.#held.has(node)) this.#states.delete(node);
    const s = this.#holderOf(node);
    s.queue.other({ t: 'remove', node });
    this.#schedule(s);
  }

  /**
   * Accepts the agents' dialled-in connections on `listen` here and hands each socket, unread, to
   * the workers in turn (controller/push/connect-listener.ts serves it there).
   * @throws ConfigError `bad_option` (field `connect-listen`) when it cannot listen there
   */
  async serveConnect(listen: ConnectListen): Promise<AddressInfo> {
    if (this.#connectServer !== null) throw new ConfigError('the push pool serves --connect-listen already');
    // paused: this process reads nothing of it, the worker's TLS server does
    const server = net.createServer({ pauseOnConnect: true }, (socket) => this.#handOff(socket));
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(listen.port, listen.host, () => {
          server.off('error', reject);
          resolve();
        });
      });
    } catch (err) {
      throw new ConfigError(`--connect-listen ${listen.host}:${listen.port}: ${(err as Error).message}`, {
        cause: err,
        field: 'connect-listen',
      });
    }
    server.on('error', (err) => this.#log.error({ err }, 'connect listener error'));
    this.#connectServer = server;
    return server.address() as AddressInfo;
  }

  /**
   * Stops accepting dialled-in connections and has every worker close those it holds (1012),
   * spread over `windowMs` all together; resolves when all have, or a worker has not within the
   * window and PUSH_CLOSE_GRACE_MS more (its connections go with its `close`).
   */
  async drainConnect(windowMs: number): Promise<void> {
    this.#draining = true;
    const server = this.#connectServer;
    this.#connectServer = null;
    server?.close();
    for (const s of this.#shards) this.#dropSockets(s, 'shutting_down');
    const slots = this.#drainSlots(windowMs);
    await Promise.all(
      this.#shards.map(
        (s) =>
          new Promise<void>((resolve) => {
            if (!s.ready || s.child === null) return resolve();
            const timer = setTimeout(resolve, windowMs + PUSH_CLOSE_GRACE_MS + IPC_BATCH_MAX_DELAY_MS);
            timer.unref();
            s.drainedWaiter = () => {
              clearTimeout(timer);
              s.drainedWaiter = null;
              resolve();
            };
            s.queue.other({ t: 'drain', windowMs, slotsMs: slots[s.index]! });
            s.batches.flushNow();
          }),
      ),
    );
  }

  state(node: string): PushState {
    const s = this.#states.get(node);
    return s ? { ...s } : { ...IDLE_PUSH_STATE };
  }

  on<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    this.#events.on(event, fn as (...args: unknown[]) => void);
  }

  off<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    this.#events.off(event, fn as (...args: unknown[]) => void);
  }

  /** Workers' requests waiting for their turn at the handler (not those being answered). */
  get requestsWaiting(): number {
    return this.#requests.length - this.#requestsHead;
  }

  /** Sockets of `--connect-listen` accepted and waiting to be handed to a worker, for tests and diagnostics. */
  get connectHandoffsWaiting(): number {
    return this.#shards.reduce((n, s) => n + s.handoffs.length, 0);
  }

  /** Workers' requests being answered now (each holding one of the `requestsInFlight` places). */
  get requestsAnswering(): number {
    return this.#answering.size;
  }

  /** Worker process ids, for tests and diagnostics. */
  get workerPids(): number[] {
    return this.#shards.flatMap((s) => (s.child?.pid !== undefined ? [s.child.pid] : []));
  }

  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    this.#connectServer?.close();
    this.#connectServer = null;
    for (const s of this.#shards) this.#dropSockets(s, 'shutting_down');
    // requests still waiting are not started: their connections close with the workers (1001),
    // and the agents ask again over HTTPS or after their redial
    this.#requests = [];
    this.#requestsHead = 0;
    this.#overdue.stop();
    this.#closing = Promise.all(this.#shards.map((s) => this.#closeShard(s))).then(() => {
      this.#metrics.connected(0);
      this.#log.info('push workers stopped');
    });
    return this.#closing;
  }

  // ---- workers -------------------------------------------------------------------------------

  #target(node: string): PushTarget {
    let t = this.#targets.get(node);
    if (!t) {
      t = { node, url: null, generation: 0, ackedGeneration: null };
      this.#targets.set(node, t);
    }
    return t;
  }

  #shardOf(node: string): Shard {
    return this.#shards[shardOf(node, this.#shards.length)]!;
  }

  /** The worker holding the node's dialled-in connection, else its shard's. */
  #holderOf(node: string): Shard {
    return this.#held.get(node) ?? this.#shardOf(node);
  }

  /**
   * A socket of `--connect-listen`, to the next ready worker; none ready (all restarting): destroyed.
   * Each worker has at most one socket on its way: Node's channel holds every message sent after a
   * handle until the child acknowledges it, so sockets sent as they come would queue the wake-ups,
   * answers and commands behind them, one worker turn each (a reconnect storm held a wake-up for
   * ~2 s: `npm run bench -- --dial-out`). The others wait here, unread, at most
   * MAX_CONNECT_PENDING_CONNECTIONS a worker (more are cut, `too_many_connections`), and go one at
   * a time as the worker says it took the last (`took`).
   */
  #handOff(socket: net.Socket): void {
    const n = this.#shards.length;
    for (let k = 0; k < n; k++) {
      const s = this.#shards[(this.#nextHandOff + k) % n]!;
      if (!s.ready || s.child === null || this.#draining || this.#closed) continue;
      this.#nextHandOff = (s.index + 1) % n;
      if (s.handoffs.length >= this.#o.connectMaxWaiting) {
        socket.destroy();
        this.#metrics.connectRefused('too_many_connections');
        return;
      }
      s.handoffs.push(socket);
      this.#nextSocket(s);
      return;
    }
    socket.destroy();
    this.#metrics.connectRefused(this.#draining || this.#closed ? 'shutting_down' : 'connect_unavailable');
  }

  /** Sends worker `s` its next waiting socket, unless one is on its way (or none waits). */
  #nextSocket(s: Shard): void {
    while (!s.handingOff && s.handoffs.length > 0) {
      const socket = s.handoffs.shift()!;
      // gone while it waited (the agent gave up): nothing to hand over
      if (socket.destroyed) continue;
      const child = s.child;
      if (!s.ready || child === null) {
        socket.destroy();
        continue;
      }
      s.handingOff = true;
      try {
        // the handle travels with its own message; the socket is closed here once sent
        child.send({ t: 'connection' }, socket, {}, (err) => {
          if (err) socket.destroy();
        });
      } catch {
        socket.destroy();
        s.handingOff = false;
      }
    }
  }

  /** The sockets waiting for worker `s` are cut (it died, or the pool drains or closes), counted as `code`. */
  #dropSockets(s: Shard, code: 'connect_unavailable' | 'shutting_down'): void {
    const waiting = s.handoffs.splice(0);
    s.handingOff = false;
    for (const socket of waiting) socket.destroy();
    if (waiting.length > 0) this.#metrics.connectRefused(code, waiting.length);
  }

  /** A worker holds the node's dialled-in connection now: the node's wake-ups go there, and no other worker keeps one. */
  #attached(s: Shard, node: string): void {
    const prev = this.#held.get(node);
    this.#held.set(node, s);
    // an older dialled-in connection at another worker is replaced (4000), as within one worker
    if (prev !== undefined && prev !== s) this.#tell(prev, { t: 'held-elsewhere', node });
    // the shard's worker closes a dialled connection it has, and dials no more while this lasts
    const shard = this.#shardOf(node);
    if (shard !== s && shard !== prev) this.#tell(shard, { t: 'held-elsewhere', node });
    this.#events.emit('attach', node);
  }

  /**
   * The node's dialled-in connection at worker `s` is gone. If `s` was holding it for another
   * shard, that worker forgets the node and its shard's worker dials the announced endpoint, if
   * there is one (within one worker, its dialer does both itself).
   */
  #detached(s: Shard, node: string): void {
    if (this.#held.get(node) !== s) return; // replaced at another worker meanwhile
    this.#held.delete(node);
    this.#events.emit('detach', node);
    const shard = this.#shardOf(node);
    if (shard === s) return;
    this.#tell(s, { t: 'remove', node });
    const t = this.#targets.get(node);
    if (t === undefined) {
      this.#states.delete(node); // removed while held
      return;
    }
    if (t.url === null || this.#closed || this.#draining) return;
    this.#tell(shard, { t: 'endpoint', node, url: t.url, gen: t.generation });
    shard.queue.notify(node, t.generation, 'ping');
    this.#schedule(shard, true);
  }

  /**
   * The moments (ms into the window) at which each worker closes its dialled-in connections: the
   * i-th of all n at i/n of the window, dealt to the workers in turn, so the closes of all of them
   * together are spread evenly (each worker spreading its own share alone would close one of
   * each at the window's start).
   */
  #drainSlots(windowMs: number): number[][] {
    const left = this.#shards.map(() => 0);
    for (const s of this.#held.values()) left[s.index]!++;
    const slots: number[][] = this.#shards.map(() => []);
    const n = this.#held.size;
    let i = 0;
    while (i < n)
      for (const s of this.#shards) {
        if (left[s.index]! === 0) continue;
        left[s.index]!--;
        slots[s.index]!.push((i++ * windowMs) / n);
      }
    return slots;
  }

  #tell(s: Shard, cmd: ToWorkerCommand): void {
    s.queue.other(cmd);
    this.#schedule(s);
  }

  #send(node: string, cmd: ToWorkerCommand): void {
    const s = this.#shardOf(node);
    s.queue.other(cmd);
    this.#schedule(s);
  }

  /**
   * Posts the shard's queue to its worker in one message. `soon` (a wake-up to send): once the
   * synchronous part of the current job is done, so the worker signs it before the API has even
   * written the answer to the request that made the change (a change set's wake-ups are queued
   * in one synchronous loop: a fan-out is still one message); otherwise at the end of the event
   * loop's turn, or IPC_BATCH_MAX_DELAY_MS into a long one (TurnFlusher), so the answers to many
   * fetches travel together.
   */
  #schedule(s: Shard, soon = false): void {
    if (!s.ready) return;
    if (soon) {
      if (s.flushSoon) return;
      s.flushSoon = true;
      queueMicrotask(() => {
        s.flushSoon = false;
        s.batches.flushNow(); // the batch's wait starts again with the next message queued
      });
      return;
    }
    s.batches.queued();
  }

  #flush(s: Shard): void {
    if (!s.ready || s.child === null || s.queue.empty) return;
    this.#post(s, { t: 'batch', words: s.queue.take() });
  }

  #post(s: Shard, m: ToWorker): void {
    try {
      s.child?.send(m);
    } catch (err) {
      this.#log.error({ worker: s.index, err }, 'cannot reach push worker');
    }
  }

  #spawn(s: Shard): Promise<void> {
    return new Promise((resolve) => {
      const child = fork(this.#o.workerScript, [], {
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
        serialization: 'advanced',
        env: pushWorkerEnv(process.env),
      });
      s.child = child;
      s.ready = false;
      child.on('message', (m: FromWorker) => {
        if (m.t === 'ready') {
          s.ready = true;
          // not the nodes another worker holds a dialled-in connection of: dialled when it ends
          const shardTargets = [...this.#targets.values()].filter(
            (t) => shardOf(t.node, this.#shards.length) === s.index && (this.#held.get(t.node) ?? s) === s,
          );
          // a restarted worker takes up the connections its predecessor held, not only the
          // nodes that are behind: their agents count on push being there
          const reconnect = shardTargets
            .filter((t) => (this.#states.get(t.node)?.state ?? 'idle') !== 'idle')
            .map((t) => t.node);
          // the start carries every target: commands queued before it are already folded in
          s.queue.clear();
          const start = new WorkerCommands();
          // the floors first: no dial starts before the worker knows whom it must refuse
          start.other({ t: 'identity-floors', floors: this.#floors });
          start.other({ t: 'start', targets: shardTargets, reconnect });
          this.#post(s, { t: 'batch', words: start.take() });
          resolve();
        } else if (m.t === 'batch') {
          // a replaced worker's last messages answer nothing: its requests' ids are not the new one's
          if (s.child !== child) return;
          try {
            this.#onBatch(s, m);
          } catch (err) {
            if (!(err instanceof MalformedBatchError)) throw err;
            // a batch this process cannot read (a bug on one side of the channel): the worker is
            // replaced, and the new one reconnects its nodes and reports their states afresh
            this.#log.error({ worker: s.index, err }, 'push worker sent a batch that cannot be read: restarting it');
            child.kill('SIGKILL');
          }
        } else if (m.t === 'took') {
          if (s.child !== child) return;
          s.handingOff = false;
          this.#nextSocket(s);
        } else if (m.t === 'drained') {
          if (s.child === child) s.drainedWaiter?.();
        } else if (m.t === 'closed') {
          s.closedWaiter?.();
        }
      });
      child.on('error', (err) => this.#log.error({ worker: s.index, err }, 'push worker error'));
      child.on('exit', (code, signal) => {
        if (s.child !== child) return;
        s.child = null;
        s.ready = false;
        this.#dropSockets(s, this.#closed || this.#draining ? 'shutting_down' : 'connect_unavailable');
        s.closedWaiter?.();
        s.drainedWaiter?.();
        resolve();
        if (this.#closed) return;
        this.#onWorkerLost(s, code, signal);
      });
      const init: ToWorker = {
        t: 'init',
        worker: s.index,
        signingJwk: this.#o.signingJwk,
        issuer: this.#o.issuer,
        trustDomain: this.#o.trustDomain,
        material: this.#o.material,
        logLevel: this.#o.logger.level,
        tuning: this.#o.tuning,
        requestAnswerTimeoutMs: this.#o.requestAnswerTimeoutMs,
        ...(this.#o.sessionFile === undefined ? {} : { sessionFile: this.#o.sessionFile(s.index) }),
      };
      child.send(init);
    });
  }

  #onWorkerLost(s: Shard, code: number | null, signal: NodeJS.Signals | null): void {
    const delay = Math.min(RECONNECT_BACKOFF_MAX_MS, PUSH_WORKER_RESTART_BASE_MS * 2 ** s.restarts++);
    this.#log.error({ worker: s.index, code, signal, restartInMs: delay }, 'push worker exited; restarting it');
    const now = new Date().toISOString();
    // every node the worker was connected or dialling to: a dial in flight died with it too, and
    // a node left 'connecting' would show no error until the new worker's dial ends
    for (const [node, st] of this.#states) {
      if (this.#holderOf(node) !== s || st.state === 'idle' || st.state === 'disconnected') continue;
      const next: PushState = {
        ...st,
        state: 'disconnected',
        connected: false,
        via: null,
        last_error: 'connection_reset',
        last_error_at: now,
      };
      this.#states.set(node, next);
      this.#events.emit('state', node, { ...next });
    }
    // its dialled-in connections died with it: other shards' nodes are dialled by their own workers
    for (const [node, holder] of [...this.#held]) if (holder === s) this.#detached(s, node);
    s.connected = 0;
    s.dialledIn = 0;
    this.#metrics.connected(this.#shards.reduce((n, x) => n + x.connected, 0));
    this.#metrics.dialledIn(this.#shards.reduce((n, x) => n + x.dialledIn, 0));
    setTimeout(() => {
      if (!this.#closed) void this.#spawn(s);
    }, delay).unref();
  }

  #onBatch(s: Shard, m: Extract<FromWorker, { t: 'batch' }>): void {
    // the counters first: they stand even when the events that follow cannot be read
    if (m.metrics) {
      s.connected = m.metrics.connected;
      s.dialledIn = m.metrics.dialledIn;
      this.#metrics.connected(this.#shards.reduce((n, x) => n + x.connected, 0));
      this.#metrics.dialledIn(this.#shards.reduce((n, x) => n + x.dialledIn, 0));
      if (m.metrics.sent) this.#metrics.sent(m.metrics.sent);
      for (const [code, n] of Object.entries(m.metrics.dialFailures)) this.#metrics.dialFailed(code, n);
      for (const [code, n] of Object.entries(m.metrics.connectRefusals)) this.#metrics.connectRefused(code, n);
    }
    readWorkerEvents(m.events, {
      state: (node, st) => {
        // the node's state is the worker's that holds it: not its shard's while another holds
        // its dialled-in connection, nor a former holder's once it let go
        if (this.#holderOf(node) !== s) return;
        if (!this.#targets.has(node) && !this.#held.has(node)) return; // removed meanwhile
        this.#states.set(node, st);
        this.#events.emit('state', node, { ...st });
      },
      ack: (e) => {
        const t = this.#targets.get(e.node);
        if (t) t.ackedGeneration = e.gen;
        s.restarts = 0;
        this.#metrics.acked(e.latencyMs / 1000);
        this.#events.emit('ack', e);
      },
      nack: (e) => {
        this.#metrics.nacked(e.code);
        this.#events.emit('nack', e);
      },
      request: (id, r) => this.#answerRequest(s, id, r),
      attach: (node) => this.#attached(s, node),
      detach: (node) => this.#detached(s, node),
    });
  }

  /**
   * Queues a worker's request for the handler: at most `requestsInFlight` are answered at once,
   * in arrival order. One from a worker replaced meanwhile is dropped (its agent times out).
   */
  #answerRequest(s: Shard, id: number, r: PushRequest): void {
    // a closing pool starts nothing: a worker's batches still arrive until it exits
    if (s.child === null || this.#closed) return;
    this.#requests.push({ s, child: s.child, id, r, at: performance.now() });
    this.#pumpRequests();
  }

  #pumpRequests(): void {
    if (this.#closed) return;
    while (this.#answering.size < this.#o.requestsInFlight && this.#requestsHead < this.#requests.length) {
      const q = this.#requests[this.#requestsHead++]!;
      // its worker was replaced, or has answered it 503 already (the agent asked HTTPS): dead work
      if (q.s.child !== q.child || performance.now() - q.at >= this.#o.requestAnswerTimeoutMs) continue;
      this.#answering.add(q);
      this.#overdue.arm();
      void this.#replyTo(q.r).then((reply) => this.#answered(q, reply));
    }
    if (this.#requestsHead === this.#requests.length) {
      this.#requests = [];
      this.#requestsHead = 0;
    } else if (this.#requestsHead > REQUEST_QUEUE_COMPACT_AT) {
      // a steady stream that never drains: drop the answered head now and then, not on every take
      this.#requests = this.#requests.slice(this.#requestsHead);
      this.#requestsHead = 0;
    }
  }

  /** Sends a request's answer to its worker and frees its place; one the sweep gave up on is dropped. */
  #answered(q: QueuedRequest, reply: PushReply): void {
    if (!this.#answering.delete(q)) return; // the sweep gave up on it
    if (q.s.child === q.child) {
      q.s.queue.answer(q.id, q.r.kind, reply);
      this.#schedule(q.s);
    }
    this.#pumpRequests();
  }

  /**
   * Frees the places of requests whose worker has stopped waiting (PUSH_REQUEST_ANSWER_TIMEOUT_MS
   * after they came; it has answered them 503 itself): a handler that never settles holds no
   * place for ever. One timer, due at the oldest's deadline, not one per request: a fan-out
   * answers thousands of fetches a second.
   */
  #sweepAnswering(now: number): void {
    for (const q of this.#answering) {
      if (now - q.at < this.#o.requestAnswerTimeoutMs) break;
      this.#answering.delete(q);
    }
    this.#pumpRequests();
  }

  async #replyTo(r: PushRequest): Promise<PushReply> {
    const handler = this.#requestHandler;
    if (handler === null) return unavailableReply(r.kind);
    try {
      return await handler(r);
    } catch (err) {
      this.#log.error({ node: r.node, err, kind: r.kind }, 'push request handler failed');
      return { status: 500, error: 'internal' };
    }
  }

  #closeShard(s: Shard): Promise<void> {
    const child = s.child;
    if (child === null || child.exitCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(() => child.kill('SIGKILL'), PUSH_WORKER_CLOSE_MS);
      timer.unref();
      child.once('exit', () => {
        clearTimeout(timer);
        resolve();
      });
      if (s.ready) {
        // flush what is queued, then close
        if (!s.queue.empty) this.#post(s, { t: 'batch', words: s.queue.take() });
        this.#post(s, { t: 'close' });
      } else {
        // not started yet: it exits once its channel is gone (it ignores SIGTERM, see worker.ts)
        try {
          child.disconnect();
        } catch {
          child.kill('SIGKILL');
        }
      }
    });
  }
}

/**
 * The environment a push worker starts with: what every child of Herald inherits
 * (protocol/child-env.ts: never the database URL), and glibc's mmap threshold at
 * PUSH_WORKER_MMAP_THRESHOLD_BYTES unless the operator's GLIBC_TUNABLES already sets one (other
 * tunables are kept). Other C libraries ignore the variable. The worker reads nothing else of
 * its environment: everything it needs comes over IPC.
 */
export function pushWorkerEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  const tunables = (env.GLIBC_TUNABLES ?? '').split(':').filter((t) => t !== '');
  if (!tunables.some((t) => t.startsWith('glibc.malloc.mmap_threshold=')))
    tunables.push(`glibc.malloc.mmap_threshold=${PUSH_WORKER_MMAP_THRESHOLD_BYTES}`);
  return childEnv(env, { GLIBC_TUNABLES: tunables.join(':') });
}
