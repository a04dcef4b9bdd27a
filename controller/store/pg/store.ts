/**
 * `Store` on PostgreSQL (docs/several-controllers.md), for several controllers sharing one database. The rows and
 * the transaction object are SQLite's (controller/store/tx.ts over controller/store/statements.ts); what differs is how
 * transactions meet:
 *
 * - A transaction runs on a pooled connection (READ COMMITTED). Rows read for change are
 *   locked (`FOR UPDATE`), the operations a tick advances claimed `SKIP LOCKED`.
 * - The generation is global and never goes backwards for any reader: a transaction that
 *   touched nodes takes its number last, from the `sequence` row, whose lock it then holds to
 *   its commit, so transactions commit in the order of their numbers (a bare PostgreSQL
 *   sequence hands numbers out in call order, not commit order). A group commit takes the
 *   numbers of all its units at once, after the last has run, and stamps and logs them in one
 *   statement each (`#seal`).
 * - A fetch's read is one statement (`metadataSource`, `PG_METADATA_SQL`).
 * - Every change set is written to `change_log` under the same lock (so the log is in commit
 *   order too) and one `NOTIFY herald_changes` per transaction says "look": every controller
 *   reads the log from where it stopped (controller/fleet/change-feed.ts), which is also how it recovers
 *   what it missed while cut off.
 * - A deadlock, a serialization failure or a unique-key race with another controller retries
 *   the whole transaction (its callback uses only `tx`, so it can run again).
 * - The database being away or stalled is `store_unavailable` (the API's 503), never a hang:
 *   every wait on it is bounded. Connecting gives up after PG_CONNECT_TIMEOUT_S, a statement
 *   after PG_STATEMENT_TIMEOUT_MS, a lock wait after PG_LOCK_TIMEOUT_MS, an idle transaction
 *   after PG_IDLE_IN_TRANSACTION_TIMEOUT_MS; a wait for a pooled connection after
 *   PG_POOL_WAIT_MS, behind at most PG_POOL_QUEUE_ENTRIES others (pool-gate.ts: the client's
 *   own queue has neither bound).
 *
 * The client is `postgres` (porsager): pooled, prepared statements, and `listen()` on a
 * dedicated connection that reconnects with backoff and calls back after every (re)connect,
 * which is where a controller re-reads what it may have missed.
 */
import postgres from 'postgres';
import { ConfigError, HeraldError } from '../../../protocol/errors.js';
import {
  CHANGE_LOG_RETENTION_S,
  PG_CONNECT_TIMEOUT_S,
  PG_CONTROL_CONNECTIONS,
  PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
  PG_INSERT_MANY_MAX_ROWS,
  PG_LOCK_TIMEOUT_MS,
  PG_RECONNECT_BACKOFF_MAX_S,
  PG_POOL_CONNECTIONS,
  PG_POOL_QUEUE_ENTRIES,
  PG_POOL_WAIT_MS,
  PG_STATEMENT_TIMEOUT_MS,
  PG_TX_RETRY_ATTEMPTS,
} from '../../../protocol/limits.js';
import { ChangeSetBuilder } from '../../model/change-set.js';
import { SqlStoreBase } from '../base.js';
import type {
  ConsumeResult,
  EnrollmentTokenRecord,
  FloorReason,
  IdentityFloorRecord,
  NewEnrollmentToken,
  NodeCertificateRecord,
  SeenCertificate,
} from '../enrollment-records.js';
import { pgEnrollment, type AppendAudit } from './enrollment.js';
import { AuditWriter } from '../audit-chain.js';
import { PG_MIGRATIONS, PG_SCHEMA_VERSION, pgStatementTexts, type PgStatementName } from './schema.js';
import type { ChangeSet, KnownGenerations, MetadataRead } from '../../model/records.js';
import { PoolGate } from './pool-gate.js';
import { SqlOutputRows, type OutputChunkRecord } from '../output.js';
import {
  INSERT_MANY,
  METADATA_GROUP_CONFIGS_AT,
  NODE_AT,
  PG_METADATA_SQL,
  SELECT_MANY,
  SQL,
  type InsertMany,
  type InsertManyName,
  type SelectMany,
  type SelectManyName,
  type StatementName,
  type Statements,
  type Stmt,
  VALUES_SQL,
  type ValuesName,
  type ValuesStmt,
} from '../statements.js';
import { type GroupConfigs, SqlRows, SqlTx } from '../tx.js';
import { nodeOfValues } from '../rows.js';
import type { Committed, Store, TxFn, UnitOutcome } from '../store.js';

export const CHANGE_CHANNEL = 'herald_changes';
/** The advisory lock the migrating controller holds (any fixed number; "herald" in base 36, truncated). */
const MIGRATION_LOCK_KEY = 1_095_189_117;

/**
 * Statements of PostgreSQL alone: the sequence row with the change counter (`$1` generations and
 * `$2` change sets taken at once), the touched nodes' new generations and the change sets' log
 * rows, each written for a whole transaction (all the units of a group commit) in one statement.
 */
const HEADS_SQL = `UPDATE sequence SET value = value + $1, changes = changes + $2 WHERE name = 'generation' RETURNING value, changes`;
const STAMP_SQL = `UPDATE nodes n SET generation = v.g FROM unnest($1::text[], $2::bigint[]) AS v(id, g) WHERE n.id = v.id`;
const LOG_SQL = `INSERT INTO change_log (seq, origin, generation, body)
  SELECT v.seq, $4, v.g, v.body FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS v(seq, g, body)`;

/** One committed change set as the log keeps it. */
export interface LoggedChange {
  seq: number;
  /** The controller whose transaction it was. */
  origin: string;
  changes: ChangeSet;
}

export interface PgStoreOptions {
  /** This controller's name, written with each change it logs. */
  controller: string;
  now?: () => number;
  /** Connections in the pool (default PG_POOL_CONNECTIONS); `LISTEN` takes one more. */
  maxConnections?: number;
  /** Longest wait for a pooled connection, ms (default PG_POOL_WAIT_MS). */
  poolWaitMs?: number;
  /** Callers waiting for a pooled connection at most (default PG_POOL_QUEUE_ENTRIES). */
  poolQueueEntries?: number;
}

type Sql = postgres.Sql<Record<string, never>>;
type TxSql = postgres.TransactionSql<Record<string, never>>;

/** A unit of work that ran: its result and what it changed, not yet numbered. */
interface Ran<T> {
  result: T;
  changes: ChangeSetBuilder;
}

/** Where PG_METADATA_SQL's row has the deployments: after the node's columns. */
const METADATA_DEPLOYMENTS_AT = Object.keys(NODE_AT).length;

const RETRYABLE = new Set(['40001', '40P01', '23505']);
/** Class 08 (connection exception), 57P (operator intervention: shutdown), 53 (resources). */
const UNAVAILABLE_SQLSTATE = /^(08|57P|53)/;
const UNAVAILABLE_CLIENT = new Set([
  'CONNECTION_CLOSED',
  'CONNECTION_ENDED',
  'CONNECTION_DESTROYED',
  'CONNECT_TIMEOUT',
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/** Is `err` the database being away (rather than a bug or a refusal)? */
export function isUnavailable(err: unknown): boolean {
  const e = err as { code?: unknown; errno?: unknown };
  if (typeof e?.code !== 'string') return false;
  if (UNAVAILABLE_CLIENT.has(e.code)) return true;
  // statement_timeout (57014) and lock_timeout (55P03) are a stuck database as far as the caller can tell
  return UNAVAILABLE_SQLSTATE.test(e.code) || e.code === '57014' || e.code === '55P03';
}

function unavailable(err: unknown): HeraldError {
  return new HeraldError('store_unavailable', `the database is unreachable: ${(err as Error).message}`, {
    cause: err,
  });
}

/** Statements bound to one connection or transaction. */
function bind(sql: Sql | TxSql, texts: Record<PgStatementName, string>): Statements {
  const out = {} as Record<StatementName, Stmt> &
    Record<InsertManyName, InsertMany> &
    Record<SelectManyName, SelectMany> &
    Record<ValuesName, ValuesStmt>;
  for (const name of Object.keys(SQL) as StatementName[]) {
    const text = texts[name];
    out[name] = {
      get: async (...params: unknown[]) => (await sql.unsafe(text, params as never[], { prepare: true }))[0],
      all: async (...params: unknown[]) => [...(await sql.unsafe(text, params as never[], { prepare: true }))],
      run: async (...params: unknown[]) => ({
        changes: (await sql.unsafe(text, params as never[], { prepare: true })).count,
      }),
    };
  }
  for (const name of Object.keys(VALUES_SQL) as ValuesName[]) {
    const text = texts[name];
    out[name] = {
      all: async (...params: unknown[]) => [...(await sql.unsafe(text, params as never[], { prepare: true }).values())],
    };
  }
  for (const name of Object.keys(INSERT_MANY) as InsertManyName[]) {
    const text = texts[name];
    const width = INSERT_MANY[name].columns.length;
    out[name] = {
      run: async (rows) => {
        for (let at = 0; at < rows.length; at += PG_INSERT_MANY_MAX_ROWS) {
          const chunk = rows.slice(at, at + PG_INSERT_MANY_MAX_ROWS);
          // one array per column, in the columns' order
          const columns = Array.from({ length: width }, (_, j) => chunk.map((r) => r[j]));
          await sql.unsafe(text, columns as never[], { prepare: true });
        }
      },
    };
  }
  for (const name of Object.keys(SELECT_MANY) as SelectManyName[]) {
    const text = texts[name];
    out[name] = {
      all: async (keys) =>
        keys.length === 0 ? [] : [...(await sql.unsafe(text, [keys] as never[], { prepare: true }))],
    };
  }
  return out;
}

export class PgStore extends SqlStoreBase implements Store {
  readonly #sql: Sql;
  readonly #control: Sql;
  readonly #texts = pgStatementTexts();
  readonly #pool: Statements;
  readonly #rows: SqlRows;
  readonly #output: SqlOutputRows;
  readonly #now: () => number;
  readonly #controller: string;
  readonly #url: string;
  /** Every use of the pool passes here first: a bounded wait for a connection. */
  readonly #gate: PoolGate;
  /** Set by the fleet (controller/fleet/fleet.ts); without one, acks are written as SQLite writes them. */
  #ackFence: ((node: string) => number | undefined) | null = null;
  /** Why this controller may not write now (standing.ts), checked before every write. */
  #writeGate: () => HeraldError | undefined = () => undefined;
  /** Transactions in flight: close() waits for them. */
  readonly #open = new Set<Promise<unknown>>();
  #closed = false;

  private constructor(url: string, sql: Sql, control: Sql, o: Required<PgStoreOptions>) {
    super();
    this.#url = url;
    this.#sql = sql;
    this.#control = control;
    this.#now = o.now;
    this.#controller = o.controller;
    this.#gate = new PoolGate({ permits: o.maxConnections, waitMs: o.poolWaitMs, maxWaiting: o.poolQueueEntries });
    this.#pool = bind(sql, this.#texts);
    this.#rows = new SqlRows(this.#pool, o.now);
    this.#output = new SqlOutputRows(this.#pool);
  }

  /**
   * Connects to `url` (`postgres://user[:pass]@host:port/db`) and migrates the schema (one
   * controller at a time, under an advisory lock).
   * @throws ConfigError `bad_option` (field `db`) when the database cannot be reached or was
   *   migrated by a newer Herald
   */
  static async open(url: string, opts: PgStoreOptions): Promise<PgStore> {
    const o: Required<PgStoreOptions> = {
      now: Date.now,
      maxConnections: PG_POOL_CONNECTIONS,
      poolWaitMs: PG_POOL_WAIT_MS,
      poolQueueEntries: PG_POOL_QUEUE_ENTRIES,
      ...opts,
    };
    const client = (max: number, role: string) =>
      postgres(url, {
        max,
        connect_timeout: PG_CONNECT_TIMEOUT_S,
        // the client's default waits up to 20 s between attempts once a few failed (its count
        // is shared by the pool), and queries queue meanwhile: a request would hang past any
        // deadline and a recovered database would wait for that timer. A short cap keeps
        // "the database is away" a fast 503 and the way back quick.
        backoff: (retries: number) => Math.min(0.05 * 2 ** retries, PG_RECONNECT_BACKOFF_MAX_S),
        onnotice: () => {},
        // BIGINT (generations, epoch ms, counts) as numbers: all stay below 2^53
        types: {
          bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
        },
        connection: {
          application_name: `herald-controller/${o.controller}${role}`,
          statement_timeout: PG_STATEMENT_TIMEOUT_MS,
          lock_timeout: PG_LOCK_TIMEOUT_MS,
          idle_in_transaction_session_timeout: PG_IDLE_IN_TRANSACTION_TIMEOUT_MS,
        },
      }) as unknown as Sql;
    const sql = client(o.maxConnections, '');
    // membership and ownership on connections of their own: a lease must be renewed on time
    // even while a storm of announcements or a big cluster keeps every pooled connection busy
    const control = client(PG_CONTROL_CONNECTIONS, '/fleet');
    const store = new PgStore(url, sql, control, o);
    try {
      await store.#migrate();
    } catch (err) {
      await Promise.all([sql.end({ timeout: 1 }), control.end({ timeout: 1 })]);
      if (err instanceof ConfigError) throw err;
      throw new ConfigError(`--db ${redact(url)}: ${(err as Error).message}`, { cause: err, field: 'db' });
    }
    return store;
  }

  /** The pooled client (transactions, reads, the change feed). */
  get sql(): Sql {
    return this.#sql;
  }

  /** PG_CONTROL_CONNECTIONS connections of their own for membership and ownership (controller/fleet/fleet.ts). */
  get controlSql(): Sql {
    return this.#control;
  }

  get url(): string {
    return redact(this.#url);
  }

  /** Acks are written only for nodes this controller owns, with the epoch it holds (docs/several-controllers.md fencing). */
  setAckFence(fence: (node: string) => number | undefined): void {
    this.#ackFence = fence;
  }

  /**
   * Every write of this store (transactions, group commits, acks, output, enrolment) first asks
   * `gate`, and rejects with what it returns: a controller whose certificate is revoked or
   * expired changes nothing the fleet runs, by whatever path (API, push connection, cluster
   * tick). The fleet's own membership statements (controlSql) are not gated: handing nodes back
   * is a write it must still make.
   */
  setWriteGate(gate: () => HeraldError | undefined): void {
    this.#writeGate = gate;
  }

  #assertWritable(): void {
    const refusal = this.#writeGate();
    if (refusal !== undefined) throw refusal;
  }

  async #migrate(): Promise<void> {
    await this.#sql.begin(async (tx) => {
      // one controller migrates; the others wait here and find nothing left to do
      await tx.unsafe(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`);
      await tx.unsafe(
        'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
      );
      const [row] = await tx.unsafe('SELECT MAX(version) AS v FROM schema_migrations');
      const current = Number((row as unknown as { v: number | null }).v ?? 0);
      if (current > PG_SCHEMA_VERSION)
        throw new ConfigError(
          `--db ${redact(this.#url)}: schema version ${current} is newer than this Herald knows (${PG_SCHEMA_VERSION}); use a newer Herald`,
          { field: 'db' },
        );
      for (const m of PG_MIGRATIONS) {
        if (m.version <= current) continue;
        await tx.unsafe(m.sql);
        await m.run?.(tx as never);
        await tx.unsafe('INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)', [
          m.version,
          m.name,
          new Date(this.#now()).toISOString(),
        ]);
      }
    });
  }

  #assertOpen(): void {
    if (this.#closed) throw new HeraldError('internal', 'the store is closed');
  }

  /** Runs `fn` on the pool (after the gate's bounded wait), mapping "the database is away" to store_unavailable. */
  #db<T>(fn: () => Promise<T>): Promise<T> {
    return this.#gate.run(() => this.#mapped(fn));
  }

  async #mapped<T>(fn: () => Promise<T>): Promise<T> {
    this.#assertOpen();
    try {
      return await fn();
    } catch (err) {
      if (isUnavailable(err)) throw unavailable(err);
      throw err;
    }
  }

  /** A read of several statements in one snapshot (REPEATABLE READ, read only). */
  #snapshot<T>(fn: (rows: SqlRows) => Promise<T>): Promise<T> {
    return this.#db(
      () =>
        this.#sql.begin('isolation level repeatable read read only', (tx) =>
          fn(new SqlRows(bind(tx, this.#texts), this.#now, this.#rows.configCache)),
        ) as Promise<T>,
    );
  }

  // ---- transactions ------------------------------------------------------------------------

  transaction<T>(fn: TxFn<T>): Promise<Committed<T>> {
    return this.#retrying(
      () =>
        this.#sql.begin(async (tx) => {
          const s = bind(tx, this.#texts);
          const ran = await this.#unit(s, fn, new AuditWriter(s, this.#controller));
          const { committed, last } = await this.#seal(tx, [ran]);
          if (last !== null) await tx.unsafe('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, String(last)]);
          return committed[0]!;
        }) as Promise<Committed<T>>,
    );
  }

  group<T>(units: ReadonlyArray<TxFn<T>>): Promise<Array<UnitOutcome<T>>> {
    return this.#retrying(
      () =>
        this.#sql.begin(async (tx) => {
          const s = bind(tx, this.#texts);
          // one chain for the group: its head is locked once, then kept from unit to unit
          const chain = new AuditWriter(s, this.#controller);
          const ran: Array<Ran<T> | { error: unknown }> = [];
          for (const fn of units) {
            const mark = chain.mark();
            try {
              ran.push((await tx.savepoint(() => this.#unit(s, fn, chain))) as Ran<T>);
            } catch (error) {
              chain.reset(mark);
              // a unit's own error undoes that unit; a lost connection or a deadlock ends them all
              if (isUnavailable(error) || RETRYABLE.has((error as { code?: string }).code ?? '')) throw error;
              ran.push({ error });
            }
          }
          const done = ran.filter((r): r is Ran<T> => !('error' in r));
          const { committed, last } = await this.#seal(tx, done);
          if (last !== null) await tx.unsafe('SELECT pg_notify($1, $2)', [CHANGE_CHANNEL, String(last)]);
          let i = 0;
          return ran.map(
            (r): UnitOutcome<T> =>
              'error' in r ? { ok: false, error: r.error } : { ok: true, value: committed[i++]! },
          );
        }) as Promise<Array<UnitOutcome<T>>>,
    );
  }

  #retrying<T>(run: () => Promise<T>): Promise<T> {
    const p = this.#gate.run(() => this.#retry(run));
    this.#open.add(p);
    const forget = () => this.#open.delete(p);
    p.then(forget, forget);
    return p;
  }

  async #retry<T>(run: () => Promise<T>): Promise<T> {
    this.#assertOpen();
    this.#assertWritable();
    for (let attempt = 0; ; attempt++) {
      try {
        return await run();
      } catch (err) {
        const code = (err as { code?: string }).code ?? '';
        if (RETRYABLE.has(code) && attempt < PG_TX_RETRY_ATTEMPTS) continue;
        if (isUnavailable(err)) throw unavailable(err);
        throw err;
      }
    }
  }

  /**
   * Runs one unit of work, gathering what it changed (numbered and logged by #seal), and appends
   * its audit rows to the chain: the chain head's lock comes here, the sequence row's in #seal,
   * always in this order.
   */
  async #unit<T>(s: Statements, fn: TxFn<T>, chain: AuditWriter): Promise<Ran<T>> {
    const changes = new ChangeSetBuilder();
    const unit = new SqlTx(new SqlRows(s, this.#now, this.#rows.configCache, { inTransaction: true }), changes, chain);
    try {
      const result = await fn(unit);
      await unit.flushAudit();
      return { result, changes };
    } finally {
      unit.end();
    }
  }

  /**
   * The end of a transaction whose units have run: the numbers for all of them at once (and the
   * sequence row's lock, to the commit), a generation for each unit that touched a node and a
   * log number for each that changed anything, in the units' order; then every touched node
   * stamped and every change set logged, one statement each, as SQLite stamps in process: a
   * cluster of 5,000 nodes is one UPDATE, not 5,000 round trips. `last` is the last log
   * number, null when nothing changed.
   */
  async #seal<T>(
    tx: TxSql,
    ran: ReadonlyArray<Ran<T>>,
  ): Promise<{ committed: Array<Committed<T>>; last: number | null }> {
    const logged = ran.filter((r) => !r.changes.isEmpty);
    if (logged.length === 0)
      return { committed: ran.map((r) => ({ result: r.result, changes: r.changes.build(null) })), last: null };
    const bumps = logged.filter((r) => r.changes.needsGeneration).length;
    const [head] = (await tx.unsafe(HEADS_SQL, [bumps, logged.length], { prepare: true })) as unknown as Array<{
      value: number;
      changes: number;
    }>;
    let gen = head!.value - bumps;
    let seq = head!.changes - logged.length;
    /** Node → its new generation (a later unit's, when two touched it: the higher). */
    const stamps = new Map<string, number>();
    const log: { seqs: number[]; gens: Array<number | null>; bodies: string[] } = { seqs: [], gens: [], bodies: [] };
    const committed = ran.map((r): Committed<T> => {
      if (r.changes.isEmpty) return { result: r.result, changes: r.changes.build(null) };
      const g = r.changes.needsGeneration ? ++gen : null;
      if (g !== null) for (const node of r.changes.nodesToStamp()) stamps.set(node, g);
      const built = r.changes.build(g);
      log.seqs.push(++seq);
      log.gens.push(g);
      log.bodies.push(JSON.stringify(built));
      return { result: r.result, changes: built };
    });
    if (stamps.size > 0)
      await tx.unsafe(STAMP_SQL, [[...stamps.keys()], [...stamps.values()]] as never[], { prepare: true });
    await tx.unsafe(LOG_SQL, [log.seqs, log.gens, log.bodies, this.#controller] as never[], { prepare: true });
    return { committed, last: seq };
  }

  /** Only the nodes this controller owns now, at the epoch it holds; others' owners record theirs. */
  async recordAcked(acks: ReadonlyMap<string, number>): Promise<void> {
    const ids: string[] = [];
    const gens: number[] = [];
    const epochs: number[] = [];
    const fence = this.#ackFence;
    this.#assertWritable();
    if (fence === null) {
      await this.#db(() =>
        this.#sql.unsafe(
          `UPDATE nodes n SET acked_generation = v.g FROM unnest($1::text[], $2::bigint[]) AS v(id, g)
           WHERE n.id = v.id AND (n.acked_generation IS NULL OR n.acked_generation < v.g)`,
          [[...acks.keys()], [...acks.values()]] as never[],
        ),
      );
      return;
    }
    for (const [node, gen] of acks) {
      const epoch = fence(node);
      if (epoch === undefined) continue;
      ids.push(node);
      gens.push(gen);
      epochs.push(epoch);
    }
    if (ids.length === 0) return;
    await this.#db(() =>
      this.#sql.unsafe(
        `UPDATE nodes n SET acked_generation = v.g
         FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(id, g, e), node_owners o
         WHERE n.id = v.id AND o.node_id = v.id AND o.controller = $4 AND o.epoch = v.e
           AND (n.acked_generation IS NULL OR n.acked_generation < v.g)`,
        [ids, gens, epochs, this.#controller] as never[],
      ),
    );
  }

  appendOutput(chunk: OutputChunkRecord): Promise<{ duplicate: boolean }> {
    return this.#retrying(
      () =>
        this.#sql.begin((tx) =>
          new SqlOutputRows(bind(tx, this.#texts)).append(chunk, new Date(this.#now()).toISOString()),
        ) as Promise<{ duplicate: boolean }>,
    );
  }

  // ---- enrolment (controller/store/pg/enrollment.ts) --------------------------------------------------------

  #iso(): string {
    return new Date(this.#now()).toISOString();
  }

  /** An enrolment change in one transaction, with its audit rows appended to the chain in it. */
  #tx<T>(fn: (tx: TxSql, audit: AppendAudit) => Promise<T>): Promise<T> {
    return this.#retrying(
      () =>
        this.#sql.begin((tx) => {
          const chain = new AuditWriter(bind(tx, this.#texts), this.#controller);
          return fn(tx, async (e) => {
            await chain.append([e]);
          });
        }) as Promise<T>,
    );
  }

  createEnrollmentToken(t: NewEnrollmentToken, who: string): Promise<EnrollmentTokenRecord> {
    return this.#tx((tx, audit) => pgEnrollment.create(tx, audit, t, who, this.#iso()));
  }

  listEnrollmentTokens(): Promise<EnrollmentTokenRecord[]> {
    return this.#db(() => pgEnrollment.list(this.#sql));
  }

  revokeEnrollmentToken(id: string, who: string): Promise<EnrollmentTokenRecord> {
    return this.#tx(async (tx, audit) => {
      const r = await pgEnrollment.revoke(tx, audit, id, who, this.#iso());
      if (!r) throw new HeraldError('not_found', `no enrollment token ${id}`);
      return r;
    });
  }

  consumeEnrollmentToken(tokenHash: string, node: string, usedBy: string): Promise<ConsumeResult> {
    return this.#tx((tx, audit) => pgEnrollment.consume(tx, audit, tokenHash, node, usedBy, this.#iso()));
  }

  getNodeCertificate(node: string): Promise<NodeCertificateRecord | undefined> {
    return this.#db(() => pgEnrollment.certificate(this.#sql, node));
  }

  noteNodeCertificate(node: string, c: SeenCertificate, who: string): Promise<void> {
    return this.#tx((tx, audit) => pgEnrollment.noteCertificate(tx, audit, node, c, who, this.#iso()));
  }

  async noteRenewalFailure(node: string, code: string, reported: number): Promise<void> {
    this.#assertWritable();
    return this.#db(() => pgEnrollment.noteRenewalFailure(this.#sql, node, code, reported, this.#iso()));
  }

  listIdentityFloors(): Promise<IdentityFloorRecord[]> {
    return this.#db(() => pgEnrollment.floors(this.#sql));
  }

  raiseIdentityFloor(
    node: string,
    notBefore: string,
    renewed: { serial: string; notBefore: string } | null,
    reason: FloorReason,
    who: string,
  ): Promise<void> {
    return this.#tx((tx, audit) =>
      pgEnrollment.raiseFloor(tx, audit, node, notBefore, renewed, reason, who, this.#iso()),
    );
  }

  retireSupersededCertificates(node: string, serial: string): Promise<boolean> {
    return this.#db(() => pgEnrollment.retireSuperseded(this.#sql, node, serial, this.#iso()));
  }

  // ---- the change log (controller/fleet/change-feed.ts reads it) ------------------------------------------

  /** Logged change sets after `afterSeq`, oldest first, at most `limit`. */
  async changesAfter(afterSeq: number, limit: number): Promise<LoggedChange[]> {
    const rows = (await this.#db(() =>
      this.#sql.unsafe('SELECT seq, origin, body FROM change_log WHERE seq > $1 ORDER BY seq LIMIT $2', [
        afterSeq,
        limit,
      ]),
    )) as unknown as Array<{ seq: number; origin: string; body: string }>;
    return rows.map((r) => ({ seq: r.seq, origin: r.origin, changes: JSON.parse(r.body) as ChangeSet }));
  }

  /** The newest logged number (0 when none), and the oldest still kept (null when none). */
  async changeHead(): Promise<{ last: number; oldest: number | null }> {
    const [r] = (await this.#db(() =>
      this.#sql.unsafe(
        `SELECT (SELECT changes FROM sequence WHERE name = 'generation') AS last, (SELECT MIN(seq) FROM change_log) AS oldest`,
      ),
    )) as unknown as Array<{ last: number; oldest: number | null }>;
    return { last: r!.last, oldest: r!.oldest };
  }

  /** Deletes log entries older than CHANGE_LOG_RETENTION_S (any controller may; it is idempotent). */
  async pruneChanges(): Promise<number> {
    const r = await this.#db(() =>
      this.#sql.unsafe(`DELETE FROM change_log WHERE at < now() - make_interval(secs => $1)`, [CHANGE_LOG_RETENTION_S]),
    );
    return r.count;
  }

  /**
   * `LISTEN herald_changes` on a connection of its own: `onNotify` per notification,
   * `onListen` after every (re)connect (notifications sent meanwhile are lost: re-read then).
   */
  async listen(onNotify: (payload: string) => void, onListen: () => void): Promise<{ unlisten(): Promise<void> }> {
    // (a connection of its own, beside the pool: not through the gate)
    const r = await this.#mapped(() => this.#sql.listen(CHANGE_CHANNEL, onNotify, onListen));
    return { unlisten: () => r.unlisten() };
  }

  /**
   * A fetch's read in one statement (PG_METADATA_SQL): the node's row and, unless `known` has
   * its generation, its deployments with their clusters' node groups' configs as JSON, in one
   * snapshot; configs come from the cache (they never change: a config is read once per
   * controller). Without it a fetch was a node read then a read-only transaction of four more
   * statements, each a round trip (BENCHMARKS.md, "Several controllers").
   */
  override metadataSource(node: string, known: KnownGenerations = []): Promise<MetadataRead | undefined> {
    return this.#db(async () => {
      const [row] = (await this.#sql
        .unsafe(PG_METADATA_SQL, [node, known === 'all', known === 'all' ? [] : [...known]] as never[], {
          prepare: true,
        })
        .values()) as unknown as unknown[][];
      if (row === undefined) return undefined;
      const n = nodeOfValues(row);
      const deployments = row[METADATA_DEPLOYMENTS_AT] as unknown[][] | null;
      if (deployments === null) return { node: n, source: null };
      return {
        node: n,
        source: await this.#rows.metadataOf(
          n,
          deployments,
          (_, v) => (v[METADATA_GROUP_CONFIGS_AT] ?? []) as GroupConfigs,
        ),
      };
    });
  }

  protected read<T>(fn: (rows: SqlRows, output: SqlOutputRows) => Promise<T>, snapshot = false): Promise<T> {
    if (!snapshot) return this.#db(() => fn(this.#rows, this.#output));
    return this.#snapshot((rows) => fn(rows, this.#output));
  }

  /** Waits for the transactions in flight, then closes the pool (queries still running get 5 s). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.allSettled([...this.#open]);
    await Promise.all([this.#sql.end({ timeout: 5 }), this.#control.end({ timeout: 5 })]);
  }
}

/** The URL without its password, for logs and errors. */
export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return 'postgres://…';
  }
}
