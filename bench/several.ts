/**
 * Several controllers on one PostgreSQL (the benchmarks, docs/several-controllers.md), each configuration on
 * a bed of its own (several-bed.ts: a new database, its controllers, a new fleet that knows only
 * them). A bed is not reused from one controller count to the next: between two runs the last
 * run's cluster must complete and be deleted, and on PostgreSQL every signal of a cluster takes
 * the cluster's row lock and reads its N nodes, so at N = 5,000 that took longer than an hour
 * here (about 1.5 signals a second); a new fleet costs a few minutes instead.
 *
 * - Fan-out with 3, 2 and 1 controllers at each fan-out N: one `POST /v1/clusters`
 *   naming every node (one request, one transaction, a wake-up per node from its owner), as in
 *   fanout.ts. Per run: all acked, all fetched, the controllers' CPU (all of them, /proc), and the database's
 *   commits per node changed (`pg_stat_database.xact_commit`, reads included, and write
 *   transactions from the transaction id counter), less the background the controllers make
 *   when nothing changes (heartbeats, reconciles), measured just before.
 * - Failover at each failover N with 3 controllers (one bed, its fleet growing through them): `kill -9` of the one owning the most nodes
 *   (and of its push workers), then until every node it owned has a wake-up from a survivor. The
 *   parts: kill → the victim's lease ends (its last heartbeat + the lease, from its row), →
 *   the survivors claim the nodes (`node_owners.since`), → each orphan pinged (the agents'
 *   own record of the wake-up: its time, signer and reason). Then the victim starts again and
 *   takes its share back before the next step.
 */
import { metricSum } from './api-client.js';
import type { FirstWake } from './harness.js';
import { statementDelta, statementFigures, type StatementCounts, type StatementFigures } from './pg-statements.js';
import { CONTROLLER_NAMES, type DbCounters, type SeveralBed } from './several-bed.js';
import { childrenOf, dist, nowMs, round, roundDist, say, sleep, type Dist } from './util.js';

/** Idle window before each fan-out run: the database's background commits per second. */
const BACKGROUND_WINDOW_MS = 4_000;
/** After a run, before reading pg_stat_database: backends flush their counters at most once a second. */
const STATS_FLUSH_WAIT_MS = 1_500;
/**
 * How long one change may take, request to last fetch. A cluster's transaction on PostgreSQL is a
 * statement per row, each a round trip from a controller that shares two cores with the fleet:
 * at N = 1,000 the request took 23-53 s on this machine, so the limit grows with N.
 */
const RUN_WINDOW_MS = (n: number): number => 120_000 + n * 100;
/** How long a failover may take before the run gives up waiting for the last ping. */
const FAILOVER_WINDOW_MS = (n: number): number => 60_000 + n * 10;

export interface SeveralFanoutRun {
  controllers: number;
  n: number;
  run: number;
  commitMs: number;
  /** The first agent acked: the change committed and its NOTIFY reached the owners by then. */
  firstAckedMs: number;
  allAckedMs: number;
  allFetchedMs: number;
  ackMs: Dist;
  fetchMs: Dist;
  acked: number;
  fetched: number;
  fetchedByPoll: number;
  /** CPU s of every controller (with its push workers) from the request to the last fetch. */
  controllerCpuS: number;
  cpuPerAgentUs: number;
  /** Per controller: CPU s, nodes owned, metadata fetches answered 200, wake-ups acked. */
  perController: Array<{ name: string; cpuS: number; owned: number; fetch200: number; acked: number }>;
  db: {
    commits: number;
    writeTx: number;
    windowMs: number;
    /** Background per second (idle window before the run). */
    bgCommitsPerS: number;
    bgWriteTxPerS: number;
    /** delta − background × window: what the change cost, all in. */
    netCommits: number;
    netWriteTx: number;
    /** net / N. */
    commitsPerNode: number;
    writeTxPerNode: number;
    /** Statements (pg_stat_statements, BEGIN and COMMIT included) per node changed, less the background; absent without the extension. */
    statements?: StatementFigures;
  };
  timedOut: boolean;
}

export interface FailoverRun {
  n: number;
  victim: string;
  orphans: number;
  pinged: number;
  /** kill → the victim's lease_until (its last heartbeat + 8 s). */
  leaseEndMs: number;
  /** kill → first / last orphan claimed by a survivor (node_owners.since). */
  firstClaimMs: number;
  lastClaimMs: number;
  /** kill → first / last orphan pinged (wake-up from a survivor, at the agent). */
  firstPingMs: number;
  lastPingMs: number;
  /** Each orphan: its claim → its ping. */
  claimToPingMs: Dist;
  /** kill → ping, over the orphans. */
  killToPingMs: Dist;
  /** Orphans pinged per second between the first claim and the last ping. */
  dialRatePerS: number;
  /** Survivors' CPU s (with push workers) from the kill to the last ping, and per orphan (µs). */
  survivorCpuS: number;
  cpuPerOrphanUs: number;
  reasons: Record<string, number>;
  timedOut: boolean;
}

export interface SeveralResult {
  fanout: SeveralFanoutRun[];
  failover: FailoverRun[];
  grow: Array<{ label: string; n: number; added: number; addMs: number }>;
  problems: string[];
  /** The push worker processes each controller ran (counted at the first bed's start). */
  workersPerController?: number;
}

export interface SeveralOptions {
  /** A new bed: a database of its own, controllers `names` (started by bed.start()), no agents yet. */
  makeBed: (label: string, names: readonly string[]) => Promise<SeveralBed>;
  fanoutNs: number[];
  failoverNs: number[];
  runsFor: (n: number) => number;
  /** Called after each run with the figures so far (the caller writes them, so a stopped run keeps its finished parts). */
  onProgress?: (r: SeveralResult) => void;
}

const sum = (m: Map<string, number>): number => [...m.values()].reduce((a, b) => a + b, 0);

interface Background {
  commitsPerS: number;
  writeTxPerS: number;
  /** Each statement's calls in the window (null without pg_stat_statements), and the window. */
  statements: StatementCounts | null;
  ms: number;
}

/** The database's commits per second over an idle window (nothing changing, hooks held), and its statements. */
async function background(bed: SeveralBed): Promise<Background> {
  const sa = await bed.statementCounts();
  const a = await bed.dbCounters();
  await sleep(BACKGROUND_WINDOW_MS);
  const b = await bed.dbCounters();
  const sb = await bed.statementCounts();
  const s = (b.t - a.t) / 1000;
  return {
    commitsPerS: (b.commits - a.commits) / s,
    writeTxPerS: (b.xid - a.xid) / s,
    statements: sa && sb && statementDelta(sa, sb),
    ms: b.t - a.t,
  };
}

/** The idle window of the two with fewer statements in all (per second). */
function quieter(x: Background, y: Background): Background {
  const rate = (b: Background) => [...(b.statements?.values() ?? [])].reduce((a, c) => a + c, 0) / b.ms;
  return rate(x) <= rate(y) ? x : y;
}

async function fanoutRun(bed: SeveralBed, n: number, run: number, problems: string[]): Promise<SeveralFanoutRun> {
  const fleet = bed.fleet!;
  const k = bed.live().length;
  await bed.settle(n, problems);
  await bed.steady(n, 60_000, problems, `fan-out N=${n}, ${k} controllers`);
  await fleet.hold(true);
  const bgBefore = await background(bed);
  const owned = new Map((await bed.members()).filter((r) => r.live).map((r) => [r.name, r.nodes_owned]));
  const m0 = new Map<string, Map<string, number>>();
  for (const c of bed.live()) m0.set(bed.nameOf(c), await c.op.metrics());
  const name = `sev${k}n${n}r${run}`;
  await fleet.arm(`${name}-install`);
  const st0 = await bed.statementCounts();
  const db0: DbCounters = await bed.dbCounters();
  const cpu0 = bed.cpu();
  const t0 = nowMs();
  const nodes = Array.from({ length: n }, (_, i) => `b${String(i).padStart(5, '0')}`);
  const created = await bed.op.must<{ id: string }>(
    201,
    'POST',
    '/v1/clusters',
    { name, nodes, install_config_id: bed.configId, uninstall_config_id: bed.configId },
    RUN_WINDOW_MS(n),
    { prefer: 'return=minimal' }, // as the one-controller fan-out asks (bench/fanout.ts)
  );
  const tCommit = nowMs();
  bed.cluster = { id: created.id, name };
  const w = await fleet.waitRun(n, RUN_WINDOW_MS(n));
  const cpu1 = bed.cpu();
  await sleep(STATS_FLUSH_WAIT_MS);
  const db1 = await bed.dbCounters();
  const st1 = await bed.statementCounts();
  // the window before can carry the tail of the last settle (its deletes' acks and fetches); the
  // one after (hooks still held) is quiet: the lower of the two is the background
  const bgAfter = await background(bed);
  const bg = {
    commitsPerS: Math.min(bgBefore.commitsPerS, bgAfter.commitsPerS),
    writeTxPerS: Math.min(bgBefore.writeTxPerS, bgAfter.writeTxPerS),
  };
  const reports = await fleet.report();
  const acks = reports.map((r) => r.tAck).filter((t): t is number => t !== null);
  const fetches = reports.map((r) => r.tFetch).filter((t): t is number => t !== null);
  const perController: SeveralFanoutRun['perController'] = [];
  for (const c of bed.live()) {
    const cn = bed.nameOf(c);
    const a = m0.get(cn)!;
    const b = await c.op.metrics();
    const d = (metric: string, label?: string): number => metricSum(b, metric, label) - metricSum(a, metric, label);
    perController.push({
      name: cn,
      cpuS: round((cpu1.get(cn) ?? 0) - (cpu0.get(cn) ?? 0), 2),
      owned: owned.get(cn) ?? 0,
      fetch200: d('herald_metadata_fetches_total', 'status="200"'),
      acked: d('herald_wakeups_acked_total'),
    });
  }
  const cpuS = sum(cpu1) - sum(cpu0);
  const windowMs = db1.t - db0.t;
  const commits = db1.commits - db0.commits;
  const writeTx = db1.xid - db0.xid;
  const r: SeveralFanoutRun = {
    controllers: k,
    n,
    run,
    commitMs: round(tCommit - t0, 1),
    firstAckedMs: round(dist(acks.map((t) => t - t0)).min, 1),
    allAckedMs: round(dist(acks.map((t) => t - t0)).max, 1),
    allFetchedMs: round(dist(fetches.map((t) => t - t0)).max, 1),
    ackMs: roundDist(dist(acks.map((t) => t - t0)), 1),
    fetchMs: roundDist(dist(fetches.map((t) => t - t0)), 1),
    acked: acks.length,
    fetched: fetches.length,
    fetchedByPoll: reports.filter((x) => x.fetchWasPoll).length,
    controllerCpuS: round(cpuS, 2),
    cpuPerAgentUs: Math.round((cpuS / n) * 1e6),
    perController,
    db: {
      commits,
      writeTx,
      windowMs,
      bgCommitsPerS: round(bg.commitsPerS, 1),
      bgWriteTxPerS: round(bg.writeTxPerS, 1),
      netCommits: Math.round(commits - (bg.commitsPerS * windowMs) / 1000),
      netWriteTx: Math.round(writeTx - (bg.writeTxPerS * windowMs) / 1000),
      commitsPerNode: round((commits - (bg.commitsPerS * windowMs) / 1000) / n, 2),
      writeTxPerNode: round((writeTx - (bg.writeTxPerS * windowMs) / 1000) / n, 2),
      ...statementsOf(st0, st1, windowMs, quieter(bgBefore, bgAfter), n),
    },
    timedOut: w.timedOut,
  };
  if (r.acked !== n) problems.push(`fan-out N=${n}, ${k} controllers, run ${run}: acked ${r.acked}/${n}`);
  if (r.fetched !== n) problems.push(`fan-out N=${n}, ${k} controllers, run ${run}: fetched ${r.fetched}/${n}`);
  say(
    `several controllers: fan-out N=${n} with ${k}: answered ${r.commitMs} ms, all acked ${r.allAckedMs} ms, all fetched ${r.allFetchedMs} ms; controllers' CPU ${r.controllerCpuS} s (${r.cpuPerAgentUs} µs/agent); commits/node ${r.db.commitsPerNode}, write tx/node ${r.db.writeTxPerNode}`,
  );
  say(`several controllers: fan-out N=${n} with ${k}: statements/node ${r.db.statements?.perNode ?? 'n/a'}`);
  return r;
}

function statementsOf(
  a: StatementCounts | null,
  b: StatementCounts | null,
  windowMs: number,
  bg: Background,
  n: number,
): { statements?: StatementFigures } {
  if (a === null || b === null || bg.statements === null) return {};
  return { statements: statementFigures(statementDelta(a, b), windowMs, bg.statements, bg.ms, n) };
}

async function failoverRun(bed: SeveralBed, n: number, problems: string[]): Promise<FailoverRun> {
  const fleet = bed.fleet!;
  await bed.settle(n, problems);
  await bed.steady(n, 60_000, problems, `failover N=${n}`);
  const rows = (await bed.members()).filter((r) => r.live);
  const victim = [...rows].sort((a, b) => b.nodes_owned - a.nodes_owned || a.name.localeCompare(b.name))[0]!.name;
  const orphans = (
    (await bed.sql.unsafe('SELECT node_id FROM node_owners WHERE controller = $1', [victim])) as unknown as Array<{
      node_id: string;
    }>
  ).map((r) => r.node_id);
  const orphanSet = new Set(orphans);
  await fleet.arm('failover');
  const cpu0 = bed.cpu();
  cpu0.delete(victim);
  const tKill = await bed.kill9(victim, nowMs);
  say(`several controllers: failover N=${n}: kill -9 of ${victim} (${orphans.length} nodes)`);
  let wakes: FirstWake[] = [];
  let timedOut = true;
  let tLast = NaN;
  const limit = FAILOVER_WINDOW_MS(n);
  while (nowMs() - tKill < limit) {
    await sleep(200);
    wakes = (await fleet.wakesSince(tKill, victim)).filter((w) => orphanSet.has(w.node));
    if (wakes.every((w) => w.t !== null)) {
      timedOut = false;
      break;
    }
  }
  tLast = nowMs();
  const cpu1 = new Map<string, number>();
  for (const [k, v] of bed.cpu()) if (cpu0.has(k)) cpu1.set(k, v);
  const [lease] = (await bed.sql.unsafe(
    'SELECT EXTRACT(EPOCH FROM lease_until) * 1000 AS at FROM controllers WHERE name = $1',
    [victim],
  )) as unknown as Array<{ at: string }>;
  const claims = (await bed.sql.unsafe(
    'SELECT node_id, EXTRACT(EPOCH FROM since) * 1000 AS at FROM node_owners WHERE node_id = ANY($1::text[]) AND controller <> $2',
    [orphans, victim] as never[],
  )) as unknown as Array<{ node_id: string; at: string }>;
  const claimAt = new Map(claims.map((c) => [c.node_id, Number(c.at)]));
  const pinged = wakes.filter((w): w is FirstWake & { t: number } => w.t !== null);
  const pingT = pinged.map((w) => w.t);
  const claimT = [...claimAt.values()];
  const claimToPing = pinged.filter((w) => claimAt.has(w.node)).map((w) => w.t - claimAt.get(w.node)!);
  const reasons: Record<string, number> = {};
  for (const w of pinged) reasons[w.reason ?? '?'] = (reasons[w.reason ?? '?'] ?? 0) + 1;
  const firstClaim = dist(claimT).min;
  const lastPing = dist(pingT).max;
  const cpuS = sum(cpu1) - sum(cpu0);
  const r: FailoverRun = {
    n,
    victim,
    orphans: orphans.length,
    pinged: pinged.length,
    leaseEndMs: round(Number(lease?.at) - tKill, 0),
    firstClaimMs: round(firstClaim - tKill, 0),
    lastClaimMs: round(dist(claimT).max - tKill, 0),
    firstPingMs: round(dist(pingT).min - tKill, 0),
    lastPingMs: round(lastPing - tKill, 0),
    claimToPingMs: roundDist(dist(claimToPing), 0),
    killToPingMs: roundDist(dist(pingT.map((t) => t - tKill)), 0),
    dialRatePerS: round(pinged.length / ((lastPing - firstClaim) / 1000), 0),
    survivorCpuS: round(cpuS, 2),
    cpuPerOrphanUs: Math.round((cpuS / Math.max(1, orphans.length)) * 1e6),
    reasons,
    timedOut,
  };
  if (timedOut)
    problems.push(
      `failover N=${n}: ${r.pinged} of ${r.orphans} nodes of ${victim} pinged by a survivor within ${Math.round((tLast - tKill) / 1000)} s`,
    );
  say(
    `several controllers: failover N=${n}: ${r.pinged}/${r.orphans} pinged; lease ended ${r.leaseEndMs} ms after the kill, claimed ${r.firstClaimMs}-${r.lastClaimMs} ms, pinged ${r.firstPingMs}-${r.lastPingMs} ms (${r.dialRatePerS}/s; survivors' CPU ${r.survivorCpuS} s)`,
  );
  await bed.startController(victim);
  await bed.steady(n, 60_000 + n * 20, problems, `after the failover at N=${n}, ${victim} back`);
  return r;
}

/** Every step in turn: the fleet grows to each N; at a fan-out N, 3 → 2 → 1 controllers; at a failover N, a kill -9. */
export async function severalPhase(o: SeveralOptions): Promise<SeveralResult> {
  const out: SeveralResult = { fanout: [], failover: [], grow: [], problems: [] };
  const problems = out.problems;
  const onBed = async (label: string, names: readonly string[], fn: (bed: SeveralBed) => Promise<void>) => {
    const bed = await o.makeBed(label, names);
    try {
      await bed.start();
      const first = bed.live()[0];
      if (first !== undefined) out.workersPerController ??= childrenOf(first.pid).length;
      await fn(bed);
    } catch (err) {
      problems.push(`${label}: ${(err as Error).message}`);
      say(`several controllers: ${label}: ${(err as Error).stack ?? String(err)}`);
    } finally {
      await bed.stop();
    }
  };
  const failoverNs = [...o.failoverNs].sort((a, b) => a - b);
  if (failoverNs.length > 0)
    await onBed('failover', CONTROLLER_NAMES, async (bed) => {
      for (const n of failoverNs) {
        const g = await bed.grow(n, problems);
        out.grow.push({ label: 'failover', n, ...g });
        out.failover.push(await failoverRun(bed, n, problems));
        o.onProgress?.(out);
      }
    });
  for (const n of [...o.fanoutNs].sort((a, b) => a - b))
    for (const k of [3, 2, 1]) {
      const label = `fanout-${n}-${k}`;
      await onBed(label, CONTROLLER_NAMES.slice(0, k), async (bed) => {
        const g = await bed.grow(n, problems);
        out.grow.push({ label, n, ...g });
        for (let run = 1; run <= o.runsFor(n); run++) {
          out.fanout.push(await fanoutRun(bed, n, run, problems));
          o.onProgress?.(out);
        }
      });
    }
  return out;
}
