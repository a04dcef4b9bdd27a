/**
 * What `GET /v1/deployments/{id}/output` shows of a revision's kept chunks (docs/api.md): per
 * stream, the text in sequence order with the sequence range, at most the last
 * OUTPUT_KEPT_PER_REVISION_BYTES of both streams together. Where output is missing the text says
 * so in one line: chunks the agent dropped (`dropped_bytes`) and the start cut to keep the limit.
 * Pure; the text is as the agent masked it.
 */
import { OUTPUT_KEPT_PER_REVISION_BYTES } from '../../protocol/limits.js';
import { gapMarker, OUTPUT_STREAMS, type OutputStream, type OutputStreamView } from '../../protocol/output.js';
import type { KeptOutput } from '../store/output.js';

/** The line put where the start of a stream was cut. */
export function cutMarker(bytes: number): string {
  return `[herald: ${bytes} bytes cut]\n`;
}

export function renderOutput(
  kept: KeptOutput,
  limitBytes = OUTPUT_KEPT_PER_REVISION_BYTES,
): Record<OutputStream, OutputStreamView> {
  const cut: Record<OutputStream, number> = { ...kept.cutBytes };
  const parts: Record<OutputStream, string[]> = { stdout: [], stderr: [] };
  const range: Record<OutputStream, { first: number | null; last: number | null }> = {
    stdout: { first: null, last: null },
    stderr: { first: null, last: null },
  };
  let room = limitBytes;
  for (let i = kept.chunks.length - 1; i >= 0; i--) {
    const c = kept.chunks[i]!;
    const b = Buffer.from(c.text, 'utf8');
    if (room <= 0) {
      cut[c.stream] += b.length;
      continue;
    }
    let text = c.text;
    if (b.length > room) {
      let from = b.length - room;
      while (from < b.length && (b[from]! & 0xc0) === 0x80) from++; // start on a character
      cut[c.stream] += from;
      text = b.toString('utf8', from);
      room = 0;
    } else {
      room -= b.length;
      if (c.droppedBytes > 0) text = gapMarker(c.droppedBytes) + text;
    }
    parts[c.stream].push(text);
    const r = range[c.stream];
    r.last ??= c.seq;
    r.first = c.seq;
  }
  const out = {} as Record<OutputStream, OutputStreamView>;
  for (const s of OUTPUT_STREAMS) {
    const head = cut[s] > 0 ? cutMarker(cut[s]) : '';
    out[s] = { text: head + parts[s].reverse().join(''), first_seq: range[s].first, last_seq: range[s].last };
  }
  return out;
}
