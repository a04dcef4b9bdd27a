/**
 * A stalled database is answered, not waited on: while another session holds an ACCESS
 * EXCLUSIVE lock on a table, a real controller process on a throwaway PostgreSQL answers every
 * one of many concurrent requests 503 `store_unavailable` with Retry-After while the lock is
 * still held (a lock wait gives up after PG_LOCK_TIMEOUT_MS, a wait for a pooled connection
 * after PG_POOL_WAIT_MS, and a stall one request saw is shared at once with those queued behind
 * it), and once the lock is gone the same requests succeed. Needs `npm run build`.
 *
 * The lock is held until every answer has come, or at the longest until PG_STATEMENT_TIMEOUT_MS
 * has passed (the old bound: the client's queue held requests for several statement timeouts
 * in a row, the last answered only after the lock was gone). What is asserted is the order of
 * events: every answer before the release.
 */
import postgres from 'postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { PG_STATEMENT_TIMEOUT_MS } from '../../protocol/limits.js';
import { makeFleet, type TestFleet } from '../helpers/fleet.js';
import { keepFleetLogs } from '../helpers/fleet-logs.js';
import { api, isBuilt, type ApiResponse } from '../helpers/procs.js';

let f: TestFleet;
let port: number;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  f = await makeFleet(['c1'], []);
  port = (await f.startController('c1')).port;
}, 120_000);

beforeEach(({ onTestFailed, task }) => {
  onTestFailed(async () => {
    await keepFleetLogs(f, task.name);
  }, 60_000);
});

afterAll(async () => {
  await f?.cleanup();
});

/** Holds `LOCK TABLE <table> IN ACCESS EXCLUSIVE MODE` in a session of its own until `release()`. */
async function lockTable(url: string, table: string): Promise<{ release(): Promise<void> }> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => {
    locked = r;
  });
  const tx = sql.begin(async (t) => {
    await t.unsafe(`LOCK TABLE ${table} IN ACCESS EXCLUSIVE MODE`);
    locked();
    await released;
  });
  await isLocked;
  return {
    async release() {
      release();
      await tx;
      await sql.end({ timeout: 1 });
    },
  };
}

describe('a PostgreSQL table locked by another session', { timeout: 90_000 }, () => {
  it('answers 30 concurrent requests 503 store_unavailable with Retry-After while the lock is held, and serves them once it is gone', async () => {
    expect((await api(port, f.op, 'POST', '/v1/nodes', { id: 'n0' })).status).toBe(201);
    const lock = await lockTable(f.db, 'nodes');
    const events: Array<
      { what: 'answer'; r: ApiResponse } | { what: 'answer-error'; err: unknown } | { what: 'release' }
    > = [];
    // reads (a node) and writes (a new node) alike
    const requests = Array.from({ length: 30 }, (_, i) =>
      i % 2 === 0
        ? () => api(port, f.op, 'GET', '/v1/nodes/n0')
        : () => api(port, f.op, 'POST', '/v1/nodes', { id: `s${i}` }),
    );
    let answered = 0;
    let allAnswered!: () => void;
    const all = new Promise<void>((r) => {
      allAnswered = r;
    });
    for (const send of requests)
      void send()
        .then(
          (r) => events.push({ what: 'answer', r }),
          (err: unknown) => events.push({ what: 'answer-error', err }),
        )
        .finally(() => {
          if (++answered === requests.length) allAnswered();
        });
    let watchdog: NodeJS.Timeout | undefined;
    await Promise.race([all, new Promise<void>((r) => (watchdog = setTimeout(r, PG_STATEMENT_TIMEOUT_MS)))]);
    clearTimeout(watchdog);
    events.push({ what: 'release' });
    await lock.release();
    await all;

    const released = events.findIndex((e) => e.what === 'release');
    const before = events.slice(0, released);
    expect(before.map((e) => e.what)).toEqual(requests.map(() => 'answer'));
    for (const e of before) {
      const r = (e as { r: ApiResponse }).r;
      expect({ status: r.status, code: r.json?.error?.code, retryAfter: r.headers['retry-after'] }).toEqual({
        status: 503,
        code: 'store_unavailable',
        retryAfter: '1',
      });
    }

    // the lock gone, the same requests succeed
    for (const [i, send] of requests.entries()) expect((await send()).status).toBe(i % 2 === 0 ? 200 : 201);
  });
});
