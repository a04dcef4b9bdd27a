/**
 * One simulated agent: the agent's own parts, assembled by `assembleAgent()` (agent/assemble.ts),
 * the function `herald agent` uses. Many run in one harness process.
 *
 * What differs from `herald agent` is only what is handed in, and why:
 * - the hook runner: the fan-out runs use a no-op one (the benchmark allows it there; hooks are
 *   timed on their own), the restart uses the real `agent/hooks/run-item.ts`;
 * - one logger counts warnings for all agents of a process (no pino per agent);
 * - the PKI files are not watched (ten thousand watchers would test inotify, not Herald), and
 *   every agent uses the same key file (its certificate is its own);
 * - every metadata fetch passes one gate per harness process (see below);
 * - with push off, the endpoint is not announced;
 * - dialling out (`dialOut`), it listens on nothing: its push connection is the one its own
 *   Dialer opens to the controller's connect listener (agent/dialer.ts), as `herald agent
 *   --dial-out` without `--listen` does.
 * Counters and timestamps are taken by the assembly's observer and the parts' counters.
 */
import type { MetadataItem } from '../protocol/heat.js';
import type { FetchState } from '../protocol/frames.js';
import type { Logger } from '../certs/tls.js';
import { assembleAgent, type AssembledAgent } from '../agent/assemble.js';
import type { RunItem } from '../agent/hooks/types.js';
import type { AgentSlot } from './pki-cache.js';
import { nowMs, NO_HOOK_LAUNCHER_ENV } from './util.js';

/**
 * At most this many metadata fetches of one harness process in flight at once. A real agent has
 * its machine to itself; thousands of them in one process would otherwise all start their TLS
 * handshakes together and starve the same process's listeners, whose acks then miss the
 * controller's 1 s answer limit. The queue only orders work the process's CPU has to do anyway.
 */
class Gate {
  #free: number;
  readonly #waiting: Array<() => void> = [];
  constructor(n: number) {
    this.#free = n;
  }
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((r) => this.#waiting.push(r));
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next) next();
      else this.#free++;
    }
  }
}
let gate: Gate | null = null;
export function setFetchConcurrency(n: number): void {
  gate = n > 0 ? new Gate(n) : null;
}

/**
 * Dialling out, at most this many agents of one harness process handshake at once (agent/dialer.ts
 * `runDial`), for the reason of the fetch gate above: a storm of reconnects in one process would
 * otherwise hold its event loop past the controller's 1 s answer limit, and its agents' acks would
 * miss it (N = 200 on the shared host, 2026-12-08: 125 of 200 connections dropped half-open, the
 * harness's loop late by up to 1.3 s). In listener mode the controller bounds its own dials the
 * same way (MAX_DIALS_IN_FLIGHT; fleet.ts dialConcurrencyFor shares it among the processes).
 */
let dialGate: Gate | null = null;
export function setDialConcurrency(n: number): void {
  dialGate = n > 0 ? new Gate(n) : null;
}

export interface SimPkiPaths {
  dir: string;
  caPath: string;
  keyPath: string;
  certPath: string;
  revokedPath: string;
  jwksPath: string;
  trustDomain: string;
}

export interface SimAgentOptions {
  slot: AgentSlot;
  pki: SimPkiPaths;
  controllerUrl: string;
  stateDir: string;
  runItem: RunItem;
  pollIntervalMs: number;
  pollIntervalHealthyMs: number;
  /** Announce the listener (push on); false: never announced, so never dialled (push off). */
  announce: boolean;
  log: Logger;
  /** The controllers accepted (`--controller-id`; default `controller`, the one-controller benchmarks' name). */
  controllerId?: string;
  /** `--dial-out`: the connect URL(s); the agent then listens on nothing (docs/dial-out.md). */
  dialOut?: string;
}

export interface WakeRecord {
  t: number;
  gen: number;
  fetch: FetchState;
  /** The controller that signed it, and why it was sent (a takeover's first wake-up is a ping). */
  iss: string;
  reason: string;
}

export interface FetchRecord {
  t: number;
  status: 200 | 304;
  gen: number;
  /** Highest deployment revision in the document (200 only). */
  maxRev: number;
  /** The document holds an item named `target` (the change the current run waits for). */
  hit: boolean;
  poll: boolean;
}

export interface SimCounters {
  connected: number;
  wakesVerified: number;
  acks: number;
  nacks: number;
  fetch200: number;
  fetch304: number;
  fetchErrors: number;
  polls: number;
  runs: number;
  signalsDelivered: number;
  refused: number;
  /** Push connections accepted so far, and how many of them on a resumed TLS session. */
  accepted: number;
  resumed: number;
  /** Dialling out: pongs the controller answered to the agent's pings (its idle traffic). */
  pongs: number;
  /** Dialling out: dials that failed before the upgrade (refused, timed out, ...). */
  dialFailures: number;
}

export class SimAgent {
  readonly slot: AgentSlot;
  readonly #o: SimAgentOptions;
  #agent: AssembledAgent | null = null;
  #wakesVerified = 0;
  #fetch200 = 0;
  #fetch304 = 0;
  #fetchErrors = 0;
  /** Since the last mark(). */
  wakes: WakeRecord[] = [];
  fetches: FetchRecord[] = [];
  spawns: number[] = [];
  announcedAt = 0;
  /** Name of the metadata item the current run waits for (see FetchRecord.hit). */
  target: string | null = null;
  /** ... at this revision or later (a restart's step is a new revision of an existing item). */
  targetMinRevision = 0;

  constructor(o: SimAgentOptions) {
    this.slot = o.slot;
    this.#o = o;
  }

  async start(): Promise<void> {
    const o = this.#o;
    const agent = await assembleAgent(
      {
        node: o.slot.node,
        controller: o.controllerUrl,
        ...(o.dialOut === undefined ? { listen: { host: o.slot.ip, port: o.slot.port } } : { dialOut: o.dialOut }),
        pki: o.pki.dir,
        ca: o.pki.caPath,
        cert: o.pki.certPath,
        key: o.pki.keyPath,
        trustDomain: o.pki.trustDomain,
        stateDir: o.stateDir,
        controllerId: o.controllerId ?? 'controller',
        pollIntervalMs: o.pollIntervalMs,
        pollIntervalHealthyMs: o.pollIntervalHealthyMs,
        shutdownGraceMs: 1_000,
        announce: o.announce,
        hookLauncher: process.env[NO_HOOK_LAUNCHER_ENV] !== '1',
      },
      {
        log: o.log,
        runItem: o.runItem,
        watchPki: false,
        ...(gate ? { runFetch: (f) => gate!.run(f) } : {}),
        ...(dialGate ? { runDial: (d) => dialGate!.run(d) } : {}),
        observe: {
          wake: (claims, fetch) => {
            this.#wakesVerified++;
            this.wakes.push({ t: nowMs(), gen: claims.gen, fetch, iss: claims.iss, reason: claims.reason });
          },
          fetched: (r, poll) => {
            if (r.status === 200) {
              this.#fetch200++;
              let maxRev = 0;
              let hit = false;
              for (const it of r.document.deployments as MetadataItem[]) {
                if (typeof it.revision === 'number' && it.revision > maxRev) maxRev = it.revision;
                if (
                  this.target !== null &&
                  it.name === this.target &&
                  (typeof it.revision !== 'number' || it.revision >= this.targetMinRevision)
                )
                  hit = true;
              }
              this.fetches.push({ t: nowMs(), status: 200, gen: r.gen, maxRev, hit, poll });
            } else {
              this.#fetch304++;
              this.fetches.push({ t: nowMs(), status: 304, gen: r.gen, maxRev: 0, hit: false, poll });
            }
          },
          fetchFailed: () => {
            this.#fetchErrors++;
          },
          spawn: () => this.spawns.push(nowMs()),
        },
      },
    );
    this.#agent = agent;
    await agent.start();
    void agent.announced().then(() => {
      if (o.announce) this.announcedAt = nowMs();
    });
  }

  /** Starts a new measuring window: the per-run records are cleared. */
  mark(target: string | null = null, minRevision = 0): void {
    this.target = target;
    this.targetMinRevision = minRevision;
    this.wakes = [];
    this.fetches = [];
    this.spawns = [];
  }

  counters(): SimCounters {
    const p = this.#agent?.parts;
    const d = p?.dialer;
    return {
      connected: (p?.listener?.connections ?? 0) + (d?.connected ? 1 : 0),
      wakesVerified: this.#wakesVerified,
      acks: (p?.listener?.stats.acks ?? 0) + (d?.stats.acks ?? 0),
      nacks: (p?.listener?.stats.nacks ?? 0) + (d?.stats.nacks ?? 0),
      fetch200: this.#fetch200,
      fetch304: this.#fetch304,
      fetchErrors: this.#fetchErrors,
      polls: p?.poller.polls ?? 0,
      runs: p?.apply.runs ?? 0,
      signalsDelivered: p?.outbox.delivered ?? 0,
      refused: (p?.listener?.stats.refused ?? 0) + (d?.stats.refused ?? 0),
      // a dialled connection established counts as one accepted (never resumed: agent/dialer.ts)
      accepted: (p?.listener?.stats.accepted ?? 0) + (d?.stats.connected ?? 0),
      resumed: p?.listener?.stats.resumed ?? 0,
      pongs: d?.stats.pongs ?? 0,
      dialFailures: d?.stats.dialFailures ?? 0,
    };
  }

  get applyBusy(): boolean {
    return this.#agent?.parts.apply.busy ?? false;
  }

  /** Resolves when the agent's outbox has no signal waiting for its answer. */
  outboxIdle(): Promise<void> {
    return this.#agent?.parts.outbox.idle() ?? Promise.resolve();
  }

  announced(): Promise<boolean> {
    return this.#agent?.announced() ?? Promise.resolve(false);
  }

  async stop(): Promise<void> {
    await this.#agent?.stop();
  }
}
