/**
 * The agent process (SPEC §4): wires the listener, the fetch coalescer, the fetcher, the apply
 * loop, the outbox and the poller together. Everything else in agent/ receives what it needs.
 *
 * Start: check the certificate is `agent/<node>`, recover interrupted items, drain the outbox,
 * listen, announce the endpoint, fetch and apply. Stop (SIGTERM/SIGINT): no new work; a running
 * hook may finish within AGENT_SHUTDOWN_GRACE_MS, then its group is killed and the item
 * signalled as interrupted.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import type { Logger as PinoLogger } from 'pino';
import { ConfigError, codeOf } from '../protocol/errors.js';
import { spiffeIdOf, TRUST_DOMAIN_RE } from '../protocol/identity.js';
import { AGENT_FIRST_POLL_WAIT_MS, AGENT_SHUTDOWN_GRACE_MS, DEFAULT_TRUST_DOMAIN, POLL_INTERVAL_HEALTHY_MS, POLL_INTERVAL_MS } from '../protocol/limits.js';
import { WakeVerifier } from '../protocol/wake.js';
import { trustDomainOf } from '../certs/identity.js';
import { materialPaths, pkiPaths } from '../certs/paths.js';
import { PkiMaterial, refusalCodeOf } from '../certs/tls.js';
import { ensurePrivateDir } from './atomic-file.js';
import { ApplyLoop } from './apply.js';
import { FetchCoalescer } from './coalescer.js';
import { checkRootOwned, UnsafeStateDirError, type OwnerFs } from './root-owned.js';
import { earlyRetryDelayMs, Fetcher, keySetOf } from './fetcher.js';
import type { RunItem } from './hooks/types.js';
import { WakeListener } from './listener.js';
import { OutboxSender } from './outbox.js';
import { OutboxStore } from './outbox-store.js';
import { Poller } from './poller.js';
import { AgentState } from './state.js';

// CommonJS, so require()d: see the note in listener.ts (idle RSS)
const { pino } = createRequire(import.meta.url)('pino') as typeof import('pino');

export interface HostPort {
  host: string;
  port: number;
}

export interface AgentConfig {
  node: string;
  /** `https://host:port` */
  controller: string;
  listen: HostPort;
  advertise?: HostPort | undefined;
  pki: string;
  stateDir: string;
  hooksDir?: string | undefined;
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
  /** The effective uid the root-ownership checks go by (default process.getuid()); tests inject it. */
  uid?: number | undefined;
  /** The file system those checks stat (default node:fs). */
  ownerFs?: OwnerFs | undefined;
}

export const DEFAULT_AGENT_CONFIG = {
  controllerId: 'controller',
  pollIntervalMs: POLL_INTERVAL_MS,
  pollIntervalHealthyMs: POLL_INTERVAL_HEALTHY_MS,
} as const;

export interface RunningAgent {
  /** The bound listener port. */
  port: number;
  log: PinoLogger;
  /** Stops everything; resolves when done. Idempotent. */
  stop(reason?: string): Promise<void>;
}

/**
 * Starts the agent.
 * @throws ConfigError naming the option when the configuration or PKI is unusable
 */
export async function startAgent(cfg: AgentConfig): Promise<RunningAgent> {
  const log = pino({ name: 'herald-agent', level: cfg.logLevel ?? process.env.HERALD_LOG_LEVEL ?? 'info', base: { node: cfg.node } }, pino.destination({ fd: 2, sync: true }));

  // ---- identity and PKI --------------------------------------------------------------------
  const paths = materialPaths(cfg.pki, 'agent', cfg.node);
  const trustDomain = cfg.trustDomain ?? trustDomainFromPki(cfg.pki, cfg.ca ?? paths.caPath);
  const material = new PkiMaterial({
    caPath: cfg.ca ?? paths.caPath,
    certPath: cfg.cert ?? paths.certPath,
    keyPath: cfg.key ?? paths.keyPath,
    revokedPath: paths.revokedPath,
    jwksPath: paths.jwksPath,
    trustDomain,
    logger: log,
  });
  const me = material.current().identity;
  if (me.role !== 'agent' || me.name !== cfg.node) {
    material.close();
    throw new ConfigError(`--node ${cfg.node}: the certificate ${cfg.cert ?? paths.certPath} is ${me.spiffeId}, not ${spiffeIdOf(trustDomain, 'agent', cfg.node)}`, { field: 'node' });
  }
  if (!material.current().jwks) {
    material.close();
    throw new ConfigError(`--pki ${cfg.pki}: no ${paths.jwksPath}; the agent cannot verify wake-ups or metadata`, { field: 'pki', code: 'pki_missing' });
  }
  const p = pkiPaths(cfg.pki);
  for (const secret of [p.caKey, p.signingJwk]) {
    if (readable(secret)) log.warn({ file: secret }, 'this agent can read a CA or controller secret; it belongs on the CA host or controller only');
  }
  const controllerSpiffeId = spiffeIdOf(trustDomain, 'controller', cfg.controllerId);

  if (cfg.advertise === undefined && WILDCARD_HOSTS.has(cfg.listen.host)) {
    material.close();
    throw new ConfigError(`--listen ${formatHostPort(cfg.listen)} binds every address: give --advertise host:port, the address the controller dials`, { field: 'advertise' });
  }

  // ---- durable state -----------------------------------------------------------------------
  // absolute: hooks run with their run directory as the working directory
  const stateDir = path.resolve(cfg.stateDir);
  // as root: nothing anyone else could write is trusted (SPEC §4); checked before the state dir
  // is touched, and again once it exists (it may have been made meanwhile by someone else)
  const ownership = { stateDir, hooksDir: cfg.hooksDir, uid: cfg.uid ?? process.getuid?.(), fs: cfg.ownerFs };
  const checkOwnership = (): void => {
    try {
      checkRootOwned(ownership);
    } catch (err) {
      if (err instanceof UnsafeStateDirError) {
        log.error({ code: err.code, field: err.field, path: err.path, owner: err.ownerUid, mode: err.mode }, 'refusing to start: unsafe state or hooks dir');
      }
      material.close();
      throw err;
    }
  };
  checkOwnership();
  const state = await AgentState.open(stateDir, { log });
  const store = await OutboxStore.open(stateDir, { log });
  const runsDir = path.join(stateDir, 'runs');
  await ensurePrivateDir(runsDir, log);
  checkOwnership();

  // ---- parts -------------------------------------------------------------------------------
  const fetcher = new Fetcher({
    controllerUrl: cfg.controller,
    node: cfg.node,
    material,
    controllerSpiffeId,
    lastAppliedGen: () => state.lastAppliedGeneration,
    log,
  });
  const outbox = new OutboxSender({ store, send: (p2, body) => fetcher.signal(p2, body), log });
  let runItem: RunItem | undefined;
  const apply = new ApplyLoop({
    node: cfg.node,
    state,
    enqueue: (s) => outbox.put(s),
    loadRunItem: async () => (runItem ??= (await import('./hooks/run-item.js')).runItem),
    runOptions: { runsDir, ...(cfg.hooksDir ? { hooksDir: path.resolve(cfg.hooksDir) } : {}), log },
    log,
  });

  let lastFetchOk = false;
  // no initial generation: a fresh process has not fetched anything yet, whatever it did before
  const coalescer = new FetchCoalescer({
    fetch: async () => {
      try {
        const r = await fetcher.fetchMetadata();
        lastFetchOk = true;
        outbox.retryNow();
        if (r.status === 200) {
          log.info({ gen: r.gen, items: r.document.deployments.length }, 'metadata fetched');
          apply.submit(r.document);
        } else {
          log.debug({ gen: r.gen }, 'metadata not modified');
        }
        return { gen: r.gen };
      } catch (err) {
        lastFetchOk = false;
        const code = codeOf(err) ?? refusalCodeOf(err) ?? (err as { code?: string }).code;
        log.warn({ code, err: (err as Error).message }, 'metadata fetch failed');
        // a wake-up's fetch that failed for a passing reason is retried by the poller soon, not at
        // the next interval; a refused answer waits for the next poll
        const retryMs = earlyRetryDelayMs(err);
        if (retryMs !== null) poller.fetchFailed(retryMs);
        throw err;
      }
    },
  });

  // test-only: a skewed wake-up clock (HERALD_TEST_CLOCK_OFFSET_MS), for the security battery's
  // "agent clock ahead" case; TLS, the state dir and polling keep the real clock
  const clockOffsetMs = Number(process.env.HERALD_TEST_CLOCK_OFFSET_MS ?? 0) || 0;
  if (clockOffsetMs !== 0) log.warn({ clockOffsetMs }, 'HERALD_TEST_CLOCK_OFFSET_MS is set: wake-ups are checked against a skewed clock (tests only)');
  const wakeNowS = (): number => (Date.now() + clockOffsetMs) / 1000;
  const startedAtS = Math.floor(wakeNowS());
  const verifier = new WakeVerifier({ audience: me.spiffeId, keys: keySetOf(material), startedAtS, nowS: wakeNowS });
  const listener = new WakeListener({
    material,
    verifier,
    onWake: (claims) => coalescer.wake(claims.gen),
    lastFetchedGen: () => coalescer.lastFetchedGen,
    log,
  });
  const poller = new Poller({
    intervalMs: cfg.pollIntervalMs,
    healthyIntervalMs: cfg.pollIntervalHealthyMs,
    isPushHealthy: () => listener.isPushHealthy(),
    poll: async () => {
      coalescer.poll();
      await coalescer.idle();
      return lastFetchOk;
    },
  });
  listener.on('push-change', () => poller.pushChanged());

  // ---- start -------------------------------------------------------------------------------
  await apply.recover();
  outbox.kick();
  let port: number;
  try {
    port = await listener.listen(cfg.listen.host, cfg.listen.port);
  } catch (err) {
    fetcher.close();
    material.close();
    throw new ConfigError(`--listen ${formatHostPort(cfg.listen)}: ${(err as Error).message}`, { field: 'listen', cause: err });
  }
  const adv = cfg.advertise ?? cfg.listen;
  const url = `wss://${formatHost(adv.host)}:${adv.port === 0 || cfg.advertise === undefined ? port : adv.port}/v1/wake`;
  log.info({ listen: `${formatHost(cfg.listen.host)}:${port}`, url, controller: cfg.controller, identity: me.spiffeId }, 'agent started');
  const announceAbort = new AbortController();
  const announcing = fetcher.announce(url, announceAbort.signal).catch((err: unknown) => {
    log.error({ err }, 'endpoint announcement stopped');
    return false;
  });
  poller.startAfter(announcing, AGENT_FIRST_POLL_WAIT_MS);

  let stopping: Promise<void> | null = null;

  const stop = (reason = 'stop'): Promise<void> => {
    stopping ??= (async () => {
      log.info({ reason }, 'agent stopping');
      poller.stop();
      announceAbort.abort();
      coalescer.close();
      await listener.close();
      await apply.stop(cfg.shutdownGraceMs ?? AGENT_SHUTDOWN_GRACE_MS);
      await announcing;
      // one short chance to deliver what is queued; the rest waits on disk for the next start
      await Promise.race([outbox.idle(), new Promise((r) => setTimeout(r, 1_000).unref())]);
      await outbox.stop();
      fetcher.close();
      material.close();
      await state.flush().catch(() => undefined);
      log.info('agent stopped');
    })();
    return stopping;
  };
  return { port, log, stop };
}

const WILDCARD_HOSTS = new Set(['0.0.0.0', '::', '[::]', '']);

function readable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.R_OK);
    return true;
  } catch {
    return false;
  }
}

/** The trust domain a PKI dir was made for, without loading node-forge. */
export function trustDomainFromPki(dir: string, caPath: string): string {
  try {
    const td = (JSON.parse(fs.readFileSync(pkiPaths(dir).meta, 'utf8')) as { trustDomain?: unknown }).trustDomain;
    if (typeof td === 'string' && TRUST_DOMAIN_RE.test(td)) return td;
  } catch {
    // a bundle has no pki.json: ask the CA certificate
  }
  try {
    return trustDomainOf(fs.readFileSync(caPath));
  } catch {
    return DEFAULT_TRUST_DOMAIN;
  }
}

function formatHost(h: string): string {
  return h.includes(':') ? `[${h}]` : h;
}

export function formatHostPort(hp: HostPort): string {
  return `${formatHost(hp.host)}:${hp.port}`;
}
