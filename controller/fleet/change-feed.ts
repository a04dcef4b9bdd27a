/**
 * Every committed change, whichever controller made it, in commit order (docs/several-controllers.md): the feed
 * reads `change_log` (controller/store/pg/store.ts) from where it stopped and hands each change set to the
 * service, which wakes the nodes this controller owns and announces events. It reads when a
 * `NOTIFY herald_changes` arrives, after this controller's own commits (`catchUp`), every
 * CHANGE_FEED_POLL_INTERVAL_MS in case a notification was lost, and after every (re)connect of
 * its `LISTEN` connection, when it also re-reads the nodes whose acknowledged generation is
 * behind (`resync`): notifications sent while the connection was down are gone, and entries
 * pruned meanwhile (CHANGE_LOG_RETENTION_S) are recovered that way.
 */
import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import { CHANGE_FEED_BATCH_ENTRIES, CHANGE_FEED_POLL_INTERVAL_MS } from '../../protocol/limits.js';
import type { LoggedChange, PgStore } from '../store/pg/store.js';

export interface ChangeFeedOptions {
  store: PgStore;
  /** One change set, in commit order; awaited before the next. */
  apply: (c: LoggedChange) => Promise<void>;
  /** After a (re)connect: wake owned nodes whose acknowledged generation is behind. */
  resync: () => Promise<void>;
  logger: Logger;
  registry: Registry;
  pollMs?: number;
}

export class ChangeFeed {
  readonly #o: ChangeFeedOptions;
  readonly #log: Logger;
  #last = 0;
  #reading: Promise<void> | undefined;
  #again = false;
  #timer: NodeJS.Timeout | undefined;
  #unlisten: (() => Promise<void>) | undefined;
  #closed = false;
  #connects = 0;
  #failing = false;
  readonly #notifications: Counter;
  readonly #applied: Counter;
  readonly #reconnects: Counter;

  constructor(o: ChangeFeedOptions) {
    this.#o = o;
    this.#log = o.logger.child({ component: 'change-feed' });
    this.#notifications = new Counter({
      name: 'herald_fleet_notifications_total',
      help: 'change notifications received from the database',
      registers: [o.registry],
    });
    this.#applied = new Counter({
      name: 'herald_fleet_changes_applied_total',
      help: 'change log entries read and applied, by origin (this controller or another)',
      labelNames: ['origin'],
      registers: [o.registry],
    });
    this.#reconnects = new Counter({
      name: 'herald_fleet_listen_reconnects_total',
      help: 'LISTEN connections re-established (each followed by a resync)',
      registers: [o.registry],
    });
  }

  /** The newest entry applied. */
  get position(): number {
    return this.#last;
  }

  /** Starts after what is logged now (the service starts from the stored state), then listens. */
  async start(): Promise<void> {
    this.#last = (await this.#o.store.changeHead()).last;
    const l = await this.#o.store.listen(
      () => {
        this.#notifications.inc();
        void this.catchUp();
      },
      () => {
        // after every (re)connect of the LISTEN connection; the first is the start itself
        if (this.#connects++ === 0) return;
        this.#reconnects.inc();
        this.#log.info('change notifications connected again: reading what was missed');
        void this.catchUp().then(() => this.#resync());
      },
    );
    this.#unlisten = l.unlisten;
    this.#timer = setInterval(() => void this.catchUp(), this.#o.pollMs ?? CHANGE_FEED_POLL_INTERVAL_MS);
    this.#timer.unref();
  }

  /**
   * Reads and applies every entry committed before now. Concurrent calls share one reader; a
   * call made while it reads gets one more pass, so its commit is covered. Never rejects.
   */
  catchUp(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#reading) {
      this.#again = true;
      return this.#reading;
    }
    this.#reading = (async () => {
      do {
        this.#again = false;
        try {
          await this.#read();
          if (this.#failing) this.#log.info('change log readable again');
          this.#failing = false;
        } catch (err) {
          // once per outage, not once per poll
          if (!this.#failing)
            this.#log.warn({ err: { message: (err as Error).message } }, 'could not read the change log; retrying');
          this.#failing = true;
          return;
        }
      } while (this.#again && !this.#closed);
    })().finally(() => {
      this.#reading = undefined;
    });
    return this.#reading;
  }

  async #read(): Promise<void> {
    for (;;) {
      const batch = await this.#o.store.changesAfter(this.#last, CHANGE_FEED_BATCH_ENTRIES);
      if (batch.length === 0) return;
      if (batch[0]!.seq > this.#last + 1) {
        // pruned before this controller read them: what they said is re-read from the nodes
        this.#log.warn(
          { from: this.#last + 1, to: batch[0]!.seq - 1 },
          'change log entries were pruned unread: resync',
        );
        await this.#resync();
      }
      for (const c of batch) {
        try {
          await this.#o.apply(c);
        } catch (err) {
          this.#log.error({ err, seq: c.seq }, 'a change set could not be applied');
        }
        this.#last = c.seq;
        this.#applied.inc({ origin: c.origin });
      }
      if (batch.length < CHANGE_FEED_BATCH_ENTRIES) return;
    }
  }

  async #resync(): Promise<void> {
    try {
      await this.#o.resync();
    } catch (err) {
      this.#log.warn({ err: { message: (err as Error).message } }, 'resync failed; the next reconnect or poll retries');
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    await this.#reading;
    await this.#unlisten?.().catch(() => {});
  }
}
