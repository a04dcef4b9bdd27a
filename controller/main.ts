/**
 * The controller process: wires the store, the service, the HTTPS API, the push dialer (in this
 * process or in worker processes), the optional listener for agents that dial in, and the
 * optional plain health listener, and shuts them down in order on SIGTERM/SIGINT: stop accepting,
 * finish in-flight requests while the dialled-in connections are closed over the drain window
 * (1012), close the other agent connections (1001), write what is pending, close the database.
 */
import { readTrustDomain } from '../certs/trust-domain.js';
import fs from 'node:fs';
import type http from 'node:http';
import os from 'node:os';
import type { AddressInfo } from 'node:net';
import { pino, type Logger } from 'pino';
import { materialPaths, pkiPaths, signingKeyFileOf, type MaterialPaths } from '../certs/paths.js';
import type { LoadedIssuer } from '../certs/pki.js';
import { removeSessionFilesFrom } from '../certs/session-file.js';
import { TicketKey } from '../certs/ticket-key.js';
import { PkiMaterial } from '../certs/tls.js';
import { ConfigError, HeraldError } from '../protocol/errors.js';
import {
  AGENT_CERT_LIFETIME_S,
  CONNECT_DRAIN_WINDOW_MS,
  DEFAULT_TRUST_DOMAIN,
  IDLE_GC_CHECK_MS,
  IDLE_GC_MAX_BUSY_FRACTION,
  IDLE_GC_MIN_GARBAGE_BYTES,
  RESTART_STEP_MARGIN_S,
} from '../protocol/limits.js';
import { KeySet, Signer, type Ed25519PrivateJwk } from '../protocol/jws.js';
import { ed25519Engine, fastEd25519 } from './ed25519.js';
import { IdleCollector, v8Probe } from './idle-collector.js';
import { ApiServer, createHealthServer } from './api/server.js';
import { AccessControl } from './access/access.js';
import { apiRateLimiters, type RateOverrides } from './api/rate-limit.js';
import { ClusterEngine } from './clusters/engine.js';
import { AgentAnswers } from './service/agent-answers.js';
import { Enrollment } from './service/enrollment.js';
import { IdentityFloors } from './service/identity-floors.js';
import { EventBus } from './service/events.js';
import { ControllerMetrics } from './metrics.js';
import { DEFAULT_BOOTSTRAP_ADMIN, type ControllerOptions } from './options.js';
import type { PushService } from './push/types.js';
import type { PushTuning } from './push/ipc.js';
import { ControllerService } from './service/service.js';
import { Standing } from './fleet/standing.js';
import { looseDatabaseFiles, SqliteStore } from './store/sqlite/store.js';
import type { PgStore } from './store/pg/store.js';
import type { Store } from './store/store.js';
import { ObjectStoreServer } from './heat/server.js';
import { keystoneValidator, staticTokenValidator } from './heat/tokens.js';
import { HeatObjects } from './service/heat.js';
import { AuditRequests } from './service/audit-requests.js';
import { AuditCheckpoints } from './service/audit-checkpoints.js';

export interface StartDeps {
  /** Default: pino JSON lines to stderr at `options.logLevel`. */
  logger?: Logger;
  /** Default: the real dialer (PushDialer, or PushPool with --push-workers ≥ 1). */
  push?: (ctx: PushContext) => PushService | Promise<PushService>;
  /** Cluster step margin (default RESTART_STEP_MARGIN_S); tests shorten it. */
  stepMarginS?: number;
  clusterTickMs?: number;
  rates?: RateOverrides;
  bodyLimits?: { requestBytes?: number; signalBytes?: number };
  /** Override of API_UNAUTHENTICATED_HEADERS_DEADLINE_MS; tests shorten it. */
  unauthenticatedHeadersDeadlineMs?: number;
  /** Timeouts of the real push dialer, in this process or its workers (default protocol/limits.ts); tests shorten them. */
  pushTuning?: PushTuning;
  /** The audit trail's checkpoint interval and retention (default protocol/limits.ts); tests shorten them. */
  audit?: { everyMs?: number; retentionDays?: number; keptMaxEntries?: number; pruneBatchEntries?: number };
}

export interface PushContext {
  signer: Signer;
  signingJwk: Ed25519PrivateJwk;
  issuer: string;
  trustDomain: string;
  material: PkiMaterial;
  materialPaths: MaterialPaths;
  logger: Logger;
  metrics: ControllerMetrics;
  workers: number;
  /** The file push dialer `worker` (0 in process) keeps its TLS sessions in (certs/session-file.ts). */
  sessionFile: (worker: number) => string;
  tuning: PushTuning;
}

export interface RunningController {
  /** The bound API address (port 0 resolved). */
  address: AddressInfo;
  healthAddress: AddressInfo | null;
  /** Where agents dial in (`--connect-listen`), or null. */
  connectAddress: AddressInfo | null;
  /** Heat's object store (`--object-store-listen`), or null. */
  objectStoreAddress: AddressInfo | null;
  /** `spiffe://<td>/controller/<name>` */
  spiffeId: string;
  /** The issuing CA of `--issuer`, kept for enrolment and renewal (docs/adding-nodes.md). */
  issuer: LoadedIssuer | undefined;
  /** Join tokens, enrolment and renewal. */
  enrollment: Enrollment;
  service: ControllerService;
  /** The answers to agents' fetches and signals, over HTTPS and push connections alike. */
  answers: AgentAnswers;
  store: Store;
  api: ApiServer;
  metrics: ControllerMetrics;
  logger: Logger;
  /** The API's TLS session-ticket key (`<pki>/controller/<name>.tls-ticket-key`), rotated on its timer. */
  ticketKey: TicketKey;
  /** The audit trail's signed checkpoints and its pruning (docs/access.md). */
  auditCheckpoints: AuditCheckpoints;
  /** Graceful shutdown; idempotent. */
  close(): Promise<void>;
}

export function createLogger(level: ControllerOptions['logLevel']): Logger {
  // synchronous: a line written just before a crash is not lost in a buffer
  return pino(
    { level, base: { pid: process.pid, name: 'herald-controller' } },
    pino.destination({ fd: 2, sync: true }),
  );
}

/**
 * The trust domain: --trust-domain, else the PKI's pki.json, else the CA's `spiffe://<domain>`
 * SAN, else the default.
 */
export function resolveTrustDomain(o: ControllerOptions): string {
  return o.trustDomain || readTrustDomain(o.pki, { caPath: o.ca, fallback: DEFAULT_TRUST_DOMAIN });
}

/** The signing key in `file`, and its Signer (made once: making it is what checks the key). */
function loadSigningKey(file: string): { jwk: Ed25519PrivateJwk; signer: Signer } {
  let jwk: Ed25519PrivateJwk;
  try {
    jwk = JSON.parse(fs.readFileSync(file, 'utf8')) as Ed25519PrivateJwk;
  } catch (err) {
    throw new ConfigError(`cannot read the signing key ${file}: ${(err as Error).message}`, {
      cause: err,
      field: 'signing-key',
      code: (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'pki_missing' : 'bad_option',
    });
  }
  try {
    return { jwk, signer: new Signer(jwk, fastEd25519) };
  } catch (err) {
    throw new ConfigError(`${file} is not a usable private Ed25519 JWK with a kid: ${(err as Error).message}`, {
      cause: err,
      field: 'signing-key',
    });
  }
}

/** The real push service: the in-process dialer, or worker processes behind PushPool. */
async function defaultPush(ctx: PushContext): Promise<PushService> {
  if (ctx.workers === 0) {
    const { PushDialer } = await import('./push/dialer.js');
    return new PushDialer({
      ...ctx.tuning,
      signer: ctx.signer,
      issuer: ctx.issuer,
      trustDomain: ctx.trustDomain,
      material: ctx.material,
      logger: ctx.logger,
      metrics: ctx.metrics.registry,
      sessionFile: ctx.sessionFile(0),
    });
  }
  const { PushPool } = await import('./push/pool.js');
  return new PushPool({
    workers: ctx.workers,
    signingJwk: ctx.signingJwk,
    issuer: ctx.issuer,
    trustDomain: ctx.trustDomain,
    material: ctx.materialPaths,
    logger: ctx.logger,
    metrics: ctx.metrics.registry,
    sessionFile: ctx.sessionFile,
    tuning: ctx.tuning,
  });
}

/** @throws ConfigError `pki_missing` or `bad_option` (field `issuer`) */
async function loadControllerIssuer(dir: string, name: string, caPath: string): Promise<LoadedIssuer> {
  const { loadIssuer } = await import('../certs/pki.js');
  try {
    return loadIssuer(dir, name, caPath);
  } catch (err) {
    const code = err instanceof HeraldError && err.code === 'pki_missing' ? 'pki_missing' : 'bad_option';
    throw new ConfigError((err as Error).message, { cause: err, field: 'issuer', code });
  }
}

/**
 * Starts a controller with checked options. Throws ConfigError (naming the option) before
 * anything listens when the PKI, certificate or database is not usable.
 */
export async function startController(o: ControllerOptions, deps: StartDeps = {}): Promise<RunningController> {
  const logger = deps.logger ?? createLogger(o.logLevel);
  const trustDomain = resolveTrustDomain(o);
  const base = materialPaths(o.pki, 'controller', o.name);
  const paths: MaterialPaths = {
    ...base,
    caPath: o.ca ?? base.caPath,
    certPath: o.cert ?? base.certPath,
    keyPath: o.key ?? base.keyPath,
  };
  const material = new PkiMaterial({ ...paths, trustDomain, logger });
  const cleanup: Array<() => void | Promise<void>> = [() => material.close()];
  const undo = async (): Promise<void> => {
    for (const f of cleanup.reverse()) await f();
  };
  try {
    const me = material.current().identity;
    if (me.role !== 'controller' || me.name !== o.name) {
      throw new ConfigError(`${paths.certPath} is ${me.spiffeId}, not controller/${o.name}`, { field: 'cert' });
    }
    // the issuing CA is loaded now, so a wrong --issuer stops the start; enrolment and renewal
    // sign with it (docs/adding-nodes.md); node-forge loads only when one is given
    const issuer = o.issuer === undefined ? undefined : await loadControllerIssuer(o.pki, o.issuer, paths.caPath);
    if (issuer) logger.info({ issuer: issuer.name, serial: issuer.serial }, 'issuing CA loaded');
    const signingFile = signingKeyFileOf(o.pki, o.name, o.signingKey);
    const loaded = loadSigningKey(signingFile);
    const signingJwk = loaded.jwk;
    let signer = loaded.signer;
    let pushService: PushService | undefined;
    // a rotated signing key comes with a new JWKS: take the new private key with it
    material.on('jwks-change', () => {
      try {
        const next = loadSigningKey(signingFile);
        signer = next.signer;
        pushService?.setSigningKey(next.jwk);
        logger.info({ kid: signer.kid }, 'signing key reloaded');
      } catch (err) {
        logger.error(
          { err: { message: (err as Error).message } },
          'signing key not reloaded; keeping the last good one',
        );
      }
    });

    // the API's session-ticket key, so agents resume their TLS sessions after a restart (issue
    // 16); a key file readable by others or of the wrong length stops the start
    const ticketKey = new TicketKey({ file: pkiPaths(o.pki).ticketKey(o.name), logger });
    cleanup.push(() => ticketKey.close());

    const { store, file: dbFile, pg } = await openStore(o.db, o.name);
    cleanup.push(() => store.close());
    // its own certificate, checked while it runs: revoked or expired, it gives up its nodes and
    // writes nothing (docs/several-controllers.md)
    const standing = new Standing({ material, logger });
    standing.start();
    cleanup.push(() => standing.close());
    pg?.setWriteGate(() => standing.refusal());
    for (const { file, mode } of dbFile === null ? [] : looseDatabaseFiles(dbFile)) {
      logger.warn(
        { code: 'unsafe_file_mode', file, mode },
        `${file} is readable or writable by group or others (mode ${mode}); it holds hidden input values: chmod 600 it`,
      );
    }
    const metrics = new ControllerMetrics();
    const events = new EventBus();
    // beside the database: its own process's state (the PKI directory may be shared by processes of one name)
    const sessionFile = (worker: number): string =>
      dbFile !== null && dbFile !== ':memory:'
        ? `${dbFile}.push-sessions-${worker}`
        : pkiPaths(o.pki).pushSessions(o.name, worker);
    // the files of workers this start does not have (fewer workers than the last start: worker 0
    // dials when there are none) hold sessions no one will offer again
    const stale = removeSessionFilesFrom(sessionFile, Math.max(1, o.pushWorkers));
    if (stale.removed.length > 0)
      logger.info({ files: stale.removed }, 'removed the session files of push workers no longer started');
    for (const { file, error } of stale.failed)
      logger.warn(
        { code: 'session_file_unremovable', file, error },
        `${file}: cannot remove a stale push session file`,
      );
    const dialer = await (deps.push ?? defaultPush)({
      signer,
      signingJwk,
      issuer: me.spiffeId,
      trustDomain,
      material,
      materialPaths: paths,
      logger,
      metrics,
      workers: o.pushWorkers,
      sessionFile,
      tuning: deps.pushTuning ?? {},
    });
    // several controllers (docs/several-controllers.md): the fleet decides which nodes this one pushes to
    let publicUrl = o.publicUrl ?? defaultPublicUrl(o.listen.host, o.listen.port);
    const fleet =
      pg &&
      new (await import('./fleet/fleet.js')).Fleet({
        store: pg,
        name: o.name,
        apiUrl: () => publicUrl,
        push: dialer,
        logger,
        registry: metrics.registry,
        standing,
      });
    const push: PushService = fleet ?? dialer;
    pushService = push;
    cleanup.push(() => push.close());

    const service = new ControllerService({
      store,
      push,
      events,
      logger,
      metrics,
      clusters: new ClusterEngine({ stepMarginS: deps.stepMarginS ?? RESTART_STEP_MARGIN_S }),
      publicUrl,
      name: o.name,
      autoRegister: o.autoRegister,
      standing: () => standing.refusal(),
      ...(fleet
        ? {
            controllers: () => fleet.members(),
            owners: (nodes: string[] | null) => fleet.owners(nodes),
            pushCares: (node: string) => fleet.cares(node),
          }
        : {}),
      ...(deps.clusterTickMs !== undefined ? { clusterTickMs: deps.clusterTickMs } : {}),
    });
    cleanup.push(() => service.close());
    if (pg) {
      const { ChangeFeed } = await import('./fleet/change-feed.js');
      const feed = new ChangeFeed({
        store: pg,
        apply: (c) => service.applyChanges(c.changes, c.origin),
        // notifications missed while cut off: every owned node whose agent is behind gets a ping
        resync: async () => {
          for (const n of await pg.listNodes())
            if (n.ackedGeneration === null || n.ackedGeneration < n.generation) push.notify(n.id, n.generation, 'ping');
        },
        logger,
        registry: metrics.registry,
      });
      await feed.start();
      service.useChangeFeed(feed);
      cleanup.push(() => feed.close());
    }
    // the push workers load revoked.json but not the database: they are sent its floors
    const floors = new IdentityFloors({
      store,
      material,
      logger,
      ...(dialer.setIdentityFloors ? { onChange: (f) => dialer.setIdentityFloors?.(f) } : {}),
    });
    await floors.start();
    cleanup.push(() => floors.close());
    const enrollment = new Enrollment({
      store,
      issuer,
      floors,
      material,
      agentCertLifetimeS: o.agentCertLifetimeS ?? AGENT_CERT_LIFETIME_S,
      logger,
    });
    // an agent's fetches and signals draw on one budget whether they come over HTTPS or push
    const limiters = apiRateLimiters(deps.rates);
    const answers = new AgentAnswers({
      service,
      signer: () => signer,
      issuer: me.spiffeId,
      trustDomain: me.trustDomain,
      limits: { fetch: limiters.fetch, signal: limiters.signal },
      metrics,
      logger,
      ...(deps.bodyLimits?.signalBytes !== undefined ? { signalBodyBytes: deps.bodyLimits.signalBytes } : {}),
    });
    cleanup.push(() => answers.close());
    const access = new AccessControl({ store, bootstrapAdmins: o.bootstrapAdmins ?? [DEFAULT_BOOTSTRAP_ADMIN] });
    const api = new ApiServer({
      service,
      access,
      answers,
      material,
      logger,
      metrics,
      enrollment,
      floors,
      ticketKey,
      limiters,
      audit: new AuditRequests({ store, hiddenOf: (d) => service.hiddenInputsOf(d), logger }),
      ...(deps.bodyLimits ? { bodyLimits: deps.bodyLimits } : {}),
      ...(deps.unauthenticatedHeadersDeadlineMs !== undefined
        ? { unauthenticatedHeadersDeadlineMs: deps.unauthenticatedHeadersDeadlineMs }
        : {}),
    });
    push.serveRequests((r) => answers.answerPush(r));
    let address: AddressInfo;
    try {
      address = await api.listen(o.listen.port, o.listen.host);
    } catch (err) {
      throw new ConfigError(`--listen ${o.listen.host}:${o.listen.port}: ${(err as Error).message}`, {
        cause: err,
        field: 'listen',
      });
    }
    cleanup.push(() => api.close(0));
    // port 0 is known only now; nothing has been served yet (this runs before any I/O callback)
    if (o.publicUrl === null) {
      publicUrl = defaultPublicUrl(o.listen.host, address.port);
      service.setPublicUrl(publicUrl);
    }
    await service.start();
    // the audit trail's checkpoints, signed with this controller's key, checked with every
    // controller's public key (docs/access.md "Audit trail")
    const auditCheckpoints = new AuditCheckpoints({
      store,
      logger,
      spiffeId: me.spiffeId,
      signer: () => signer,
      keys: () => {
        const m = material.current();
        return new KeySet(m.jwks ?? { keys: [] }, m.revokedKids);
      },
      ...(o.auditCheckpointIntervalMs !== undefined ? { everyMs: o.auditCheckpointIntervalMs } : {}),
      ...deps.audit,
    });
    auditCheckpoints.start();
    cleanup.push(() => auditCheckpoints.close());
    // after the service's start: an agent dialling in is answered with its ping at once
    let connectAddress: AddressInfo | null = null;
    if (o.connectListen) {
      if (!push.serveConnect)
        throw new ConfigError('--connect-listen: this push service takes no dialled-in connections', {
          field: 'connect-listen',
        });
      connectAddress = await push.serveConnect(o.connectListen);
    }
    const objectStore = o.objectStoreListen
      ? await startObjectStore(o, { store, service, material, logger, metrics })
      : null;
    if (objectStore) cleanup.push(() => objectStore.close());

    // what a burst (a fleet connecting, a change to every node) left in V8's heap, collected once
    // the process is quiet, so an idle controller holds what it uses
    const idle = new IdleCollector(v8Probe(), {
      everyMs: IDLE_GC_CHECK_MS,
      maxUtilization: IDLE_GC_MAX_BUSY_FRACTION,
      minGarbageBytes: IDLE_GC_MIN_GARBAGE_BYTES,
      onCollected: (before, after) =>
        logger.info(
          { heap_before_mb: Math.round(before / 2 ** 20), heap_after_mb: Math.round(after / 2 ** 20) },
          'collected the heap while idle',
        ),
    });
    idle.start();
    cleanup.push(() => idle.close());

    let health: http.Server | null = null;
    let healthAddress: AddressInfo | null = null;
    if (o.healthListen) {
      // the TLS /healthz's phase, and the database reachable
      const h = createHealthServer(() =>
        service.phase !== 'ok'
          ? Promise.resolve(service.phase)
          : store.generation().then(
              () => 'ok',
              () => 'unavailable',
            ),
      );
      health = h;
      try {
        healthAddress = await new Promise<AddressInfo>((resolve, reject) => {
          h.once('error', reject);
          h.listen(o.healthListen!.port, o.healthListen!.host, () => resolve(h.address() as AddressInfo));
        });
      } catch (err) {
        throw new ConfigError(
          `--health-listen ${o.healthListen.host}:${o.healthListen.port}: ${(err as Error).message}`,
          { cause: err, field: 'health-listen' },
        );
      }
    }

    logger.info(
      {
        event: 'controller.start',
        listen: `${address.address}:${address.port}`,
        health: healthAddress ? `${healthAddress.address}:${healthAddress.port}` : null,
        connect: connectAddress ? `${connectAddress.address}:${connectAddress.port}` : null,
        objectStore: objectStore ? `${objectStore.address.address}:${objectStore.address.port}` : null,
        spiffeId: me.spiffeId,
        trustDomain,
        db: pg ? pg.url : o.db,
        autoRegister: o.autoRegister,
        pushWorkers: o.pushWorkers,
        signing: ed25519Engine(),
        generation: await store.generation(),
      },
      'controller listening',
    );

    let closing: Promise<void> | undefined;
    const close = (): Promise<void> => {
      closing ??= (async () => {
        logger.info({ event: 'controller.stop' }, 'controller shutting down');
        service.beginStop(); // probes hear `stopping` while the API drains
        const h = health;
        await Promise.all([
          api.close(),
          h ? new Promise<void>((r) => h.close(() => r())) : Promise.resolve(),
          objectStore?.close(),
          // their agents move to another controller over the window, not all at once; wake-ups
          // still go on those not yet closed
          connectAddress ? push.drainConnect?.(o.connectDrainMs ?? CONNECT_DRAIN_WINDOW_MS) : undefined,
        ]);
        await service.close();
        // after the last change: its rows are under the last checkpoint
        await auditCheckpoints.close();
        await push.close();
        answers.close();
        await store.close();
        standing.close();
        ticketKey.close();
        material.close();
        logger.info({ event: 'controller.stopped' }, 'controller stopped');
      })();
      return closing;
    };
    return {
      address,
      healthAddress,
      connectAddress,
      objectStoreAddress: objectStore?.address ?? null,
      spiffeId: me.spiffeId,
      service,
      answers,
      store,
      api,
      metrics,
      logger,
      issuer,
      enrollment,
      ticketKey,
      auditCheckpoints,
      close,
    };
  } catch (err) {
    await undo();
    throw err;
  }
}

/**
 * The store `--db` names: `postgres://…` (or `postgresql://…`) is PostgreSQL, shared by
 * several controllers; a path (or `sqlite:<path>`) is SQLite, this controller's alone.
 */
async function openStore(db: string, name: string): Promise<{ store: Store; file: string | null; pg: PgStore | null }> {
  if (/^postgres(ql)?:\/\//.test(db)) {
    const { PgStore } = await import('./store/pg/store.js');
    const pg = await PgStore.open(db, { controller: name });
    return { store: pg, file: null, pg };
  }
  const file = db.startsWith('sqlite:') ? db.slice('sqlite:'.length) : db;
  return { store: new SqliteStore(file, { controller: name }), file, pg: null };
}

/** The URL agents reach the API at, for `deploy_signal_id`. */
export function defaultPublicUrl(host: string, port: number): string {
  const h = host === '0.0.0.0' || host === '::' ? os.hostname() : host;
  return `https://${h.includes(':') ? `[${h}]` : h}:${port}`;
}

/**
 * Heat's object store on its own listener (docs/heat.md), its tokens checked by Keystone or by the
 * static file. @throws ConfigError naming the option that failed
 */
async function startObjectStore(
  o: ControllerOptions,
  d: { store: Store; service: ControllerService; material: PkiMaterial; logger: Logger; metrics: ControllerMetrics },
): Promise<{ address: AddressInfo; close(): Promise<void> }> {
  const listen = o.objectStoreListen!;
  const tokens = o.objectStoreTokens
    ? staticTokenValidator({ file: o.objectStoreTokens, logger: d.logger })
    : keystoneValidator({
        credentialsFile: o.keystoneCredentials!,
        ...(o.keystoneCa ? { caFile: o.keystoneCa } : {}),
        ...(o.keystoneRoles ? { roles: o.keystoneRoles } : {}),
        logger: d.logger,
      });
  const heat = new HeatObjects({
    store: d.store,
    committed: (c) => d.service.committed(c),
    heatProjects: o.heatProjects ?? [],
  });
  const server = new ObjectStoreServer({
    heat,
    tokens,
    material: d.material,
    logger: d.logger,
    refusal: () => d.service.standingRefusal(),
    requests: d.metrics.objectStoreRequests,
  });
  try {
    await server.listen(listen.port, listen.host);
  } catch (err) {
    tokens.close();
    await server.close();
    throw new ConfigError(`--object-store-listen ${listen.host}:${listen.port}: ${(err as Error).message}`, {
      cause: err,
      field: 'object-store-listen',
    });
  }
  return {
    address: server.server.address() as AddressInfo,
    close: async () => {
      await server.close();
      tokens.close();
    },
  };
}
