/**
 * Real Herald processes for the benchmark: `herald controller` and `herald agent`, started
 * through the testbed (cli/testbed/) from the same compiled tree as this benchmark (`bin/herald`
 * runs `dist/cli/main.js`), with their logs in the run directory. They are not leaders of process
 * groups of their own: a signal reaches the process alone, as it did a process the benchmark
 * forks. Every process started here is killed when the benchmark exits (and, inside the
 * benchmark's own PID namespace, by the kernel when it dies).
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startAgent } from '../cli/testbed/agent.js';
import { startController as startTestbedController } from '../cli/testbed/controller.js';
import { OperatorClient } from './api-client.js';
import type { BenchPki } from './pki-cache.js';
import { descendantsOf, NO_HOOK_LAUNCHER_ENV, say, sleep } from './util.js';

export { freeLowPort } from '../cli/testbed/ports.js';

const live = new Set<ChildProcess>();
export function killAll(): void {
  for (const c of live) {
    try {
      c.kill('SIGKILL');
    } catch {
      // gone
    }
  }
  live.clear();
}

export function track(c: ChildProcess): ChildProcess {
  live.add(c);
  c.once('exit', () => live.delete(c));
  return c;
}

export function exited(c: ChildProcess): Promise<void> {
  return new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r() : c.once('exit', () => r())));
}

/** Stops `c` with `sig`, then SIGKILL after `ms`. */
export async function stopProc(c: ChildProcess, sig: NodeJS.Signals = 'SIGTERM', ms = 15_000): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return;
  c.kill(sig);
  const t = setTimeout(() => c.kill('SIGKILL'), ms);
  await exited(c);
  clearTimeout(t);
}

export interface ControllerProc {
  proc: ChildProcess;
  pid: number;
  port: number;
  url: string;
  db: string;
  op: OperatorClient;
  log: string;
  /** Time (epoch ms) the process was spawned and the moment /healthz first answered. */
  spawnedAt: number;
  readyAt: number;
}

export interface ControllerArgs {
  pki: BenchPki;
  dir: string;
  port: number;
  db?: string;
  pushWorkers?: number;
  logLevel?: string;
  extra?: string[];
  label?: string;
  /** Node flags for the controller (its push workers inherit them: fork keeps execArgv), e.g. --cpu-prof. */
  nodeArgs?: string[] | undefined;
}

export async function startController(a: ControllerArgs): Promise<ControllerProc> {
  const db = a.db ?? path.join(a.dir, 'controller.db');
  const log = path.join(a.dir, `${a.label ?? 'controller'}.log`);
  const spawnedAt = Date.now();
  // HERALD_BENCH_CONTROLLER_WRAP: a command the controller runs under, for diagnosis (e.g.
  // `heaptrack -o /tmp/ht`: where its native memory goes); words split on spaces
  const wrap = (process.env.HERALD_BENCH_CONTROLLER_WRAP ?? '').split(' ').filter(Boolean);
  // HERALD_BENCH_CONTROLLER_NODE_ARGS: node flags added after Herald's own (a later V8 flag wins), for
  // experiments on the controller alone (its push workers inherit them), e.g. `--trace-gc`
  const extraNode = (process.env.HERALD_BENCH_CONTROLLER_NODE_ARGS ?? '').split(' ').filter(Boolean);
  let proc: ChildProcess | undefined;
  try {
    await startTestbedController({
      label: a.label ?? 'controller',
      pki: a.pki.dir,
      db,
      port: a.port,
      pushWorkers: a.pushWorkers,
      logLevel: a.logLevel,
      args: a.extra,
      logFile: log,
      nodeArgs: [...(a.nodeArgs ?? []), ...extraNode],
      wrap,
      group: false,
      timeoutMs: 60_000,
      everyMs: 10,
      onStart: (p) => {
        proc = track(p.child);
      },
    });
  } catch (err) {
    say(tail(log));
    throw err;
  }
  return {
    proc: proc!,
    pid: proc!.pid!,
    port: a.port,
    url: `https://127.0.0.1:${a.port}`,
    db,
    op: new OperatorClient(a.pki.operator, '127.0.0.1', a.port, 64),
    log,
    spawnedAt,
    readyAt: Date.now(),
  };
}

export async function stopController(c: ControllerProc, sig: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  c.op.close();
  // under HERALD_BENCH_CONTROLLER_WRAP the controller is the wrapper's child (or further down):
  // a signal to the wrapper alone would leave it running, dialling agents that are gone
  if (process.env.HERALD_BENCH_CONTROLLER_WRAP)
    for (const p of descendantsOf(c.pid)) {
      try {
        process.kill(p, sig);
      } catch {
        // gone already
      }
    }
  await stopProc(c.proc, sig);
}

export interface AgentProcArgs {
  pki: BenchPki;
  node: string;
  controllerUrl: string;
  /** `--listen`; null: none (then `dialOut`). */
  listen: string | null;
  advertise?: string;
  /** `--dial-out`: the connect URL(s) it dials (docs/dial-out.md). */
  dialOut?: string;
  stateDir: string;
  logFile: string;
  extra?: string[];
  nodeArgs?: string[] | undefined;
}

/** A real `herald agent` process. */
export function startAgentProc(a: AgentProcArgs): ChildProcess {
  a.pki.ensureLayoutKey(a.node);
  const agent = startAgent({
    node: a.node,
    pki: a.pki.dir,
    controllers: [a.controllerUrl],
    listen: a.listen,
    advertise: a.advertise,
    stateDir: a.stateDir,
    args: [
      ...(a.dialOut !== undefined ? ['--dial-out', a.dialOut] : []),
      ...(a.extra ?? []),
      ...(process.env[NO_HOOK_LAUNCHER_ENV] === '1' ? ['--no-hook-launcher'] : []),
    ],
    logFile: a.logFile,
    nodeArgs: a.nodeArgs,
    group: false,
  });
  return track(agent.proc.child);
}

export function tail(file: string, lines = 15): string {
  try {
    return `--- ${file}\n${fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')}`;
  } catch {
    return `(no ${file})`;
  }
}

export { sleep };
