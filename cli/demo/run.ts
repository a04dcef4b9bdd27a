/**
 * `herald demo`: a whole Herald installation on 127.0.0.1 in a temporary directory, one cluster
 * restart through it, and the checks that show what a restart promises: every node's service
 * was re-provisioned (new pid) while its volume and application container were left alone.
 *
 * The story, one module each: supervision (cli/demo/supervisor.ts: the processes, and stopping them
 * all on exit, on failure and on Ctrl-C unless `--keep`), fixtures (cli/demo/fixtures.ts: PKI,
 * controller, nodes, cluster), checks (cli/demo/checks.ts) and reporting (cli/demo/report.ts).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { HeraldError } from '../../protocol/errors.js';
import { checkNodes } from './checks.js';
import {
  createCluster,
  createHealthConfig,
  demoGroups,
  makePki,
  readPid,
  startController,
  startNodes,
  type DemoController,
  type DemoNode,
} from './fixtures.js';
import { keepRunning, timelineLines, wakeTable, writeStopScript } from './report.js';
import { DEMO_VIEWER, showViewer } from './viewer.js';
import { DemoFailure, DemoSupervisor, tail } from './supervisor.js';
import { formatMs, parseDuration, parsePositiveInt, table } from '../operator/format.js';
import { TestbedError } from '../testbed/wait.js';
import { freePort } from '../testbed/ports.js';
import { watchRestart, type WatchEvent } from '../operator/watch.js';

export { timelineLines } from './report.js';

/** Most nodes the demo starts (each is a Node.js process). */
export const MAX_DEMO_NODES = 50;

export interface DemoOptions {
  nodes: string;
  keep: boolean;
  dir?: string | undefined;
  timeout: string;
  /** The agents listen on nothing and dial out to the controller (docs/dial-out.md). */
  dialOut?: boolean;
  /** Two upgrades instead of the restart: one promoted canary, one reverted (cli/demo/upgrade.ts). */
  upgrade?: boolean;
  /** Where the demo talks (default stdout). */
  out?: NodeJS.WritableStream;
}

/** One run's places, processes and output. */
interface Run {
  root: string;
  ownDir: boolean;
  pkiDir: string;
  nodesDir: string;
  ids: string[];
  stepTimeoutMs: number;
  /** When the demo started (epoch ms). */
  t0: number;
  sup: DemoSupervisor;
  nodes: DemoNode[];
  dialOut: boolean;
  ctl?: DemoController;
  say(s: string): void;
  step(s: string): void;
}

/** Runs the demo; resolves with the exit status. */
export async function runDemo(o: DemoOptions): Promise<number> {
  const run = prepare(o);
  const stop = async (): Promise<void> => {
    run.ctl?.api.close();
    await run.sup.stopAll(() =>
      run.nodes.flatMap((n) => [readPid(path.join(n.dir, 'service.pid')), n.servicePid, n.containerPid]),
    );
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
    if (o.upgrade) {
      const { upgradeAndCheck } = await import('./upgrade.js');
      await upgradeAndCheck({
        api: run.ctl!.api,
        clusterId,
        healthId: await createHealthConfig(run.ctl!.api, run.nodesDir),
        nodesDir: run.nodesDir,
        nodes: run.nodes,
        stepTimeoutMs: run.stepTimeoutMs,
        say: run.say,
        step: run.step,
      });
    } else await restartAndCheck(run, clusterId);
    if (o.keep) {
      keepRunning(run.say, {
        root: run.root,
        pkiDir: run.pkiDir,
        controllerUrl: run.ctl!.url,
        clusterId,
        children: run.sup.children,
        nodes: run.nodes,
        ownDir: run.ownDir,
      });
      release(run);
      return 0;
    }
    await stop();
    run.say(run.ownDir ? 'Stopped everything and removed the directory.' : `Stopped everything; ${run.root} is kept.`);
    return 0;
  } catch (err) {
    // after Ctrl-C the steps in flight fail as their processes go: that is not news
    if (interrupted) return new Promise<number>(() => undefined);
    await reportFailure(run, err, o.keep, stop);
    return 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** Checks the options and makes the run's directory. */
function prepare(o: DemoOptions): Run {
  const out = o.out ?? process.stdout;
  const nodeCount = parsePositiveInt(o.nodes, '--nodes');
  if (nodeCount > MAX_DEMO_NODES) throw new HeraldError('bad_option', `--nodes must be at most ${MAX_DEMO_NODES}`);
  const stepTimeoutMs = parseDuration(o.timeout, '--timeout');
  const root = path.resolve(o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-')));
  fs.mkdirSync(root, { recursive: true, mode: 0o700 });
  const nodesDir = path.join(root, 'nodes');
  const t0 = Date.now();
  const say = (s: string): void => void out.write(`${s}\n`);
  return {
    root,
    ownDir: o.dir === undefined,
    pkiDir: path.join(root, 'pki'),
    nodesDir,
    ids: Array.from({ length: nodeCount }, (_, i) => `n${i + 1}`),
    stepTimeoutMs,
    t0,
    // the hooks get demo_root as an input: a service a hook started carries it in its environment
    sup: new DemoSupervisor(root, [`demo_root=${nodesDir}`]),
    nodes: [],
    dialOut: o.dialOut === true,
    say,
    step: (s) => say(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(5)} s] ${s}`),
  };
}

/** PKI, controller, nodes with their agents, and a created cluster; returns its id. */
async function setUp(run: Run): Promise<string> {
  const n = run.ids.length;
  run.say(`Herald demo: a ${n}-node cluster restart on 127.0.0.1, in ${run.root}`);
  await makePki(run.pkiDir, run.ids);
  run.step(`PKI made: CA, controller, operators admin and ${DEMO_VIEWER}, ${n} agents`);
  const connect = run.dialOut ? await freePort() : undefined;
  const ctl = await startController(run.sup, run.root, run.pkiDir, run.stepTimeoutMs, connect);
  run.ctl = ctl;
  run.step(
    `controller listening on ${ctl.url}${connect ? `, dialled-in connections on 127.0.0.1:${connect}` : ''} (log: logs/controller.log)`,
  );
  const agents = await startNodes(run.sup, ctl, {
    pkiDir: run.pkiDir,
    nodesDir: run.nodesDir,
    ids: run.ids,
    timeoutMs: run.stepTimeoutMs,
    nodes: run.nodes,
    ...(connect ? { dialOut: `wss://127.0.0.1:${connect}/v1/connect` } : {}),
  });
  run.step(
    run.dialOut
      ? `${n} agents dialled in (they listen on nothing); each node has a volume and an application container (a sleep process)`
      : `${n} agents registered; each node has a volume and an application container (a sleep process)`,
  );
  const createStart = Date.now();
  const clusterId = await createCluster(run.sup, ctl.api, {
    nodesDir: run.nodesDir,
    nodes: run.nodes,
    timeoutMs: run.stepTimeoutMs,
    watch: [ctl.proc, ...agents],
  });
  run.step(
    `cluster ${clusterId} CREATE_COMPLETE in ${formatMs(Date.now() - createStart)}: the service runs on every node`,
  );
  return clusterId;
}

/** The restart, its timeline and wake-up table, then the checks on every node. */
async function restartAndCheck(run: Run, clusterId: string): Promise<void> {
  const api = run.ctl!.api;
  run.say('');
  const healthId = await createHealthConfig(api, run.nodesDir);
  const { masters, workers } = demoGroups(run.ids);
  const startedAt = new Date();
  await api.patch(`/v1/clusters/${encodeURIComponent(clusterId)}/actions/restart`, { health_config_id: healthId });
  run.step(
    `restart: PATCH /v1/clusters/${clusterId}/actions/restart {"health_config_id"} → 204 in ${formatMs(Date.now() - startedAt.getTime())}: masters (${masters.join(', ') || 'none'}) one at a time, then workers (${workers.join(', ')}) together, each node ending with a health check`,
  );
  const events: WatchEvent[] = [];
  const result = await watchRestart(api, {
    clusterId,
    startedAt,
    timeoutMs: run.stepTimeoutMs,
    pollIntervalMs: 250,
    onEvent: (e) => void events.push(e),
  });
  if (result.timedOut) throw new DemoFailure(`the restart did not finish within ${formatMs(run.stepTimeoutMs)}`);
  if (!result.ok)
    throw new DemoFailure(
      `the restart ended ${result.cluster?.status ?? '?'}: ${result.failed.map((f) => `${f.node}: ${f.reason}`).join('; ')}`,
    );
  const totalMs = Date.now() - startedAt.getTime();

  for (const line of timelineLines(events, startedAt)) run.say(line);
  const order = rolloutOrder(events, masters, workers);
  if (order) throw new DemoFailure(order);
  run.say('');
  run.say(
    masters.length > 0
      ? `✓ masters restarted one at a time, and no worker started before the last master was healthy`
      : '✓ one worker group, restarted together',
  );
  const shown = workers[0] ?? masters[0]!;
  const lines = events.filter((e) => e.kind === 'output' && e.node === shown);
  run.say(`Live output of ${shown}, as it streamed while its steps ran (herald deploy logs --follow shows the same):`);
  for (const e of lines)
    if (e.kind === 'output') run.say(`  +${formatMs(e.at.getTime() - startedAt.getTime()).padStart(7)}  ${e.line}`);
  if (lines.length === 0) run.say('  (no line arrived before the step ended: the final result carries the output)');
  run.say('');
  run.say('Per node, after the PATCH (woken = the agent acknowledged a signed wake-up):');
  run.say(wakeTable(events, run.ids, startedAt));
  run.say(
    `RESTART_COMPLETE ${formatMs(totalMs)} after the PATCH, with the agents' fallback polling set to 30 s: push did it.`,
  );

  const { rows, failures } = checkNodes(run.nodes);
  run.say('');
  run.say(table(['NODE', 'CONTAINER PID', 'VOLUME FILES', 'SERVICE PID', 'SCRIPTS'], rows).trimEnd());
  run.say('');
  if (failures.length) {
    for (const f of failures) run.say(`✗ ${f}`);
    throw new DemoFailure(`${failures.length} check(s) failed`);
  }
  run.say(
    `✓ all ${run.ids.length} nodes re-provisioned: new service pids, same containers, same volumes (${((Date.now() - run.t0) / 1000).toFixed(1)} s in all)`,
  );
  run.say('');
  const viewer = await showViewer(api, {
    url: run.ctl!.url,
    pkiDir: run.pkiDir,
    env: run.sup.env,
    clusterId,
  });
  for (const line of viewer) run.say(line);
}

/** `--keep`: lets the demo exit with everything still running. */
function release(run: Run): void {
  run.ctl?.api.close();
  run.sup.release();
  for (const n of run.nodes) n.container.unref();
}

/** One line for the failure; then either `--keep`'s stop script or the logs of what died, and a stop. */
async function reportFailure(run: Run, err: unknown, keep: boolean, stop: () => Promise<void>): Promise<void> {
  const msg =
    err instanceof DemoFailure || err instanceof HeraldError || err instanceof TestbedError
      ? err.message
      : err instanceof Error
        ? (err.stack ?? err.message)
        : String(err);
  process.stderr.write(`herald demo: failed: ${msg}\n`);
  if (keep) {
    process.stderr.write(
      `herald demo: --keep: left everything in ${run.root} (logs in ${path.join(run.root, 'logs')}; stop with: sh ${path.join(run.root, 'stop.sh')})\n`,
    );
    writeStopScript(run.root, run.sup.children, run.nodes, run.ownDir);
    release(run);
    return;
  }
  for (const c of run.sup.children.filter((c) => c.hasExited()))
    process.stderr.write(`  ${c.name} exited; its log:\n${tail(c.logFile)}\n`);
  await stop();
}

/**
 * From the restart's phase events: why the rollout order is wrong (masters overlapping, or a
 * worker starting before the last master ended), or undefined when it is right.
 */
function rolloutOrder(events: WatchEvent[], masters: string[], workers: string[]): string | undefined {
  const span = (node: string): { start: number; end: number } | undefined => {
    let start: number | undefined;
    let end: number | undefined;
    for (const e of events) {
      if (e.kind !== 'phase' || e.node !== node) continue;
      if (start === undefined && e.phase === 'uninstalling') start = e.at.getTime();
      if (e.phase === 'complete') end = e.at.getTime();
    }
    return start === undefined || end === undefined ? undefined : { start, end };
  };
  const m = masters.map((n) => ({ n, s: span(n) }));
  for (const x of m) if (!x.s) return `no start and end seen for master ${x.n}`;
  const sorted = m.map((x) => ({ n: x.n, ...x.s! })).sort((a, b) => a.start - b.start);
  for (let i = 1; i < sorted.length; i++) {
    if (sorted[i]!.start < sorted[i - 1]!.end)
      return `masters ${sorted[i - 1]!.n} and ${sorted[i]!.n} were down at once`;
  }
  const lastMaster = Math.max(...sorted.map((x) => x.end), -Infinity);
  for (const w of workers) {
    const s = span(w);
    if (s && s.start < lastMaster) return `worker ${w} started before the last master ended`;
  }
  return undefined;
}
