/**
 * `herald demo --controllers N` (SPEC §7): N controllers on one PostgreSQL (the given `--db`, or
 * a throwaway server in a temporary directory), agents that know all of them, a cluster, and a
 * rolling restart during which the controller owning the most nodes is killed with SIGKILL. It
 * shows the spread, the timeline from the kill (its nodes taken over, each pinged by its new
 * owner, the restart's end) and checks that the restart completed, every step ran exactly once
 * (counted by the hook scripts on the nodes) and the takeover was within 10 s.
 *
 * The story, one module each: options and the database (here), fixtures (demo-fixtures.ts and
 * demo-fleet.ts), supervision (demo-supervisor.ts), and the spread table (operator-controllers.ts).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { HeraldError } from '../protocol/errors.js';
import { checkNodes } from './demo-checks.js';
import { createCluster, readPid, startNodes, type DemoNode } from './demo-fixtures.js';
import {
  controllersView,
  fleetNames,
  kill9,
  makeFleetPki,
  nodesHeldBy,
  startControllers,
  victimOf,
  waitSpread,
  watchTakeover,
  type FleetController,
  type Takeover,
} from './demo-fleet.js';
import { DemoFailure, DemoSupervisor, tail } from './demo-supervisor.js';
import { controllersTable } from './operator-controllers.js';
import { formatMs, parseDuration, parsePositiveInt, table } from './operator-format.js';
import { watchRestart, type WatchEvent, type WatchResult } from './operator-watch.js';
import { pgBinDir, startThrowawayPg, ThrowawayPgError, type ThrowawayPg } from './throwaway-pg.js';

export const MIN_DEMO_CONTROLLERS = 2;
export const MAX_DEMO_CONTROLLERS = 5;
/** Nodes per controller when `--nodes` is not given. */
export const DEMO_NODES_PER_CONTROLLER = 3;
/** Most nodes this demo starts (each is a Node.js process). */
export const MAX_FLEET_DEMO_NODES = 50;
/** SPEC §7: a dead controller's nodes are taken over and pinged within this long of its death. */
export const TAKEOVER_LIMIT_MS = 10_000;
/** How long the demo watches for the takeover before it reports what it saw (a ✗). */
const TAKEOVER_WATCH_MS = 30_000;
/** How long the demo waits to reach a `--db` server. */
const DB_CONNECT_TIMEOUT_S = 5;
/** How long the closing spread may take to show every node held again (two heartbeats). */
const AFTER_SETTLE_MS = 5_000;
const DEMO_DATABASE = 'herald_demo';

export interface ControllersDemoOptions {
  controllers: string;
  db?: string | undefined;
  nodes?: string | undefined;
  dir?: string | undefined;
  timeout: string;
  /** Where the demo talks (default stdout). */
  out?: NodeJS.WritableStream;
}

/** The checked options. */
export interface FleetPlan {
  names: string[];
  ids: string[];
  stepTimeoutMs: number;
  /** The `--db` URL, or undefined for a throwaway server made with the binaries in `pgBin`. */
  db: string | undefined;
  pgBin: string | undefined;
}

/**
 * Checks the options up front: `--controllers` 2..5, `--nodes` at least one per controller,
 * `--db` a `postgres://` URL, and, without `--db`, PostgreSQL's server binaries to be found by
 * `findPgBin`.
 * @throws HeraldError `bad_option` naming the option
 */
export function planFleet(o: ControllersDemoOptions, findPgBin: () => string | undefined = pgBinDir): FleetPlan {
  const count = /^\d+$/.test(o.controllers) ? Number(o.controllers) : Number.NaN;
  if (!(count >= MIN_DEMO_CONTROLLERS && count <= MAX_DEMO_CONTROLLERS))
    throw new HeraldError(
      'bad_option',
      `--controllers must be a whole number from ${MIN_DEMO_CONTROLLERS} to ${MAX_DEMO_CONTROLLERS}, not ${JSON.stringify(o.controllers)}`,
    );
  const nodeCount = o.nodes === undefined ? count * DEMO_NODES_PER_CONTROLLER : parsePositiveInt(o.nodes, '--nodes');
  if (nodeCount < count || nodeCount > MAX_FLEET_DEMO_NODES)
    throw new HeraldError(
      'bad_option',
      `--nodes must be from ${count} (one per controller) to ${MAX_FLEET_DEMO_NODES} with --controllers ${count}, not ${nodeCount}`,
    );
  const stepTimeoutMs = parseDuration(o.timeout, '--timeout');
  let pgBin: string | undefined;
  if (o.db !== undefined) checkDbUrl(o.db);
  else {
    pgBin = findPgBin();
    if (!pgBin)
      throw new HeraldError(
        'bad_option',
        '--controllers needs PostgreSQL: give --db postgres://user@host:port/db (an empty database), or install PostgreSQL 15 or newer (Debian: apt-get install postgresql) for a throwaway server; no initdb found by pg_config --bindir or in /usr/lib/postgresql',
      );
  }
  return {
    names: fleetNames(count),
    ids: Array.from({ length: nodeCount }, (_, i) => `n${i + 1}`),
    stepTimeoutMs,
    db: o.db,
    pgBin,
  };
}

/** @throws HeraldError `bad_option` naming `--db` unless `db` is a `postgres://` URL */
function checkDbUrl(db: string): void {
  let ok = /^postgres(ql)?:\/\//.test(db);
  try {
    if (ok) ok = new URL(db).pathname.length > 1;
  } catch {
    ok = false;
  }
  if (!ok)
    throw new HeraldError(
      'bad_option',
      `--db must be a PostgreSQL URL, postgres://user[:password]@host:port/database, not ${JSON.stringify(redact(db))}`,
    );
}

/** The URL without its password, for messages. */
function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return url.replace(/:[^:@/]*@/, ':***@');
  }
}

/**
 * Connects to `--db` and refuses a database that is not the demo's to use: one that holds
 * nodes or configs, or has a live controller.
 * @throws HeraldError `bad_option` naming `--db`
 */
async function checkDb(db: string): Promise<void> {
  const { default: postgres } = await import('postgres');
  const sql = postgres(db, { max: 1, connect_timeout: DB_CONNECT_TIMEOUT_S, onnotice: () => {} });
  try {
    const [t] = await sql<{ nodes: string | null; controllers: string | null }[]>`
      SELECT to_regclass('nodes')::text AS nodes, to_regclass('controllers')::text AS controllers`;
    if (t?.nodes) {
      const [n] = await sql<{ used: boolean }[]>`
        SELECT EXISTS (SELECT 1 FROM nodes) OR EXISTS (SELECT 1 FROM configs) AS used`;
      if (n?.used)
        throw new HeraldError(
          'bad_option',
          `--db ${redact(db)} already holds nodes or configs (an earlier demo?): give the demo an empty database`,
        );
    }
    if (t?.controllers) {
      const [c] = await sql<
        { live: boolean }[]
      >`SELECT EXISTS (SELECT 1 FROM controllers WHERE lease_until > now()) AS live`;
      if (c?.live)
        throw new HeraldError(
          'bad_option',
          `--db ${redact(db)} has live controllers: give the demo a database of its own`,
        );
    }
  } catch (err) {
    if (err instanceof HeraldError) throw err;
    throw new HeraldError('bad_option', `--db ${redact(db)}: cannot use it: ${(err as Error).message}`);
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/** One run's places, processes and output. */
interface FleetRun {
  plan: FleetPlan;
  root: string;
  ownDir: boolean;
  pkiDir: string;
  nodesDir: string;
  t0: number;
  sup: DemoSupervisor;
  nodes: DemoNode[];
  ctls: FleetController[];
  pg?: ThrowawayPg;
  say(s: string): void;
  step(s: string): void;
}

/** Runs the demo; resolves with the exit status. */
export async function runControllersDemo(o: ControllersDemoOptions): Promise<number> {
  const plan = planFleet(o);
  if (plan.db) await checkDb(plan.db);
  const out = o.out ?? process.stdout;
  const root = path.resolve(o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-')));
  fs.mkdirSync(root, { recursive: true, mode: 0o700 });
  const nodesDir = path.join(root, 'nodes');
  const t0 = Date.now();
  const say = (s: string): void => void out.write(`${s}\n`);
  const run: FleetRun = {
    plan,
    root,
    ownDir: o.dir === undefined,
    pkiDir: path.join(root, 'pki'),
    nodesDir,
    t0,
    sup: new DemoSupervisor(root, [`demo_root=${nodesDir}`]),
    nodes: [],
    ctls: [],
    say,
    step: (s) => say(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(5)} s] ${s}`),
  };
  const stop = async (): Promise<void> => {
    for (const c of run.ctls) c.api.close();
    await run.sup.stopAll(() =>
      run.nodes.flatMap((n) => [readPid(path.join(n.dir, 'service.pid')), n.servicePid, n.containerPid]),
    );
    await run.pg?.stop();
    if (run.ownDir) fs.rmSync(run.root, { recursive: true, force: true });
  };
  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals): void => {
    interrupted = true;
    process.stderr.write(`\nherald demo: ${sig}: stopping everything\n`);
    void stop().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const clusterId = await setUp(run);
    const failures = await restartThroughKill(run, clusterId);
    await stop();
    run.say(
      run.ownDir
        ? `Stopped everything${run.pg ? ', PostgreSQL included,' : ''} and removed the directory.`
        : `Stopped everything; ${run.root} is kept.`,
    );
    return failures === 0 ? 0 : 1;
  } catch (err) {
    if (interrupted) return new Promise<number>(() => undefined);
    const msg =
      err instanceof DemoFailure || err instanceof HeraldError || err instanceof ThrowawayPgError
        ? err.message
        : err instanceof Error
          ? (err.stack ?? err.message)
          : String(err);
    process.stderr.write(`herald demo: failed: ${msg}\n`);
    for (const c of run.sup.children.filter((c) => c.exited && !c.name.startsWith('controller-')))
      process.stderr.write(`  ${c.name} exited; its log:\n${tail(c.log)}\n`);
    await stop();
    return 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** The database, PKI, controllers, agents (spread over the controllers) and a created cluster; returns its id. */
async function setUp(run: FleetRun): Promise<string> {
  const { names, ids } = run.plan;
  run.say(
    `Herald demo: ${names.length} controllers on one PostgreSQL, ${ids.length} nodes, a restart through a kill -9; in ${run.root}`,
  );
  let db = run.plan.db;
  if (db === undefined) {
    run.pg = await startThrowawayPg(run.plan.pgBin!, run.sup.env);
    db = await run.pg.createDatabase(DEMO_DATABASE);
    run.step(
      `PostgreSQL: a throwaway server on 127.0.0.1:${run.pg.port} (data in ${run.pg.dir}), database ${DEMO_DATABASE}`,
    );
  } else {
    run.step(`PostgreSQL: ${redact(db)}`);
  }
  await makeFleetPki(run.pkiDir, names, ids);
  run.step(
    `PKI made: CA, ${names.join(', ')} (each its own certificate and signing key), operator admin, ${ids.length} agents`,
  );
  run.ctls = await startControllers(run.sup, { pkiDir: run.pkiDir, db, names, timeoutMs: run.plan.stepTimeoutMs });
  run.step(
    `controllers listening: ${run.ctls.map((c) => `${c.name} ${c.url}`).join(', ')} (logs: logs/controller-*.log)`,
  );
  const first = run.ctls[0]!;
  const agents = await startNodes(run.sup, first, {
    pkiDir: run.pkiDir,
    nodesDir: run.nodesDir,
    ids,
    timeoutMs: run.plan.stepTimeoutMs,
    nodes: run.nodes,
    controllerUrls: run.ctls.map((c) => c.url),
  });
  const watch = [...run.ctls.map((c) => c.child), ...agents];
  const view = await waitSpread(run.sup, run.ctls, {
    live: names.length,
    nodeCount: ids.length,
    timeoutMs: run.plan.stepTimeoutMs,
    watch,
  });
  run.step(
    `${ids.length} agents registered, each knowing all ${names.length} controllers; the spread (herald controllers):`,
  );
  run.say(indent(controllersTable(view, Date.now())));
  const createStart = Date.now();
  const clusterId = await createCluster(run.sup, first.api, {
    nodesDir: run.nodesDir,
    nodes: run.nodes,
    timeoutMs: run.plan.stepTimeoutMs,
    watch,
  });
  run.step(
    `cluster ${clusterId} CREATE_COMPLETE in ${formatMs(Date.now() - createStart)}: the service runs on every node`,
  );
  return clusterId;
}

/**
 * Starts the restart through a survivor, kills the controller owning the most nodes as soon as
 * the first node has restarted, and follows both to their end; prints the timeline and the
 * checks. Resolves with how many checks failed.
 */
async function restartThroughKill(run: FleetRun, clusterId: string): Promise<number> {
  const before = await controllersView(run.ctls);
  const victimRow = victimOf(before);
  const victim = run.ctls.find((c) => c.name === victimRow.name)!;
  const survivors = run.ctls.filter((c) => c !== victim);
  const orphans = (await nodesHeldBy(victim)).sort(byNodeNumber);
  if (orphans.length !== victimRow.nodes_owned)
    throw new DemoFailure(`${victim.name} owns ${victimRow.nodes_owned} nodes but is connected to ${orphans.length}`);
  const api = survivors[0]!.api;
  run.say('');
  const startedAt = new Date();
  await api.patch(`/v1/clusters/${encodeURIComponent(clusterId)}/actions/restart`, {});
  run.step(
    `restart accepted by ${survivors[0]!.name}; ${victim.name} owns the most nodes (${orphans.join(', ')}): it is killed -9 once the first node has restarted`,
  );
  const t: Takeover = { victim: victim.name, orphans, killedAt: 0, pinged: new Map() };
  const events: WatchEvent[] = [];
  let doneAtKill = 0;
  let watching: Promise<void> | undefined;
  let killFailure: unknown;
  let pid = 0;
  const result = await watchRestart(api, {
    clusterId,
    startedAt,
    timeoutMs: run.plan.stepTimeoutMs + TAKEOVER_WATCH_MS,
    pollIntervalMs: 250,
    onEvent: (e) => {
      events.push(e);
      if (watching || killFailure || e.kind !== 'phase' || e.phase !== 'complete') return;
      doneAtKill = events.filter((x) => x.kind === 'phase' && x.phase === 'complete').length;
      try {
        pid = kill9(victim);
      } catch (err) {
        killFailure = err;
        return;
      }
      t.killedAt = Date.now();
      watching = watchTakeover(survivors, before, t, t.killedAt + TAKEOVER_WATCH_MS);
    },
  });
  if (killFailure) throw killFailure;
  if (!watching) throw new DemoFailure('the restart ended before a node had restarted: nothing was killed');
  await watching;
  const endedAt = events.find((e) => e.kind === 'status' && /_(COMPLETE|FAILED)$/.test(e.status))?.at.getTime();

  run.say('');
  run.say(`Timeline, from the kill -9 of ${victim.name}:`);
  for (const line of timeline(t, events, {
    startedAt: startedAt.getTime(),
    pid,
    doneAtKill,
    total: run.plan.ids.length,
    endedAt,
  }))
    run.say(line);
  run.say('');
  // held counts are reported with the heartbeat: wait for the survivors' next one, or show what is
  const after = await waitSpread(run.sup, survivors, {
    live: survivors.length,
    nodeCount: run.plan.ids.length,
    timeoutMs: AFTER_SETTLE_MS,
    watch: [],
  }).catch(() => controllersView(survivors));
  run.say('After (herald controllers):');
  run.say(indent(controllersTable(after, Date.now())));
  run.say('');

  const checks = fleetChecks(run, t, result, startedAt.getTime());
  const { rows, failures } = checkNodes(run.nodes);
  run.say(table(['NODE', 'CONTAINER PID', 'VOLUME FILES', 'SERVICE PID', 'SCRIPTS'], rows).trimEnd());
  run.say('');
  for (const c of checks) run.say(`${c.ok ? '✓' : '✗'} ${c.text}`);
  for (const f of failures) run.say(`✗ ${f}`);
  const failed = checks.filter((c) => !c.ok).length + failures.length;
  run.say(
    failed === 0
      ? `✓ all checks hold (${((Date.now() - run.t0) / 1000).toFixed(1)} s in all)`
      : `${failed} check(s) failed; the controllers' logs are in ${path.join(run.root, 'logs')}${run.ownDir ? ' (removed on exit: use --dir to keep them)' : ''}`,
  );
  return failed;
}

/** The story from the kill: seconds relative to it, one line per step. */
function timeline(
  t: Takeover,
  events: WatchEvent[],
  o: { startedAt: number; pid: number; doneAtKill: number; total: number; endedAt: number | undefined },
): string[] {
  const at = (ms: number): string => {
    const s = (ms - t.killedAt) / 1000;
    return `${s < 0 ? '-' : '+'}${Math.abs(s).toFixed(2)} s`.padStart(10);
  };
  const lines: Array<[number, string]> = [
    [o.startedAt, 'restart accepted'],
    [
      t.killedAt,
      `kill -9 ${t.victim} (pid ${o.pid}), owner of ${t.orphans.length} of ${o.total} nodes (${t.orphans.join(', ')}); ${o.doneAtKill} node(s) restarted so far`,
    ],
  ];
  if (t.takenOverAt !== undefined) {
    const gained = [...(t.gained ?? [])].filter(([, n]) => n > 0).map(([c, n]) => `${c} +${n}`);
    lines.push([t.takenOverAt, `${t.victim} not live, its nodes taken over: ${gained.join(', ') || '-'}`]);
  }
  for (const [node, p] of t.pinged) lines.push([p.at, `${node} pinged by its new owner ${p.by}`]);
  for (const e of events)
    if (e.kind === 'phase' && e.at.getTime() >= t.killedAt && t.orphans.includes(e.node) && e.phase !== 'pending')
      lines.push([e.at.getTime(), `${e.node} ${e.phase}`]);
  if (o.endedAt !== undefined) {
    const end = events.find((e) => e.kind === 'status' && e.at.getTime() === o.endedAt);
    lines.push([o.endedAt, end?.kind === 'status' ? end.status : 'restart ended']);
  }
  return lines.sort((a, b) => a[0] - b[0]).map(([ms, text]) => `${at(ms)}  ${text}`);
}

/** The restart completed; the takeover was within TAKEOVER_LIMIT_MS; each node ran each step once. */
function fleetChecks(
  run: FleetRun,
  t: Takeover,
  r: WatchResult,
  startedAt: number,
): Array<{ ok: boolean; text: string }> {
  const status = r.cluster?.status ?? '?';
  const restart = r.ok
    ? {
        ok: true,
        text: `the restart completed: ${status} ${formatMs(Date.now() - startedAt)} after the PATCH, through the kill`,
      }
    : {
        ok: false,
        text: r.timedOut
          ? `the restart did not finish within ${formatMs(run.plan.stepTimeoutMs + TAKEOVER_WATCH_MS)}`
          : `the restart ended ${status}: ${r.failed.map((f) => `${f.node}: ${f.reason}`).join('; ') || 'no reason'}`,
      };
  const missing = t.orphans.filter((n) => !t.pinged.has(n));
  const lastPing = Math.max(t.takenOverAt ?? Number.POSITIVE_INFINITY, ...[...t.pinged.values()].map((p) => p.at));
  const within = missing.length === 0 && t.takenOverAt !== undefined && lastPing - t.killedAt <= TAKEOVER_LIMIT_MS;
  const takeover = {
    ok: within,
    text:
      missing.length > 0
        ? `not every orphaned node was pinged by a new owner within ${formatMs(TAKEOVER_WATCH_MS)}: ${missing.join(', ')}`
        : t.takenOverAt === undefined
          ? `${t.victim} was never seen dead with its nodes taken over`
          : `takeover: every node of ${t.victim} (${t.orphans.join(', ')}) owned and pinged by a survivor ${formatMs(lastPing - t.killedAt)} after the kill (limit ${formatMs(TAKEOVER_LIMIT_MS)})`,
  };
  const counts = run.nodes.map((n) => ({ id: n.id, steps: restartSteps(n) }));
  const wrong = counts.filter((c) => c.steps.join(',') !== 'uninstall RESTART,install RESTART');
  const once = {
    ok: wrong.length === 0,
    text:
      wrong.length === 0
        ? `every step ran exactly once: on each of the ${counts.length} nodes the scripts counted one uninstall, then one install`
        : `steps did not run exactly once: ${wrong.map((c) => `${c.id}: ${c.steps.join(', ') || 'none'}`).join('; ')}`,
  };
  return [restart, takeover, once];
}

/** The restart's steps as the node's scripts logged them (`<node>/runs.log`), in order. */
function restartSteps(n: DemoNode): string[] {
  try {
    return fs
      .readFileSync(path.join(n.dir, 'runs.log'), 'utf8')
      .split('\n')
      .filter((l) => l.endsWith(' RESTART'));
  } catch {
    return [];
  }
}

function byNodeNumber(a: string, b: string): number {
  return Number(a.slice(1)) - Number(b.slice(1));
}

function indent(s: string): string {
  return s
    .trimEnd()
    .split('\n')
    .map((l) => `  ${l}`)
    .join('\n');
}
