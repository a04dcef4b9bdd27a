/**
 * The audit trail of three controllers writing at once on one PostgreSQL (docs/access.md "Audit
 * trail"), all real processes started through the testbed: one chain, numbered without a gap in
 * commit order whichever controller wrote a row, signed by their checkpoints; `herald audit
 * verify` (reading the database itself) passes on it while they run and after they stop, passes
 * on an export taken through the API, and reports an edited, a deleted and a reordered row of a
 * copy of the database changed with SQL directly.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { controllerNames, makeFleet, nodeNames, type TestFleet } from '../helpers/fleet.js';
import { keepFleetLogs } from '../helpers/fleet-logs.js';
import { api, heraldSync, isBuilt, stopProc, waitFor } from '../helpers/procs.js';

const CONTROLLERS = controllerNames(3);
let f: TestFleet;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  f = await makeFleet(CONTROLLERS, nodeNames(1));
  await Promise.all(CONTROLLERS.map((c) => f.startController(c, { args: ['--audit-checkpoint-interval', '1s'] })));
}, 120_000);

beforeEach(({ onTestFailed, task }) => {
  onTestFailed(async () => {
    await keepFleetLogs(f, task.name);
  }, 60_000);
});

afterAll(async () => {
  await f?.cleanup();
});

/** `herald audit verify` on `db`: its exit code, and every problem line as [code, seq]. */
function verify(
  db: string,
  ...more: string[]
): { code: number | null; problems: Array<[string, number]>; out: string; err: string } {
  const r = heraldSync(['audit', 'verify', '--pki', f.pki, '--db', db, ...more]);
  const problems = [...r.out.matchAll(/^seq (\d+): (audit_[a-z_]+):/gm)].map((m): [string, number] => [
    m[2]!,
    Number(m[1]),
  ]);
  return { code: r.code, problems, out: r.out, err: r.err };
}

/** A copy of the fleet's database (no one may be connected to it), changed by `sql`; resolves to its URL. */
async function editedCopy(name: string, sql: string): Promise<string> {
  const { default: postgres } = await import('postgres');
  const admin = postgres(f.pg.url, { max: 1, onnotice: () => {} });
  const source = new URL(f.db).pathname.slice(1);
  try {
    await admin.unsafe(`CREATE DATABASE ${name} TEMPLATE ${source}`);
  } finally {
    await admin.end({ timeout: 1 });
  }
  const u = new URL(f.db);
  u.pathname = `/${name}`;
  const copy = postgres(u.toString(), { max: 1, onnotice: () => {} });
  try {
    await copy.unsafe(sql);
  } finally {
    await copy.end({ timeout: 1 });
  }
  return u.toString();
}

type Row = { seq: number; action: string; controller: string | null; outcome: string };

describe('the audit trail of three controllers on one PostgreSQL', { timeout: 150_000 }, () => {
  it('three controllers writing at once leave one chain without a gap, and herald audit verify passes on it while they run', async () => {
    const ports = CONTROLLERS.map((c) => f.controllers.get(c)!.port);
    const at = (i: number) => ports[i % ports.length]!;
    const nodes = await Promise.all(
      Array.from({ length: 30 }, (_, i) => api(at(i), f.op, 'POST', '/v1/nodes', { id: `x${i}` })),
    );
    expect(nodes.map((r) => r.status)).toEqual(nodes.map(() => 201));
    const configs = await Promise.all(
      Array.from({ length: 9 }, (_, i) =>
        api(at(i), f.op, 'POST', '/v1/configs', { name: `c${i}`, group: 'script', config: '#!/bin/sh\n' }),
      ),
    );
    expect(configs.map((r) => r.status)).toEqual(configs.map(() => 201));
    const deployments = await Promise.all(
      Array.from({ length: 30 }, (_, i) =>
        api(at(i + 1), f.op, 'POST', '/v1/deployments', { node: `x${i}`, config_id: configs[i % 9]!.json.id }),
      ),
    );
    expect(deployments.map((r) => r.status)).toEqual(deployments.map(() => 201));
    // refusals are rows of the chain too
    const again = await Promise.all(ports.map((p) => api(p, f.op, 'POST', '/v1/nodes', { id: 'x0' })));
    expect(again.map((r) => r.status)).toEqual([409, 409, 409]);

    // one line: every seq from the first to the last, rows of each controller among them
    const rows = await waitFor(
      'a checkpoint after the last change',
      async () => {
        const r = (await api(ports[0]!, f.op, 'GET', '/v1/audit?limit=1000')).json.items as Row[];
        return r[0]?.action === 'audit.checkpoint' ? r : null;
      },
      30_000,
      100,
    );
    const seqs = rows.map((r) => r.seq).sort((a, b) => a - b);
    expect(seqs).toEqual(Array.from({ length: seqs.length }, (_, i) => i + 1));
    for (const c of CONTROLLERS) {
      expect(
        rows.some((r) => r.controller === c && r.action === 'POST /v1/nodes'),
        c,
      ).toBe(true);
    }
    expect(rows.filter((r) => r.action === 'POST /v1/nodes' && r.outcome === 'node_exists')).toHaveLength(3);
    expect(rows.filter((r) => r.action === 'deployment.create')).toHaveLength(30);

    const running = verify(f.db);
    expect(running.problems).toEqual([]);
    expect(running.code).toBe(0);
    expect(running.out).toMatch(/the audit trail verifies/);
  });

  it('an export through the API (herald audit export) verifies on its own', () => {
    const file = path.join(f.work, 'trail.jsonl');
    const c2 = f.controllers.get('c2')!;
    const exp = heraldSync([
      'audit',
      'export',
      '--out',
      file,
      '--controller',
      c2.url,
      '--controller-id',
      'c2',
      '--pki',
      f.pki,
    ]);
    expect(exp.code, exp.err).toBe(0);
    const lines = fs.readFileSync(file, 'utf8').trim().split('\n');
    expect(JSON.parse(lines[0]!)).toMatchObject({ kind: 'head' });
    expect(lines.length).toBeGreaterThan(100);
    const r = heraldSync(['audit', 'verify', '--file', file, '--pki', f.pki]);
    expect(r.out).toMatch(/the audit trail verifies/);
    expect(r.code).toBe(0);
  });

  it('after they stop, herald audit verify passes, and reports an edited, a deleted and a reordered row of copies changed with SQL', async () => {
    await Promise.all(CONTROLLERS.map((c) => stopProc(f.controllers.get(c)!.proc)));
    const clean = verify(f.db);
    expect(clean.problems).toEqual([]);
    expect(clean.code).toBe(0);

    const edited = verify(await editedCopy('audit_edited', `UPDATE audit SET detail = '{"node":"x99"}' WHERE seq = 5`));
    expect(edited.problems).toEqual([['audit_row_edited', 5]]);
    expect(edited.code).toBe(1);
    expect(edited.err).toMatch(/^herald: audit_row_edited: /);

    const deleted = verify(await editedCopy('audit_deleted', 'DELETE FROM audit WHERE seq = 9'));
    expect(deleted.problems).toEqual([['audit_row_deleted', 9]]);
    expect(deleted.code).toBe(1);
    expect(deleted.err).toMatch(/^herald: audit_row_deleted: /);

    // PostgreSQL's seq is an identity column, which an UPDATE cannot set: two rows' contents swapped
    const reordered = verify(
      await editedCopy(
        'audit_reordered',
        `CREATE TEMP TABLE t AS SELECT * FROM audit WHERE seq IN (12, 13);
         UPDATE audit a SET at = t.at, who = t.who, action = t.action, target = t.target, detail = t.detail,
           outcome = t.outcome, controller = t.controller, prev_hash = t.prev_hash, hash = t.hash
         FROM t WHERE a.seq IN (12, 13) AND t.seq = 25 - a.seq`,
      ),
    );
    expect(reordered.problems).toEqual([
      ['audit_row_reordered', 12],
      ['audit_row_reordered', 13],
    ]);
    expect(reordered.code).toBe(1);
    expect(reordered.err).toMatch(/^herald: audit_row_reordered: /);
  });
});
