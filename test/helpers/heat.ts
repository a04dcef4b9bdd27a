/**
 * Unmodified OpenStack Heat for tests: Debian's python3-heat started standalone by
 * test/fixtures/heat/run-heat.sh (one heat-all process, SQLite, in-process RPC, noauth) in a temp
 * dir on a free port, its object store the URL the caller names (through the noauth token's
 * catalog, the only way Heat finds one), and the unmodified `openstack` CLI pointed at it.
 *
 *   const heat = await startHeat({ objectStoreUrl: 'https://127.0.0.1:8443/v1/AUTH_admin', caFile });
 *   const r = await heat.openstack(['stack', 'list', '-f', 'json']);
 *   await heat.stop();
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { freePort, REPO } from './procs.js';

/** The Debian packages the Heat tests need (bookworm: Heat 19, Zed). */
export const HEAT_PACKAGES = [
  'python3-heat',
  'python3-heatclient',
  'python3-openstackclient',
  'python3-os-collect-config',
  'python3-os-refresh-config',
  'python3-os-apply-config',
] as const;

export const HEAT_FIXTURE_DIR = path.join(REPO, 'test', 'fixtures', 'heat');

/** Debian's interpreter: a python3 earlier on PATH (pyenv) lacks Debian's modules. */
const PYTHON = '/usr/bin/python3';
const MODULES = [
  'heat',
  'heatclient',
  'swiftclient',
  'openstackclient',
  'os_collect_config',
  'os_refresh_config',
  'os_apply_config',
];
/** Heat's API answers in ~4 s on an idle machine; a loaded 2-core one has taken 40 s. */
const HEAT_START_TIMEOUT_MS = 180_000;
const OPENSTACK_TIMEOUT_MS = 300_000;
const POLL_EVERY_MS = 250;

/** The `openstack` executable, or undefined. */
function openstackPath(): string | undefined {
  const dirs = ['/usr/bin', ...(process.env.PATH ?? '').split(path.delimiter)];
  for (const d of dirs) {
    const p = path.join(d, 'openstack');
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch {
      // not here
    }
  }
  return undefined;
}

let available: boolean | undefined;

/** Can tests start Heat here (Debian's modules importable by /usr/bin/python3, `openstack` present)? */
export function heatAvailable(): boolean {
  if (available === undefined) {
    available =
      openstackPath() !== undefined &&
      spawnSync(PYTHON, ['-c', MODULES.map((m) => `import ${m}`).join('; ')], { stdio: 'ignore', timeout: 120_000 })
        .status === 0;
  }
  return available;
}

export interface HeatOptions {
  /** The object store's account URL, e.g. `https://127.0.0.1:8443/v1/AUTH_admin` (project `admin`). */
  objectStoreUrl: string;
  /** The CA that heat-all trusts for an HTTPS object store (REQUESTS_CA_BUNDLE); default: the system's. */
  caFile?: string;
  /** How long heat-all may take to answer (default HEAT_START_TIMEOUT_MS). */
  startTimeoutMs?: number;
  /**
   * The token the `openstack` CLI sends (`--os-auth-type admin_token --os-token`), which Heat
   * passes on to the object store unchanged; default: none (`--os-auth-type none` sends `notused`).
   */
  token?: string;
}

export interface OpenstackResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export interface Heat {
  /** The orchestration endpoint, `http://127.0.0.1:<port>/v1/admin`. */
  readonly apiUrl: string;
  readonly port: number;
  /** heat-all's pid, also its process group. */
  readonly pid: number;
  /** The run's temp dir (heat.conf, token.json, heat.sqlite, logs); removed by stop(). */
  readonly dir: string;
  /** heat-all's own log (debug level). */
  readonly logFile: string;
  /** The end of heat-all's logs, for a failure message. */
  logTail(lines?: number): string;
  /**
   * Runs the unmodified `openstack` CLI with `--os-auth-type none` (or `admin_token` with the
   * token given) `--os-endpoint <apiUrl>` and
   * `args`, without blocking the event loop (an object store in this process must keep answering).
   */
  openstack(args: string[], timeoutMs?: number): Promise<OpenstackResult>;
  /** SIGKILLs heat-all's process group and any `openstack` still running, removes the dir. Idempotent. */
  stop(): Promise<void>;
}

/** The environment of Heat's processes: no OpenStack credentials or proxies from ours, caches in `dir`. */
function heatEnv(dir: string, caFile: string | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(OS_|PYTHON)/.test(k) || /^(https?|all|no)_proxy$/i.test(k)) continue;
    env[k] = v;
  }
  env.NO_PROXY = '127.0.0.1,localhost';
  // stevedore's entry-point cache would otherwise land in ~/.cache
  env.XDG_CACHE_HOME = path.join(dir, 'cache');
  env.PYTHONDONTWRITEBYTECODE = '1';
  if (caFile) env.REQUESTS_CA_BUNDLE = caFile;
  return env;
}

function httpStatus(url: string): Promise<number> {
  return new Promise((resolve) => {
    const req = http.get(url, { agent: false, headers: { 'x-auth-token': 'notused' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', () => resolve(0));
    req.setTimeout(10_000, () => req.destroy());
  });
}

function tail(file: string, lines: number): string {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/**
 * Starts Heat and resolves once its API answers. On failure everything started is removed.
 * @throws Error when the packages are missing, heat-all exits, or it does not answer in time
 */
export async function startHeat(opts: HeatOptions): Promise<Heat> {
  const o = { startTimeoutMs: HEAT_START_TIMEOUT_MS, ...opts };
  const openstack = openstackPath();
  if (!heatAvailable() || !openstack)
    throw new Error(
      `OpenStack Heat is not installed: apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')}`,
    );
  if (o.caFile && !fs.existsSync(o.caFile)) throw new Error(`caFile ${o.caFile} does not exist`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-heat-'));
  const env = heatEnv(dir, o.caFile);
  const port = await freePort();
  const apiUrl = `http://127.0.0.1:${port}/v1/admin`;
  const outFile = path.join(dir, 'heat-all.out');
  const logFile = path.join(dir, 'heat-all.log');
  const fd = fs.openSync(outFile, 'a');
  const child = spawn(path.join(HEAT_FIXTURE_DIR, 'run-heat.sh'), [dir, String(port), o.objectStoreUrl], {
    cwd: dir,
    detached: true,
    stdio: ['ignore', fd, fd],
    env,
  });
  fs.closeSync(fd);
  let gone = false;
  const exited = new Promise<void>((resolve) => {
    child.once('exit', () => {
      gone = true;
      resolve();
    });
  });
  const clis = new Set<ChildProcess>();
  let stopped: Promise<void> | undefined;

  const logTail = (lines = 30): string =>
    [`--- ${outFile}`, tail(outFile, lines), `--- ${logFile}`, tail(logFile, lines)].join('\n');

  const stop = (): Promise<void> => {
    stopped ??= (async () => {
      for (const c of clis) killGroup(c.pid);
      if (!gone) killGroup(child.pid);
      await exited;
      await Promise.all(
        [...clis].map(
          (c) => new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r(null) : c.once('exit', r))),
        ),
      );
      fs.rmSync(dir, { recursive: true, force: true });
    })();
    return stopped;
  };

  const t0 = Date.now();
  for (;;) {
    if ((await httpStatus(`${apiUrl}/stacks`)) === 200) break;
    if (gone || Date.now() - t0 > o.startTimeoutMs) {
      const why = gone ? 'heat-all exited at start' : `heat-all did not answer in ${o.startTimeoutMs} ms`;
      const logs = logTail();
      await stop();
      throw new Error(`${why}:\n${logs}`);
    }
    await new Promise((r) => setTimeout(r, POLL_EVERY_MS));
  }

  const runOpenstack = (args: string[], timeoutMs = OPENSTACK_TIMEOUT_MS): Promise<OpenstackResult> =>
    new Promise((resolve, reject) => {
      if (stopped) return reject(new Error('Heat is stopped'));
      const auth = o.token ? ['--os-auth-type', 'admin_token', '--os-token', o.token] : ['--os-auth-type', 'none'];
      const c = spawn(openstack, [...auth, '--os-endpoint', apiUrl, ...args], {
        cwd: dir,
        detached: true,
        stdio: ['ignore', 'pipe', 'pipe'],
        env,
      });
      clis.add(c);
      let stdout = '';
      let stderr = '';
      c.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
      c.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
      const timer = setTimeout(() => {
        stderr += `\n(killed after ${timeoutMs} ms)`;
        killGroup(c.pid);
      }, timeoutMs);
      c.once('error', reject);
      c.once('close', (code) => {
        clearTimeout(timer);
        clis.delete(c);
        resolve({ code, stdout, stderr });
      });
    });

  return { apiUrl, port, pid: child.pid!, dir, logFile, logTail, openstack: runOpenstack, stop };
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // gone already
  }
}
