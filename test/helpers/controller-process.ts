/**
 * A real `bin/herald controller` process for durability tests, through the testbed
 * (cli/testbed/controller.ts): started on port 0 (the bound port is read from its "controller
 * listening" log line), killed with any signal, restarted on the same database.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { startController } from '../../cli/testbed/controller.js';
import type { Exit } from '../../cli/testbed/process.js';
import { HERALD, REPO, track } from './procs.js';

export { HERALD, REPO };

export function controllerBuilt(): boolean {
  return (
    fs.existsSync(path.join(REPO, 'dist', 'cli', 'main.js')) &&
    fs.existsSync(path.join(REPO, 'dist', 'controller', 'main.js'))
  );
}

export interface ControllerProc {
  child: ChildProcess;
  port: number;
  logFile: string;
  /** What it logged since it started. */
  log(): string;
  exited: Promise<Exit>;
  kill(sig: NodeJS.Signals): Promise<Exit>;
}

/** `args`: `herald controller` options (`--pki`, `--db`, ...) after `--listen 127.0.0.1:0 --push-workers 0`. */
export async function startControllerProcess(
  args: string[],
  logFile: string,
  timeoutMs = 20_000,
  env: NodeJS.ProcessEnv = {},
): Promise<ControllerProc> {
  const c = await startController({
    pushWorkers: 0,
    args,
    logFile,
    timeoutMs,
    cwd: REPO,
    env: { ...process.env, ...env },
    onStart: track,
  });
  const p = c.proc;
  return {
    child: p.child,
    port: c.port,
    logFile,
    log: p.log,
    exited: p.exited,
    kill: (sig) => {
      p.signal(sig);
      return p.exited;
    },
  };
}
