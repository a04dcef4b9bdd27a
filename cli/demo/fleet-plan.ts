/**
 * The options of `herald demo --controllers N` and the database it runs on, checked before
 * anything starts: every mistake is one `bad_option` line naming the option (docs/several-controllers.md: a
 * `postgres://` URL, an empty database; or, without `--db`, PostgreSQL's server binaries for a
 * throwaway server).
 */
import { HeraldError } from '../../protocol/errors.js';
import { fleetNames } from './fleet.js';
import { parseDuration, parsePositiveInt } from '../operator/format.js';
import { pgBinDir } from '../throwaway-pg.js';

export const MIN_DEMO_CONTROLLERS = 2;
export const MAX_DEMO_CONTROLLERS = 5;
/** Nodes per controller when `--nodes` is not given. */
export const DEMO_NODES_PER_CONTROLLER = 3;
/** Most nodes this demo starts (each is a Node.js process). */
export const MAX_FLEET_DEMO_NODES = 50;
/** How long the demo waits to reach a `--db` server. */
const DB_CONNECT_TIMEOUT_S = 5;

export interface ControllersDemoOptions {
  controllers: string;
  db?: string | undefined;
  nodes?: string | undefined;
  dir?: string | undefined;
  /** Leave everything running and say how to use it and how to stop it. */
  keep?: boolean;
  timeout: string;
  /** Where the demo talks (default stdout). */
  out?: NodeJS.WritableStream;
}

/** The checked options. */
export interface FleetPlan {
  names: string[];
  ids: string[];
  stepTimeoutMs: number;
  /** The `--db` URL, or undefined for a throwaway server made with the binaries in `pgBin`. */
  db: string | undefined;
  pgBin: string | undefined;
}

/**
 * Checks the options up front: `--controllers` 2..5, `--nodes` at least one per controller,
 * `--db` a `postgres://` URL, and, without `--db`, PostgreSQL's server binaries to be found by
 * `findPgBin`.
 * @throws HeraldError `bad_option` naming the option
 */
export function planFleet(o: ControllersDemoOptions, findPgBin: () => string | undefined = pgBinDir): FleetPlan {
  const count = /^\d+$/.test(o.controllers) ? Number(o.controllers) : Number.NaN;
  if (!(count >= MIN_DEMO_CONTROLLERS && count <= MAX_DEMO_CONTROLLERS))
    throw new HeraldError(
      'bad_option',
      `--controllers must be a whole number from ${MIN_DEMO_CONTROLLERS} to ${MAX_DEMO_CONTROLLERS}, not ${JSON.stringify(o.controllers)}`,
    );
  const nodeCount = o.nodes === undefined ? count * DEMO_NODES_PER_CONTROLLER : parsePositiveInt(o.nodes, '--nodes');
  if (nodeCount < count || nodeCount > MAX_FLEET_DEMO_NODES)
    throw new HeraldError(
      'bad_option',
      `--nodes must be from ${count} (one per controller) to ${MAX_FLEET_DEMO_NODES} with --controllers ${count}, not ${nodeCount}`,
    );
  const stepTimeoutMs = parseDuration(o.timeout, '--timeout');
  let pgBin: string | undefined;
  if (o.db !== undefined) checkDbUrl(o.db);
  else {
    pgBin = findPgBin();
    if (!pgBin)
      throw new HeraldError(
        'bad_option',
        '--controllers needs PostgreSQL: give --db postgres://user@host:port/db (an empty database), or install PostgreSQL 15 or newer (Debian: apt-get install postgresql) for a throwaway server; no initdb found by pg_config --bindir or in /usr/lib/postgresql',
      );
  }
  return {
    names: fleetNames(count),
    ids: Array.from({ length: nodeCount }, (_, i) => `n${i + 1}`),
    stepTimeoutMs,
    db: o.db,
    pgBin,
  };
}

/** @throws HeraldError `bad_option` naming `--db` unless `db` is a `postgres://` URL */
function checkDbUrl(db: string): void {
  let ok = /^postgres(ql)?:\/\//.test(db);
  try {
    if (ok) ok = new URL(db).pathname.length > 1;
  } catch {
    ok = false;
  }
  if (!ok)
    throw new HeraldError(
      'bad_option',
      `--db must be a PostgreSQL URL, postgres://user[:password]@host:port/database, not ${JSON.stringify(redact(db))}`,
    );
}

/** The URL without its password, for messages. */
export function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return url.replace(/:[^:@/]*@/, ':***@');
  }
}

/**
 * Connects to `--db` and refuses a database that is not the demo's to use: one that holds
 * nodes or configs, or has a live controller.
 * @throws HeraldError `bad_option` naming `--db`
 */
export async function checkDb(db: string): Promise<void> {
  const { default: postgres } = await import('postgres');
  const sql = postgres(db, { max: 1, connect_timeout: DB_CONNECT_TIMEOUT_S, onnotice: () => {} });
  try {
    const [t] = await sql<{ nodes: string | null; controllers: string | null }[]>`
      SELECT to_regclass('nodes')::text AS nodes, to_regclass('controllers')::text AS controllers`;
    if (t?.nodes) {
      const [n] = await sql<{ used: boolean }[]>`
        SELECT EXISTS (SELECT 1 FROM nodes) OR EXISTS (SELECT 1 FROM configs) AS used`;
      if (n?.used)
        throw new HeraldError(
          'bad_option',
          `--db ${redact(db)} already holds nodes or configs (an earlier demo?): give the demo an empty database`,
        );
    }
    if (t?.controllers) {
      const [c] = await sql<
        { live: boolean }[]
      >`SELECT EXISTS (SELECT 1 FROM controllers WHERE lease_until > now()) AS live`;
      if (c?.live)
        throw new HeraldError(
          'bad_option',
          `--db ${redact(db)} has live controllers: give the demo a database of its own`,
        );
    }
  } catch (err) {
    if (err instanceof HeraldError) throw err;
    throw new HeraldError('bad_option', `--db ${redact(db)}: cannot use it: ${(err as Error).message}`);
  } finally {
    await sql.end({ timeout: 1 });
  }
}
