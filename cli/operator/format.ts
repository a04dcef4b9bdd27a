/**
 * How operator commands talk to people: aligned tables, `key: value` listings, durations and
 * times; and how they read people's input: `k=v` pairs, `name[:Type]=default` declarations,
 * `10m`-style durations. Pure: every function returns strings or values and does no I/O.
 */
import { HeraldError } from '../../protocol/errors.js';

/** Heat's input types (docs/protocol.md). */
export const INPUT_TYPES = ['String', 'Number', 'CommaDelimitedList', 'Json', 'Boolean'] as const;
export type InputType = (typeof INPUT_TYPES)[number];

/** A cell: anything is shown, `null`/`undefined` as `-`. */
export function cell(v: unknown): string {
  if (v === null || v === undefined || v === '') return '-';
  if (typeof v === 'string') return v;
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  return JSON.stringify(v);
}

/**
 * Formats rows as a table with a header, columns padded to their widest cell (the last column
 * is not padded, so lines carry no trailing spaces).
 */
export function table(headers: string[], rows: unknown[][]): string {
  const cells = [headers, ...rows.map((r) => headers.map((_, i) => cell(r[i])))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return `${cells
    .map((r) =>
      r
        .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n')}\n`;
}

/**
 * A resource as `key: value` lines, nested objects indented; arrays of scalars joined by commas.
 * Multi-line strings (scripts, stdout) are shown as indented blocks.
 */
export function keyValues(obj: Record<string, unknown>, indent = ''): string {
  const keys = Object.keys(obj);
  const width = Math.max(0, ...keys.map((k) => k.length));
  let out = '';
  for (const k of keys) {
    const v = obj[k];
    const label = `${indent}${(`${k}:`).padEnd(width + 1)}`;
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
      const inner = v as Record<string, unknown>;
      out += Object.keys(inner).length === 0 ? `${label} {}\n` : `${indent}${k}:\n${keyValues(inner, `${indent}  `)}`;
    } else if (Array.isArray(v) && v.some((x) => x !== null && typeof x === 'object')) {
      out += `${indent}${k}:\n`;
      for (const item of v) {
        if (item !== null && typeof item === 'object') {
          const body = keyValues(item as Record<string, unknown>, `${indent}    `);
          out += `${indent}  - ${body.slice(indent.length + 4)}`;
        } else {
          out += `${indent}  - ${cell(item)}\n`;
        }
      }
    } else if (Array.isArray(v)) {
      out += `${label} ${v.length === 0 ? '[]' : v.map(cell).join(', ')}\n`;
    } else if (typeof v === 'string' && v.includes('\n')) {
      out += `${indent}${k}: |\n${v
        .replace(/\n$/, '')
        .split('\n')
        .map((l) => `${indent}    ${l}`)
        .join('\n')}\n`;
    } else {
      out += `${label} ${cell(v)}\n`;
    }
  }
  return out;
}

/** `12:00:01.234`, local time. */
export function clockTime(d: Date = new Date()): string {
  const p = (n: number, w = 2): string => String(n).padStart(w, '0');
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

/** `40 ms`, `1.2 s`, `3m05s`. */
export function formatMs(ms: number): string {
  if (!Number.isFinite(ms)) return '-';
  const r = Math.max(0, Math.round(ms));
  if (r < 1000) return `${r} ms`;
  if (r < 60_000) return `${(r / 1000).toFixed(r < 10_000 ? 2 : 1)} s`;
  const m = Math.floor(r / 60_000);
  return `${m}m${String(Math.floor((r % 60_000) / 1000)).padStart(2, '0')}s`;
}

/**
 * Parses `500ms`, `30s`, `10m`, `1h` or a bare number of seconds into milliseconds.
 * @throws HeraldError `bad_option` naming `option`
 */
export function parseDuration(s: string, option: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(s.trim());
  if (!m) throw new HeraldError('bad_option', `${option} ${JSON.stringify(s)} is not a duration (e.g. 90s, 10m, 1h)`);
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  const ms = unit === 'ms' ? n : unit === 's' ? n * 1000 : unit === 'm' ? n * 60_000 : n * 3_600_000;
  if (ms <= 0) throw new HeraldError('bad_option', `${option} must be positive`);
  return ms;
}

/**
 * Parses a positive whole number.
 * @throws HeraldError `bad_option` naming `option`
 */
export function parsePositiveInt(s: string, option: string): number {
  if (!/^\d+$/.test(s) || Number(s) < 1)
    throw new HeraldError('bad_option', `${option} must be a whole number of at least 1, not ${JSON.stringify(s)}`);
  return Number(s);
}

/** Commander's collector for repeatable options. */
export function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

/**
 * `k=v` pairs into an object. The value is kept a string unless it starts with `json:` (then
 * parsed), so `--input port=8080` sends `"8080"` and `--input 'tags=json:["a"]'` a list. The
 * controller converts by the config's declared types.
 * @throws HeraldError `bad_option` naming `option`
 */
export function parseKeyValues(pairs: string[] | undefined, option: string): Record<string, unknown> | undefined {
  if (!pairs || pairs.length === 0) return undefined;
  const out: Record<string, unknown> = {};
  for (const p of pairs) {
    const eq = p.indexOf('=');
    if (eq <= 0) throw new HeraldError('bad_option', `${option} ${JSON.stringify(p)} is not key=value`);
    const k = p.slice(0, eq);
    const v = p.slice(eq + 1);
    if (v.startsWith('json:')) {
      try {
        out[k] = JSON.parse(v.slice(5));
      } catch {
        throw new HeraldError('bad_option', `${option} ${k}: the value after json: is not JSON`);
      }
    } else {
      out[k] = v;
    }
  }
  return out;
}

export interface InputDecl {
  name: string;
  type: InputType;
  default?: unknown;
  description?: string;
  hidden?: boolean;
}

/**
 * Parses a config input declaration `name[:Type][=default]` (Type one of Heat's, default
 * String). The name is not checked here: the controller checks it and answers with `field`.
 * @throws HeraldError `bad_option` for an unknown type
 */
export function parseInputDecl(spec: string, option: string, hidden = false): InputDecl {
  const eq = spec.indexOf('=');
  const head = eq < 0 ? spec : spec.slice(0, eq);
  const colon = head.indexOf(':');
  const name = colon < 0 ? head : head.slice(0, colon);
  const typeText = colon < 0 ? 'String' : head.slice(colon + 1);
  const type = INPUT_TYPES.find((t) => t.toLowerCase() === typeText.toLowerCase());
  if (!type)
    throw new HeraldError(
      'bad_option',
      `${option} ${JSON.stringify(spec)}: type must be one of ${INPUT_TYPES.join(', ')}`,
    );
  const decl: InputDecl = { name, type };
  if (eq >= 0) decl.default = spec.slice(eq + 1);
  if (hidden) decl.hidden = true;
  return decl;
}

export interface OutputDecl {
  name: string;
  type: InputType;
  error_output?: boolean;
  hidden?: boolean;
}

/** Parses an output declaration `name[:Type]`; `hidden`: its value is masked to who may not deploy (docs/access.md). */
export function parseOutputDecl(spec: string, option: string, errorOutput = false, hidden = false): OutputDecl {
  const d = parseInputDecl(spec, option);
  const out: OutputDecl = { name: d.name, type: d.type };
  if (errorOutput) out.error_output = true;
  if (hidden) out.hidden = true;
  return out;
}

/** Splits `a,b , c` into `['a','b','c']`, dropping empties. */
export function splitList(s: string | undefined): string[] {
  return (s ?? '')
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x.length > 0);
}
