/**
 * Hidden input values masked in what a hook printed (docs/architecture.md): every value of an input marked
 * `hidden: true` that appears in the kept stdout or stderr, in a declared output or in a reason is
 * replaced by `***` before the result is kept, signalled or logged.
 *
 * Masking runs on the final kept text, never chunk by chunk, so a value the pipe delivered in two
 * pieces is caught whole. Each value of at least one character is masked (a short secret is still
 * a secret; masking a one-character value masks that character everywhere), in every form a hook
 * is likely to print it (hidden-forms.ts: as the environment string, and as each common JSON
 * encoder writes it). A `\uXXXX` escape matches in either case of its hex digits. Occurrences that
 * overlap are masked as one, so a value holding another, or two overlapping forms, leave nothing
 * of either behind.
 */
import type { MetadataInput } from '../../protocol/heat.js';
import { MAX_JSON_DEPTH_LEVELS } from '../../protocol/limits.js';
import { inputEnvValue } from './env.js';
import { hiddenForms } from './hidden-forms.js';
import type { RunResult } from './types.js';

export const MASK = '***';

/** The marker TailBuffer (and fitSignalBody) put where the start was cut. */
const CUT_MARKER_RE = /^\[herald: \d+ bytes cut\]\n/;

/**
 * The strings to mask for these inputs (every form of each hidden value, hidden-forms.ts), longest
 * first; empty when none is hidden.
 */
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
    if (env.length === 0) continue;
    for (const f of hiddenForms(input.value, env)) out.add(f);
  }
  return [...out].sort((a, b) => b.length - a.length);
}

/**
 * `text` with the hex digits of every `\uXXXX` escape (and of an escape's beginning, `\uA`) in
 * lower case: the same length, so a position in one is the same position in the other.
 */
export function foldHexCase(text: string): string {
  return text.includes('\\u') ? text.replace(/\\u[0-9A-Fa-f]{1,4}/g, (m) => m.toLowerCase()) : text;
}

/**
 * Where any of `values` occurs in `text`, as it is or with its escapes' hex digits in the other
 * case: [start, end) pairs in order, overlapping occurrences joined into one.
 */
export function hiddenSpans(text: string, values: readonly string[]): Array<[number, number]> {
  const found: Array<[number, number]> = [];
  const scan = (t: string, v: string): void => {
    for (let i = t.indexOf(v); i !== -1; i = t.indexOf(v, i + 1)) found.push([i, i + v.length]);
  };
  const folded = foldHexCase(text);
  for (const v of values) {
    scan(text, v);
    if (folded !== text || foldHexCase(v) !== v) scan(folded, foldHexCase(v));
  }
  if (found.length === 0) return found;
  found.sort((a, b) => a[0] - b[0] || b[1] - a[1]);
  const out: Array<[number, number]> = [found[0]!];
  for (const [s, e] of found) {
    const last = out[out.length - 1]!;
    if (s < last[1]) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out;
}

/**
 * `text` with every occurrence of each value replaced by `***`. When the text starts with a cut
 * marker, a value whose beginning was cut away is masked too: the text right after the marker is
 * checked against each value's endings.
 */
export function maskText(text: string, values: readonly string[]): string {
  if (values.length === 0 || text === '') return text;
  let t = text;
  const spans = hiddenSpans(text, values);
  if (spans.length > 0) {
    let out = '';
    let at = 0;
    for (const [s, e] of spans) {
      out += text.slice(at, s) + MASK;
      at = e;
    }
    t = out + text.slice(at);
  }
  const m = CUT_MARKER_RE.exec(t);
  if (m !== null) {
    const head = m[0];
    const body = t.slice(head.length);
    const folded = foldHexCase(body);
    for (const v of values) {
      for (let k = v.length - 1; k >= 1; k--) {
        const end = v.slice(v.length - k);
        if (body.startsWith(end) || folded.startsWith(foldHexCase(end))) return head + MASK + body.slice(k);
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
