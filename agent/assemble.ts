/**
 * The agent's one wiring (docs/architecture.md): the PKI material, the state dir, the fetcher, the
 * outbox, the live output sender, the apply loop, the wake-up listener and the dialer (either or
 * both, docs/dial-out.md), the poller and the
 * pipeline that carries a wake-up or a poll through a fetch to the apply loop (agent/pipeline.ts),
 * assembled from explicit dependencies (logger, clock, random, hook runner, file system owner
 * checks). This file only makes the parts and hands them to one another; what the agent does with
 * a change is the pipeline's. `agent/main.ts` (the process), the benchmark's simulated agents and
 * the tests run these same parts wired this same way; what differs between them is only what they
 * hand in.
 *
 * `assembleAgent()` checks and opens everything that can be refused at start-up (the identity,
 * the JWKS, a wildcard listen address without an advertised one, a PKI file, state or hooks dir
 * another user could write when running as root); `start()` recovers, listens, announces, dials
 * out and polls.
 */
import { readTrustDomain } from '../certs/trust-domain.js';
import fs from 'node:fs';
import path from 'node:path';
import { ConfigError } from '../protocol/errors.js';
import type { FetchState, SignalledFrame } from '../protocol/frames.js';
import type { MetadataItem } from '../protocol/heat.js';
import { acceptsController, parseControllerIds, spiffeIdOf, type ControllerIds } from '../protocol/identity.js';
import {
  AGENT_FIRST_POLL_WAIT_MS,
  AGENT_SHUTDOWN_GRACE_MS,
  DEFAULT_TRUST_DOMAIN,
  POLL_INTERVAL_HEALTHY_MS,
  POLL_INTERVAL_MS,
} from '../protocol/limits.js';
import { WakeVerifier, type WakeClaims } from '../protocol/wake.js';
import { materialPaths, pkiPaths } from '../certs/paths.js';
import { PkiMaterial, type Logger } from '../certs/tls.js';
import { ApplyLoop, type ApplyLoopOptions } from './apply.js';
import type { HookLauncher } from './hooks/launcher.js';
import { ensurePrivateDir } from './atomic-file.js';
import type { FetchCoalescer } from './coalescer.js';
import { parseControllerUrls } from './controller-endpoints.js';
import { Fetcher, keySetOf } from './fetcher.js';
import type { RunItem } from './hooks/types.js';
import { parseDialProxy, type ProxyEnv } from './dial-proxy.js';
import { Dialer, parseDialOutUrls } from './dialer.js';
import { WakeListener } from './listener.js';
import type { PushFetchAnswer } from './push-connections.js';
import { OutboxSender } from './outbox.js';
import { OutboxStore } from './outbox-store.js';
import { OutputSender } from './output-sender.js';
import { AgentPipeline, type PipelineObserver } from './pipeline.js';
import { Poller, realTimers } from './poller.js';
import { CertificateRenewer } from './renewal.js';
import { checkRootOwned, checkRootOwnedPki, UnsafePathError, type OwnerFs } from './root-owned.js';
import { AgentState } from './state.js';

export interface HostPort {
  host: string;
  port: number;
}

export interface AgentConfig {
  node: string;
  /** `https://host:port`, or several separated by commas: the agent moves to the next when one fails. */
  controller: string;
  /** The wake-up listener's address; none: the agent listens on nothing and announces no endpoint (then `dialOut` is needed). */
  listen?: HostPort | undefined;
  advertise?: HostPort | undefined;
  /**
   * The controllers' connect URLs, `wss://host:port/v1/connect`, separated by commas: the agent
   * dials out and keeps one push connection (docs/dial-out.md). With `listen` too, both serve.
   */
  dialOut?: string | undefined;
  /** The proxy settings of the environment (`HTTPS_PROXY`, `NO_PROXY`), for dialling out. */
  proxyEnv?: ProxyEnv | undefined;
  pki: string;
  stateDir: string;
  hooksDir?: string | undefined;
  /** The controllers accepted: a name, several separated by commas, or `*` for every one of the trust domain. */
  controllerId: string;
  pollIntervalMs: number;
  pollIntervalHealthyMs: number;
  /** Default: from the PKI (pki.json, else the CA's SPIFFE SAN), else herald.local. */
  trustDomain?: string | undefined;
  /** Override of the PKI layout's files. */
  ca?: string | undefined;
  cert?: string | undefined;
  key?: string | undefined;
  shutdownGraceMs?: number | undefined;
  logLevel?: string | undefined;
  /**
   * Announce the listener's endpoint to the controller (default true). False: the controller
   * never learns it and never dials, so only polling fetches (the benchmark's push-off runs).
   */
  announce?: boolean | undefined;
  /** Stream hooks' output while they run (docs/api.md; default true). False: only the signal carries it. */
  liveOutput?: boolean | undefined;
  /** Renew the certificate at two thirds of its lifetime (docs/adding-nodes.md; default true). */
  renew?: boolean | undefined;
  /**
   * Start hooks from a small process that stays (agent/hooks/launcher.ts; default true where it
   * can: Linux with perl). False: the agent spawns every hook itself.
   */
  hookLauncher?: boolean | undefined;
}

export const DEFAULT_AGENT_CONFIG = {
  controllerId: 'controller',
  pollIntervalMs: POLL_INTERVAL_MS,
  pollIntervalHealthyMs: POLL_INTERVAL_HEALTHY_MS,
} as const;

/**
 * What happened, for a caller that counts or times it; none of these changes what the agent does.
 * Wake-ups and fetches are the pipeline's (agent/pipeline.ts).
 */
export interface AgentObserver extends PipelineObserver {
  /** A hook process started. */
  spawn?(pid: number, item: MetadataItem): void;
}

/** The logger every part takes; `debug` is used when there is one. */
export interface AgentLogger extends Logger {
  debug?(obj: object, msg?: string): void;
}

export interface AgentDeps {
  /** Every part logs here (main.ts: pino on stderr). */
  log: AgentLogger;
  /**
   * The wall clock, ms since the epoch (default Date.now): wake-up verification (`iat`, `exp`,
   * the start time), the listener's idle and health windows, the poller, and the timestamps the
   * state dir and the outbox record. TLS validity is OpenSSL's and keeps the system clock.
   */
  now?: () => number;
  /** Uniform in [0, 1) (default Math.random): the poll jitter and the outbox's retry backoff. */
  random?: () => number;
  /** Runs one deployment item. Default: `agent/hooks/run-item.ts`, loaded at the first item. */
  runItem?: RunItem;
  /**
   * Every metadata fetch runs through this (default: runs it). The benchmark bounds how many of
   * one harness process's simulated agents fetch at once.
   */
  runFetch?: <T>(fetch: () => Promise<T>) => Promise<T>;
  /**
   * Every dial out runs through this (agent/dialer.ts `runDial`; default: runs it). The benchmark
   * bounds how many of one harness process's simulated agents handshake at once.
   */
  runDial?: (dial: () => Promise<void>) => Promise<void>;
  /** Watch the PKI files for rotation and revocation (default true). */
  watchPki?: boolean;
  /** The effective uid the root-ownership checks (state, hooks, PKI) go by (default process.getuid()). */
  uid?: number | undefined;
  /** The file system those checks stat (default node:fs). */
  ownerFs?: OwnerFs;
  observe?: AgentObserver;
}

export interface AgentParts {
  material: PkiMaterial;
  state: AgentState;
  fetcher: Fetcher;
  outbox: OutboxSender;
  output: OutputSender;
  apply: ApplyLoop;
  /** Wake-ups and polls to fetches to the apply loop (agent/pipeline.ts). */
  pipeline: AgentPipeline;
  /** The pipeline's own (`pipeline.coalescer`). */
  coalescer: FetchCoalescer;
  /** The wake-up listener; null without `listen`. */
  listener: WakeListener | null;
  /** The connection dialled out; null without `dialOut`. */
  dialer: Dialer | null;
  poller: Poller;
  renewer: CertificateRenewer;
}

export interface AssembledAgent {
  /** The agent's SPIFFE id (from its certificate). */
  readonly identity: string;
  readonly parts: AgentParts;
  /**
   * Recovers interrupted items (and what a killed agent left), drains the outbox, listens,
   * announces the endpoint, dials out, and starts polling once the announcement is through
   * (bounded). Resolves with the bound port (0 without a listener).
   * @throws ConfigError `listen` when the address cannot be bound (everything is closed then)
   */
  start(): Promise<number>;
  /** Resolves when the announcement is over: true when the controller took it. */
  announced(): Promise<boolean>;
  /** No new work; a running hook may finish within `shutdownGraceMs`; then everything closes. Idempotent. */
  stop(reason?: string): Promise<void>;
}

/**
 * Assembles the agent's parts and opens its state dir.
 * @throws ConfigError naming the option when the configuration or PKI is unusable
 *   (`unsafe_state_dir`, `unsafe_pki` when running as root over a file or dir another user could write)
 */
export async function assembleAgent(cfg: AgentConfig, deps: AgentDeps): Promise<AssembledAgent> {
  const { log, observe = {} } = deps;
  const now = deps.now ?? Date.now;

  // ---- identity and PKI --------------------------------------------------------------------
  const controllerIds: ControllerIds = parseControllerIds(cfg.controllerId);
  parseControllerUrls(cfg.controller); // refused here, before anything is opened
  const dialOut = parseDialOutOption(cfg.dialOut);
  const proxy = parseDialProxy(cfg.proxyEnv ?? {});
  if (cfg.listen === undefined && dialOut === undefined)
    throw new ConfigError('give --listen <host:port>, --dial-out <url,...>, or both: the agent needs a push path', {
      field: 'listen',
    });
  if (cfg.listen === undefined && cfg.advertise !== undefined)
    throw new ConfigError('--advertise names the address of the listener: it needs --listen', { field: 'advertise' });
  const paths = materialPaths(cfg.pki, 'agent', cfg.node);
  const uid = 'uid' in deps ? deps.uid : process.getuid?.();
  // as root: a PKI file someone else could write would let them choose whom the agent obeys;
  // checked for every file PkiMaterial reads, at start and at every reload
  const checkPki = (file: string): void =>
    checkRootOwnedPki(file, { uid, ...(deps.ownerFs ? { fs: deps.ownerFs } : {}) });
  const logUnsafe = (err: unknown, msg: string): void => {
    if (err instanceof UnsafePathError) {
      log.error({ code: err.code, field: err.field, path: err.path, owner: err.ownerUid, mode: err.mode }, msg);
    }
  };
  let material: PkiMaterial;
  try {
    if (fs.existsSync(cfg.pki)) checkPki(cfg.pki);
    const meta = pkiPaths(cfg.pki).meta;
    if (cfg.trustDomain === undefined && fs.existsSync(meta)) checkPki(meta);
    const trustDomain =
      cfg.trustDomain ?? readTrustDomain(cfg.pki, { caPath: cfg.ca ?? paths.caPath, fallback: DEFAULT_TRUST_DOMAIN });
    material = new PkiMaterial({
      caPath: cfg.ca ?? paths.caPath,
      certPath: cfg.cert ?? paths.certPath,
      keyPath: cfg.key ?? paths.keyPath,
      revokedPath: paths.revokedPath,
      jwksPath: paths.jwksPath,
      trustDomain,
      logger: log,
      watch: deps.watchPki ?? true,
      checkFile: checkPki,
    });
  } catch (err) {
    logUnsafe(err, 'refusing to start: unsafe PKI file or directory');
    throw err;
  }
  const trustDomain = material.options.trustDomain;
  const refuse = (err: Error): never => {
    material.close();
    throw err;
  };
  const me = material.current().identity;
  if (me.role !== 'agent' || me.name !== cfg.node) {
    refuse(
      new ConfigError(
        `--node ${cfg.node}: the certificate ${cfg.cert ?? paths.certPath} is ${me.spiffeId}, not ${spiffeIdOf(trustDomain, 'agent', cfg.node)}`,
        { field: 'node' },
      ),
    );
  }
  if (!material.current().jwks) {
    refuse(
      new ConfigError(`--pki ${cfg.pki}: no ${paths.jwksPath}; the agent cannot verify wake-ups or metadata`, {
        field: 'pki',
        code: 'pki_missing',
      }),
    );
  }
  if (cfg.listen !== undefined && cfg.advertise === undefined && WILDCARD_HOSTS.has(cfg.listen.host)) {
    refuse(
      new ConfigError(
        `--listen ${formatHostPort(cfg.listen)} binds every address: give --advertise host:port, the address the controller dials`,
        { field: 'advertise' },
      ),
    );
  }

  // ---- durable state -----------------------------------------------------------------------
  // absolute: hooks run with their run directory as the working directory
  const stateDir = path.resolve(cfg.stateDir);
  // as root: nothing anyone else could write is trusted (root-owned.ts); checked before the state dir
  // is touched, and again once it exists (it may have been made meanwhile by someone else)
  const ownership = {
    stateDir,
    hooksDir: cfg.hooksDir,
    uid,
    ...(deps.ownerFs ? { fs: deps.ownerFs } : {}),
  };
  const checkOwnership = (): void => {
    try {
      checkRootOwned(ownership);
    } catch (err) {
      logUnsafe(err, 'refusing to start: unsafe state or hooks dir');
      refuse(err as Error);
    }
  };
  checkOwnership();
  const date = (): Date => new Date(now());
  let state: AgentState;
  let store: OutboxStore;
  try {
    state = await AgentState.open(stateDir, { log, now: date });
    store = await OutboxStore.open(stateDir, { log, now: date });
  } catch (err) {
    return refuse(err as Error);
  }
  const runsDir = path.join(stateDir, 'runs');
  await ensurePrivateDir(runsDir, log);
  checkOwnership();

  // ---- parts -------------------------------------------------------------------------------
  const fetcher = new Fetcher({
    controllerUrl: cfg.controller,
    node: cfg.node,
    material,
    controllerSpiffeId: { controllers: controllerIds },
    lastAppliedGen: () => state.lastAppliedGeneration,
    // over a push connection whose controller offers it (the dialled one first: a controller that
    // has it pushes there); the listener and the dialer are made below
    pushFetch: (nonce, ifNoneMatch, timeoutMs): Promise<PushFetchAnswer> | null =>
      dialer?.fetchOverPush(nonce, ifNoneMatch, timeoutMs) ??
      listener?.fetchOverPush(nonce, ifNoneMatch, timeoutMs) ??
      null,
    pushSignal: (nonce, deploymentId, revision, body, timeoutMs): Promise<SignalledFrame> | null =>
      dialer?.signalOverPush(nonce, deploymentId, revision, body, timeoutMs) ??
      listener?.signalOverPush(nonce, deploymentId, revision, body, timeoutMs) ??
      null,
    pushHealthy: (): boolean => isPushHealthy(),
    // the API requests go through the dialled connection's proxy too (docs/dial-out.md)
    proxy,
    log,
  });
  const renewer = new CertificateRenewer({
    material,
    certPath: cfg.cert ?? paths.certPath,
    keyPath: cfg.key ?? paths.keyPath,
    send: (body) => fetcher.renewCertificate(body),
    log,
    now,
    ...(deps.random ? { random: deps.random } : {}),
  });
  const outbox = new OutboxSender({
    store,
    send: (p, body, deploymentId) => fetcher.signal(p, body, deploymentId),
    log,
    ...(deps.random ? { random: deps.random } : {}),
  });
  const output = new OutputSender({ node: cfg.node, send: (p, body) => fetcher.output(p, body), log });
  let runItem: RunItem | undefined = deps.runItem;
  const runOptions: ApplyLoopOptions['runOptions'] = {
    runsDir,
    ...(cfg.hooksDir ? { hooksDir: path.resolve(cfg.hooksDir) } : {}),
    log,
  };
  let launcher: HookLauncher | undefined;
  const apply = new ApplyLoop({
    node: cfg.node,
    state,
    enqueue: (s) => outbox.put(s),
    // the runner and the launcher load at the first item: an idle agent holds neither
    loadRunItem: async () => {
      if (cfg.hookLauncher !== false && launcher === undefined) {
        const { HookLauncher } = await import('./hooks/launcher.js');
        launcher ??= new HookLauncher({ log });
        runOptions.launcher = launcher;
      }
      runItem ??= (await import('./hooks/run-item.js')).runItem;
      return runItem;
    },
    runOptions,
    ...(cfg.liveOutput === false ? {} : { openOutput: (item: MetadataItem) => output.open(item) }),
    log,
    ...(observe.spawn ? { onSpawn: observe.spawn } : {}),
  });

  // ---- the pipeline: wake-ups and polls in, fetches, documents to the apply loop -----------
  // the listener, the dialer and the poller hand their wake-ups and polls to the pipeline
  // (agent/pipeline.ts), made last from the parts; none calls it before start(). The listener and
  // the dialer share the verifier, so a wake-up that comes both ways is taken once (its replay
  // cache), and the pipeline's coalescer fetches a generation once whichever way it was announced.
  const nowS = (): number => now() / 1000;
  const verifier = new WakeVerifier({
    audience: me.spiffeId,
    keys: keySetOf(material),
    startedAtS: Math.floor(nowS()),
    nowS,
  });
  const onWake = (claims: WakeClaims): FetchState => pipeline.onWake(claims);
  const lastFetchedGen = (): number => pipeline.lastFetchedGen;
  const listener =
    cfg.listen === undefined
      ? null
      : new WakeListener({
          material,
          verifier,
          acceptController: (name) => acceptsController(controllerIds, name),
          onWake,
          lastFetchedGen,
          log,
          now,
        });
  const dialer =
    dialOut === undefined
      ? null
      : new Dialer({
          urls: dialOut,
          node: cfg.node,
          material,
          controllers: controllerIds,
          verifier,
          onWake,
          lastFetchedGen,
          log,
          proxy,
          timers: { ...realTimers, now },
          ...(deps.random ? { random: deps.random } : {}),
          ...(deps.runDial ? { runDial: deps.runDial } : {}),
        });
  const isPushHealthy = (): boolean => (dialer?.isPushHealthy() ?? false) || (listener?.isPushHealthy() ?? false);
  const poller = new Poller({
    intervalMs: cfg.pollIntervalMs,
    healthyIntervalMs: cfg.pollIntervalHealthyMs,
    isPushHealthy,
    poll: (): Promise<boolean> => pipeline.onPoll(),
    timers: { ...realTimers, now },
    ...(deps.random ? { random: deps.random } : {}),
  });
  const pipeline = new AgentPipeline({
    fetcher,
    ...(deps.runFetch ? { runFetch: deps.runFetch } : {}),
    apply,
    outbox,
    output,
    poller,
    log,
    observe,
  });
  const onPushChange = (): void => {
    poller.pushChanged();
    // fetches go over the push connection now: an idle API connection would only be a second one
    if (isPushHealthy()) fetcher.closeIdleApiConnections();
  };
  listener?.on('push-change', onPushChange);
  dialer?.on('push-change', onPushChange);

  // ---- start and stop ----------------------------------------------------------------------
  const announceAbort = new AbortController();
  let announcing: Promise<boolean> = Promise.resolve(false);
  let started = false;

  const start = async (): Promise<number> => {
    started = true;
    await apply.recover();
    outbox.kick();
    let port = 0;
    if (listener !== null && cfg.listen !== undefined) {
      const listen = cfg.listen;
      try {
        port = await listener.listen(listen.host, listen.port);
      } catch (err) {
        await listener.close();
        await outbox.stop();
        fetcher.close();
        material.close();
        throw new ConfigError(`--listen ${formatHostPort(listen)}: ${(err as Error).message}`, {
          field: 'listen',
          cause: err,
        });
      }
      const adv = cfg.advertise ?? listen;
      const url = `wss://${formatHost(adv.host)}:${adv.port === 0 || cfg.advertise === undefined ? port : adv.port}/v1/wake`;
      log.info(
        { listen: `${formatHost(listen.host)}:${port}`, url, controller: cfg.controller, identity: me.spiffeId },
        'agent started',
      );
      if (cfg.announce ?? true) {
        announcing = fetcher.announce(url, announceAbort.signal).catch((err: unknown) => {
          log.error({ err }, 'endpoint announcement stopped');
          return false;
        });
      }
    }
    if (dialer !== null) {
      // without a listener there is no endpoint to announce: the controller reaches this agent
      // only on the connection it dials out (docs/dial-out.md)
      if (listener === null)
        log.info({ dialOut: cfg.dialOut, controller: cfg.controller, identity: me.spiffeId }, 'agent started');
      dialer.start();
    }
    poller.startAfter(announcing, AGENT_FIRST_POLL_WAIT_MS);
    if (cfg.renew ?? true) renewer.start();
    return port;
  };

  let stopping: Promise<void> | null = null;
  const stop = (reason = 'stop'): Promise<void> => {
    stopping ??= (async () => {
      log.info({ reason }, 'agent stopping');
      poller.stop();
      await renewer.stop();
      announceAbort.abort();
      pipeline.close();
      await Promise.all([listener?.close(), dialer?.close()]);
      await apply.stop(cfg.shutdownGraceMs ?? AGENT_SHUTDOWN_GRACE_MS);
      launcher?.close();
      await announcing;
      // one short chance to deliver what is queued; the rest waits on disk for the next start
      if (started) await Promise.race([outbox.idle(), new Promise((r) => setTimeout(r, 1_000).unref())]);
      await outbox.stop();
      output.stop();
      fetcher.close();
      material.close();
      // the journal folded into state.json: the next start replays nothing
      await state.close().catch((err: unknown) => log.warn({ err }, 'cannot fold the state journal at stop'));
      log.info({}, 'agent stopped');
    })();
    return stopping;
  };

  return {
    identity: me.spiffeId,
    parts: {
      material,
      state,
      fetcher,
      outbox,
      output,
      apply,
      pipeline,
      coalescer: pipeline.coalescer,
      listener,
      dialer,
      poller,
      renewer,
    },
    start,
    announced: () => announcing,
    stop,
  };
}

const WILDCARD_HOSTS = new Set(['0.0.0.0', '::', '[::]', '']);

function formatHost(h: string): string {
  return h.includes(':') ? `[${h}]` : h;
}

export function formatHostPort(hp: HostPort): string {
  return `${formatHost(hp.host)}:${hp.port}`;
}

/** `--dial-out`, parsed; undefined when not given. @throws ConfigError naming `dial-out` */
function parseDialOutOption(value: string | undefined): URL[] | undefined {
  if (value === undefined) return undefined;
  try {
    return parseDialOutUrls(value);
  } catch (err) {
    throw new ConfigError((err as Error).message, { field: 'dial-out', cause: err });
  }
}
