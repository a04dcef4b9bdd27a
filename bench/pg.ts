/**
 * The PostgreSQL of the several-controllers benchmark (docs/several-controllers.md): cli/throwaway-pg.ts's server
 * (`initdb` in a temp dir, run as the `postgres` user when the benchmark runs as root) on the
 * port the run gives it, with `fsync` on: the store's commit latency is one of the figures, and
 * a commit that does not reach the disk is not the one a deployment pays.
 */
import fs from 'node:fs';
import path from 'node:path';
import postgres from 'postgres';
import { pgBinDir, startThrowawayPg } from '../cli/throwaway-pg.js';
import { track } from './procs.js';

/** Three controllers take (PG_POOL_CONNECTIONS + LISTEN + PG_CONTROL_CONNECTIONS) each; the benchmark's own readers a few more. */
const MAX_CONNECTIONS = 100;

export interface BenchPg {
  /** The maintenance database's URL. */
  readonly url: string;
  readonly port: number;
  readonly version: string;
  /**
   * Whether `pg_stat_statements` is loaded (its library was found beside the server's): each
   * database then counts its statements (bench/pg-statements.ts).
   */
  readonly statements: boolean;
  /** A new empty database; resolves to its URL. */
  createDatabase(name: string): Promise<string>;
  close(): Promise<void>;
}

/** Starts the server on `port`. */
export async function startBenchPg(port: number): Promise<BenchPg> {
  const bin = pgBinDir();
  if (!bin) throw new Error('no PostgreSQL server binaries (initdb, postgres): install Debian package postgresql');
  const statements = hasStatementsLibrary(bin);
  const pg = await startThrowawayPg(bin, process.env, {
    port,
    fsync: true,
    maxConnections: MAX_CONNECTIONS,
    sharedBuffers: '128MB',
    ...(statements
      ? { settings: { shared_preload_libraries: 'pg_stat_statements', 'pg_stat_statements.max': '5000' } }
      : {}),
  });
  track(pg.child);
  const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
  let version: string;
  try {
    version = String((await sql`SHOW server_version`)[0]?.server_version ?? '');
  } finally {
    await sql.end({ timeout: 1 });
  }
  return {
    url: pg.url,
    port: pg.port,
    version,
    statements,
    createDatabase: (name) => pg.createDatabase(name),
    close: () => pg.stop(),
  };
}

/** `pg_stat_statements` beside the server's binaries: Debian's `lib/` or the npm package's `lib/postgresql/`. */
function hasStatementsLibrary(bin: string): boolean {
  const root = path.dirname(bin);
  return ['lib', path.join('lib', 'postgresql')].some((d) =>
    fs.existsSync(path.join(root, d, 'pg_stat_statements.so')),
  );
}
