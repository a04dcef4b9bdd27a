/**
 * A throwaway PostgreSQL for tests (docs/several-controllers.md): cli/throwaway-pg.ts (`initdb` in a temp dir, a
 * free port on 127.0.0.1, run as the `postgres` user when the tests run as root), or the server
 * `HERALD_TEST_PG` names (a `postgres://` URL the tests may create databases on; `kill9()` and
 * `start()` need our own).
 */
import { pgBinDir, startThrowawayPg } from '../../cli/throwaway-pg.js';

export { pgBinDir };

export interface PgServer {
  /** A URL of the server's maintenance database (`postgres`). */
  readonly url: string;
  readonly port: number;
  /** Ours (true) or HERALD_TEST_PG's (false: kill9 and start are not available). */
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

/** Can tests get a PostgreSQL here (HERALD_TEST_PG, or the binaries to start one)? */
export function pgAvailable(): boolean {
  return Boolean(process.env.HERALD_TEST_PG) || pgBinDir() !== undefined;
}

let counter = 0;
const nextName = () => `herald_test_${process.pid}_${++counter}`;

/** Starts a throwaway server (or wraps HERALD_TEST_PG). Close it in afterAll. */
export async function startPg(): Promise<PgServer> {
  const external = process.env.HERALD_TEST_PG;
  if (external) return externalServer(external);
  const bin = pgBinDir();
  if (!bin) throw new Error('no PostgreSQL server binaries: install Debian package postgresql or set HERALD_TEST_PG');
  const pg = await startThrowawayPg(bin);
  return {
    url: pg.url,
    port: pg.port,
    owned: true,
    createDatabase: (name) => pg.createDatabase(name ?? nextName()),
    kill9: () => pg.kill9(),
    start: () => pg.start(),
    close: () => pg.stop(),
  };
}

function externalServer(url: string): PgServer {
  const refuse = () => Promise.reject(new Error('HERALD_TEST_PG names a server these tests do not own'));
  return {
    url,
    port: Number(new URL(url).port || 5432),
    owned: false,
    async createDatabase(name) {
      const { default: postgres } = await import('postgres');
      const db = name ?? nextName();
      const sql = postgres(url, { max: 1, onnotice: () => {} });
      try {
        await sql.unsafe(`CREATE DATABASE ${db}`);
      } finally {
        await sql.end({ timeout: 1 });
      }
      const u = new URL(url);
      u.pathname = `/${db}`;
      return u.toString();
    },
    kill9: refuse,
    start: refuse,
    close: () => Promise.resolve(),
  };
}
