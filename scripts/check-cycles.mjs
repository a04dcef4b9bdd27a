#!/usr/bin/env node
/**
 * Fails (exit 1) when any TypeScript module of the project imports itself through others.
 * Edges come from TypeScript's own pre-processor (ts.preProcessFile), so comments and strings
 * never count and every form does: `import`, `import type`, `export … from`, `import()` and
 * `require()`. Only relative specifiers are followed (`./x.js` is `./x.ts`); packages are not
 * ours. Circles are the strongly connected components of that graph (Tarjan), each printed
 * with one path around it. Run from anywhere: it reads the tree it lives in.
 *
 *   node scripts/check-cycles.mjs [--types=false]   (--types=false: leave `import type` out)
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SKIP_DIRS = new Set(['node_modules', 'dist', '.git', 'coverage', 'tmp']);
const withTypes = !process.argv.includes('--types=false');

function sources(dir, out = []) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    if (e.name.startsWith('.') || SKIP_DIRS.has(e.name)) continue;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) sources(p, out);
    else if (/\.(c|m)?tsx?$/.test(e.name) && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/** The module file a relative specifier names, if it is one of ours. */
function resolve(from, spec) {
  const base = path.resolve(path.dirname(from), spec);
  const stem = base.replace(/\.(c|m)?js$/, '');
  for (const c of [base, `${stem}.ts`, `${stem}.tsx`, `${stem}.mts`, `${stem}.cts`, path.join(base, 'index.ts')]) {
    if (fs.existsSync(c) && fs.statSync(c).isFile()) return c;
  }
  return undefined;
}

/** `import type …` and `export type … from` statements, which preProcessFile reports like any import. */
function typeOnlySpecifiers(file, text) {
  const specs = new Set();
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, false);
  for (const st of sf.statements) {
    const typeOnly =
      (ts.isImportDeclaration(st) && st.importClause?.isTypeOnly) || (ts.isExportDeclaration(st) && st.isTypeOnly);
    if (typeOnly && st.moduleSpecifier && ts.isStringLiteral(st.moduleSpecifier)) specs.add(st.moduleSpecifier.text);
  }
  return specs;
}

const files = sources(ROOT);
const edges = new Map();
for (const f of files) {
  const text = fs.readFileSync(f, 'utf8');
  const info = ts.preProcessFile(text, true, true);
  const skip = withTypes ? new Set() : typeOnlySpecifiers(f, text);
  const to = new Set();
  for (const { fileName } of info.importedFiles) {
    if (!fileName.startsWith('.') || skip.has(fileName)) continue;
    const t = resolve(f, fileName);
    if (t && t !== f) to.add(t);
    else if (t === f) to.add(f); // a module importing itself is a circle of one
  }
  edges.set(f, to);
}

// Tarjan's strongly connected components, iteratively (a deep tree must not overflow the stack)
let next = 0;
const index = new Map();
const low = new Map();
const onStack = new Set();
const stack = [];
const components = [];
for (const start of files) {
  if (index.has(start)) continue;
  const work = [{ v: start, it: edges.get(start).values() }];
  index.set(start, next);
  low.set(start, next);
  next++;
  stack.push(start);
  onStack.add(start);
  while (work.length > 0) {
    const top = work[work.length - 1];
    const step = top.it.next();
    if (!step.done) {
      const w = step.value;
      if (!index.has(w)) {
        index.set(w, next);
        low.set(w, next);
        next++;
        stack.push(w);
        onStack.add(w);
        work.push({ v: w, it: edges.get(w).values() });
      } else if (onStack.has(w)) {
        low.set(top.v, Math.min(low.get(top.v), index.get(w)));
      }
      continue;
    }
    work.pop();
    if (work.length > 0) {
      const parent = work[work.length - 1].v;
      low.set(parent, Math.min(low.get(parent), low.get(top.v)));
    }
    if (low.get(top.v) === index.get(top.v)) {
      const comp = [];
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        comp.push(w);
      } while (w !== top.v);
      if (comp.length > 1 || edges.get(top.v).has(top.v)) components.push(comp);
    }
  }
}

/** One path around a component, from its first file (breadth-first, inside the component). */
function loopOf(comp) {
  const inside = new Set(comp);
  const first = [...comp].sort()[0];
  const prev = new Map([[first, null]]);
  const queue = [first];
  while (queue.length > 0) {
    const v = queue.shift();
    for (const w of edges.get(v)) {
      if (w === first) {
        const loop = [first];
        for (let x = v; x !== first; x = prev.get(x)) loop.splice(1, 0, x);
        return [...loop, first];
      }
      if (inside.has(w) && !prev.has(w)) {
        prev.set(w, v);
        queue.push(w);
      }
    }
  }
  return [first, first];
}

const rel = (f) => path.relative(ROOT, f);
for (const comp of components) {
  console.log(`import circle among ${comp.length} module(s): ${loopOf(comp).map(rel).join(' -> ')}`);
}
console.log(
  `check-cycles: ${files.length} modules, ${components.length} import circle(s)${withTypes ? '' : ' (type-only imports left out)'}`,
);
process.exit(components.length > 0 ? 1 : 0);
