/**
 * The tables of who may do what (docs/access.md), in each store's dialect: the grants (an
 * operator's name, a role, the scope's selectors as a JSON list) and each node's labels, which
 * grants may select nodes by. Both live in the database, so every controller of a PostgreSQL
 * database reads the same policy, on every request. A deleted node's labels go with it
 * (controller/store/tx.ts deleteNode). Harmless run again over its own result, as every migration is.
 */

const TABLES = (strict: string) => `
  CREATE TABLE IF NOT EXISTS access_grants (
    id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    role TEXT NOT NULL,
    scope TEXT NOT NULL,
    created_at TEXT NOT NULL,
    created_by TEXT NOT NULL
  )${strict};
  CREATE INDEX IF NOT EXISTS access_grants_by_subject ON access_grants (subject);
  CREATE TABLE IF NOT EXISTS node_labels (
    node TEXT PRIMARY KEY,
    labels TEXT NOT NULL
  )${strict};
`;

/** SQLite's migration 9 (controller/store/sqlite/schema.ts). */
export const SQLITE_ACCESS_MIGRATION_SQL = TABLES(' STRICT');

/** PostgreSQL's migration 7 (controller/store/pg/schema.ts): SQLite's migration 9. */
export const PG_ACCESS_MIGRATION_SQL = TABLES('');
