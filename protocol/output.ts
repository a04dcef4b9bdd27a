/**
 * Live output (docs/api.md): the chunk an agent posts while a hook runs (`POST
 * /v1/nodes/{node}/deployments/{id}/output`), what `GET /v1/deployments/{id}/output` answers, and
 * the `/v1/events` payload of type `output`. Both sides import these; the check of a posted chunk
 * lives here so the agent's sender and the controller agree on it.
 *
 * A chunk's text is already masked (hidden values are `***` before a chunk leaves the node,
 * docs/architecture.md); nothing on the controller side can, or tries to, un-mask it.
 */
import { HeraldError } from './errors.js';
import { OUTPUT_CHUNK_MAX_BYTES } from './limits.js';

export type OutputStream = 'stdout' | 'stderr';
export const OUTPUT_STREAMS: readonly OutputStream[] = ['stdout', 'stderr'];

/** One posted chunk. `seq` counts from 1 per revision, over both streams. */
export type OutputChunkBody = {
  revision: number;
  stream: OutputStream;
  seq: number;
  text: string;
  /** Bytes the agent dropped just before this chunk (its queue was full): a gap. */
  dropped_bytes?: number;
};

/** The answer to a posted chunk: `duplicate` when that sequence number was kept before. */
export type OutputChunkAck = { seq: number; duplicate: boolean };

/** One stream of `GET /v1/deployments/{id}/output`: the kept text and the chunks it holds. */
export type OutputStreamView = {
  text: string;
  /** Lowest and highest sequence number kept for this stream; null when none is. */
  first_seq: number | null;
  last_seq: number | null;
};

/** `GET /v1/deployments/{id}/output[?revision=R]` (default: the current revision). */
export type DeploymentOutputView = {
  deployment_id: string;
  node: string;
  revision: number;
  /** True once the revision's result is in (no more chunks are expected). */
  signalled: boolean;
  stdout: OutputStreamView;
  stderr: OutputStreamView;
};

/** The `data` of a `/v1/events` event of type `output`. */
export type OutputEventView = {
  deployment_id: string;
  node: string;
  revision: number;
  stream: OutputStream;
  seq: number;
  text: string;
  dropped_bytes?: number;
};

/** The last non-empty line of `text` (a trailing `\r` dropped), or null when it has none. */
export function lastLineOf(text: string): string | null {
  const lines = text.split('\n');
  for (let i = lines.length - 1; i >= 0; i--) {
    const l = lines[i]!.replace(/\r$/, '');
    if (l.trim() !== '') return l;
  }
  return null;
}

/** What `GET /v1/clusters/{id}` adds to each node (docs/api.md: a stuck node is seen while stuck). */
export type ClusterNodeOutputView = {
  /** The last line of live output of the node's current (or last) step, as the agent masked it; null when none. */
  last_output_line: string | null;
};

/** The line the kept text shows where chunks were lost (dropped at the agent, or cut for size). */
export function gapMarker(bytes: number): string {
  return `[herald: ${bytes} bytes of output not streamed]\n`;
}

/**
 * Checks a posted chunk's shape.
 * @throws HeraldError `invalid_request` with `field`; `empty_chunk` (field `text`) for no text
 */
export function parseOutputChunk(body: unknown): OutputChunkBody {
  const bad = (field: string, message: string): never => {
    throw new HeraldError('invalid_request', message, { field });
  };
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return bad('body', 'expected a JSON object');
  const b = body as Record<string, unknown>;
  if (!isPositiveInt(b.revision)) bad('revision', 'revision must be a positive integer');
  if (b.stream !== 'stdout' && b.stream !== 'stderr') bad('stream', 'stream must be "stdout" or "stderr"');
  if (!isPositiveInt(b.seq)) bad('seq', 'seq must be a positive integer');
  if (typeof b.text !== 'string') bad('text', 'text must be a string');
  // an empty chunk would be a row that the per-revision byte limit never counts
  if (b.text === '') throw new HeraldError('empty_chunk', 'text must not be empty', { field: 'text' });
  if (Buffer.byteLength(b.text as string, 'utf8') > OUTPUT_CHUNK_MAX_BYTES)
    bad('text', `text must be at most ${OUTPUT_CHUNK_MAX_BYTES} bytes`);
  if (b.dropped_bytes !== undefined && !(Number.isSafeInteger(b.dropped_bytes) && (b.dropped_bytes as number) >= 0))
    bad('dropped_bytes', 'dropped_bytes must be a non-negative integer');
  const out: OutputChunkBody = {
    revision: b.revision as number,
    stream: b.stream as OutputStream,
    seq: b.seq as number,
    text: b.text as string,
  };
  if (typeof b.dropped_bytes === 'number' && b.dropped_bytes > 0) out.dropped_bytes = b.dropped_bytes;
  return out;
}

function isPositiveInt(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 1;
}
