/**
 * Heat's rules for input values, as pure functions: a value coerced to its declared type
 * (undeclared ones kept as Strings, as Heat does) and PATCH's merge. The service applies them
 * to what a caller sent; the store applies them when it makes a deployment a cluster step
 * needs; neither owns them.
 */
import { HeraldError, RefusalError } from '../../protocol/errors.js';
import { checkInputName, DERIVED_INPUT_NAMES, type InputType } from '../../protocol/heat.js';
import type { ConfigRecord } from './records.js';

/**
 * Checks and coerces `values` against the config's declared inputs: declared ones to their
 * type, undeclared ones kept as Strings (as Heat does). A null value means "unset".
 * @throws RefusalError bad_name | forbidden_input; HeraldError bad_input_value
 */
export function coerceInputValues(
  config: ConfigRecord,
  values: Record<string, unknown>,
  prefix = 'input_values',
): Record<string, unknown> {
  const declared = new Map(config.inputs.map((i) => [i.name, i]));
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(values)) {
    const field = `${prefix}.${name}`;
    checkInputName(name, field);
    if ((DERIVED_INPUT_NAMES as readonly string[]).includes(name))
      throw new RefusalError('bad_name', `${name} is derived by Herald`, { field });
    if (value === null || value === undefined) continue;
    out[name] = coerceValue(declared.get(name)?.type ?? 'String', value, field);
  }
  return out;
}

const TRUE_WORDS = new Set(['true', 't', 'yes', 'y', 'on', '1']);
const FALSE_WORDS = new Set(['false', 'f', 'no', 'n', 'off', '0']);

/**
 * A value as its Heat type. String values are strings (lists and objects JSON-encoded);
 * Numbers from numbers or numeric strings; Booleans from booleans, 0/1 or Heat's words;
 * CommaDelimitedLists from lists of scalars or "a,b"; Json from anything (a string holding JSON
 * is parsed).
 * @throws HeraldError bad_input_value (the message names the type, never the value)
 */
export function coerceValue(type: InputType, value: unknown, field: string): unknown {
  const bad = (): never => {
    throw new HeraldError('bad_input_value', `${field} must be a ${type}`, { field });
  };
  switch (type) {
    case 'String':
      if (typeof value === 'string') return value;
      if (typeof value === 'number' || typeof value === 'boolean') return String(value);
      return JSON.stringify(value);
    case 'Number': {
      if (typeof value === 'number' && Number.isFinite(value)) return value;
      if (typeof value === 'string' && value.trim() !== '' && Number.isFinite(Number(value))) return Number(value);
      return bad();
    }
    case 'Boolean': {
      if (typeof value === 'boolean') return value;
      if (value === 0 || value === 1) return value === 1;
      if (typeof value === 'string') {
        const w = value.trim().toLowerCase();
        if (TRUE_WORDS.has(w)) return true;
        if (FALSE_WORDS.has(w)) return false;
      }
      return bad();
    }
    case 'CommaDelimitedList': {
      if (typeof value === 'string') return value === '' ? [] : value.split(',').map((s) => s.trim());
      if (Array.isArray(value) && value.every((v) => ['string', 'number', 'boolean'].includes(typeof v)))
        return value.map(String);
      return bad();
    }
    case 'Json': {
      if (typeof value === 'string') {
        try {
          return JSON.parse(value) as unknown;
        } catch {
          return value;
        }
      }
      return value;
    }
  }
}

/** PATCH semantics for input values: given keys replace, null removes, others are kept. */
export function mergeInputValues(
  current: Record<string, unknown>,
  patch: Record<string, unknown>,
): Record<string, unknown> {
  const out: Record<string, unknown> = { ...current };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}
