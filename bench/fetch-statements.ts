/**
 * The statements one metadata fetch costs on PostgreSQL, counted by `pg_stat_statements` (BEGIN
 * and COMMIT included: each is a round trip the controller waits for): a cluster of FETCH_NODES
 * nodes made in a database of its own, then, in this process, the controller's own fetch path
 * (`ControllerService.metadata`, as the fetch route and the push connection's fetch frame call it)
 * for each node: once as a 200 with nothing cached (a woken agent's fetch), once as a 304 (a poll
 * that finds nothing new). Nothing else uses the database meanwhile, so the delta is the fetches'.
 */
import { pino } from 'pino';
import postgres from 'postgres';
import { ClusterEngine } from '../controller/clusters/engine.js';
import { IDLE_PUSH_STATE, type PushService } from '../controller/push/types.js';
import { EventBus } from '../controller/service/events.js';
import { ControllerService } from '../controller/service/service.js';
import { PgStore } from '../controller/store/pg/store.js';
import { enableStatements, statementCounts, statementDelta } from './pg-statements.js';

const FETCH_NODES = 200;
const WHO = 'spiffe://herald.local/operator/bench';

export interface FetchStatements {
  nodes: number;
  /** Statements per fetch answered 200 (the document built: nothing cached). */
  per200: number;
  /** Statements per fetch answered 304 (the agent holds the generation). */
  per304: number;
  /** Each statement's calls per 200 fetch. */
  of200: Array<{ query: string; perFetch: number }>;
}

const NO_PUSH: PushService = {
  start: async () => {},
  notify: () => {},
  setEndpoint: () => {},
  remove: () => {},
  state: () => ({ ...IDLE_PUSH_STATE }),
  setSigningKey: () => {},
  serveRequests: () => {},
  on: () => {},
  close: async () => {},
};

/** Null when pg_stat_statements is not loaded. `pgUrl` names an empty database. */
export async function fetchStatementsPhase(pgUrl: string): Promise<FetchStatements | null> {
  const stats = postgres(pgUrl, { max: 1, onnotice: () => {} });
  const store = await PgStore.open(pgUrl, { controller: 'bench' });
  try {
    if (!(await enableStatements(stats))) return null;
    const nodes = Array.from({ length: FETCH_NODES }, (_, i) => `f${String(i).padStart(4, '0')}`);
    await store.transaction(async (tx) => {
      for (const n of nodes) await tx.createNode(n, null, WHO);
    });
    const cfg = await store.createConfig(
      { name: 'fetch', group: 'script', config: '#!/bin/sh\ntrue\n', inputs: [], outputs: [], options: {} },
      WHO,
    );
    await store.transaction((tx) =>
      new ClusterEngine().create(
        tx,
        {
          name: 'fetch',
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
    const service = new ControllerService({
      store,
      push: NO_PUSH,
      events: new EventBus(),
      logger: pino({ level: 'silent' }),
      publicUrl: 'https://127.0.0.1:8443',
    });
    // one unmeasured fetch of another node's kind: prepared statements, the config cache
    await service.metadata(nodes[0]!);
    const held = new Map<string, number>();
    const a = await statementCounts(stats);
    for (const n of nodes.slice(1)) held.set(n, (await service.metadata(n)).generation);
    const b = await statementCounts(stats);
    for (const n of nodes.slice(1)) await service.metadata(n, [held.get(n)!]);
    const c = await statementCounts(stats);
    const k = nodes.length - 1;
    const sum = (m: Map<string, number>) => [...m.values()].reduce((x, y) => x + y, 0);
    const d200 = statementDelta(a, b);
    return {
      nodes: k,
      per200: Math.round((sum(d200) / k) * 100) / 100,
      per304: Math.round((sum(statementDelta(b, c)) / k) * 100) / 100,
      of200: [...d200]
        .map(([query, calls]) => ({ query: query.slice(0, 120), perFetch: Math.round((calls / k) * 100) / 100 }))
        .sort((x, y) => y.perFetch - x.perFetch),
    };
  } finally {
    await store.close();
    await stats.end({ timeout: 1 });
  }
}
