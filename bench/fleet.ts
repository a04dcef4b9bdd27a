/**
 * The parent's side of the harness processes: forks them, deals the agents out, and asks them
 * questions (counters, run reports) over IPC.
 */
import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type {
  AgentRunReport,
  FirstWake,
  FromHarness,
  HarnessCounters,
  HarnessStart,
  HookMode,
  ToHarness,
  WakeAsk,
} from './harness.js';
import { MAX_DIALS_IN_FLIGHT } from '../protocol/limits.js';
import type { AgentSlot, BenchPki } from './pki-cache.js';
import { exited, track } from './procs.js';
import { nowMs, say, sleep } from './util.js';

/**
 * Dials out in flight at once in each of `procs` harness processes started together: the
 * controller's own bound on its dials in listener mode (MAX_DIALS_IN_FLIGHT) shared among them,
 * so that both modes hold as many handshakes in flight (sim-agent.ts).
 */
export function dialConcurrencyFor(procs: number): number {
  return Math.ceil(MAX_DIALS_IN_FLIGHT / Math.max(1, procs));
}

const HARNESS = path.join(path.dirname(fileURLToPath(import.meta.url)), 'harness.js');

export interface FleetOptions {
  pki: BenchPki;
  slots: AgentSlot[];
  controllerUrl: string;
  /** Several controllers: every agent knows them all (see HarnessStart.controllerUrls). */
  controllerUrls?: string[];
  controllerId?: string;
  /** Every agent dials this connect URL (`--dial-out`) and listens on nothing. */
  dialOut?: string;
  stateRoot: string;
  hook: HookMode;
  procs: number;
  pollIntervalMs?: number;
  pollIntervalHealthyMs?: number;
  announce?: boolean;
  startConcurrency?: number;
  fetchConcurrency?: number;
  /** Dials out in flight at once per harness process (default dialConcurrencyFor(procs)). */
  dialConcurrency?: number;
  /** Extra node flags for the harness processes (e.g. --cpu-prof). */
  execArgv?: string[];
}

interface Member {
  child: ChildProcess;
  pending: Map<number, (data: unknown) => void>;
  started: Promise<{ ms: number; failed: string[] }>;
}

export class Fleet {
  readonly members: Member[] = [];
  size: number;
  #id = 0;

  private constructor(size: number) {
    this.size = size;
  }

  static async start(o: FleetOptions): Promise<{ fleet: Fleet; startMs: number; failed: string[] }> {
    const fleet = new Fleet(0);
    const r = await fleet.grow(o);
    return { fleet, ...r };
  }

  /**
   * Adds `o.slots` as more agents in `o.procs` new harness processes (a fleet grows from one
   * N to the next without restarting the agents it has).
   */
  async grow(o: FleetOptions): Promise<{ startMs: number; failed: string[] }> {
    const procs = Math.max(1, Math.min(o.procs, o.slots.length));
    const t0 = Date.now();
    const added: Member[] = [];
    for (let i = 0; i < procs; i++) {
      const index = this.members.length;
      const slots = o.slots.filter((_, j) => j % procs === i);
      const child = track(
        fork(HARNESS, [], {
          stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
          serialization: 'advanced',
          execArgv: o.execArgv ?? [],
        }),
      );
      const pending = new Map<number, (data: unknown) => void>();
      let onStarted!: (v: { ms: number; failed: string[] }) => void;
      const started = new Promise<{ ms: number; failed: string[] }>((r) => (onStarted = r));
      child.on('message', (m: FromHarness) => {
        if (m.t === 'started') onStarted({ ms: m.ms, failed: m.failed });
        else if (m.t === 'reply') {
          const f = pending.get(m.id);
          pending.delete(m.id);
          f?.(m.data);
        }
      });
      child.once('exit', (code, sig) => {
        onStarted({ ms: -1, failed: [`harness ${index} exited ${code ?? sig}`] });
        for (const f of pending.values()) f(undefined);
        pending.clear();
      });
      const start: HarnessStart = {
        t: 'start',
        index,
        slots,
        pki: {
          dir: o.pki.dir,
          caPath: o.pki.caPath,
          keyPath: o.pki.sharedKeyPath,
          revokedPath: path.join(o.pki.dir, 'revoked.json'),
          jwksPath: path.join(o.pki.dir, 'wake-signing.jwks'),
          trustDomain: o.pki.trustDomain,
        },
        controllerUrl: o.controllerUrl,
        ...(o.controllerUrls ? { controllerUrls: o.controllerUrls } : {}),
        ...(o.controllerId !== undefined ? { controllerId: o.controllerId } : {}),
        ...(o.dialOut !== undefined ? { dialOut: o.dialOut } : {}),
        stateRoot: o.stateRoot,
        hook: o.hook,
        pollIntervalMs: o.pollIntervalMs ?? 120_000,
        pollIntervalHealthyMs: o.pollIntervalHealthyMs ?? 600_000,
        announce: o.announce ?? true,
        startConcurrency: o.startConcurrency ?? 32,
        fetchConcurrency: o.fetchConcurrency ?? 64,
        dialConcurrency: o.dialConcurrency ?? dialConcurrencyFor(procs),
      };
      child.send(start);
      const m = { child, pending, started };
      this.members.push(m);
      added.push(m);
    }
    const results = await Promise.all(added.map((m) => m.started));
    this.size += o.slots.length;
    return { startMs: Date.now() - t0, failed: results.flatMap((r) => r.failed) };
  }

  #ask<T>(m: Member, msg: Omit<Extract<ToHarness, { id: number }>, 'id'>, timeoutMs = 60_000): Promise<T> {
    const id = ++this.#id;
    return new Promise<T>((resolve, reject) => {
      const t = setTimeout(() => {
        m.pending.delete(id);
        reject(new Error(`harness did not answer ${msg.t} within ${timeoutMs} ms`));
      }, timeoutMs);
      m.pending.set(id, (d) => {
        clearTimeout(t);
        resolve(d as T);
      });
      m.child.send({ ...msg, id } as ToHarness);
    });
  }

  async all<T>(msg: Omit<Extract<ToHarness, { id: number }>, 'id'>, timeoutMs?: number): Promise<T[]> {
    return Promise.all(this.members.map((m) => this.#ask<T>(m, msg, timeoutMs)));
  }

  async counters(): Promise<HarnessCounters> {
    const parts = await this.all<HarnessCounters>({ t: 'counters' });
    const sum = { ...parts[0]! };
    sum.lastLog = [];
    for (const p of parts.slice(1)) {
      for (const k of Object.keys(p) as Array<keyof HarnessCounters>) {
        if (k === 'loopDelayMaxMs') sum[k] = Math.max(sum[k], p[k]);
        else if (typeof p[k] === 'number') (sum[k] as number) += p[k] as number;
      }
    }
    for (const p of parts) sum.lastLog.push(...p.lastLog);
    return sum;
  }

  /** Clears every agent's per-run records and sets the item name this run waits for. */
  async arm(target: string, minRevision = 0): Promise<void> {
    await this.all({ t: 'arm', target, minRevision } as never);
  }

  /** While off, held hooks end at once (between measuring windows; see harness.ts). */
  async hold(on: boolean): Promise<void> {
    await this.all({ t: 'hold', on } as never);
  }

  async progress(): Promise<{ acked: number; fetched: number }> {
    const parts = await this.all<{ acked: number; fetched: number }>({ t: 'progress' });
    return { acked: parts.reduce((a, p) => a + p.acked, 0), fetched: parts.reduce((a, p) => a + p.fetched, 0) };
  }

  /** Each agent's first wake-up at or after `since` (epoch ms) signed by a controller other than `notFrom`. */
  async wakesSince(since: number, notFrom: string): Promise<FirstWake[]> {
    return (await this.all<FirstWake[]>({ t: 'wakesSince', since, notFrom } as never, 120_000)).flat();
  }

  /** For each ask, the agent's first wake-up at or after `since` announcing `gen` or later (epoch ms), or null. */
  async wakesAtLeast(asks: WakeAsk[]): Promise<Array<number | null>> {
    const parts = await this.all<Array<number | null>>({ t: 'wakesAtLeast', asks } as never, 120_000);
    return asks.map((_, i) => parts.map((p) => p[i] ?? null).find((t) => t !== null) ?? null);
  }

  async report(): Promise<AgentRunReport[]> {
    return (await this.all<AgentRunReport[]>({ t: 'report' }, 120_000)).flat();
  }

  async release(): Promise<void> {
    await this.all({ t: 'release' });
  }

  /** Waits until no agent has a signal waiting for its answer (at most `ms`). */
  async settle(ms: number): Promise<void> {
    await this.all({ t: 'settle' }, ms);
  }

  /** Waits until every agent acked and fetched this run's change, or `ms` passes. */
  async waitRun(n: number, ms: number): Promise<{ acked: number; fetched: number; timedOut: boolean }> {
    const t0 = nowMs();
    let last = { acked: 0, fetched: 0 };
    while (nowMs() - t0 < ms) {
      last = await this.progress();
      if (last.acked >= n && last.fetched >= n) return { ...last, timedOut: false };
      await sleep(n > 2000 ? 100 : 25);
    }
    say(`run timed out: ${last.acked}/${n} acked, ${last.fetched}/${n} fetched`);
    return { ...last, timedOut: true };
  }

  async stop(): Promise<void> {
    await Promise.all(
      this.members.map(async (m) => {
        try {
          await this.#ask(m, { t: 'stop' }, 20_000);
        } catch {
          m.child.kill('SIGKILL');
        }
        const t = setTimeout(() => m.child.kill('SIGKILL'), 5_000);
        await exited(m.child);
        clearTimeout(t);
      }),
    );
  }

  pids(): number[] {
    return this.members.map((m) => m.child.pid!).filter((p) => p !== undefined);
  }
}
