/**
 * Live output rows (docs/api.md; tables `deployment_output` and `deployment_output_cut`), over the
 * statements both stores share: each chunk an agent posted, keyed by deployment, revision and
 * sequence number, so a chunk sent twice is kept once; per revision only the newest chunks
 * holding OUTPUT_KEPT_PER_REVISION_BYTES stay (older ones are deleted, and the bytes cut are
 * counted per stream); a removed deployment's output goes with it (a trigger in each schema).
 */
import { HeraldError } from '../../protocol/errors.js';
import { OUTPUT_KEPT_PER_REVISION_BYTES } from '../../protocol/limits.js';
import type { OutputStream } from '../../protocol/output.js';
import type { Statements } from './statements.js';

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

export class SqlOutputRows {
  readonly #s: Statements;
  readonly #limitBytes: number;

  constructor(s: Statements, limitBytes = OUTPUT_KEPT_PER_REVISION_BYTES) {
    this.#s = s;
    this.#limitBytes = limitBytes;
  }

  /**
   * Keeps the chunk and trims the revision to the limit; the caller runs it in one transaction.
   * `duplicate` when that sequence number was kept before (nothing changes then).
   * @throws HeraldError `output_closed` when the revision's result is in: its output is final,
   *   so a chunk can neither add to nor rewrite what operators read as the run's log
   */
  async append(c: OutputChunkRecord, at: string): Promise<{ duplicate: boolean }> {
    const s = this.#s;
    // PostgreSQL: FOR SHARE makes a signal committing meanwhile wait for this transaction, or this
    // read wait for the signal and see it; SQLite's one writer orders the two the same way
    const rev = (await s.outRevisionSignalled.get(c.deploymentId, c.revision)) as
      | { signalled: number | string }
      | undefined;
    if (rev !== undefined && Number(rev.signalled) === 1)
      throw new HeraldError(
        'output_closed',
        `revision ${c.revision} of deployment ${c.deploymentId} has its result: its output is final`,
        { field: 'revision' },
      );
    const bytes = Buffer.byteLength(c.text, 'utf8');
    const r = await s.outInsert.run(c.deploymentId, c.revision, c.seq, c.stream, c.text, bytes, c.droppedBytes, at);
    if (r.changes === 0) return { duplicate: true };
    let total = Number(((await s.outTotal.get(c.deploymentId, c.revision)) as { n: number | string }).n);
    // delete whole chunks, oldest first, while the rest still holds the limit
    while (total > this.#limitBytes) {
      const rows = (await s.outOldest.all(c.deploymentId, c.revision)) as Array<{
        seq: number;
        stream: string;
        bytes: number;
      }>;
      let deleted = false;
      for (const row of rows) {
        if (total - row.bytes < this.#limitBytes) break;
        await s.outDelete.run(c.deploymentId, c.revision, row.seq);
        await s.outAddCut.run(c.deploymentId, c.revision, row.stream, row.bytes);
        total -= row.bytes;
        deleted = true;
      }
      if (!deleted) break;
    }
    return { duplicate: false };
  }

  /** The text of the newest chunk of each deployment's current revision (those with none are absent). */
  async lastChunks(deploymentIds: readonly string[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (const id of deploymentIds) {
      const r = (await this.#s.outLast.get(id)) as { text: string } | undefined;
      if (r !== undefined) out.set(id, r.text);
    }
    return out;
  }

  async read(deploymentId: string, revision: number): Promise<KeptOutput> {
    const rows = (await this.#s.outChunks.all(deploymentId, revision)) as Array<{
      seq: number;
      stream: OutputStream;
      text: string;
      dropped_bytes: number;
    }>;
    const chunks = rows.map((r) => ({
      deploymentId,
      revision,
      seq: r.seq,
      stream: r.stream,
      text: r.text,
      droppedBytes: r.dropped_bytes,
    }));
    const cutBytes: Record<OutputStream, number> = { stdout: 0, stderr: 0 };
    for (const r of (await this.#s.outCuts.all(deploymentId, revision)) as Array<{
      stream: OutputStream;
      bytes: number;
    }>)
      cutBytes[r.stream] = r.bytes;
    return { chunks, cutBytes };
  }
}
