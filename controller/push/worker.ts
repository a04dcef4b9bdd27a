/**
 * A push worker process: runs one PushDialer for its shard of the nodes, driven by the PushPool
 * facade in the controller's main process over IPC (controller/push/ipc.ts), and holds the
 * dialled-in connections of the sockets the main process hands it (`--connect-listen`: TLS,
 * authorization and upgrade happen here, controller/push/connect-listener.ts). It loads the TLS
 * material itself (and watches it, so a renewed certificate or revoked.json applies here too);
 * the signing key and the database's identity floors (revoked nodes) come over the IPC pipe. Started by `child_process.fork` of the compiled
 * `dist/controller/push/worker.js`; it exits when its parent does.
 */
import type net from 'node:net';
import pino from 'pino';
import { PkiMaterial } from '../../certs/tls.js';
import { IPC_BATCH_MAX_DELAY_MS } from '../../protocol/limits.js';
import { Signer } from '../../protocol/jws.js';
import { fastEd25519 } from '../ed25519.js';
import { PushDialer } from './dialer.js';
import {
  readWorkerCommands,
  WorkerEvents,
  type CommandWord,
  type FromWorker,
  type ToWorker,
  type ToWorkerCommand,
  type WorkerCommandHandlers,
  type WorkerInit,
} from './ipc.js';
import { DeltaPushMetrics } from './metrics.js';
import { unavailableReply, type PushReply, type PushRequest } from './types.js';
import { OldestFirstTimer } from './oldest-first-timer.js';
import { TurnFlusher } from './turn-flusher.js';

function send(m: FromWorker): void {
  // with a callback, a parent that has just died is an EPIPE here, not an unhandled 'error'
  // event that would crash this process before its 'disconnect' handler runs
  if (process.connected) process.send?.(m, undefined, {}, () => undefined);
}

class Worker {
  readonly #dialer: PushDialer;
  readonly #material: PkiMaterial;
  readonly #metrics = new DeltaPushMetrics(() => this.#batches.queued());
  /** Events since the last batch; each one written schedules the next batch. */
  readonly #events = new WorkerEvents(() => this.#batches.queued());
  /** Posts the batch at the end of the turn, or IPC_BATCH_MAX_DELAY_MS into a long one. */
  readonly #batches = new TurnFlusher(() => this.#flush(), IPC_BATCH_MAX_DELAY_MS);
  /**
   * Requests sent to the main process, by id (so oldest first): at most one fetch and one signal
   * per connected node. `at`: when sent (performance.now(), so a wall clock stepped back does not
   * hold a request longer).
   */
  readonly #requests = new Map<number, { kind: PushRequest['kind']; resolve: (r: PushReply) => void; at: number }>();
  #requestSeq = 0;
  /** One timer for all requests, due when the oldest's answer is overdue (see #sweep). */
  readonly #overdue: OldestFirstTimer;
  readonly #timeoutMs: number;

  constructor(init: WorkerInit) {
    this.#timeoutMs = init.requestAnswerTimeoutMs;
    this.#overdue = new OldestFirstTimer(
      this.#timeoutMs,
      () => this.#requests.values().next().value?.at,
      (now) => this.#sweep(now),
    );
    const logger = pino({ level: init.logLevel }).child({ push_worker: init.worker });
    this.#material = new PkiMaterial({ ...init.material, trustDomain: init.trustDomain, logger });
    this.#dialer = new PushDialer({
      ...init.tuning,
      signer: new Signer(init.signingJwk, fastEd25519),
      issuer: init.issuer,
      trustDomain: init.trustDomain,
      material: this.#material,
      logger,
      metricsSink: this.#metrics,
      ...(init.sessionFile === undefined ? {} : { sessionFile: init.sessionFile }),
    });
    this.#dialer.on('state', (node, s) => this.#events.state(node, s));
    this.#dialer.on('ack', (e) => this.#events.ack(e));
    this.#dialer.on('nack', (e) => this.#events.nack(e));
    this.#dialer.on('attach', (node) => this.#events.attach(node));
    this.#dialer.on('detach', (node) => this.#events.detach(node));
    this.#dialer.serveRequests(
      (r) =>
        new Promise((resolve) => {
          const id = ++this.#requestSeq;
          this.#requests.set(id, { kind: r.kind, resolve, at: performance.now() });
          this.#overdue.arm();
          this.#events.request(id, r);
        }),
    );
  }

  /**
   * A main process that does not answer (a stalled database) does not hold a request for ever:
   * `requestAnswerTimeoutMs` (PUSH_REQUEST_ANSWER_TIMEOUT_MS) after it was sent the agent is told to ask over HTTPS, and a
   * late answer finds nothing. One timer, due at the oldest request's deadline, not one per
   * request: a fan-out sends thousands a second.
   */
  #sweep(now: number): void {
    for (const [id, p] of this.#requests) {
      if (now - p.at < this.#timeoutMs) break;
      this.#requests.delete(id);
      p.resolve(unavailableReply(p.kind));
    }
  }

  /** A socket of `--connect-listen` the main process accepted: served here from its first byte. */
  accept(socket: net.Socket): void {
    this.#dialer.connectListener().accept(socket);
  }

  /** The commands of one batch from the main process, in order. */
  run(words: readonly CommandWord[]): void {
    readWorkerCommands(words, this.#handlers);
    this.#batches.queued();
  }

  readonly #handlers: WorkerCommandHandlers = {
    notify: (node, gen, reason) => this.#dialer.notify(node, gen, reason),
    answer: (id, kind, r) => {
      const pending = this.#requests.get(id);
      if (pending?.kind !== kind) return; // answers another request (or none): never taken
      this.#requests.delete(id);
      // the structured clone of the IPC channel delivers the body as a plain Uint8Array (the
      // reply is this batch's own: viewed as a Buffer in place)
      const b = r.body;
      if (b !== undefined) r.body = Buffer.from(b.buffer, b.byteOffset, b.byteLength);
      pending.resolve(r);
    },
    other: (cmd) => this.#other(cmd),
  };

  #other(cmd: ToWorkerCommand): void {
    switch (cmd.t) {
      case 'start': {
        void this.#dialer.start(cmd.targets);
        const gens = new Map(cmd.targets.map((t) => [t.node, t.generation]));
        for (const node of cmd.reconnect) this.#dialer.notify(node, gens.get(node) ?? 0, 'ping');
        break;
      }
      case 'endpoint':
        this.#dialer.setEndpoint(cmd.node, cmd.url, cmd.gen);
        break;
      case 'remove':
        this.#dialer.remove(cmd.node);
        break;
      case 'held-elsewhere':
        this.#dialer.heldElsewhere(cmd.node);
        break;
      case 'drain':
        void this.#dialer.drainConnect(cmd.windowMs, cmd.slotsMs).then(() => {
          // the states of the closed connections first, then the word that they are all closed
          this.#batches.flushNow();
          send({ t: 'drained' });
        });
        break;
      case 'signing-key':
        this.#dialer.setSigningKey(cmd.jwk);
        break;
      case 'identity-floors':
        // merged with revoked.json's; a change closes the connections now under a floor
        // ('revoked-change': the dialer's #closeRevoked)
        this.#material.setIdentityFloors(new Map(cmd.floors));
        break;
    }
  }

  async close(): Promise<void> {
    for (const p of this.#requests.values()) p.resolve(unavailableReply(p.kind));
    this.#requests.clear();
    this.#overdue.stop();
    await this.#dialer.close();
    this.#material.close();
    this.#batches.flushNow();
  }

  #flush(): void {
    if (this.#events.empty && !this.#metrics.dirty) return;
    send({ t: 'batch', events: this.#events.take(), metrics: this.#metrics.dirty ? this.#metrics.take() : null });
  }
}

let worker: Worker | null = null;

process.on('message', (m: ToWorker, handle?: unknown) => {
  try {
    if (m.t === 'connection') {
      const socket = handle as net.Socket | undefined;
      if (worker === null) socket?.destroy();
      else if (socket) worker.accept(socket);
      // at once, not in a batch: the main process hands over the next socket on this word
      send({ t: 'took' });
    } else if (m.t === 'init') {
      worker = new Worker(m);
      send({ t: 'ready' });
    } else if (m.t === 'batch') {
      worker?.run(m.words);
    } else if (m.t === 'close') {
      void (worker?.close() ?? Promise.resolve()).then(() => {
        send({ t: 'closed' });
        process.disconnect?.();
      });
    }
  } catch (err) {
    // a bad init (unreadable PKI) is fatal for this worker; the pool reports and restarts it
    process.stderr.write(`herald push worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  }
});

// the parent went away: nothing will drive this dialer any more
process.on('disconnect', () => process.exit(0));

// a signal to the whole process group (systemd's control-group stop, Ctrl-C in a terminal)
// reaches this process too: the main process drives the stop (its connections drained over the
// window, then `close`), and this process exits once told to or once its parent is gone
process.on('SIGTERM', () => undefined);
process.on('SIGINT', () => undefined);
