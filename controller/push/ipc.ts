/**
 * The messages between the PushPool facade (controller main process) and its push worker
 * processes, over the `child_process.fork` IPC channel. Both directions are batched (per event
 * loop turn; a change set's wake-ups once it is applied): a fan-out to 10,000 nodes is a handful
 * of IPC messages, not 10,000.
 */
import type { MaterialPaths } from '../../certs/paths.js';
import type { Ed25519PrivateJwk } from '../../protocol/jws.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { PushMetricsDelta } from './metrics.js';
import type { AckEvent, PushReply, PushRequest, PushState, PushTarget } from './types.js';

/** Tuning a worker's dialer takes (PushDialerOptions' numbers). */
export interface PushTuning {
  pingIntervalMs?: number;
  answerTimeoutMs?: number;
  dialTimeoutMs?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  maxWakesInFlight?: number;
  maxDialsInFlight?: number;
  closeGraceMs?: number;
  /** A dialled-in connection silent this long is half-open (default CONNECT_SILENCE_MAX_MS). */
  connectSilenceMaxMs?: number;
  /** TLS plus upgrade of a dialled-in connection (default CONNECT_HANDSHAKE_TIMEOUT_MS). */
  connectHandshakeTimeoutMs?: number;
  /** Dialled-in connections pending authentication (default MAX_CONNECT_PENDING_CONNECTIONS). */
  connectMaxPending?: number;
}

export interface WorkerInit {
  t: 'init';
  worker: number;
  /** The controller's private signing key: handed over the local IPC pipe, never written out. */
  signingJwk: Ed25519PrivateJwk;
  issuer: string;
  trustDomain: string;
  material: MaterialPaths;
  logLevel: string;
  tuning: PushTuning;
  /** How long it waits for the answer to a request before telling the agent to ask HTTPS (503). */
  requestAnswerTimeoutMs: number;
  /** Where this worker keeps its TLS sessions with the agents (certs/session-file.ts). */
  sessionFile?: string;
}

/**
 * A TCP connection to `--connect-listen` the main process accepted and did not read: sent with
 * the socket as the message's handle, one a message (a handle cannot ride in a batch).
 */
export interface ConnectionHandoff {
  t: 'connection';
}

/** A batch with a word out of place: only a bug on one side of the channel writes one. */
export class MalformedBatchError extends Error {
  override name = 'MalformedBatchError';
}

/** Messages written flat, each a tag and then its fields, taken as one batch. */
class FlatWords<W> {
  words: W[] = [];

  get empty(): boolean {
    return this.words.length === 0;
  }

  /** The words written so far; the writer starts again empty. */
  take(): W[] {
    const w = this.words;
    this.words = [];
    return w;
  }
}

/**
 * The length in words of the message at word `i` of a batch, its tag included. Only this module
 * writes them, so a word out of place is a bug on one side of the channel.
 * @throws MalformedBatchError when `w[i]` is no tag of `sizes`, or the message is cut short
 */
function messageWords(w: readonly unknown[], i: number, sizes: readonly number[], batch: string, what: string): number {
  const tag = w[i];
  const words = typeof tag === 'number' ? sizes[tag] : undefined;
  if (words === undefined) throw new MalformedBatchError(`${batch}: no ${what} tag at word ${i}`);
  if (i + words > w.length) throw new MalformedBatchError(`${batch}: the ${what} at word ${i} is cut short`);
  return words;
}

/** The commands to a worker other than a wake-up and an answer (those are written flat: `WorkerCommands`). */
export type ToWorkerCommand =
  /** `reconnect`: nodes a crashed predecessor held connections to, connected again at once. */
  | { t: 'start'; targets: PushTarget[]; reconnect: string[] }
  | { t: 'endpoint'; node: string; url: string | null; gen: number }
  | { t: 'remove'; node: string }
  /** Another worker holds the node's connection now (its agent dialled in there): close ours and forget the node. */
  | { t: 'held-elsewhere'; node: string }
  /**
   * The controller stops: close the dialled-in connections (1012), the i-th at `slotsMs[i]` ms
   * into the window (any beyond at its end), then answer `drained`.
   */
  | { t: 'drain'; windowMs: number; slotsMs: number[] }
  | { t: 'signing-key'; jwk: Ed25519PrivateJwk }
  /**
   * The revoked identities the main process keeps beyond revoked.json (its database: node
   * revocations and renewals), `role/name` -> floor in ms since the epoch: every one, replacing
   * the last. The worker merges them with its own revoked.json (`PkiMaterial.setIdentityFloors`).
   */
  | { t: 'identity-floors'; floors: [string, number][] };

/**
 * One value of a batch of commands to a worker: as the events (EventWord), the two commands a
 * fan-out sends per agent are written flat, each a tag and then its fields in a fixed order (a
 * wake-up: node, generation, reason; an answer: request id, kind and the reply's fields, absent
 * ones as null); any other command is one word after its tag, as the object it is. Written as
 * objects, a wake-up and an answer cost the two processes ~9-11 µs an agent, flat ~5
 * (2026-12-07, 10,000 of each in batches of 1,000).
 */
export type CommandWord = EventWord | ToWorkerCommand;

export type ToWorker = WorkerInit | { t: 'batch'; words: CommandWord[] } | ConnectionHandoff | { t: 'close' };

/** What a worker does with each command of a batch, in the order they were written. */
export interface WorkerCommandHandlers {
  notify(node: string, gen: number, reason: WakeReason): void;
  /** The answer to the worker's request `id` (a body arrives as a Uint8Array). */
  answer(id: number, kind: PushRequest['kind'], r: PushReply): void;
  other(cmd: ToWorkerCommand): void;
}

const NOTIFY = 0;
const ANSWER = 1;
const OTHER = 2;
/** Words a command takes, its tag included, by tag. */
const COMMAND_WORDS = [4, 9, 2];

/** A shard's commands since its last batch, written flat (CommandWord). */
export class WorkerCommands extends FlatWords<CommandWord> {
  /** Drops what was written (a start carries every target: what was queued before it is folded in). */
  clear(): void {
    this.words = [];
  }

  notify(node: string, gen: number, reason: WakeReason): void {
    this.words.push(NOTIFY, node, gen, reason);
  }

  answer(id: number, kind: PushRequest['kind'], r: PushReply): void {
    this.words.push(
      ANSWER,
      id,
      kind,
      r.status,
      r.etag ?? null,
      r.signature ?? null,
      r.body ?? null,
      r.error ?? null,
      r.retryAfterS ?? null,
    );
  }

  other(cmd: ToWorkerCommand): void {
    this.words.push(OTHER, cmd);
  }
}

/**
 * Hands each command of a batch to its handler, in order; an answer's reply has only the fields
 * that were given.
 * @throws MalformedBatchError at the first word that is not a command's tag, or a command cut
 *   short (the commands before it were handed over)
 */
export function readWorkerCommands(w: readonly CommandWord[], h: WorkerCommandHandlers): void {
  let i = 0;
  while (i < w.length) {
    const words = messageWords(w, i, COMMAND_WORDS, 'push commands batch', 'command');
    switch (w[i]) {
      case NOTIFY:
        h.notify(w[i + 1] as string, w[i + 2] as number, w[i + 3] as WakeReason);
        break;
      case ANSWER: {
        const r: PushReply = { status: w[i + 3] as number };
        if (w[i + 4] !== null) r.etag = w[i + 4] as string;
        if (w[i + 5] !== null) r.signature = w[i + 5] as string;
        if (w[i + 6] !== null) r.body = w[i + 6] as Uint8Array;
        if (w[i + 7] !== null) r.error = w[i + 7] as string;
        if (w[i + 8] !== null) r.retryAfterS = w[i + 8] as number;
        h.answer(w[i + 1] as number, w[i + 2] as PushRequest['kind'], r);
        break;
      }
      case OTHER:
        h.other(w[i + 1] as ToWorkerCommand);
        break;
    }
    i += words;
  }
}

/**
 * One value of a worker's events as they cross the channel: the events are written flat, each a
 * tag and then its fields in a fixed order (`WorkerEvents`, `readWorkerEvents`). The channel's
 * structured clone costs both ends about as much per object as per message: written as objects,
 * the four events of a woken agent (two push states, an ack, a fetch) cost the two processes
 * ~48 µs an agent, flat ~34 µs (`node dist/bench/ipc-cost.js`).
 */
export type EventWord = string | number | boolean | null | Uint8Array;

/** What the main process does with each event of a batch, in the order the worker wrote them. */
export interface WorkerEventHandlers {
  state(node: string, s: PushState): void;
  ack(e: AckEvent): void;
  nack(e: { node: string; jti: string | null; code: string }): void;
  /** An agent's fetch or signal on its push connection, for the main process to answer (`answer`). */
  request(id: number, r: PushRequest): void;
  /** The node's agent dialled in to this worker, which holds its connection now. */
  attach(node: string): void;
  /** The node's dialled-in connection at this worker is gone. */
  detach(node: string): void;
}

/** The tags, each followed by a fixed number of fields (see the writers below). */
const STATE = 0;
const ACK = 1;
const NACK = 2;
const FETCH = 3;
const SIGNAL = 4;
const ATTACH = 5;
const DETACH = 6;
/** Words an event takes, its tag included, by tag. */
const EVENT_WORDS = [9, 6, 4, 5, 5, 2, 2];

/** A worker's events since its last batch, written flat (EventWord). */
export class WorkerEvents extends FlatWords<EventWord> {
  readonly #onWrite: () => void;

  /** @param onWrite called after each event written (the worker schedules its next batch) */
  constructor(onWrite: () => void = () => undefined) {
    super();
    this.#onWrite = onWrite;
  }

  state(node: string, s: PushState): void {
    this.words.push(
      STATE,
      node,
      s.state,
      s.via,
      s.generation_pushed,
      s.generation_acked,
      s.last_ack_at,
      s.last_error,
      s.last_error_at,
    );
    this.#onWrite();
  }

  ack(e: AckEvent): void {
    this.words.push(ACK, e.node, e.jti, e.gen, e.fetch, e.latencyMs);
    this.#onWrite();
  }

  nack(e: { node: string; jti: string | null; code: string }): void {
    this.words.push(NACK, e.node, e.jti, e.code);
    this.#onWrite();
  }

  request(id: number, r: PushRequest): void {
    if (r.kind === 'fetch') this.words.push(FETCH, id, r.node, r.nonce, r.ifNoneMatch);
    else this.words.push(SIGNAL, id, r.node, r.deploymentId, r.body);
    this.#onWrite();
  }

  attach(node: string): void {
    this.words.push(ATTACH, node);
    this.#onWrite();
  }

  detach(node: string): void {
    this.words.push(DETACH, node);
    this.#onWrite();
  }
}

/**
 * Hands each event of a worker's batch to its handler, as objects again, in order.
 * @throws MalformedBatchError at the first word that is not an event's tag, or an event cut short
 *   (the events before it were handed over)
 */
export function readWorkerEvents(w: readonly EventWord[], h: WorkerEventHandlers): void {
  let i = 0;
  while (i < w.length) {
    const words = messageWords(w, i, EVENT_WORDS, 'push worker batch', 'event');
    switch (w[i]) {
      case STATE: {
        const state = w[i + 2] as PushState['state'];
        h.state(w[i + 1] as string, {
          state,
          connected: state === 'connected',
          via: w[i + 3] as PushState['via'],
          generation_pushed: w[i + 4] as number | null,
          generation_acked: w[i + 5] as number | null,
          last_ack_at: w[i + 6] as string | null,
          last_error: w[i + 7] as string | null,
          last_error_at: w[i + 8] as string | null,
        });
        break;
      }
      case ACK:
        h.ack({
          node: w[i + 1] as string,
          jti: w[i + 2] as string,
          gen: w[i + 3] as number,
          fetch: w[i + 4] as AckEvent['fetch'],
          latencyMs: w[i + 5] as number,
        });
        break;
      case NACK:
        h.nack({ node: w[i + 1] as string, jti: w[i + 2] as string | null, code: w[i + 3] as string });
        break;
      case FETCH:
        h.request(w[i + 1] as number, {
          kind: 'fetch',
          node: w[i + 2] as string,
          nonce: w[i + 3] as string,
          ifNoneMatch: w[i + 4] as string | null,
        });
        break;
      case SIGNAL:
        h.request(w[i + 1] as number, {
          kind: 'signal',
          node: w[i + 2] as string,
          deploymentId: w[i + 3] as string,
          body: w[i + 4] as Uint8Array,
        });
        break;
      case ATTACH:
        h.attach(w[i + 1] as string);
        break;
      case DETACH:
        h.detach(w[i + 1] as string);
        break;
    }
    i += words;
  }
}

export type FromWorker =
  | { t: 'ready' }
  | { t: 'batch'; events: EventWord[]; metrics: PushMetricsDelta | null }
  /** The `drain` command is done: every dialled-in connection of the worker is closed. */
  | { t: 'drained' }
  /** The worker has the socket last handed to it (ConnectionHandoff): the next may come. */
  | { t: 'took' }
  | { t: 'closed' };
