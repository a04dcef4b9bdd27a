/**
 * Hidden input values masked in what a hook printed (SPEC §4): every value of an input marked
 * `hidden: true` that appears in the kept stdout or stderr, in a declared output or in a reason is
 * replaced by `***` before the result is kept, signalled or logged.
 *
 * Masking runs on the final kept text, never chunk by chunk, so a value the pipe delivered in two
 * pieces is caught whole. Each value of at least one character is masked (a short secret is still
 * a secret; masking a one-character value masks that character everywhere), in the forms a hook
 * can see it: as the environment string (lists and objects JSON-encoded) and, for strings, JSON-
 * escaped (a hook that prints JSON). Longest first, so a value holding another is masked whole.
 */
import type { MetadataInput } from '../../protocol/heat.js';
import { MAX_JSON_DEPTH_LEVELS } from '../../protocol/limits.js';
import { inputEnvValue } from './env.js';
import type { RunResult } from './types.js';

export const MASK = '***';

/** The marker TailBuffer (and fitSignalBody) put where the start was cut. */
const CUT_MARKER_RE = /^\[herald: \d+ bytes cut\]\n/;

/** The strings to mask for these inputs, longest first; empty when none is hidden. */
export function hiddenValues(inputs: readonly MetadataInput[] | undefined): string[] {
  const out = new Set<string>();
  for (const input of inputs ?? []) {
    if (input?.hidden !== true) continue;
    let env: string;
    try {
      env = inputEnvValue(input.value);
    } catch {
      continue; // a value JSON cannot encode was refused before the run
    }
    if (env.length > 0) out.add(env);
    if (typeof input.value === 'string') {
      const escaped = JSON.stringify(input.value).slice(1, -1);
      if (escaped.length > 0) out.add(escaped);
    }
  }
  return [...out].sort((a, b) => b.length - a.length);
}

/**
 * `text` with every occurrence of each value replaced by `***`. When the text starts with a cut
 * marker, a value whose beginning was cut away is masked too: the text right after the marker is
 * checked against each value's endings.
 */
export function maskText(text: string, values: readonly string[]): string {
  if (values.length === 0 || text === '') return text;
  let t = text;
  for (const v of values) if (t.includes(v)) t = t.split(v).join(MASK);
  const m = CUT_MARKER_RE.exec(t);
  if (m !== null) {
    const head = m[0];
    const body = t.slice(head.length);
    for (const v of values) {
      for (let k = v.length - 1; k >= 1; k--) {
        if (body.startsWith(v.slice(v.length - k))) return head + MASK + body.slice(k);
      }
    }
  }
  return t;
}

/** A JSON-like value with every string in it masked (depth-bounded; outputs are checked before). */
export function maskValue(v: unknown, values: readonly string[], depth = 0): unknown {
  if (values.length === 0) return v;
  if (typeof v === 'string') return maskText(v, values);
  if (v === null || typeof v !== 'object' || depth > MAX_JSON_DEPTH_LEVELS) return v;
  if (Array.isArray(v)) return v.map((x) => maskValue(x, values, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>))
    out[maskText(k, values)] = maskValue(x, values, depth + 1);
  return out;
}

/** The result with hidden values masked in stdout, stderr, outputs and the reason. */
export function maskResult(r: RunResult, values: readonly string[]): RunResult {
  if (values.length === 0) return r;
  const out: RunResult = {
    ...r,
    deploy_stdout: maskText(r.deploy_stdout, values),
    deploy_stderr: maskText(r.deploy_stderr, values),
    outputs: maskValue(r.outputs, values) as Record<string, unknown>,
  };
  if (r.status_reason !== undefined) out.status_reason = maskText(r.status_reason, values);
  return out;
}
