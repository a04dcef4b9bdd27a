/**
 * The testbed (docs/development.md, "The testbed"): real Herald processes on 127.0.0.1 in one
 * directory, started through `bin/herald` as an operator would start them: a PKI made by
 * certs/ (pki.ts), controllers on SQLite or on a throwaway PostgreSQL (cli/throwaway-pg.ts) the
 * testbed starts (controller.ts), agents (agent.ts), each process logging to a file of its own
 * (process.ts); and one `stop()` for all of it. The demo (`herald demo`), the benchmark and the
 * integration tests start their processes here.
 *
 *   const bed = new Testbed({ prefix: 'herald-e2e-' });
 *   const pki = await bed.makePki({ agents: ['n1'] });
 *   const ctl = await bed.startController();                 // SQLite in the bed's directory
 *   const a = bed.startAgent({ node: 'n1' });                 // knows every controller started
 *   await a.announced();
 *   ...
 *   await bed.stop();                                         // { kill9: true } for kill -9
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startThrowawayPg, type ThrowawayPg, type ThrowawayPgOptions } from '../throwaway-pg.js';
import { startAgent, type AgentOptions, type TestbedAgent } from './agent.js';
import { startController, type ControllerOptions, type TestbedController } from './controller.js';
import { makePki, type PkiOptions, type TestbedPki } from './pki.js';
import { spawnHerald, STOP_GRACE_MS, type HeraldProcess } from './process.js';
import { sleep, TestbedError } from './wait.js';

export interface TestbedOptions {
  /** Its directory (made when missing, and kept by `stop()`). Default: a new temporary one, removed by `stop()`. */
  dir?: string | undefined;
  /** The temporary directory's name prefix (default `herald-testbed-`). */
  prefix?: string | undefined;
  /** Where the processes' logs go (default: the directory itself). */
  logDir?: string | undefined;
  /** Every process's environment (default: this process's). */
  env?: NodeJS.ProcessEnv | undefined;
  /** Every process's working directory (default: this process's). */
  cwd?: string | undefined;
  /** Keep the directory at `stop()` even when it is a temporary one (to read the logs after). */
  keep?: boolean | undefined;
  /** Processes of their own process group (default true; see SpawnOptions.group). */
  group?: boolean | undefined;
  /** Told of every process the testbed starts, as it starts (a registry of the caller's). */
  onSpawn?: ((p: HeraldProcess) => void) | undefined;
}

type Role = 'controller' | 'agent' | 'other';

/** Runs in the bed's directory, its processes logging to `<logDir>/<label>.log`. */
type Placed<T> = Omit<T, 'logFile' | 'env' | 'cwd' | 'group'> & {
  /** Default `<logDir>/<label>.log`. */
  logFile?: string | undefined;
  /** More environment for this process, over the bed's. */
  env?: NodeJS.ProcessEnv | undefined;
};

export class Testbed {
  readonly dir: string;
  readonly logDir: string;
  readonly env: NodeJS.ProcessEnv;
  /** Every process started, in order, with its role (stopped agents first, controllers last). */
  readonly processes: Array<{ role: Role; proc: HeraldProcess }> = [];
  readonly controllers: TestbedController[] = [];
  pki: TestbedPki | undefined;
  pg: ThrowawayPg | undefined;
  readonly #own: boolean;
  readonly #o: TestbedOptions;
  #stopped: Promise<void> | undefined;

  /** Makes (or takes) the directory; starts nothing. */
  constructor(o: TestbedOptions = {}) {
    this.#o = o;
    this.#own = o.dir === undefined;
    this.dir = o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), o.prefix ?? 'herald-testbed-'));
    fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    this.logDir = o.logDir ?? this.dir;
    this.env = o.env ?? process.env;
  }

  /** Makes the PKI (default in `<dir>/pki`); the bed's controllers and agents use it. */
  async makePki(o: PkiOptions & { dir?: string } = {}): Promise<TestbedPki> {
    this.pki = await makePki(o.dir ?? path.join(this.dir, 'pki'), o);
    return this.pki;
  }

  /**
   * Starts a throwaway PostgreSQL (cli/throwaway-pg.ts), stopped by `stop()`, and creates
   * `database` on it; resolves to that database's URL, for `startController({ db })`.
   * @throws ThrowawayPgError when there is no server or it does not start
   */
  async startPg(binDir: string, database: string, o: ThrowawayPgOptions = {}): Promise<string> {
    if (this.pg) throw new TestbedError('bad_option', 'the testbed has its PostgreSQL already');
    this.pg = await startThrowawayPg(binDir, this.env, o);
    return this.pg.createDatabase(database);
  }

  /** Starts `bin/herald <args>` (not a controller or an agent: `herald <command>` for as long as it runs). */
  spawn(label: string, args: string[], o: { env?: NodeJS.ProcessEnv; logFile?: string } = {}): HeraldProcess {
    return this.#track('other', spawnHerald({ ...this.#place(label, o), name: label, args }));
  }

  /**
   * Starts a controller on the bed's PKI (default) and, unless `db` is given, on SQLite in
   * `<dir>/herald.db`; resolves once it is ready (see controller.ts).
   */
  async startController(o: Placed<ControllerOptions> = {}): Promise<TestbedController> {
    const label = o.label ?? (o.name === undefined ? 'controller' : `controller-${o.name}`);
    const c = await startController({
      pki: this.pki?.dir,
      db: path.join(this.dir, 'herald.db'),
      ...o,
      ...this.#place(label, o),
      label,
      onStart: (p) => this.#track('controller', p),
    });
    this.controllers.push(c);
    return c;
  }

  /**
   * Starts an agent on the bed's PKI (default), knowing every controller the bed started (default),
   * its state in `<dir>/state-<node>` (default); does not wait for it (see agent.ts).
   */
  startAgent(
    o: Placed<Omit<AgentOptions, 'controllers' | 'stateDir'>> & Partial<Pick<AgentOptions, 'controllers' | 'stateDir'>>,
  ): TestbedAgent {
    const label = o.label ?? `agent-${o.node}`;
    const a = startAgent({
      pki: this.pki?.dir,
      controllers: this.controllers.map((c) => c.url),
      stateDir: path.join(this.dir, `state-${o.node}`),
      ...o,
      ...this.#place(label, o),
      label,
    });
    this.#track('agent', a.proc);
    return a;
  }

  /**
   * Stops every process still running: agents and other commands first, then the controllers
   * (all signalled at once), with SIGTERM and SIGKILL after `graceMs`, or with SIGKILL at once
   * (`kill9`). Resolves once every one has exited.
   */
  async stopProcesses(o: { kill9?: boolean; graceMs?: number } = {}): Promise<void> {
    const order = [
      ...this.processes.filter((p) => p.role !== 'controller'),
      ...this.processes.filter((p) => p.role === 'controller'),
    ].map((p) => p.proc);
    for (const p of order) p.signal(o.kill9 ? 'SIGKILL' : 'SIGTERM');
    const deadline = Date.now() + (o.graceMs ?? STOP_GRACE_MS);
    while (!o.kill9 && order.some((p) => !p.hasExited()) && Date.now() < deadline) await sleep(50);
    for (const p of order) if (!p.hasExited()) p.signal('SIGKILL');
    await Promise.all(order.map((p) => p.exited));
  }

  /**
   * Stops everything (`stopProcesses`, then PostgreSQL) and removes the directory when it is the
   * bed's own and not kept. Idempotent.
   */
  stop(o: { kill9?: boolean; graceMs?: number } = {}): Promise<void> {
    this.#stopped ??= (async () => {
      await this.stopProcesses(o);
      if (o.kill9) await this.pg?.kill9();
      await this.pg?.stop();
      if (this.#own && !this.#o.keep) fs.rmSync(this.dir, { recursive: true, force: true });
    })();
    return this.#stopped;
  }

  /** Lets this process exit with the bed's processes still running (`herald demo --keep`). */
  release(): void {
    this.#stopped ??= Promise.resolve();
    for (const { proc } of this.processes) proc.child.unref();
    this.pg?.child.unref();
  }

  #place(label: string, o: { env?: NodeJS.ProcessEnv | undefined; logFile?: string | undefined }) {
    return {
      logFile: o.logFile ?? path.join(this.logDir, `${label}.log`),
      env: o.env === undefined ? this.env : { ...this.env, ...o.env },
      cwd: this.#o.cwd,
      group: this.#o.group,
    };
  }

  #track(role: Role, proc: HeraldProcess): HeraldProcess {
    this.processes.push({ role, proc });
    this.#o.onSpawn?.(proc);
    return proc;
  }
}
