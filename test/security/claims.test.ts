/**
 * Every claim in SECURITY.md names the test that proves it, as `test/<file>.test.ts › <name>`,
 * `<name>` being the full name vitest gives the test (its describe titles and its own title,
 * joined by spaces, as the JSON reporter's `fullName`). This fails unless each named file exists
 * and holds those titles: describe titles as `describe(...)` literals, the test's own as a
 * string literal (an `it`, or a row of an `it.each` table titled '%s'), or as an `it`/`it.each`
 * template whose `%s` stands for the rest. It also fails when a row of a STRIDE table names no
 * test at all.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { namesATest } from './helpers/test-names.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const DOC = fs.readFileSync(path.join(REPO, 'SECURITY.md'), 'utf8');
const REF_RE = /`(test\/[^`\s]+\.test\.ts) › ([^`]+)`/g;

interface Ref {
  file: string;
  name: string;
}

function references(text: string): Ref[] {
  return [...text.matchAll(REF_RE)].map((m) => ({ file: m[1]!, name: m[2]! }));
}

const refs = references(DOC);

describe('claims: SECURITY.md names real tests', () => {
  it('names tests at all, in every STRIDE table', () => {
    expect(refs.length).toBeGreaterThanOrEqual(50);
    const stride = DOC.slice(DOC.indexOf('<!-- stride -->'), DOC.indexOf('## What Herald does not defend against'));
    expect(stride.length).toBeGreaterThan(1000);
    const rows = stride.split('\n').filter((l) => /^\| [STRIDE](?:\/[STRIDE])* \|/.test(l));
    expect(rows.length).toBeGreaterThanOrEqual(30);
    const bare = rows.filter((r) => references(r).length === 0);
    expect(bare, 'STRIDE rows that name no test').toEqual([]);
  });

  it.each(refs.map((r) => [`${r.file} › ${r.name}`, r] as const))('%s', (_ref, r) => {
    const file = path.join(REPO, r.file);
    expect(fs.existsSync(file), `${r.file} does not exist`).toBe(true);
    expect(namesATest(r.name, fs.readFileSync(file, 'utf8')), `${r.file} has no test named "${r.name}"`).toBe(true);
  });

  it('refuses a name that is not a test (self-check)', () => {
    const src = fs.readFileSync(path.join(REPO, 'test/security/frames.test.ts'), 'utf8');
    expect(namesATest('frames: every verifier code over a live connection a frame that is not a JWS', src)).toBe(true);
    expect(namesATest('frames: every verifier code over a live connection a frame that was never written', src)).toBe(
      false,
    );
    expect(namesATest('a frame that is not a JWS', src)).toBe(false);
  });
});
