/**
 * The fleet's lease (SPEC §7) on a real PostgreSQL, in-process: renewals run on connections of
 * their own, so a controller whose pooled connections are all busy (a storm of announcements, a
 * big cluster) keeps its lease and its nodes. The dialer behind the fleet is a recorder: what
 * is under test is the lease, not the pushing (the integration suite pushes for real).
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Fleet } from '../../controller/pg-fleet.js';
import { PgStore } from '../../controller/pg-store.js';
import { IDLE_PUSH_STATE, type PushService } from '../../controller/push-types.js';
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
