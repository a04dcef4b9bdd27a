/**
 * SQLite's tables for live output (docs/api.md; migration 4); the rows are read and written by
 * controller/store/output.ts. Durable like the rest of the store: a controller started again serves what
 * it kept.
 */

/**
 * Migration 4's SQL (listed in controller/store/sqlite/schema.ts MIGRATIONS); idempotent, so a database whose
 * version record was lost migrates again cleanly.
 */
export const OUTPUT_MIGRATION_SQL = `
  CREATE TABLE IF NOT EXISTS deployment_output (
    deployment_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    stream TEXT NOT NULL,
    text TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    dropped_bytes INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    PRIMARY KEY (deployment_id, revision, seq)
  ) STRICT;
  CREATE TABLE IF NOT EXISTS deployment_output_cut (
    deployment_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    stream TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (deployment_id, revision, stream)
  ) STRICT;
  -- a removed deployment's output goes with it, whichever code path removes the row
  CREATE TRIGGER IF NOT EXISTS deployment_output_removed AFTER DELETE ON deployments BEGIN
    DELETE FROM deployment_output WHERE deployment_id = OLD.id;
    DELETE FROM deployment_output_cut WHERE deployment_id = OLD.id;
  END;
`;
