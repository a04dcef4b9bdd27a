/**
 * The audit trail's rows in the store (docs/access.md, "Audit trail"): appending to the hash chain
 * inside a transaction, and reading it back in seq order. Every append takes the chain head's
 * row lock first (`audit_head`, `FOR UPDATE`; SQLite's one writer is that lock already), so the
 * rows of several controllers on one PostgreSQL are numbered and chained in commit order, one
 * line; the transaction holds it to its commit. A transaction's rows are written at its end
 * (SqlTx buffers them), right before the generation's own lock: each append costs one statement
 * more than an unchained insert (the head's update), and two locks are always taken in one
 * order. The hashing is protocol/audit-chain.ts's.
 */
import { AUDIT_GENESIS_HASH, AUDIT_OK, nextAuditRow, type AuditChainRow } from '../../protocol/audit-chain.js';
import type { Statements } from './statements.js';

/** A change to record; `who` is a SPIFFE id. */
export interface AuditEntry {
  at: string;
  who: string;
  action: string;
  target: string;
  /** An object, or its JSON text already made (a request's, masked as it was written). */
  detail: Record<string, unknown> | string | null;
  /** `ok` (the default), or the code the change was refused with. */
  outcome?: string;
}

/** The newest row of the chain (seq 0 and the genesis hash before the first). */
export interface ChainHead {
  seq: number;
  hash: string;
}

/** The detail as the chain stores it; it is hashed as this very text, so any JSON text will do. */
export function detailText(detail: Record<string, unknown> | string | null): string | null {
  return detail === null ? null : typeof detail === 'string' ? detail : JSON.stringify(detail);
}

/**
 * Appends to the chain in one transaction (or one savepoint of a group commit). The head is read
 * under its lock at the first append and kept after; `mark`/`reset` bring it back when a
 * savepoint that appended is rolled back.
 */
export class AuditWriter {
  readonly #s: Statements;
  readonly #controller: string;
  #head: ChainHead | undefined;

  constructor(s: Statements, controller: string) {
    this.#s = s;
    this.#controller = controller;
  }

  /** The head as this transaction holds it, locking it first. */
  async head(): Promise<ChainHead> {
    this.#head ??= headOf(await this.#s.auditHeadLock.get());
    return this.#head;
  }

  /** What a savepoint may have to return to. */
  mark(): ChainHead | undefined {
    return this.#head;
  }

  /** The savepoint that appended since `mark` was rolled back. */
  reset(to: ChainHead | undefined): void {
    this.#head = to;
  }

  /** Appends `entries` in order; resolves with the new head. */
  async append(entries: readonly AuditEntry[]): Promise<ChainHead> {
    let head = await this.head();
    if (entries.length === 0) return head;
    for (const e of entries) {
      const row = this.#row(head, e);
      await this.#s.auditAppend.run(...rowValues(row));
      head = { seq: row.seq, hash: row.hash };
    }
    await this.#s.auditHeadSet.run(head.seq, head.hash);
    this.#head = head;
    return head;
  }

  /**
   * Appends at once, for SQLite's synchronous transactions (its enrolment rows): better-sqlite3's
   * statements answer without a promise.
   */
  appendNow(e: AuditEntry): void {
    const head = this.#head ?? headOf(this.#s.auditHeadLock.get());
    const row = this.#row(head, e);
    this.#s.auditAppend.run(...rowValues(row));
    this.#s.auditHeadSet.run(row.seq, row.hash);
    this.#head = { seq: row.seq, hash: row.hash };
  }

  /** The row at `seq`, if any. */
  async row(seq: number): Promise<AuditChainRow | undefined> {
    const r = (await this.#s.auditRow.get(seq)) as Record<string, unknown> | undefined;
    return r === undefined ? undefined : chainRowOf(r);
  }

  /** Deletes the rows through `seq` (pruning, under the head's lock); resolves with how many. */
  async deleteThrough(seq: number): Promise<number> {
    await this.head();
    return (await this.#s.auditDeleteThrough.run(seq)).changes;
  }

  /** Up to `limit` rows after `afterSeq`, oldest first, as this transaction sees them. */
  async page(afterSeq: number, limit: number): Promise<AuditChainRow[]> {
    return ((await this.#s.auditPage.all(afterSeq, limit)) as Array<Record<string, unknown>>).map(chainRowOf);
  }

  /** The first row after `seq`, if any. */
  async firstAfter(seq: number): Promise<AuditChainRow | undefined> {
    const [r] = (await this.#s.auditPage.all(seq, 1)) as Array<Record<string, unknown>>;
    return r === undefined ? undefined : chainRowOf(r);
  }

  #row(head: ChainHead, e: AuditEntry): AuditChainRow {
    return nextAuditRow(head, {
      at: e.at,
      who: e.who,
      action: e.action,
      target: e.target,
      detail: detailText(e.detail),
      outcome: e.outcome ?? AUDIT_OK,
      controller: this.#controller,
    });
  }
}

function headOf(row: unknown): ChainHead {
  const r = row as { seq: number; hash: string } | undefined;
  // the migration writes the head row; a database without it was not migrated by this Herald
  if (r === undefined) return { seq: 0, hash: AUDIT_GENESIS_HASH };
  return { seq: Number(r.seq), hash: r.hash };
}

/** The row's values in the order of `auditAppend`. */
export function rowValues(r: AuditChainRow): unknown[] {
  return [r.seq, r.at, r.who, r.action, r.target, r.detail, r.outcome, r.controller, r.prev_hash, r.hash];
}

/** A row as the database returns it (PostgreSQL's BIGINT already a number). */
export function chainRowOf(r: Record<string, unknown>): AuditChainRow {
  return {
    seq: Number(r.seq),
    at: String(r.at),
    who: String(r.who),
    action: String(r.action),
    target: String(r.target),
    detail: r.detail === null || r.detail === undefined ? null : String(r.detail),
    outcome: r.outcome === null || r.outcome === undefined ? AUDIT_OK : String(r.outcome),
    controller: r.controller === null || r.controller === undefined ? null : String(r.controller),
    prev_hash: String(r.prev_hash ?? ''),
    hash: String(r.hash ?? ''),
  };
}

/**
 * Chains rows written before the chain was (the migration's step, on either store): `page`, rows
 * without a hash in seq order, each after `head` with outcome `ok`. Each keeps the seq it has
 * (numbers may skip: an identity column skips one on a rollback). Resolves with the rows to
 * write back (their outcome, prev_hash and hash) and the new head.
 */
export function chainExisting(
  head: ChainHead,
  page: ReadonlyArray<Record<string, unknown>>,
): { rows: AuditChainRow[]; head: ChainHead } {
  const rows: AuditChainRow[] = [];
  let h = head;
  for (const raw of page) {
    const r = chainRowOf(raw);
    const next = nextAuditRow({ seq: r.seq - 1, hash: h.hash }, r);
    rows.push(next);
    h = { seq: next.seq, hash: next.hash };
  }
  return { rows, head: h };
}

/** The migration's SQL for both stores: the head row (the genesis until the existing rows are chained). */
export const AUDIT_HEAD_INSERT_SQL = `INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '${AUDIT_GENESIS_HASH}') ON CONFLICT (id) DO NOTHING`;
/** The last row the chain already covers (none before the first migration to it). */
export const AUDIT_LAST_HASHED_SQL = 'SELECT seq, hash FROM audit WHERE hash IS NOT NULL ORDER BY seq DESC LIMIT 1';
/** Rows still without a hash, after a seq, in order, a page at a time (the `?`s: after, limit). */
export const AUDIT_UNHASHED_SQL =
  'SELECT seq, at, who, action, target, detail, controller FROM audit WHERE hash IS NULL AND seq > ? ORDER BY seq LIMIT ?';
/** One chained row written back (the `?`s: outcome, prev_hash, hash, seq). */
export const AUDIT_CHAINED_SQL = 'UPDATE audit SET outcome = ?, prev_hash = ?, hash = ? WHERE seq = ?';
