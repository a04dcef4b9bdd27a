/**
 * A real `herald controller` process of the testbed (docs/development.md, "The testbed"), on
 * SQLite (a file) or PostgreSQL (a `postgres://` URL: several controllers share one), ready once
 * it logs "controller listening": that line comes after the store is open, the push dialer has
 * its nodes and, on PostgreSQL, the controller has joined the fleet, and it names the port the
 * kernel gave when it was started on port 0 (no race for a port picked first).
 */
import fs from 'node:fs';
import { loggedPort, spawnHerald, type HeraldProcess, type SpawnOptions } from './process.js';
import { waitFor } from './wait.js';

/** How long a controller may take to log that it listens, unless told. */
export const CONTROLLER_READY_TIMEOUT_MS = 30_000;

export interface ControllerOptions extends Omit<SpawnOptions, 'args' | 'name'> {
  /** The name the process is known by (default `controller`, or `controller-<name>`). */
  label?: string | undefined;
  /** `--pki` (unless `args` or the environment give it). */
  pki?: string | undefined;
  /** `--db`: a SQLite file or a `postgres://` URL (unless `args` or the environment give it). */
  db?: string | undefined;
  /** `--name`: its certificate `controller/<name>` (default: none given, `controller`). */
  name?: string | undefined;
  /** Default 127.0.0.1. */
  host?: string | undefined;
  /** Default 0: the kernel picks, and the controller logs what it picked. */
  port?: number | undefined;
  /** `--push-workers` (default: none given, the controller's default). */
  pushWorkers?: number | undefined;
  /** `--log-level` (default `info`: readiness is read from an info line). */
  logLevel?: string | undefined;
  /** More `herald controller` options, after the testbed's (where one is given twice, the later wins). */
  args?: readonly string[] | undefined;
  /** How long it may take to be ready (default CONTROLLER_READY_TIMEOUT_MS). */
  timeoutMs?: number | undefined;
  /** How often its log is read meanwhile (default 20 ms). */
  everyMs?: number | undefined;
  /** Told of the process as soon as it is started, before it is ready (a registry of the caller's). */
  onStart?: ((proc: HeraldProcess) => void) | undefined;
}

export interface TestbedController {
  /** Its `--name`, or `controller`. */
  readonly name: string;
  readonly host: string;
  /** The port it listens on (the one it was given, or the one the kernel gave). */
  readonly port: number;
  /** `https://<host>:<port>`. */
  readonly url: string;
  /** The port of its object store (`--object-store-listen`, docs/heat.md) as it logged it; undefined without one. */
  readonly objectStorePort: number | undefined;
  /** `--db` as given (undefined when `args` or the environment gave it). */
  readonly db: string | undefined;
  readonly proc: HeraldProcess;
}

/**
 * Starts a controller; resolves once it is ready (it logged "controller listening").
 * @throws TestbedError `exited` (it exited first: a port taken, a bad option; with its log's
 *   tail) or `timeout`; the process is SIGKILLed then
 */
export async function startController(o: ControllerOptions): Promise<TestbedController> {
  const name = o.name ?? 'controller';
  const host = o.host ?? '127.0.0.1';
  const args = [
    'controller',
    '--listen',
    `${host.includes(':') ? `[${host}]` : host}:${o.port ?? 0}`,
    ...(o.pki !== undefined ? ['--pki', o.pki] : []),
    ...(o.db !== undefined ? ['--db', o.db] : []),
    ...(o.name !== undefined ? ['--name', o.name] : []),
    ...(o.pushWorkers !== undefined ? ['--push-workers', String(o.pushWorkers)] : []),
    '--log-level',
    o.logLevel ?? 'info',
    ...(o.args ?? []),
  ];
  const proc = spawnHerald({
    ...o,
    name: o.label ?? (o.name === undefined ? 'controller' : `controller-${o.name}`),
    args,
  });
  o.onStart?.(proc);
  let port: number;
  try {
    port = await waitFor(`${proc.name} to listen`, () => listenedPortIn(proc.log()), {
      timeoutMs: o.timeoutMs ?? CONTROLLER_READY_TIMEOUT_MS,
      everyMs: o.everyMs,
      watch: [proc],
    });
  } catch (err) {
    await proc.kill9();
    throw err;
  }
  return {
    name,
    host,
    port,
    url: `https://${host.includes(':') ? `[${host}]` : host}:${port}`,
    objectStorePort: loggedPort(proc.log(), 'controller listening', 'objectStore'),
    db: o.db,
    proc,
  };
}

/** The port in the last "controller listening" line (pino JSON) of `text`, if it holds one. */
export function listenedPortIn(text: string): number | undefined {
  return loggedPort(text, 'controller listening');
}

/** The port in a controller log file's last "controller listening" line, if it has logged one. */
export function listenedPort(logFile: string): number | undefined {
  try {
    return listenedPortIn(fs.readFileSync(logFile, 'utf8'));
  } catch {
    return undefined;
  }
}
