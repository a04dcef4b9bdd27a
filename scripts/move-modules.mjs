#!/usr/bin/env node
/**
 * Moves TypeScript modules and rewrites every relative import of them, and theirs, across the
 * tree: `node scripts/move-modules.mjs moves.txt` where each line of moves.txt is
 * `old/path.ts new/path.ts` (repository-relative; blank lines and `#` comments skipped).
 *
 * Imports are found by TypeScript's own pre-processor (ts.preProcessFile), the same reader as
 * scripts/check-cycles.mjs, so every form is rewritten (`import`, `import type`, `export … from`,
 * `import()`, `require()`) and nothing in a comment or string is. Files move with `git mv`, so
 * history follows them. Paths that are strings to TypeScript (a worker's script path, a file
 * read at run time) are not imports: the tool prints every line that still names an old path.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SKIP_DIRS = new Set(['node_modules', 'dist', '.git', 'coverage', 'tmp']);

function sources(dir, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    if (e.name.startsWith('.') || SKIP_DIRS.has(e.name)) continue;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) sources(p, out);
    else if (/\.(c|m)?tsx?$/.test(e.name) && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/** `./x.js` written in `from` names this file of the tree (or undefined when it is not one). */
function resolveSpecifier(from, spec) {
  if (!spec.startsWith('.')) return undefined;
  const base = path.resolve(path.dirname(from), spec);
  for (const c of [base.replace(/\.js$/, '.ts'), base.replace(/\.mjs$/, '.mts'), base, `${base}.ts`]) {
    if (fs.existsSync(c) && fs.statSync(c).isFile()) return c;
  }
  return undefined;
}

function specifierFor(fromFile, toFile) {
  let rel = path.relative(path.dirname(fromFile), toFile).split(path.sep).join('/');
  if (!rel.startsWith('.')) rel = `./${rel}`;
  return rel.replace(/\.ts$/, '.js').replace(/\.mts$/, '.mjs');
}

const listFile = process.argv[2];
if (!listFile) {
  console.error('usage: node scripts/move-modules.mjs <moves.txt>');
  process.exit(2);
}
const moves = new Map();
for (const line of fs.readFileSync(listFile, 'utf8').split('\n')) {
  const t = line.replace(/#.*/, '').trim();
  if (!t) continue;
  const [from, to] = t.split(/\s+/);
  const abs = path.resolve(ROOT, from);
  if (!fs.existsSync(abs)) throw new Error(`${from} does not exist`);
  moves.set(abs, path.resolve(ROOT, to));
}
const where = (f) => moves.get(f) ?? f;

const files = sources(ROOT);
let rewritten = 0;
for (const file of files) {
  const text = fs.readFileSync(file, 'utf8');
  const info = ts.preProcessFile(text, true, true);
  const edits = [];
  for (const ref of info.importedFiles) {
    const target = resolveSpecifier(file, ref.fileName);
    if (!target) continue;
    const next = specifierFor(where(file), where(target));
    // ref.pos is the opening quote's offset, the specifier follows it
    const at = text.indexOf(ref.fileName, ref.pos);
    if (next !== ref.fileName) edits.push({ pos: at, end: at + ref.fileName.length, text: next });
  }
  if (!edits.length) continue;
  let out = text;
  for (const e of edits.sort((a, b) => b.pos - a.pos)) out = out.slice(0, e.pos) + e.text + out.slice(e.end);
  fs.writeFileSync(file, out);
  rewritten++;
}
for (const [from, to] of moves) {
  fs.mkdirSync(path.dirname(to), { recursive: true });
  execFileSync('git', ['mv', from, to], { cwd: ROOT });
}
console.log(`moved ${moves.size} files, rewrote imports in ${rewritten}`);

// text that names a moved file by its whole path (comments, docs) is rewritten too
const textFiles = execFileSync('git', ['ls-files'], { cwd: ROOT, encoding: 'utf8' })
  .split('\n')
  .filter((f) => f && /\.(ts|mts|mjs|js|md|json|yaml|yml|sh)$|^\.ci\//.test(f) && !f.endsWith('package-lock.json'));
const escapeRe = (x) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
const renames = [...moves].map(([from, to]) => [
  new RegExp(`(?<![\\w/.-])${escapeRe(path.relative(ROOT, from))}(?![\\w/])`, 'g'),
  path.relative(ROOT, to),
]);
let mentions = 0;
for (const f of textFiles) {
  const abs = path.join(ROOT, f);
  if (!fs.existsSync(abs)) continue;
  const text = fs.readFileSync(abs, 'utf8');
  let out = text;
  for (const [re, to] of renames) out = out.replace(re, to);
  if (out !== text) {
    fs.writeFileSync(abs, out);
    mentions++;
  }
}
console.log(`rewrote whole-path mentions in ${mentions} files`);

// what a string still names: each old path without its extension, as a reader would write it
const olds = [...moves.keys()].map((f) => path.relative(ROOT, f).replace(/\.ts$/, ''));
let named = '';
try {
  named = execFileSync('git', ['grep', '-n', '-F', ...olds.flatMap((o) => ['-e', o])], { cwd: ROOT, encoding: 'utf8' });
} catch {
  // git grep exits 1 when nothing matches
}
process.stdout.write(named);
