// Prints (or with --write, rewrites in docs/errors.md) the error-code table from protocol/errors.ts.
// Run after `npm run build`.
import fs from 'node:fs';
import { ERROR_CODES } from '../dist/protocol/errors.js';
const rows = [
  '| code | meaning |',
  '|---|---|',
  ...Object.entries(ERROR_CODES).map(([c, d]) => `| \`${c}\` | ${d.replace(/\|/g, '\\|')} |`),
];
if (process.argv.includes('--write')) {
  const readme = fs.readFileSync('docs/errors.md', 'utf8');
  const re = /(<!-- error-table:start[^\n]*-->\n)[\s\S]*?(\n<!-- error-table:end -->)/;
  if (!re.test(readme)) throw new Error('docs/errors.md has no error-table markers');
  fs.writeFileSync('docs/errors.md', readme.replace(re, `$1${rows.join('\n')}$2`));
} else console.log(rows.join('\n'));
