/**
 * What several controllers on one PostgreSQL pay per node (docs/several-controllers.md, "What a
 * change costs each controller"), in-process: two controllers wired as `controller/main.ts` wires
 * one (its PgStore, the fleet, the change feed and the service) on one real database. Their
 * dialers record what the fleet passes on: what is under test is who acts on a change and what
 * each serves, not the pushing (test/integration/several-controllers.test.ts pushes for real).
 */
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChangeFeed } from '../../controller/fleet/change-feed.js';
import { Fleet } from '../../controller/fleet/fleet.js';
import { ControllerMetrics } from '../../controller/metrics.js';
import { IDLE_PUSH_STATE, type PushService } from '../../controller/push/types.js';
import { EventBus } from '../../controller/service/events.js';
import { ControllerService } from '../../controller/service/service.js';
import { SqlStoreBase } from '../../controller/store/base.js';
import { PgStore } from '../../controller/store/pg/store.js';
import type { MetadataRead } from '../../controller/store/store.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import { waitFor } from '../helpers/procs.js';

const WHO = 'spiffe://herald.local/operator/admin';
const NODES = Array.from({ length: 12 }, (_, i) => `n${String(i).padStart(2, '0')}`);
let pg: PgServer;
beforeAll(async () => {
  pg = await startPg();
});
afterAll(async () => {
  await pg?.close();
});

/** A dialer that records what it is told to do. */
function recordingDialer() {
  const notified: Array<[string, number]> = [];
  const endpoints = new Map<string, string | null>();
  const d: PushService & { notified: typeof notified; endpoints: typeof endpoints } = {
    notified,
    endpoints,
    start: async () => {},
    notify: (node, gen) => void notified.push([node, gen]),
    setEndpoint: (node, url) => void endpoints.set(node, url),
    remove: (node) => void endpoints.delete(node),
    state: () => ({ ...IDLE_PUSH_STATE }),
    setSigningKey: () => {},
    serveRequests: () => {},
    on: () => {},
    close: async () => {},
  };
  return d;
}

type Controller = Awaited<ReturnType<typeof startController>>;

/** Controller `name` on database `db`, its documents' signal URLs under `publicUrl`, wired as controller/main.ts wires it. */
async function startController(db: string, name: string, publicUrl: string) {
  const store = await PgStore.open(db, { controller: name });
  const dialer = recordingDialer();
  const registry = new Registry();
  const metrics = new ControllerMetrics(registry);
  const logger = pino({ level: 'silent' });
  const fleet = new Fleet({
    store,
    name,
    apiUrl: () => publicUrl,
    push: dialer,
    logger,
    registry,
    heartbeatMs: 100,
    leaseMs: 2_000,
    reconcileMs: 100,
    settleMs: 300,
  });
  const events = new EventBus();
  const service = new ControllerService({
    store,
    push: fleet,
    events,
    logger,
    metrics,
    publicUrl,
    name,
    controllers: () => fleet.members(),
    owners: (nodes) => fleet.owners(nodes),
    pushCares: (node) => fleet.cares(node),
  });
  const feed = new ChangeFeed({
    store,
    apply: (c) => service.applyChanges(c.changes, c.origin),
    resync: async () => {},
    logger,
    registry,
  });
  await feed.start();
  service.useChangeFeed(feed);
  await service.start();
  /** Records read back to act on changes since the test began, by what for. */
  const reads = async (): Promise<Record<string, number>> => {
    const m = await metrics.changeReads.get();
    return Object.fromEntries(m.values.map((v) => [String(v.labels.for), v.value]));
  };
  const close = async () => {
    await service.close();
    await feed.close();
    await fleet.close();
    await store.close();
  };
  return { name, store, dialer, fleet, events, service, feed, reads, close };
}

/** Two controllers on a new database with NODES announced (each with an endpoint), each owning some. */
async function twoControllers(urls: [string, string]): Promise<[Controller, Controller]> {
  const db = await pg.createDatabase();
  const seed = await PgStore.open(db, { controller: 'seed' });
  for (const [i, n] of NODES.entries()) await seed.createNode(n, `wss://127.0.0.1:${7000 + i}/v1/wake`, WHO);
  await seed.close();
  const c1 = await startController(db, 'c1', urls[0]);
  const c2 = await startController(db, 'c2', urls[1]);
  await waitFor(
    'both to own nodes, every node owned once',
    async () =>
      NODES.every((n) => c1.fleet.owns(n) !== c2.fleet.owns(n)) &&
      NODES.some((n) => c1.fleet.owns(n)) &&
      NODES.some((n) => c2.fleet.owns(n)),
    15_000,
    50,
  );
  return [c1, c2];
}

/** Waits until `c` has applied every change logged so far. */
async function caughtUp(...cs: Controller[]): Promise<void> {
  const head = (await cs[0]!.store.changeHead()).last;
  for (const c of cs) {
    await c.feed.catchUp();
    await waitFor(`${c.name} to apply change ${head}`, async () => c.feed.position >= head, 10_000, 20);
  }
}

/**
 * PostgreSQL's one-statement read of each node's document source gives what the statements of
 * the shared read (SqlRows, as SQLite runs it; here in one snapshot of the same database) give.
 */
async function sameAsStatements(store: PgStore): Promise<void> {
  const byId = (r: MetadataRead | undefined) =>
    r?.source && {
      ...r,
      source: {
        ...r.source,
        entries: [...r.source.entries].sort((a, b) => a.deployment.id.localeCompare(b.deployment.id)),
      },
    };
  let entries = 0;
  for (const n of NODES) {
    const one = await store.metadataSource(n);
    entries += one?.source?.entries.length ?? 0;
    expect(byId(one), n).toEqual(byId(await SqlStoreBase.prototype.metadataSource.call(store, n)));
  }
  expect(entries).toBeGreaterThan(NODES.length / 2);
}

async function config(c: Controller, name: string, hidden: boolean): Promise<string> {
  const v = await c.service.createConfig(
    {
      name,
      group: 'script',
      config: `#!/bin/sh\necho ${name}\n`,
      inputs: [
        { name: 'secret', type: 'String', hidden },
        { name: 'size', type: 'Number', default: 3 },
      ],
      outputs: [{ name: 'result', type: 'String' }],
    },
    WHO,
  );
  return String(v.id);
}

describe("a node's document on several controllers", { timeout: 60_000 }, () => {
  it('is byte-identical whichever controller serves it, at every generation; a 304 likewise', async () => {
    const url = 'https://herald.example:8443';
    const [c1, c2] = await twoControllers([url, url]);
    try {
      const install = await config(c1, 'install', true);
      const uninstall = await config(c1, 'uninstall', false);
      const gpu = await config(c2, 'gpu', false);
      await c1.service.createCluster(
        {
          name: 'k',
          nodegroups: [
            { name: 'masters', role: 'master', nodes: NODES.slice(0, 3) },
            { name: 'gpus', nodes: NODES.slice(3, 8), install_config_id: gpu, input_values: { size: 9 } },
          ],
          install_config_id: install,
          uninstall_config_id: uninstall,
          input_values: { secret: 's3cret', size: 5 },
        },
        WHO,
      );
      const own = await c2.service.createDeployment(
        { node: NODES[9], config_id: gpu, name: 'own', input_values: { secret: 'x', extra: [1, 'two'] } },
        WHO,
      );
      await c1.service.createDeployment({ node: NODES[4], config_id: uninstall, action: 'UPDATE' }, WHO);
      await caughtUp(c1, c2);
      const same = async (step: string) => {
        for (const n of NODES) {
          const a = await c1.service.metadata(n);
          const b = await c2.service.metadata(n);
          expect(b.generation, `${step} ${n}`).toBe(a.generation);
          expect(a.built, `${step} ${n}`).not.toBeNull();
          expect(b.built!.body.equals(a.built!.body), `${step} ${n}`).toBe(true);
          expect(b.built!.sha256, `${step} ${n}`).toBe(a.built!.sha256);
          const doc = JSON.parse(a.built!.body.toString('utf8')) as {
            node: string;
            generation: number;
            deployments: Array<{ inputs: Array<{ name: string; value?: unknown; hidden?: boolean }> }>;
          };
          expect(doc).toMatchObject({ node: n, generation: a.generation });
          // served again (from each one's cache now): the same bytes
          expect((await c2.service.metadata(n)).built!.body.equals(a.built!.body)).toBe(true);
          // an agent that holds the generation gets a 304 from either
          for (const c of [c1, c2])
            expect(await c.service.metadata(n, [a.generation])).toEqual({
              generation: a.generation,
              built: null,
            });
        }
      };
      await same('created');
      await sameAsStatements(c1.store);
      const secretOf = async (n: string) =>
        JSON.parse((await c1.service.metadata(n)).built!.body.toString('utf8')).deployments.flatMap(
          (d: { inputs: Array<{ name: string; value?: unknown; hidden?: boolean }> }) =>
            d.inputs.filter((i) => i.name === 'secret'),
        );
      // the hidden flag comes from the cluster's configs, whichever config the node's group runs
      expect(await secretOf(NODES[5]!)).toEqual([{ name: 'secret', type: 'String', value: 's3cret', hidden: true }]);
      // a new generation of one node, made through the other controller: both serve it, not the one cached
      await c2.service.updateDeployment(String(own.id), { input_values: { extra: null, size: 4 } }, WHO);
      await caughtUp(c1, c2);
      await same('patched');
      await sameAsStatements(c2.store);
    } finally {
      await c2.close();
      await c1.close();
    }
  });

  it('differs between controllers given different public URLs only in the signal URLs', async () => {
    const [u1, u2] = ['https://c1.example:8443', 'https://c2.example:8443'];
    const [c1, c2] = await twoControllers([u1, u2]);
    try {
      const cfg = await config(c1, 'plain', false);
      await c1.service.createDeployment({ node: NODES[0], config_id: cfg }, WHO);
      await caughtUp(c1, c2);
      const a = (await c1.service.metadata(NODES[0]!)).built!.body.toString('utf8');
      const b = (await c2.service.metadata(NODES[0]!)).built!.body.toString('utf8');
      expect(b).not.toBe(a);
      expect(b.includes(`"${u2}/v1/nodes/`)).toBe(true);
      expect(b.replaceAll(`"${u2}/v1/nodes/`, `"${u1}/v1/nodes/`)).toBe(a);
    } finally {
      await c2.close();
      await c1.close();
    }
  });
});

describe('a change on several controllers', { timeout: 60_000 }, () => {
  it("is applied by its nodes' owners alone: only the owner wakes a node, whichever controller made the change, and neither reads it back", async () => {
    const [c1, c2] = await twoControllers(['https://c1.example:8443', 'https://c2.example:8443']);
    try {
      const cfg = await config(c1, 'plain', false);
      await caughtUp(c1, c2);
      const before = [await c1.reads(), await c2.reads()];
      // one node of c2's, changed through c1
      const x = NODES.find((n) => c2.fleet.owns(n))!;
      await c1.service.createDeployment({ node: x, config_id: cfg }, WHO);
      await caughtUp(c1, c2);
      expect(c2.dialer.notified.filter(([n]) => n === x)).toHaveLength(1);
      expect(c1.dialer.notified.filter(([n]) => n === x)).toEqual([]);
      // every node, changed through c1: each woken by its owner alone, once
      await c1.service.createCluster(
        { name: 'all', nodes: NODES, install_config_id: cfg, uninstall_config_id: cfg },
        WHO,
      );
      await caughtUp(c1, c2);
      for (const c of [c1, c2]) {
        const count = new Map<string, number>();
        for (const [n] of c.dialer.notified) count.set(n, (count.get(n) ?? 0) + 1);
        const want = new Map(NODES.filter((n) => c.fleet.owns(n)).map((n) => [n, n === x ? 2 : 1]));
        expect(count, c.name).toEqual(want);
      }
      // nothing read back per node for those changes, by the controller that made them or the owners (no one
      // listens to the events); the cluster's status once, by the controller whose change it was (an operation's
      // end is logged there)
      expect(await c2.reads()).toEqual(before[1]);
      expect(await c1.reads()).toEqual({ ...before[0], cluster: (before[0]!.cluster ?? 0) + 1 });
      before[0] = await c1.reads();

      // an endpoint moved through c1 for a node of c2's: c2 alone learns it, reading the node once for its generation
      const y = NODES.find((n) => c2.fleet.owns(n))!;
      const url = 'wss://127.0.0.1:7999/v1/wake';
      await c1.service.announce(y, { url }, {
        spiffeId: `spiffe://herald.local/agent/${y}`,
        dns: [],
        ips: ['127.0.0.1'],
      } as never);
      await caughtUp(c1, c2);
      expect(c2.dialer.endpoints.get(y)).toBe(url);
      expect(c1.dialer.endpoints.has(y)).toBe(false);
      expect(await c1.reads()).toEqual(before[0]);
      expect((await c2.reads()).push).toBe((before[1]!.push ?? 0) + 1);
    } finally {
      await c2.close();
      await c1.close();
    }
  });

  it('still reaches the event stream of a controller that owns none of its nodes', async () => {
    const [c1, c2] = await twoControllers(['https://c1.example:8443', 'https://c2.example:8443']);
    try {
      const cfg = await config(c1, 'plain', false);
      const x = NODES.find((n) => c1.fleet.owns(n))!;
      const seen: Array<{ type: string; id: unknown }> = [];
      const unsubscribe = c2.events.subscribe((e) => seen.push({ type: e.type, id: e.data.id }));
      try {
        const d = await c1.service.createDeployment({ node: x, config_id: cfg }, WHO);
        await caughtUp(c1, c2);
        expect(seen).toContainEqual({ type: 'deployment', id: d.id });
        expect(seen).toContainEqual({ type: 'node', id: x });
        expect(c2.dialer.notified.filter(([n]) => n === x)).toEqual([]);
        expect((await c2.reads()).events).toBeGreaterThanOrEqual(2);
      } finally {
        unsubscribe();
      }
    } finally {
      await c2.close();
      await c1.close();
    }
  });
});
