/**
 * Real processes for integration tests, through the testbed (cli/testbed/): `bin/herald` started
 * detached (its own process group, so a kill reaches everything it started in that group), logs
 * in a work dir, a small HTTPS client with a certificate, and waiting for conditions instead of
 * sleeping. Every process started through here (or a testbed given `onSpawn: track`) is
 * SIGKILLed by `killAll()`.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../cli/testbed/ports.js';
import { heraldBin, spawnHerald, type HeraldProcess } from '../../cli/testbed/process.js';
import { waitFor as waitUntil } from '../../cli/testbed/wait.js';
import { isLiveState, parseProcStat, type ProcStat } from '../../protocol/proc-stat.js';

export { freePort };

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const HERALD = heraldBin();

/** Is the CLI built (dist/cli/main.js)? Integration suites need `npm run build` first. */
export function isBuilt(): boolean {
  return fs.existsSync(path.join(REPO, 'dist', 'cli', 'main.js'));
}

/** A process started through the testbed; `log()` is its whole log file (earlier starts under the same name included). */
export type Proc = HeraldProcess;

const live = new Set<Proc>();
// a test file that ends without killAll() leaves no process running
process.once('exit', () => {
  for (const p of live) p.signal('SIGKILL');
});

/** Registers `p` for `killAll()` (a testbed's `onSpawn`). */
export function track(p: Proc): void {
  live.add(p);
  void p.exited.then(() => live.delete(p));
}

/** A testbed process as a Proc (its whole log file), registered for `killAll()`. */
export function asProc(h: HeraldProcess): Proc {
  const p: Proc = { ...h, log: () => fs.readFileSync(h.logFile, 'utf8') };
  track(p);
  return p;
}

/** Starts `bin/herald <args>` detached, stdout and stderr appended to `<workDir>/<name>.log`. */
export function startHerald(name: string, args: string[], workDir: string, env: NodeJS.ProcessEnv = {}): Proc {
  const logFile = path.join(workDir, `${name}.log`);
  return asProc(spawnHerald({ name, args, logFile, cwd: REPO, env: { ...process.env, ...env } }));
}

export function hasExited(p: Proc): boolean {
  return p.hasExited();
}

/** Signals the process group and waits for the process to exit. */
export async function stopProc(p: Proc, sig: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  p.signal(sig);
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
export function waitFor<T>(what: string, fn: () => Promise<T> | T, ms = 15_000, everyMs = 20): Promise<NonNullable<T>> {
  return waitUntil(what, fn, { timeoutMs: ms, everyMs });
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
