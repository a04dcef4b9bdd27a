/**
 * `herald audit ls|export|verify` (docs/access.md, "Audit trail"; docs/cli.md). `ls` and `export`
 * ask the API like every operator command. `verify` does not ask any controller: it reads the
 * trail straight from the database (`--db`, read only, in one snapshot) or from an export
 * (`--file`), and checks it with the controllers' public keys alone (`<pki>/wake-signing.jwks`,
 * less the kids revoked.json revokes), so a controller, or whoever can write its database,
 * cannot vouch for the trail it holds. Any problem exits 1 with its code.
 */
import fs from 'node:fs';
import readline from 'node:readline';
import type { Command } from 'commander';
import { AuditVerifier, type AuditChainRow, type AuditReport } from '../../protocol/audit-chain.js';
import { ConfigError, HeraldError } from '../../protocol/errors.js';
import { KeySet } from '../../protocol/jws.js';
import { AUDIT_PAGE_ENTRIES } from '../../protocol/limits.js';
import { pkiPaths } from '../../certs/paths.js';
import { parseRevoked } from '../../certs/revoked.js';
import { leaf, out, printJson, withClient, withConnectionOptions, type CommonOptions } from './commands.js';
import { parsePositiveInt, table } from './format.js';

interface VerifyOptions extends CommonOptions {
  db?: string;
  file?: string;
  jwks?: string;
  revoked?: string;
}

interface AuditItem {
  seq: number;
  at: string;
  who: string;
  action: string;
  target: string;
  outcome: string;
}

export function registerAuditCommands(program: Command): void {
  const audit = withConnectionOptions(
    program
      .command('audit')
      .description('the audit trail: list it, export it as JSON lines, verify its hash chain and signatures'),
  );
  leaf(audit, 'ls', 'list the newest audit rows, newest first', [
    'herald audit ls --limit 20',
    'herald audit ls --before 1200',
  ])
    .option('--limit <n>', 'rows at most (default 100, at most 1000)')
    .option('--before <seq>', 'rows before this seq (the next page back)')
    .action((o: { limit?: string; before?: string }, cmd: Command) => {
      const q = new URLSearchParams();
      if (o.limit !== undefined) q.set('limit', String(parsePositiveInt(o.limit, '--limit')));
      if (o.before !== undefined) q.set('before', String(parsePositiveInt(o.before, '--before')));
      return withClient(cmd, async (client, c) => {
        const body = await client.get<{ items: AuditItem[] }>(`/v1/audit${q.size > 0 ? `?${q}` : ''}`);
        if (c.json) return printJson(c, body);
        out(
          c,
          table(
            ['SEQ', 'AT', 'WHO', 'ACTION', 'TARGET', 'OUTCOME'],
            body.items.map((a) => [a.seq, a.at, a.who, a.action, a.target, a.outcome]),
          ),
        );
      });
    });
  leaf(audit, 'export', "write the whole trail as JSON lines, with each row's hashes", [
    'herald audit export --out trail.jsonl',
    'herald audit verify --file trail.jsonl --pki pki',
  ])
    .option('--out <file>', 'write to this file (default: standard output)')
    .action((o: { out?: string }, cmd: Command) =>
      withClient(cmd, async (client) => {
        const sink = o.out === undefined ? process.stdout : fs.createWriteStream(o.out, { mode: 0o600 });
        try {
          await client.download('/v1/audit?format=jsonl', sink);
        } finally {
          if (sink !== process.stdout) await new Promise((resolve) => (sink as fs.WriteStream).end(resolve));
        }
      }),
    );
  leaf(
    audit,
    'verify',
    "recompute the hash chain and check every checkpoint's signature; report an edited, deleted or reordered row by seq",
    [
      'herald audit verify --db herald.db --pki pki',
      'herald audit verify --db postgres://herald@db:5432/herald --pki pki',
      'herald audit verify --file trail.jsonl --jwks wake-signing.jwks',
    ],
  )
    .option(
      '--db <file|url>',
      'read the trail from this database (SQLite file of a stopped controller, or postgres://…)',
    )
    .option('--file <file>', 'read the trail from an export (herald audit export)')
    .option('--jwks <file>', "the controllers' public keys (default <pki>/wake-signing.jwks)")
    .option('--revoked <file>', 'signing key ids not to trust (default <pki>/revoked.json, when it exists)')
    .addHelpText(
      'after',
      "\nExit status: 0 when the trail verifies; 1 with the first problem's code (audit_row_edited,\naudit_row_deleted, audit_row_reordered, audit_checkpoint_invalid, audit_chain_rewritten,\naudit_unanchored) after every problem is listed, each with its seq.\n",
    )
    .action((_o: unknown, cmd: Command) => verify(cmd.optsWithGlobals<VerifyOptions>()));
}

async function verify(o: VerifyOptions): Promise<void> {
  if ((o.db === undefined) === (o.file === undefined))
    throw new ConfigError('give exactly one of --db (a database) and --file (an export)', { field: 'db' });
  const keys = loadKeys(o);
  const source =
    o.db !== undefined
      ? await (await import('../../controller/store/audit-reader.js')).openAuditSource(o.db)
      : fileSource(o.file!);
  let report: AuditReport;
  try {
    const head = await source.head();
    const v = new AuditVerifier({ keys, head });
    for (let at = 0; ; ) {
      const page = await source.rows(at, AUDIT_PAGE_ENTRIES);
      if (page.length === 0) break;
      for (const r of page) v.add(r);
      at = page[page.length - 1]!.seq;
    }
    report = v.finish();
  } finally {
    await source.close();
  }
  if (o.json) {
    const { anchoredThrough, unanchoredRows, ...rest } = report;
    printJson(o, { ...rest, anchored_through: anchoredThrough, unanchored_rows: unanchoredRows });
  } else {
    const c = report.checkpoints;
    const span = report.first === null ? 'no rows' : `${report.rows} rows, seq ${report.first}..${report.last}`;
    const signed =
      report.anchoredThrough === null
        ? 'no trusted checkpoint'
        : `signed through seq ${report.anchoredThrough}${report.unanchoredRows > 0 ? ` (${report.unanchoredRows} row${report.unanchoredRows === 1 ? '' : 's'} after it not yet)` : ''}`;
    out(
      o,
      `audit trail: ${span}; checkpoints: ${c.trusted} trusted, ${c.untrusted} by other keys, ${c.invalid} invalid; ${signed}\n`,
    );
    for (const p of report.problems) out(o, `seq ${p.seq}: ${p.code}: ${p.message}\n`);
    if (report.ok) out(o, 'the audit trail verifies\n');
  }
  const first = report.problems[0];
  if (first !== undefined)
    throw new HeraldError(
      first.code,
      `${report.problems.length} problem(s) in the audit trail, the first at seq ${first.seq}: ${first.message}`,
    );
}

/** The controllers' public keys: the JWKS, less the kids revoked.json revokes. @throws ConfigError */
function loadKeys(o: VerifyOptions): KeySet {
  const p = pkiPaths(o.pki ?? process.env.HERALD_PKI ?? 'pki');
  const jwksFile = o.jwks ?? p.jwks;
  let jwks: unknown;
  try {
    jwks = JSON.parse(fs.readFileSync(jwksFile, 'utf8'));
  } catch (err) {
    throw new ConfigError(`--jwks ${jwksFile}: ${(err as Error).message}`, {
      cause: err,
      field: 'jwks',
      code: (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'pki_missing' : 'bad_option',
    });
  }
  const revokedFile = o.revoked ?? p.revoked;
  let kids: string[] = [];
  if (o.revoked !== undefined || fs.existsSync(revokedFile)) {
    try {
      kids = parseRevoked(fs.readFileSync(revokedFile), revokedFile).kids;
    } catch (err) {
      throw new ConfigError(`--revoked ${revokedFile}: ${(err as Error).message}`, { cause: err, field: 'revoked' });
    }
  }
  try {
    return new KeySet(jwks, kids);
  } catch (err) {
    throw new ConfigError(`--jwks ${jwksFile}: ${(err as Error).message}`, { cause: err, field: 'jwks' });
  }
}

/** An export read line by line: its `head` line, then its rows (in the order written: ascending seq). */
function fileSource(file: string): {
  head(): Promise<{ seq: number; hash: string } | null>;
  rows(afterSeq: number, limit: number): Promise<AuditChainRow[]>;
  close(): Promise<void>;
} {
  let input: fs.ReadStream;
  try {
    fs.accessSync(file, fs.constants.R_OK);
    input = fs.createReadStream(file);
  } catch (err) {
    throw new ConfigError(`--file ${file}: ${(err as Error).message}`, { cause: err, field: 'file' });
  }
  const lines = readline.createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY })[Symbol.asyncIterator]();
  let n = 0;
  const next = async (): Promise<Record<string, unknown> | undefined> => {
    for (;;) {
      const l = await lines.next();
      if (l.done) return undefined;
      n++;
      if (l.value.trim() === '') continue;
      try {
        const v = JSON.parse(l.value) as unknown;
        if (v !== null && typeof v === 'object' && !Array.isArray(v)) return v as Record<string, unknown>;
      } catch {
        // reported below
      }
      throw new ConfigError(`--file ${file}: line ${n} is not a JSON object`, { field: 'file' });
    }
  };
  let pending: Record<string, unknown> | undefined;
  return {
    async head() {
      const first = await next();
      if (first?.kind === 'head' && Number.isSafeInteger(first.seq) && typeof first.hash === 'string')
        return { seq: first.seq as number, hash: first.hash };
      pending = first;
      return null; // an export without its head line: the rows alone are checked
    },
    async rows(_afterSeq, limit) {
      const page: AuditChainRow[] = [];
      while (page.length < limit) {
        const v = pending ?? (await next());
        pending = undefined;
        if (v === undefined) break;
        if (v.kind !== 'row' || !isRow(v))
          throw new ConfigError(`--file ${file}: line ${n} is not an audit row of an export`, { field: 'file' });
        const { kind: _kind, ...row } = v;
        page.push(row as unknown as AuditChainRow);
      }
      return page;
    },
    async close() {
      input.destroy();
    },
  };
}

function isRow(v: Record<string, unknown>): boolean {
  const str = (k: string) => typeof v[k] === 'string';
  return (
    Number.isSafeInteger(v.seq) &&
    ['at', 'who', 'action', 'target', 'outcome', 'prev_hash', 'hash'].every(str) &&
    (v.detail === null || str('detail')) &&
    (v.controller === null || str('controller'))
  );
}
