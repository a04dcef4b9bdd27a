/**
 * The audit trail read straight from a database, for `herald audit verify --db` (docs/access.md,
 * "Audit trail"): the verifier trusts neither a controller nor its API, only the rows and the
 * controllers' public keys. Read only, in one snapshot (SQLite: a read transaction on a read-only
 * connection; PostgreSQL: REPEATABLE READ READ ONLY), and without migrating anything: a database
 * no Herald with the chain has opened is refused.
 */
import type { AuditChainRow } from '../../protocol/audit-chain.js';
import { ConfigError } from '../../protocol/errors.js';
import { chainRowOf, type ChainHead } from './audit-chain.js';
import { redact } from './pg/store.js';
import { SQL } from './statements.js';

/** A snapshot of one database's trail. */
export interface AuditSource {
  /** The head the controllers recorded. */
  head(): Promise<ChainHead>;
  /** Up to `limit` rows after `afterSeq`, oldest first. */
  rows(afterSeq: number, limit: number): Promise<AuditChainRow[]>;
  close(): Promise<void>;
}

/**
 * Opens `db` (`postgres://…`, else a SQLite file, `sqlite:<path>` too) for reading the trail.
 * @throws ConfigError `db_in_use` (a running controller holds the SQLite file), `bad_option`
 *   (cannot be opened, or has no audit chain yet)
 */
export async function openAuditSource(db: string): Promise<AuditSource> {
  return /^postgres(ql)?:\/\//.test(db) ? openPg(db) : openSqlite(db.startsWith('sqlite:') ? db.slice(7) : db);
}

const numbered = (sql: string): string => {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
};

async function openSqlite(file: string): Promise<AuditSource> {
  const { default: Database } = await import('better-sqlite3');
  let db: import('better-sqlite3').Database;
  try {
    // no wait: a running controller holds its file for good
    db = new Database(file, { readonly: true, fileMustExist: true, timeout: 0 });
  } catch (err) {
    throw new ConfigError(`--db ${file}: cannot open the database: ${(err as Error).message}`, {
      cause: err,
      field: 'db',
    });
  }
  try {
    db.exec('BEGIN');
    const head = db.prepare(SQL.auditHeadGet);
    const page = db.prepare(SQL.auditPage);
    const h = head.get() as ChainHead | undefined;
    return {
      head: () => Promise.resolve(h === undefined ? noChain(file) : { seq: Number(h.seq), hash: h.hash }),
      rows: (afterSeq, limit) =>
        Promise.resolve((page.all(afterSeq, limit) as Array<Record<string, unknown>>).map(chainRowOf)),
      close: () => {
        if (db.inTransaction) db.exec('COMMIT');
        db.close();
        return Promise.resolve();
      },
    };
  } catch (err) {
    db.close();
    if ((err as { code?: string }).code === 'SQLITE_BUSY')
      throw new ConfigError(
        `--db ${file}: a controller has this database open; stop it, or verify an export (herald audit export, then --file)`,
        { cause: err, field: 'db', code: 'db_in_use' },
      );
    if (/no such table: audit_head/.test((err as Error).message)) noChain(file);
    throw new ConfigError(`--db ${file}: ${(err as Error).message}`, { cause: err, field: 'db' });
  }
}

async function openPg(url: string): Promise<AuditSource> {
  const { default: postgres } = await import('postgres');
  const sql = postgres(url, {
    max: 1,
    onnotice: () => {},
    types: { bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) } },
  }) as unknown as import('postgres').Sql<Record<string, never>>;
  let conn: import('postgres').ReservedSql<Record<string, never>> | undefined;
  try {
    conn = await sql.reserve();
    await conn.unsafe('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    const [h] = (await conn.unsafe(SQL.auditHeadGet)) as unknown as ChainHead[];
    const c = conn;
    const page = numbered(SQL.auditPage);
    return {
      head: () => Promise.resolve(h === undefined ? noChain(redact(url)) : { seq: Number(h.seq), hash: h.hash }),
      rows: async (afterSeq, limit) =>
        ([...(await c.unsafe(page, [afterSeq, limit]))] as Array<Record<string, unknown>>).map(chainRowOf),
      close: async () => {
        await c.unsafe('COMMIT').catch(() => {});
        c.release();
        await sql.end({ timeout: 1 });
      },
    };
  } catch (err) {
    conn?.release();
    await sql.end({ timeout: 1 });
    if ((err as { code?: string }).code === '42P01') noChain(redact(url));
    throw new ConfigError(`--db ${redact(url)}: ${(err as Error).message}`, { cause: err, field: 'db' });
  }
}

function noChain(db: string): never {
  throw new ConfigError(
    `--db ${db}: this database has no audit chain yet: start a controller of this version on it once`,
    { field: 'db' },
  );
}
