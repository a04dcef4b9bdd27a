/**
 * The fleet's lease (docs/several-controllers.md) on a real PostgreSQL, in-process: renewals run on connections of
 * their own, so a controller whose pooled connections are all busy (a storm of announcements, a
 * big cluster) keeps its lease and its nodes. The dialer behind the fleet is a recorder: what
 * is under test is the lease, not the pushing (the integration suite pushes for real).
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Fleet } from '../../controller/fleet/fleet.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { HeraldError } from '../../protocol/errors.js';
import { IDLE_PUSH_STATE, type PushService } from '../../controller/push/types.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import { waitFor } from '../helpers/procs.js';

const WHO = 'spiffe://herald.local/operator/admin';
let pg: PgServer;
beforeAll(async () => {
  pg = await startPg();
});
afterAll(async () => {
  await pg?.close();
});

function recordingDialer(): PushService & { endpoints: Map<string, string | null> } {
  const endpoints = new Map<string, string | null>();
  return {
    endpoints,
    start: async () => {},
    notify: () => {},
    setEndpoint: (node, url) => void endpoints.set(node, url),
    remove: (node) => void endpoints.delete(node),
    state: () => ({ ...IDLE_PUSH_STATE }),
    setSigningKey: () => {},
    serveRequests: () => {},
    on: () => {},
    close: async () => {},
  };
}

/** A fleet `c1` on `store` pushing through `push`, with short timers (a lease of 600 ms). */
function testFleet(store: PgStore, push: PushService): Fleet {
  return new Fleet({
    store,
    name: 'c1',
    apiUrl: () => 'https://127.0.0.1:1',
    push,
    logger: pino({ level: 'error' }, new Writable({ write: (_c, _e, cb) => cb() })),
    registry: new Registry(),
    heartbeatMs: 100,
    leaseMs: 600,
    reconcileMs: 100,
  });
}

describe('the fleet lease', () => {
  it('is renewed while every pooled connection is busy, so the controller keeps its nodes', async () => {
    const store = await PgStore.open(await pg.createDatabase(), { controller: 'c1' });
    const dialer = recordingDialer();
    const fleet = testFleet(store, dialer);
    try {
      for (const n of ['a', 'b', 'c'])
        await store.announceEndpoint(n, `wss://127.0.0.1:7${n.charCodeAt(0)}/v1/wake`, WHO, true);
      await fleet.start([]);
      expect(['a', 'b', 'c'].every((n) => fleet.owns(n))).toBe(true);
      expect([...dialer.endpoints.keys()].sort()).toEqual(['a', 'b', 'c']);
      // every pooled connection sleeps for five leases
      const busy = Array.from({ length: 10 }, () => store.sql.unsafe('SELECT pg_sleep(3)'));
      const samples: boolean[] = [];
      for (let i = 0; i < 25; i++) {
        await new Promise((r) => setTimeout(r, 100));
        samples.push(fleet.owns('a'));
      }
      await Promise.all(busy);
      expect(samples.every(Boolean)).toBe(true);
      expect([...dialer.endpoints.keys()].sort()).toEqual(['a', 'b', 'c']); // never dropped
    } finally {
      await fleet.close();
      await store.close();
    }
  });
});

/**
 * A fleet on `store` whose claim of node `a` races a change: just before the claim statement, the
 * change (a cluster step's next revision, as another node's signal makes it) commits and the
 * change feed hands it over while `a` is not yet this fleet's. `failCatchUpOnce`: the read after
 * the claim fails the first time (the database lost mid-pass).
 */
async function claimRaceBed(o: { failCatchUpOnce: boolean }) {
  const store = await PgStore.open(await pg.createDatabase(), { controller: 'c1' });
  // what the dialer was last told of each node's generation (by setEndpoint or notify)
  const told = new Map<string, number>();
  const dialer: PushService = {
    ...recordingDialer(),
    setEndpoint: (node, _url, gen) => void told.set(node, Math.max(told.get(node) ?? 0, gen)),
    notify: (node, gen) => void told.set(node, Math.max(told.get(node) ?? 0, gen)),
    remove: (node) => void told.delete(node),
  };
  const real = store.controlSql;
  const race: { fleet?: Fleet; committed?: number; catchUpFailed: boolean } = { catchUpFailed: false };
  const control = new Proxy(real, {
    get(t, k) {
      if (k !== 'unsafe') return Reflect.get(t, k);
      return async (q: string, params?: never[]) => {
        if (race.committed === undefined && q.includes('INSERT INTO node_owners')) {
          const [r] = (await real.unsafe(
            "UPDATE nodes SET generation = generation + 1 WHERE id = 'a' RETURNING generation",
          )) as unknown as Array<{ generation: number }>;
          race.committed = r!.generation;
          race.fleet!.notify('a', race.committed, 'restart');
        }
        if (o.failCatchUpOnce && !race.catchUpFailed && q.includes('FROM nodes WHERE id = ANY')) {
          race.catchUpFailed = true;
          throw new Error('connection lost');
        }
        return real.unsafe(q, params);
      };
    },
  });
  const storeView = new Proxy(store, {
    get(t, k) {
      if (k === 'controlSql') return control;
      const v = Reflect.get(t, k);
      return typeof v === 'function' ? v.bind(t) : v;
    },
  });
  race.fleet = testFleet(storeView, dialer);
  await store.announceEndpoint('a', 'wss://127.0.0.1:7001/v1/wake', WHO, true);
  return { store, fleet: race.fleet, told, race };
}

describe('taking a node over', () => {
  it('wakes it with a generation committed between the scan that chose it and the claim', async () => {
    const { store, fleet, told, race } = await claimRaceBed({ failCatchUpOnce: false });
    try {
      await fleet.start([]);
      expect(fleet.owns('a')).toBe(true);
      expect(race.committed).toBeDefined();
      expect(told.get('a')).toBe(race.committed);
    } finally {
      await fleet.close();
      await store.close();
    }
  });

  it('when the read after the claim fails, lets the node go and adopts it again at the next pass, caught up', async () => {
    const { store, fleet, told, race } = await claimRaceBed({ failCatchUpOnce: true });
    try {
      await fleet.start([]);
      expect(race.catchUpFailed).toBe(true);
      expect(fleet.owns('a')).toBe(false); // not kept with the generation the scan read
      await waitFor('the node adopted again', async () => fleet.owns('a'), 10_000, 50);
      expect(told.get('a')).toBe(race.committed);
    } finally {
      await fleet.close();
      await store.close();
    }
  });
});

/** A standing the test steers: `refusal` set means revoked; `revoked` is what revoked.json lists. */
function steeredStanding(serial: string, notAfter = new Date(Date.now() + 86_400_000)) {
  const listeners: Array<() => void> = [];
  const s = {
    refusal: undefined as HeraldError | undefined,
    revoked: new Set<string>(),
    notAfter,
    standing: {
      refusal: () => s.refusal,
      certificate: () => ({ serial, notAfter: s.notAfter }),
      revokedSerials: () => s.revoked,
      onChange: (fn: () => void) => void listeners.push(fn),
    },
    change(): void {
      for (const fn of listeners) fn();
    },
  };
  return s;
}

/** Two controllers `c1` and `c2` on one database, each with its own store and steered standing. */
async function twoControllers(o: { c2NotAfter?: Date } = {}) {
  const db = await pg.createDatabase();
  const make = async (name: string, serial: string, notAfter?: Date) => {
    const store = await PgStore.open(db, { controller: name });
    const s = steeredStanding(serial, notAfter);
    const fleet = new Fleet({
      store,
      name,
      apiUrl: () => 'https://127.0.0.1:1',
      push: recordingDialer(),
      logger: pino({ level: 'silent' }),
      registry: new Registry(),
      heartbeatMs: 100,
      leaseMs: 600,
      reconcileMs: 100,
      settleMs: 300,
      standing: s.standing,
    });
    return { store, fleet, s };
  };
  const c1 = await make('c1', 'c1serial');
  const c2 = await make('c2', 'c2serial', o.c2NotAfter);
  for (let i = 0; i < 12; i++)
    await c1.store.announceEndpoint(`n${i}`, `wss://127.0.0.1:${7000 + i}/v1/wake`, WHO, true);
  const nodes = Array.from({ length: 12 }, (_, i) => `n${i}`);
  await c1.fleet.start([]);
  await c2.fleet.start([]);
  const close = async () => {
    for (const c of [c2, c1]) {
      await c.fleet.close();
      await c.store.close();
    }
  };
  return { c1, c2, nodes, close };
}

describe("a controller's certificate and its lease", () => {
  it('a lease held by a controller whose serial is in revoked.json does not count: its peer takes every node though it keeps renewing', async () => {
    const { c1, c2, nodes, close } = await twoControllers();
    try {
      await waitFor(
        'both own nodes',
        async () => nodes.some((n) => c2.fleet.owns(n)) && nodes.some((n) => c1.fleet.owns(n)),
        10_000,
        50,
      );
      // c2 does not know (a controller that does not step down: a stolen key, an old Herald)
      c1.s.revoked.add('c2serial');
      await waitFor('c1 to own every node', async () => nodes.every((n) => c1.fleet.owns(n)), 10_000, 50);
      expect(c1.fleet.liveControllers).toEqual(['c1']);
      expect((await c1.fleet.members()).find((m) => m.name === 'c2')!.live).toBe(false);
      expect([...(await c1.fleet.owners(null)).values()].every((o) => o === 'c1')).toBe(true);
    } finally {
      await close();
    }
  });

  it('a lease held by a controller whose certificate has ended does not count (database time)', async () => {
    const { c1, c2, nodes, close } = await twoControllers({ c2NotAfter: new Date(Date.now() + 4_000) });
    try {
      await waitFor('c2 to own nodes', async () => nodes.some((n) => c2.fleet.owns(n)), 10_000, 50);
      await waitFor('c1 to own every node', async () => nodes.every((n) => c1.fleet.owns(n)), 15_000, 50);
      expect((await c1.fleet.members()).find((m) => m.name === 'c2')!.live).toBe(false);
    } finally {
      await close();
    }
  });

  it('a controller that loses its standing hands its nodes back and ends its lease at once; its store writes nothing', async () => {
    const { c1, c2, nodes, close } = await twoControllers();
    try {
      await waitFor('c2 to own nodes', async () => nodes.some((n) => c2.fleet.owns(n)), 10_000, 50);
      c2.s.refusal = new HeraldError('controller_revoked');
      c2.store.setWriteGate(() => c2.s.refusal);
      c2.s.change();
      expect(nodes.some((n) => c2.fleet.owns(n))).toBe(false); // at once, before any database call
      await waitFor('c1 to own every node', async () => nodes.every((n) => c1.fleet.owns(n)), 10_000, 50);
      const row = (await c1.fleet.members()).find((m) => m.name === 'c2')!;
      expect(row).toMatchObject({ live: false, nodes_owned: 0 });
      await expect(
        c2.store.createConfig({ name: 'x', group: 'script', config: '' } as never, WHO),
      ).rejects.toMatchObject({
        code: 'controller_revoked',
      });
      await expect(c2.store.recordAcked(new Map([['n1', 1]]))).rejects.toMatchObject({ code: 'controller_revoked' });
      // renewed: it joins again and takes its share back
      c2.s.refusal = undefined;
      c2.s.change();
      await waitFor('c2 to own nodes again', async () => nodes.some((n) => c2.fleet.owns(n)), 10_000, 50);
    } finally {
      await close();
    }
  });
});

/** A dialer that records what the fleet passes on, and whose events a test fires (an agent dialling in). */
function hookedDialer() {
  const handlers = new Map<string, Array<(...a: unknown[]) => void>>();
  const notified: Array<[string, number]> = [];
  const removed: string[] = [];
  const endpoints = new Map<string, string | null>();
  const attached = new Set<string>();
  const d: PushService & {
    notified: typeof notified;
    removed: typeof removed;
    endpoints: typeof endpoints;
    fire(event: 'attach' | 'detach', node: string): void;
  } = {
    ...recordingDialer(),
    notified,
    removed,
    endpoints,
    notify: (node, gen) => void notified.push([node, gen]),
    setEndpoint: (node, url) => void endpoints.set(node, url),
    remove: (node) => void removed.push(node),
    state: (node) =>
      attached.has(node)
        ? { ...IDLE_PUSH_STATE, state: 'connected', connected: true, via: 'dialled-in' }
        : { ...IDLE_PUSH_STATE },
    on: (event, fn) => void handlers.set(event, [...(handlers.get(event) ?? []), fn as (...a: unknown[]) => void]),
    fire: (event, node) => {
      if (event === 'attach') attached.add(node);
      else attached.delete(node);
      for (const h of handlers.get(event) ?? []) h(node);
    },
  };
  return d;
}

describe('dialled-in connections among several controllers', () => {
  it("the controller holding a node's dialled-in connection passes its wake-ups on though another owns it; the owner dials nothing for a node without an endpoint", async () => {
    const db = await pg.createDatabase();
    const made = await Promise.all(
      ['c1', 'c2'].map(async (name) => {
        const store = await PgStore.open(db, { controller: name });
        const dialer = hookedDialer();
        const fleet = new Fleet({
          store,
          name,
          apiUrl: () => 'https://127.0.0.1:1',
          push: dialer,
          logger: pino({ level: 'silent' }),
          registry: new Registry(),
          heartbeatMs: 100,
          leaseMs: 600,
          reconcileMs: 100,
          settleMs: 300,
        });
        return { store, dialer, fleet };
      }),
    );
    const [c1, c2] = made as [(typeof made)[number], (typeof made)[number]];
    try {
      // nodes of agents that only dial out: no endpoint announced
      const nodes = Array.from({ length: 12 }, (_, i) => `d${i}`);
      for (const n of nodes) await c1.store.createNode(n, null, WHO);
      await c1.fleet.start([]);
      await c2.fleet.start([]);
      await waitFor(
        'both own nodes',
        async () => nodes.some((n) => c2.fleet.owns(n)) && nodes.some((n) => c1.fleet.owns(n)),
        10_000,
        50,
      );
      const x = nodes.find((n) => c2.fleet.owns(n))!;
      // the owner never dials a node that announced no endpoint
      expect(c2.dialer.endpoints.has(x)).toBe(false);

      // x's agent dials in at c1, which does not own it
      c1.dialer.fire('attach', x);
      expect(c1.fleet.owns(x)).toBe(false);
      expect(c1.fleet.holds(x)).toBe(true);
      c1.fleet.notify(x, 9, 'deployment');
      expect(c1.dialer.notified).toContainEqual([x, 9]);
      expect(c1.fleet.state(x)).toMatchObject({ connected: true, via: 'dialled-in' });
      expect((await c1.fleet.members()).find((m) => m.name === 'c1')!.nodes_held).toBeGreaterThanOrEqual(1);
      // a node of c1's that is not held passes only as c1's own
      const other = nodes.find((n) => c2.fleet.owns(n) && n !== x);
      if (other !== undefined) {
        c1.fleet.notify(other, 9, 'deployment');
        expect(c1.dialer.notified.some(([n]) => n === other)).toBe(false);
      }

      // the connection ends: c1 forgets the node (its owner dials it, if anyone) and passes nothing more
      c1.dialer.fire('detach', x);
      expect(c1.dialer.removed).toContain(x);
      c1.fleet.notify(x, 10, 'deployment');
      expect(c1.dialer.notified).not.toContainEqual([x, 10]);
      expect(c1.fleet.state(x).connected).toBe(false);
    } finally {
      for (const c of [c2, c1]) {
        await c.fleet.close();
        await c.store.close();
      }
    }
  });
});
