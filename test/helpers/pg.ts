/**
 * A throwaway PostgreSQL for tests (SPEC §7): `initdb` in a temp dir, a free port on 127.0.0.1,
 * trust authentication for one local user, run as the `postgres` user when the tests run as
 * root (PostgreSQL refuses to run as root). `HERALD_TEST_PG` (a `postgres://` URL of a server
 * the tests may create databases on) replaces it; `kill9()` and `restart()` need our own.
 *
 * The server runs in its own process group, so `kill9()` is what `kill -9` of PostgreSQL is:
 * the postmaster and every backend at once. `fsync=off` keeps tests fast; it loses nothing a
 * killed process wrote (the data is in the OS's page cache), only what a power cut would.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { pgBinDir } from '../../cli/throwaway-pg.js';
import { freePort, waitFor } from './procs.js';

export interface PgServer {
  /** A URL of the server's maintenance database (`postgres`). */
  readonly url: string;
  readonly port: number;
  /** Ours (true) or HERALD_TEST_PG's (false: kill9 and restart are not available). */
  readonly owned: boolean;
  /** A new empty database; resolves to its URL. */
  createDatabase(name?: string): Promise<string>;
  /** SIGKILL to the postmaster and every backend (its process group); resolves once all are gone. */
  kill9(): Promise<void>;
  /** Starts the server again on the same port and data directory; resolves when it accepts connections. */
  start(): Promise<void>;
  /** Stops the server and removes its data directory. Idempotent. */
  close(): Promise<void>;
}

const USER = 'herald';

// one home for where the binaries are: the demo's throwaway server looks there too
export { pgBinDir } from '../../cli/throwaway-pg.js';

/** Can tests get a PostgreSQL here (HERALD_TEST_PG, or the binaries to start one)? */
export function pgAvailable(): boolean {
  return Boolean(process.env.HERALD_TEST_PG) || pgBinDir() !== undefined;
}

let counter = 0;

/** Starts a throwaway server (or wraps HERALD_TEST_PG). Close it in afterAll. */
export async function startPg(): Promise<PgServer> {
  const external = process.env.HERALD_TEST_PG;
  if (external) return externalServer(external);
  const bin = pgBinDir();
  if (!bin) throw new Error('no PostgreSQL server binaries: install Debian package postgresql or set HERALD_TEST_PG');
  const asRoot = process.getuid?.() === 0;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pg-'));
  const data = path.join(dir, 'data');
  if (asRoot) spawnSync('chown', ['postgres:postgres', dir]);
  const run = (cmd: string, args: string[]) =>
    asRoot
      ? spawnSync('runuser', ['-u', 'postgres', '--', cmd, ...args], { encoding: 'utf8' })
      : spawnSync(cmd, args, { encoding: 'utf8' });
  const init = run(path.join(bin, 'initdb'), [
    '-D',
    data,
    '-U',
    USER,
    '--auth=trust',
    '-E',
    'UTF8',
    '--no-sync',
    '--no-instructions',
  ]);
  if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr}`);
  const port = await freePort();
  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();

  const start = async (): Promise<void> => {
    const args = [
      '-D',
      data,
      '-p',
      String(port),
      '-k',
      dir,
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'fsync=off',
      '-c',
      'max_connections=200',
      '-c',
      'shared_buffers=32MB',
      '-c',
      'log_min_messages=fatal',
    ];
    const logFd = fs.openSync(path.join(dir, 'server.log'), 'a');
    if (asRoot) fs.fchownSync(logFd, uidOf('postgres'), gidOf('postgres'));
    const c = asRoot
      ? spawn('runuser', ['-u', 'postgres', '--', path.join(bin, 'postgres'), ...args], {
          detached: true,
          stdio: ['ignore', logFd, logFd],
        })
      : spawn(path.join(bin, 'postgres'), args, { detached: true, stdio: ['ignore', logFd, logFd] });
    fs.closeSync(logFd);
    child = c;
    exited = new Promise((resolve) => c.once('exit', () => resolve()));
    const url = `postgres://${USER}@127.0.0.1:${port}/postgres`;
    await waitFor(
      `PostgreSQL on port ${port} (log: ${path.join(dir, 'server.log')})`,
      async () => {
        const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
        try {
          await sql`SELECT 1`;
          return true;
        } catch {
          return false;
        } finally {
          await sql.end({ timeout: 1 });
        }
      },
      30_000,
      50,
    );
  };

  const kill = async (sig: NodeJS.Signals): Promise<void> => {
    const c = child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    // runuser (when root) and the postmaster and its backends share the process group
    try {
      process.kill(-c.pid!, sig);
    } catch {
      /* gone already */
    }
    await exited;
    // backends may outlive the postmaster for a moment: wait until none holds the data directory
    await waitFor('PostgreSQL backends to exit', () => groupGone(c.pid!), 10_000);
  };

  await start();
  const url = `postgres://${USER}@127.0.0.1:${port}/postgres`;
  let closed = false;
  return {
    url,
    port,
    owned: true,
    createDatabase: (name) => createDatabase(url, name),
    kill9: () => kill('SIGKILL'),
    start,
    async close() {
      if (closed) return;
      closed = true;
      await kill('SIGTERM');
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

function externalServer(url: string): PgServer {
  const refuse = () => Promise.reject(new Error('HERALD_TEST_PG names a server these tests do not own'));
  return {
    url,
    port: Number(new URL(url).port || 5432),
    owned: false,
    createDatabase: (name) => createDatabase(url, name),
    kill9: refuse,
    start: refuse,
    close: () => Promise.resolve(),
  };
}

async function createDatabase(serverUrl: string, name?: string): Promise<string> {
  const db = name ?? `herald_test_${process.pid}_${++counter}`;
  const sql = postgres(serverUrl, { max: 1, onnotice: () => {} });
  try {
    await sql.unsafe(`CREATE DATABASE ${db}`);
  } finally {
    await sql.end({ timeout: 1 });
  }
  const u = new URL(serverUrl);
  u.pathname = `/${db}`;
  return u.toString();
}

function groupGone(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return false;
  } catch {
    return true;
  }
}

function uidOf(user: string): number {
  return Number(spawnSync('id', ['-u', user], { encoding: 'utf8' }).stdout.trim());
}

function gidOf(user: string): number {
  return Number(spawnSync('id', ['-g', user], { encoding: 'utf8' }).stdout.trim());
}
