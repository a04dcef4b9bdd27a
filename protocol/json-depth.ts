/**
 * One depth guard for every free-form JSON value Herald accepts (docs/api.md): API bodies' configs,
 * options, input values and signal outputs, and the agent's hook answers. A value nested deeper
 * than MAX_JSON_DEPTH_LEVELS is refused before anything stores, re-serialises or walks it recursively
 * (V8's JSON.stringify and a recursive walk both overflow the stack a few thousand levels down).
 */
import { MAX_JSON_DEPTH_LEVELS } from './limits.js';

/**
 * Depth of a parsed JSON value, walked iteratively (no recursion, so no stack overflow however
 * deep), stopping as soon as `limit` is exceeded. A scalar is depth 0, `[]`/`{}` depth 1.
 * @returns the depth, or `limit + 1` as soon as it is known to be deeper than `limit`.
 */
export function jsonDepth(value: unknown, limit = MAX_JSON_DEPTH_LEVELS): number {
  let max = 0;
  const stack: Array<[unknown, number]> = [[value, 0]];
  while (stack.length > 0) {
    const [v, d] = stack.pop() as [unknown, number];
    if (v === null || typeof v !== 'object') continue;
    const depth = d + 1;
    if (depth > max) {
      max = depth;
      if (max > limit) return limit + 1;
    }
    const children = Array.isArray(v) ? v : Object.values(v as Record<string, unknown>);
    for (const c of children) if (c !== null && typeof c === 'object') stack.push([c, depth]);
  }
  return max;
}

/** True when `value` is nested at most `limit` levels deep. */
export function withinJsonDepth(value: unknown, limit = MAX_JSON_DEPTH_LEVELS): boolean {
  return jsonDepth(value, limit) <= limit;
}

/**
 * The depth of JSON text, counted over its brackets without parsing it (so text too deep to
 * parse or stringify safely is measured cheaply). Brackets inside strings are skipped.
 * @returns the depth, or `limit + 1` as soon as it is known to be deeper than `limit`.
 */
export function jsonTextDepth(text: string, limit = MAX_JSON_DEPTH_LEVELS): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      depth++;
      if (depth > max) {
        max = depth;
        if (max > limit) return limit + 1;
      }
    } else if (c === 0x7d || c === 0x5d) depth--;
  }
  return max;
}
