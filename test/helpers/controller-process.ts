/**
 * A real `bin/herald controller` process for durability tests: started on port 0 (the bound
 * port is read from its "controller listening" log line), killed with any signal, restarted on
 * the same database.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const HERALD = path.join(REPO, 'bin', 'herald');

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
  log(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(sig: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of live) {
    try {
      process.kill(-c.pid!, 'SIGKILL');
    } catch {
      // gone
    }
  }
});

export async function startControllerProcess(
  args: string[],
  logFile: string,
  timeoutMs = 20_000,
  env: NodeJS.ProcessEnv = {},
): Promise<ControllerProc> {
  const fd = fs.openSync(logFile, 'a');
  const start = fs.statSync(logFile).size;
  const child = spawn(
    process.execPath,
    [HERALD, 'controller', '--listen', '127.0.0.1:0', '--push-workers', '0', ...args],
    {
      cwd: REPO,
      detached: true,
      stdio: ['ignore', fd, fd],
      env: { ...process.env, ...env },
    },
  );
  fs.closeSync(fd);
  live.add(child);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    });
  });
  const log = (): string => fs.readFileSync(logFile, 'utf8').slice(start);
  const t0 = Date.now();
  let port = 0;
  let gone = false;
  void exited.then(() => (gone = true));
  while (port === 0) {
    const m = /"listen":"127\.0\.0\.1:(\d+)"/.exec(log());
    if (m) port = Number(m[1]);
    else if (gone) throw new Error(`controller exited at start:\n${log()}`);
    else if (Date.now() - t0 > timeoutMs) throw new Error(`controller did not start in ${timeoutMs} ms:\n${log()}`);
    else await new Promise((r) => setTimeout(r, 20));
  }
  return {
    child,
    port,
    logFile,
    log,
    exited,
    kill: (sig) => {
      try {
        process.kill(-child.pid!, sig);
      } catch {
        // gone already
      }
      return exited;
    },
  };
}
