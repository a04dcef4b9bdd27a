/**
 * `Store` on SQLite (better-sqlite3): WAL with `synchronous=FULL`, so a change the API has
 * acknowledged survives a crash or power loss; schema migrations versioned in code; statements
 * prepared once. Synchronous by design: a transaction never interleaves with another request.
 */
import { randomUUID } from 'node:crypto';
import { closeSync, constants, existsSync, mkdirSync, openSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { ConfigError, HeraldError } from '../protocol/errors.js';
import type { DeployAction } from '../protocol/heat.js';
import { HOOK_TIMEOUT_S, RESTART_STEP_MARGIN_S } from '../protocol/limits.js';
import type { WakeReason } from '../protocol/wake.js';
import { planCluster, type PlanNode } from './cluster-machine.js';
import {
  emptyChanges,
  type AnnounceResult,
  type AuditRecord,
  type ChangeSet,
  type ClusterNodePhase,
  type ClusterNodeRecord,
  type ClusterOperation,
  type ClusterRecord,
  type ClusterRole,
  type ClusterStatus,
  type ConfigRecord,
  type DeploymentPatch,
  type DeploymentRecord,
  type DeploymentStatus,
  type MetadataSource,
  type NewCluster,
  type NewConfig,
  type NewDeployment,
  type NodeRecord,
  type RevisionRecord,
  type SignalInput,
  type Store,
} from './store.js';

interface Migration {
  version: number;
  name: string;
  sql: string;
}

/** Applied in order, each in its own transaction; never edit one that has shipped. */
const MIGRATIONS: Migration[] = [
  {
    version: 1,
    name: 'initial',
    sql: `
      CREATE TABLE sequence (name TEXT PRIMARY KEY, value INTEGER NOT NULL) STRICT;
      INSERT INTO sequence (name, value) VALUES ('generation', 0);
      CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        endpoint TEXT,
        generation INTEGER NOT NULL,
        acked_generation INTEGER,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE TABLE node_tombstones (
        id TEXT PRIMARY KEY,
        deleted_at TEXT NOT NULL,
        deleted_by TEXT NOT NULL
      ) STRICT;
      CREATE TABLE configs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        grp TEXT NOT NULL,
        config TEXT NOT NULL,
        inputs TEXT NOT NULL,
        outputs TEXT NOT NULL,
        options TEXT NOT NULL,
        created_at TEXT NOT NULL
      ) STRICT;
      CREATE TABLE deployments (
        id TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        config_id TEXT NOT NULL,
        name TEXT,
        actions TEXT NOT NULL,
        revision INTEGER NOT NULL,
        cluster_id TEXT,
        cluster_role TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX deployments_by_node ON deployments (node);
      CREATE TABLE revisions (
        deployment_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        item_id TEXT NOT NULL UNIQUE,
        action TEXT NOT NULL,
        input_values TEXT NOT NULL,
        status TEXT NOT NULL,
        status_reason TEXT NOT NULL,
        output_values TEXT,
        signalled INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        signalled_at TEXT,
        PRIMARY KEY (deployment_id, revision)
      ) STRICT;
      CREATE TABLE clusters (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        status_reason TEXT NOT NULL,
        install_config_id TEXT NOT NULL,
        uninstall_config_id TEXT NOT NULL,
        input_values TEXT NOT NULL,
        operation TEXT NOT NULL,
        max_unavailable INTEGER NOT NULL,
        op_started_at TEXT,
        op_finished_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE TABLE cluster_nodes (
        cluster_id TEXT NOT NULL,
        node TEXT NOT NULL,
        position INTEGER NOT NULL,
        phase TEXT NOT NULL,
        install_deployment_id TEXT NOT NULL,
        uninstall_deployment_id TEXT NOT NULL,
        step_deadline_ms INTEGER,
        uninstall_started_at TEXT,
        uninstall_finished_at TEXT,
        install_started_at TEXT,
        install_finished_at TEXT,
        reason TEXT,
        PRIMARY KEY (cluster_id, node)
      ) STRICT;
      CREATE INDEX cluster_nodes_by_node ON cluster_nodes (node);
      CREATE TABLE audit (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        who TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT
      ) STRICT;
    `,
  },
  {
    version: 2,
    name: 'cluster_nodes_phase_indexes',
    // what #glance reads on every signal of a cluster step: an index seek per question, not every
    // node's row of the cluster (all the primary key's index would give); and a restart window's
    // next pending nodes in position order without sorting all of them
    sql: `
      CREATE INDEX cluster_nodes_by_deadline ON cluster_nodes (cluster_id, phase, step_deadline_ms);
      CREATE INDEX cluster_nodes_by_position ON cluster_nodes (cluster_id, phase, position);
    `,
  },
];

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

const IN_PROGRESS_REASON = 'Deploy data available';
const CLUSTER_INSTALL_ACTIONS: DeployAction[] = ['CREATE', 'UPDATE', 'RESTART'];
const CLUSTER_UNINSTALL_ACTIONS: DeployAction[] = ['RESTART', 'DELETE'];
/**
 * Safety stop for the plan/apply loop of one cluster in one transaction. Each round applies a
 * whole plan, so at most three rounds act whatever the cluster's size (window starts; the
 * timeouts of steps started with no budget left; finish), and a fourth finds nothing to do.
 */
const MAX_PLAN_ROUNDS = 8;

interface NodeRow {
  id: string;
  endpoint: string | null;
  generation: number;
  acked_generation: number | null;
  created_at: string;
  updated_at: string;
}
interface ConfigRow {
  id: string;
  name: string;
  grp: string;
  config: string;
  inputs: string;
  outputs: string;
  options: string;
  created_at: string;
}
interface DeploymentRow {
  id: string;
  node: string;
  config_id: string;
  name: string | null;
  actions: string;
  cluster_id: string | null;
  cluster_role: string | null;
  d_created_at: string;
  d_updated_at: string;
  revision: number;
  item_id: string;
  action: string;
  input_values: string;
  status: string;
  status_reason: string;
  output_values: string | null;
  signalled: number;
  r_created_at: string;
  r_updated_at: string;
  signalled_at: string | null;
}
type RevisionRow = Omit<DeploymentRow, 'id' | 'node' | 'config_id' | 'name' | 'actions' | 'cluster_id' | 'cluster_role' | 'd_created_at' | 'd_updated_at'>;
interface ClusterRow {
  id: string;
  name: string;
  status: string;
  status_reason: string;
  install_config_id: string;
  uninstall_config_id: string;
  input_values: string;
  operation: string;
  max_unavailable: number;
  op_started_at: string | null;
  op_finished_at: string | null;
  created_at: string;
  updated_at: string;
}
interface ClusterNodeRow {
  cluster_id: string;
  node: string;
  position: number;
  phase: string;
  install_deployment_id: string;
  uninstall_deployment_id: string;
  step_deadline_ms: number | null;
  uninstall_started_at: string | null;
  uninstall_finished_at: string | null;
  install_started_at: string | null;
  install_finished_at: string | null;
  reason: string | null;
}

const DEPLOYMENT_SELECT = `
  SELECT d.id, d.node, d.config_id, d.name, d.actions, d.cluster_id, d.cluster_role,
         d.created_at AS d_created_at, d.updated_at AS d_updated_at,
         r.revision, r.item_id, r.action, r.input_values, r.status, r.status_reason, r.output_values,
         r.signalled, r.created_at AS r_created_at, r.updated_at AS r_updated_at, r.signalled_at
  FROM deployments d JOIN revisions r ON r.deployment_id = d.id AND r.revision = d.revision`;

/** What starting or failing a node's step needs of its cluster. */
type StepCluster = Pick<ClusterRecord, 'id' | 'operation'>;

/** The state of one transaction: which nodes' metadata changed, and what to announce. */
class Tx {
  readonly touched = new Map<string, WakeReason | null>();
  readonly changes: ChangeSet = emptyChanges();
  readonly removedNodes = new Set<string>();
  /** Membership of each list, so add() stays O(1): a 10,000-node cluster adds 20,000 ids. */
  readonly #seen = new Map<string, Set<string>>();

  /** The node's metadata changed; `reason` when it also has work (a wake-up). */
  touch(node: string, reason: WakeReason | null = null): void {
    const had = this.touched.get(node);
    this.touched.set(node, had ?? reason);
  }

  add(list: keyof Omit<ChangeSet, 'generation' | 'touchedNodes' | 'wakes'>, id: string): void {
    const l = this.changes[list];
    let seen = this.#seen.get(list);
    if (seen === undefined || seen.size !== l.length) {
      // (re)built when the list was changed behind our back (a splice elsewhere in the store)
      seen = new Set(l);
      this.#seen.set(list, seen);
    }
    if (!seen.has(id)) {
      seen.add(id);
      l.push(id);
    }
  }
}

export interface SqliteStoreOptions {
  /** Clock for timestamps and step deadlines (epoch ms). Default Date.now. */
  now?: () => number;
  /** Added to a cluster step's hook timeout to make its deadline. Default RESTART_STEP_MARGIN_S. */
  stepMarginS?: number;
}

export class SqliteStore implements Store {
  readonly #db: Database.Database;
  readonly #now: () => number;
  readonly #marginS: number;
  readonly #configCache = new Map<string, ConfigRecord>();
  readonly #s: ReturnType<SqliteStore['prepare']>;
  #closed = false;

  /**
   * Opens (creating if needed) the database at `path` (`:memory:` for tests) and migrates it.
   * @throws ConfigError `bad_option` when the file cannot be opened or was written by a newer
   *   Herald (unknown schema version)
   */
  constructor(path: string, opts: SqliteStoreOptions = {}) {
    this.#now = opts.now ?? Date.now;
    this.#marginS = opts.stepMarginS ?? RESTART_STEP_MARGIN_S;
    try {
      if (path !== ':memory:' && path !== '') createPrivateFile(path);
      this.#db = new Database(path);
    } catch (err) {
      throw new ConfigError(`--db ${path}: cannot open the database: ${(err as Error).message}`, { cause: err });
    }
    try {
      this.#db.pragma('journal_mode = WAL');
      this.#db.pragma('synchronous = FULL');
      this.#db.pragma('foreign_keys = OFF');
      this.#db.pragma('busy_timeout = 5000');
      this.#migrate(path);
      this.#s = this.prepare();
    } catch (err) {
      this.#db.close();
      throw err;
    }
  }

  #migrate(path: string): void {
    this.#db.exec('CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT');
    const row = this.#db.prepare('SELECT MAX(version) AS v FROM schema_migrations').get() as { v: number | null };
    const current = row.v ?? 0;
    if (current > SCHEMA_VERSION) {
      throw new ConfigError(`--db ${path}: schema version ${current} is newer than this Herald knows (${SCHEMA_VERSION}); use a newer Herald`);
    }
    for (const m of MIGRATIONS) {
      if (m.version <= current) continue;
      this.#db.transaction(() => {
        this.#db.exec(m.sql);
        this.#db.prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)').run(m.version, m.name, this.#iso());
      })();
    }
  }

  /** All statements, prepared once. */
  private prepare() {
    const p = (sql: string) => this.#db.prepare(sql);
    return {
      seqGet: p(`SELECT value FROM sequence WHERE name = 'generation'`),
      seqBump: p(`UPDATE sequence SET value = value + 1 WHERE name = 'generation' RETURNING value`),
      nodeInsert: p('INSERT INTO nodes (id, endpoint, generation, acked_generation, created_at, updated_at) VALUES (?, ?, 0, NULL, ?, ?)'),
      nodeGet: p('SELECT * FROM nodes WHERE id = ?'),
      nodeList: p('SELECT * FROM nodes ORDER BY id'),
      nodeSetEndpoint: p('UPDATE nodes SET endpoint = ?, updated_at = ? WHERE id = ?'),
      nodeSetGen: p('UPDATE nodes SET generation = ? WHERE id = ?'),
      nodeAck: p('UPDATE nodes SET acked_generation = ? WHERE id = ? AND (acked_generation IS NULL OR acked_generation < ?)'),
      nodeDelete: p('DELETE FROM nodes WHERE id = ?'),
      tombInsert: p('INSERT OR REPLACE INTO node_tombstones (id, deleted_at, deleted_by) VALUES (?, ?, ?)'),
      tombGet: p('SELECT id FROM node_tombstones WHERE id = ?'),
      tombDelete: p('DELETE FROM node_tombstones WHERE id = ?'),
      configInsert: p('INSERT INTO configs (id, name, grp, config, inputs, outputs, options, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)'),
      configGet: p('SELECT * FROM configs WHERE id = ?'),
      configList: p('SELECT * FROM configs ORDER BY created_at, id'),
      depInsert: p('INSERT INTO deployments (id, node, config_id, name, actions, revision, cluster_id, cluster_role, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)'),
      depGet: p(`${DEPLOYMENT_SELECT} WHERE d.id = ?`),
      depList: p(`${DEPLOYMENT_SELECT} ORDER BY d.created_at, d.id`),
      depByNode: p(`${DEPLOYMENT_SELECT} WHERE d.node = ? ORDER BY d.created_at, d.id`),
      depIdsByNode: p('SELECT id FROM deployments WHERE node = ?'),
      depIdsByCluster: p('SELECT id, node FROM deployments WHERE cluster_id = ?'),
      depSetRevision: p('UPDATE deployments SET revision = ?, updated_at = ? WHERE id = ?'),
      depDelete: p('DELETE FROM deployments WHERE id = ?'),
      revInsert: p(`INSERT INTO revisions (deployment_id, revision, item_id, action, input_values, status, status_reason, output_values, signalled, created_at, updated_at, signalled_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)`),
      revResult: p(`UPDATE revisions SET status = ?, status_reason = ?, output_values = ?, signalled = 1, signalled_at = ?, updated_at = ?
                    WHERE deployment_id = ? AND revision = ?`),
      revList: p(`SELECT revision, item_id, action, input_values, status, status_reason, output_values, signalled,
                         created_at AS r_created_at, updated_at AS r_updated_at, signalled_at
                  FROM revisions WHERE deployment_id = ? ORDER BY revision`),
      revDelete: p('DELETE FROM revisions WHERE deployment_id = ?'),
      clusterInsert: p(`INSERT INTO clusters (id, name, status, status_reason, install_config_id, uninstall_config_id, input_values, operation, max_unavailable, op_started_at, op_finished_at, created_at, updated_at)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)`),
      clusterGet: p('SELECT * FROM clusters WHERE id = ?'),
      clusterList: p('SELECT * FROM clusters ORDER BY created_at, id'),
      clusterActive: p(`SELECT id FROM clusters WHERE status LIKE '%_IN_PROGRESS' ORDER BY created_at, id`),
      clusterName: p('SELECT name FROM clusters WHERE id = ?'),
      clusterStatus: p('SELECT status, status_reason FROM clusters WHERE id = ?'),
      clusterConfigIds: p('SELECT install_config_id, uninstall_config_id FROM clusters WHERE id = ?'),
      clusterStart: p('UPDATE clusters SET status = ?, status_reason = ?, operation = ?, max_unavailable = ?, op_started_at = ?, op_finished_at = NULL, updated_at = ? WHERE id = ?'),
      clusterFinish: p('UPDATE clusters SET status = ?, status_reason = ?, op_finished_at = ?, updated_at = ? WHERE id = ?'),
      clusterDelete: p('DELETE FROM clusters WHERE id = ?'),
      cnInsert: p(`INSERT INTO cluster_nodes (cluster_id, node, position, phase, install_deployment_id, uninstall_deployment_id, step_deadline_ms, install_started_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      cnList: p('SELECT * FROM cluster_nodes WHERE cluster_id = ? ORDER BY position'),
      cnByNode: p('SELECT cluster_id FROM cluster_nodes WHERE node = ? LIMIT 1'),
      cnGet: p('SELECT * FROM cluster_nodes WHERE cluster_id = ? AND node = ?'),
      // #glance: each sub-query is one seek in an index on (cluster_id, phase, ...) (MIN and EXISTS
      // stop at the first entry), so its cost does not grow with the cluster's size
      cnGlance: p(`SELECT
          (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = @id AND phase = 'uninstalling') AS due_uninstall,
          (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = @id AND phase = 'installing') AS due_install,
          EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase IN ('uninstalling', 'installing')) AS in_flight,
          EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase = 'pending') AS pending,
          EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase = 'failed') AS failed`),
      // nodes in flight, counted only up to the window: all #glance needs is the room left in it
      cnInFlightCount: p(`SELECT COUNT(*) AS n FROM (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase IN ('uninstalling', 'installing') LIMIT @window)`),
      cnInFlight: p(`SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase IN ('uninstalling', 'installing')`),
      cnFirstPending: p(`SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase = 'pending' ORDER BY position LIMIT ?`),
      cnByDeployment: p(`SELECT * FROM cluster_nodes WHERE install_deployment_id = ? OR uninstall_deployment_id = ?`),
      cnReset: p(`UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                  install_started_at = NULL, install_finished_at = NULL, reason = NULL WHERE cluster_id = ?`),
      cnStartUninstall: p(`UPDATE cluster_nodes SET phase = 'uninstalling', step_deadline_ms = ?, uninstall_started_at = ?, uninstall_finished_at = NULL,
                           install_started_at = NULL, install_finished_at = NULL, reason = NULL WHERE cluster_id = ? AND node = ?`),
      cnStartInstall: p(`UPDATE cluster_nodes SET phase = 'installing', step_deadline_ms = ?, install_started_at = ?, install_finished_at = NULL, reason = NULL
                         WHERE cluster_id = ? AND node = ?`),
      cnUninstallDone: p(`UPDATE cluster_nodes SET uninstall_finished_at = ? WHERE cluster_id = ? AND node = ?`),
      cnComplete: p(`UPDATE cluster_nodes SET phase = 'complete', step_deadline_ms = NULL, install_finished_at = COALESCE(?, install_finished_at) WHERE cluster_id = ? AND node = ?`),
      cnFailUninstall: p(`UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, uninstall_finished_at = ?, reason = ? WHERE cluster_id = ? AND node = ?`),
      cnFailInstall: p(`UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, install_finished_at = ?, reason = ? WHERE cluster_id = ? AND node = ?`),
      cnDelete: p('DELETE FROM cluster_nodes WHERE cluster_id = ?'),
      auditInsert: p('INSERT INTO audit (at, who, action, target, detail) VALUES (?, ?, ?, ?, ?)'),
      auditList: p('SELECT * FROM audit ORDER BY seq DESC LIMIT ?'),
    };
  }

  // ---- transactions ------------------------------------------------------------------------

  #iso(ms = this.#now()): string {
    return new Date(ms).toISOString();
  }

  /** Runs `fn` in one IMMEDIATE transaction, then bumps the sequence once for the nodes it touched. */
  #tx<T>(fn: (tx: Tx) => T): { result: T; changes: ChangeSet } {
    this.#assertOpen();
    const run = this.#db.transaction(() => {
      const tx = new Tx();
      const result = fn(tx);
      if (tx.touched.size > 0) {
        const gen = (this.#s.seqBump.get() as { value: number }).value;
        tx.changes.generation = gen;
        for (const [node, reason] of tx.touched) {
          tx.changes.touchedNodes.push(node);
          if (tx.removedNodes.has(node)) continue;
          this.#s.nodeSetGen.run(gen, node);
          if (reason !== null) tx.changes.wakes.push({ node, generation: gen, reason });
          tx.add('nodes', node);
        }
      }
      return { result, changes: tx.changes };
    });
    return run.immediate();
  }

  #audit(who: string, action: string, target: string, detail: Record<string, unknown> | null = null): void {
    this.#s.auditInsert.run(this.#iso(), who, action, target, detail === null ? null : JSON.stringify(detail));
  }

  #assertOpen(): void {
    if (this.#closed) throw new HeraldError('internal', 'the store is closed');
  }

  // ---- nodes -------------------------------------------------------------------------------

  generation(): number {
    return (this.#s.seqGet.get() as { value: number }).value;
  }

  createNode(id: string, endpoint: string | null, who: string): { node: NodeRecord; changes: ChangeSet } {
    const { changes } = this.#tx((tx) => {
      if (this.#s.nodeGet.get(id)) throw new HeraldError('node_exists', `node ${id} exists already`, { field: 'id' });
      const now = this.#iso();
      this.#s.tombDelete.run(id);
      this.#s.nodeInsert.run(id, endpoint, now, now);
      tx.touch(id);
      this.#audit(who, 'node.create', id, endpoint === null ? null : { endpoint });
    });
    return { node: this.getNode(id)!, changes };
  }

  announceEndpoint(id: string, url: string, who: string, autoRegister: boolean): AnnounceResult {
    let created = false;
    let changed = false;
    const { changes } = this.#tx((tx) => {
      const row = this.#s.nodeGet.get(id) as NodeRow | undefined;
      const now = this.#iso();
      if (row === undefined) {
        if (this.#s.tombGet.get(id)) throw new HeraldError('node_deleted', `node ${id} was deleted; an operator must add it again`);
        if (!autoRegister) throw new HeraldError('not_found', `node ${id} is not registered (the controller runs with --no-auto-register)`);
        this.#s.nodeInsert.run(id, url, now, now);
        tx.touch(id);
        this.#audit(who, 'node.register', id, { endpoint: url });
        created = true;
        changed = true;
      } else if (row.endpoint !== url) {
        this.#s.nodeSetEndpoint.run(url, now, id);
        tx.add('nodes', id);
        this.#audit(who, 'node.endpoint', id, { endpoint: url });
        changed = true;
      }
    });
    return { node: this.getNode(id)!, created, changed, changes };
  }

  getNode(id: string): NodeRecord | undefined {
    const r = this.#s.nodeGet.get(id) as NodeRow | undefined;
    return r && nodeOf(r);
  }

  isTombstoned(id: string): boolean {
    return this.#s.tombGet.get(id) !== undefined;
  }

  listNodes(): NodeRecord[] {
    return (this.#s.nodeList.all() as NodeRow[]).map(nodeOf);
  }

  deleteNode(id: string, who: string): ChangeSet {
    return this.#tx((tx) => {
      if (!this.#s.nodeGet.get(id)) throw new HeraldError('not_found', `no node ${id}`);
      const cluster = this.#s.cnByNode.get(id) as { cluster_id: string } | undefined;
      if (cluster) throw new HeraldError('node_in_cluster', `node ${id} belongs to cluster ${cluster.cluster_id}`);
      for (const { id: dep } of this.#s.depIdsByNode.all(id) as Array<{ id: string }>) this.#removeDeployment(tx, dep);
      this.#s.nodeDelete.run(id);
      this.#s.tombInsert.run(id, this.#iso(), who);
      tx.touch(id);
      tx.removedNodes.add(id);
      tx.add('removedNodes', id);
      this.#audit(who, 'node.delete', id);
    }).changes;
  }

  recordAcked(acks: ReadonlyMap<string, number>): void {
    if (acks.size === 0) return;
    this.#assertOpen();
    this.#db.transaction(() => {
      for (const [node, gen] of acks) this.#s.nodeAck.run(gen, node, gen);
    })();
  }

  // ---- configs -----------------------------------------------------------------------------

  createConfig(c: NewConfig, who: string): ConfigRecord {
    const id = randomUUID();
    this.#tx(() => {
      this.#s.configInsert.run(id, c.name, c.group, JSON.stringify(c.config), JSON.stringify(c.inputs), JSON.stringify(c.outputs), JSON.stringify(c.options), this.#iso());
      this.#audit(who, 'config.create', id, { name: c.name, group: c.group });
    });
    return this.getConfig(id)!;
  }

  getConfig(id: string): ConfigRecord | undefined {
    const cached = this.#configCache.get(id);
    if (cached) return cached;
    const r = this.#s.configGet.get(id) as ConfigRow | undefined;
    if (!r) return undefined;
    const c = configOf(r);
    this.#configCache.set(id, c); // configs are immutable
    return c;
  }

  listConfigs(): ConfigRecord[] {
    return (this.#s.configList.all() as ConfigRow[]).map(configOf);
  }

  // ---- deployments -------------------------------------------------------------------------

  createDeployment(d: NewDeployment, who: string): { deployment: DeploymentRecord; changes: ChangeSet } {
    const id = randomUUID();
    const { changes } = this.#tx((tx) => {
      this.#insertDeployment(tx, id, d, null, null);
      this.#audit(who, 'deployment.create', id, { node: d.node, config_id: d.configId, action: d.action });
    });
    return { deployment: this.getDeployment(id)!, changes };
  }

  #insertDeployment(tx: Tx, id: string, d: NewDeployment, clusterId: string | null, role: ClusterRole | null, reason: WakeReason = 'deployment'): void {
    if (!this.#s.nodeGet.get(d.node)) throw new HeraldError('unknown_node', `no node ${d.node}`, { field: 'node' });
    if (!this.getConfig(d.configId)) throw new HeraldError('unknown_config', `no config ${d.configId}`, { field: 'config_id' });
    const now = this.#iso();
    this.#s.depInsert.run(id, d.node, d.configId, d.name, JSON.stringify(d.actions), clusterId, role, now, now);
    tx.add('deployments', id);
    this.#newRevision(tx, id, d.node, d.actions, 0, d.action, d.inputValues, reason);
  }

  /** Adds revision `prev + 1` and makes it current. A revision whose action is not listed completes at once. */
  #newRevision(tx: Tx, id: string, node: string, actions: DeployAction[], prev: number, action: DeployAction, inputValues: Record<string, unknown>, reason: WakeReason): boolean {
    const now = this.#iso();
    const revision = prev + 1;
    const triggered = actions.includes(action);
    const status: DeploymentStatus = triggered ? 'IN_PROGRESS' : 'COMPLETE';
    const why = triggered ? IN_PROGRESS_REASON : `not triggered: action ${action} is not in actions (${actions.join(', ')})`;
    this.#s.revInsert.run(id, revision, randomUUID(), action, JSON.stringify(inputValues), status, why, triggered ? 0 : 1, now, now, triggered ? null : now);
    this.#s.depSetRevision.run(revision, now, id);
    tx.touch(node, triggered ? reason : null);
    tx.add('deployments', id);
    return triggered;
  }

  updateDeployment(id: string, p: DeploymentPatch, who: string): { deployment: DeploymentRecord; changes: ChangeSet } {
    const { changes } = this.#tx((tx) => {
      const d = this.#mustDeployment(id);
      if (d.clusterId !== null) throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
      if (d.current.action === 'DELETE') throw new HeraldError('deployment_deleting', `deployment ${id} is being deleted`);
      const action = p.action ?? 'UPDATE';
      this.#newRevision(tx, id, d.node, d.actions, d.current.revision, action, p.inputValues ?? d.current.inputValues, 'deployment');
      this.#audit(who, 'deployment.update', id, { revision: d.current.revision + 1, action });
    });
    return { deployment: this.getDeployment(id)!, changes };
  }

  deleteDeployment(id: string, who: string): { deployment: DeploymentRecord | null; changes: ChangeSet } {
    let removed = false;
    const { changes } = this.#tx((tx) => {
      const d = this.#mustDeployment(id);
      if (d.clusterId !== null) throw new HeraldError('deployment_busy', `deployment ${id} belongs to cluster ${d.clusterId}`);
      if (d.current.action === 'DELETE' && !d.current.signalled) return; // its DELETE runs already
      if (d.actions.includes('DELETE')) {
        this.#newRevision(tx, id, d.node, d.actions, d.current.revision, 'DELETE', d.current.inputValues, 'deployment');
        this.#audit(who, 'deployment.delete', id, { revision: d.current.revision + 1, runs: true });
      } else {
        this.#removeDeployment(tx, id);
        this.#audit(who, 'deployment.delete', id, { runs: false });
        removed = true;
      }
    });
    return { deployment: removed ? null : (this.getDeployment(id) ?? null), changes };
  }

  #removeDeployment(tx: Tx, id: string): void {
    const d = this.getDeployment(id);
    if (!d) return;
    this.#s.revDelete.run(id);
    this.#s.depDelete.run(id);
    tx.touch(d.node);
    tx.add('removedDeployments', id);
    const i = tx.changes.deployments.indexOf(id);
    if (i >= 0) tx.changes.deployments.splice(i, 1);
  }

  #mustDeployment(id: string): DeploymentRecord {
    const d = this.getDeployment(id);
    if (!d) throw new HeraldError('not_found', `no deployment ${id}`);
    return d;
  }

  getDeployment(id: string): DeploymentRecord | undefined {
    const r = this.#s.depGet.get(id) as DeploymentRow | undefined;
    return r && deploymentOf(r);
  }

  listDeployments(filter: { node?: string | undefined } = {}): DeploymentRecord[] {
    const rows = (filter.node === undefined ? this.#s.depList.all() : this.#s.depByNode.all(filter.node)) as DeploymentRow[];
    return rows.map(deploymentOf);
  }

  listRevisions(id: string): RevisionRecord[] {
    return (this.#s.revList.all(id) as RevisionRow[]).map(revisionOf);
  }

  recordSignal(node: string, deploymentId: string, s: SignalInput, who: string, nowMs = this.#now()): {
    outcome: 'recorded' | 'duplicate';
    deployment: DeploymentRecord | null;
    changes: ChangeSet;
  } {
    let outcome: 'recorded' | 'duplicate' = 'duplicate';
    let removed = false;
    const { changes } = this.#tx((tx) => {
      const d = this.getDeployment(deploymentId);
      if (!d || d.node !== node) throw new HeraldError('not_found', `node ${node} has no deployment ${deploymentId}`);
      if (s.revision < d.current.revision) throw new HeraldError('stale_revision', `revision ${s.revision} is older than the current ${d.current.revision}`, { field: 'revision' });
      if (s.revision > d.current.revision) throw new HeraldError('unknown_revision', `revision ${s.revision} is newer than the current ${d.current.revision}`, { field: 'revision' });
      if (d.current.signalled) return;
      outcome = 'recorded';
      const config = this.getConfig(d.configId)!;
      const result = heatResult(config, s);
      this.#setResult(tx, d, result.status, result.statusReason, result.outputValues, nowMs);
      this.#audit(who, 'deployment.signal', deploymentId, { revision: s.revision, status: result.status });
      if (d.current.action === 'DELETE' && d.clusterId === null) {
        this.#removeDeployment(tx, deploymentId);
        removed = true;
      }
      if (d.clusterId !== null) this.#onClusterStepResult(tx, d.clusterId, d.node, deploymentId, result.status === 'COMPLETE', result.statusReason, nowMs);
    });
    return { outcome, deployment: removed ? null : (this.getDeployment(deploymentId) ?? null), changes };
  }

  #setResult(tx: Tx, d: DeploymentRecord, status: DeploymentStatus, reason: string, outputValues: Record<string, unknown> | null, nowMs: number): void {
    const at = this.#iso(nowMs);
    this.#s.revResult.run(status, reason, outputValues === null ? null : JSON.stringify(outputValues), at, at, d.id, d.current.revision);
    tx.touch(d.node); // the item now reads signalled: true; no work, so no wake-up
    tx.add('deployments', d.id);
  }

  metadataSource(node: string): MetadataSource | undefined {
    const n = this.getNode(node);
    if (!n) return undefined;
    const names = new Map<string, { id: string; name: string }>();
    const entries = (this.#s.depByNode.all(node) as DeploymentRow[]).map((r) => {
      const deployment = deploymentOf(r);
      let cluster: { id: string; name: string } | null = null;
      if (deployment.clusterId !== null) {
        cluster = names.get(deployment.clusterId) ?? null;
        if (!cluster) {
          const c = this.#s.clusterName.get(deployment.clusterId) as { name: string } | undefined;
          cluster = { id: deployment.clusterId, name: c?.name ?? '' };
          names.set(deployment.clusterId, cluster);
        }
      }
      return { deployment, config: this.getConfig(deployment.configId)!, cluster };
    });
    return { node: n, entries };
  }

  // ---- clusters ----------------------------------------------------------------------------

  createCluster(c: NewCluster, who: string, nowMs = this.#now()): { cluster: ClusterRecord; changes: ChangeSet } {
    const id = randomUUID();
    const { changes } = this.#tx((tx) => {
      for (const [i, n] of c.nodes.entries()) {
        if (!this.#s.nodeGet.get(n)) throw new HeraldError('unknown_node', `no node ${n}`, { field: `nodes.${i}` });
        // two clusters' uninstall and install steps must never run on one node at once
        const other = this.#s.cnByNode.get(n) as { cluster_id: string } | undefined;
        if (other) throw new HeraldError('cluster_busy', `node ${n} already belongs to cluster ${other.cluster_id}`, { field: `nodes.${i}` });
      }
      const install = this.getConfig(c.installConfigId);
      if (!install) throw new HeraldError('unknown_config', `no config ${c.installConfigId}`, { field: 'install_config_id' });
      if (!this.getConfig(c.uninstallConfigId)) throw new HeraldError('unknown_config', `no config ${c.uninstallConfigId}`, { field: 'uninstall_config_id' });
      const now = this.#iso(nowMs);
      this.#s.clusterInsert.run(id, c.name, 'CREATE_IN_PROGRESS', 'create in progress', c.installConfigId, c.uninstallConfigId,
        JSON.stringify(c.inputValues), 'create', c.nodes.length, now, now, now);
      const deadline = nowMs + stepBudgetMs(install, this.#marginS);
      for (const [position, node] of c.nodes.entries()) {
        const installId = randomUUID();
        const uninstallId = randomUUID();
        this.#insertDeployment(tx, installId, {
          node, configId: c.installConfigId, name: `${c.name}-install`, actions: CLUSTER_INSTALL_ACTIONS, action: 'CREATE', inputValues: c.installInputValues,
        }, id, 'install');
        // made now, not triggered (CREATE is not among its actions), so a restart only adds revisions
        this.#insertDeployment(tx, uninstallId, {
          node, configId: c.uninstallConfigId, name: `${c.name}-uninstall`, actions: CLUSTER_UNINSTALL_ACTIONS, action: 'CREATE', inputValues: c.uninstallInputValues,
        }, id, 'uninstall');
        this.#s.cnInsert.run(id, node, position, 'installing', installId, uninstallId, deadline, now);
      }
      tx.add('clusters', id);
      this.#audit(who, 'cluster.create', id, { name: c.name, nodes: c.nodes });
    });
    return { cluster: this.getCluster(id)!, changes };
  }

  getClusterStatus(id: string): { status: ClusterStatus; statusReason: string } | undefined {
    const r = this.#s.clusterStatus.get(id) as { status: ClusterStatus; status_reason: string } | undefined;
    return r ? { status: r.status, statusReason: r.status_reason } : undefined;
  }

  clusterConfigIds(id: string): string[] | undefined {
    const r = this.#s.clusterConfigIds.get(id) as { install_config_id: string; uninstall_config_id: string } | undefined;
    return r ? [r.install_config_id, r.uninstall_config_id] : undefined;
  }

  getCluster(id: string): ClusterRecord | undefined {
    const r = this.#s.clusterGet.get(id) as ClusterRow | undefined;
    return r && clusterOf(r, this.#s.cnList.all(id) as ClusterNodeRow[]);
  }

  listClusters(): ClusterRecord[] {
    return (this.#s.clusterList.all() as ClusterRow[]).map((r) => clusterOf(r, this.#s.cnList.all(r.id) as ClusterNodeRow[]));
  }

  activeClusterIds(): string[] {
    return (this.#s.clusterActive.all() as Array<{ id: string }>).map((r) => r.id);
  }

  restartCluster(id: string, maxUnavailable: number | null, who: string, nowMs = this.#now()): ChangeSet {
    return this.#tx((tx) => {
      const c = this.#mustIdleCluster(id);
      const window = Math.min(c.nodes.length, maxUnavailable ?? c.nodes.length);
      const now = this.#iso(nowMs);
      this.#s.clusterStart.run('RESTART_IN_PROGRESS', 'restart in progress', 'restart', window, now, now, id);
      this.#s.cnReset.run(id);
      tx.add('clusters', id);
      this.#audit(who, 'cluster.restart', id, { max_unavailable: window, from: c.status });
      this.#advanceCluster(tx, id, nowMs);
    }).changes;
  }

  deleteCluster(id: string, who: string, nowMs = this.#now()): ChangeSet {
    return this.#tx((tx) => {
      const c = this.#mustIdleCluster(id);
      const now = this.#iso(nowMs);
      this.#s.clusterStart.run('DELETE_IN_PROGRESS', 'delete in progress', 'delete', c.nodes.length, now, now, id);
      this.#s.cnReset.run(id);
      tx.add('clusters', id);
      this.#audit(who, 'cluster.delete', id, { from: c.status });
      const fresh = this.getCluster(id)!;
      for (const n of fresh.nodes) this.#startStep(tx, fresh, n, 'uninstall', nowMs);
      this.#advanceCluster(tx, id, nowMs);
    }).changes;
  }

  tickClusters(nowMs = this.#now()): ChangeSet {
    const ids = this.activeClusterIds();
    if (ids.length === 0) return emptyChanges();
    return this.#tx((tx) => {
      for (const id of ids) this.#advanceCluster(tx, id, nowMs);
    }).changes;
  }

  #mustIdleCluster(id: string): ClusterRecord {
    const c = this.getCluster(id);
    if (!c) throw new HeraldError('not_found', `no cluster ${id}`);
    if (c.status.endsWith('_IN_PROGRESS')) throw new HeraldError('restart_in_progress', `cluster ${id} is ${c.status}`);
    return c;
  }

  /** Starts a node's step: a new revision of its uninstall or install deployment. Returns its deadline. */
  #startStep(tx: Tx, c: StepCluster, n: ClusterNodeRecord, step: 'uninstall' | 'install', nowMs: number): number {
    const depId = step === 'install' ? n.installDeploymentId : n.uninstallDeploymentId;
    const d = this.#mustDeployment(depId);
    const action: DeployAction = c.operation === 'delete' ? 'DELETE' : 'RESTART';
    const reason: WakeReason = c.operation === 'restart' ? 'restart' : 'deployment';
    this.#newRevision(tx, depId, d.node, d.actions, d.current.revision, action, d.current.inputValues, reason);
    const deadline = nowMs + stepBudgetMs(this.getConfig(d.configId)!, this.#marginS);
    const at = this.#iso(nowMs);
    if (step === 'uninstall') this.#s.cnStartUninstall.run(deadline, at, c.id, n.node);
    else this.#s.cnStartInstall.run(deadline, at, c.id, n.node);
    tx.add('clusters', c.id);
    return deadline;
  }

  /**
   * A signal ended the step of `node` (whose deployment is `depId`): record it, then advance.
   * Reads the cluster's row and this node's row only, never the whole cluster: a cluster step
   * gets one signal per node, so anything O(nodes) here is O(nodes²) per operation.
   */
  #onClusterStepResult(tx: Tx, clusterId: string, node: string, depId: string, ok: boolean, reason: string, nowMs: number): void {
    const row = this.#s.clusterGet.get(clusterId) as ClusterRow | undefined;
    if (!row || !row.status.endsWith('_IN_PROGRESS')) return;
    const c: StepCluster = { id: row.id, operation: row.operation as ClusterOperation };
    const nr = this.#s.cnGet.get(clusterId, node) as ClusterNodeRow | undefined;
    const n = nr && clusterNodeOf(nr);
    // (a cluster's deployments are on its node, so `node` is the one whose deployment is `depId`)
    if (!n || !((n.installDeploymentId === depId && n.phase === 'installing') || (n.uninstallDeploymentId === depId && n.phase === 'uninstalling'))) {
      return; // a late result of a step no longer in flight
    }
    const at = this.#iso(nowMs);
    if (!ok) {
      this.#failStep(tx, c, n, reason, nowMs);
    } else if (n.phase === 'uninstalling') {
      this.#s.cnUninstallDone.run(at, clusterId, n.node);
      // the install revision is made in the transaction that records the uninstall's success:
      // the two are never pending at once, and a crash cannot fall between them
      if (c.operation === 'restart') this.#startStep(tx, c, n, 'install', nowMs);
      else this.#s.cnComplete.run(null, clusterId, n.node);
    } else {
      this.#s.cnComplete.run(at, clusterId, n.node);
    }
    tx.add('clusters', clusterId);
    this.#advanceCluster(tx, clusterId, nowMs);
  }

  #failStep(tx: Tx, c: StepCluster, n: ClusterNodeRecord, reason: string, nowMs: number): void {
    const at = this.#iso(nowMs);
    if (n.phase === 'uninstalling') this.#s.cnFailUninstall.run(at, `uninstall: ${reason}`, c.id, n.node);
    else this.#s.cnFailInstall.run(at, `install: ${reason}`, c.id, n.node);
    tx.add('clusters', c.id);
  }

  /**
   * What the cluster's indexes tell of its next plan, without loading its nodes:
   * - 'quiet': the plan is certainly empty (a step in flight, none past its deadline, and none
   *   can start: not a restart, a node failed, none pending, or the window is full);
   * - `{ room }`: the plan is certainly "start the first `room` pending nodes" (a restart, no
   *   failure, none past its deadline, room in the window), so the planner needs only the nodes
   *   in flight (fewer than the window) and those `room` nodes to make it;
   * - 'all': anything else (timeouts, finishing): the planner needs every node.
   */
  #glance(c: ClusterRow, nowMs: number): 'quiet' | 'all' | { room: number } {
    const q = this.#s.cnGlance.get({ id: c.id }) as { due_uninstall: number | null; due_install: number | null; in_flight: number; pending: number; failed: number };
    if ((q.due_uninstall !== null && q.due_uninstall <= nowMs) || (q.due_install !== null && q.due_install <= nowMs)) return 'all'; // timeouts
    const idle = q.in_flight === 0 ? 'all' : 'quiet'; // when nothing can start: finishing, or waiting
    if (c.operation !== 'restart' || q.failed !== 0 || q.pending === 0) return idle;
    const inFlight = (this.#s.cnInFlightCount.get({ id: c.id, window: c.max_unavailable }) as { n: number }).n;
    return inFlight >= c.max_unavailable ? idle : { room: c.max_unavailable - inFlight };
  }

  /**
   * Plans and applies until the cluster has nothing more to do right now. All the actions of
   * one plan are applied before planning again (they are independent: see planCluster), so the
   * number of rounds does not depend on the cluster's size; all in the caller's transaction.
   * A signal that leaves the plan empty (the common case) or fills a window slot reads no more
   * than the window's nodes.
   */
  #advanceCluster(tx: Tx, clusterId: string, nowMs: number): void {
    for (let round = 0; round < MAX_PLAN_ROUNDS; round++) {
      const row = this.#s.clusterGet.get(clusterId) as ClusterRow | undefined;
      if (!row || !row.status.endsWith('_IN_PROGRESS')) return;
      const g = this.#glance(row, nowMs);
      if (g === 'quiet') return;
      // for a window to fill, the nodes in flight and the next pending ones give the same plan as all
      const rows = g === 'all'
        ? (this.#s.cnList.all(clusterId) as ClusterNodeRow[])
        : [...(this.#s.cnInFlight.all(clusterId) as ClusterNodeRow[]), ...(this.#s.cnFirstPending.all(clusterId, g.room) as ClusterNodeRow[])];
      const c = clusterOf(row, rows);
      const plan: PlanNode[] = c.nodes.map((n) => ({ node: n.node, position: n.position, phase: n.phase, stepDeadlineMs: n.stepDeadlineMs, reason: n.reason }));
      const actions = planCluster(c.operation, c.maxUnavailable, plan, nowMs);
      if (actions.length === 0) return;
      const first = actions[0]!;
      if (first.type === 'finish') {
        const at = this.#iso(nowMs);
        if (first.remove) {
          for (const { id } of this.#s.depIdsByCluster.all(clusterId) as Array<{ id: string }>) this.#removeDeployment(tx, id);
          this.#s.cnDelete.run(clusterId);
          this.#s.clusterDelete.run(clusterId);
          tx.add('removedClusters', clusterId);
          const i = tx.changes.clusters.indexOf(clusterId);
          if (i >= 0) tx.changes.clusters.splice(i, 1);
        } else {
          this.#s.clusterFinish.run(first.status, first.reason, at, at, clusterId);
          tx.add('clusters', clusterId);
        }
        return;
      }
      const byNode = new Map(c.nodes.map((n) => [n.node, n]));
      for (const a of actions) {
        if (a.type === 'finish' || a.type !== first.type) break; // (a plan is all timeouts or all starts)
        const n = byNode.get(a.node);
        if (!n) throw new HeraldError('internal', `cluster ${clusterId}: plan names an unknown node`);
        if (a.type === 'timeout') {
          const d = this.#mustDeployment(n.phase === 'installing' ? n.installDeploymentId : n.uninstallDeploymentId);
          const startedAt = Date.parse((n.phase === 'installing' ? n.installStartedAt : n.uninstallStartedAt) ?? c.updatedAt);
          const why = `no result within the step deadline (${Math.round((n.stepDeadlineMs! - startedAt) / 1000)} s)`;
          // recorded as the revision's result: a late signal for it is then a duplicate
          if (!d.current.signalled) this.#setResult(tx, d, 'FAILED', why, null, nowMs);
          this.#failStep(tx, c, n, why, nowMs);
        } else {
          // a step started with no budget left times out before any other node starts (the next
          // plan's timeouts come first): stop here and plan again, as one start at a time would
          if (this.#startStep(tx, c, n, a.step, nowMs) <= nowMs) break;
        }
      }
    }
    throw new HeraldError('internal', `cluster ${clusterId} did not settle`);
  }

  // ---- audit -------------------------------------------------------------------------------

  listAudit(limit = 100): AuditRecord[] {
    return (this.#s.auditList.all(limit) as Array<{ seq: number; at: string; who: string; action: string; target: string; detail: string | null }>).map((r) => ({
      seq: r.seq, at: r.at, who: r.who, action: r.action, target: r.target, detail: r.detail === null ? null : (JSON.parse(r.detail) as Record<string, unknown>),
    }));
  }

  group<T>(fn: () => T): T {
    this.#assertOpen();
    return this.#db.transaction(fn).immediate();
  }

  /** Closes the database (a WAL checkpoint happens on close). Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#db.close();
  }
}

// ---- Heat's status rules --------------------------------------------------------------------

/** Heat's status for a signal: FAILED on a non-zero code or a present error_output, else COMPLETE. */
export function heatResult(config: ConfigRecord, s: SignalInput): { status: DeploymentStatus; statusReason: string; outputValues: Record<string, unknown> } {
  const outputValues: Record<string, unknown> = {};
  const reasons: string[] = [];
  for (const o of config.outputs) {
    if (!Object.prototype.hasOwnProperty.call(s.outputs, o.name)) continue;
    const v = s.outputs[o.name];
    outputValues[o.name] = v;
    if (o.error_output) reasons.push(`${o.name} : ${typeof v === 'string' ? v : JSON.stringify(v)}`);
  }
  outputValues.deploy_stdout = s.deployStdout;
  outputValues.deploy_stderr = s.deployStderr;
  outputValues.deploy_status_code = s.deployStatusCode;
  if (s.deployStatusCode !== 0) reasons.push(`deploy_status_code : Deployment exited with non-zero status code: ${s.deployStatusCode}`);
  const failed = reasons.length > 0;
  const heatReason = failed ? `Deployment to server failed: ${reasons.join(', ')}` : 'Outputs received';
  return { status: failed ? 'FAILED' : 'COMPLETE', statusReason: s.statusReason ?? heatReason, outputValues };
}

function timeoutSOf(config: ConfigRecord): number {
  const t = config.options.timeout;
  return typeof t === 'number' && Number.isFinite(t) && t > 0 ? t : HOOK_TIMEOUT_S;
}

/** A step's budget: the config's hook timeout plus the margin (SPEC §3). */
function stepBudgetMs(config: ConfigRecord, marginS: number): number {
  return Math.round((timeoutSOf(config) + marginS) * 1000);
}

// ---- row mapping ----------------------------------------------------------------------------

function nodeOf(r: NodeRow): NodeRecord {
  return { id: r.id, endpoint: r.endpoint, generation: r.generation, ackedGeneration: r.acked_generation, createdAt: r.created_at, updatedAt: r.updated_at };
}

function configOf(r: ConfigRow): ConfigRecord {
  return {
    id: r.id,
    name: r.name,
    group: r.grp,
    config: JSON.parse(r.config) as unknown,
    inputs: JSON.parse(r.inputs) as ConfigRecord['inputs'],
    outputs: JSON.parse(r.outputs) as ConfigRecord['outputs'],
    options: JSON.parse(r.options) as Record<string, unknown>,
    createdAt: r.created_at,
  };
}

function revisionOf(r: RevisionRow): RevisionRecord {
  return {
    revision: r.revision,
    itemId: r.item_id,
    action: r.action as DeployAction,
    inputValues: JSON.parse(r.input_values) as Record<string, unknown>,
    status: r.status as DeploymentStatus,
    statusReason: r.status_reason,
    outputValues: r.output_values === null ? null : (JSON.parse(r.output_values) as Record<string, unknown>),
    signalled: r.signalled === 1,
    createdAt: r.r_created_at,
    updatedAt: r.r_updated_at,
    signalledAt: r.signalled_at,
  };
}

function deploymentOf(r: DeploymentRow): DeploymentRecord {
  return {
    id: r.id,
    node: r.node,
    configId: r.config_id,
    name: r.name,
    actions: JSON.parse(r.actions) as DeployAction[],
    clusterId: r.cluster_id,
    clusterRole: r.cluster_role as ClusterRole | null,
    createdAt: r.d_created_at,
    updatedAt: r.d_updated_at,
    current: revisionOf(r),
  };
}

function clusterNodeOf(n: ClusterNodeRow): ClusterNodeRecord {
  return {
    node: n.node,
    position: n.position,
    phase: n.phase as ClusterNodePhase,
    installDeploymentId: n.install_deployment_id,
    uninstallDeploymentId: n.uninstall_deployment_id,
    stepDeadlineMs: n.step_deadline_ms,
    uninstallStartedAt: n.uninstall_started_at,
    uninstallFinishedAt: n.uninstall_finished_at,
    installStartedAt: n.install_started_at,
    installFinishedAt: n.install_finished_at,
    reason: n.reason,
  };
}

function clusterOf(r: ClusterRow, nodes: ClusterNodeRow[]): ClusterRecord {
  return {
    id: r.id,
    name: r.name,
    status: r.status as ClusterStatus,
    statusReason: r.status_reason,
    installConfigId: r.install_config_id,
    uninstallConfigId: r.uninstall_config_id,
    inputValues: JSON.parse(r.input_values) as Record<string, unknown>,
    operation: r.operation as ClusterOperation,
    maxUnavailable: r.max_unavailable,
    operationStartedAt: r.op_started_at,
    operationFinishedAt: r.op_finished_at,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    nodes: nodes.map(clusterNodeOf),
  };
}

/**
 * Creates the database file 0600 (its directory 0700 when Herald creates it) before SQLite
 * opens it: SQLite gives its `-wal` and `-shm` files the database file's mode, so all three
 * stay private (SPEC §3). An existing file is left as it is; `looseDatabaseFiles` reports it.
 */
function createPrivateFile(path: string): void {
  const dir = dirname(path);
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    closeSync(openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}

/** The database's files (`path`, `-wal`, `-shm`) that group or others may read or write, with their modes. */
export function looseDatabaseFiles(path: string): Array<{ file: string; mode: string }> {
  if (path === ':memory:' || path === '') return [];
  const loose: Array<{ file: string; mode: string }> = [];
  for (const file of [path, `${path}-wal`, `${path}-shm`]) {
    let mode: number;
    try {
      mode = statSync(file).mode & 0o777;
    } catch {
      continue;
    }
    if ((mode & 0o077) !== 0) loose.push({ file, mode: mode.toString(8).padStart(4, '0') });
  }
  return loose;
}

