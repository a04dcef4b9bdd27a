import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODE_LIST, HeraldError, RefusalError, codeOf, isErrorCode } from '../../protocol/errors.js';

const readme = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8');
const documented = new Set([...readme.matchAll(/^\| `([a-z0-9_]+)` \|/gm)].map((m) => m[1]));

describe('error codes', () => {
  it('every code is documented in the docs/errors.md table', () => {
    const missing = ERROR_CODE_LIST.filter((c) => !documented.has(c));
    expect(missing).toEqual([]);
  });

  it('docs/errors.md documents no code that does not exist', () => {
    const table = readme.slice(readme.indexOf('## Error codes'));
    const rows = [...table.matchAll(/^\| `([a-z0-9_]+)` \|/gm)].map((m) => m[1]!);
    expect(rows.filter((c) => !isErrorCode(c))).toEqual([]);
  });

  it('typed errors carry their code, a default message and the field', () => {
    const e = new RefusalError('bad_name', undefined, { field: 'outputs.0.name' });
    expect(e).toBeInstanceOf(HeraldError);
    expect(codeOf(e)).toBe('bad_name');
    expect(e.message.length).toBeGreaterThan(0);
    expect(e.field).toBe('outputs.0.name');
    expect(codeOf(new Error('x'))).toBeUndefined();
  });
});
