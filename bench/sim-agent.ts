/**
 * One simulated agent built from the AGENT'S OWN MODULES, wired as `agent/main.ts` wires them:
 * the TLS material (certs/tls.ts), the wake-up listener and its verifier (agent/listener.ts,
 * protocol/wake.ts), the fetch coalescer, the fetcher with its signature check, the apply loop,
 * the durable state and outbox, and the poller. Many run in one harness process.
 *
 * What differs from `herald agent`, and why:
 * - the hook runner is injected: the fan-out runs use a no-op one (the issue allows it there;
 *   hooks are timed on their own), the restart uses the real `agent/hooks/run-item.ts`;
 * - one logger counts warnings for all agents of a process (no pino per agent);
 * - the PKI files are not watched (ten thousand watchers would test inotify, not Herald), and
 *   every agent uses the same key file (its certificate is its own);
 * - `recover()` (which scans /proc for a previous run's hooks) is skipped: state dirs are fresh.
 * Counters and timestamps are taken in the callbacks the modules already expose.
 */
import path from 'node:path';
import { spiffeIdOf } from '../protocol/identity.js';
import type { MetadataItem } from '../protocol/heat.js';
import type { FetchState } from '../protocol/frames.js';
import { WakeVerifier } from '../protocol/wake.js';
import { PkiMaterial, type Logger } from '../certs/tls.js';
import { ensurePrivateDir } from '../agent/atomic-file.js';
import { ApplyLoop } from '../agent/apply.js';
import { FetchCoalescer } from '../agent/coalescer.js';
import { earlyRetryDelayMs, Fetcher, keySetOf } from '../agent/fetcher.js';
import { AGENT_FIRST_POLL_WAIT_MS } from '../protocol/limits.js';
import type { RunItem } from '../agent/hooks/types.js';
import { WakeListener } from '../agent/listener.js';
import { OutboxSender } from '../agent/outbox.js';
import { OutboxStore } from '../agent/outbox-store.js';
import { Poller } from '../agent/poller.js';
import { AgentState } from '../agent/state.js';
import type { AgentSlot } from './pki-cache.js';
import { nowMs } from './util.js';

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
}

export interface WakeRecord {
  t: number;
  gen: number;
  fetch: FetchState;
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
}

export class SimAgent {
  readonly slot: AgentSlot;
  readonly #o: SimAgentOptions;
  #material!: PkiMaterial;
  #listener!: WakeListener;
  #fetcher!: Fetcher;
  #coalescer!: FetchCoalescer;
  #poller!: Poller;
  #apply!: ApplyLoop;
  #outbox!: OutboxSender;
  #state!: AgentState;
  readonly #announceAbort = new AbortController();
  #announcing: Promise<boolean> = Promise.resolve(false);
  #wakesVerified = 0;
  #fetch200 = 0;
  #fetch304 = 0;
  #fetchErrors = 0;
  #inPoll = false;
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
    const log = o.log;
    this.#material = new PkiMaterial({
      caPath: o.pki.caPath, certPath: o.pki.certPath, keyPath: o.pki.keyPath, revokedPath: o.pki.revokedPath, jwksPath: o.pki.jwksPath,
      trustDomain: o.pki.trustDomain, logger: log, watch: false,
    });
    const me = this.#material.current().identity;
    if (me.name !== o.slot.node) throw new Error(`certificate is ${me.spiffeId}, not agent/${o.slot.node}`);
    const controllerSpiffeId = spiffeIdOf(o.pki.trustDomain, 'controller', 'controller');
    this.#state = await AgentState.open(o.stateDir, { log });
    const store = await OutboxStore.open(o.stateDir, { log });
    const runsDir = path.join(o.stateDir, 'runs');
    await ensurePrivateDir(runsDir, log);
    const state = this.#state;
    this.#fetcher = new Fetcher({ controllerUrl: o.controllerUrl, node: o.slot.node, material: this.#material, controllerSpiffeId, lastAppliedGen: () => state.lastAppliedGeneration, log });
    const fetcher = this.#fetcher;
    this.#outbox = new OutboxSender({ store, send: (p, body) => fetcher.signal(p, body), log });
    const outbox = this.#outbox;
    this.#apply = new ApplyLoop({
      node: o.slot.node,
      state,
      enqueue: (s) => outbox.put(s),
      loadRunItem: () => Promise.resolve(o.runItem),
      runOptions: { runsDir, log },
      log,
      onSpawn: () => this.spawns.push(nowMs()),
    });
    const apply = this.#apply;
    let lastFetchOk = false;
    this.#coalescer = new FetchCoalescer({
      initialFetchedGen: state.lastFetchedGeneration,
      fetch: async () => {
        const poll = this.#inPoll;
        try {
          const r = gate ? await gate.run(() => fetcher.fetchMetadata()) : await fetcher.fetchMetadata();
          lastFetchOk = true;
          outbox.retryNow();
          if (r.status === 200) {
            this.#fetch200++;
            let maxRev = 0;
            let hit = false;
            for (const it of r.document.deployments as MetadataItem[]) {
              if (typeof it.revision === 'number' && it.revision > maxRev) maxRev = it.revision;
              if (this.target !== null && it.name === this.target && (typeof it.revision !== 'number' || it.revision >= this.targetMinRevision)) hit = true;
            }
            this.fetches.push({ t: nowMs(), status: 200, gen: r.gen, maxRev, hit, poll });
            apply.submit(r.document);
            if ((state.lastFetchedGeneration ?? -1) < r.gen) await state.setLastFetchedGeneration(r.gen);
          } else {
            this.#fetch304++;
            this.fetches.push({ t: nowMs(), status: 304, gen: r.gen, maxRev: 0, hit: false, poll });
          }
          return { gen: r.gen };
        } catch (err) {
          lastFetchOk = false;
          this.#fetchErrors++;
          log.warn({ node: o.slot.node, code: (err as { code?: string }).code, err: (err as Error).message }, 'metadata fetch failed');
          const retryMs = earlyRetryDelayMs(err);
          if (retryMs !== null) this.#poller.fetchFailed(retryMs);
          throw err;
        }
      },
    });
    const coalescer = this.#coalescer;
    const verifier = new WakeVerifier({ audience: me.spiffeId, keys: keySetOf(this.#material), startedAtS: Math.floor(Date.now() / 1000) });
    this.#listener = new WakeListener({
      material: this.#material,
      verifier,
      onWake: (claims) => {
        this.#wakesVerified++;
        const fetch = coalescer.wake(claims.gen);
        this.wakes.push({ t: nowMs(), gen: claims.gen, fetch });
        return fetch;
      },
      lastFetchedGen: () => coalescer.lastFetchedGen,
      log,
    });
    const listener = this.#listener;
    this.#poller = new Poller({
      intervalMs: o.pollIntervalMs,
      healthyIntervalMs: o.pollIntervalHealthyMs,
      isPushHealthy: () => listener.isPushHealthy(),
      poll: async () => {
        this.#inPoll = true;
        coalescer.poll();
        this.#inPoll = false;
        await coalescer.idle();
        return lastFetchOk;
      },
    });
    listener.on('push-change', () => this.#poller.pushChanged());
    await listener.listen(o.slot.ip, o.slot.port);
    if (o.announce) {
      const url = `wss://${o.slot.ip}:${o.slot.port}/v1/wake`;
      this.#announcing = fetcher.announce(url, this.#announceAbort.signal).then((ok) => {
        this.announcedAt = nowMs();
        return ok;
      });
    }
    // as agent/main.ts: the start-up fetch waits for the announcement (bounded)
    this.#poller.startAfter(this.#announcing, AGENT_FIRST_POLL_WAIT_MS);
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
    return {
      connected: this.#listener?.connections ?? 0,
      wakesVerified: this.#wakesVerified,
      acks: this.#listener?.stats.acks ?? 0,
      nacks: this.#listener?.stats.nacks ?? 0,
      fetch200: this.#fetch200,
      fetch304: this.#fetch304,
      fetchErrors: this.#fetchErrors,
      polls: this.#poller?.polls ?? 0,
      runs: this.#apply?.runs ?? 0,
      signalsDelivered: this.#outbox?.delivered ?? 0,
      refused: this.#listener?.stats.refused ?? 0,
    };
  }

  get applyBusy(): boolean {
    return this.#apply?.busy ?? false;
  }

  announced(): Promise<boolean> {
    return this.#announcing;
  }

  async stop(): Promise<void> {
    this.#poller?.stop();
    this.#announceAbort.abort();
    this.#coalescer?.close();
    await this.#listener?.close();
    await this.#apply?.stop(1_000);
    await this.#announcing.catch(() => false);
    await this.#outbox?.stop();
    this.#fetcher?.close();
    this.#material?.close();
    await this.#state?.flush().catch(() => undefined);
  }
}
