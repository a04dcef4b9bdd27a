/**
 * The test bed of the several-controllers benchmark (docs/several-controllers.md): up to three real `herald
 * controller --name cN --db postgres://…` processes on one throwaway PostgreSQL (bench/pg.ts),
 * and one growing fleet of simulated agents (bench/sim-agent.ts, in harness processes) that know
 * every controller (`--controller-id '*'`, every URL, each agent starting at a different one, as a
 * load balancer would spread them).
 *
 * What the bed reads besides the controllers' API: the database itself (ownership rows, the
 * victim's lease, `pg_stat_database` and the transaction id counter) and /proc (CPU).
 */
import fs from 'node:fs';
import path from 'node:path';
import postgres from 'postgres';
import { pkiPaths } from '../certs/paths.js';
import { openPki } from '../cli/testbed/pki.js';
import type { ControllerView } from '../protocol/rest.js';
import { metricSum } from './api-client.js';
import { agentStateRoot, finishAndDeleteCluster, harnessProcsFor } from './fanout.js';
import { Fleet } from './fleet.js';
import { slot, type BenchPki } from './pki-cache.js';
import { exited, startController, stopController, type ControllerProc } from './procs.js';
import type { BenchPg } from './pg.js';
import { enableStatements, statementCounts, type StatementCounts } from './pg-statements.js';
import { childrenOf, say, treeSample, waitFor } from './util.js';

/**
 * Agents added at once when a fleet grows. Five thousand announcing at once kept every
 * controller's pool busy long enough that its membership heartbeat (same pool) missed the lease:
 * the controllers dropped their nodes over and over ("lease ended without a renewal") and never
 * held them all; a thousand at a time settles.
 */
const GROW_STEP_AGENTS = 1_000;

/** The controllers' names, in the order they are stopped last (c1 always runs). */
export const CONTROLLER_NAMES = ['c1', 'c2', 'c3'] as const;

/** Database counters: every commit (`pg_stat_database.xact_commit`, reads included) and the next transaction id (write transactions). */
export interface DbCounters {
  /** Epoch ms of the reading. */
  t: number;
  commits: number;
  xid: number;
}

/** Issues `controller/<name>` (certificate and signing key) in the cached PKI when it is not there yet. */
export async function ensureControllerCerts(pki: BenchPki, names: readonly string[]): Promise<void> {
  const p = pkiPaths(pki.dir);
  for (const name of names) {
    if (fs.existsSync(p.cert('controller', name)) && fs.existsSync(p.controllerJwk(name))) continue;
    await openPki(pki.dir).issue('controller', name);
    say(`several controllers: issued controller/${name} (certificate and signing key)`);
  }
}

export class SeveralBed {
  readonly controllers = new Map<string, ControllerProc>();
  fleet: Fleet | null = null;
  configId = '';
  /** The last run's cluster: completed and deleted before the next change. */
  cluster: { id: string; name: string } | null = null;
  readonly dir: string;
  readonly stateRoot: string;
  readonly #sql: postgres.Sql;
  #starts = 0;
  /** pg_stat_statements readable in this bed's database (see start()). */
  #statements = false;

  constructor(
    readonly o: {
      pki: BenchPki;
      runDir: string;
      /** Controller cN listens on port + N. */
      port: number;
      pg: BenchPg;
      dbUrl: string;
      pushWorkers?: number | undefined;
      /** This bed's controllers (a prefix of CONTROLLER_NAMES); its agents know only them. */
      names: readonly string[];
      label: string;
    },
  ) {
    this.dir = path.join(o.runDir, 'several', o.label);
    this.stateRoot = agentStateRoot(o.runDir, `several-${o.label}`);
    fs.rmSync(this.dir, { recursive: true, force: true });
    fs.rmSync(this.stateRoot, { recursive: true, force: true });
    fs.mkdirSync(this.dir, { recursive: true });
    this.#sql = postgres(o.dbUrl, {
      max: 2,
      onnotice: () => {},
      types: { bigint: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) } },
    });
  }

  get sql(): postgres.Sql {
    return this.#sql;
  }

  portOf(name: string): number {
    return this.o.port + CONTROLLER_NAMES.indexOf(name as (typeof CONTROLLER_NAMES)[number]) + 1;
  }

  urlOf(name: string): string {
    return `https://127.0.0.1:${this.portOf(name)}`;
  }

  /** The running controllers, in name order. */
  live(): ControllerProc[] {
    return CONTROLLER_NAMES.filter((n) => this.controllers.has(n)).map((n) => this.controllers.get(n)!);
  }

  nameOf(c: ControllerProc): string {
    return [...this.controllers].find(([, v]) => v === c)?.[0] ?? '?';
  }

  /** Any running controller's operator client (c1's when it runs). */
  get op(): ControllerProc['op'] {
    const c = this.live()[0];
    if (!c) throw new Error('no controller is running');
    return c.op;
  }

  async startController(name: string): Promise<ControllerProc> {
    const c = await startController({
      pki: this.o.pki,
      dir: this.dir,
      port: this.portOf(name),
      db: this.o.dbUrl,
      pushWorkers: this.o.pushWorkers,
      extra: ['--name', name],
      label: `${name}-${this.#starts++}`,
    });
    this.controllers.set(name, c);
    return c;
  }

  /** SIGTERM: the controller hands its nodes back as it leaves (the others claim them at once). */
  async stopController(name: string): Promise<void> {
    const c = this.controllers.get(name);
    if (!c) return;
    this.controllers.delete(name);
    await stopController(c, 'SIGTERM');
  }

  /** `kill -9` of the controller and its push workers at once (as of its process group); resolves (epoch ms of the kill) once it is gone. */
  async kill9(name: string, at: () => number): Promise<number> {
    const c = this.controllers.get(name)!;
    this.controllers.delete(name);
    c.op.close();
    const workers = childrenOf(c.pid);
    const t = at();
    c.proc.kill('SIGKILL');
    for (const w of workers) {
      try {
        process.kill(w, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await exited(c.proc);
    return t;
  }

  async start(): Promise<void> {
    this.#statements = this.o.pg.statements && (await enableStatements(this.#sql));
    for (const n of this.o.names) await this.startController(n);
    const cfg = await this.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'several',
      group: 'script',
      config: '#!/bin/sh\ntrue\n',
    });
    this.configId = cfg.id;
  }

  /**
   * Grows the fleet to `n` agents (hooks held), every one knowing this bed's controllers, in steps
   * of at most GROW_STEP_AGENTS, each step waiting until the controllers own and hold every node.
   */
  async grow(n: number, problems: string[]): Promise<{ addMs: number; added: number }> {
    const from = this.fleet?.size ?? 0;
    const t0 = Date.now();
    for (let have = from; have < n; have = this.fleet!.size)
      await this.#growStep(Math.min(n, have + GROW_STEP_AGENTS), problems);
    const fleet = this.fleet;
    if (fleet)
      await waitFor('start-up fetches', async () => (await fleet.counters()).fetch200 >= n, 30_000, 200).catch(
        () => undefined,
      );
    const addMs = Date.now() - t0;
    say(`several controllers: ${this.o.label}: grown to ${n} agents (+${n - from}) in ${Math.round(addMs / 1000)} s`);
    return { addMs, added: n - from };
  }

  async #growStep(n: number, problems: string[]): Promise<void> {
    const have = this.fleet?.size ?? 0;
    const slots = Array.from({ length: n - have }, (_, i) => slot('b', have + i));
    const fo = {
      pki: this.o.pki,
      slots,
      controllerUrl: this.urlOf('c1'),
      controllerUrls: this.o.names.map((c) => this.urlOf(c)),
      controllerId: '*',
      stateRoot: this.stateRoot,
      hook: 'hold' as const,
      procs: harnessProcsFor(slots.length),
      startConcurrency: 8,
    };
    let failed: string[];
    if (this.fleet === null) {
      const r = await Fleet.start(fo);
      this.fleet = r.fleet;
      failed = r.failed;
    } else {
      ({ failed } = await this.fleet.grow(fo));
    }
    if (failed.length > 0)
      problems.push(`growing to ${n}: ${failed.length} agents failed to start: ${failed.slice(0, 3).join('; ')}`);
    await this.steady(n, 60_000 + (n - have) * 80, problems, `growing to ${n}`);
  }

  /** `GET /v1/controllers` from a running controller. */
  async members(): Promise<ControllerView[]> {
    return (await this.op.must<{ items: ControllerView[] }>(200, 'GET', '/v1/controllers')).items;
  }

  /**
   * Waits until the running controllers (and only they) are live, own all `n` nodes between them
   * and hold each connected (their gauges and the rows agree). A missed wait is a problem, not a throw.
   */
  async steady(n: number, ms: number, problems: string[], what: string): Promise<boolean> {
    const want = this.live().map((c) => this.nameOf(c));
    let last = '';
    try {
      await waitFor(
        `${want.join(', ')} to own and hold all ${n} nodes`,
        async () => {
          const rows = (await this.members()).filter((r) => r.live);
          const owned = rows.reduce((a, r) => a + r.nodes_owned, 0);
          let connected = 0;
          for (const c of this.live()) connected += metricSum(await c.op.metrics(), 'herald_push_connected_agents');
          last = `${rows.map((r) => `${r.name} ${r.nodes_held}/${r.nodes_owned}`).join(', ')}; connected ${connected}`;
          return (
            rows.length === want.length &&
            rows.every((r) => want.includes(r.name) && r.nodes_held === r.nodes_owned) &&
            owned === n &&
            connected === n
          );
        },
        ms,
        250,
      );
      return true;
    } catch (err) {
      problems.push(`${what}: ${(err as Error).message} (last: ${last})`);
      return false;
    }
  }

  /** CPU seconds of each running controller with its push workers. */
  cpu(): Map<string, number> {
    const m = new Map<string, number>();
    for (const c of this.live()) m.set(this.nameOf(c), treeSample(c.pid).cpuS);
    return m;
  }

  async dbCounters(): Promise<DbCounters> {
    const xid = 'pg_snapshot_xmax(pg_current_snapshot())::text::bigint';
    const commits = '(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())';
    const [r] = await this.#sql.unsafe(`SELECT ${xid} AS xid, ${commits} AS commits`);
    return { t: Date.now(), commits: Number(r!.commits), xid: Number(r!.xid) };
  }

  /** Every statement's calls so far in this bed's database, or null without pg_stat_statements. */
  async statementCounts(): Promise<StatementCounts | null> {
    return this.#statements ? statementCounts(this.#sql) : null;
  }

  /**
   * Lets the held hooks end, waits for the last cluster's operation to finish, deletes it and
   * waits until it is gone (its nodes are free for the next run's cluster).
   */
  async settle(n: number, problems: string[]): Promise<void> {
    const fleet = this.fleet;
    if (fleet === null) return;
    await fleet.hold(false);
    await fleet.release();
    const c = this.cluster;
    if (c === null) return;
    try {
      // a cluster's operations on PostgreSQL take a statement per row (see several.ts RUN_WINDOW_MS)
      const limit = 120_000 + n * 100;
      await finishAndDeleteCluster(this.op, c, n, limit, limit);
    } catch (err) {
      problems.push(`settling ${c.name}: ${(err as Error).message}`);
    }
    this.cluster = null;
  }

  async stop(): Promise<void> {
    for (const name of [...this.controllers.keys()]) {
      const c = this.controllers.get(name)!;
      this.controllers.delete(name);
      await stopController(c, 'SIGKILL');
    }
    await this.fleet?.stop();
    await this.#sql.end({ timeout: 2 });
    fs.rmSync(this.stateRoot, { recursive: true, force: true });
  }
}
