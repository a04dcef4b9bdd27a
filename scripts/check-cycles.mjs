#!/usr/bin/env node
/**
 * Fails (exit 1) when any TypeScript module of the project imports itself through others, or
 * imports across a folder rule (FOLDER_RULES below: what a folder may not import).
 * Edges come from TypeScript's own pre-processor (ts.preProcessFile), so comments and strings
 * never count and every form does: `import`, `import type`, `export … from`, `import()` and
 * `require()`. Only relative specifiers are followed (`./x.js` is `./x.ts`); packages are not
 * ours. Circles are the strongly connected components of that graph (Tarjan), each printed
 * with one path around it. Run from anywhere: it reads the tree it lives in.
 *
 *   node scripts/check-cycles.mjs [--types=false] [--root=<dir>]
 *   (--types=false: leave `import type` out; --root: check that tree instead of this one)
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const rootArg = process.argv.find((a) => a.startsWith('--root='));
// --root=<dir>: check another tree (the script's own test builds small ones)
const ROOT = rootArg
  ? path.resolve(rootArg.slice('--root='.length))
  : path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
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

/**
 * What each folder may not import (docs/architecture.md says why). A rule applies to every
 * module under `from`; `except` lists folders under it that the rule leaves out. Type-only
 * imports count: a type is a dependency of the reader's mind too.
 */
const FOLDER_RULES = [
  {
    from: 'protocol/',
    deny: ['agent/', 'controller/', 'certs/', 'cli/', 'bench/', 'test/', 'scripts/'],
    why: 'the wire contract is pure and imports nothing of ours',
  },
  {
    from: 'certs/',
    deny: ['agent/', 'controller/', 'cli/', 'bench/', 'test/'],
    why: 'the PKI serves every process and knows none',
  },
  {
    from: 'agent/',
    deny: ['controller/', 'cli/', 'bench/', 'test/'],
    why: 'the agent and the controller never import each other',
  },
  {
    from: 'controller/',
    deny: ['agent/', 'cli/', 'bench/', 'test/'],
    why: 'the agent and the controller never import each other',
  },
  { from: 'cli/', deny: ['bench/', 'test/'], why: 'the product does not depend on its benchmarks or tests' },
  {
    from: 'cli/testbed/',
    deny: ['agent/', 'controller/', 'cli/demo/', 'cli/operator/'],
    why: 'the testbed starts Herald through bin/herald as an operator would, and reaches inside no process',
  },
  {
    from: 'controller/model/',
    deny: [
      'controller/api/',
      'controller/service/',
      'controller/store/',
      'controller/push/',
      'controller/fleet/',
      'controller/clusters/',
      'controller/heat/',
    ],
    why: "records and Heat's rules are pure: everything may use them, they use nothing",
  },
  {
    from: 'controller/store/',
    deny: ['controller/api/', 'controller/service/', 'controller/push/', 'controller/fleet/', 'controller/heat/'],
    why: 'persistence only: the operations call the store, never the reverse',
  },
  {
    from: 'controller/push/',
    deny: [
      'controller/api/',
      'controller/service/',
      'controller/store/',
      'controller/fleet/',
      'controller/clusters/',
      'controller/heat/',
    ],
    why: 'the push connections carry what they are handed; they read no store and run no operation',
  },
  {
    from: 'controller/clusters/',
    deny: ['controller/api/', 'controller/service/', 'controller/push/', 'controller/fleet/', 'controller/heat/'],
    why: 'the cluster engine runs on its narrow transaction interface',
  },
  {
    from: 'controller/access/',
    deny: [
      'controller/api/',
      'controller/service/',
      'controller/push/',
      'controller/fleet/',
      'controller/clusters/',
      'controller/heat/',
    ],
    why: 'the access policy decides on what the store holds; the edge asks it, it calls no operation',
  },
  {
    from: 'controller/service/',
    deny: ['controller/api/', 'controller/heat/', 'controller/access/'],
    why: 'the HTTPS edges call the operations, not the reverse',
  },
  {
    from: 'controller/heat/',
    deny: [
      'controller/api/',
      'controller/push/',
      'controller/fleet/',
      'controller/clusters/',
      'controller/store/sqlite/',
      'controller/store/pg/',
    ],
    why: "the object store Heat calls is an edge of its own: it uses the operations (service/heat.ts), not the API edge, a store's dialect or the push connections",
  },
  {
    from: 'controller/api/',
    deny: ['controller/heat/'],
    why: "the API and Heat's object store are two edges side by side",
  },
];

const violations = [];
for (const [f, targets] of edges) {
  const from = rel(f);
  for (const rule of FOLDER_RULES) {
    if (!from.startsWith(rule.from) || rule.except?.some((e) => from.startsWith(e))) continue;
    for (const t of targets) {
      const to = rel(t);
      if (rule.deny.some((d) => to.startsWith(d))) violations.push(`${from} imports ${to}: ${rule.from} ${rule.why}`);
    }
  }
}
for (const v of violations) console.log(`folder rule broken: ${v}`);
console.log(
  `check-cycles: ${files.length} modules, ${components.length} import circle(s), ${violations.length} folder rule(s) broken${withTypes ? '' : ' (type-only imports left out)'}`,
);
process.exit(components.length > 0 || violations.length > 0 ? 1 : 0);
