/**
 * The controller's operations, between the API and the store: validates what the store cannot,
 * runs each change as one store transaction, then wakes the nodes that got work (push), drops
 * nothing into memory that matters after a crash, and announces changes (events). Cluster
 * operations are the cluster engine's (clusters/engine.ts), run inside the store transaction
 * that records their event; a timer here only drives deadlines and restart windows (the
 * engine's tick), and it is run once at start for what happened while down.
 */
import type { Logger } from 'pino';
import { codeOf, HeraldError } from '../../protocol/errors.js';
import { DEFAULT_ACTIONS, type DeployAction } from '../../protocol/heat.js';
import { ACK_FLUSH_INTERVAL_MS, CLUSTER_TICK_INTERVAL_MS, WAKE_FETCH_EXEMPT_MS } from '../../protocol/limits.js';
import type { CertIdentity } from '../../certs/identity.js';
import { ClusterEngine, type GateRequest, type RestartOptions, type RolloutControl } from '../clusters/engine.js';
import type { ConfigChange } from '../clusters/revisions.js';
import { readGate } from './rollout-gate.js';
import { AttachPings } from './attach-pings.js';
import { hostInSans, parseEndpoint } from './endpoint.js';
import { GroupCommitter } from './group-commit.js';
import { LiveOutputService } from './live-output.js';
import type { EventBus } from './events.js';
import { encodeMetadataDocument, MetadataCache, type BuiltMetadata } from './metadata-builder.js';
import type { ControllerMetrics } from '../metrics.js';
import type { PushService } from '../push/types.js';
import { recordSignal } from './signal.js';
import { WakeCredits, type WakeCreditKind } from './wake-credits.js';
import type { ClusterView, ControllerView } from '../../protocol/rest.js';
import type {
  ClusterRecord,
  ConfigRecord,
  KnownGenerations,
  MetadataSource,
  NewNodegroup,
  RolloutGate,
} from '../model/records.js';
import { knows } from '../model/document.js';
import type { ChangeSet, DeploymentRecord, NodeRecord, Store } from '../store/store.js';
import {
  checkConfig,
  checkRevisionAction,
  clusterCreateSchema,
  coerceInputValues,
  configCreateSchema,
  deploymentCreateSchema,
  deploymentPatchSchema,
  endpointSchema,
  mergeInputValues,
  nodeCreateSchema,
  nodegroupSchema,
  nodePatchSchema,
  parseBody,
  restartSchema,
  signalSchema,
  undoSchema,
  upgradeSchema,
} from './validation.js';
import type { GateBody, NodegroupBody, RolloutBody } from './validation.js';
import { checkLabels, patchLabels } from '../../protocol/access.js';
import {
  clusterSummaryView,
  clusterView,
  configView,
  deploymentView,
  hiddenNames,
  hiddenOutputNames,
  nodeView,
  clusterRevisionView,
  restartPlanView,
  revisionView,
  upgradePlanView,
  type FetchState,
} from './views.js';

export interface ControllerServiceOptions {
  store: Store;
  push: PushService;
  events: EventBus;
  logger: Logger;
  metrics?: ControllerMetrics | undefined;
  /** Base of `deploy_signal_id`: `https://host:port` the agents reach this API at. */
  publicUrl: string;
  /** Create unknown nodes when their agent announces itself (default true). */
  autoRegister?: boolean;
  now?: () => number;
  /** The cluster engine (default: one with the default step margin). */
  clusters?: ClusterEngine;
  clusterTickMs?: number;
  ackFlushMs?: number;
  /** This controller's name (default `controller`). */
  name?: string;
  /** Several controllers (docs/several-controllers.md): every controller of the database; without it, this one alone. */
  controllers?: () => Promise<ControllerView[]>;
  /** Several controllers: the owner of each of `nodes` (null: of every node). */
  owners?: (nodes: string[] | null) => Promise<Map<string, string>>;
  /** Several controllers: whether the push service wants to hear of a change to this node (its own, or one it has not seen). */
  pushCares?: (node: string) => boolean;
  /** Why this controller may change nothing now (its certificate revoked or expired: standing.ts); default never. */
  standing?: () => HeraldError | undefined;
}

type View = Record<string, unknown>;

/**
 * Whether the reader may see the hidden outputs of a deployment on `node` (docs/access.md: an
 * operator who may deploy to it); absent: never (the event stream).
 */
export type RevealOutputs = (node: string) => boolean | Promise<boolean>;

/** A node's generation, and its metadata body unless the asker holds that generation already. */
export interface MetadataAnswer {
  generation: number;
  built: BuiltMetadata | null;
}

export class ControllerService {
  readonly store: Store;
  readonly clusters: ClusterEngine;
  readonly push: PushService;
  readonly events: EventBus;
  /** Live output chunks (docs/api.md). */
  readonly output: LiveOutputService;
  readonly #log: Logger;
  readonly #metrics: ControllerMetrics | undefined;
  #publicUrl: string;
  readonly #autoRegister: boolean;
  readonly #now: () => number;
  readonly #cache = new MetadataCache();
  /** Signals and announcements from many agents share commits (one fsync each batch). */
  readonly #committer: GroupCommitter;
  /** Each node's last fetch: its generation and when (ms), kept in place (a fetch allocates nothing here). */
  readonly #fetches = new Map<string, { gen: number; atMs: number }>();
  /** When the controller last sent each node a wake-up, oldest first (entries older than WAKE_FETCH_EXEMPT_MS are dropped). */
  readonly #wokeAt = new Map<string, number>();
  /** What each node may send outside its rate limits: the results and last output chunks of work it was given. */
  readonly #credits = new WakeCredits();
  #pendingAcks = new Map<string, number>();
  #tickTimer: NodeJS.Timeout | undefined;
  /** The tick in progress, if any: a slow one is not run twice at once. */
  #ticking: Promise<void> | undefined;
  /** Gates being read, by cluster (one read at a time per rollout: docs/api.md `gate`). */
  readonly #gateReads = new Map<string, Promise<void>>();
  #flushing: Promise<void> | undefined;
  #ackTimer: NodeJS.Timeout | undefined;
  readonly #tickMs: number;
  readonly #ackMs: number;
  #closed = false;
  #started = false;
  #stopping = false;
  #feed: { catchUp(): Promise<void> } | undefined;
  #tickFailing = false;
  #ackFailing = false;
  readonly #name: string;
  readonly #controllers: (() => Promise<ControllerView[]>) | undefined;
  readonly #owners: ((nodes: string[] | null) => Promise<Map<string, string>>) | undefined;
  readonly #pushCares: ((node: string) => boolean) | undefined;
  readonly #standing: () => HeraldError | undefined;
  readonly #startedAt = new Date().toISOString();
  readonly #attachPings: AttachPings;

  constructor(o: ControllerServiceOptions) {
    this.store = o.store;
    this.clusters = o.clusters ?? new ClusterEngine();
    this.push = o.push;
    this.events = o.events;
    this.output = new LiveOutputService(this.store, this.events);
    this.#log = o.logger;
    this.#metrics = o.metrics;
    this.#publicUrl = o.publicUrl.replace(/\/+$/, '');
    this.#autoRegister = o.autoRegister ?? true;
    this.#now = o.now ?? Date.now;
    this.#tickMs = o.clusterTickMs ?? CLUSTER_TICK_INTERVAL_MS;
    this.#ackMs = o.ackFlushMs ?? ACK_FLUSH_INTERVAL_MS;
    this.#committer = new GroupCommitter(this.store);
    this.#name = o.name ?? 'controller';
    this.#controllers = o.controllers;
    this.#owners = o.owners;
    this.#pushCares = o.pushCares;
    this.#standing = o.standing ?? (() => undefined);
    this.#attachPings = new AttachPings({
      store: this.store,
      push: this.push,
      logger: this.#log,
      register: (node) => this.#registerDialledIn(node),
    });
  }

  /**
   * Why this controller may change nothing now: HeraldError `controller_revoked` or
   * `controller_expired` (its own certificate), else undefined. The API refuses every write with
   * it; on PostgreSQL the store refuses every write with it too, whatever the path.
   */
  standingRefusal(): HeraldError | undefined {
    return this.#standing();
  }

  /** `GET /v1/controllers`: every controller of the database, or this one alone on SQLite. */
  async listControllers(): Promise<ControllerView[]> {
    if (this.#controllers) return this.#controllers();
    const nodes = await this.store.listNodes();
    const now = new Date(this.#now()).toISOString();
    return [
      {
        name: this.#name,
        api_url: this.#publicUrl,
        live: true,
        started_at: this.#startedAt,
        heartbeat_at: now,
        lease_until: now,
        nodes_owned: nodes.length,
        nodes_held: nodes.filter((n) => this.push.state(n.id).connected).length,
      },
    ];
  }

  /** Sets the base of `deploy_signal_id` (known only once the API is bound, with port 0). */
  setPublicUrl(url: string): void {
    this.#publicUrl = url.replace(/\/+$/, '');
  }

  /** Subscribes to the dialer, starts it with every node, and starts the timers. */
  async start(): Promise<void> {
    this.push.on('ack', (e) => this.#noteFetched(e.node, e.gen, false));
    // a dialled-in agent's first wake-up carries the generation the database holds
    this.push.on('attach', (node) => this.#attachPings.attached(node));
    this.push.on('state', (node, s) => {
      if (this.events.subscribers > 0) this.events.publish('push', { node, ...s });
    });
    await this.tick(); // deadlines that passed while the controller was down
    await this.push.start(
      (await this.store.listNodes()).map((n) => ({
        node: n.id,
        url: n.endpoint,
        generation: n.generation,
        ackedGeneration: n.ackedGeneration,
      })),
    );
    this.#tickTimer = setInterval(() => void this.tick(), this.#tickMs);
    this.#tickTimer.unref();
    this.#ackTimer = setInterval(() => {
      this.flushAcks().then(
        () => {
          this.#ackFailing = false;
        },
        (err: unknown) => {
          if (this.#standing() !== undefined) return; // refused, and said once by the standing
          if (codeOf(err) !== 'store_unavailable') this.#log.error({ err }, 'could not write acknowledged generations');
          else if (!this.#ackFailing)
            this.#log.warn(
              { code: 'store_unavailable' },
              'acknowledged generations not written: the database is unreachable',
            );
          this.#ackFailing = codeOf(err) === 'store_unavailable';
        },
      );
    }, this.#ackMs);
    this.#ackTimer.unref();
    this.#started = true;
  }

  /**
   * What `/healthz` says: `starting` until start() has finished (the dialer has every node and, on
   * PostgreSQL, this controller has joined the fleet and run its first ownership pass: nodes a live
   * controller still holds come over at that one's next pass), `stopping` from beginStop() or close(),
   * and the standing's code while its own certificate is revoked or expired (a probe takes it out).
   */
  get phase(): 'starting' | 'ok' | 'stopping' | 'controller_revoked' | 'controller_expired' {
    if (this.#stopping || this.#closed) return 'stopping';
    const lost = this.#standing()?.code;
    if (lost === 'controller_revoked' || lost === 'controller_expired') return lost;
    return this.#started ? 'ok' : 'starting';
  }

  /** Shutdown has begun (the API drains its requests first): probes are told `stopping` from now on. */
  beginStop(): void {
    this.#stopping = true;
  }

  /**
   * Stops the timers, waits for a tick in progress and writes pending acks. Does not close the
   * store or the dialer. Idempotent; never rejects.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#tickTimer);
    clearInterval(this.#ackTimer);
    this.#attachPings.close();
    await this.#ticking;
    await Promise.all(this.#gateReads.values());
    try {
      await this.flushAcks();
    } catch (err) {
      this.#log.error({ err }, 'could not write acknowledged generations at shutdown');
    }
  }

  // ---- nodes -------------------------------------------------------------------------------

  async createNode(body: unknown, who: string): Promise<View> {
    const b = parseBody(nodeCreateSchema, body);
    const url = b.endpoint == null ? null : parseEndpoint(b.endpoint, 'endpoint').url;
    const labels = b.labels === undefined ? {} : patchLabels({}, checkLabels(b.labels));
    const { changes } = await this.store.transaction(async (tx) => {
      await tx.createNode(b.id, url, who);
      if (Object.keys(labels).length > 0) await tx.setNodeLabels(b.id, labels, who);
    });
    const node = (await this.store.getNode(b.id))!;
    this.#log.info({ event: 'node.create', node: node.id, who }, 'node created');
    if (url !== null) this.push.setEndpoint(node.id, url, node.generation);
    await this.#apply(changes);
    return this.#nodeView(node, labels);
  }

  /**
   * `PATCH /v1/nodes/{id}` `{"labels":{"team":"web","old":null}}`: sets labels, `null` removes
   * one (docs/access.md). Read and write are one transaction.
   * @throws HeraldError invalid_request | not_found
   */
  async updateNode(id: string, body: unknown, who: string): Promise<View> {
    const b = parseBody(nodePatchSchema, body);
    const patch = checkLabels(b.labels, 'labels', true);
    const { result: labels, changes } = await this.store.transaction(async (tx) => {
      const had = (await tx.nodeLabels([id])).get(id) ?? {};
      const next = patchLabels(had, patch);
      await tx.setNodeLabels(id, next, who);
      return next;
    });
    this.#log.info({ event: 'node.labels', node: id, labels, who }, 'node labels set');
    await this.#apply(changes);
    const n = await this.store.getNode(id);
    if (!n) throw new HeraldError('not_found', `no node ${id}`);
    return (await this.#withOwners([this.#nodeView(n, labels)]))[0]!;
  }

  /**
   * A node whose agent dialled in and is not in the database: with auto-registration on, it is
   * registered (without an endpoint), as its announcement would register it; a deleted node is
   * not. Its generation, or undefined.
   */
  async #registerDialledIn(node: string): Promise<number | undefined> {
    if (!this.#autoRegister || (await this.store.isTombstoned(node))) return undefined;
    try {
      const { node: n, changes } = await this.store.createNode(node, null, `agent/${node}`);
      this.#log.info({ event: 'node.register', node, via: 'dialled-in' }, 'node registered by its agent');
      await this.#apply(changes);
      return n.generation;
    } catch (err) {
      if (codeOf(err) !== 'node_exists') throw err;
      return (await this.store.getNode(node))?.generation;
    }
  }

  /**
   * An agent's announcement of its listener. The URL's host must be among `caller`'s SANs.
   * @throws HeraldError bad_endpoint | link_local_endpoint | endpoint_not_in_san | node_deleted | not_found
   */
  async announce(node: string, body: unknown, caller: CertIdentity): Promise<View> {
    const b = parseBody(endpointSchema, body);
    const ep = parseEndpoint(b.url, 'url');
    if (!hostInSans(ep.host, caller.dns, caller.ips)) {
      throw new HeraldError('endpoint_not_in_san', `the endpoint host is not among the certificate's DNS or IP SANs`, {
        field: 'url',
      });
    }
    const { result: r, changes } = await this.#committer.run(async (tx) => {
      const done = await tx.announceEndpoint(node, ep.url, caller.spiffeId, this.#autoRegister);
      return { ...done, node: (await tx.node(node))! };
    });
    // the unit touched this node alone: its generation is the unit's, given at the unit's end
    const n: NodeRecord = { ...r.node, generation: changes.generation ?? r.node.generation };
    if (r.changed) {
      this.#log.info(
        { event: r.created ? 'node.register' : 'node.endpoint', node, endpoint: ep.url },
        r.created ? 'node registered by its agent' : 'node endpoint changed',
      );
      this.push.setEndpoint(node, ep.url, n.generation);
    }
    await this.#apply(changes);
    return this.#nodeView(n);
  }

  async listNodes(): Promise<View[]> {
    const nodes = await this.store.listNodes();
    const labels = await this.store.nodeLabels(null);
    const views = nodes.map((n) => this.#nodeView(n, labels.get(n.id) ?? {}));
    return this.#withOwners(views);
  }

  async getNode(id: string): Promise<View> {
    const n = await this.store.getNode(id);
    if (!n) throw new HeraldError('not_found', `no node ${id}`);
    const labels = (await this.store.nodeLabels([id])).get(id) ?? {};
    return (await this.#withOwners([this.#nodeView(n, labels)]))[0]!;
  }

  /** Several controllers: each node's owner (its `push` state is this controller's, so it is the owner's only when `owner` is this one). */
  async #withOwners(views: View[]): Promise<View[]> {
    if (!this.#owners) return views;
    const owners = await this.#owners(views.length === 1 ? [String(views[0]!.id)] : null);
    return views.map((v) => ({ ...v, owner: owners.get(String(v.id)) ?? null }));
  }

  async deleteNode(id: string, who: string): Promise<void> {
    const changes = await this.store.deleteNode(id, who);
    this.push.remove(id);
    this.#cache.delete(id);
    this.#fetches.delete(id);
    this.#pendingAcks.delete(id);
    this.#log.info({ event: 'node.delete', node: id, who }, 'node deleted');
    await this.#apply(changes);
  }

  #nodeView(n: NodeRecord, labels?: Readonly<Record<string, string>>): View {
    return nodeView(n, this.push.state(n.id), fetchStateOf(this.#fetches.get(n.id)), labels);
  }

  // ---- configs -----------------------------------------------------------------------------

  async createConfig(body: unknown, who: string): Promise<View> {
    const c = checkConfig(parseBody(configCreateSchema, body));
    const rec = await this.store.createConfig(c, who);
    this.#log.info({ event: 'config.create', config: rec.id, name: rec.name, group: rec.group, who }, 'config created');
    return configView(rec);
  }

  async listConfigs(): Promise<View[]> {
    return (await this.store.listConfigs()).map(configView);
  }

  async getConfig(id: string): Promise<View> {
    const c = await this.store.getConfig(id);
    if (!c) throw new HeraldError('not_found', `no config ${id}`);
    return configView(c);
  }

  // ---- deployments -------------------------------------------------------------------------

  async createDeployment(body: unknown, who: string): Promise<View> {
    const b = parseBody(deploymentCreateSchema, body);
    const config = await this.store.getConfig(b.config_id);
    if (!config) throw new HeraldError('unknown_config', `no config ${b.config_id}`, { field: 'config_id' });
    const action = checkRevisionAction(b.action) ?? 'CREATE';
    const actions = b.actions === undefined ? [...DEFAULT_ACTIONS] : [...new Set<DeployAction>(b.actions)];
    const inputValues = coerceInputValues(config, b.input_values ?? {});
    const { deployment, changes } = await this.store.createDeployment(
      { node: b.node, configId: config.id, name: b.name ?? null, actions, action, inputValues },
      who,
    );
    this.#log.info(
      { event: 'deployment.create', deployment: deployment.id, node: deployment.node, action, who },
      'deployment created',
    );
    await this.#apply(changes);
    // the caller may deploy to this node: it sees what the deployment's outputs hold
    return deploymentView(deployment, config, await this.hiddenInputsOf(deployment), null);
  }

  /**
   * A PATCH: the given input values merged into the current ones (null removes a key), as a new
   * revision. Read, merge and write are one transaction, the deployment's row locked from the
   * read to the commit: two PATCHes at once (on one controller or two) each merge into the
   * other's result, and neither's keys are lost.
   */
  async updateDeployment(id: string, body: unknown, who: string): Promise<View> {
    const b = parseBody(deploymentPatchSchema, body ?? {});
    const action = checkRevisionAction(b.action);
    const {
      result: { deployment, config },
      changes,
    } = await this.store.transaction(async (tx) => {
      const d = await tx.deployment(id);
      if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
      const config = await tx.config(d.configId);
      if (!config) throw new HeraldError('internal', `deployment ${id} has no config ${d.configId}`);
      const inputValues =
        b.input_values === undefined
          ? undefined
          : coerceInputValues(config, mergeInputValues(d.current.inputValues, b.input_values));
      const patch = {
        revises: d.current.revision,
        ...(inputValues ? { inputValues } : {}),
        ...(action ? { action } : {}),
      };
      return { deployment: await tx.updateDeployment(id, patch, who), config };
    });
    this.#log.info(
      {
        event: 'deployment.update',
        deployment: id,
        node: deployment.node,
        revision: deployment.current.revision,
        action: deployment.current.action,
        who,
      },
      'deployment updated',
    );
    await this.#apply(changes);
    return deploymentView(deployment, config, await this.hiddenInputsOf(deployment), null);
  }

  /** Resolves with the deployment while its DELETE revision runs, or null when it was removed at once. */
  async deleteDeployment(id: string, who: string): Promise<View | null> {
    const { deployment, changes } = await this.store.deleteDeployment(id, who);
    this.#log.info(
      { event: 'deployment.delete', deployment: id, runs: deployment !== null, who },
      deployment ? 'deployment DELETE revision made' : 'deployment removed',
    );
    await this.#apply(changes);
    return deployment && this.#deploymentView(deployment, () => true);
  }

  async getDeployment(id: string, reveal?: RevealOutputs): Promise<View> {
    const d = await this.store.getDeployment(id);
    if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
    return this.#deploymentView(d, reveal);
  }

  /** `visible`: which nodes' deployments the reader may see (default all). */
  async listDeployments(
    node?: string,
    reveal?: RevealOutputs,
    visible: (node: string) => boolean = () => true,
  ): Promise<View[]> {
    const list = await this.store.listDeployments({ node });
    const views: View[] = [];
    for (const d of list) if (visible(d.node)) views.push(await this.#deploymentView(d, reveal));
    return views;
  }

  async listRevisions(id: string, reveal?: RevealOutputs): Promise<View[]> {
    const d = await this.store.getDeployment(id);
    if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
    const hidden = await this.hiddenInputsOf(d);
    const outputs = (await reveal?.(d.node)) ? null : hiddenOutputNames(await this.store.getConfig(d.configId));
    return (await this.store.listRevisions(id)).map((r) => revisionView(r, hidden, outputs));
  }

  /**
   * An agent's result for its deployment (node already checked against the caller). A result
   * that cannot change anything (a duplicate of the current revision's, a stale or unknown
   * revision, another node's deployment) is answered from one read, before any write or
   * group commit; the answer is a small summary, never the (up to 4 MiB) outputs echoed back.
   */
  async signal(node: string, deploymentId: string, body: unknown, who: string): Promise<View> {
    const b = parseBody(signalSchema, body);
    const known = await this.store.getDeployment(deploymentId);
    if (!known || known.node !== node)
      throw new HeraldError('not_found', `node ${node} has no deployment ${deploymentId}`);
    if (b.revision < known.current.revision)
      throw new HeraldError(
        'stale_revision',
        `revision ${b.revision} is older than the current ${known.current.revision}`,
        { field: 'revision' },
      );
    if (b.revision > known.current.revision)
      throw new HeraldError(
        'unknown_revision',
        `revision ${b.revision} is newer than the current ${known.current.revision}`,
        { field: 'revision' },
      );
    if (known.current.signalled) {
      this.#metrics?.signals.inc({ outcome: 'duplicate', status: known.current.status });
      return signalSummary(known);
    }
    const input = {
      revision: b.revision,
      deployStatusCode: b.deploy_status_code,
      deployStdout: b.deploy_stdout,
      deployStderr: b.deploy_stderr,
      outputs: b.outputs,
      statusReason: b.status_reason,
    };
    const { result: r, changes } = await this.#committer.run((tx) =>
      recordSignal(tx, this.clusters, node, deploymentId, input, who, this.#now()),
    );
    const status = r.deployment?.current.status ?? 'removed';
    this.#metrics?.signals.inc({ outcome: r.outcome, status });
    if (r.outcome === 'recorded')
      this.#log.info(
        { event: 'deployment.signal', deployment: deploymentId, node, revision: b.revision, status },
        'signal recorded',
      );
    await this.#apply(changes);
    if (!r.deployment) return { id: deploymentId, deployment_id: deploymentId, node, removed: true };
    return signalSummary(r.deployment);
  }

  /**
   * The controller sent `node` a wake-up within WAKE_FETCH_EXEMPT_MS: its fetch answers that
   * wake-up and is not rate-limited (docs/api.md). The limit bounds what an agent asks for itself.
   */
  wokeRecently(node: string): boolean {
    const at = this.#wokeAt.get(node);
    return at !== undefined && this.#now() - at < WAKE_FETCH_EXEMPT_MS;
  }

  /**
   * Spends one of what the controller asked `node` for (controller/service/wake-credits.ts): a signal of
   * work a wake-up gave it, or one of that work's last live output chunks. Such a request is not
   * rate-limited, so back-to-back changes to one node are not held back by their own results.
   * False when none is left: the request counts against the node's rate limit (what an agent
   * sends by itself).
   */
  takeWakeCredit(node: string, kind: WakeCreditKind): boolean {
    return this.#credits.take(node, kind);
  }

  #forgetOldWakes(now: number): void {
    for (const [node, at] of this.#wokeAt) {
      if (now - at < WAKE_FETCH_EXEMPT_MS) break;
      this.#wokeAt.delete(node);
    }
  }

  async #deploymentView(d: DeploymentRecord, reveal?: RevealOutputs): Promise<View> {
    const config = await this.store.getConfig(d.configId);
    const outputs = (await reveal?.(d.node)) ? null : hiddenOutputNames(config);
    return deploymentView(d, config, await this.hiddenInputsOf(d), outputs);
  }

  /**
   * Names of the inputs hidden for `d`: hidden by its own config or, for a cluster's deployment,
   * by any config of the cluster (a cluster hands every cluster input to each of its
   * deployments, so a value one config hides must be hidden wherever it goes). Every view,
   * event and the metadata's `hidden` flags come from here.
   */
  async hiddenInputsOf(d: DeploymentRecord): Promise<Set<string>> {
    const ids =
      d.clusterId === null ? [d.configId] : [d.configId, ...((await this.store.clusterConfigIds(d.clusterId)) ?? [])];
    const configs = [];
    for (const id of ids) configs.push(await this.store.getConfig(id));
    return hiddenNames(...configs);
  }

  // ---- metadata ----------------------------------------------------------------------------

  /**
   * The node's metadata at its current generation: the body only when the asker does not hold
   * that generation (`held`: the generations its `If-None-Match` names; a 304 needs the
   * generation alone, so a poll that finds nothing new builds nothing and the cache holds only
   * what was asked for lately, not a body per node). A body is built once per generation while
   * cached. One store read either way (on PostgreSQL one statement): it is told the generations
   * whose document is not needed (the asker's, and the one cached), and returns the deployments
   * only for another.
   * @throws HeraldError node_deleted | not_found
   */
  async metadata(node: string, held: KnownGenerations = []): Promise<MetadataAnswer> {
    const kept = this.#cache.newest(node);
    const known = kept === undefined || held === 'all' ? held : [...held, kept.generation];
    const read = await this.store.metadataSource(node, known);
    if (!read) {
      if (await this.store.isTombstoned(node)) throw new HeraldError('node_deleted', `node ${node} was deleted`);
      throw new HeraldError('not_found', `no node ${node}`);
    }
    const generation = read.node.generation;
    if (read.source !== null) return { generation, built: this.#build(read.source) };
    if (knows(held, generation)) return { generation, built: null };
    // the generation cached (a build of a newer one meanwhile may have replaced it there)
    return { generation, built: this.#cache.peek(node, generation) ?? kept! };
  }

  /** The node's document, built from one snapshot of its rows, and cached. */
  #build(src: MetadataSource): BuiltMetadata {
    // as hiddenInputsOf, from the configs the snapshot read with the deployments: one set per
    // cluster, joined with a deployment's own only when its own config hides any
    const byCluster = new Map<string, Set<string>>();
    const hidden = new Map<string, ReadonlySet<string>>();
    for (const e of src.entries) {
      const own = hiddenNames(e.config);
      let names: ReadonlySet<string> = own;
      if (e.cluster !== null) {
        let ofCluster = byCluster.get(e.cluster.id);
        if (ofCluster === undefined) {
          ofCluster = hiddenNames(...e.cluster.configs);
          byCluster.set(e.cluster.id, ofCluster);
        }
        names = own.size === 0 ? ofCluster : new Set([...ofCluster, ...own]);
      }
      hidden.set(e.deployment.id, names);
    }
    const json = encodeMetadataDocument(
      src,
      (nd, id) => this.signalUrl(nd, id),
      (d) => hidden.get(d.id)!,
    );
    return this.#cache.put(src.node.id, src.node.generation, json);
  }

  signalUrl(node: string, deploymentId: string): string {
    return `${this.#publicUrl}/v1/nodes/${encodeURIComponent(node)}/deployments/${encodeURIComponent(deploymentId)}/signal`;
  }

  /** The agent holds generation `gen` now (a 200 or 304 it was sent). */
  recordFetch(node: string, gen: number): void {
    this.#noteFetched(node, gen, true);
  }

  #noteFetched(node: string, gen: number, isFetch: boolean): void {
    if (isFetch) {
      const f = this.#fetches.get(node);
      if (f === undefined) this.#fetches.set(node, { gen, atMs: this.#now() });
      else {
        f.gen = gen;
        f.atMs = this.#now();
      }
    }
    const had = this.#pendingAcks.get(node);
    if (had === undefined || had < gen) this.#pendingAcks.set(node, gen);
  }

  /** Writes the acknowledged generations gathered since the last flush (one transaction). */
  async flushAcks(): Promise<void> {
    await this.#flushing; // (one flush at a time: a batch never overtakes the one before it)
    if (this.#pendingAcks.size === 0) return;
    const batch = this.#pendingAcks;
    this.#pendingAcks = new Map();
    this.#flushing = this.store.recordAcked(batch).finally(() => {
      this.#flushing = undefined;
    });
    await this.#flushing;
  }

  // ---- clusters ----------------------------------------------------------------------------

  /**
   * Creates a cluster; its nodes' wake-ups leave before the answer is built.
   * @param answer `minimal` (the client's `Prefer: return=minimal`): the cluster without its
   *   members, counted instead (ClusterSummaryView)
   * @returns the cluster as GET shows it, or its summary
   * @throws HeraldError invalid_request | unknown_config | unknown_node | cluster_busy
   */
  async createCluster(body: unknown, who: string, answer: 'full' | 'minimal' = 'full'): Promise<View> {
    const b = parseBody(clusterCreateSchema, body);
    if ((b.nodes === undefined) === (b.nodegroups === undefined))
      throw new HeraldError('invalid_request', 'give either nodes or nodegroups', { field: 'nodegroups' });
    if (b.nodes && new Set(b.nodes).size !== b.nodes.length)
      throw new HeraldError('invalid_request', 'a node is listed twice', { field: 'nodes' });
    const install = await this.store.getConfig(b.install_config_id);
    if (!install)
      throw new HeraldError('unknown_config', `no config ${b.install_config_id}`, { field: 'install_config_id' });
    const uninstall = await this.store.getConfig(b.uninstall_config_id);
    if (!uninstall)
      throw new HeraldError('unknown_config', `no config ${b.uninstall_config_id}`, { field: 'uninstall_config_id' });
    const values = b.input_values ?? {};
    const nodegroups = b.nodegroups
      ? await this.#resolveNodegroups(b.nodegroups, install, uninstall, values)
      : undefined;
    const nodes = nodegroups ? nodegroups.flatMap((g) => g.nodes) : b.nodes!;
    const installInputValues = coerceInputValues(install, values);
    // checked now, so a value the uninstall config refuses is refused at creation; a node's uninstall
    // deployment, made at its first uninstall, coerces the stored values again (controller/store/tx.ts)
    coerceInputValues(uninstall, values);
    const { result: cluster, changes } = await this.store.transaction((tx) =>
      this.clusters.create(
        tx,
        {
          name: b.name,
          nodes,
          ...(nodegroups ? { nodegroups } : {}),
          installConfigId: install.id,
          uninstallConfigId: uninstall.id,
          installInputValues,
          inputValues: values,
        },
        who,
        this.#now(),
      ),
    );
    // the wake-ups first, then the answer: built from the rows as the transaction wrote them, not
    // read back (on PostgreSQL that read queued behind the fetches its own wake-ups caused)
    await this.#apply(changes);
    this.#log.info(
      { event: 'cluster.create', cluster: cluster.id, nodes: cluster.nodes.length, who },
      'cluster created',
    );
    const view = answer === 'minimal' ? clusterSummaryView : clusterView;
    return view(cluster, install, uninstall, await this.#groupConfigs(cluster));
  }

  /**
   * The groups of a new cluster (docs/api.md): names unique, each node in one group only, each
   * group's configs and input values (the group's over the cluster's) resolved and checked.
   * @throws HeraldError invalid_request | unknown_config | bad_input_value (field `nodegroups.<i>...`)
   */
  async #resolveNodegroups(
    groups: NodegroupBody[],
    install: ConfigRecord,
    uninstall: ConfigRecord,
    values: Record<string, unknown>,
  ): Promise<NewNodegroup[]> {
    const names = new Set<string>();
    const seen = new Map<string, string>();
    const out: NewNodegroup[] = [];
    for (const [i, g] of groups.entries()) {
      if (names.has(g.name))
        throw new HeraldError('invalid_request', `node group ${g.name} is listed twice`, {
          field: `nodegroups.${i}.name`,
        });
      names.add(g.name);
      for (const [j, n] of g.nodes.entries()) {
        const other = seen.get(n);
        if (other !== undefined)
          throw new HeraldError('invalid_request', `node ${n} is in node groups ${other} and ${g.name}`, {
            field: `nodegroups.${i}.nodes.${j}`,
          });
        seen.set(n, g.name);
      }
      const config = async (cid: string | undefined, dflt: ConfigRecord, key: string): Promise<ConfigRecord> => {
        if (cid === undefined) return dflt;
        const c = await this.store.getConfig(cid);
        if (!c) throw new HeraldError('unknown_config', `no config ${cid}`, { field: `nodegroups.${i}.${key}` });
        return c;
      };
      const gi = await config(g.install_config_id, install, 'install_config_id');
      const gu = await config(g.uninstall_config_id, uninstall, 'uninstall_config_id');
      const merged = { ...values, ...(g.input_values ?? {}) };
      const installInputValues = coerceInputValues(gi, merged);
      coerceInputValues(gu, merged); // (checked now, as the cluster's are in createCluster)
      out.push({
        name: g.name,
        role: g.role,
        nodes: g.nodes,
        ownInstallConfigId: g.install_config_id ?? null,
        ownUninstallConfigId: g.uninstall_config_id ?? null,
        ownInputValues: g.input_values ?? null,
        installConfigId: gi.id,
        uninstallConfigId: gu.id,
        installInputValues,
      });
    }
    return out;
  }

  /**
   * Adds a node group to an idle cluster (docs/api.md); its nodes install at once.
   * @returns the group as GET shows it
   * @throws HeraldError invalid_request | not_found | restart_in_progress | unknown_node | cluster_busy | unknown_config
   */
  async addNodegroup(id: string, body: unknown, who: string): Promise<View> {
    const b = parseBody(nodegroupSchema, body);
    const c = await this.store.getCluster(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    const install = await this.store.getConfig(c.installConfigId);
    const uninstall = await this.store.getConfig(c.uninstallConfigId);
    if (!install || !uninstall) throw new HeraldError('internal', `cluster ${id} lost a config`);
    if (new Set(b.nodes).size !== b.nodes.length)
      throw new HeraldError('invalid_request', 'a node is listed twice', { field: 'nodes' });
    let g: NewNodegroup;
    try {
      g = (await this.#resolveNodegroups([b], install, uninstall, c.inputValues))[0]!;
    } catch (err) {
      // the body is one group, not a list: its fields are named without the `nodegroups.0.` prefix
      const field = (err as { field?: unknown }).field;
      if (err instanceof HeraldError && typeof field === 'string' && field.startsWith('nodegroups.0.'))
        throw new HeraldError(err.code, err.message, { field: field.slice('nodegroups.0.'.length) });
      throw err;
    }
    const { changes } = await this.store.transaction((tx) => this.clusters.addNodegroup(tx, id, g, who, this.#now()));
    this.#log.info({ event: 'cluster.nodegroup.add', cluster: id, nodegroup: g.name, who }, 'node group added');
    await this.#apply(changes);
    return this.getNodegroup(id, g.name);
  }

  /** One group of a cluster, as `GET /v1/clusters/{id}` shows it. @throws HeraldError not_found */
  async getNodegroup(id: string, name: string): Promise<View> {
    const view = (await this.getCluster(id)) as unknown as ClusterView;
    const g = view.nodegroups.find((x) => x.name === name);
    if (!g) throw new HeraldError('not_found', `cluster ${id} has no node group ${name}`);
    return g as unknown as View;
  }

  /**
   * Uninstalls a group's nodes, then removes it (docs/api.md).
   * @throws HeraldError not_found | restart_in_progress | invalid_request (the last group)
   */
  async deleteNodegroup(id: string, name: string, who: string): Promise<void> {
    const { changes } = await this.store.transaction((tx) =>
      this.clusters.deleteNodegroup(tx, id, name, who, this.#now()),
    );
    this.#log.info(
      { event: 'cluster.nodegroup.delete', cluster: id, nodegroup: name, who },
      'node group delete started',
    );
    await this.#apply(changes);
  }

  async #groupConfigs(c: ClusterRecord): Promise<Array<ConfigRecord | undefined>> {
    const out: Array<ConfigRecord | undefined> = [];
    for (const g of c.nodegroups) {
      if (g.installConfigId !== null) out.push(await this.store.getConfig(g.installConfigId));
      if (g.uninstallConfigId !== null) out.push(await this.store.getConfig(g.uninstallConfigId));
    }
    return out;
  }

  /**
   * Starts a restart (docs/api.md), of the whole cluster or of group `nodegroup`; a dry run
   * (`"dry_run": true`) changes nothing and returns the plan.
   * @returns the plan of a dry run, else null
   * @throws HeraldError invalid_request | not_found | restart_in_progress | unknown_nodegroup | unknown_config
   */
  async restartCluster(id: string, body: unknown, who: string, nodegroup?: string): Promise<View | null> {
    const b = parseBody(restartSchema, body ?? {});
    let groups = b.nodegroups ?? null;
    if (nodegroup !== undefined) {
      if (groups?.some((g) => g !== nodegroup))
        throw new HeraldError('invalid_request', `this route restarts node group ${nodegroup} only`, {
          field: 'nodegroups',
        });
      groups = [nodegroup];
    }
    const opts: RestartOptions = { ...rolloutOptions(b), nodegroups: groups };
    try {
      if (b.dry_run) {
        const { result } = await this.store.transaction((tx) => this.clusters.planRestart(tx, id, opts));
        return restartPlanView(id, result.rollout, result.nodes);
      }
      const { changes } = await this.store.transaction((tx) => this.clusters.restart(tx, id, opts, who, this.#now()));
      this.#log.info(
        {
          event: 'cluster.restart',
          cluster: id,
          max_unavailable: b.max_unavailable ?? 'default',
          nodegroups: groups,
          who,
        },
        'cluster restart started',
      );
      await this.#apply(changes);
      return null;
    } catch (err) {
      // a group named in the path that the cluster does not have: that route does not exist
      if (nodegroup !== undefined && codeOf(err) === 'unknown_nodegroup')
        throw new HeraldError('not_found', `cluster ${id} has no node group ${nodegroup}`);
      throw err;
    }
  }

  /**
   * Starts an upgrade (docs/api.md "Upgrades"): new configs or input values for the cluster, or
   * for its group `nodegroup`, rolled over the nodes they change; a dry run changes nothing and
   * returns the plan.
   * @returns the plan of a dry run, else the cluster
   * @throws HeraldError invalid_request | not_found | restart_in_progress | unknown_config |
   *   bad_input_value | no_change | no_stable_revision
   */
  async upgradeCluster(id: string, body: unknown, who: string, nodegroup?: string): Promise<View> {
    const b = parseBody(upgradeSchema, body ?? {});
    const change: ConfigChange = {};
    if (nodegroup !== undefined) change.nodegroup = nodegroup;
    if (b.install_config_id !== undefined) change.installConfigId = b.install_config_id;
    if (b.uninstall_config_id !== undefined) change.uninstallConfigId = b.uninstall_config_id;
    if (b.input_values !== undefined) change.inputValues = b.input_values;
    return this.#upgrade(id, change, rolloutOptions(b), b.dry_run === true, who);
  }

  /**
   * Starts an undo (docs/api.md "Revisions"): an upgrade to the configs and values of an earlier
   * revision (default: the last stable one before the cluster's), recorded as a new revision.
   * @throws HeraldError as upgradeCluster, and unknown_cluster_revision
   */
  async undoCluster(id: string, body: unknown, who: string): Promise<View> {
    const b = parseBody(undoSchema, body ?? {});
    const { result: undoTo } = await this.store.transaction((tx) => this.clusters.undoTarget(tx, id, b.revision));
    return this.#upgrade(id, { undoTo }, rolloutOptions(b), b.dry_run === true, who);
  }

  async #upgrade(
    id: string,
    change: ConfigChange & { undoTo?: number },
    opts: RestartOptions,
    dryRun: boolean,
    who: string,
  ): Promise<View> {
    if (dryRun) {
      const { result } = await this.store.transaction((tx) => this.clusters.planUpgrade(tx, id, change, opts));
      return upgradePlanView(id, result.rollout, result.nodes, result.newRevision);
    }
    const { result: revision, changes } = await this.store.transaction((tx) =>
      this.clusters.upgrade(tx, id, change, opts, who, this.#now()),
    );
    this.#log.info(
      {
        event: change.undoTo !== undefined ? 'cluster.undo' : 'cluster.upgrade',
        cluster: id,
        revision,
        nodegroup: change.nodegroup,
        who,
      },
      change.undoTo !== undefined ? 'cluster undo started' : 'cluster upgrade started',
    );
    await this.#apply(changes);
    return this.getCluster(id);
  }

  /**
   * Pauses, resumes, aborts or promotes the cluster's running restart or upgrade (docs/api.md
   * "Rollouts"), recorded in the audit with `who`.
   * @returns the cluster
   * @throws HeraldError not_found | no_operation | not_promotable
   */
  async controlRollout(id: string, what: RolloutControl, who: string): Promise<View> {
    const { changes } = await this.store.transaction((tx) => this.clusters.control(tx, id, what, who, this.#now()));
    this.#log.info({ event: `cluster.${what}`, cluster: id, who }, `cluster rollout ${what}`);
    await this.#apply(changes);
    return this.getCluster(id);
  }

  /** A cluster's revisions, oldest first, hidden values masked (docs/api.md "Revisions"). @throws HeraldError not_found */
  async listClusterRevisions(id: string): Promise<View[]> {
    const revs = await this.store.listClusterRevisions(id);
    const c = await this.store.getCluster(id);
    if (!revs || !c) throw new HeraldError('not_found', `no cluster ${id}`);
    const configs = await Promise.all(
      ((await this.store.clusterConfigIds(id)) ?? []).map((x) => this.store.getConfig(x)),
    );
    const hidden = hiddenNames(...configs);
    return revs.map((r) => clusterRevisionView(r, c.revision, hidden) as unknown as View);
  }

  async deleteCluster(id: string, who: string): Promise<void> {
    const { changes } = await this.store.transaction((tx) => this.clusters.delete(tx, id, who, this.#now()));
    this.#log.info({ event: 'cluster.delete', cluster: id, who }, 'cluster delete started');
    await this.#apply(changes);
  }

  async getCluster(id: string): Promise<View> {
    const c = await this.store.getCluster(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    const view = clusterView(
      c,
      await this.store.getConfig(c.installConfigId),
      await this.store.getConfig(c.uninstallConfigId),
      await this.#groupConfigs(c),
    );
    // each node's last live output line (docs/api.md)
    return this.output.withLastLines(view);
  }

  async listClusters(): Promise<View[]> {
    const views: View[] = [];
    for (const c of await this.store.listClusters())
      views.push(
        clusterView(
          c,
          await this.store.getConfig(c.installConfigId),
          await this.store.getConfig(c.uninstallConfigId),
          await this.#groupConfigs(c),
        ),
      );
    return views;
  }

  /**
   * Advances cluster operations (deadlines, windows) now; the timer calls it. A transaction
   * only when some operation is in flight; a tick still running is waited for, not doubled.
   * Never rejects (a failure is logged).
   */
  tick(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#ticking ??= this.#tick().finally(() => {
      this.#ticking = undefined;
    });
    return this.#ticking;
  }

  async #tick(): Promise<void> {
    // without standing nothing advances here (on PostgreSQL the store would refuse it anyway)
    if (this.#standing() !== undefined) return;
    try {
      if ((await this.store.activeClusterIds()).length === 0) return;
      const { result: gates, changes } = await this.store.transaction((tx) => this.clusters.tick(tx, this.#now()));
      await this.#apply(changes);
      for (const g of gates) this.#readGate(g);
      this.#tickFailing = false;
    } catch (err) {
      if (this.#standing() !== undefined) return; // lost meanwhile: the standing's own line says so
      // the database away (several controllers, docs/several-controllers.md) fails every tick: say it once
      if (codeOf(err) !== 'store_unavailable') this.#log.error({ err }, 'cluster tick failed');
      else if (!this.#tickFailing)
        this.#log.warn({ code: 'store_unavailable' }, 'cluster tick failed: the database is unreachable; retrying');
      this.#tickFailing = codeOf(err) === 'store_unavailable';
    }
  }

  /**
   * Reads a rollout's gate (docs/api.md `gate`) outside any transaction, then records its answer
   * in one (the rollout advances there); one read at a time per cluster. Never rejects.
   */
  #readGate(req: GateRequest): void {
    if (this.#closed || this.#gateReads.has(req.clusterId)) return;
    const run = (async () => {
      try {
        const v = await readGate(req.gate);
        this.#log.info(
          { event: 'cluster.gate', cluster: req.clusterId, verdict: v.verdict, detail: v.detail, error: v.error },
          `rollout gate says ${v.verdict}`,
        );
        if (this.#closed) return;
        const { changes } = await this.store.transaction((tx) =>
          this.clusters.recordGate(tx, req.clusterId, v, this.#now()),
        );
        await this.#apply(changes);
      } catch (err) {
        this.#log.warn({ err, cluster: req.clusterId }, 'could not record a rollout gate answer; asking again');
      } finally {
        this.#gateReads.delete(req.clusterId);
      }
    })();
    this.#gateReads.set(req.clusterId, run);
  }

  // ---- after each transaction --------------------------------------------------------------

  /**
   * Several controllers (docs/several-controllers.md): every change set, this controller's own included, comes
   * from the change feed in commit order (controller/fleet/change-feed.ts), so after a commit the service
   * only makes the feed catch up.
   */
  useChangeFeed(feed: { catchUp(): Promise<void> }): void {
    this.#feed = feed;
  }

  async #apply(c: ChangeSet): Promise<void> {
    if (this.#feed) await this.#feed.catchUp();
    else await this.applyChanges(c);
  }

  /** After a commit made outside the service (Heat's object store, service/heat.ts): wake-ups and events. */
  committed(c: ChangeSet): Promise<void> {
    return this.#apply(c);
  }

  /**
   * Wakes the nodes that got work (at once), then announces what changed. With a change feed
   * the change may be another controller's (`origin`: the controller whose transaction it was):
   * the push service (the fleet) also learns of new endpoints and removed nodes here, and passes
   * on only what concerns the nodes it owns or holds. What is read back from the store is only
   * what this controller acts on: a node's record for the push service only when its endpoint
   * changed without a new generation and the push service cares for it, the views for the event
   * stream only while someone listens, and a cluster's status (to log an operation's end) only
   * for its own change. A change to N nodes that another controller made and this one pushes
   * none of costs it no read at all.
   */
  async applyChanges(c: ChangeSet, origin?: string): Promise<void> {
    const own = origin === undefined || origin === this.#name;
    if (c.wakes.length > 0) {
      const now = this.#now();
      for (const w of c.wakes) {
        this.push.notify(w.node, w.generation, w.reason);
        // kept by every controller: the agent's fetch and signals may come to any of them
        this.#wokeAt.delete(w.node); // re-inserted last: the map stays in wake order
        this.#wokeAt.set(w.node, now);
        this.#credits.grant(w.node);
      }
      this.#forgetOldWakes(now);
    }
    const reads = this.#metrics?.changeReads;
    const listening = this.events.subscribers > 0;
    if (listening)
      for (const id of c.deployments) {
        const d = await this.store.getDeployment(id);
        reads?.inc({ for: 'events' });
        if (d) this.events.publish('deployment', await this.#deploymentView(d));
      }
    for (const id of c.removedDeployments) {
      const node = c.removedDeploymentNodes?.[id];
      this.events.publish('deployment', {
        id,
        deployment_id: id,
        ...(node !== undefined ? { node } : {}),
        deleted: true,
      });
    }
    if (this.#feed !== undefined) await this.#tellPush(c);
    if (listening)
      for (const id of c.nodes) {
        const n = await this.store.getNode(id);
        reads?.inc({ for: 'events' });
        if (n) this.events.publish('node', this.#nodeView(n, (await this.store.nodeLabels([id])).get(id) ?? {}));
      }
    for (const id of c.removedNodes) {
      this.#credits.forget(id);
      if (this.#feed) this.push.remove(id);
      this.events.publish('node', { id, deleted: true });
    }
    for (const id of c.clusters) {
      // every signal of a cluster step lands here: the whole view (all N nodes) is built only
      // for someone listening to the event stream, the status alone otherwise
      if (listening) {
        const cl = await this.store.getCluster(id);
        reads?.inc({ for: 'events' });
        if (cl)
          this.events.publish(
            'cluster',
            clusterView(
              cl,
              await this.store.getConfig(cl.installConfigId),
              await this.store.getConfig(cl.uninstallConfigId),
              await this.#groupConfigs(cl),
            ),
          );
      }
      // an operation's end is logged by the controller whose transaction ended it
      if (!own) continue;
      const st = await this.store.getClusterStatus(id);
      reads?.inc({ for: 'cluster' });
      if (st && !st.status.endsWith('_IN_PROGRESS'))
        this.#log.info(
          { event: 'cluster.status', cluster: id, status: st.status, reason: st.statusReason },
          'cluster operation finished',
        );
    }
    for (const id of c.removedClusters) {
      this.events.publish('cluster', { id, deleted: true });
      this.#log.info({ event: 'cluster.removed', cluster: id }, 'cluster removed');
    }
  }

  /**
   * Several controllers: the push service learns of each node created or whose endpoint changed,
   * when it cares (its own node, or one it has not seen). The change set carries the endpoint;
   * the generation is the change set's when the node was touched, else (an endpoint moved alone)
   * the node is read for it. A change set an older Herald logged carries no endpoints: each of
   * its nodes the push service cares for is read, as that Herald did.
   */
  async #tellPush(c: ChangeSet): Promise<void> {
    const cares = (id: string): boolean => this.#pushCares?.(id) ?? true;
    const reads = this.#metrics?.changeReads;
    if (c.endpoints === undefined) {
      for (const id of c.nodes) {
        if (!cares(id)) continue;
        const n = await this.store.getNode(id);
        reads?.inc({ for: 'push' });
        if (n) this.push.setEndpoint(n.id, n.endpoint, n.generation);
      }
      return;
    }
    if (c.endpoints.length === 0) return;
    const touched = c.generation === null ? null : new Set(c.touchedNodes);
    for (const [id, url] of c.endpoints) {
      if (!cares(id)) continue;
      let gen = touched?.has(id) ? c.generation : null;
      if (gen === null) {
        gen = (await this.store.getNode(id))?.generation ?? null;
        reads?.inc({ for: 'push' });
        if (gen === null) continue; // deleted since
      }
      this.push.setEndpoint(id, url, gen);
    }
  }
}

/** What a signal is answered with: where the deployment stands, without its outputs. */
function signalSummary(d: DeploymentRecord): View {
  const r = d.current;
  return {
    id: d.id,
    deployment_id: d.id,
    node: d.node,
    revision: r.revision,
    status: r.status,
    status_reason: r.statusReason,
    signalled: r.signalled,
  };
}

function fetchStateOf(f: { gen: number; atMs: number } | undefined): FetchState {
  return f === undefined
    ? { generation_fetched: null, last_fetch_at: null }
    : { generation_fetched: f.gen, last_fetch_at: new Date(f.atMs).toISOString() };
}

/**
 * A rollout's options from a request body (docs/api.md "Rollouts"), each absent one left to the
 * engine's default.
 * @throws HeraldError invalid_request (field `gate...`)
 */
function rolloutOptions(b: RolloutBody): RestartOptions {
  const o: RestartOptions = {
    maxUnavailable: b.max_unavailable ?? null,
    pauseS: b.pause_s ?? 0,
    maxFailures: b.max_failures ?? 0,
    healthConfigId: b.health_config_id ?? null,
  };
  if (b.canary !== undefined) o.canary = b.canary;
  if (b.auto_promote_s !== undefined) o.autoPromoteS = b.auto_promote_s;
  if (b.on_failure !== undefined) o.onFailure = b.on_failure;
  if (b.node_deadline_s !== undefined) o.nodeDeadlineS = b.node_deadline_s;
  if (b.progress_deadline_s !== undefined) o.progressDeadlineS = b.progress_deadline_s;
  if (b.gate !== undefined) o.gate = gateOf(b.gate);
  if (b.force === true) o.force = true;
  return o;
}

/** `gate`: a `url`, or a `prometheus` server with its `query`. @throws HeraldError invalid_request */
function gateOf(g: GateBody): RolloutGate {
  const failOpen = g.fail_open === true;
  if ((g.url === undefined) === (g.prometheus === undefined))
    throw new HeraldError('invalid_request', 'gate: give either url or prometheus', { field: 'gate' });
  if (g.url !== undefined) {
    if (g.query !== undefined)
      throw new HeraldError('invalid_request', 'gate.query: a query goes with prometheus', { field: 'gate.query' });
    return { kind: 'url', url: g.url, failOpen };
  }
  if (g.query === undefined)
    throw new HeraldError('invalid_request', 'gate.query: prometheus needs a query', { field: 'gate.query' });
  return { kind: 'prometheus', url: g.prometheus!, query: g.query, failOpen };
}
