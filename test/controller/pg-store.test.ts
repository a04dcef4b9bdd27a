/**
 * PostgreSQL's own semantics (docs/several-controllers.md), beyond the store suite both stores pass
 * (store.test.ts): several stores on one database as several controllers are, committing at
 * once; the global generation as every reader sees it; the change log and its notifications;
 * fenced acks; schema versions; and the database going away (store_unavailable, not a hang).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import postgres from 'postgres';
import { PgStore } from '../../controller/store/pg/store.js';
import { PG_MIGRATIONS } from '../../controller/store/pg/schema.js';
import { PG_INSERT_MANY_MAX_ROWS } from '../../protocol/limits.js';
import type { NewConfig } from '../../controller/store/store.js';
import { rejectedCode } from '../helpers/controller-codes.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import { waitFor } from '../helpers/procs.js';

const WHO = 'spiffe://herald.local/operator/admin';
const CONFIG: NewConfig = { name: 'c', group: 'script', config: 'x', inputs: [], outputs: [], options: {} };
let pg: PgServer;
const open: PgStore[] = [];

beforeAll(async () => {
  pg = await startPg();
});
afterAll(async () => {
  for (const s of open) await s.close();
  await pg?.close();
});

async function stores(n: number, url?: string): Promise<{ url: string; list: PgStore[] }> {
  const db = url ?? (await pg.createDatabase());
  const list = await Promise.all(Array.from({ length: n }, (_, i) => PgStore.open(db, { controller: `c${i + 1}` })));
  open.push(...list);
  return { url: db, list };
}

describe('several stores on one database', () => {
  it('migrate once when they open a new database at the same moment', async () => {
    const { url, list } = await stores(3);
    expect(await list[0]!.generation()).toBe(0);
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    const rows = await sql`SELECT version FROM schema_migrations ORDER BY version`;
    await sql.end();
    // each migration once, in order
    expect(rows.map((r) => r.version)).toEqual(PG_MIGRATIONS.map((m) => m.version));
  });

  it("a node's generation never goes backwards for a reader while two controllers commit to it at once, and the log is in commit order", async () => {
    const { list } = await stores(3);
    const [a, b, reader] = list as [PgStore, PgStore, PgStore];
    await a.createNode('n', null, WHO);
    const cfg = await a.createConfig(CONFIG, WHO);
    const seen: number[] = [];
    let writing = true;
    const reading = (async () => {
      while (writing) seen.push((await reader.getNode('n'))!.generation);
    })();
    const writes = Array.from({ length: 60 }, (_, i) =>
      (i % 2 === 0 ? a : b).createDeployment(
        { node: 'n', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
        WHO,
      ),
    );
    const made = await Promise.all(writes);
    writing = false;
    await reading;
    expect(seen.length).toBeGreaterThan(1);
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThanOrEqual(seen[i - 1]!);
    // 60 distinct generations, the node at the highest
    const gens = made.map((m) => m.changes.generation!);
    expect(new Set(gens).size).toBe(60);
    expect((await reader.getNode('n'))!.generation).toBe(Math.max(...gens));
    // the log: numbered without a gap, generations rising with the numbers (commit order)
    const log = await reader.changesAfter(0, 1000);
    expect(log.map((e) => e.seq)).toEqual(log.map((_, i) => i + 1));
    const logged = log.map((e) => e.changes.generation).filter((g): g is number => g !== null);
    expect(logged).toEqual([...logged].sort((x, y) => x - y));
    expect(new Set(log.map((e) => e.origin))).toEqual(new Set(['c1', 'c2']));
  });

  it('two controllers creating one node at once: one creates it, the other is told node_exists', async () => {
    const { list } = await stores(2);
    const results = await Promise.allSettled(list.map((s) => s.createNode('x', null, WHO)));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failed = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(await rejectedCode(Promise.reject(failed.reason))).toBe('node_exists');
  });

  it('a node deleted through one controller while another adds a deployment to it leaves nothing behind', async () => {
    const { list } = await stores(2);
    const [a, b] = list as [PgStore, PgStore];
    const cfg = await a.createConfig(CONFIG, WHO);
    for (let i = 0; i < 15; i++) {
      const node = `d${i}`;
      await a.createNode(node, null, WHO);
      await Promise.allSettled([
        a.createDeployment(
          { node, configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
          WHO,
        ),
        b.deleteNode(node, WHO),
      ]);
      // the deletion came last (nothing left) or first (the deployment was refused unknown_node)
      expect(await a.getNode(node)).toBeUndefined();
      expect(await a.listDeployments({ node })).toEqual([]);
    }
  });

  it('two controllers putting one node in two clusters at once: one cluster gets it, the other is cluster_busy', async () => {
    const { list } = await stores(2);
    const [a, b] = list as [PgStore, PgStore];
    const { ClusterEngine } = await import('../../controller/clusters/engine.js');
    const engine = new ClusterEngine();
    await a.createNode('shared', null, WHO);
    const cfg = await a.createConfig(CONFIG, WHO);
    const cluster = (name: string) => ({
      name,
      nodes: ['shared'],
      installConfigId: cfg.id,
      uninstallConfigId: cfg.id,
      installInputValues: {},

      inputValues: {},
    });
    const results = await Promise.allSettled(
      [a, b].map((s, i) => s.transaction((tx) => engine.create(tx, cluster(`k${i}`), WHO, Date.now()))),
    );
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failed = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(await rejectedCode(Promise.reject(failed.reason))).toBe('cluster_busy');
  });

  it(`a cluster of more than PG_INSERT_MANY_MAX_ROWS / 2 members is written in several statements, every row kept`, async () => {
    const { url, list } = await stores(1);
    const [a] = list as [PgStore];
    // a deployment and a revision a node, inserted CLUSTER_INSERT_BATCH_ENTRIES members at a time: several statements
    const n = PG_INSERT_MANY_MAX_ROWS / 2 + 1;
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    try {
      await sql`INSERT INTO nodes (id, endpoint, generation, acked_generation, created_at, updated_at)
        SELECT 'big' || i, NULL, 0, NULL, '2026-12-04T00:00:00.000Z', '2026-12-04T00:00:00.000Z'
        FROM generate_series(1, ${n}) AS i`;
      const cfg = await a.createConfig(CONFIG, WHO);
      const { ClusterEngine } = await import('../../controller/clusters/engine.js');
      const nodes = Array.from({ length: n }, (_, i) => `big${i + 1}`);
      const { result } = await a.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          {
            name: 'big',
            nodes,
            installConfigId: cfg.id,
            uninstallConfigId: cfg.id,
            installInputValues: {},

            inputValues: {},
          },
          WHO,
          Date.now(),
        ),
      );
      const [counts] = await sql`SELECT
          (SELECT COUNT(*) FROM deployments WHERE cluster_id = ${result.id})::int AS deployments,
          (SELECT COUNT(*) FROM revisions r JOIN deployments d ON d.id = r.deployment_id WHERE d.cluster_id = ${result.id})::int AS revisions,
          (SELECT COUNT(*) FROM cluster_nodes WHERE cluster_id = ${result.id})::int AS members`;
      expect(counts).toEqual({ deployments: n, revisions: n, members: n });
      expect((await a.getCluster(result.id))!.nodes.map((m) => m.node)).toEqual(nodes);
    } finally {
      await sql.end();
    }
  });

  it('another controller is notified of a commit, and reads it from the log', async () => {
    const { list } = await stores(2);
    const [a, b] = list as [PgStore, PgStore];
    const payloads: string[] = [];
    let heard!: () => void;
    const got = new Promise<void>((r) => (heard = r));
    const l = await b.listen(
      (p) => {
        payloads.push(p);
        heard();
      },
      () => {},
    );
    await a.createNode('m', null, WHO);
    await got;
    await l.unlisten();
    const entries = await b.changesAfter(0, 10);
    expect(entries.map((e) => String(e.seq))).toContain(payloads[0]);
    expect(entries[0]).toMatchObject({ origin: 'c1', changes: { touchedNodes: ['m'] } });
  });

  it('a group commit numbers, stamps and logs every unit at its end: each unit its own generation and log entry, in order, one notification', async () => {
    const { list } = await stores(2);
    const [a, b] = list as [PgStore, PgStore];
    for (const n of ['p', 'q', 'r']) await a.createNode(n, null, WHO);
    const cfg = await a.createConfig(CONFIG, WHO);
    const head = (await b.changeHead()).last;
    const payloads: string[] = [];
    const l = await b.listen(
      (p) => void payloads.push(p),
      () => {},
    );
    const dep = (node: string) => async (tx: Parameters<Parameters<PgStore['transaction']>[0]>[0]) =>
      tx.createDeployment(
        { node, configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
        WHO,
      );
    const out = await a.group<unknown>([
      dep('p'),
      async () => {
        throw new Error('this unit fails alone');
      },
      dep('q'),
      async () => 'changes nothing',
      dep('p'),
      dep('r'),
    ]);
    expect(out.map((o) => o.ok)).toEqual([true, false, true, true, true, true]);
    const changed = out.filter((o) => o.ok && o.value.changes.generation !== null);
    const gens = changed.map((o) => (o.ok ? o.value.changes.generation! : 0));
    expect(gens).toEqual([gens[0], gens[0]! + 1, gens[0]! + 2, gens[0]! + 3]);
    // p touched twice: the later unit's generation
    expect((await b.getNode('p'))!.generation).toBe(gens[2]);
    expect((await b.getNode('q'))!.generation).toBe(gens[1]);
    expect((await b.getNode('r'))!.generation).toBe(gens[3]);
    const log = await b.changesAfter(head, 100);
    expect(log.map((e) => e.seq)).toEqual([head + 1, head + 2, head + 3, head + 4]);
    expect(log.map((e) => e.changes.generation)).toEqual(gens);
    expect(log.map((e) => e.changes.wakes.map((w) => w.node))).toEqual([['p'], ['q'], ['p'], ['r']]);
    expect(log.every((e) => e.origin === 'c1')).toBe(true);
    await waitFor('the notification', async () => payloads.length > 0, 5_000, 20);
    await l.unlisten();
    expect(payloads).toEqual([String(head + 4)]);
  });

  it('writes acknowledged generations only for nodes it owns at the epoch it holds', async () => {
    const { url, list } = await stores(1);
    const s = list[0]!;
    for (const n of ['o', 'p', 'q']) await s.createNode(n, null, WHO);
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    await sql`INSERT INTO node_owners (node_id, controller, epoch) VALUES ('o', 'c1', 3), ('p', 'c2', 1), ('q', 'c1', 5)`;
    await sql.end();
    const held = new Map([
      ['o', 3], // owned, right epoch
      ['p', 1], // owned by another controller
      ['q', 4], // an older epoch: fenced out
    ]);
    s.setAckFence((node) => held.get(node));
    await s.recordAcked(
      new Map([
        ['o', 7],
        ['p', 7],
        ['q', 7],
      ]),
    );
    expect((await s.getNode('o'))!.ackedGeneration).toBe(7);
    expect((await s.getNode('p'))!.ackedGeneration).toBeNull();
    expect((await s.getNode('q'))!.ackedGeneration).toBeNull();
  });

  it('refuses a database migrated by a newer Herald (bad_option naming --db)', async () => {
    const { url } = await stores(1);
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    await sql`INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 'x')`;
    await sql.end();
    const err = await PgStore.open(url, { controller: 'c9' }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'bad_option', field: 'db' });
  });
});

describe('the database going away', () => {
  it('answers store_unavailable while PostgreSQL is killed, keeps what was committed, and works again when it is back', async () => {
    const own = await startPg();
    try {
      const url = await own.createDatabase();
      const s = await PgStore.open(url, { controller: 'c1' });
      open.push(s);
      await s.createNode('kept', null, WHO);
      await own.kill9();
      expect(await rejectedCode(s.getNode('kept'))).toBe('store_unavailable');
      expect(await rejectedCode(s.createNode('lost', null, WHO))).toBe('store_unavailable');
      await own.start();
      expect((await s.getNode('kept'))?.id).toBe('kept');
      expect(await s.getNode('lost')).toBeUndefined();
      await s.createNode('after', null, WHO);
      expect((await s.listNodes()).map((n) => n.id)).toEqual(['after', 'kept']);
    } finally {
      await own.close();
    }
  });

  it('refuses to start when the database cannot be reached (bad_option naming --db, the password not shown)', async () => {
    const err = (await PgStore.open('postgres://herald:s3cret@127.0.0.1:1/none', { controller: 'c1' }).catch(
      (e: unknown) => e,
    )) as { code: string; field: string; message: string };
    expect(err).toMatchObject({ code: 'bad_option', field: 'db' });
    expect(err.message).not.toContain('s3cret');
  });
});
