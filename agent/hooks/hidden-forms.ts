/**
 * Every spelling of a hidden input value a hook is likely to print, so masking (mask.ts) finds the
 * value whichever way it left the hook. A hook sees a value as its environment string (lists and
 * objects JSON-encoded), but it may print it through a JSON encoder, and encoders differ:
 *
 * - JavaScript, Rust, Ruby and Python with `ensure_ascii=False` escape only `"`, `\` and control
 *   characters (`\n`, `\t`, `\r`, `\b`, `\f`, else `\u00XX`);
 * - Python's `json.dumps` (by default) and PHP's `json_encode` also write every non-ASCII
 *   character as `\uXXXX` (a character beyond U+FFFF as its surrogate pair, `\ud83d\ude00`);
 * - PHP writes `/` as `\/`; with `JSON_HEX_TAG`/`_AMP`/`_APOS`/`_QUOT` also `< > & ' "` as `\u00XX`;
 * - Go writes `< > &` as `\u003c \u003e \u0026`, U+2028 and U+2029 as `\u2028 \u2029`, and
 *   control characters other than `\n \r \t` as `\u00XX`;
 * - Python re-encoding a list or an object separates with `", "` and `": "`.
 *
 * Hex digits are written in lower case here; mask.ts matches them in either case (PHP writes its
 * `JSON_HEX_*` escapes upper case, Jackson all of them). Pure.
 */

/** How one encoder writes a string's content (between its quotes). */
interface Profile {
  /** Every character above U+007F as `\uXXXX` (surrogate pairs beyond U+FFFF). */
  asciiOnly: boolean;
  /** These characters as `\u00XX` (Go's and PHP's HTML-safe escapes). */
  hex: string;
  /** `/` as `\/` (PHP). */
  slash: boolean;
  /** U+2028 and U+2029 as escapes even when other non-ASCII is written as it is (Go). */
  lineSeparators: boolean;
  /** `\b` and `\f` as `\u0008` and `\u000c` (Go) rather than their short escapes. */
  longControls: boolean;
}

const SHORT_ESCAPES: Record<string, string> = { '"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t' };
const HTML_SAFE = ['', '<>&', '<>&\'"'];

function u(code: number): string {
  return `\\u${code.toString(16).padStart(4, '0')}`;
}

/** `s` as the content of a JSON string written the way `p` writes it. */
function encode(s: string, p: Profile): string {
  let out = '';
  // by UTF-16 code unit, so a character beyond U+FFFF comes out as its surrogate pair
  for (let i = 0; i < s.length; i++) {
    const ch = s[i]!;
    const code = s.charCodeAt(i);
    if (p.hex.includes(ch)) out += u(code);
    else if (SHORT_ESCAPES[ch] !== undefined) out += SHORT_ESCAPES[ch];
    else if (ch === '\b' || ch === '\f') out += p.longControls ? u(code) : ch === '\b' ? '\\b' : '\\f';
    else if (code < 0x20) out += u(code);
    else if (ch === '/' && p.slash) out += '\\/';
    else if (code > 0x7f && p.asciiOnly) out += u(code);
    else if ((code === 0x2028 || code === 0x2029) && p.lineSeparators) out += u(code);
    else out += ch;
  }
  return out;
}

/**
 * The encoders' profiles that can differ for `text` (a switch whose characters `text` does not
 * hold would only repeat a form, so it is left off: a long value costs a few passes, not 48).
 */
function profilesFor(text: string): Profile[] {
  const has = (re: RegExp): boolean => re.test(text);
  const options = <T>(present: boolean, all: T[]): T[] => (present ? all : all.slice(0, 1));
  const out: Profile[] = [];
  for (const asciiOnly of options(has(/[^\0-\x7f]/), [false, true]))
    for (const hex of options(has(/[<>&'"]/), HTML_SAFE))
      for (const slash of options(text.includes('/'), [false, true]))
        for (const lineSeparators of options(!asciiOnly && has(/[\u2028\u2029]/), [false, true]))
          for (const longControls of options(has(/[\b\f]/), [false, true]))
            out.push({ asciiOnly, hex, slash, lineSeparators, longControls });
  return out;
}

/** `v` serialised as JSON with every string written the way `p` writes it; `spaced`: Python's separators. */
function serialise(v: unknown, p: Profile, spaced: boolean, depth = 0): string {
  if (typeof v === 'string') return `"${encode(v, p)}"`;
  if (v === null || typeof v !== 'object' || depth > 64) return JSON.stringify(v) ?? 'null';
  const comma = spaced ? ', ' : ',';
  if (Array.isArray(v)) return `[${v.map((x) => serialise(x, p, spaced, depth + 1)).join(comma)}]`;
  const colon = spaced ? ': ' : ':';
  return `{${Object.entries(v as Record<string, unknown>)
    .map(([k, x]) => `"${encode(k, p)}"${colon}${serialise(x, p, spaced, depth + 1)}`)
    .join(comma)}}`;
}

/**
 * Every form of a hidden value a hook is likely to print, without duplicates: `env`, the value as
 * the hook's environment holds it, as it is and as the content of a JSON string written by each
 * encoder above; for a list or an object also the value re-encoded by each of them, compact and
 * with Python's separators. Empty strings are left out (they would mask nothing but themselves).
 */
export function hiddenForms(value: unknown, env: string): string[] {
  const out = new Set<string>([env]);
  for (const p of profilesFor(env)) out.add(encode(env, p));
  if (value !== null && typeof value === 'object') {
    const strings = JSON.stringify(value) ?? '';
    for (const p of profilesFor(strings)) for (const spaced of [false, true]) out.add(serialise(value, p, spaced));
  }
  out.delete('');
  return [...out];
}
