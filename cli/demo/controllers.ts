/**
 * `herald demo --controllers N` (docs/several-controllers.md): N controllers on one PostgreSQL (the given `--db`, or
 * a throwaway server in a temporary directory), agents that know all of them, a cluster, and a
 * rolling restart during which the controller owning the most nodes is killed with SIGKILL. It
 * shows the spread, the timeline from the kill (its nodes taken over, each pinged by its new
 * owner, the restart's end) and checks that the restart completed, every step ran exactly once
 * (counted by the hook scripts on the nodes) and the takeover was within 10 s.
 *
 * The story, one module each: options and the database (cli/demo/fleet-plan.ts), fixtures
 * (cli/demo/fixtures.ts, cli/demo/fleet.ts), supervision (cli/demo/supervisor.ts), the timeline and checks
 * (cli/demo/fleet-report.ts), and the spread table (cli/operator/controllers.ts); here, the order of it.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { HeraldError } from '../../protocol/errors.js';
import { checkNodes } from './checks.js';
import { createCluster, readPid, startNodes, type DemoNode } from './fixtures.js';
import {
  controllersView,
  kill9,
  makeFleetPki,
  nodesHeldBy,
  startControllers,
  victimOf,
  waitSpread,
  watchTakeover,
  type FleetController,
  type Takeover,
} from './fleet.js';
import { checkDb, planFleet, redact, type ControllersDemoOptions, type FleetPlan } from './fleet-plan.js';
import { fleetChecks, indent, keepFleetRunning, timeline } from './fleet-report.js';
import { writeStopScript } from './report.js';
import { DemoFailure, DemoSupervisor, tail } from './supervisor.js';
import { controllersTable } from '../operator/controllers.js';
import { formatMs, table } from '../operator/format.js';
import { watchRestart, type WatchEvent, type WatchResult } from '../operator/watch.js';
import { TestbedError } from '../testbed/wait.js';
import { ThrowawayPgError, type ThrowawayPg } from '../throwaway-pg.js';

export type { ControllersDemoOptions } from './fleet-plan.js';

/** How long the demo watches for the takeover before it reports what it saw (a ✗). */
const TAKEOVER_WATCH_MS = 30_000;
/** How long the closing spread may take to show every node held again (two heartbeats). */
const AFTER_SETTLE_MS = 5_000;
const DEMO_DATABASE = 'herald_demo';

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
  /** The database's URL, once known. */
  db?: string;
  /** The controller the demo killed, once it has. */
  killed?: FleetController;
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
    await run.sup.bed.stop();
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
    const failures = await report(run, await restartThroughKill(run, clusterId));
    if (o.keep) {
      keepFleetRunning(run.say, {
        root: run.root,
        pkiDir: run.pkiDir,
        db: run.db!,
        clusterId,
        live: run.ctls.filter((c) => c !== run.killed),
        killed: run.killed,
        nodes: run.nodes.length,
        throwawayPg: run.pg !== undefined,
        stopScript: stopScript(run),
        ownDir: run.ownDir,
      });
      release(run);
      return failures === 0 ? 0 : 1;
    }
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
      err instanceof DemoFailure ||
      err instanceof HeraldError ||
      err instanceof ThrowawayPgError ||
      err instanceof TestbedError
        ? err.message
        : err instanceof Error
          ? (err.stack ?? err.message)
          : String(err);
    process.stderr.write(`herald demo: failed: ${msg}\n`);
    if (o.keep) {
      process.stderr.write(
        `herald demo: --keep: left everything in ${run.root} (logs in ${path.join(run.root, 'logs')}; stop with: sh ${stopScript(run)})\n`,
      );
      release(run);
      return 1;
    }
    const killed = run.killed ? `controller-${run.killed.name}` : undefined;
    for (const c of run.sup.children.filter((c) => c.hasExited() && c.name !== killed))
      process.stderr.write(`  ${c.name} exited; its log:\n${tail(c.logFile)}\n`);
    await stop();
    return 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** `<root>/stop.sh` for `--keep`: the processes, then PostgreSQL and its directory. */
function stopScript(run: FleetRun): string {
  return writeStopScript(run.root, run.sup.children, run.nodes, run.ownDir, {
    groups: run.pg?.child.pid ? [run.pg.child.pid] : [],
    dirs: run.pg ? [run.pg.dir] : [],
  });
}

/** `--keep`: lets the demo exit with everything still running. */
function release(run: FleetRun): void {
  for (const c of run.ctls) c.api.close();
  run.sup.release();
  for (const n of run.nodes) n.container.unref();
}

/** The database, PKI, controllers, agents (spread over the controllers) and a created cluster; returns its id. */
async function setUp(run: FleetRun): Promise<string> {
  const { names, ids } = run.plan;
  run.say(
    `Herald demo: ${names.length} controllers on one PostgreSQL, ${ids.length} nodes, a restart through a kill -9; in ${run.root}`,
  );
  let db = run.plan.db;
  if (db === undefined) {
    db = await run.sup.bed.startPg(run.plan.pgBin!, DEMO_DATABASE);
    const pg = run.sup.bed.pg!;
    run.pg = pg;
    run.db = db;
    run.step(`PostgreSQL: a throwaway server on 127.0.0.1:${pg.port} (data in ${pg.dir}), database ${DEMO_DATABASE}`);
  } else {
    run.db = db;
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
  const watch = [...run.ctls.map((c) => c.proc), ...agents];
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

/** What the restart through the kill left to report. */
interface KillRun {
  t: Takeover;
  survivors: FleetController[];
  events: WatchEvent[];
  result: WatchResult;
  startedAt: number;
  endedAt: number | undefined;
  pid: number;
  doneAtKill: number;
}

/**
 * Starts the restart through a survivor, kills the controller owning the most nodes as soon as
 * the first node has restarted, and follows both, the restart and the takeover, to their end.
 */
async function restartThroughKill(run: FleetRun, clusterId: string): Promise<KillRun> {
  const before = await controllersView(run.ctls);
  const victimRow = victimOf(before);
  const victim = run.ctls.find((c) => c.name === victimRow.name)!;
  const survivors = run.ctls.filter((c) => c !== victim);
  const orphans = (await nodesHeldBy(victim)).sort(byNodeNumber);
  if (orphans.length !== victimRow.nodes_owned)
    throw new DemoFailure(`${victim.name} owns ${victimRow.nodes_owned} nodes but is connected to ${orphans.length}`);
  const api = survivors[0]!.api;
  run.say('');
  const startedAt = Date.now();
  await api.patch(`/v1/clusters/${encodeURIComponent(clusterId)}/actions/restart`, {});
  run.step(
    `restart accepted by ${survivors[0]!.name}; ${victim.name} owns the most nodes (${orphans.join(', ')}): it is killed -9 once the first node has restarted`,
  );
  const k: Omit<KillRun, 'result' | 'endedAt'> = {
    t: { victim: victim.name, orphans, killedAt: 0, pinged: new Map() },
    survivors,
    events: [],
    startedAt,
    pid: 0,
    doneAtKill: 0,
  };
  let watching: Promise<void> | undefined;
  let killFailure: unknown;
  const result = await watchRestart(api, {
    clusterId,
    startedAt: new Date(startedAt),
    timeoutMs: run.plan.stepTimeoutMs + TAKEOVER_WATCH_MS,
    pollIntervalMs: 250,
    onEvent: (e) => {
      k.events.push(e);
      if (watching || killFailure || e.kind !== 'phase' || e.phase !== 'complete') return;
      k.doneAtKill = k.events.filter((x) => x.kind === 'phase' && x.phase === 'complete').length;
      try {
        run.killed = victim;
        k.pid = kill9(victim);
      } catch (err) {
        killFailure = err;
        return;
      }
      k.t.killedAt = Date.now();
      watching = watchTakeover(survivors, before, k.t, k.t.killedAt + TAKEOVER_WATCH_MS);
    },
  });
  if (killFailure) throw killFailure;
  if (!watching) throw new DemoFailure('the restart ended before a node had restarted: nothing was killed');
  await watching;
  const end = k.events.find((e) => e.kind === 'status' && /_(COMPLETE|FAILED)$/.test(e.status));
  return { ...k, result, endedAt: end?.at.getTime() };
}

/** The timeline from the kill, the spread after, and the checks; resolves with how many failed. */
async function report(run: FleetRun, k: KillRun): Promise<number> {
  run.say('');
  run.say(`Timeline, from the kill -9 of ${k.t.victim}:`);
  const o = {
    startedAt: k.startedAt,
    pid: k.pid,
    doneAtKill: k.doneAtKill,
    total: run.plan.ids.length,
    endedAt: k.endedAt,
  };
  for (const line of timeline(k.t, k.events, o)) run.say(line);
  run.say('');
  // held counts are reported with the heartbeat: wait for the survivors' next one, or show what is
  const after = await waitSpread(run.sup, k.survivors, {
    live: k.survivors.length,
    nodeCount: run.plan.ids.length,
    timeoutMs: AFTER_SETTLE_MS,
    watch: [],
  }).catch(() => controllersView(k.survivors));
  run.say('After (herald controllers):');
  run.say(indent(controllersTable(after, Date.now())));
  run.say('');

  const checks = fleetChecks(k.t, k.result, {
    nodes: run.nodes,
    startedAt: k.startedAt,
    endedAt: k.endedAt,
    timeoutMs: run.plan.stepTimeoutMs + TAKEOVER_WATCH_MS,
    watchMs: TAKEOVER_WATCH_MS,
  });
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

function byNodeNumber(a: string, b: string): number {
  return Number(a.slice(1)) - Number(b.slice(1));
}
