import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const script = path.resolve(import.meta.dirname, '../../scripts/check-bench-prose.mjs');
const run = (...files: string[]) => spawnSync(process.execPath, [script, ...files], { encoding: 'utf8' });

describe("bench/ carries no narrative prose (BENCHMARKS.md's words are hand-written)", () => {
  it('passes on the tree', () => {
    const r = run();
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it('fails on a paragraph-length literal and on a run of fixed lines, not on figure lines or table rows', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prose-'));
    const file = path.join(dir, 'x.ts');
    const words = 'the controller commits the change and dials every node whose generation is behind it';
    fs.writeFileSync(
      file,
      [
        'const p = (x: string): void => void x;',
        `p(\`${words}, ${words}, \${1}.\`);`,
        `p('${words}');`,
        `p('${words}');`,
        `p('${words}');`,
        // biome-ignore lint/suspicious/noTemplateCurlyInString: the source text of a template line
        'p(`p50 ${1} ms, p99 ${2} ms; COMPLETE p50 ${3} ms`);',
        `p('| ${words} | ${words} | ${words} |');`,
      ].join('\n'),
    );
    const r = run(file);
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/x\.ts:2: a literal of \d+ fixed characters/);
    expect(r.stderr).toMatch(/x\.ts:2: 4 lines of fixed text in a row/);
    expect(r.stderr).not.toMatch(/x\.ts:[67]/);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
