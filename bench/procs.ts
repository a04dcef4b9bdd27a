/**
 * Real Herald processes for the benchmark: `herald controller` and `herald agent`, started from
 * the same compiled tree as this benchmark (`dist/cli/main.js`, what `bin/herald` runs), with
 * their logs in the run directory. Every process started here is killed when the benchmark
 * exits (and, inside the benchmark's own PID namespace, by the kernel when it dies).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { OperatorClient } from './api-client.js';
import type { BenchPki } from './pki-cache.js';
import { descendantsOf, NO_HOOK_LAUNCHER_ENV, say, sleep, waitFor } from './util.js';
import { HERALD_NODE_FLAGS } from '../protocol/node-flags.js';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The CLI entry of this build: `dist/cli/main.js` beside `dist/bench/`. */
export const HERALD_ENTRY = path.resolve(here, '..', 'cli', 'main.js');

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

/** A TCP port below the ephemeral range that is free on 127.0.0.1 now. */
export async function freeLowPort(from = 18443): Promise<number> {
  for (let p = from; p < from + 2000; p++) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(p, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) return p;
  }
  throw new Error('no free port below 20443');
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
  const fd = fs.openSync(log, 'a');
  const args = [
    HERALD_ENTRY,
    'controller',
    '--listen',
    `127.0.0.1:${a.port}`,
    '--pki',
    a.pki.dir,
    '--db',
    db,
    '--log-level',
    a.logLevel ?? 'info',
    ...(a.pushWorkers !== undefined ? ['--push-workers', String(a.pushWorkers)] : []),
    ...(a.extra ?? []),
  ];
  const spawnedAt = Date.now();
  // HERALD_BENCH_CONTROLLER_WRAP: a command the controller runs under, for diagnosis (e.g.
  // `heaptrack -o /tmp/ht`: where its native memory goes); words split on spaces
  const wrap = (process.env.HERALD_BENCH_CONTROLLER_WRAP ?? '').split(' ').filter(Boolean);
  // HERALD_BENCH_CONTROLLER_NODE_ARGS: node flags added after Herald's own (a later V8 flag wins), for
  // experiments on the controller alone (its push workers inherit them), e.g. `--trace-gc`
  const extraNode = (process.env.HERALD_BENCH_CONTROLLER_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const argv = [process.execPath, ...HERALD_NODE_FLAGS, ...(a.nodeArgs ?? []), ...extraNode, ...args];
  const proc = track(
    spawn(wrap[0] ?? argv[0]!, [...wrap.slice(1), ...(wrap.length ? argv : argv.slice(1))], {
      stdio: ['ignore', fd, fd],
    }),
  );
  fs.closeSync(fd);
  const op = new OperatorClient(a.pki.operator, '127.0.0.1', a.port, 64);
  try {
    await waitFor(
      'the controller to answer /healthz',
      async () => {
        if (proc.exitCode !== null) throw new Error(`controller exited ${proc.exitCode}; see ${log}`);
        return (await op.request('GET', '/healthz', undefined, 2_000)).status === 200;
      },
      60_000,
      10,
    );
  } catch (err) {
    say(tail(log));
    throw err;
  }
  return {
    proc,
    pid: proc.pid!,
    port: a.port,
    url: `https://127.0.0.1:${a.port}`,
    db,
    op,
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
  listen: string;
  advertise?: string;
  stateDir: string;
  logFile: string;
  extra?: string[];
  nodeArgs?: string[] | undefined;
}

/** A real `herald agent` process. */
export function startAgentProc(a: AgentProcArgs): ChildProcess {
  a.pki.ensureLayoutKey(a.node);
  const fd = fs.openSync(a.logFile, 'a');
  const args = [
    HERALD_ENTRY,
    'agent',
    '--node',
    a.node,
    '--controller',
    a.controllerUrl,
    '--listen',
    a.listen,
    ...(a.advertise ? ['--advertise', a.advertise] : []),
    '--pki',
    a.pki.dir,
    '--state-dir',
    a.stateDir,
    ...(a.extra ?? []),
    ...(process.env[NO_HOOK_LAUNCHER_ENV] === '1' ? ['--no-hook-launcher'] : []),
  ];
  const c = track(
    spawn(process.execPath, [...HERALD_NODE_FLAGS, ...(a.nodeArgs ?? []), ...args], { stdio: ['ignore', fd, fd] }),
  );
  fs.closeSync(fd);
  return c;
}

export function tail(file: string, lines = 15): string {
  try {
    return `--- ${file}\n${fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')}`;
  } catch {
    return `(no ${file})`;
  }
}

export { sleep };
