/**
 * `npm run check:cycles` (scripts/check-cycles.mjs) on small trees made here: it fails on an
 * import circle and on an import across a folder rule, and passes a tree that has neither.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

const SCRIPT = path.resolve(import.meta.dirname, '..', '..', 'scripts', 'check-cycles.mjs');
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

function check(files: Record<string, string>): { code: number | null; out: string } {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-cycles-'));
  dirs.push(root);
  for (const [name, text] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(root, name)), { recursive: true });
    fs.writeFileSync(path.join(root, name), text);
  }
  const r = spawnSync(process.execPath, [SCRIPT, `--root=${root}`], { encoding: 'utf8' });
  return { code: r.status, out: r.stdout + r.stderr };
}

describe('check-cycles', () => {
  it('passes a tree whose imports follow the folder rules and make no circle', () => {
    const r = check({
      'protocol/a.ts': 'export const a = 1;\n',
      'agent/b.ts': "import { a } from '../protocol/a.js';\nexport const b = a;\n",
      'controller/c.ts': "import { a } from '../protocol/a.js';\nexport const c = a;\n",
    });
    expect(r.out).toMatch(/0 import circle\(s\), 0 folder rule\(s\) broken/);
    expect(r.code).toBe(0);
  });

  it('fails on an import circle', () => {
    const r = check({
      'controller/a.ts': "import { b } from './b.js';\nexport const a = b;\n",
      'controller/b.ts': "import { a } from './a.js';\nexport const b = a;\n",
    });
    expect(r.out).toMatch(/import circle among 2 module\(s\)/);
    expect(r.code).toBe(1);
  });

  it.each([
    ['the agent importing the controller', 'agent/x.ts', "import { c } from '../controller/c.js';\n"],
    ['the controller importing the agent', 'controller/x.ts', "import type { c } from '../agent/c.js';\n"],
    ['the protocol importing the PKI', 'protocol/x.ts', "import { c } from '../certs/c.js';\n"],
  ])('fails on %s', (_what, file, text) => {
    const r = check({
      [file]: text,
      'controller/c.ts': 'export const c = 1;\n',
      'agent/c.ts': 'export type c = 1;\n',
      'certs/c.ts': 'export const c = 1;\n',
    });
    expect(r.out).toMatch(new RegExp(`folder rule broken: ${file} imports`));
    expect(r.code).toBe(1);
  });
});
