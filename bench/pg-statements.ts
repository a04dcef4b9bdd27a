/**
 * What the controllers asked PostgreSQL, statement by statement: `pg_stat_statements` (loaded by
 * bench/pg.ts when its library is there) read before and after a window, per statement text. A
 * statement here is one round trip a controller waited for: `BEGIN`, `COMMIT` and `SAVEPOINT` count
 * (the extension tracks utility statements by default). PostgreSQL 15's extension records a
 * `commit` once however many there were (seen here: six transactions, one `commit` call), so the
 * commits are counted as the transactions begun: one `COMMIT` (or `ROLLBACK`) per `BEGIN`.
 */
import type postgres from 'postgres';

/** Calls per normalised statement text, in the current database. */
export type StatementCounts = Map<string, number>;

/** One statement's calls over a window, less the background, per node changed. */
export interface StatementShare {
  /** The statement as pg_stat_statements normalises it, cut to STATEMENT_TEXT_CHARS. */
  query: string;
  perNode: number;
}

/** The statements' figures of one window. */
export interface StatementFigures {
  /** Every statement, less the background, per node changed. */
  perNode: number;
  /** The statements that made it, most first (those of at least 0.01 per node). */
  top: StatementShare[];
}

const STATEMENT_TEXT_CHARS = 120;

/** Makes the extension's view readable in this database; false when the server did not load it. */
export async function enableStatements(sql: postgres.Sql): Promise<boolean> {
  try {
    await sql.unsafe('CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    await sql.unsafe('SELECT 1 FROM pg_stat_statements LIMIT 1');
    return true;
  } catch {
    return false;
  }
}

/** Every statement's calls so far in this database (the benchmark's own reads of the statistics left out). */
export async function statementCounts(sql: postgres.Sql): Promise<StatementCounts> {
  const here = 'dbid = (SELECT oid FROM pg_database WHERE datname = current_database())';
  const notOurs = `query NOT LIKE '%pg_stat_%' AND query NOT LIKE '%pg_current_snapshot%'`;
  const rows = (await sql.unsafe(
    `SELECT query, SUM(calls)::bigint AS calls FROM pg_stat_statements WHERE ${here} AND ${notOurs} GROUP BY query`,
  )) as unknown as Array<{ query: string; calls: number | string }>;
  const out: StatementCounts = new Map();
  let begun = 0;
  for (const r of rows) {
    const q = oneLine(r.query);
    if (/^(commit|rollback|end)$/i.test(q)) continue;
    if (/^(begin|start transaction)\b/i.test(q)) begun += Number(r.calls);
    out.set(q, Number(r.calls));
  }
  if (begun > 0) out.set('commit (one per begin)', begun);
  return out;
}

/** b − a, per statement. */
export function statementDelta(a: StatementCounts, b: StatementCounts): StatementCounts {
  const d = new Map<string, number>();
  for (const [q, calls] of b) {
    const n = calls - (a.get(q) ?? 0);
    if (n > 0) d.set(q, n);
  }
  return d;
}

/**
 * A window's statements per node changed: each statement's calls less its background rate
 * (`background`, calls over `backgroundMs` of an idle window) times the window, over `n` nodes.
 */
export function statementFigures(
  window: StatementCounts,
  windowMs: number,
  background: StatementCounts,
  backgroundMs: number,
  n: number,
): StatementFigures {
  const shares: StatementShare[] = [];
  let total = 0;
  for (const [query, calls] of window) {
    const net = Math.max(0, calls - ((background.get(query) ?? 0) * windowMs) / Math.max(1, backgroundMs));
    total += net;
    const perNode = net / n;
    if (perNode >= 0.01) shares.push({ query: query.slice(0, STATEMENT_TEXT_CHARS), perNode: round2(perNode) });
  }
  shares.sort((x, y) => y.perNode - x.perNode);
  return { perNode: round2(total / n), top: shares };
}

function oneLine(q: string): string {
  return q.replace(/\s+/g, ' ').trim();
}

function round2(x: number): number {
  return Math.round(x * 100) / 100;
}
