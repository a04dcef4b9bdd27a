#!/usr/bin/env node
/**
 * Applies one guard to the `postgres` client (3.4.9) after `npm ci`: `nextWrite` may run from a
 * setImmediate after the connection closed and its socket is null; unguarded it throws a
 * TypeError nobody can catch and the controller process dies when PostgreSQL goes away
 * (porsager/postgres#1154, #1066, #1208; the guard is PR #1176/#1168, not released yet). With
 * the guard the pending bytes are dropped, as the query they belonged to was already rejected
 * with CONNECTION_CLOSED. Idempotent; fails loudly if the file is not the one it knows, so an
 * upgrade of the client makes someone look again.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'node_modules', 'postgres');
const BEFORE = '  function nextWrite(fn) {\n    const x = socket.write(chunk, fn)';
const AFTER =
  '  function nextWrite(fn) {\n    if (socket === null) { // herald: guard from porsager/postgres#1176\n      nextWriteTimer !== null && clearImmediate(nextWriteTimer)\n      chunk = nextWriteTimer = null\n      return false\n    }\n    const x = socket.write(chunk, fn)';

if (!fs.existsSync(root)) process.exit(0); // not installed (a production install of the agent alone)
for (const file of ['src/connection.js', 'cjs/src/connection.js', 'cf/src/connection.js']) {
  const p = path.join(root, file);
  if (!fs.existsSync(p)) continue;
  const text = fs.readFileSync(p, 'utf8');
  if (text.includes(AFTER)) continue;
  if (!text.includes(BEFORE)) {
    console.error(`patch-postgres: ${p} is not the postgres 3.4.9 this guard was written for; check the upstream fix`);
    process.exit(1);
  }
  fs.writeFileSync(p, text.replace(BEFORE, AFTER));
}
