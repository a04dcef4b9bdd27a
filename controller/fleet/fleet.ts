/**
 * One controller's place among several on one PostgreSQL database (docs/several-controllers.md): membership,
 * node ownership, and the push service behind it.
 *
 * - Membership: a row per controller (name, API URL, heartbeat) renewed every
 *   CONTROLLER_HEARTBEAT_INTERVAL_MS; its lease runs CONTROLLER_LEASE_MS past each renewal, in
 *   the database's clock, so controllers on machines with different clocks agree on who is live.
 * - Ownership: a row per node naming its owner and a fencing epoch, raised at every change of
 *   owner (and when an owner starts again). A node's lease is its owner's. Every
 *   OWNERSHIP_RECONCILE_INTERVAL_MS each controller compares the rows with the rendezvous
 *   spread over the live controllers: it claims the nodes that are its own and whose owner is
 *   missing or dead (one statement checks that at the claim, so two controllers never both
 *   win), and releases the nodes that belong to another live controller. A claimed node is
 *   adopted: the dialer connects to it and sends a ping wake-up with the current generation.
 * - Fencing: only the owner dials and pushes (`notify` and `setEndpoint` pass through only for
 *   owned nodes), and only while its own lease holds: a controller that cannot renew stops
 *   pushing when the lease it last got ends (its monotonic clock, started before the renewal was
 *   sent, so it stops no later than the others think it dead). Acknowledged generations are
 *   written with the epoch held (controller/store/pg/store.ts), so a fenced-out owner's acks are ignored.
 * - Dialled-in connections: push follows the connection. A controller that holds a node's
 *   dialled-in connection (its agent chose it: docs/protocol.md) passes that node's wake-ups on,
 *   owner or not, while in standing; the change feed brings every change to every controller.
 *   The owner dials only an announced endpoint, so a node that announced none is pushed to by
 *   its holder alone.
 * - Standing: a lease counts only while its holder's certificate does. Each controller writes
 *   its certificate's serial and end to its membership row; a row whose serial is in the
 *   reader's revoked.json, or whose certificate has ended (database time), is dead to every
 *   reader, whatever its lease says. A controller that finds its own certificate revoked or
 *   expired (standing.ts) hands its nodes back and stops renewing at once, and joins again only
 *   once it is back in standing (a renewed certificate).
 *
 * `Fleet` is the `PushService` the controller's service sees.
 */
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import {
  CONTROLLER_HEARTBEAT_INTERVAL_MS,
  CONTROLLER_LEASE_MS,
  OWNERSHIP_FULL_SCAN_INTERVAL_MS,
  OWNERSHIP_RECONCILE_INTERVAL_MS,
  OWNERSHIP_SETTLE_MS,
} from '../../protocol/limits.js';
import type { Ed25519PrivateJwk } from '../../protocol/jws.js';
import type { ControllerView } from '../../protocol/rest.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { PgStore } from '../store/pg/store.js';
import type { AddressInfo } from 'node:net';
import {
  type ConnectListen,
  IDLE_PUSH_STATE,
  type PushEvents,
  type PushRequestHandler,
  type PushService,
  type PushState,
  type PushTarget,
} from '../push/types.js';
import { ownerOf } from './rendezvous.js';
import type { OwnCertificate } from './standing.js';

/** What the fleet asks of this controller's standing (standing.ts). */
export interface FleetStanding {
  refusal(): Error | undefined;
  /** Undefined: none to write (the membership row is then judged by its lease alone). */
  certificate(): OwnCertificate | undefined;
  revokedSerials(): ReadonlySet<string>;
  onChange(fn: () => void): void;
}

/**
 * The one test of a live membership row `c`, for every reader's every use (the spread, the
 * claim, GET /v1/controllers): its lease ahead, its certificate not ended and its serial not in
 * `$<revoked>` (the reader's revoked.json). A row without a certificate (a controller of a
 * Herald before this check) is judged by its lease alone.
 */
const liveRow = (c: string, revoked: number): string =>
  `(${c}.lease_until > now() AND (${c}.cert_not_after IS NULL OR ${c}.cert_not_after > now())
    AND (${c}.cert_serial IS NULL OR NOT (${c}.cert_serial = ANY($${revoked}::text[]))))`;

export interface FleetOptions {
  store: PgStore;
  /** This controller's name (its certificate's). */
  name: string;
  /** The URL operators and agents reach its API at (known once the API listens). */
  apiUrl: () => string;
  /** The real dialer (PushDialer or PushPool). */
  push: PushService;
  logger: Logger;
  registry: Registry;
  /** Monotonic ms (default performance.now). */
  clock?: () => number;
  heartbeatMs?: number;
  leaseMs?: number;
  reconcileMs?: number;
  fullScanMs?: number;
  settleMs?: number;
  /** Its own certificate's standing; without one (tests), always in standing and no peer revoked. */
  standing?: FleetStanding;
}

const ALWAYS_STANDING: FleetStanding = {
  refusal: () => undefined,
  certificate: () => undefined,
  revokedSerials: () => new Set(),
  onChange: () => {},
};

/** A controller as `GET /v1/controllers` shows it. */
export type ControllerMember = ControllerView;

interface NodeRow {
  id: string;
  endpoint: string | null;
  generation: number;
  controller: string | null;
  epoch: number | null;
}

export class Fleet implements PushService {
  readonly #o: Required<Omit<FleetOptions, 'clock'>> & { clock: () => number };
  readonly #inner: PushService;
  readonly #log: Logger;
  readonly #incarnation = randomUUID();
  /** Owned node → the epoch held. */
  readonly #owned = new Map<string, number>();
  /** Owned node → the endpoint given to the dialer. */
  readonly #endpoints = new Map<string, string | null>();
  /** Nodes whose dialled-in connection this controller holds, owned or not. */
  readonly #held = new Set<string>();
  /** Monotonic ms until which this controller may push (its lease as it last renewed it). */
  #leaseUntil = 0;
  #live: string[] = [];
  #heartbeatTimer: NodeJS.Timeout | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;
  #reconciling: Promise<void> | undefined;
  #again = false;
  #started = false;
  #closed = false;
  #leaseLostLogged = false;
  /** Its certificate is revoked or expired: it has given up its lease and nodes (see #stepDown). */
  #steppedDown = false;
  /** After a step-down, the database has its nodes back and its lease ended. */
  #handedBack = false;
  /** Fires when the lease ends without a renewal: fencing does not wait on a database call. */
  #leaseTimer: NodeJS.Timeout | undefined;
  /** Every node id the last full scan saw. */
  #known = new Set<string>();
  /** A node unknown to the last scan was mentioned: the next reconcile scans. */
  #dirty = true;
  #lastScanAt = Number.NEGATIVE_INFINITY;
  /** Until then every reconcile scans: the spread is settling (membership changed, nodes moved). */
  #settlingUntil = 0;
  /** The reconcile's last attempt failed (logged once until it succeeds again). */
  #reconcileFailing = false;
  /** A renewal failed since the last success (logged once). */
  #renewFailing = false;
  readonly #m: {
    owned: Gauge;
    held: Gauge;
    takeovers: Counter;
    released: Counter;
    renew: Histogram;
    renewFailures: Counter;
  };

  constructor(o: FleetOptions) {
    this.#o = {
      clock: () => performance.now(),
      heartbeatMs: CONTROLLER_HEARTBEAT_INTERVAL_MS,
      leaseMs: CONTROLLER_LEASE_MS,
      reconcileMs: OWNERSHIP_RECONCILE_INTERVAL_MS,
      fullScanMs: OWNERSHIP_FULL_SCAN_INTERVAL_MS,
      settleMs: OWNERSHIP_SETTLE_MS,
      standing: ALWAYS_STANDING,
      ...o,
    };
    this.#inner = o.push;
    this.#log = o.logger.child({ component: 'fleet' });
    const r = o.registry;
    this.#m = {
      owned: new Gauge({ name: 'herald_fleet_nodes_owned', help: 'nodes this controller owns', registers: [r] }),
      held: new Gauge({
        name: 'herald_fleet_nodes_held',
        help: 'push connections held: owned nodes connected, and nodes of others whose agents dialled in here',
        registers: [r],
      }),
      takeovers: new Counter({
        name: 'herald_fleet_takeovers_total',
        help: 'nodes claimed from a dead controller or from none',
        registers: [r],
      }),
      released: new Counter({
        name: 'herald_fleet_released_total',
        help: 'nodes handed to another live controller (rendezvous spread)',
        registers: [r],
      }),
      renew: new Histogram({
        name: 'herald_fleet_lease_renew_seconds',
        help: 'time to renew the membership lease',
        buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5],
        registers: [r],
      }),
      renewFailures: new Counter({
        name: 'herald_fleet_lease_renew_failures_total',
        help: 'lease renewals that failed (database unreachable)',
        registers: [r],
      }),
    };
    o.store.setAckFence((node) => (this.#pushing() ? this.#owned.get(node) : undefined));
    // before any other listener: the service's answer to an attach (the ping) must pass `notify`
    this.#inner.on('attach', (node) => this.#held.add(node));
    this.#inner.on('detach', (node) => {
      this.#held.delete(node);
      // held for its agent only: the owner dials it, if anyone
      if (!this.#owned.has(node)) this.#inner.remove(node);
    });
  }

  get name(): string {
    return this.#o.name;
  }

  /** The controllers thought live at the last reconcile (sorted). */
  get liveControllers(): readonly string[] {
    return this.#live;
  }

  owns(node: string): boolean {
    return this.#owned.has(node) && this.#pushing();
  }

  /** Whether it holds the node's dialled-in connection, and so pushes to it (while in standing), owner or not. */
  holds(node: string): boolean {
    return this.#held.has(node) && !this.#steppedDown;
  }

  /** Whether the change feed should tell it of a change to `node`: its own, or one its last scan did not see. */
  cares(node: string): boolean {
    return this.#owned.has(node) || !this.#known.has(node);
  }

  get ownedCount(): number {
    return this.#owned.size;
  }

  #pushing(): boolean {
    return this.#o.clock() < this.#leaseUntil && !this.#steppedDown;
  }

  /** A renewal sent at `sentAt` succeeded: push until `sentAt + lease`, and stop then unless renewed again. */
  #renewed(sentAt: number): void {
    this.#leaseUntil = sentAt + this.#o.leaseMs;
    clearTimeout(this.#leaseTimer);
    this.#leaseTimer = setTimeout(
      () => {
        if (!this.#closed && !this.#pushing()) this.#loseLease(new Error('the lease ended without a renewal'));
      },
      Math.max(0, this.#leaseUntil - this.#o.clock()) + 1,
    );
    this.#leaseTimer.unref();
  }

  // ---- PushService -------------------------------------------------------------------------

  /** Joins (membership row), then claims its nodes; `targets` are ignored: ownership decides. */
  async start(_targets: PushTarget[]): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    await this.#inner.start([]);
    // standing lost or regained: act now, not at the next heartbeat
    this.#o.standing.onChange(() => void this.#heartbeat());
    if (this.#o.standing.refusal() === undefined) {
      await this.#join();
      await this.reconcile();
    } else this.#steppedDown = true;
    this.#heartbeatTimer = setInterval(() => void this.#heartbeat(), this.#o.heartbeatMs);
    this.#heartbeatTimer.unref();
    this.#reconcileTimer = setInterval(() => void this.reconcile(), this.#o.reconcileMs);
    this.#reconcileTimer.unref();
  }

  notify(node: string, generation: number, reason: WakeReason): void {
    if (this.owns(node) || this.holds(node)) this.#inner.notify(node, generation, reason);
    else this.#noteNode(node);
  }

  setEndpoint(node: string, url: string | null, generation: number): void {
    if (!this.owns(node)) {
      this.#noteNode(node);
      return;
    }
    if (this.#endpoints.get(node) === url) return;
    this.#endpoints.set(node, url);
    this.#inner.setEndpoint(node, url, generation);
  }

  remove(node: string): void {
    this.#drop(node);
    this.#known.delete(node);
  }

  /** A node the last scan did not see (new, announced through any controller): scan now, it may be this one's. */
  #noteNode(node: string): void {
    if (this.#known.has(node) || this.#closed || !this.#started) return;
    this.#dirty = true;
    void this.reconcile();
  }

  state(node: string): PushState {
    return this.#owned.has(node) || this.#held.has(node) ? this.#inner.state(node) : { ...IDLE_PUSH_STATE };
  }

  serveConnect(listen: ConnectListen): Promise<AddressInfo> {
    if (!this.#inner.serveConnect) throw new Error('this push service takes no dialled-in connections');
    return this.#inner.serveConnect(listen);
  }

  drainConnect(windowMs: number): Promise<void> {
    return this.#inner.drainConnect?.(windowMs) ?? Promise.resolve();
  }

  setSigningKey(jwk: Ed25519PrivateJwk): void {
    this.#inner.setSigningKey(jwk);
  }

  serveRequests(handler: PushRequestHandler): void {
    this.#inner.serveRequests(handler);
  }

  on<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    this.#inner.on(event, fn);
  }

  /** Leaves: stops the timers, hands its nodes back (others claim them at once) and closes the dialer. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#heartbeatTimer);
    clearInterval(this.#reconcileTimer);
    clearTimeout(this.#leaseTimer);
    await this.#reconciling;
    const mine = [...this.#owned.keys()];
    this.#owned.clear();
    try {
      await this.#o.store.controlSql.unsafe('DELETE FROM node_owners WHERE controller = $1', [this.#o.name]);
      await this.#o.store.controlSql.unsafe(
        'UPDATE controllers SET lease_until = now() WHERE name = $1 AND incarnation = $2',
        [this.#o.name, this.#incarnation],
      );
    } catch (err) {
      this.#log.warn({ err: { message: (err as Error).message } }, 'could not hand back nodes at shutdown');
    }
    this.#log.info({ nodes: mine.length }, 'left the fleet');
    await this.#inner.close();
  }

  // ---- membership --------------------------------------------------------------------------

  async #join(): Promise<void> {
    const t0 = this.#o.clock();
    const cert = this.#o.standing.certificate();
    await this.#o.store.controlSql.unsafe(
      `INSERT INTO controllers (name, api_url, incarnation, started_at, heartbeat_at, lease_until, cert_serial, cert_not_after)
       VALUES ($1, $2, $3, now(), now(), now() + make_interval(secs => $4), $5, $6)
       ON CONFLICT (name) DO UPDATE SET api_url = excluded.api_url, incarnation = excluded.incarnation,
         started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until,
         cert_serial = excluded.cert_serial, cert_not_after = excluded.cert_not_after`,
      [
        this.#o.name,
        this.#o.apiUrl(),
        this.#incarnation,
        this.#o.leaseMs / 1000,
        cert?.serial ?? null,
        cert?.notAfter ?? null,
      ] as never[],
    );
    this.#steppedDown = false;
    this.#renewed(t0);
    this.#log.info({ controller: this.#o.name, apiUrl: this.#o.apiUrl() }, 'joined the fleet');
  }

  async #heartbeat(): Promise<void> {
    if (this.#closed) return;
    const refusal = this.#o.standing.refusal();
    if (refusal !== undefined) return this.#stepDown(refusal);
    if (this.#steppedDown) {
      // back in standing (a renewed certificate): join as at start, nodes only through the claim rules
      try {
        await this.#join();
        this.#log.info({ controller: this.#o.name }, 'back in standing: rejoined the fleet');
        void this.reconcile();
      } catch (err) {
        this.#m.renewFailures.inc();
        this.#log.warn({ code: 'store_unavailable', err: { message: (err as Error).message } }, 'could not rejoin');
      }
      return;
    }
    const t0 = this.#o.clock();
    const cert = this.#o.standing.certificate();
    const held = this.#heldNow();
    this.#m.held.set(held);
    try {
      const r = await this.#o.store.controlSql.unsafe(
        `UPDATE controllers SET heartbeat_at = now(), lease_until = now() + make_interval(secs => $3), api_url = $4,
           nodes_held = $5, cert_serial = $6, cert_not_after = $7 WHERE name = $1 AND incarnation = $2`,
        [
          this.#o.name,
          this.#incarnation,
          this.#o.leaseMs / 1000,
          this.#o.apiUrl(),
          held,
          cert?.serial ?? null,
          cert?.notAfter ?? null,
        ] as never[],
      );
      this.#m.renew.observe((this.#o.clock() - t0) / 1000);
      this.#renewFailing = false;
      if (r.count === 0) {
        // another process took this name (or an operator removed the row): join again, and
        // take the nodes back only through the claim rules
        this.#log.warn({ controller: this.#o.name }, 'membership row replaced by another incarnation; joining again');
        await this.#join();
        return;
      }
      if (this.#leaseLostLogged) this.#log.info('lease renewed again: rejoining the fleet');
      this.#renewed(t0);
      this.#leaseLostLogged = false;
      void this.#o.store.pruneChanges().catch(() => {});
    } catch (err) {
      this.#m.renewFailures.inc();
      if (!this.#pushing()) this.#loseLease(err);
      else if (!this.#renewFailing) {
        this.#renewFailing = true;
        this.#log.warn(
          { code: 'store_unavailable', err: { message: (err as Error).message } },
          'could not renew the lease; pushing until it ends',
        );
      }
      return;
    }
  }

  /**
   * Its own certificate is revoked or expired: stop pushing, hand every node back and end its
   * lease now (the others claim the nodes at their next pass, as from a controller that left).
   * Retried at every heartbeat until the database has taken it; the others' own check of its
   * row (liveRow) does not wait for this.
   */
  async #stepDown(refusal: Error): Promise<void> {
    if (!this.#steppedDown) {
      this.#steppedDown = true;
      clearTimeout(this.#leaseTimer);
      this.#leaseUntil = 0;
      this.#log.error(
        { code: (refusal as { code?: string }).code, nodes: this.#owned.size },
        'own certificate no longer in standing: stopped pushing and handing its nodes to the other controllers',
      );
      for (const node of [...this.#owned.keys()]) this.#drop(node);
      this.#handedBack = false;
    }
    if (this.#handedBack) return;
    try {
      await this.#o.store.controlSql.unsafe('DELETE FROM node_owners WHERE controller = $1', [this.#o.name]);
      await this.#o.store.controlSql.unsafe(
        'UPDATE controllers SET lease_until = LEAST(lease_until, now()) WHERE name = $1 AND incarnation = $2',
        [this.#o.name, this.#incarnation],
      );
      this.#handedBack = true;
    } catch (err) {
      this.#m.renewFailures.inc();
      this.#log.warn({ err: { message: (err as Error).message } }, 'could not hand back its nodes yet; retrying');
    }
  }

  /** The lease ended without a renewal: stop pushing to every node, forget them (others take them). */
  #loseLease(err: unknown): void {
    if (!this.#leaseLostLogged) {
      this.#leaseLostLogged = true;
      this.#log.error(
        { code: 'store_unavailable', nodes: this.#owned.size, err: { message: (err as Error).message } },
        'lease ended without a renewal: stopped pushing; the nodes go to the live controllers',
      );
    }
    for (const node of [...this.#owned.keys()]) this.#drop(node);
  }

  #drop(node: string): void {
    this.#owned.delete(node);
    this.#endpoints.delete(node);
    this.#inner.remove(node);
    this.#m.owned.set(this.#owned.size);
  }

  // ---- ownership ---------------------------------------------------------------------------

  /** Compares ownership with the spread now (the timer calls it); a run in progress is followed by one more. */
  reconcile(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#reconciling) {
      this.#again = true;
      return this.#reconciling;
    }
    this.#reconciling = (async () => {
      do {
        this.#again = false;
        try {
          await this.#reconcile();
          this.#reconcileFailing = false;
        } catch (err) {
          if (!this.#pushing()) this.#loseLease(err);
          else if (!this.#reconcileFailing) {
            // once per outage: the lease lines say the rest
            this.#reconcileFailing = true;
            this.#log.warn(
              { err: { message: (err as Error).message } },
              'ownership not reconciled; retrying every second',
            );
          }
        }
      } while (this.#again && !this.#closed);
    })().finally(() => {
      this.#reconciling = undefined;
    });
    return this.#reconciling;
  }

  async #reconcile(): Promise<void> {
    if (this.#steppedDown) return; // its nodes are handed back already
    if (!this.#pushing()) {
      if (this.#owned.size > 0) this.#loseLease(new Error('lease ended'));
      return;
    }
    const sql = this.#o.store.controlSql;
    const me = this.#o.name;
    const live = (
      (await sql.unsafe(`SELECT c.name FROM controllers c WHERE ${liveRow('c', 1)} ORDER BY c.name`, [
        [...this.#o.standing.revokedSerials()],
      ] as never[])) as unknown as Array<{
        name: string;
      }>
    ).map((r) => r.name);
    if (!live.includes(me)) live.push(me);
    live.sort();
    const now = this.#o.clock();
    if (live.join(',') !== this.#live.join(',')) {
      this.#log.info({ live, was: this.#live }, 'live controllers changed');
      this.#settlingUntil = now + this.#o.settleMs;
    }
    this.#live = live;
    // the full scan reads every node: each second while the spread settles or a new node was
    // mentioned, else every OWNERSHIP_FULL_SCAN_INTERVAL_MS (what others released meanwhile)
    if (!this.#dirty && now >= this.#settlingUntil && now - this.#lastScanAt < this.#o.fullScanMs) return;
    this.#dirty = false;
    this.#lastScanAt = now;
    const rows = (await sql.unsafe(
      `SELECT n.id, n.endpoint, n.generation, o.controller, o.epoch
       FROM nodes n LEFT JOIN node_owners o ON o.node_id = n.id`,
    )) as unknown as NodeRow[];
    this.#known = new Set(rows.map((r) => r.id));
    const liveSet = new Set(live);
    const claim: NodeRow[] = [];
    const readopt: NodeRow[] = [];
    const release: string[] = [];
    const stillMine = new Set<string>();
    /** Nodes adopted in this pass, each with the endpoint and generation the scan read. */
    const adopted: NodeRow[] = [];
    let waiting = 0;
    for (const r of rows) {
      const want = ownerOf(r.id, live);
      if (r.controller === me) {
        if (want !== me) release.push(r.id);
        else if (this.#owned.get(r.id) !== r.epoch) readopt.push(r);
        else stillMine.add(r.id);
      } else if (want === me) {
        if (r.controller === null || !liveSet.has(r.controller)) claim.push(r);
        else waiting++; // its live owner hands it over at its next reconcile
      }
    }
    // ownership this process thought it had but the rows no longer give it (taken while cut off, node deleted)
    const rowsMine = new Set([...stillMine, ...readopt.map((r) => r.id), ...release]);
    for (const node of [...this.#owned.keys()]) if (!rowsMine.has(node)) this.#drop(node);

    if (release.length > 0) {
      await sql.unsafe('DELETE FROM node_owners WHERE controller = $1 AND node_id = ANY($2::text[])', [
        me,
        release,
      ] as never[]);
      for (const node of release) this.#drop(node);
      this.#m.released.inc(release.length);
      this.#log.info({ nodes: release.length, live }, 'handed nodes to other live controllers');
    }
    // a node adopted here is caught up below (#catchUpAdopted); if anything after the first adoption
    // fails, the pass lets go of what it adopted, so the next pass adopts it again (the rows still
    // name this controller: a new epoch) and catches it up, rather than keeping it uncaught-up
    try {
      if (claim.length > 0) {
        const won = (await sql.unsafe(
          `INSERT INTO node_owners (node_id, controller, epoch)
           SELECT id, $1, 1 FROM unnest($2::text[]) AS v(id)
           ON CONFLICT (node_id) DO UPDATE SET controller = excluded.controller, epoch = node_owners.epoch + 1, since = now()
             WHERE node_owners.controller <> excluded.controller
               AND NOT EXISTS (SELECT 1 FROM controllers c WHERE c.name = node_owners.controller AND ${liveRow('c', 3)})
           RETURNING node_id, epoch`,
          [me, claim.map((r) => r.id), [...this.#o.standing.revokedSerials()]] as never[],
        )) as unknown as Array<{ node_id: string; epoch: number }>;
        const byId = new Map(claim.map((r) => [r.id, r]));
        const from = new Map<string, number>();
        for (const w of won) {
          const r = byId.get(w.node_id)!;
          const was = r.controller ?? '(none)';
          from.set(was, (from.get(was) ?? 0) + 1);
          this.#adopt(r, w.epoch);
          adopted.push(r);
        }
        if (won.length > 0) {
          this.#m.takeovers.inc(won.length);
          this.#log.info({ nodes: won.length, from: Object.fromEntries(from) }, 'took over nodes');
        }
      }
      if (readopt.length > 0) {
        // rows naming this controller from before it (re)started, or from before a lease loss: a new epoch fences the old
        const won = (await sql.unsafe(
          `UPDATE node_owners SET epoch = epoch + 1, since = now()
           WHERE controller = $1 AND node_id = ANY($2::text[]) RETURNING node_id, epoch`,
          [me, readopt.map((r) => r.id)] as never[],
        )) as unknown as Array<{ node_id: string; epoch: number }>;
        const byId = new Map(readopt.map((r) => [r.id, r]));
        for (const w of won) {
          const r = byId.get(w.node_id)!;
          this.#adopt(r, w.epoch);
          adopted.push(r);
        }
        if (won.length > 0) this.#log.info({ nodes: won.length }, 'adopted the nodes it owned before');
      }
      if (adopted.length > 0) await this.#catchUpAdopted(adopted);
    } catch (err) {
      for (const a of adopted) if (this.#owned.has(a.id)) this.#drop(a.id);
      this.#dirty = true; // the retry a second later scans again
      throw err;
    }
    this.#m.owned.set(this.#owned.size);
    // nodes moved (or were waiting for another controller to let go): keep looking each second
    if (claim.length > 0 || release.length > 0 || readopt.length > 0 || waiting > 0)
      this.#settlingUntil = this.#o.clock() + this.#o.settleMs;
  }

  /** Owns `r` from now at `epoch`: a fresh dialer entry, so it connects and pings with the current generation. */
  #adopt(r: NodeRow, epoch: number): void {
    if (this.#steppedDown) return; // a pass that began before the step-down: no node is its own any more
    this.#owned.set(r.id, epoch);
    this.#inner.remove(r.id);
    this.#endpoints.set(r.id, r.endpoint);
    if (r.endpoint !== null) this.#inner.setEndpoint(r.id, r.endpoint, r.generation);
  }

  /**
   * The scan read each adopted node's endpoint and generation before the claim, and a change
   * committed in between reached no controller: this one's change feed passed it on while the
   * node was not yet its own (`notify` and `setEndpoint` pass only for owned nodes), and the
   * former owner had let it go or was dead. The ping on connect then carried the generation
   * the agent had already fetched, so it fetched nothing and the step waited for its deadline.
   * Read them again now that they are owned: what commits after this read, the feed passes on.
   */
  async #catchUpAdopted(adopted: NodeRow[]): Promise<void> {
    const rows = (await this.#o.store.controlSql.unsafe(
      'SELECT id, endpoint, generation FROM nodes WHERE id = ANY($1::text[])',
      [adopted.map((r) => r.id)] as never[],
    )) as unknown as Array<Pick<NodeRow, 'id' | 'endpoint' | 'generation'>>;
    const current = new Map(rows.map((r) => [r.id, r]));
    let changed = 0;
    for (const a of adopted) {
      if (!this.owns(a.id)) continue; // let go again meanwhile, or the lease ended
      const r = current.get(a.id);
      if (r === undefined) {
        this.#drop(a.id); // deleted meanwhile
        continue;
      }
      // an endpoint the feed has moved on from since the adoption is newer than this read's
      if (r.endpoint !== a.endpoint && this.#endpoints.get(a.id) === a.endpoint)
        this.setEndpoint(a.id, r.endpoint, r.generation);
      else if (r.generation > a.generation) this.#inner.notify(a.id, r.generation, 'ping');
      else continue;
      changed++;
    }
    if (changed > 0) this.#log.info({ nodes: changed }, 'nodes changed while being claimed: woken again');
  }

  /** The owner of each of `nodes` (null: of every node) as the database records it. */
  async owners(nodes: string[] | null): Promise<Map<string, string>> {
    const rows = (await (nodes === null
      ? this.#o.store.controlSql.unsafe('SELECT node_id, controller FROM node_owners')
      : this.#o.store.controlSql.unsafe('SELECT node_id, controller FROM node_owners WHERE node_id = ANY($1::text[])', [
          nodes,
        ] as never[]))) as unknown as Array<{ node_id: string; controller: string }>;
    return new Map(rows.map((r) => [r.node_id, r.controller]));
  }

  /** Every controller of the database, live or not, with what it owns and holds. */
  async members(): Promise<ControllerMember[]> {
    const rows = (await this.#o.store.controlSql.unsafe(
      `SELECT c.name, c.api_url, c.started_at, c.heartbeat_at, c.lease_until, ${liveRow('c', 1)} AS live,
              c.nodes_held, (SELECT COUNT(*) FROM node_owners o WHERE o.controller = c.name) AS nodes_owned
       FROM controllers c ORDER BY c.name`,
      [[...this.#o.standing.revokedSerials()]] as never[],
    )) as unknown as Array<{
      name: string;
      api_url: string;
      started_at: Date;
      heartbeat_at: Date;
      lease_until: Date;
      live: boolean;
      nodes_held: number;
      nodes_owned: number;
    }>;
    return rows.map((r) => ({
      name: r.name,
      api_url: r.api_url,
      live: r.live,
      started_at: new Date(r.started_at).toISOString(),
      heartbeat_at: new Date(r.heartbeat_at).toISOString(),
      lease_until: new Date(r.lease_until).toISOString(),
      nodes_owned: Number(r.nodes_owned),
      nodes_held: r.name === this.#o.name ? this.#heldNow() : r.nodes_held,
    }));
  }

  /** The push connections it holds: of its own nodes, and the dialled-in ones of others'. */
  #heldNow(): number {
    let held = 0;
    for (const node of this.#owned.keys()) if (this.#inner.state(node).connected) held++;
    for (const node of this.#held) if (!this.#owned.has(node) && this.#inner.state(node).connected) held++;
    return held;
  }
}
