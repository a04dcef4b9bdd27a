/**
 * Commit latency of the two stores side by side, in this process (no HTTP, no controller): the
 * same sequence of single-change transactions against `SqliteStore` (a file on this machine's
 * disk, `synchronous = FULL`) and `PgStore` (the benchmark's PostgreSQL on 127.0.0.1, `fsync` on,
 * `synchronous_commit` on), each timed from the call to its promise resolving (the commit
 * durable, the change set returned):
 *
 * - `createDeployment`: a new deployment of a node (new generation, audit row; PostgreSQL: the
 *   change-log row and the NOTIFY under the sequence row's lock);
 * - `updateDeployment`: a PATCH's new revision of it;
 * - signal: the agent's result for that revision, `recordSignal` in one `transaction()`, as the
 *   API's signal route runs it;
 * - `recordAcked`: the acknowledged generation of one node.
 *
 * One call at a time, so the figure is a commit's own latency, not a queue's.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ClusterEngine } from '../controller/clusters/engine.js';
import { PgStore } from '../controller/pg-store.js';
import { recordSignal } from '../controller/signal.js';
import { SqliteStore } from '../controller/sqlite-store.js';
import type { Store } from '../controller/store.js';
import { dist, nowMs, round, type Dist } from './util.js';

export const STORE_OPS = ['createDeployment', 'updateDeployment', 'signal', 'recordAcked'] as const;
export type StoreOp = (typeof STORE_OPS)[number];

export interface StoreLatency {
  store: 'sqlite' | 'postgres';
  /** Each op's latency in ms over `samples` calls. */
  ops: Record<StoreOp, Dist>;
  samples: number;
}

const WHO = 'spiffe://herald.local/operator/bench';

/** A cluster engine is needed only by a cluster's deployment; these are plain ones. */
const NO_CLUSTERS = {
  onStepResult: () => {
    throw new Error('the store latency benchmark signals plain deployments only');
  },
} as unknown as ClusterEngine;

async function measure(store: Store, kind: StoreLatency['store'], samples: number): Promise<StoreLatency> {
  const nodes = Array.from({ length: 8 }, (_, i) => `lat${i}`);
  for (const n of nodes) await store.createNode(n, null, WHO);
  const cfg = await store.createConfig(
    { name: 'latency', group: 'script', config: '#!/bin/sh\ntrue\n', inputs: [], outputs: [], options: {} },
    WHO,
  );
  const times: Record<StoreOp, number[]> = { createDeployment: [], updateDeployment: [], signal: [], recordAcked: [] };
  const timed = async <T>(op: StoreOp, fn: () => Promise<T>): Promise<T> => {
    const t0 = nowMs();
    const r = await fn();
    times[op].push(nowMs() - t0);
    return r;
  };
  // a few unmeasured rounds first: prepared statements, the page cache, the JIT
  const warm = Math.min(20, Math.ceil(samples / 10));
  for (let i = 0; i < samples + warm; i++) {
    const node = nodes[i % nodes.length]!;
    const { deployment: d } = await timed('createDeployment', () =>
      store.createDeployment(
        { node, configId: cfg.id, name: `d${i}`, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: {} },
        WHO,
      ),
    );
    const { deployment: u } = await timed('updateDeployment', () =>
      store.updateDeployment(d.id, { inputValues: { round: i } }, WHO),
    );
    await timed('signal', () =>
      store.transaction((tx) =>
        recordSignal(
          tx,
          NO_CLUSTERS,
          node,
          d.id,
          { revision: u.current.revision, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} },
          WHO,
          Date.now(),
        ),
      ),
    );
    await timed('recordAcked', () => store.recordAcked(new Map([[node, i + 1]])));
    if (i === warm - 1) for (const op of STORE_OPS) times[op].length = 0;
  }
  const ops = {} as Record<StoreOp, Dist>;
  for (const op of STORE_OPS) {
    const d = dist(times[op]);
    ops[op] = {
      n: d.n,
      p50: round(d.p50, 3),
      p99: round(d.p99, 3),
      min: round(d.min, 3),
      max: round(d.max, 3),
      mean: round(d.mean, 3),
    };
  }
  return { store: kind, ops, samples };
}

/** Both stores, SQLite first; `pgUrl` names an empty database. */
export async function storeLatencyPhase(o: {
  runDir: string;
  pgUrl: string;
  samples: number;
}): Promise<StoreLatency[]> {
  const file = path.join(o.runDir, 'store-latency.db');
  fs.rmSync(file, { force: true });
  const sqlite = new SqliteStore(file);
  const out: StoreLatency[] = [];
  try {
    out.push(await measure(sqlite, 'sqlite', o.samples));
  } finally {
    await sqlite.close();
  }
  const pg = await PgStore.open(o.pgUrl, { controller: 'bench' });
  try {
    out.push(await measure(pg, 'postgres', o.samples));
  } finally {
    await pg.close();
  }
  return out;
}
