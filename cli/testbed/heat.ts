/**
 * Unmodified OpenStack Heat in the testbed (docs/development.md, "The testbed"): Debian's
 * python3-heat started standalone by cli/testbed/heat/run-heat.sh (one heat-all process, SQLite,
 * in-process RPC, noauth) in a temp dir on a free port, its object store the URL the caller
 * names (through the noauth token's catalog, the only way Heat finds one), and the unmodified
 * `openstack` CLI pointed at it. `herald demo --heat`, the benchmark (`--heat`) and the real-Heat
 * tests start Heat here. Heat's processes log in UTC, so its log's times can be read beside
 * Herald's.
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
import { freePort } from './ports.js';
import { heraldBin } from './process.js';
import { TestbedError } from './wait.js';

/** The Debian packages Heat itself needs here (bookworm: Heat 19, Zed), and the `openstack` CLI. */
export const HEAT_SERVICE_PACKAGES = ['python3-heat', 'python3-heatclient', 'python3-openstackclient'] as const;

/** The Debian packages of a stock node (cli/testbed/occ-node.ts). */
export const STOCK_NODE_PACKAGES = [
  'python3-os-collect-config',
  'python3-os-refresh-config',
  'python3-os-apply-config',
] as const;

/** Every Debian package the real-Heat suites need: Heat and a stock node's. */
export const HEAT_PACKAGES = [...HEAT_SERVICE_PACKAGES, ...STOCK_NODE_PACKAGES] as const;

/**
 * The runner's files (run-heat.sh, heat.conf.in, api-paste.ini, policy.yaml, make-token.py,
 * sqlite-autoincrement.py): in the checkout that holds `bin/herald`, whether this module runs
 * from the sources or from dist/ (the build copies no data file).
 */
export function heatRunnerDir(): string {
  return path.resolve(path.dirname(heraldBin()), '..', 'cli', 'testbed', 'heat');
}

/** Debian's interpreter: a python3 earlier on PATH (pyenv) lacks Debian's modules. */
const PYTHON = '/usr/bin/python3';
const SERVICE_MODULES = ['heat', 'heatclient', 'swiftclient', 'openstackclient'];
const STOCK_NODE_MODULES = ['os_collect_config', 'os_refresh_config', 'os_apply_config'];
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

const available = new Map<boolean, boolean>();

/**
 * Can Heat be started here: Debian's modules importable by /usr/bin/python3 and `openstack`
 * present; with `stockNode` (the default, what the real-Heat suites need) a stock node's too.
 */
export function heatAvailable(stockNode = true): boolean {
  let ok = available.get(stockNode);
  if (ok === undefined) {
    const modules = stockNode ? [...SERVICE_MODULES, ...STOCK_NODE_MODULES] : SERVICE_MODULES;
    ok =
      openstackPath() !== undefined &&
      spawnSync(PYTHON, ['-c', modules.map((m) => `import ${m}`).join('; ')], { stdio: 'ignore', timeout: 120_000 })
        .status === 0;
    available.set(stockNode, ok);
  }
  return ok;
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
  /** Heat's directory (made; kept by stop()). Default: a new temporary one, removed by stop(). */
  dir?: string;
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
  /** Heat's directory (heat.conf, token.json, heat.sqlite, logs); removed by stop() when it made it. */
  readonly dir: string;
  /** heat-all's own log (debug level, times in UTC). */
  readonly logFile: string;
  /** heat-all's log so far (empty when unreadable). */
  log(): string;
  /** The end of heat-all's logs, for a failure message. */
  logTail(lines?: number): string;
  /**
   * Runs the unmodified `openstack` CLI with `--os-auth-type none` (or `admin_token` with the
   * token given) `--os-endpoint <apiUrl>` and
   * `args`, without blocking the event loop (an object store in this process must keep answering).
   */
  openstack(args: string[], timeoutMs?: number): Promise<OpenstackResult>;
  /** SIGKILLs heat-all's process group and any `openstack` still running, removes the dir it made. Idempotent. */
  stop(): Promise<void>;
  /** Lets this process exit with heat-all still running (`herald demo --keep`); stop() then does nothing. */
  release(): void;
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
  // oslo.log writes local time without a zone: in UTC, its times can be read beside Herald's
  env.TZ = 'UTC';
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
  if (!heatAvailable(false) || !openstack)
    throw new TestbedError(
      'bad_option',
      `OpenStack Heat is not installed: apt-get install --no-install-recommends ${HEAT_SERVICE_PACKAGES.join(' ')}`,
    );
  if (o.caFile && !fs.existsSync(o.caFile)) throw new TestbedError('bad_option', `caFile ${o.caFile} does not exist`);
  const ownDir = o.dir === undefined;
  const dir = o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-heat-'));
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const env = heatEnv(dir, o.caFile);
  const port = await freePort();
  const apiUrl = `http://127.0.0.1:${port}/v1/admin`;
  const outFile = path.join(dir, 'heat-all.out');
  const logFile = path.join(dir, 'heat-all.log');
  const fd = fs.openSync(outFile, 'a');
  const child = spawn(path.join(heatRunnerDir(), 'run-heat.sh'), [dir, String(port), o.objectStoreUrl], {
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
      if (ownDir) fs.rmSync(dir, { recursive: true, force: true });
    })();
    return stopped;
  };
  const release = (): void => {
    stopped ??= Promise.resolve();
    child.unref();
  };

  const t0 = Date.now();
  for (;;) {
    if ((await httpStatus(`${apiUrl}/stacks`)) === 200) break;
    if (gone || Date.now() - t0 > o.startTimeoutMs) {
      const why = gone ? 'heat-all exited at start' : `heat-all did not answer in ${o.startTimeoutMs} ms`;
      const logs = logTail();
      await stop();
      throw new TestbedError(gone ? 'exited' : 'timeout', `${why}:\n${logs}`);
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

  const log = (): string => {
    try {
      return fs.readFileSync(logFile, 'utf8');
    } catch {
      return '';
    }
  };
  return { apiUrl, port, pid: child.pid!, dir, logFile, log, logTail, openstack: runOpenstack, stop, release };
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // gone already
  }
}
