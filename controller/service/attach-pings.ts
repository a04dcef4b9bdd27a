/**
 * The first wake-up on a dialled-in connection (docs/protocol.md, "Dialled-in connections"): once
 * a node's agent has dialled in, it is sent a `ping` with the node's current generation, read
 * here from the store. The push service knows only the generations it was told (and, with
 * several controllers, none of the nodes another controller owns), so it sends nothing on a
 * dialled-in connection until this `notify`.
 *
 * A few reads at a time: a controller's restart brings thousands of agents back within seconds,
 * and the PostgreSQL pool refuses callers past a bounded queue (PG_POOL_QUEUE_ENTRIES). A read
 * that fails is tried again a second later while the node is still connected.
 */
import type { Logger } from 'pino';
import { MAX_ATTACH_PING_READS_IN_FLIGHT, STORE_UNAVAILABLE_RETRY_AFTER_S } from '../../protocol/limits.js';
import { codeOf } from '../../protocol/errors.js';
import type { PushService } from '../push/types.js';
import type { Store } from '../store/store.js';

export interface AttachPingsOptions {
  store: Pick<Store, 'getNode'>;
  push: Pick<PushService, 'notify' | 'state'>;
  logger: Logger;
  /**
   * A node not in the database whose agent dialled in: registers it (as an announcement does with
   * auto-registration on) and resolves with its generation, or undefined when it may not be
   * registered (auto-registration off, or the node was deleted).
   */
  register?: (node: string) => Promise<number | undefined>;
  /** Default MAX_ATTACH_PING_READS_IN_FLIGHT. */
  readsInFlight?: number;
  /** Default STORE_UNAVAILABLE_RETRY_AFTER_S in ms. */
  retryMs?: number;
}

export class AttachPings {
  readonly #o: Required<AttachPingsOptions>;
  /** Nodes waiting for their read, in the order they attached (each once). */
  readonly #waiting = new Set<string>();
  #reading = 0;
  #closed = false;
  /** A failing store is said once until a read succeeds again. */
  #failing = false;
  readonly #retries = new Set<NodeJS.Timeout>();

  constructor(o: AttachPingsOptions) {
    this.#o = {
      register: async () => undefined,
      readsInFlight: MAX_ATTACH_PING_READS_IN_FLIGHT,
      retryMs: STORE_UNAVAILABLE_RETRY_AFTER_S * 1000,
      ...o,
    };
  }

  /** The node's agent has dialled in: its ping follows once its generation is read. */
  attached(node: string): void {
    if (this.#closed) return;
    this.#waiting.add(node);
    this.#pump();
  }

  /** Stops reading; waiting nodes get no ping. Idempotent. */
  close(): void {
    this.#closed = true;
    this.#waiting.clear();
    for (const t of this.#retries) clearTimeout(t);
    this.#retries.clear();
  }

  #pump(): void {
    while (!this.#closed && this.#reading < this.#o.readsInFlight && this.#waiting.size > 0) {
      const node = this.#waiting.values().next().value as string;
      this.#waiting.delete(node);
      this.#reading++;
      void this.#ping(node).finally(() => {
        this.#reading--;
        this.#pump();
      });
    }
  }

  async #ping(node: string): Promise<void> {
    try {
      const n = await this.#o.store.getNode(node);
      this.#failing = false;
      if (this.#closed) return;
      // not (or no longer) a node here: registered as an announcement would be, else no ping
      const generation = n?.generation ?? (await this.#o.register(node));
      if (this.#closed) return;
      if (generation === undefined) {
        this.#o.logger.debug({ node }, 'a dialled-in agent of a node not in the database: no ping');
        return;
      }
      this.#o.push.notify(node, generation, 'ping');
    } catch (err) {
      if (!this.#failing)
        this.#o.logger.warn(
          { node, code: codeOf(err) ?? 'internal', err: { message: (err as Error).message } },
          'could not read the generation of a dialled-in node; trying again',
        );
      this.#failing = true;
      const t = setTimeout(() => {
        this.#retries.delete(t);
        // gone meanwhile: a later attach asks anew
        if (this.#o.push.state(node).connected) this.attached(node);
      }, this.#o.retryMs);
      t.unref();
      this.#retries.add(t);
    }
  }
}
