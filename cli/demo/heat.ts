/**
 * `herald demo --heat` (docs/heat.md): unmodified OpenStack Heat drives Herald. On 127.0.0.1, in
 * one directory: a PKI, a controller serving Heat's object store (`--object-store-listen`, a
 * static token file), three agents, and standalone Heat from Debian (cli/testbed/heat.ts) whose
 * catalog names that object store. A stack of the cluster-restart blueprint
 * (cli/demo/heat-restart.yaml: per node a DeployedServer, an install and an uninstall
 * SoftwareDeployment) is created, then restarted with `openstack stack update --existing
 * --parameter restart_trigger=1`, and the timeline is printed (cli/demo/heat-report.ts): the
 * command, Heat's API receiving the PATCH (Heat's log), each metadata PUT reaching Herald (the
 * controller's `heat.metadata` events), each hook's start (the scripts write the time), Heat's
 * UPDATE_COMPLETE; beside it what os-collect-config's polling would have added, computed.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { HeraldError } from '../../protocol/errors.js';
import type { ListEnvelope, NodeView } from '../../protocol/rest.js';
import { clientFromOptions, type ApiClient } from '../operator/client.js';
import { formatMs, parseDuration } from '../operator/format.js';
import { HEAT_SERVICE_PACKAGES, heatAvailable, startHeat, type Heat, type OpenstackResult } from '../testbed/heat.js';
import { requestReceivedAt, stackEndedAt } from '../testbed/heat-log.js';
import { OCC_POLLING_INTERVAL_DEFAULT_S } from '../testbed/occ-node.js';
import { makePki } from '../testbed/pki.js';
import type { TestbedController } from '../testbed/controller.js';
import { heraldBin } from '../testbed/process.js';
import { TestbedError } from '../testbed/wait.js';
import {
  heatChecks,
  heatMetadataPuts,
  heatTimelineLines,
  pollingLines,
  pushGapTable,
  type HeatHook,
  type HeatRestartFacts,
} from './heat-report.js';
import { heraldCommand, writeStopScript } from './report.js';
import { DemoFailure, DemoSupervisor, tail, type Child } from './supervisor.js';
import { whileWaiting } from './waiting.js';

/** The demo's nodes: one per server of cli/demo/heat-restart.yaml. */
export const HEAT_DEMO_NODES = ['n1', 'n2', 'n3'] as const;
/** The stack's name. */
export const HEAT_DEMO_STACK = 'herald-demo';
/** A step's time limit unless `--timeout` says otherwise: Heat's steps take tens of seconds on a loaded machine. */
export const HEAT_DEMO_STEP_TIMEOUT = '4m';
/** Heat finds the object store as this project's account (the token file's catalog). */
const PROJECT = 'admin';

export interface HeatDemoOptions {
  keep: boolean;
  dir?: string | undefined;
  /** Each step's limit (default HEAT_DEMO_STEP_TIMEOUT). */
  timeout?: string | undefined;
  /** Where the demo talks (default stdout). */
  out?: NodeJS.WritableStream & { isTTY?: boolean };
}

interface HeatRun {
  root: string;
  ownDir: boolean;
  pkiDir: string;
  marksDir: string;
  stepTimeoutMs: number;
  t0: number;
  token: string;
  sup: DemoSupervisor;
  out: NodeJS.WritableStream & { isTTY?: boolean };
  ctl?: TestbedController;
  api?: ApiClient;
  agents: Child[];
  heat?: Heat;
  say(s: string): void;
  step(s: string): void;
}

/** The restart's template, beside `bin/herald` in the checkout (the build copies no data file). */
export function heatDemoTemplate(): string {
  return path.resolve(path.dirname(heraldBin()), '..', 'cli', 'demo', 'heat-restart.yaml');
}

/**
 * Runs the demo; resolves with the exit status (0: every check held).
 * @throws HeraldError `bad_option` when Heat is not installed (naming Debian's packages) or an option is wrong
 */
export async function runHeatDemo(o: HeatDemoOptions): Promise<number> {
  if (!heatAvailable(false))
    throw new HeraldError(
      'bad_option',
      `--heat needs OpenStack Heat and its CLI, not installed here (Debian: apt-get install --no-install-recommends ${HEAT_SERVICE_PACKAGES.join(' ')})`,
    );
  const run = prepare(o);
  const stop = async (): Promise<void> => {
    run.api?.close();
    await run.heat?.stop();
    await run.sup.stopAll(() => []);
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
    await setUp(run);
    const failures = report(run, await restart(run));
    if (o.keep) {
      keepRunning(run);
      return failures === 0 ? 0 : 1;
    }
    await stop();
    run.say(run.ownDir ? 'Stopped everything and removed the directory.' : `Stopped everything; ${run.root} is kept.`);
    return failures === 0 ? 0 : 1;
  } catch (err) {
    if (interrupted) return new Promise<number>(() => undefined);
    const msg =
      err instanceof DemoFailure || err instanceof HeraldError || err instanceof TestbedError
        ? err.message
        : err instanceof Error
          ? (err.stack ?? err.message)
          : String(err);
    process.stderr.write(`herald demo: failed: ${msg}\n`);
    if (o.keep) {
      process.stderr.write(`herald demo: --keep: left everything in ${run.root}; stop with: sh ${stopScript(run)}\n`);
      release(run);
      return 1;
    }
    for (const c of run.sup.children.filter((c) => c.hasExited()))
      process.stderr.write(`  ${c.name} exited; its log:\n${tail(c.logFile)}\n`);
    await stop();
    return 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

function prepare(o: HeatDemoOptions): HeatRun {
  const out = o.out ?? process.stdout;
  const stepTimeoutMs = parseDuration(o.timeout ?? HEAT_DEMO_STEP_TIMEOUT, '--timeout');
  const root = path.resolve(o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-')));
  fs.mkdirSync(root, { recursive: true, mode: 0o700 });
  const marksDir = path.join(root, 'marks');
  fs.mkdirSync(marksDir, { recursive: true });
  // the agents run their hooks as this user; the marks are the scripts' only output here
  fs.chmodSync(marksDir, 0o755);
  const t0 = Date.now();
  const say = (s: string): void => void out.write(`${s}\n`);
  return {
    root,
    ownDir: o.dir === undefined,
    pkiDir: path.join(root, 'pki'),
    marksDir,
    stepTimeoutMs,
    t0,
    token: crypto.randomBytes(32).toString('hex'),
    sup: new DemoSupervisor(root),
    out,
    agents: [],
    say,
    step: (s) => say(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(5)} s] ${s}`),
  };
}

/** PKI, the controller with the object store, the agents, Heat, and the stack created. */
async function setUp(run: HeatRun): Promise<void> {
  const nodes = HEAT_DEMO_NODES;
  run.say(`Herald demo with OpenStack Heat: a ${nodes.length}-node cluster restart, on 127.0.0.1, in ${run.root}`);
  await makePki(run.pkiDir, { agents: [...nodes] });
  // the token Heat passes on to the object store, known to the controller by its digest only
  const tokens = path.join(run.root, 'object-store-tokens');
  const digest = crypto.createHash('sha256').update(run.token).digest('hex');
  fs.writeFileSync(tokens, `${digest} ${PROJECT} heat-demo\n`, { mode: 0o600 });
  run.step(`PKI made: CA, controller, operator admin, ${nodes.length} agents; the object store's token file`);
  const ctl = await run.sup.bed.startController({
    pki: run.pkiDir,
    db: path.join(run.root, 'controller.db'),
    timeoutMs: run.stepTimeoutMs,
    args: ['--object-store-listen', '127.0.0.1:0', '--object-store-tokens', tokens, '--heat-project', PROJECT],
  });
  run.ctl = ctl;
  if (ctl.objectStorePort === undefined)
    throw new DemoFailure('the controller did not say where its object store listens');
  run.api = clientFromOptions({ controller: ctl.url, pki: run.pkiDir }, run.sup.env);
  run.step(
    `controller listening on ${ctl.url}, Heat's object store on https://127.0.0.1:${ctl.objectStorePort} (log: logs/controller.log)`,
  );
  for (const node of nodes)
    run.agents.push(
      run.sup.bed.startAgent({
        node,
        pki: run.pkiDir,
        stateDir: path.join(run.root, 'nodes', node, 'agent-state'),
        pollInterval: '30s',
      }).proc,
    );
  const api = run.api;
  await run.sup.waitFor(
    'every agent to announce its endpoint',
    run.stepTimeoutMs,
    async () => {
      const body = await api.get<ListEnvelope<NodeView>>('/v1/nodes');
      const ready = new Set(body.items.filter((n) => n.endpoint).map((n) => n.id));
      return nodes.every((id) => ready.has(id)) ? true : undefined;
    },
    [ctl.proc, ...run.agents],
  );
  run.step(`${nodes.length} agents registered (fallback polling every 30 s: only push makes the restart quick)`);

  const heatDir = path.join(run.root, 'heat');
  run.heat = await whileWaiting(
    run.out,
    'starting OpenStack Heat (heat-all: its database, then its API)',
    startHeat({
      objectStoreUrl: `https://127.0.0.1:${ctl.objectStorePort}/v1/AUTH_${PROJECT}`,
      caFile: path.join(run.pkiDir, 'ca.crt'),
      token: run.token,
      dir: heatDir,
      startTimeoutMs: run.stepTimeoutMs,
    }),
  );
  run.step(`OpenStack Heat answering on ${run.heat.apiUrl}, its object store Herald's (log: heat/heat-all.log)`);

  await openstack(run, 'creating the stack', [
    'stack',
    'create',
    '-t',
    heatDemoTemplate(),
    ...nodes.flatMap((n, i) => ['--parameter', `node_${i + 1}=${n}`]),
    '--parameter',
    `marks=${run.marksDir}`,
    '--wait',
    '--poll',
    '1',
    HEAT_DEMO_STACK,
  ]);
  const missing = nodes.filter((n) => hookStarts(run.marksDir, n, 'install', 0).length === 0);
  if (missing.length > 0) throw new DemoFailure(`the stack was created but no install ran on ${missing.join(', ')}`);
  run.step(
    `stack ${HEAT_DEMO_STACK} CREATE_COMPLETE: per node a DeployedServer with an install (actions CREATE, UPDATE) and an uninstall (UPDATE); each install ran`,
  );
}

/** The `openstack` CLI against the demo's Heat, shown as waiting; its stdout. @throws DemoFailure on a non-zero exit */
async function openstack(run: HeatRun, label: string, args: string[]): Promise<string> {
  const heat = run.heat!;
  const r: OpenstackResult = await whileWaiting(run.out, label, heat.openstack(args, run.stepTimeoutMs));
  if (r.code !== 0)
    throw new DemoFailure(
      `openstack ${args.slice(0, 2).join(' ')} exited ${r.code}:\n${r.stderr.trim()}\n${r.stdout.trim()}\nHeat's log:\n${heat.logTail(20)}`,
    );
  return r.stdout;
}

/** The times a hook started on `node` (each script appends ns since the epoch), in ms, at or after `afterMs`. */
export function hookStarts(marksDir: string, node: string, hook: HeatHook, afterMs: number): number[] {
  let text: string;
  try {
    text = fs.readFileSync(path.join(marksDir, `${node}.${hook}`), 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => /^\d{10,}$/.test(l.trim()))
    .map((l) => Number(BigInt(l.trim()) / 1000n) / 1000)
    .filter((ms) => ms >= afterMs);
}

/** The PATCH that restarts the stack, then what followed until Heat ended the update. */
async function restart(run: HeatRun): Promise<HeatRestartFacts> {
  const heat = run.heat!;
  run.say('');
  const cmdAt = Date.now();
  await openstack(run, 'openstack stack update (the CLI loads, then sends the PATCH)', [
    'stack',
    'update',
    '--existing',
    '--parameter',
    'restart_trigger=1',
    HEAT_DEMO_STACK,
  ]);
  run.step(
    `restart: openstack stack update --existing --parameter restart_trigger=1 ${HEAT_DEMO_STACK} → accepted (PATCH 202)`,
  );
  const ended = await whileWaiting(
    run.out,
    'Heat updating the stack: uninstall, then install, on every node',
    run.sup.waitFor(
      "Heat's UPDATE_COMPLETE",
      run.stepTimeoutMs,
      async () => stackEndedAt(heat.log(), HEAT_DEMO_STACK, 'UPDATE', cmdAt),
      [run.ctl!.proc, ...run.agents],
    ),
  );
  return {
    nodes: HEAT_DEMO_NODES,
    cmdAt,
    patchAt: requestReceivedAt(heat.log(), 'PATCH', HEAT_DEMO_STACK, cmdAt),
    puts: heatMetadataPuts(run.ctl!.proc.log(), cmdAt).filter((p) =>
      (HEAT_DEMO_NODES as readonly string[]).includes(p.node),
    ),
    hooks: HEAT_DEMO_NODES.flatMap((node) =>
      (['uninstall', 'install'] as const).flatMap((hook) =>
        hookStarts(run.marksDir, node, hook, cmdAt).map((at) => ({ node, hook, at })),
      ),
    ),
    ended,
    pollIntervalS: OCC_POLLING_INTERVAL_DEFAULT_S,
  };
}

/** Prints the timeline, the gaps, the comparison and the checks; returns how many checks failed. */
function report(run: HeatRun, f: HeatRestartFacts): number {
  run.say('');
  run.say('Timeline from the command (Heat, the controller and the hooks write their times; one clock):');
  for (const l of heatTimelineLines(f)) run.say(l);
  run.say('');
  run.say("Per node, from Heat's metadata write reaching Herald to the hook's start:");
  run.say(pushGapTable(f));
  run.say('');
  for (const l of pollingLines(f)) run.say(l);
  if (f.patchAt !== undefined && f.ended !== undefined)
    run.say(
      `Heat's PATCH → ${f.ended.action}_${f.ended.status}: ${formatMs(f.ended.at - f.patchAt)} (most of it Heat's own work: its convergence, its signal polls every ~1 s)`,
    );
  const failures = heatChecks(f);
  run.say('');
  if (failures.length > 0) for (const x of failures) run.say(`✗ ${x}`);
  else
    run.say(
      `✓ every node ran its uninstall, then its install, and Heat completed the update (${((Date.now() - run.t0) / 1000).toFixed(1)} s in all)`,
    );
  return failures.length;
}

/** `<root>/stop.sh` for `--keep`: the Herald processes, then Heat's process group. */
function stopScript(run: HeatRun): string {
  return writeStopScript(run.root, run.sup.children, [], run.ownDir, {
    groups: run.heat ? [run.heat.pid] : [],
  });
}

function release(run: HeatRun): void {
  run.api?.close();
  run.heat?.release();
  run.sup.release();
}

/** `--keep`: how to go on with the `openstack` CLI and Herald's, and how to stop it all. */
function keepRunning(run: HeatRun): void {
  const stop = stopScript(run);
  const heat = run.heat!;
  const herald = heraldCommand();
  const cli = `openstack --os-auth-type admin_token --os-token ${run.token} --os-endpoint ${heat.apiUrl}`;
  run.say('');
  run.say(
    `Left running (--keep): the controller, ${HEAT_DEMO_NODES.length} agents and Heat. Logs: ${run.root}/logs, ${heat.logFile}`,
  );
  run.say('');
  run.say('With the openstack CLI (Heat passes the token on to Herald):');
  run.say(`  ${cli} stack update --existing --parameter restart_trigger=2 --wait ${HEAT_DEMO_STACK}`);
  run.say(`  ${cli} stack output show ${HEAT_DEMO_STACK} results`);
  run.say('With the herald CLI:');
  run.say(`  HERALD_NO_CA_WARNING=1 ${herald} deploy list --node n1 --controller ${run.ctl!.url} --pki ${run.pkiDir}`);
  run.say('');
  run.say(`Stop everything${run.ownDir ? ' and remove the directory' : ''}: sh ${stop}`);
  release(run);
}
