import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import * as limits from '../../protocol/limits.js';

const section = readFileSync(new URL('../../docs/limits.md', import.meta.url), 'utf8');

describe('limits documentation', () => {
  it('documents every limit of protocol/limits.ts in docs/limits.md', () => {
    const missing = Object.keys(limits).filter((name) => !section.includes(`\`${name}\``));
    expect(missing).toEqual([]);
  });

  it('names no limit in docs/limits.md that protocol/limits.ts does not have', () => {
    const named = [...section.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].map((m) => m[1]!);
    expect(named.filter((n) => !(n in limits))).toEqual([]);
  });

  it('every limit name carries its unit, or is a count, fraction or name', () => {
    const unitless =
      /(_MS|_S|_BYTES|_BITS|_DAYS|_PER_S|_BURST|_CAPACITY|_CONNECTIONS|_FRAMES|_FRACTION|_LEVELS|_REQUESTS|_PORT|_ENTRIES|_BUCKETS|_IN_FLIGHT|_DOMAIN|_ATTEMPTS|_ROWS|_PROCESSES)$/;
    expect(Object.keys(limits).filter((n) => !unitless.test(n))).toEqual([]);
  });
});
