/**
 * The `postgres` client as installed carries the guard scripts/patch-postgres.mjs applies
 * (porsager/postgres#1154: without it, a write scheduled after a connection closed throws an
 * uncatchable TypeError and the controller dies when PostgreSQL goes away). The several-
 * controllers fault tests (test/integration/several-controllers.test.ts) are where a missing
 * guard shows as a dead controller; this names the cause.
 */
import fs from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

describe('the postgres client', () => {
  it('has the nextWrite guard in every build the package ships (npm ci applies it in prepare)', () => {
    const root = path.join(path.dirname(new URL(import.meta.url).pathname), '..', '..', 'node_modules', 'postgres');
    for (const file of ['src/connection.js', 'cjs/src/connection.js'])
      expect(fs.readFileSync(path.join(root, file), 'utf8'), file).toContain(
        'herald: guard from porsager/postgres#1176',
      );
  });
});
