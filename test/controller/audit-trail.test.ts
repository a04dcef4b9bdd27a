/**
 * The audit trail (docs/access.md "Audit trail") of a real controller on SQLite, run in process,
 * and of PostgreSQL for the migration: what a change's request row holds (hidden values masked,
 * the outcome of a refusal), and `herald audit verify` (bin/herald, reading the database itself)
 * on the untouched file and on copies edited with SQLite directly; pruning; the chaining of the
 * rows a database held before the chain.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AUDIT_GENESIS_HASH, AuditVerifier, type AuditChainRow } from '../../protocol/audit-chain.js';
import { Signer } from '../../protocol/jws.js';
import { AuditCheckpoints } from '../../controller/service/audit-checkpoints.js';
import { MIGRATIONS } from '../../controller/store/sqlite/schema.js';
import { PG_MIGRATIONS } from '../../controller/store/pg/schema.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { memoryLogger, startTestController, type TestController } from '../helpers/controller-harness.js';
import { heraldSync, isBuilt } from '../helpers/procs.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const SECRET = 'hunter2-hidden-value';
const GENEROUS = { burst: 10_000, perS: 10_000 };

let pki: ControllerTestPki;
let op: Cred;
let work: string;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  pki = await makeControllerTestPki();
  op = pki.cred('operator', 'admin');
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-audit-'));
}, 60_000);

afterAll(() => {
  pki?.cleanup();
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

interface Row {
  seq: number;
  who: string;
  action: string;
  target: string;
  outcome: string;
  detail: { request?: { method: string; path: string; body: Record<string, any> }; status?: number } | null;
}

async function rows(t: TestController): Promise<Row[]> {
  const r = await t.req(op, 'GET', '/v1/audit?limit=1000');
  expect(r.status).toBe(200);
  return r.json.items as Row[];
}

/** `herald audit verify` on `db`: its exit code, and every problem line as [code, seq]. */
function verify(db: string): { code: number | null; problems: Array<[string, number]>; out: string; err: string } {
  const r = heraldSync(['audit', 'verify', '--db', db, '--pki', pki.dir]);
  const problems = [...r.out.matchAll(/^seq (\d+): (audit_[a-z_]+):/gm)].map((m): [string, number] => [
    m[2]!,
    Number(m[1]),
  ]);
  return { code: r.code, problems, out: r.out, err: r.err };
}

/** A copy of the database file, changed by `sql` through SQLite directly. */
function editedCopy(db: string, name: string, sql: string): string {
  const copy = path.join(work, name);
  fs.copyFileSync(db, copy);
  const d = new Database(copy);
  d.exec(sql);
  d.close();
  return copy;
}

describe('the audit trail of a controller on SQLite', () => {
  let t: TestController;
  let db: string;
  let cfg: string;
  let dep: string;

  beforeAll(async () => {
    db = path.join(work, 'herald.db');
    t = await startTestController(pki, { db }, { rates: { other: GENEROUS } });
  }, 60_000);

  afterAll(async () => {
    await t?.close();
  });

  it('records each change asked of the API: who, the route, its target, the request with hidden values masked, ok', async () => {
    const c = await t.req(op, 'POST', '/v1/configs', {
      name: 'with-secret',
      group: 'script',
      config: '#!/bin/sh\necho "$name"\n',
      inputs: [
        { name: 'password', hidden: true, default: `${SECRET}-default` },
        { name: 'name', default: 'shown-default' },
      ],
    });
    expect(c.status).toBe(201);
    cfg = c.json.id;
    expect((await t.req(op, 'POST', '/v1/nodes', { id: 'a1' })).status).toBe(201);
    expect((await t.req(op, 'POST', '/v1/nodes', { id: 'a2' })).status).toBe(201);
    const d = await t.req(op, 'POST', '/v1/deployments', {
      node: 'a1',
      config_id: cfg,
      input_values: { password: SECRET, name: 'shown' },
    });
    expect(d.status).toBe(201);
    dep = d.json.id;
    expect(
      (await t.req(op, 'PATCH', `/v1/deployments/${dep}`, { input_values: { password: `${SECRET}-2`, name: 'x' } }))
        .status,
    ).toBe(200);
    const cl = await t.req(op, 'POST', '/v1/clusters', {
      name: 'cl',
      nodes: ['a2'],
      install_config_id: cfg,
      uninstall_config_id: cfg,
      input_values: { password: `${SECRET}-3`, name: 'cluster-shown' },
    });
    expect(cl.status).toBe(201);

    const all = await rows(t);
    const me = pki.spiffe('operator', 'admin');
    const byAction = (a: string) => all.filter((r) => r.action === a);
    const [cfgRow] = byAction('POST /v1/configs');
    expect(cfgRow).toMatchObject({ who: me, target: `/v1/configs/${cfg}`, outcome: 'ok', detail: { status: 201 } });
    expect(cfgRow!.detail!.request!.body.config).toBe('#!/bin/sh\necho "$name"\n');
    expect(cfgRow!.detail!.request!.body.inputs).toEqual([
      { name: 'password', hidden: true, default: '***' },
      { name: 'name', default: 'shown-default' },
    ]);
    const [depRow] = byAction('POST /v1/deployments');
    expect(depRow).toMatchObject({ who: me, target: `/v1/deployments/${dep}`, outcome: 'ok' });
    expect(depRow!.detail!.request!.body).toEqual({
      node: 'a1',
      config_id: cfg,
      input_values: { password: '***', name: 'shown' },
    });
    const [patchRow] = byAction('PATCH /v1/deployments/:id');
    expect(patchRow!.detail!.request).toMatchObject({
      method: 'PATCH',
      path: `/v1/deployments/${dep}`,
      body: { input_values: { password: '***', name: 'x' } },
    });
    const [clusterRow] = byAction('POST /v1/clusters');
    expect(clusterRow!.detail!.request!.body.input_values).toEqual({ password: '***', name: 'cluster-shown' });
    // the change's own rows, written in its transaction, beside the request's
    expect(byAction('deployment.create').map((r) => r.target)).toContain(dep);
    expect(byAction('cluster.create')).toHaveLength(1);
    // and nowhere in the trail, nor in its export
    expect(JSON.stringify(all)).not.toContain(SECRET);
    const exported = await t.req(op, 'GET', '/v1/audit?format=jsonl');
    expect(exported.status).toBe(200);
    expect(exported.headers['content-type']).toMatch(/^application\/jsonl/);
    expect(exported.text).not.toContain(SECRET);
    const lines = exported.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { kind: string } & AuditChainRow);
    expect(lines[0]).toMatchObject({ kind: 'head' });
    expect(lines.slice(1).every((l) => l.kind === 'row' && /^[0-9a-f]{64}$/.test(l.hash))).toBe(true);
    expect(lines[1]!.prev_hash).toBe(AUDIT_GENESIS_HASH);
  });

  it("records a refused change with its code and status: the role's, the body's, the store's", async () => {
    const agent = pki.cred('agent', 'n1');
    expect((await t.req(agent, 'POST', '/v1/configs', { name: 'x', group: 'script', config: 'x' })).status).toBe(403);
    expect((await t.req(op, 'POST', '/v1/nodes', { id: 'a1' })).status).toBe(409);
    expect((await t.req(op, 'POST', '/v1/deployments', { node: 'a1', config_id: cfg, bogus: 1 })).status).toBe(400);
    const busy = await t.req(op, 'DELETE', `/v1/nodes/a2`);
    expect(busy.json.error.code).toBe('node_in_cluster');
    const refused = (await rows(t)).filter((r) => r.outcome !== 'ok');
    const seen = refused.map((r) => [r.who.split('/').slice(-2).join('/'), r.action, r.outcome, r.detail?.status]);
    expect(seen).toEqual(
      expect.arrayContaining([
        ['agent/n1', 'POST /v1/configs', 'wrong_role', 403],
        ['operator/admin', 'POST /v1/nodes', 'node_exists', 409],
        ['operator/admin', 'POST /v1/deployments', 'invalid_request', 400],
        ['operator/admin', 'DELETE /v1/nodes/:id', 'node_in_cluster', 409],
      ]),
    );
    const badBody = refused.find((r) => r.outcome === 'invalid_request')!;
    expect(badBody.detail!.request!.body).toEqual({ node: 'a1', config_id: cfg, bogus: 1 });
    expect(badBody.target).toBe('/v1/deployments');
  });

  it('the list leaves out a detail over AUDIT_LIST_DETAIL_MAX_BYTES, naming its length; the export keeps it whole', async () => {
    const script = `#!/bin/sh\n# ${'x'.repeat(100_000)}\n`;
    const c = await t.req(op, 'POST', '/v1/configs', { name: 'big', group: 'script', config: script });
    expect(c.status).toBe(201);
    const row = (await rows(t)).find(
      (r) => r.action === 'POST /v1/configs' && r.target === `/v1/configs/${c.json.id}`,
    )!;
    expect(row.detail).toBeNull();
    expect((row as unknown as { detail_bytes: number }).detail_bytes).toBeGreaterThan(100_000);
    const line = (await t.req(op, 'GET', '/v1/audit?format=jsonl')).text
      .split('\n')
      .find((l) => l.includes(`"target":"/v1/configs/${c.json.id}"`) && l.includes('POST /v1/configs'))!;
    expect(JSON.parse(JSON.parse(line).detail).request.body.config).toBe(script);
  });

  it('herald audit verify refuses to read the file while the controller holds it (db_in_use)', () => {
    const r = verify(db);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/^herald: db_in_use: /);
  });

  it('herald audit verify passes on the untouched file, and reports an edited, a deleted and a reordered row by seq', async () => {
    await t.close(); // (its last checkpoint is written, and the file let go)
    const clean = verify(db);
    expect(clean.problems).toEqual([]);
    expect(clean.out).toMatch(/the audit trail verifies/);
    expect(clean.code).toBe(0);

    const edited = verify(
      editedCopy(db, 'edited.db', `UPDATE audit SET who = 'spiffe://herald.local/operator/eve' WHERE seq = 4`),
    );
    expect(edited.problems).toEqual([['audit_row_edited', 4]]);
    expect(edited.code).toBe(1);
    expect(edited.err).toMatch(/^herald: audit_row_edited: .*seq 4/);

    const deleted = verify(editedCopy(db, 'deleted.db', 'DELETE FROM audit WHERE seq = 6'));
    expect(deleted.problems).toEqual([['audit_row_deleted', 6]]);
    expect(deleted.err).toMatch(/^herald: audit_row_deleted: /);

    const reordered = verify(
      editedCopy(
        db,
        'reordered.db',
        'UPDATE audit SET seq = -1 WHERE seq = 7; UPDATE audit SET seq = 7 WHERE seq = 8; UPDATE audit SET seq = 8 WHERE seq = -1',
      ),
    );
    expect(reordered.problems).toEqual([
      ['audit_row_reordered', 7],
      ['audit_row_reordered', 8],
    ]);
    expect(reordered.err).toMatch(/^herald: audit_row_reordered: /);

    // the newest rows cut off, the head left as it was (the last checkpoint went with them)
    const cut = verify(editedCopy(db, 'cut.db', 'DELETE FROM audit WHERE seq > 10'));
    expect(cut.problems).toEqual([
      ['audit_unanchored', 1],
      ['audit_row_deleted', 11],
    ]);
  }, 60_000);
});

describe('pruning on SQLite', () => {
  it('deletes the rows past retention and anchors the rest with an audit.prune row and a checkpoint: the trail still verifies', async () => {
    const db = path.join(work, 'pruned.db');
    const t = await startTestController(
      pki,
      { db },
      { rates: { other: GENEROUS }, audit: { keptMaxEntries: 10, everyMs: 3_600_000 } },
    );
    try {
      for (let i = 0; i < 12; i++) expect((await t.req(op, 'POST', '/v1/nodes', { id: `p${i}` })).status).toBe(201);
      await t.ctl.auditCheckpoints.tick();
      const left = await rows(t);
      const prune = left.find((r) => r.action === 'audit.prune')!;
      expect(prune).toMatchObject({ who: pki.spiffe('controller', 'controller'), outcome: 'ok' });
      const first = Math.min(...left.map((r) => r.seq));
      expect(prune.detail).toMatchObject({ first_kept_seq: first, through_seq: first - 1 });
      expect(left.filter((r) => r.action === 'audit.checkpoint').length).toBeGreaterThanOrEqual(1);
      // at most a few more than kept: the pruning's own rows
      expect(left.length).toBeLessThanOrEqual(13);
    } finally {
      await t.close();
    }
    expect(verify(db).problems).toEqual([]);
    // rows deleted at the start beyond what the pruning recorded
    const d = new Database(db, { readonly: true });
    const first = (d.prepare('SELECT MIN(seq) AS s FROM audit').get() as { s: number }).s;
    d.close();
    const more = verify(editedCopy(db, 'pruned-more.db', `DELETE FROM audit WHERE seq <= ${first + 1}`));
    expect(more.problems).toEqual([['audit_row_deleted', first + 1]]);
  }, 60_000);
});

/** Rows of an audit table before the chain: the first schema's columns only. */
const LEGACY = [
  ['2026-01-01T00:00:00.000Z', 'spiffe://herald.local/operator/admin', 'node.create', 'old1', null],
  [
    '2026-01-01T00:00:01.000Z',
    'spiffe://herald.local/operator/admin',
    'config.create',
    'c-old',
    '{"name":"x","group":"script"}',
  ],
  [
    '2026-01-01T00:00:02.000Z',
    'spiffe://herald.local/agent/old1',
    'node.register',
    'old1',
    '{"endpoint":"wss://h:1/v1/wake"}',
  ],
] as const;

describe('the migration chains the rows written before the chain', () => {
  it('on SQLite: in seq order, outcome ok, no controller; the trail verifies once a controller signed it', async () => {
    const db = path.join(work, 'legacy.db');
    const d = new Database(db);
    d.exec(
      'CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT',
    );
    for (const m of MIGRATIONS.filter((x) => x.version <= 8)) {
      d.exec(m.sql);
      for (const c of m.columns ?? []) {
        const have = d.prepare(`PRAGMA table_info(${c.table})`).all() as Array<{ name: string }>;
        if (!have.some((x) => x.name === c.column)) d.exec(`ALTER TABLE ${c.table} ADD COLUMN ${c.column} ${c.decl}`);
      }
      d.prepare('INSERT INTO schema_migrations VALUES (?, ?, ?)').run(m.version, m.name, '2026-01-01T00:00:00Z');
    }
    const ins = d.prepare('INSERT INTO audit (at, who, action, target, detail) VALUES (?, ?, ?, ?, ?)');
    for (const r of LEGACY) ins.run(...r);
    d.close();
    const t = await startTestController(pki, { db });
    try {
      const got = await rows(t);
      const old = got.filter((r) => r.seq <= 3).sort((a, b) => a.seq - b.seq);
      expect(old.map((r) => [r.action, r.outcome])).toEqual(LEGACY.map((l) => [l[2], 'ok']));
      expect(old.every((r) => (r as unknown as { controller: null }).controller === null)).toBe(true);
    } finally {
      await t.close();
    }
    expect(verify(db).problems).toEqual([]);
    expect(verify(db).code).toBe(0);
  }, 60_000);

  describe('on PostgreSQL', () => {
    let pg: PgServer;
    beforeAll(async () => {
      pg = await startPg();
    }, 60_000);
    afterAll(async () => {
      await pg?.close();
    });

    it('in seq order over the numbers an identity column skipped; the trail verifies once a controller signed it', async () => {
      const url = await pg.createDatabase();
      const { default: postgres } = await import('postgres');
      const sql = postgres(url, { max: 1, onnotice: () => {} });
      try {
        await sql.unsafe(
          'CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)',
        );
        for (const m of PG_MIGRATIONS.filter((x) => x.version <= 6)) {
          await sql.unsafe(m.sql);
          await sql.unsafe('INSERT INTO schema_migrations VALUES ($1, $2, $3)', [m.version, m.name, '2026-01-01']);
        }
        const ins = 'INSERT INTO audit (at, who, action, target, detail) VALUES ($1, $2, $3, $4, $5)';
        await sql.unsafe(ins, [...LEGACY[0]]);
        // a rolled-back insert spends a number of the identity column
        await sql
          .begin(async (tx) => {
            await tx.unsafe(ins, [...LEGACY[1]]);
            await tx.unsafe('SELECT 1/0');
          })
          .catch(() => {});
        for (const r of LEGACY.slice(1)) await sql.unsafe(ins, [...r]);
      } finally {
        await sql.end({ timeout: 1 });
      }
      const store = await PgStore.open(url, { controller: 'controller' });
      try {
        const chained = await store.auditPage(0, 100);
        expect(chained.map((r) => [r.seq, r.action])).toEqual([
          [1, 'node.create'],
          [3, 'config.create'],
          [4, 'node.register'],
        ]);
        expect(await store.auditHead()).toEqual({ seq: 4, hash: chained[2]!.hash });
        const cps = new AuditCheckpoints({
          store,
          logger: memoryLogger().logger,
          spiffeId: pki.spiffe('controller', 'controller'),
          signer: () => new Signer(pki.signingJwk),
          keys: () => pki.keys,
        });
        expect(await cps.checkpoint()).toBe(5);
        // the next row is numbered by the chain: 5 was the checkpoint, so a change is 6
        await store.createNode('new1', null, pki.spiffe('operator', 'admin'));
        expect((await store.auditPage(5, 10)).map((r) => [r.seq, r.action, r.controller])).toEqual([
          [6, 'node.create', 'controller'],
        ]);
        expect(await cps.checkpoint()).toBe(7);
      } finally {
        await store.close();
      }
      expect(verify(url).problems).toEqual([]);
      expect(verify(url).code).toBe(0);
    }, 60_000);
  });
});

describe('group commits and the chain', () => {
  let pg: PgServer;
  beforeAll(async () => {
    pg = await startPg();
  }, 60_000);
  afterAll(async () => {
    await pg?.close();
  });

  it.each(['SQLite', 'PostgreSQL'])(
    'on %s, a unit rolled back after it appended leaves the chain as it was: the next unit follows the last row kept',
    async (kind) => {
      const store =
        kind === 'SQLite'
          ? new SqliteStore(path.join(work, 'group.db'), { controller: 'g' })
          : await PgStore.open(await pg.createDatabase(), { controller: 'g' });
      const who = pki.spiffe('operator', 'admin');
      const entry = (target: string) => ({
        at: new Date().toISOString(),
        who,
        action: 'test.row',
        target,
        detail: null,
      });
      try {
        const out = await store.group<void>([
          (tx) => tx.createNode('g1', null, who),
          async (tx) => {
            await tx.auditChain.append([entry('undone')]);
            throw new Error('this unit fails after its row was appended');
          },
          (tx) => tx.createNode('g2', null, who),
          async (tx) => {
            await tx.auditChain.append([entry('kept')]);
          },
        ]);
        expect(out.map((o) => o.ok)).toEqual([true, false, true, true]);
        const rows = await store.auditPage(0, 100);
        expect(rows.map((r) => [r.seq, r.action, r.target])).toEqual([
          [1, 'node.create', 'g1'],
          [2, 'node.create', 'g2'],
          [3, 'test.row', 'kept'],
        ]);
        expect(await store.auditHead()).toEqual({ seq: 3, hash: rows[2]!.hash });
        const v = new AuditVerifier({ keys: pki.keys, head: await store.auditHead() });
        for (const r of rows) v.add(r);
        // (no checkpoint in this store: the chain itself holds)
        expect(v.finish().problems.map((p) => p.code)).toEqual(['audit_unanchored']);
      } finally {
        await store.close();
      }
    },
    60_000,
  );
});
