/**
 * A throwaway PostgreSQL for the several-controllers benchmark (SPEC §7), the way
 * test/helpers/pg.ts starts one (not imported: bench/ does not depend on test/): `initdb` in a
 * directory of the run, a given port on 127.0.0.1, trust authentication for one local user, run
 * as the `postgres` user when the benchmark runs as root (PostgreSQL refuses to run as root).
 *
 * Unlike the tests' server it keeps `fsync` on: the store's commit latency is one of the
 * figures, and a commit that does not reach the disk is not the one a deployment pays.
 * The server runs in its own process group, so `close()` stops the postmaster and every backend.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import postgres from 'postgres';
import { track } from './procs.js';
import { waitFor } from './util.js';

const USER = 'herald';
/** Three controllers take (PG_POOL_CONNECTIONS + LISTEN) each; the benchmark's own readers a few more. */
const MAX_CONNECTIONS = 100;

export interface BenchPg {
  /** The maintenance database's URL. */
  readonly url: string;
  readonly port: number;
  readonly version: string;
  /** A new empty database; resolves to its URL. */
  createDatabase(name: string): Promise<string>;
  close(): Promise<void>;
}

/** The directory of PostgreSQL's server binaries, or undefined when none is installed. */
export function pgBinDir(): string | undefined {
  const fromPath = spawnSync('pg_config', ['--bindir'], { encoding: 'utf8' });
  const candidates: string[] = [];
  if (fromPath.status === 0) candidates.push(fromPath.stdout.trim());
  const debian = '/usr/lib/postgresql';
  if (fs.existsSync(debian))
    for (const v of fs.readdirSync(debian).sort((a, b) => Number(b) - Number(a)))
      candidates.push(path.join(debian, v, 'bin'));
  return candidates.find((d) => fs.existsSync(path.join(d, 'initdb')) && fs.existsSync(path.join(d, 'postgres')));
}

/** Starts a server with its data in `dir` (emptied first) on `port`. */
export async function startBenchPg(dir: string, port: number): Promise<BenchPg> {
  const bin = pgBinDir();
  if (!bin) throw new Error('no PostgreSQL server binaries (initdb, postgres): install Debian package postgresql');
  const asRoot = process.getuid?.() === 0;
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
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
    '--no-instructions',
  ]);
  if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr}`);
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
    `max_connections=${MAX_CONNECTIONS}`,
    '-c',
    'shared_buffers=128MB',
    '-c',
    'log_min_messages=fatal',
  ];
  const log = path.join(dir, 'server.log');
  const logFd = fs.openSync(log, 'a');
  if (asRoot) fs.fchownSync(logFd, idOf('-u'), idOf('-g'));
  const child: ChildProcess = track(
    asRoot
      ? spawn('runuser', ['-u', 'postgres', '--', path.join(bin, 'postgres'), ...args], {
          detached: true,
          stdio: ['ignore', logFd, logFd],
        })
      : spawn(path.join(bin, 'postgres'), args, { detached: true, stdio: ['ignore', logFd, logFd] }),
  );
  fs.closeSync(logFd);
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const url = `postgres://${USER}@127.0.0.1:${port}/postgres`;
  let version = '';
  await waitFor(
    `PostgreSQL on port ${port} (log: ${log})`,
    async () => {
      if (child.exitCode !== null) throw new Error(`postgres exited ${child.exitCode}; see ${log}`);
      const sql = postgres(url, { max: 1, connect_timeout: 2, onnotice: () => {} });
      try {
        version = String((await sql`SHOW server_version`)[0]?.server_version ?? '');
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
  let closed = false;
  return {
    url,
    port,
    version,
    async createDatabase(name) {
      const sql = postgres(url, { max: 1, onnotice: () => {} });
      try {
        await sql.unsafe(`CREATE DATABASE ${name}`);
      } finally {
        await sql.end({ timeout: 1 });
      }
      const u = new URL(url);
      u.pathname = `/${name}`;
      return u.toString();
    },
    async close() {
      if (closed) return;
      closed = true;
      try {
        process.kill(-child.pid!, 'SIGTERM');
      } catch {
        // gone
      }
      const t = setTimeout(() => {
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          // gone
        }
      }, 10_000);
      await exited;
      clearTimeout(t);
    },
  };
}

function idOf(flag: '-u' | '-g'): number {
  return Number(spawnSync('id', [flag, 'postgres'], { encoding: 'utf8' }).stdout.trim());
}
