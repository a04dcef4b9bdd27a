/**
 * The signal outbox's sending loop (docs/architecture.md). Every signal is on disk (`OutboxStore`) before it
 * is sent; the queue is drained strictly in order, an entry removed once the controller answered
 * 2xx, 404 (the deployment is gone), 409 (a stale or unknown revision) or 400/413/422 (the signal
 * itself is refused: resending the same bytes cannot help),
 * and anything else retried with exponential backoff and full jitter, never before a 429's
 * Retry-After (a fetch's `retryNow` does not cut that wait short). After a restart the loop
 * starts with whatever the last run left. A result whose deployment has a newer revision queued
 * is dropped unsent (the controller could only answer it 409 stale_revision), so the queue holds
 * at most one deliverable result per deployment.
 */
import { fullJitterMs } from '../protocol/backoff.js';
import { OUTBOX_BACKOFF_BASE_MS, OUTBOX_BACKOFF_MAX_MS } from '../protocol/limits.js';
import type { SignalBody } from '../protocol/heat.js';
import type { Logger } from '../certs/tls.js';
import type { OutboxEntry, OutboxSignal, OutboxStore } from './outbox-store.js';

/** What the controller answered a signal: its status, and a 429's Retry-After (ms) when it said one. */
export interface SignalAnswer {
  status: number;
  retryAfterMs?: number;
}

/** Sends one signal for `deploymentId`; resolves with the controller's answer, rejects on a network error. */
export type SendSignal = (path: string, body: SignalBody, deploymentId: string) => Promise<SignalAnswer>;

export interface OutboxSenderOptions {
  store: OutboxStore;
  send: SendSignal;
  log: Logger;
  /** Default OUTBOX_BACKOFF_BASE_MS. */
  backoffBaseMs?: number;
  /** Default OUTBOX_BACKOFF_MAX_MS. */
  backoffMaxMs?: number;
  random?: () => number;
}

/** Is this answer final for the entry (remove it), or worth a retry? */
export function isFinalStatus(status: number): boolean {
  // 400, 413 and 422 say the signal itself is wrong: resending the same bytes cannot help, and
  // retrying it forever would hold back every signal queued behind it
  return (status >= 200 && status < 300) || [400, 404, 409, 413, 422].includes(status);
}

export class OutboxSender {
  readonly #o: Required<Omit<OutboxSenderOptions, 'random'>> & { random: () => number };
  #running: Promise<void> | null = null;
  #again = false;
  #stopped = false;
  #attempt = 0;
  /** Cuts a backoff wait short. */
  #wake: (() => void) | null = null;
  /** No signal goes before this (epoch ms): the controller's Retry-After. */
  #notBeforeMs = 0;
  readonly #idleWaiters: Array<() => void> = [];
  /**
   * The newest revision queued per deployment. A result of an older revision of the same
   * deployment can only be answered 409 stale_revision (the controller made the newer one current
   * before this agent could run it), so it is dropped unsent: the queue holds at most one
   * deliverable result per deployment, however fast its revisions come.
   */
  readonly #newest = new Map<string, number>();
  /** Signals delivered (or dropped as final) by this process, for tests. */
  delivered = 0;
  /** Signals dropped unsent because a newer revision of the same deployment was queued. */
  superseded = 0;

  constructor(opts: OutboxSenderOptions) {
    this.#o = {
      backoffBaseMs: OUTBOX_BACKOFF_BASE_MS,
      backoffMaxMs: OUTBOX_BACKOFF_MAX_MS,
      random: Math.random,
      ...opts,
    };
  }

  /** Writes the signal durably, then starts sending. Resolves once it is on disk. */
  async put(signal: OutboxSignal): Promise<OutboxEntry> {
    const entry = await this.#o.store.enqueue(signal);
    this.#noteQueued(entry);
    this.kick();
    return entry;
  }

  /** Starts draining (e.g. after a restart); a drain already running picks up new entries. */
  kick(): void {
    if (this.#stopped) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    this.#running = this.#drain().finally(() => {
      this.#running = null;
      if (this.#again && !this.#stopped) {
        this.#again = false;
        this.kick();
        return;
      }
      for (const w of this.#idleWaiters.splice(0)) w();
    });
  }

  /** The controller answered something (a fetch): a waiting retry goes now, or once its Retry-After has passed. */
  retryNow(): void {
    this.#attempt = 0;
    this.#wake?.();
  }

  /** Resolves when the queue was drained (or the sender stopped). */
  idle(): Promise<void> {
    if (this.#running === null) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /** Stops sending after the request in flight; entries stay on disk for the next start. */
  stop(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    return this.#running ?? Promise.resolve();
  }

  async #drain(): Promise<void> {
    while (!this.#stopped) {
      this.#again = false;
      let entries: OutboxEntry[];
      try {
        entries = await this.#o.store.list();
      } catch (err) {
        this.#o.log.error({ err }, 'cannot read the outbox; retrying');
        await this.#backoff();
        continue;
      }
      if (entries.length === 0) return;
      for (const e of entries) this.#noteQueued(e); // after a restart, the list is all there is
      for (const e of entries) {
        if (this.#stopped) return;
        if (!(await this.#sendOne(e))) break; // keep the order: nothing after a failed entry goes first
      }
    }
  }

  #noteQueued(e: OutboxEntry): void {
    if ((this.#newest.get(e.deployment_id) ?? -1) < e.body.revision) this.#newest.set(e.deployment_id, e.body.revision);
  }

  async #dropSuperseded(e: OutboxEntry): Promise<void> {
    await this.#o.store.remove(e);
    this.superseded++;
    this.#o.log.info(
      {
        deployment_id: e.deployment_id,
        revision: e.body.revision,
        newer: this.#newest.get(e.deployment_id),
        seq: e.seq,
      },
      'signal superseded by a newer revision of the same deployment; dropped unsent',
    );
  }

  /** Sends one entry until it is final; false when stopped first. */
  async #sendOne(e: OutboxEntry): Promise<boolean> {
    while (!this.#stopped) {
      // a newer revision of the deployment may have been queued while this one waited to retry
      if ((this.#newest.get(e.deployment_id) ?? e.body.revision) > e.body.revision) {
        await this.#dropSuperseded(e);
        return true;
      }
      try {
        const { status, retryAfterMs } = await this.#o.send(e.path, e.body, e.deployment_id);
        // at most the longest backoff: a wrong Retry-After cannot hold the results back for long
        if (retryAfterMs !== undefined) this.#notBeforeMs = Date.now() + Math.min(retryAfterMs, this.#o.backoffMaxMs);
        if (isFinalStatus(status)) {
          await this.#o.store.remove(e);
          this.#attempt = 0;
          this.delivered++;
          if (this.#newest.get(e.deployment_id) === e.body.revision) this.#newest.delete(e.deployment_id);
          const log = status < 300 ? this.#o.log.info.bind(this.#o.log) : this.#o.log.warn.bind(this.#o.log);
          log(
            { deployment_id: e.deployment_id, revision: e.body.revision, status, seq: e.seq },
            status < 300 ? 'signal delivered' : 'signal refused for good; dropped',
          );
          return true;
        }
        this.#o.log.warn(
          { deployment_id: e.deployment_id, status, attempt: this.#attempt, retryAfterMs },
          'signal not accepted; retrying',
        );
      } catch (err) {
        this.#o.log.warn(
          {
            deployment_id: e.deployment_id,
            err: (err as Error).message,
            code: (err as { code?: string }).code,
            attempt: this.#attempt,
          },
          'signal not delivered; retrying',
        );
      }
      await this.#backoff();
    }
    return false;
  }

  async #backoff(): Promise<void> {
    const jittered = fullJitterMs(this.#attempt, this.#o.backoffBaseMs, this.#o.backoffMaxMs, this.#o.random);
    const ms = Math.max(10, jittered, this.#notBeforeMs - Date.now());
    this.#attempt++;
    if (this.#stopped) return;
    await new Promise<void>((resolve) => {
      let t = setTimeout(done, ms);
      t.unref();
      const self = this;
      function done(): void {
        clearTimeout(t);
        // cut short (retryNow): not before the controller's Retry-After, unless stopping
        const leftMs = self.#notBeforeMs - Date.now();
        if (leftMs > 0 && !self.#stopped) {
          t = setTimeout(done, leftMs);
          t.unref();
          return;
        }
        if (self.#wake === done) self.#wake = null;
        resolve();
      }
      this.#wake = done;
    });
  }
}
