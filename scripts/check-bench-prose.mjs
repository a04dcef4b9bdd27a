#!/usr/bin/env node
/**
 * Fails (exit 1) when the benchmark's code carries narrative prose: BENCHMARKS.md's numbers are
 * generated, its words are written by people (in its kept sections, or docs/performance.md).
 * Two rules, over every bench/*.ts, read with TypeScript's own parser (comments never count):
 *
 * - no string or template literal holds more than MAX_FIXED characters of fixed text (a
 *   template's `${…}` parts left out): a label, a header or a figure with its few words fit;
 *   a paragraph does not (a table row, `|…`, is column labels and figures: not counted);
 * - no MAX_RUN or more lines of fixed English are emitted one after the other: consecutive
 *   statements `p(…)` / `L.push(…)` (or any other call whose arguments are all text) each
 *   carrying a literal of at least MIN_LINE fixed characters a part (emittedLines).
 *
 *   node scripts/check-bench-prose.mjs [files…]   (default: bench/*.ts of this tree)
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const MAX_FIXED = 160;
export const MAX_RUN = 3;
export const MIN_LINE = 40;

/** The fixed text of a string-like node, or null when the node is not one. */
function fixedText(node) {
  if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) return node.text;
  if (ts.isTemplateExpression(node)) return node.head.text + node.templateSpans.map((s) => s.literal.text).join('');
  return null;
}

/**
 * The prose lines a statement emits: the literal arguments of a call statement (`p('…')`) with at
 * least MIN_LINE fixed characters for each part of it (the text around each `${…}`): a line with a
 * figure every few words is a figure line, not prose. Table rows (`|…`) are not prose.
 */
function emittedLines(stmt) {
  if (!ts.isExpressionStatement(stmt) || !ts.isCallExpression(stmt.expression)) return [];
  const args = stmt.expression.arguments;
  if (args.length === 0 || args.some((a) => fixedText(a) === null)) return [];
  return args.filter((a) => {
    const t = fixedText(a);
    const parts = ts.isTemplateExpression(a) ? a.templateSpans.length + 1 : 1;
    return t.length / parts >= MIN_LINE && !t.trimStart().startsWith('|');
  });
}

export function check(file, text = fs.readFileSync(file, 'utf8')) {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.ES2022, true, ts.ScriptKind.TS);
  const problems = [];
  const where = (node) => {
    const { line } = sf.getLineAndCharacterOfPosition(node.getStart(sf));
    return `${path.relative(ROOT, file)}:${line + 1}`;
  };
  const visit = (node) => {
    const t = fixedText(node);
    if (t !== null && t.length > MAX_FIXED && !t.trimStart().startsWith('|')) {
      problems.push(
        `${where(node)}: a literal of ${t.length} fixed characters (at most ${MAX_FIXED}): "${t.slice(0, 60)}…"`,
      );
      return;
    }
    if (ts.isBlock(node) || ts.isSourceFile(node) || ts.isCaseClause(node) || ts.isDefaultClause(node)) {
      let run = [];
      const flush = () => {
        const lines = run.flatMap((s) => emittedLines(s));
        if (lines.length >= MAX_RUN)
          problems.push(`${where(run[0])}: ${lines.length} lines of fixed text in a row (at most ${MAX_RUN - 1})`);
        run = [];
      };
      for (const s of node.statements) {
        if (emittedLines(s).length > 0) run.push(s);
        else flush();
      }
      flush();
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return problems;
}

function benchFiles() {
  const dir = path.join(ROOT, 'bench');
  return fs
    .readdirSync(dir)
    .filter((n) => n.endsWith('.ts') && !n.endsWith('.d.ts'))
    .map((n) => path.join(dir, n));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const files = process.argv.length > 2 ? process.argv.slice(2).map((f) => path.resolve(f)) : benchFiles();
  const problems = files.flatMap((f) => check(f));
  for (const p of problems) process.stderr.write(`${p}\n`);
  if (problems.length > 0) {
    process.stderr.write(
      `${problems.length} place(s) in bench/ carry prose: generate the figures, and write the words in BENCHMARKS.md's kept sections or docs/performance.md\n`,
    );
    process.exit(1);
  }
}
