/**
 * SQLite's side of the store: the schema and its migrations (versioned in code), the rows as
 * SQLite returns them and their mapping to records, and every statement, prepared once.
 */
import type Database from 'better-sqlite3';
import type { DeployAction } from '../protocol/heat.js';
import { OUTPUT_MIGRATION_SQL } from './sqlite-output.js';
import type {
  ClusterNodePhase,
  ClusterNodeRecord,
  ClusterOperation,
  ClusterRecord,
  ClusterRole,
  ClusterStatus,
  ConfigRecord,
  DeploymentRecord,
  DeploymentStatus,
  NodegroupRecord,
  NodegroupRole,
  NodeRecord,
  RevisionRecord,
  Rollout,
} from './records.js';

interface Migration {
  version: number;
  name: string;
  sql: string;
  /**
   * Columns added after `sql`, each only when missing: SQLite has no ADD COLUMN IF NOT EXISTS,
   * and a migration must stay harmless when it runs again over its own result.
   */
  columns?: Array<{ table: string; column: string; decl: string }>;
}

/** Applied in order, each in its own transaction; never edit one that has shipped. */
export const MIGRATIONS: Migration[] = [
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
    // what the engine's glance reads on every signal of a cluster step: an index seek per question, not every
    // node's row of the cluster (all the primary key's index would give); and a restart window's
    // next pending nodes in position order without sorting all of them
    sql: `
      CREATE INDEX cluster_nodes_by_deadline ON cluster_nodes (cluster_id, phase, step_deadline_ms);
      CREATE INDEX cluster_nodes_by_position ON cluster_nodes (cluster_id, phase, position);
    `,
  },
  {
    version: 3,
    name: 'cluster_nodegroups',
    // SPEC §8: node groups with a role and configs of their own; a restart's limits kept on the
    // cluster's row (JSON) so a controller started again carries the rollout on; a node's health
    // check and the end of its step (its pause counts from there). Existing clusters become one
    // group 'default-worker' with the cluster's configs.
    sql: `
      CREATE TABLE IF NOT EXISTS cluster_nodegroups (
        cluster_id TEXT NOT NULL,
        name TEXT NOT NULL,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        install_config_id TEXT,
        uninstall_config_id TEXT,
        input_values TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (cluster_id, name)
      ) STRICT;
      INSERT OR IGNORE INTO cluster_nodegroups (cluster_id, name, position, role, created_at)
        SELECT id, 'default-worker', 0, 'worker', created_at FROM clusters;
    `,
    columns: [
      { table: 'clusters', column: 'rollout', decl: 'TEXT' },
      { table: 'cluster_nodes', column: 'nodegroup', decl: "TEXT NOT NULL DEFAULT 'default-worker'" },
      { table: 'cluster_nodes', column: 'health_deployment_id', decl: 'TEXT' },
      { table: 'cluster_nodes', column: 'check_started_at', decl: 'TEXT' },
      { table: 'cluster_nodes', column: 'ended_at_ms', decl: 'INTEGER' },
    ],
  },
  {
    version: 4,
    name: 'deployment_output',
    // SPEC §8 live output: each chunk an agent streamed, kept once per sequence number, the
    // newest 1 MiB per revision (controller/sqlite-output.ts)
    sql: OUTPUT_MIGRATION_SQL,
  },
];

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

export interface NodeRow {
  id: string;
  endpoint: string | null;
  generation: number;
  acked_generation: number | null;
  created_at: string;
  updated_at: string;
}
export interface ConfigRow {
  id: string;
  name: string;
  grp: string;
  config: string;
  inputs: string;
  outputs: string;
  options: string;
  created_at: string;
}
export interface DeploymentRow {
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
export type RevisionRow = Omit<
  DeploymentRow,
  'id' | 'node' | 'config_id' | 'name' | 'actions' | 'cluster_id' | 'cluster_role' | 'd_created_at' | 'd_updated_at'
>;
export interface ClusterRow {
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
  rollout: string | null;
}
export interface NodegroupRow {
  cluster_id: string;
  name: string;
  position: number;
  role: string;
  install_config_id: string | null;
  uninstall_config_id: string | null;
  input_values: string | null;
  created_at: string;
}
export interface ClusterNodeRow {
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
  nodegroup: string;
  health_deployment_id: string | null;
  check_started_at: string | null;
  ended_at_ms: number | null;
}

const DEPLOYMENT_SELECT = `
  SELECT d.id, d.node, d.config_id, d.name, d.actions, d.cluster_id, d.cluster_role,
         d.created_at AS d_created_at, d.updated_at AS d_updated_at,
         r.revision, r.item_id, r.action, r.input_values, r.status, r.status_reason, r.output_values,
         r.signalled, r.created_at AS r_created_at, r.updated_at AS r_updated_at, r.signalled_at
  FROM deployments d JOIN revisions r ON r.deployment_id = d.id AND r.revision = d.revision`;

/** All statements, prepared once on `db`. */
export function prepareStatements(db: Database.Database) {
  const p = (sql: string) => db.prepare(sql);
  return {
    seqGet: p(`SELECT value FROM sequence WHERE name = 'generation'`),
    seqBump: p(`UPDATE sequence SET value = value + 1 WHERE name = 'generation' RETURNING value`),
    nodeInsert: p(
      'INSERT INTO nodes (id, endpoint, generation, acked_generation, created_at, updated_at) VALUES (?, ?, 0, NULL, ?, ?)',
    ),
    nodeGet: p('SELECT * FROM nodes WHERE id = ?'),
    nodeList: p('SELECT * FROM nodes ORDER BY id'),
    nodeSetEndpoint: p('UPDATE nodes SET endpoint = ?, updated_at = ? WHERE id = ?'),
    nodeSetGen: p('UPDATE nodes SET generation = ? WHERE id = ?'),
    nodeAck: p(
      'UPDATE nodes SET acked_generation = ? WHERE id = ? AND (acked_generation IS NULL OR acked_generation < ?)',
    ),
    nodeDelete: p('DELETE FROM nodes WHERE id = ?'),
    tombInsert: p('INSERT OR REPLACE INTO node_tombstones (id, deleted_at, deleted_by) VALUES (?, ?, ?)'),
    tombGet: p('SELECT id FROM node_tombstones WHERE id = ?'),
    tombDelete: p('DELETE FROM node_tombstones WHERE id = ?'),
    configInsert: p(
      'INSERT INTO configs (id, name, grp, config, inputs, outputs, options, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
    ),
    configGet: p('SELECT * FROM configs WHERE id = ?'),
    configList: p('SELECT * FROM configs ORDER BY created_at, id'),
    depInsert: p(
      'INSERT INTO deployments (id, node, config_id, name, actions, revision, cluster_id, cluster_role, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?)',
    ),
    depGet: p(`${DEPLOYMENT_SELECT} WHERE d.id = ?`),
    depList: p(`${DEPLOYMENT_SELECT} ORDER BY d.created_at, d.id`),
    depByNode: p(`${DEPLOYMENT_SELECT} WHERE d.node = ? ORDER BY d.created_at, d.id`),
    depIdsByNode: p('SELECT id FROM deployments WHERE node = ?'),
    depIdsByCluster: p('SELECT id, node FROM deployments WHERE cluster_id = ?'),
    depSetRevision: p('UPDATE deployments SET revision = ?, updated_at = ? WHERE id = ?'),
    depDelete: p('DELETE FROM deployments WHERE id = ?'),
    revInsert:
      p(`INSERT INTO revisions (deployment_id, revision, item_id, action, input_values, status, status_reason, output_values, signalled, created_at, updated_at, signalled_at)
                  VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)`),
    revResult:
      p(`UPDATE revisions SET status = ?, status_reason = ?, output_values = ?, signalled = 1, signalled_at = ?, updated_at = ?
                  WHERE deployment_id = ? AND revision = ?`),
    revList: p(`SELECT revision, item_id, action, input_values, status, status_reason, output_values, signalled,
                       created_at AS r_created_at, updated_at AS r_updated_at, signalled_at
                FROM revisions WHERE deployment_id = ? ORDER BY revision`),
    revDelete: p('DELETE FROM revisions WHERE deployment_id = ?'),
    clusterInsert:
      p(`INSERT INTO clusters (id, name, status, status_reason, install_config_id, uninstall_config_id, input_values, operation, max_unavailable, op_started_at, op_finished_at, created_at, updated_at)
                      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)`),
    clusterGet: p('SELECT * FROM clusters WHERE id = ?'),
    clusterList: p('SELECT * FROM clusters ORDER BY created_at, id'),
    clusterActive: p(`SELECT id FROM clusters WHERE status LIKE '%_IN_PROGRESS' ORDER BY created_at, id`),
    clusterName: p('SELECT name FROM clusters WHERE id = ?'),
    clusterStatus: p('SELECT status, status_reason FROM clusters WHERE id = ?'),
    clusterConfigIds: p('SELECT install_config_id, uninstall_config_id FROM clusters WHERE id = ?'),
    clusterStart: p(
      'UPDATE clusters SET status = ?, status_reason = ?, operation = ?, max_unavailable = ?, op_started_at = ?, op_finished_at = NULL, updated_at = ? WHERE id = ?',
    ),
    clusterFinish: p(
      'UPDATE clusters SET status = ?, status_reason = ?, op_finished_at = ?, updated_at = ? WHERE id = ?',
    ),
    clusterDelete: p('DELETE FROM clusters WHERE id = ?'),
    cnInsert:
      p(`INSERT INTO cluster_nodes (cluster_id, node, position, phase, install_deployment_id, uninstall_deployment_id, step_deadline_ms, install_started_at, nodegroup)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
    ngInsert:
      p(`INSERT INTO cluster_nodegroups (cluster_id, name, position, role, install_config_id, uninstall_config_id, input_values, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
    ngList: p('SELECT * FROM cluster_nodegroups WHERE cluster_id = ? ORDER BY position'),
    ngDelete: p('DELETE FROM cluster_nodegroups WHERE cluster_id = ?'),
    ngDeleteOne: p('DELETE FROM cluster_nodegroups WHERE cluster_id = ? AND name = ?'),
    ngNextPosition: p('SELECT COALESCE(MAX(position), -1) + 1 AS p FROM cluster_nodegroups WHERE cluster_id = ?'),
    cnNextPosition: p('SELECT COALESCE(MAX(position), -1) + 1 AS p FROM cluster_nodes WHERE cluster_id = ?'),
    cnOfGroup: p('SELECT node FROM cluster_nodes WHERE cluster_id = ? AND nodegroup = ?'),
    cnDeleteGroup: p('DELETE FROM cluster_nodes WHERE cluster_id = ? AND nodegroup = ?'),
    depIdsByClusterNode: p('SELECT id FROM deployments WHERE cluster_id = ? AND node = ?'),
    clusterSetRollout: p('UPDATE clusters SET rollout = ? WHERE id = ?'),
    cnResetGroup:
      p(`UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ? AND nodegroup = ?`),
    cnStartCheck:
      p(`UPDATE cluster_nodes SET phase = 'checking', step_deadline_ms = ?, check_started_at = ?, install_finished_at = ?, health_deployment_id = ?, reason = NULL
                       WHERE cluster_id = ? AND node = ?`),
    cnFailCheck: p(
      `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, reason = ? WHERE cluster_id = ? AND node = ?`,
    ),
    cnEnded: p('UPDATE cluster_nodes SET ended_at_ms = ? WHERE cluster_id = ? AND node = ?'),
    cnList: p('SELECT * FROM cluster_nodes WHERE cluster_id = ? ORDER BY position'),
    cnByNode: p('SELECT cluster_id FROM cluster_nodes WHERE node = ? LIMIT 1'),
    cnGet: p('SELECT * FROM cluster_nodes WHERE cluster_id = ? AND node = ?'),
    // the engine's glance: each sub-query is one seek in an index on (cluster_id, phase, ...) (MIN and EXISTS
    // stop at the first entry), so its cost does not grow with the cluster's size
    cnGlance: p(`SELECT
        (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = @id AND phase = 'uninstalling') AS due_uninstall,
        (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = @id AND phase = 'installing') AS due_install,
        EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase IN ('uninstalling', 'installing')) AS in_flight,
        EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase = 'pending') AS pending,
        EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase = 'failed') AS failed`),
    // nodes in flight, counted only up to the window: all the glance needs is the room left in it
    cnInFlightCount: p(
      `SELECT COUNT(*) AS n FROM (SELECT 1 FROM cluster_nodes WHERE cluster_id = @id AND phase IN ('uninstalling', 'installing') LIMIT @window)`,
    ),
    cnInFlight: p(`SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase IN ('uninstalling', 'installing')`),
    cnFirstPending: p(
      `SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase = 'pending' ORDER BY position LIMIT ?`,
    ),
    cnByDeployment: p(`SELECT * FROM cluster_nodes WHERE install_deployment_id = ? OR uninstall_deployment_id = ?`),
    cnReset:
      p(`UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ?`),
    cnStartUninstall:
      p(`UPDATE cluster_nodes SET phase = 'uninstalling', step_deadline_ms = ?, uninstall_started_at = ?, uninstall_finished_at = NULL,
                         install_started_at = NULL, install_finished_at = NULL, reason = NULL WHERE cluster_id = ? AND node = ?`),
    cnStartInstall:
      p(`UPDATE cluster_nodes SET phase = 'installing', step_deadline_ms = ?, install_started_at = ?, install_finished_at = NULL, reason = NULL
                       WHERE cluster_id = ? AND node = ?`),
    cnUninstallDone: p(`UPDATE cluster_nodes SET uninstall_finished_at = ? WHERE cluster_id = ? AND node = ?`),
    cnComplete: p(
      `UPDATE cluster_nodes SET phase = 'complete', step_deadline_ms = NULL, install_finished_at = COALESCE(?, install_finished_at) WHERE cluster_id = ? AND node = ?`,
    ),
    cnFailUninstall: p(
      `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, uninstall_finished_at = ?, reason = ? WHERE cluster_id = ? AND node = ?`,
    ),
    cnFailInstall: p(
      `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, install_finished_at = ?, reason = ? WHERE cluster_id = ? AND node = ?`,
    ),
    cnDelete: p('DELETE FROM cluster_nodes WHERE cluster_id = ?'),
    auditInsert: p('INSERT INTO audit (at, who, action, target, detail) VALUES (?, ?, ?, ?, ?)'),
    auditList: p('SELECT * FROM audit ORDER BY seq DESC LIMIT ?'),
  };
}

export type Statements = ReturnType<typeof prepareStatements>;

// ---- row mapping ----------------------------------------------------------------------------

export function nodeOf(r: NodeRow): NodeRecord {
  return {
    id: r.id,
    endpoint: r.endpoint,
    generation: r.generation,
    ackedGeneration: r.acked_generation,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export function configOf(r: ConfigRow): ConfigRecord {
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

export function revisionOf(r: RevisionRow): RevisionRecord {
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

export function deploymentOf(r: DeploymentRow): DeploymentRecord {
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

export function clusterNodeOf(n: ClusterNodeRow): ClusterNodeRecord {
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
    nodegroup: n.nodegroup,
    healthDeploymentId: n.health_deployment_id,
    checkStartedAt: n.check_started_at,
    endedAtMs: n.ended_at_ms,
  };
}

export function nodegroupOf(g: NodegroupRow): NodegroupRecord {
  return {
    name: g.name,
    role: g.role as NodegroupRole,
    position: g.position,
    installConfigId: g.install_config_id,
    uninstallConfigId: g.uninstall_config_id,
    inputValues: g.input_values === null ? null : (JSON.parse(g.input_values) as Record<string, unknown>),
    createdAt: g.created_at,
  };
}

export function clusterOf(r: ClusterRow, nodes: ClusterNodeRow[], groups: NodegroupRow[]): ClusterRecord {
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
    nodegroups: groups.map(nodegroupOf),
    rollout: r.rollout === null ? null : (JSON.parse(r.rollout) as Rollout),
  };
}
