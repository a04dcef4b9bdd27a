/**
 * `Store` on SQLite (better-sqlite3): WAL with `synchronous=FULL`, so a change the API has
 * acknowledged survives a crash or power loss; schema migrations versioned in code
 * (controller/store/sqlite/schema.ts); statements prepared once.
 *
 * better-sqlite3 has one connection, and a transaction's callback is async, so the store runs
 * one transaction at a time under a lock: BEGIN IMMEDIATE, the callback, COMMIT. Reads outside
 * a transaction take the lock too (the shared rows of controller/store/tx.ts await between statements), so
 * none sees another's uncommitted writes.
 */
import { closeSync, constants, existsSync, mkdirSync, openSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { ConfigError, HeraldError } from '../../../protocol/errors.js';
import { SQLITE_BUSY_TIMEOUT_MS, SQLITE_PAGE_CACHE_BYTES } from '../../../protocol/limits.js';
import { ChangeSetBuilder } from '../../model/change-set.js';
import { SqlStoreBase } from '../base.js';
import { MIGRATIONS, prepareStatements, SCHEMA_VERSION } from './schema.js';
import { SqlOutputRows, type OutputChunkRecord } from '../output.js';
import type { Statements } from '../statements.js';
import { SqlRows, SqlTx } from '../tx.js';
import { AuditWriter } from '../audit-chain.js';
import { SqliteEnrollmentRows } from './enrollment.js';
import type {
  ConsumeResult,
  EnrollmentTokenRecord,
  FloorReason,
  IdentityFloorRecord,
  NewEnrollmentToken,
  NodeCertificateRecord,
  SeenCertificate,
} from '../enrollment-records.js';
import type { Committed, Store, TxFn, UnitOutcome } from '../store.js';

export { SCHEMA_VERSION } from './schema.js';

export interface SqliteStoreOptions {
  /** Clock for timestamps (epoch ms). Default Date.now. */
  now?: () => number;
  /** This controller's name, written with each audit row (default `controller`). */
  controller?: string;
}

export class SqliteStore extends SqlStoreBase implements Store {
  readonly #db: Database.Database;
  readonly #s: Statements;
  readonly #rows: SqlRows;
  /** The rows a transaction reads through (they never fill the config cache). */
  readonly #txRows: SqlRows;
  readonly #output: SqlOutputRows;
  readonly #enrollment: SqliteEnrollmentRows;
  readonly #now: () => number;
  readonly #controller: string;
  /** A transaction (or a read waiting behind one) holds the connection. */
  #busy = false;
  readonly #waiting: Array<() => void> = [];
  #closed = false;

  /**
   * Opens (creating if needed, 0600) the database at `path` (`:memory:` for tests) and migrates it.
   * @throws ConfigError `bad_option` when the file cannot be opened or was written by a newer
   *   Herald (unknown schema version)
   */
  constructor(path: string, opts: SqliteStoreOptions = {}) {
    super();
    const o = { now: Date.now, controller: 'controller', ...opts };
    this.#now = o.now;
    this.#controller = o.controller;
    try {
      if (path !== ':memory:' && path !== '') createPrivateFile(path);
      this.#db = new Database(path);
    } catch (err) {
      throw new ConfigError(`--db ${path}: cannot open the database: ${(err as Error).message}`, { cause: err });
    }
    try {
      this.#claim(path);
      this.#db.pragma('synchronous = FULL');
      this.#db.pragma('foreign_keys = OFF');
      this.#db.pragma(`busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`);
      // a bound of our own: better-sqlite3 builds SQLite with a 16 MiB page cache, which a
      // controller fills as its database grows (the soak's C heap grew ~30 MB over 23,000 changes
      // before it levelled off, `npm run bench -- --soak`)
      this.#db.pragma(`cache_size = -${SQLITE_PAGE_CACHE_BYTES / 1024}`);
      this.#migrate(path, o.now);
      this.#s = prepareStatements(this.#db);
      this.#rows = new SqlRows(this.#s, o.now);
      this.#txRows = new SqlRows(this.#s, o.now, this.#rows.configCache, { inTransaction: true });
      this.#output = new SqlOutputRows(this.#s);
      const s = this.#s;
      this.#enrollment = new SqliteEnrollmentRows(this.#db, (e) => new AuditWriter(s, o.controller).appendNow(e));
    } catch (err) {
      this.#db.close();
      throw err;
    }
  }

  /**
   * One controller per database file (docs/several-controllers.md): the connection takes SQLite's lock for good
   * (`locking_mode = EXCLUSIVE`, then a write transaction), so a second controller on the same
   * file is refused at once instead of waiting on it. Several controllers share PostgreSQL.
   * @throws ConfigError `db_in_use`
   */
  #claim(path: string): void {
    try {
      this.#db.pragma('locking_mode = EXCLUSIVE');
      this.#db.pragma('busy_timeout = 0');
      this.#db.pragma('journal_mode = WAL');
      this.#db.exec('BEGIN IMMEDIATE');
      this.#db.exec('COMMIT');
    } catch (err) {
      if ((err as { code?: string }).code === 'SQLITE_BUSY')
        throw new ConfigError(
          `--db ${path}: another controller has this database open; several controllers share a PostgreSQL database (--db postgres://...)`,
          { cause: err, field: 'db', code: 'db_in_use' },
        );
      throw err;
    }
  }

  #migrate(path: string, now: () => number): void {
    this.#db.exec(
      'CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT',
    );
    const row = this.#db.prepare('SELECT MAX(version) AS v FROM schema_migrations').get() as { v: number | null };
    const current = row.v ?? 0;
    if (current > SCHEMA_VERSION) {
      throw new ConfigError(
        `--db ${path}: schema version ${current} is newer than this Herald knows (${SCHEMA_VERSION}); use a newer Herald`,
      );
    }
    for (const m of MIGRATIONS) {
      if (m.version <= current) continue;
      this.#db.transaction(() => {
        this.#db.exec(m.sql);
        for (const c of m.columns ?? []) {
          const have = this.#db.prepare(`PRAGMA table_info(${c.table})`).all() as Array<{ name: string }>;
          if (!have.some((x) => x.name === c.column))
            this.#db.exec(`ALTER TABLE ${c.table} ADD COLUMN ${c.column} ${c.decl}`);
        }
        m.run?.(this.#db);
        this.#db
          .prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)')
          .run(m.version, m.name, new Date(now()).toISOString());
      })();
    }
  }

  // ---- the lock ----------------------------------------------------------------------------

  /** Runs `fn` holding the connection; waits (first come, first served) while another holds it. */
  async #exclusive<T>(fn: () => T | Promise<T>): Promise<T> {
    if (this.#busy) await new Promise<void>((resolve) => this.#waiting.push(resolve));
    else this.#busy = true;
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next)
        next(); // handed over: still busy
      else this.#busy = false;
    }
  }

  /** A read outside a transaction: in turn with the transactions, so it sees only committed rows. */
  #read<T>(fn: () => T | Promise<T>): Promise<T> {
    return this.#exclusive(() => {
      this.#assertOpen();
      return fn();
    });
  }

  #assertOpen(): void {
    if (this.#closed) throw new HeraldError('internal', 'the store is closed');
  }

  // ---- transactions ------------------------------------------------------------------------

  transaction<T>(fn: TxFn<T>): Promise<Committed<T>> {
    return this.#exclusive(async () => {
      this.#assertOpen();
      this.#db.exec('BEGIN IMMEDIATE');
      try {
        const out = await this.#unit(fn, new AuditWriter(this.#s, this.#controller));
        this.#db.exec('COMMIT');
        return out;
      } catch (err) {
        if (this.#db.inTransaction) this.#db.exec('ROLLBACK');
        throw err;
      }
    });
  }

  group<T>(units: ReadonlyArray<TxFn<T>>): Promise<Array<UnitOutcome<T>>> {
    return this.#exclusive(async () => {
      this.#assertOpen();
      const outcomes: Array<UnitOutcome<T>> = [];
      const chain = new AuditWriter(this.#s, this.#controller);
      this.#db.exec('BEGIN IMMEDIATE');
      try {
        for (const fn of units) {
          const mark = chain.mark();
          this.#db.exec('SAVEPOINT unit');
          try {
            const value = await this.#unit(fn, chain);
            this.#db.exec('RELEASE unit');
            outcomes.push({ ok: true, value });
          } catch (error) {
            this.#db.exec('ROLLBACK TO unit');
            this.#db.exec('RELEASE unit');
            chain.reset(mark);
            outcomes.push({ ok: false, error });
          }
        }
        this.#db.exec('COMMIT');
      } catch (err) {
        if (this.#db.inTransaction) this.#db.exec('ROLLBACK');
        throw err;
      }
      return outcomes;
    });
  }

  /** Runs one unit of work, then gives the nodes it touched one new generation. */
  async #unit<T>(fn: TxFn<T>, chain: AuditWriter): Promise<Committed<T>> {
    const changes = new ChangeSetBuilder();
    const tx = new SqlTx(this.#txRows, changes, chain);
    let result: T;
    try {
      result = await fn(tx);
      await tx.flushAudit();
    } finally {
      tx.end();
    }
    let gen: number | null = null;
    if (changes.needsGeneration) {
      gen = (this.#s.seqBump.get() as { value: number }).value;
      for (const node of changes.nodesToStamp()) this.#s.nodeSetGen.run(gen, node);
    }
    return { result, changes: changes.build(gen) };
  }

  recordAcked(acks: ReadonlyMap<string, number>): Promise<void> {
    if (acks.size === 0) return Promise.resolve();
    return this.#exclusive(() => {
      this.#assertOpen();
      this.#db.transaction(() => {
        for (const [node, gen] of acks) this.#s.nodeAck.run(gen, node, gen);
      })();
    });
  }

  protected read<T>(fn: (rows: SqlRows, output: SqlOutputRows) => Promise<T>): Promise<T> {
    return this.#read(() => fn(this.#rows, this.#output));
  }

  appendOutput(chunk: OutputChunkRecord): Promise<{ duplicate: boolean }> {
    return this.#exclusive(async () => {
      this.#assertOpen();
      this.#db.exec('BEGIN IMMEDIATE');
      try {
        const out = await this.#output.append(chunk, new Date(this.#now()).toISOString());
        this.#db.exec('COMMIT');
        return out;
      } catch (err) {
        if (this.#db.inTransaction) this.#db.exec('ROLLBACK');
        throw err;
      }
    });
  }

  // ---- enrolment (controller/store/sqlite/enrollment.ts) -----------------------------------------------------

  createEnrollmentToken(t: NewEnrollmentToken, who: string): Promise<EnrollmentTokenRecord> {
    return this.#write(() => this.#enrollment.create(t, who, this.#iso()));
  }

  listEnrollmentTokens(): Promise<EnrollmentTokenRecord[]> {
    return this.#read(() => this.#enrollment.list());
  }

  revokeEnrollmentToken(id: string, who: string): Promise<EnrollmentTokenRecord> {
    return this.#write(() => {
      const r = this.#enrollment.revoke(id, who, this.#iso());
      if (!r) throw new HeraldError('not_found', `no enrollment token ${id}`);
      return r;
    });
  }

  consumeEnrollmentToken(tokenHash: string, node: string, usedBy: string): Promise<ConsumeResult> {
    return this.#write(() => this.#enrollment.consume(tokenHash, node, usedBy, this.#iso()));
  }

  getNodeCertificate(node: string): Promise<NodeCertificateRecord | undefined> {
    return this.#read(() => this.#enrollment.certificate(node));
  }

  noteNodeCertificate(node: string, c: SeenCertificate, who: string): Promise<void> {
    return this.#write(() => this.#enrollment.noteCertificate(node, c, who, this.#iso()));
  }

  noteRenewalFailure(node: string, code: string, reported: number): Promise<void> {
    return this.#write(() => this.#enrollment.noteRenewalFailure(node, code, reported, this.#iso()));
  }

  listIdentityFloors(): Promise<IdentityFloorRecord[]> {
    return this.#read(() => this.#enrollment.floors());
  }

  raiseIdentityFloor(
    node: string,
    notBefore: string,
    renewed: { serial: string; notBefore: string } | null,
    reason: FloorReason,
    who: string,
  ): Promise<void> {
    return this.#write(() => this.#enrollment.raiseFloor(node, notBefore, renewed, reason, who, this.#iso()));
  }

  retireSupersededCertificates(node: string, serial: string): Promise<boolean> {
    return this.#write(() => this.#enrollment.retireSuperseded(node, serial, this.#iso()));
  }

  /** A change outside `transaction()` (no generation): in turn with every other transaction. */
  #write<T>(fn: () => T): Promise<T> {
    return this.#exclusive(() => {
      this.#assertOpen();
      return fn();
    });
  }

  #iso(): string {
    return new Date(this.#now()).toISOString();
  }

  /** Waits for the open transaction, then closes the database (a WAL checkpoint happens on close). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    await this.#exclusive(() => {
      if (this.#closed) return;
      this.#closed = true;
      this.#db.close();
    });
  }
}

/**
 * Creates the database file 0600 (its directory 0700 when Herald creates it) before SQLite
 * opens it: SQLite gives its `-wal` and `-shm` files the database file's mode, so all three
 * stay private (docs/api.md). An existing file is left as it is; `looseDatabaseFiles` reports it.
 */
function createPrivateFile(path: string): void {
  const dir = dirname(path);
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    closeSync(openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}

/** The database's files (`path`, `-wal`, `-shm`) that group or others may read or write, with their modes. */
export function looseDatabaseFiles(path: string): Array<{ file: string; mode: string }> {
  if (path === ':memory:' || path === '') return [];
  const loose: Array<{ file: string; mode: string }> = [];
  for (const file of [path, `${path}-wal`, `${path}-shm`]) {
    let mode: number;
    try {
      mode = statSync(file).mode & 0o777;
    } catch {
      continue;
    }
    if ((mode & 0o077) !== 0) loose.push({ file, mode: mode.toString(8).padStart(4, '0') });
  }
  return loose;
}
