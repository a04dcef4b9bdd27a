/**
 * Live output's sending side (docs/api.md): while a hook runs, what it prints goes to the controller
 * in numbered chunks (`POST /v1/nodes/{node}/deployments/{id}/output`), flushed every
 * OUTPUT_FLUSH_INTERVAL_MS or at OUTPUT_CHUNK_MAX_BYTES, masked before it leaves (OutputChunker).
 *
 * Best-effort by design, beside the outbox and not through it: the final signal still carries
 * the tails, so a lost chunk loses nothing the result needs. A slow or absent controller never
 * blocks or slows the hook: the output path only appends to a bounded in-memory queue
 * (OUTPUT_QUEUE_MAX_BYTES) and never awaits the network; when the queue is full the oldest chunks
 * are dropped and the next chunk carries how many bytes were lost (`dropped_bytes`). One request
 * at a time, paced to the controller's rate class (OUTPUT_RATE_BURST, then OUTPUT_RATE_PER_S),
 * except a run's last chunk of each stream, which the run's signal waits for: the controller lets
 * EXEMPT_OUTPUT_PER_WAKE_REQUESTS chunks past its limit for each change that gave the node work,
 * and the agent counts them as it counts its tokens (`granted`, at each wake-up that is not a
 * ping), so such a chunk takes a token if one is there, else one of those credits, and waits
 * only when it has neither. A chunk the controller may already hold is sent again and kept once
 * there (its `seq`). The controller takes no chunk once the run's result is in, so at the end of
 * a run whose queue does not empty in half of OUTPUT_FINAL_FLUSH_WAIT_MS the run's last chunks go
 * ahead of the rest, which are dropped as a gap. A refused chunk is never sent again; a 409 (the revision's result is in,
 * `output_closed`, or a newer revision exists) drops the rest of that run's chunks too.
 */
import type { Logger } from '../certs/tls.js';
import type { MetadataItem } from '../protocol/heat.js';
import {
  EXEMPT_OUTPUT_CAPACITY,
  EXEMPT_OUTPUT_PER_WAKE_REQUESTS,
  OUTPUT_FINAL_FLUSH_WAIT_MS,
  OUTPUT_FLUSH_INTERVAL_MS,
  OUTPUT_QUEUE_MAX_BYTES,
  OUTPUT_RATE_BURST,
  OUTPUT_RATE_PER_S,
  OUTPUT_CHUNK_MAX_BYTES,
} from '../protocol/limits.js';
import type { OutputChunkBody, OutputStream } from '../protocol/output.js';
import { hiddenValues } from './hooks/mask.js';
import { OutputChunker } from './hooks/output-chunker.js';

/** Posts one chunk; resolves with the status (and a 429's Retry-After, ms), rejects on a network error. */
export type SendOutput = (path: string, body: OutputChunkBody) => Promise<{ status: number; retryAfterMs?: number }>;

export interface OutputSenderOptions {
  node: string;
  send: SendOutput;
  log: Logger & { debug?(obj: object, msg?: string): void };
  /** Default OUTPUT_QUEUE_MAX_BYTES. */
  maxQueueBytes?: number;
  /** Default OUTPUT_FLUSH_INTERVAL_MS. */
  flushIntervalMs?: number;
  /** Default OUTPUT_FINAL_FLUSH_WAIT_MS. */
  finalWaitMs?: number;
}

/** One run's output sink: `write` is called from the pipes' data handlers and never throws. */
export interface LiveOutput {
  write(stream: OutputStream, chunk: Buffer): void;
  /** The hook ended: sends the rest, waiting at most OUTPUT_FINAL_FLUSH_WAIT_MS for the queue. Idempotent. */
  close(): Promise<void>;
}

interface Queued {
  path: string;
  body: OutputChunkBody;
  bytes: number;
  /** The run's last chunk of its stream: not paced (see the module's comment). */
  last?: boolean;
}

/** Backoff after a network error: doubles from this, ms. */
const RETRY_BASE_MS = 250;
const RETRY_MAX_MS = 5_000;

/** The route a chunk is posted to. */
export function outputPath(node: string, deploymentId: string): string {
  return `/v1/nodes/${encodeURIComponent(node)}/deployments/${encodeURIComponent(deploymentId)}/output`;
}

export class OutputSender {
  readonly #o: Required<OutputSenderOptions>;
  readonly #queue: Queued[] = [];
  #queuedBytes = 0;
  /** Dropped bytes not yet told, per path + revision. */
  #dropped = new Map<string, number>();
  #pumping = false;
  #inflight: Queued | null = null;
  /** The chunk whose token the pump is waiting for. */
  #waitingFor: Queued | null = null;
  #stopped = false;
  #tokens = OUTPUT_RATE_BURST;
  #tokensAt = Date.now();
  /** The controller's credits for a run's last chunks, as far as this agent knows of them. */
  #credits = 0;
  #idleWaiters: Array<() => void> = [];
  #wake: (() => void) | null = null;
  /** Chunks answered 2xx, for tests. */
  sent = 0;
  /** Bytes dropped because the queue was full, for tests. */
  droppedBytes = 0;

  constructor(o: OutputSenderOptions) {
    this.#o = {
      maxQueueBytes: OUTPUT_QUEUE_MAX_BYTES,
      flushIntervalMs: OUTPUT_FLUSH_INTERVAL_MS,
      finalWaitMs: OUTPUT_FINAL_FLUSH_WAIT_MS,
      ...o,
    };
  }

  /** A sink for one run of `item`; hidden values of its inputs are masked in every chunk. */
  open(item: MetadataItem): LiveOutput {
    let hidden: string[];
    try {
      hidden = hiddenValues(Array.isArray(item.inputs) ? item.inputs : []);
    } catch {
      hidden = [];
    }
    const path = outputPath(this.#o.node, item.deployment_id);
    const revision = item.revision;
    const chunkers: Record<OutputStream, OutputChunker> = {
      stdout: new OutputChunker(hidden),
      stderr: new OutputChunker(hidden),
    };
    let seq = 0;
    let closed: Promise<void> | null = null;
    /** Each stream's newest chunk queued: at close, the run's last (it may not have left yet). */
    const newest: Partial<Record<OutputStream, Queued>> = {};
    const flush = (stream: OutputStream, end: boolean): void => {
      for (const text of chunkers[stream].take(end))
        newest[stream] = this.#push({ path, body: { revision, stream, seq: ++seq, text } });
    };
    const timer = setInterval(() => {
      flush('stdout', false);
      flush('stderr', false);
    }, this.#o.flushIntervalMs);
    timer.unref();
    return {
      write: (stream, chunk) => {
        if (closed !== null) return;
        try {
          const c = chunkers[stream];
          c.write(chunk);
          if (c.pendingLength >= OUTPUT_CHUNK_MAX_BYTES) flush(stream, false);
        } catch (err) {
          this.#o.log.warn({ err }, 'live output: a chunk could not be queued');
        }
      },
      close: () => {
        closed ??= (async () => {
          clearInterval(timer);
          for (const stream of ['stdout', 'stderr'] as const) {
            flush(stream, true);
            const q = newest[stream];
            if (q !== undefined) this.#markLast(q);
          }
          // the controller takes no chunk once the run's result is in (output_closed), so the run's
          // tail must arrive before the signal: when half the wait has not emptied the queue, the
          // run's other chunks give way to its last ones, their bytes told as a gap
          const half = Math.floor(this.#o.finalWaitMs / 2);
          await this.#idle(half);
          if (this.#queue.some((x) => x.path === path && x.body.revision === revision && x.last !== true))
            this.#dropAllButLast(path, revision);
          await this.#idle(this.#o.finalWaitMs - half);
        })();
        return closed;
      },
    };
  }

  /**
   * The controller gave this node work (a wake-up that is not a ping): it lets that work's last
   * chunks past its limit (controller/service/wake-credits.ts), so they need not wait for a token here.
   */
  granted(): void {
    this.#credits = Math.min(this.#credits + EXEMPT_OUTPUT_PER_WAKE_REQUESTS, EXEMPT_OUTPUT_CAPACITY);
    if (this.#waitingFor?.last === true) this.#wake?.(); // a last chunk waiting for a token goes now
  }

  /** Stops sending; what is queued is dropped (the signal carries the tails). Idempotent. */
  stop(): void {
    this.#stopped = true;
    this.#queue.length = 0;
    this.#queuedBytes = 0;
    this.#wake?.();
    this.#settleIdle();
  }

  /** Queues a chunk; returns its entry (undefined once stopped). */
  #push(q: Omit<Queued, 'bytes'>): Queued | undefined {
    if (this.#stopped) return undefined;
    const key = `${q.path}#${q.body.revision}`;
    const entry: Queued = { ...q, bytes: Buffer.byteLength(q.body.text, 'utf8') };
    this.#queue.push(entry);
    this.#queuedBytes += entry.bytes;
    // the chunk in flight stays: it may be delivered already
    const first = this.#inflight !== null && this.#queue[0] === this.#inflight ? 1 : 0;
    while (this.#queuedBytes > this.#o.maxQueueBytes && this.#queue.length > first + 1) {
      const old = this.#queue.splice(first, 1)[0]!;
      this.#queuedBytes -= old.bytes;
      this.droppedBytes += old.bytes;
      const k = `${old.path}#${old.body.revision}`;
      this.#dropped.set(k, (this.#dropped.get(k) ?? 0) + old.bytes + (old.body.dropped_bytes ?? 0));
    }
    // the gap travels with the oldest chunk still queued of that run
    for (const [k, n] of this.#dropped) {
      const next = this.#queue.find((x) => `${x.path}#${x.body.revision}` === k);
      if (next === undefined) {
        if (k !== key) this.#dropped.delete(k); // that run is over: nothing left to carry it
        continue;
      }
      next.body.dropped_bytes = (next.body.dropped_bytes ?? 0) + n;
      this.#dropped.delete(k);
    }
    if (!this.#pumping) void this.#pump();
    return entry;
  }

  async #pump(): Promise<void> {
    this.#pumping = true;
    let failures = 0;
    try {
      while (!this.#stopped && this.#queue.length > 0) {
        await this.#takeToken();
        // the wait may have let stop() empty the queue, or a full one drop its oldest
        const q = this.#queue[0];
        if (q === undefined) continue;
        let retryMs: number | undefined;
        this.#inflight = q;
        try {
          const r = await this.#o.send(q.path, q.body);
          failures = 0;
          if (r.status === 429) retryMs = r.retryAfterMs ?? 1_000;
          else if (r.status >= 200 && r.status < 300) this.sent++;
          else {
            this.#o.log.debug?.({ status: r.status, path: q.path, seq: q.body.seq }, 'live output chunk refused');
            // 409 (output_closed, stale_revision): the run's revision takes no more output, so
            // the chunks queued after this one would each be refused the same way
            if (r.status === 409) this.#dropRun(q);
          }
        } catch (err) {
          failures++;
          retryMs = Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** Math.min(failures - 1, 5));
          if (failures === 1)
            this.#o.log.debug?.({ err: (err as Error).message }, 'live output: controller unreachable');
        } finally {
          this.#inflight = null;
        }
        if (retryMs === undefined) {
          // sent or refused for good: it leaves the queue (stop() may have emptied it already)
          if (this.#queue[0] === q) {
            this.#queue.shift();
            this.#queuedBytes -= q.bytes;
          }
          continue;
        }
        await this.#sleep(retryMs);
      }
    } finally {
      this.#pumping = false;
      this.#settleIdle();
    }
  }

  /**
   * Paces the chunk at the head of the queue: the client side of the controller's token bucket,
   * so the agent is not refused 429 needlessly. A run's last chunk goes on a credit when no token
   * is there (see the module's comment); the head is read again after each wait, since a full
   * queue may drop it and `close` may mark it the last meanwhile.
   */
  async #takeToken(): Promise<void> {
    for (;;) {
      const now = Date.now();
      this.#tokens = Math.min(OUTPUT_RATE_BURST, this.#tokens + ((now - this.#tokensAt) / 1000) * OUTPUT_RATE_PER_S);
      this.#tokensAt = now;
      if (this.#tokens >= 1) {
        this.#tokens -= 1;
        return;
      }
      const head = this.#queue[0];
      if (head === undefined || this.#stopped) return;
      if (head.last === true && this.#credits > 0) {
        this.#credits--;
        return;
      }
      this.#waitingFor = head;
      const full = await this.#sleep(((1 - this.#tokens) / OUTPUT_RATE_PER_S) * 1000);
      this.#waitingFor = null;
      if (full) {
        // a timer may fire a little before its time by this clock: a whole wait is a whole token
        this.#tokens = 1;
        this.#tokensAt = Date.now();
      }
    }
  }

  /** Drops the chunks queued after `q` of the same run (its path and revision); `q` itself leaves as usual. */
  #dropRun(q: Queued): void {
    for (let i = this.#queue.length - 1; i >= 0; i--) {
      const x = this.#queue[i]!;
      if (x === q || x.path !== q.path || x.body.revision !== q.body.revision) continue;
      this.#queue.splice(i, 1);
      this.#queuedBytes -= x.bytes;
    }
  }

  /**
   * Drops a run's queued chunks but its last ones (and the one in flight, which may be delivered
   * already); their bytes ride on the run's first chunk left as `dropped_bytes`.
   */
  #dropAllButLast(path: string, revision: number): void {
    let gap = 0;
    for (let i = this.#queue.length - 1; i >= 0; i--) {
      const x = this.#queue[i]!;
      if (x.path !== path || x.body.revision !== revision || x.last === true || x === this.#inflight) continue;
      this.#queue.splice(i, 1);
      this.#queuedBytes -= x.bytes;
      this.droppedBytes += x.bytes;
      gap += x.bytes + (x.body.dropped_bytes ?? 0);
    }
    const next = this.#queue.find((x) => x.path === path && x.body.revision === revision && x !== this.#inflight);
    if (next !== undefined && gap > 0) next.body.dropped_bytes = (next.body.dropped_bytes ?? 0) + gap;
    // a pump waiting for a token for a chunk dropped here looks at the new head
    if (this.#waitingFor !== null && !this.#queue.includes(this.#waitingFor)) this.#wake?.();
  }

  /** `q` turned out to be its run's last chunk of its stream: a wait for its token may end now. */
  #markLast(q: Queued): void {
    q.last = true;
    if (this.#waitingFor === q) this.#wake?.();
  }

  /** Resolves true after `ms`, or false at once when `#wake` is called. */
  #sleep(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.#wake = null;
        resolve(true);
      }, ms);
      t.unref();
      this.#wake = () => {
        this.#wake = null;
        clearTimeout(t);
        resolve(false);
      };
    });
  }

  /** Resolves when the queue is empty, or after `ms`. */
  #idle(ms: number): Promise<void> {
    if (this.#queue.length === 0 && !this.#pumping) return Promise.resolve();
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      t.unref();
      this.#idleWaiters.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  #settleIdle(): void {
    if (this.#queue.length > 0 && !this.#stopped) return;
    for (const w of this.#idleWaiters.splice(0)) w();
  }
}
