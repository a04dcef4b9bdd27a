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
import { ClusterEngine } from '../controller/clusters/engine.js';
import { GroupCommitter } from '../controller/service/group-commit.js';
import { PgStore } from '../controller/store/pg/store.js';
import { recordSignal } from '../controller/service/signal.js';
import { SqliteStore } from '../controller/store/sqlite/store.js';
import type { Store } from '../controller/store/store.js';
import { dist, nowMs, round, type Dist } from './util.js';

export const STORE_OPS = ['createDeployment', 'updateDeployment', 'signal', 'recordAcked'] as const;
export type StoreOp = (typeof STORE_OPS)[number];

export interface StoreLatency {
  store: 'sqlite' | 'postgres';
  /** Each op's latency in ms over `samples` calls. */
  ops: Record<StoreOp, Dist>;
  samples: number;
  /** A cluster of `n` nodes made and its installs signalled (absent in runs before 2026-12-04). */
  cluster?: ClusterTimes;
}

/** One large cluster in one store: its creating transaction, then every member's install result. */
export interface ClusterTimes {
  n: number;
  /** `ClusterEngine.create` in one `transaction()`: wall time to the commit, and this process's CPU in it. */
  createMs: number;
  createCpuMs: number;
  /** Signals in flight at once (as many agents' would be), committed in groups as the service commits them. */
  concurrency: number;
  /** From the first signal to the cluster's CREATE_COMPLETE. */
  signalsMs: number;
  status: string;
}

/** Nodes of the cluster timed, and the signals sent at once. */
const CLUSTER_NODES = 5_000;
const CLUSTER_SIGNAL_CONCURRENCY = 64;

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
      store.updateDeployment(d.id, { revises: d.current.revision, inputValues: { round: i } }, WHO),
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
  return { store: kind, ops, samples, cluster: await measureCluster(store) };
}

/**
 * A cluster of CLUSTER_NODES made in one request's transaction, then each member's install
 * result recorded as the signal route records it (`recordSignal` through the service's group
 * commit), CLUSTER_SIGNAL_CONCURRENCY at a time, until the cluster is CREATE_COMPLETE: what a
 * large cluster's creation and its first step cost the store.
 */
async function measureCluster(store: Store): Promise<ClusterTimes> {
  const nodes = Array.from({ length: CLUSTER_NODES }, (_, i) => `big${String(i).padStart(5, '0')}`);
  await store.transaction(async (tx) => {
    for (const n of nodes) await tx.createNode(n, null, WHO);
  });
  const cfg = (name: string) =>
    store.createConfig(
      { name, group: 'script', config: '#!/bin/sh\ntrue\n', inputs: [], outputs: [], options: {} },
      WHO,
    );
  const [install, uninstall] = [await cfg('big-install'), await cfg('big-uninstall')];
  const engine = new ClusterEngine();
  const cpu0 = process.cpuUsage();
  const t0 = nowMs();
  const {
    result: { id },
  } = await store.transaction((tx) =>
    engine.create(
      tx,
      {
        name: 'big',
        nodes,
        installConfigId: install.id,
        uninstallConfigId: uninstall.id,
        installInputValues: {},

        inputValues: {},
      },
      WHO,
      Date.now(),
    ),
  );
  const createMs = nowMs() - t0;
  const cpu = process.cpuUsage(cpu0);
  const members = [...(await store.getCluster(id))!.nodes];
  const committer = new GroupCommitter(store);
  const t1 = nowMs();
  await Promise.all(
    Array.from({ length: CLUSTER_SIGNAL_CONCURRENCY }, async () => {
      for (let m = members.pop(); m !== undefined; m = members.pop()) {
        const { node, installDeploymentId } = m;
        await committer.run((tx) =>
          recordSignal(
            tx,
            engine,
            node,
            installDeploymentId,
            { revision: 1, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} },
            WHO,
            Date.now(),
          ),
        );
      }
    }),
  );
  return {
    n: CLUSTER_NODES,
    createMs: round(createMs, 1),
    createCpuMs: round((cpu.user + cpu.system) / 1000, 1),
    concurrency: CLUSTER_SIGNAL_CONCURRENCY,
    signalsMs: round(nowMs() - t1, 1),
    status: (await store.getClusterStatus(id))?.status ?? 'gone',
  };
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
