/**
 * Real processes for integration tests: `bin/herald` started detached (its own process group,
 * so a kill reaches everything it started in that group), logs in a work dir, a small HTTPS
 * client with a certificate, and waiting for conditions instead of sleeping.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { isLiveState, parseProcStat, type ProcStat } from '../../protocol/proc-stat.js';
import { HERALD_NODE_FLAGS } from '../../protocol/node-flags.js';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const HERALD = path.join(REPO, 'bin', 'herald');

/** Is the CLI built (dist/cli/main.js)? Integration suites need `npm run build` first. */
export function isBuilt(): boolean {
  return fs.existsSync(path.join(REPO, 'dist', 'cli', 'main.js'));
}

export interface Proc {
  name: string;
  child: ChildProcess;
  logFile: string;
  /** Resolves when the process has exited. */
  exited: Promise<void>;
  log(): string;
}

const live = new Set<Proc>();

/** Starts `bin/herald <args>` detached, stdout and stderr appended to `<workDir>/<name>.log`. */
export function startHerald(name: string, args: string[], workDir: string, env: NodeJS.ProcessEnv = {}): Proc {
  const logFile = path.join(workDir, `${name}.log`);
  const fd = fs.openSync(logFile, 'a');
  const child = spawn(process.execPath, [...HERALD_NODE_FLAGS, HERALD, ...args], {
    cwd: REPO,
    detached: true,
    stdio: ['ignore', fd, fd],
    env: { ...process.env, ...env },
  });
  fs.closeSync(fd);
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
  const p: Proc = { name, child, logFile, exited, log: () => fs.readFileSync(logFile, 'utf8') };
  live.add(p);
  void exited.then(() => live.delete(p));
  return p;
}

export function hasExited(p: Proc): boolean {
  return p.child.exitCode !== null || p.child.signalCode !== null;
}

/** Signals the process group and waits for the process to exit. */
export async function stopProc(p: Proc, sig: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (!hasExited(p) && p.child.pid !== undefined) {
    try {
      process.kill(-p.child.pid, sig);
    } catch {
      // gone already
    }
  }
  await p.exited;
}

/** SIGKILLs every process started here that still runs (afterAll). */
export async function killAll(): Promise<void> {
  await Promise.all([...live].map((p) => stopProc(p, 'SIGKILL')));
}

/** Runs `bin/herald <args>` to completion. */
export function heraldSync(args: string[]): { code: number | null; out: string; err: string } {
  const r = spawnSync(process.execPath, [HERALD, ...args], { cwd: REPO, encoding: 'utf8', timeout: 60_000 });
  return { code: r.status, out: r.stdout ?? '', err: r.stderr ?? '' };
}

/** A port free right now on 127.0.0.1 (racy by nature; a collision shows as an early exit). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export interface Cred {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
}

export function credOf(pkiDir: string, role: string, name: string): Cred {
  return {
    ca: fs.readFileSync(path.join(pkiDir, 'ca.crt')),
    cert: fs.readFileSync(path.join(pkiDir, role, `${name}.crt`)),
    key: fs.readFileSync(path.join(pkiDir, role, `${name}.key`)),
  };
}

export interface ApiResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  raw: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  json: any;
}

/** One HTTPS request with a client certificate (a fresh connection each time). */
export function api(
  port: number,
  c: Cred,
  method: string,
  p: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<ApiResponse> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: p,
        ca: c.ca,
        cert: c.cert,
        key: c.key,
        servername: 'localhost',
        agent: false,
        headers: {
          ...(data ? { 'content-type': 'application/json', 'content-length': String(data.length) } : {}),
          ...headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const raw = Buffer.concat(chunks).toString('utf8');
          let json: unknown;
          try {
            json = raw ? JSON.parse(raw) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, json });
        });
      },
    );
    req.on('error', reject);
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')));
    req.end(data);
  });
}

/**
 * Polls `fn` until it returns a truthy value (and returns it), or throws after `ms` naming
 * `what` and the last error. Polling a condition is the event here: the processes are separate.
 */
export async function waitFor<T>(
  what: string,
  fn: () => Promise<T> | T,
  ms = 15_000,
  everyMs = 20,
): Promise<NonNullable<T>> {
  const t0 = Date.now();
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (err) {
      last = err;
    }
    if (Date.now() - t0 > ms)
      throw new Error(
        `timed out after ${ms} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message ?? String(last)})` : ''}`,
      );
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** `/proc/<pid>/stat` of `pid`, parsed; undefined when the process is gone (or no /proc). */
export function readProcStat(pid: number): ProcStat | undefined {
  try {
    return parseProcStat(fs.readFileSync(`/proc/${pid}/stat`, 'latin1'));
  } catch {
    return undefined;
  }
}

/** Does `pid` run (and is not a zombie)? */
export function procAlive(pid: number): boolean {
  const s = readProcStat(pid);
  return s !== undefined && isLiveState(s.state);
}
