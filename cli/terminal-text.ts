/**
 * Text from the controller shown in an operator's terminal. Much of it comes from nodes: a hook's
 * output, a failure reason, a last output line. A node that prints ESC, CSI or OSC sequences (or
 * their one-byte C1 forms, U+0080-U+009F) could otherwise move the cursor, rewrite what is on the
 * screen, retitle the window, write to the clipboard or hide lines; a bare `\r` rewrites a line.
 * So every such string is printed through `visible()`, which writes each control character as a
 * `\u001b`-style escape and leaves `\n` and `\t` alone; `--raw` opts out (docs/cli.md). Pure.
 */

/** C0 controls but `\t` and `\n`, DEL, and the C1 controls. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to find control characters
const CONTROL_RE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;
/** What `JSON.stringify` leaves as it is of the above: DEL and C1. */
const JSON_CONTROL_RE = /[\u007f-\u009f]/g;

function escaped(c: string): string {
  return `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
}

/** `s` with every terminal control character but `\n` and `\t` written as `\u001b` (etc.). */
export function visible(s: string): string {
  return s.replace(CONTROL_RE, escaped);
}

/**
 * `v` with `visible()` applied to every string in it, keys included (depth-bounded); other
 * values, a `Date` among them, are kept as they are. For views that draw with control sequences
 * of their own (a progress bar), which must not go through `visible()` as a whole.
 */
export function visibleDeep<T>(v: T, depth = 0): T {
  if (typeof v === 'string') return visible(v) as T;
  if (v === null || typeof v !== 'object' || depth > 64) return v;
  if (Array.isArray(v)) return v.map((x) => visibleDeep(x, depth + 1)) as T;
  if (Object.getPrototypeOf(v) !== Object.prototype) return v;
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) out[visible(k)] = visibleDeep(x, depth + 1);
  return out as T;
}

/**
 * `v` as indented JSON. `JSON.stringify` escapes C0 controls already; DEL and C1 are escaped
 * here too (`\u009b`, the same JSON value), unless `raw`.
 */
export function jsonText(v: unknown, raw = false): string {
  const text = JSON.stringify(v, null, 2) ?? 'null';
  return raw ? text : text.replace(JSON_CONTROL_RE, escaped);
}
