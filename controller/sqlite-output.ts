/**
 * Live output kept in SQLite (SPEC §8; table `deployment_output`, migration 4): each chunk an
 * agent posted, keyed by deployment, revision and sequence number, so a chunk sent twice is kept
 * once; per revision only the newest chunks holding OUTPUT_KEPT_PER_REVISION_BYTES stay (older
 * ones are deleted, and the bytes cut are counted per stream in `deployment_output_cut`); a
 * removed deployment's output is deleted with it (a trigger).
 * Durable like the rest of the store: a controller started again serves what it kept.
 */
import type Database from 'better-sqlite3';
import { OUTPUT_KEPT_PER_REVISION_BYTES } from '../protocol/limits.js';
import type { OutputStream } from '../protocol/output.js';

/**
 * Migration 4's SQL (listed in sqlite-schema.ts MIGRATIONS); idempotent, so a database whose
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

export interface OutputChunkRecord {
  deploymentId: string;
  revision: number;
  seq: number;
  stream: OutputStream;
  text: string;
  droppedBytes: number;
}

export interface KeptOutput {
  /** Oldest first. */
  chunks: OutputChunkRecord[];
  /** Bytes deleted to keep the limit, per stream. */
  cutBytes: Record<OutputStream, number>;
}

export class SqliteOutputRows {
  readonly #db: Database.Database;
  readonly #insert: Database.Statement;
  readonly #total: Database.Statement;
  readonly #oldest: Database.Statement;
  readonly #delete: Database.Statement;
  readonly #addCut: Database.Statement;
  readonly #chunks: Database.Statement;
  readonly #cuts: Database.Statement;
  readonly #last: Database.Statement;
  readonly #limitBytes: number;

  constructor(db: Database.Database, limitBytes = OUTPUT_KEPT_PER_REVISION_BYTES) {
    this.#db = db;
    this.#limitBytes = limitBytes;
    this.#insert = db.prepare(
      `INSERT INTO deployment_output (deployment_id, revision, seq, stream, text, bytes, dropped_bytes, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
    );
    this.#total = db.prepare(
      'SELECT COALESCE(SUM(bytes), 0) AS n FROM deployment_output WHERE deployment_id = ? AND revision = ?',
    );
    this.#oldest = db.prepare(
      'SELECT seq, stream, bytes FROM deployment_output WHERE deployment_id = ? AND revision = ? ORDER BY seq LIMIT 64',
    );
    this.#delete = db.prepare('DELETE FROM deployment_output WHERE deployment_id = ? AND revision = ? AND seq = ?');
    this.#addCut = db.prepare(
      `INSERT INTO deployment_output_cut (deployment_id, revision, stream, bytes) VALUES (?, ?, ?, ?)
       ON CONFLICT (deployment_id, revision, stream) DO UPDATE SET bytes = bytes + excluded.bytes`,
    );
    this.#chunks = db.prepare(
      'SELECT seq, stream, text, dropped_bytes FROM deployment_output WHERE deployment_id = ? AND revision = ? ORDER BY seq',
    );
    this.#cuts = db.prepare('SELECT stream, bytes FROM deployment_output_cut WHERE deployment_id = ? AND revision = ?');
    // the newest chunk of the deployment's current revision (an index seek per deployment)
    this.#last = db.prepare(
      `SELECT o.text FROM deployment_output o JOIN deployments d ON d.id = o.deployment_id AND d.revision = o.revision
       WHERE o.deployment_id = ? ORDER BY o.seq DESC LIMIT 1`,
    );
  }

  /**
   * Keeps the chunk (one transaction with the trim); `duplicate` when that sequence number was
   * kept before (nothing changes then).
   */
  append(c: OutputChunkRecord, at: string): { duplicate: boolean } {
    return this.#db.transaction(() => {
      const bytes = Buffer.byteLength(c.text, 'utf8');
      const r = this.#insert.run(c.deploymentId, c.revision, c.seq, c.stream, c.text, bytes, c.droppedBytes, at);
      if (r.changes === 0) return { duplicate: true };
      let total = (this.#total.get(c.deploymentId, c.revision) as { n: number }).n;
      // delete whole chunks, oldest first, while the rest still holds the limit
      while (total > this.#limitBytes) {
        const rows = this.#oldest.all(c.deploymentId, c.revision) as Array<{
          seq: number;
          stream: string;
          bytes: number;
        }>;
        let deleted = false;
        for (const row of rows) {
          if (total - row.bytes < this.#limitBytes) break;
          this.#delete.run(c.deploymentId, c.revision, row.seq);
          this.#addCut.run(c.deploymentId, c.revision, row.stream, row.bytes);
          total -= row.bytes;
          deleted = true;
        }
        if (!deleted) break;
      }
      return { duplicate: false };
    })();
  }

  /** The text of the newest chunk of each deployment's current revision (those with none are absent). */
  lastChunks(deploymentIds: readonly string[]): Map<string, string> {
    const out = new Map<string, string>();
    for (const id of deploymentIds) {
      const r = this.#last.get(id) as { text: string } | undefined;
      if (r !== undefined) out.set(id, r.text);
    }
    return out;
  }

  read(deploymentId: string, revision: number): KeptOutput {
    const chunks = (
      this.#chunks.all(deploymentId, revision) as Array<{
        seq: number;
        stream: OutputStream;
        text: string;
        dropped_bytes: number;
      }>
    ).map((r) => ({
      deploymentId,
      revision,
      seq: r.seq,
      stream: r.stream,
      text: r.text,
      droppedBytes: r.dropped_bytes,
    }));
    const cutBytes: Record<OutputStream, number> = { stdout: 0, stderr: 0 };
    for (const r of this.#cuts.all(deploymentId, revision) as Array<{ stream: OutputStream; bytes: number }>)
      cutBytes[r.stream] = r.bytes;
    return { chunks, cutBytes };
  }
}
