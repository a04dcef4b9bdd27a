/**
 * Every statement of the store, once, in the SQL both stores speak: SQLite (controller/store/sqlite/store.ts)
 * prepares them as they are, with `FOR UPDATE` and `SKIP LOCKED` taken out (its one writer
 * is the lock); PostgreSQL (controller/store/pg/store.ts) numbers the `?` placeholders `$1, $2, ...`. The rows
 * they return are mapped to records in controller/store/rows.ts; controller/store/tx.ts runs them.
 *
 * The dialect is the common part of the two: no `INSERT OR ...`, no named parameters, booleans
 * as 0/1 (`CASE WHEN EXISTS ...`), a sub-query in FROM with an alias, upserts with `ON CONFLICT`.
 * One read is PostgreSQL's alone, made of the same select lists (`PG_METADATA_SQL`: a fetch in
 * one statement, with JSON aggregates SQLite spells otherwise).
 */

/** A prepared statement: SQLite's answer at once, PostgreSQL's as a promise; callers `await` both. */
export interface Stmt {
  /** The first row, or undefined. */
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[] | Promise<unknown[]>;
  run(...params: unknown[]): { changes: number } | Promise<{ changes: number }>;
}

const DEPLOYMENT_COLUMNS = `d.id, d.node, d.config_id, d.name, d.actions, d.cluster_id, d.cluster_role,
         d.created_at AS d_created_at, d.updated_at AS d_updated_at,
         r.revision, r.item_id, r.action, r.input_values, r.status, r.status_reason, r.output_values,
         r.signalled, r.created_at AS r_created_at, r.updated_at AS r_updated_at, r.signalled_at`;
const DEPLOYMENT_FROM = 'deployments d JOIN revisions r ON r.deployment_id = d.id AND r.revision = d.revision';
const DEPLOYMENT_SELECT = `SELECT ${DEPLOYMENT_COLUMNS} FROM ${DEPLOYMENT_FROM}`;
/** An audit row's columns, in the order the chain hashes them (protocol/audit-chain.ts AuditChainRow). */
const AUDIT_COLUMNS = 'seq, at, who, action, target, detail, outcome, controller, prev_hash, hash';

/** A node's labels and cluster membership, what a scope check reads (controller/store/access-rows.ts). */
const FACTS_SELECT = `SELECT n.id, l.labels, c.id AS cluster_id, c.name AS cluster_name, cn.nodegroup
  FROM nodes n LEFT JOIN node_labels l ON l.node = n.id LEFT JOIN cluster_nodes cn ON cn.node = n.id
  LEFT JOIN clusters c ON c.id = cn.cluster_id`;

/** A column a many-row insert writes, with the PostgreSQL type of the array it is bound as. */
type Column = readonly [name: string, pgType: 'text' | 'integer' | 'bigint'];

/**
 * Inserts of many rows in one call: a cluster's new members (a deployment, its revision and a
 * row each: a node's uninstall deployment is made at its first uninstall). PostgreSQL binds each column as one array (`INSERT … SELECT * FROM unnest(…)`),
 * so a cluster of 10,000 nodes is three statements, not 50,000 round trips. SQLite runs the
 * one-row form once per row, in process: a multi-row `VALUES` form measured no faster there
 * (20,000 deployment rows in ~0.1 s either way, 2026-12-04). The one-row inserts of the same
 * tables (`SQL.depInsert`, `SQL.revInsert`) are made from these column lists, so a row built for
 * one fits the other.
 */
export const INSERT_MANY = {
  depInsertMany: {
    table: 'deployments',
    columns: [
      ['id', 'text'],
      ['node', 'text'],
      ['config_id', 'text'],
      ['name', 'text'],
      ['actions', 'text'],
      ['revision', 'integer'],
      ['cluster_id', 'text'],
      ['cluster_role', 'text'],
      ['created_at', 'text'],
      ['updated_at', 'text'],
    ],
  },
  revInsertMany: {
    table: 'revisions',
    columns: [
      ['deployment_id', 'text'],
      ['revision', 'integer'],
      ['item_id', 'text'],
      ['action', 'text'],
      ['input_values', 'text'],
      ['status', 'text'],
      ['status_reason', 'text'],
      ['signalled', 'integer'],
      ['created_at', 'text'],
      ['updated_at', 'text'],
      ['signalled_at', 'text'],
    ],
  },
  cnInsertMany: {
    table: 'cluster_nodes',
    columns: [
      ['cluster_id', 'text'],
      ['node', 'text'],
      ['position', 'integer'],
      ['phase', 'text'],
      ['install_deployment_id', 'text'],
      ['uninstall_deployment_id', 'text'],
      ['step_deadline_ms', 'bigint'],
      ['install_started_at', 'text'],
      ['nodegroup', 'text'],
      ['revision', 'integer'],
    ],
  },
} as const satisfies Record<string, { table: string; columns: readonly Column[] }>;

/** The one-row form of a many-row insert (SQLite's). */
export function insertOneSql(name: InsertManyName): string {
  const { table, columns } = INSERT_MANY[name];
  return `INSERT INTO ${table} (${columns.map(([c]) => c).join(', ')}) VALUES (${columns.map(() => '?').join(', ')})`;
}

export const SQL = {
  seqGet: `SELECT value FROM sequence WHERE name = 'generation'`,
  seqBump: `UPDATE sequence SET value = value + 1 WHERE name = 'generation' RETURNING value`,
  nodeInsert:
    'INSERT INTO nodes (id, endpoint, generation, acked_generation, created_at, updated_at) VALUES (?, ?, 0, NULL, ?, ?)',
  nodeGet: 'SELECT * FROM nodes WHERE id = ?',
  // a node that rows are added under (a deployment, a cluster's member): held against a delete
  // by another controller until the commit, and no obstacle to the generation being stamped
  nodeKeyLock: 'SELECT id FROM nodes WHERE id = ? FOR KEY SHARE',
  // a node about to be deleted: waits for those, so the deployments read next are all of them
  nodeLock: 'SELECT id FROM nodes WHERE id = ? FOR UPDATE',
  nodeList: 'SELECT * FROM nodes ORDER BY id',
  nodeSetEndpoint: 'UPDATE nodes SET endpoint = ?, updated_at = ? WHERE id = ?',
  nodeSetGen: 'UPDATE nodes SET generation = ? WHERE id = ?',
  nodeAck: 'UPDATE nodes SET acked_generation = ? WHERE id = ? AND (acked_generation IS NULL OR acked_generation < ?)',
  nodeDelete: 'DELETE FROM nodes WHERE id = ?',
  tombInsert:
    'INSERT INTO node_tombstones (id, deleted_at, deleted_by) VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET deleted_at = excluded.deleted_at, deleted_by = excluded.deleted_by',
  tombGet: 'SELECT id FROM node_tombstones WHERE id = ?',
  tombDelete: 'DELETE FROM node_tombstones WHERE id = ?',
  configInsert:
    'INSERT INTO configs (id, name, grp, config, inputs, outputs, options, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
  configGet: 'SELECT * FROM configs WHERE id = ?',
  configList: 'SELECT * FROM configs ORDER BY created_at, id',
  // the one-row inserts: the same columns, in the same order, as the many-row forms
  depInsert: insertOneSql('depInsertMany'),
  depGet: `${DEPLOYMENT_SELECT} WHERE d.id = ?`,
  // the row a revision or a signal changes, locked to the end of the transaction (PostgreSQL);
  // locked alone, then read with its revision by a new statement: a locking read over the join
  // would re-check the join against the updated row after waiting and find no row at all
  depLock: 'SELECT id FROM deployments WHERE id = ? FOR UPDATE',
  depList: `${DEPLOYMENT_SELECT} ORDER BY d.created_at, d.id`,
  depByNode: `${DEPLOYMENT_SELECT} WHERE d.node = ? ORDER BY d.created_at, d.id`,
  depIdsByNode: 'SELECT id FROM deployments WHERE node = ?',
  // a cluster's nodegroups' configs, for a node's metadata (controller/store/tx.ts metadataSource)
  ngConfigsOfCluster:
    'SELECT install_config_id, uninstall_config_id FROM cluster_nodegroups WHERE cluster_id = ? ORDER BY position',
  depIdsByCluster: 'SELECT id, node FROM deployments WHERE cluster_id = ?',
  depSetRevision: 'UPDATE deployments SET revision = ?, updated_at = ? WHERE id = ?',
  depDelete: 'DELETE FROM deployments WHERE id = ?',
  revInsert: insertOneSql('revInsertMany'),
  revResult: `UPDATE revisions SET status = ?, status_reason = ?, output_values = ?, signalled = 1, signalled_at = ?, updated_at = ?
                  WHERE deployment_id = ? AND revision = ?`,
  revList: `SELECT revision, item_id, action, input_values, status, status_reason, output_values, signalled,
                       created_at AS r_created_at, updated_at AS r_updated_at, signalled_at
                FROM revisions WHERE deployment_id = ? ORDER BY revision`,
  revDelete: 'DELETE FROM revisions WHERE deployment_id = ?',
  clusterInsert: `INSERT INTO clusters (id, name, status, status_reason, install_config_id, uninstall_config_id, input_values, operation, max_unavailable, op_started_at, op_finished_at, created_at, updated_at)
                      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)`,
  clusterGet: 'SELECT * FROM clusters WHERE id = ?',
  // the cluster head: the engine's lock point (clusters/tx.ts)
  clusterGetForUpdate: 'SELECT * FROM clusters WHERE id = ? FOR UPDATE',
  clusterList: 'SELECT * FROM clusters ORDER BY created_at, id',
  clusterActive: `SELECT id FROM clusters WHERE status LIKE '%_IN_PROGRESS' ORDER BY created_at, id`,
  // what one controller's tick advances: the operations no other controller is advancing right now
  clusterActiveClaim: `SELECT id FROM clusters WHERE status LIKE '%_IN_PROGRESS' ORDER BY created_at, id FOR UPDATE SKIP LOCKED`,
  clusterName: 'SELECT name FROM clusters WHERE id = ?',
  clusterStatus: 'SELECT status, status_reason FROM clusters WHERE id = ?',
  clusterConfigIds: 'SELECT install_config_id, uninstall_config_id FROM clusters WHERE id = ?',
  clusterStart:
    'UPDATE clusters SET status = ?, status_reason = ?, operation = ?, max_unavailable = ?, op_started_at = ?, op_finished_at = NULL, updated_at = ? WHERE id = ?',
  clusterFinish: 'UPDATE clusters SET status = ?, status_reason = ?, op_finished_at = ?, updated_at = ? WHERE id = ?',
  clusterDelete: 'DELETE FROM clusters WHERE id = ?',
  ngInsert: `INSERT INTO cluster_nodegroups (cluster_id, name, position, role, install_config_id, uninstall_config_id, input_values, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
  ngList: 'SELECT * FROM cluster_nodegroups WHERE cluster_id = ? ORDER BY position',
  ngDelete: 'DELETE FROM cluster_nodegroups WHERE cluster_id = ?',
  ngDeleteOne: 'DELETE FROM cluster_nodegroups WHERE cluster_id = ? AND name = ?',
  ngNextPosition: 'SELECT COALESCE(MAX(position), -1) + 1 AS p FROM cluster_nodegroups WHERE cluster_id = ?',
  cnNextPosition: 'SELECT COALESCE(MAX(position), -1) + 1 AS p FROM cluster_nodes WHERE cluster_id = ?',
  cnOfGroup: 'SELECT node FROM cluster_nodes WHERE cluster_id = ? AND nodegroup = ?',
  cnDeleteGroup: 'DELETE FROM cluster_nodes WHERE cluster_id = ? AND nodegroup = ?',
  depIdsByClusterNode: 'SELECT id FROM deployments WHERE cluster_id = ? AND node = ?',
  clusterSetRollout: 'UPDATE clusters SET rollout = ? WHERE id = ?',
  cnResetGroup: `UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ? AND nodegroup = ?`,
  cnStartCheck: `UPDATE cluster_nodes SET phase = 'checking', step_deadline_ms = ?, check_started_at = ?, install_finished_at = ?, health_deployment_id = ?, reason = NULL
                       WHERE cluster_id = ? AND node = ?`,
  cnFailCheck: `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, reason = ?, ended_at_ms = ? WHERE cluster_id = ? AND node = ?`,
  cnList: 'SELECT * FROM cluster_nodes WHERE cluster_id = ? ORDER BY position',
  cnByNode: 'SELECT cluster_id FROM cluster_nodes WHERE node = ? LIMIT 1',
  cnGet: 'SELECT * FROM cluster_nodes WHERE cluster_id = ? AND node = ?',
  // what a node's uninstall deployment is made of, at its first uninstall (controller/store/tx.ts newUninstallDeployment)
  cnUninstallSource: `SELECT n.uninstall_deployment_id, c.name, c.uninstall_config_id, c.input_values,
        g.uninstall_config_id AS group_uninstall_config_id, g.input_values AS group_input_values
      FROM cluster_nodes n JOIN clusters c ON c.id = n.cluster_id
        JOIN cluster_nodegroups g ON g.cluster_id = n.cluster_id AND g.name = n.nodegroup
      WHERE n.cluster_id = ? AND n.node = ?`,
  // the engine's glance: each sub-query is one seek in an index on (cluster_id, phase, ...) (MIN and EXISTS
  // stop at the first entry), so its cost does not grow with the cluster's size
  cnGlance: `SELECT
        (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = ? AND phase = 'uninstalling') AS due_uninstall,
        (SELECT MIN(step_deadline_ms) FROM cluster_nodes WHERE cluster_id = ? AND phase = 'installing') AS due_install,
        CASE WHEN EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = ? AND phase IN ('uninstalling', 'installing')) THEN 1 ELSE 0 END AS in_flight,
        CASE WHEN EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = ? AND phase = 'pending') THEN 1 ELSE 0 END AS pending,
        CASE WHEN EXISTS (SELECT 1 FROM cluster_nodes WHERE cluster_id = ? AND phase = 'failed') THEN 1 ELSE 0 END AS failed`,
  // nodes in flight, counted only up to the window: all the glance needs is the room left in it
  cnInFlightCount: `SELECT COUNT(*) AS n FROM (SELECT 1 FROM cluster_nodes WHERE cluster_id = ? AND phase IN ('uninstalling', 'installing') LIMIT ?) AS w`,
  cnInFlight: `SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase IN ('uninstalling', 'installing')`,
  cnFirstPending: `SELECT * FROM cluster_nodes WHERE cluster_id = ? AND phase = 'pending' ORDER BY position LIMIT ?`,
  cnByDeployment: `SELECT * FROM cluster_nodes WHERE install_deployment_id = ? OR uninstall_deployment_id = ?`,
  cnReset: `UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ?`,
  // (the uninstall deployment named when this step made it: controller/store/tx.ts newUninstallDeployment)
  cnStartUninstall: `UPDATE cluster_nodes SET phase = 'uninstalling', step_deadline_ms = ?, uninstall_started_at = ?, uninstall_finished_at = NULL,
                         install_started_at = NULL, install_finished_at = NULL, reason = NULL,
                         uninstall_deployment_id = COALESCE(?, uninstall_deployment_id) WHERE cluster_id = ? AND node = ?`,
  cnStartInstall: `UPDATE cluster_nodes SET phase = 'installing', step_deadline_ms = ?, install_started_at = ?, install_finished_at = NULL, reason = NULL
                       WHERE cluster_id = ? AND node = ?`,
  cnUninstallDone: `UPDATE cluster_nodes SET uninstall_finished_at = ? WHERE cluster_id = ? AND node = ?`,
  // a node's step ended (complete or failed): its phase and when it ended, in one statement
  cnComplete: `UPDATE cluster_nodes SET phase = 'complete', step_deadline_ms = NULL, install_finished_at = COALESCE(?, install_finished_at), ended_at_ms = ? WHERE cluster_id = ? AND node = ?`,
  cnFailUninstall: `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, uninstall_finished_at = ?, reason = ?, ended_at_ms = ? WHERE cluster_id = ? AND node = ?`,
  cnFailInstall: `UPDATE cluster_nodes SET phase = 'failed', step_deadline_ms = NULL, install_finished_at = ?, reason = ?, ended_at_ms = ? WHERE cluster_id = ? AND node = ?`,
  cnDelete: 'DELETE FROM cluster_nodes WHERE cluster_id = ?',
  // the audit trail's hash chain (controller/store/audit-chain.ts, docs/access.md): every append
  // locks the head row first, so rows are numbered and chained in commit order by any controller
  auditHeadLock: 'SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE',
  auditHeadGet: 'SELECT seq, hash FROM audit_head WHERE id = 1',
  auditHeadSet: 'UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1',
  // (PostgreSQL's seq is an identity column of the first schema: the chain numbers rows itself)
  auditAppend: `INSERT INTO audit (seq, at, who, action, target, detail, outcome, controller, prev_hash, hash) OVERRIDING SYSTEM VALUE
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
  auditList: `SELECT ${AUDIT_COLUMNS} FROM audit ORDER BY seq DESC LIMIT ?`,
  auditListBefore: `SELECT ${AUDIT_COLUMNS} FROM audit WHERE seq < ? ORDER BY seq DESC LIMIT ?`,
  auditPage: `SELECT ${AUDIT_COLUMNS} FROM audit WHERE seq > ? ORDER BY seq LIMIT ?`,
  auditRow: `SELECT ${AUDIT_COLUMNS} FROM audit WHERE seq = ?`,
  auditDeleteThrough: 'DELETE FROM audit WHERE seq <= ?',
  // the newest row of an action (the checkpoints are frequent: a short walk back on the key)
  auditNewestOf: 'SELECT seq FROM audit WHERE action = ? ORDER BY seq DESC LIMIT 1',
  // cluster revisions and upgrades (docs/api.md "Revisions"; controller/store/tx.ts)
  crInsert: `INSERT INTO cluster_revisions (cluster_id, revision, install_config_id, uninstall_config_id, input_values, nodegroups,
       created_at, created_by, stable_at, source_revision) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
  crGet: 'SELECT * FROM cluster_revisions WHERE cluster_id = ? AND revision = ?',
  crList: 'SELECT * FROM cluster_revisions WHERE cluster_id = ? ORDER BY revision',
  crCount: 'SELECT COUNT(*) AS n FROM cluster_revisions WHERE cluster_id = ?',
  crSetStable: 'UPDATE cluster_revisions SET stable_at = ? WHERE cluster_id = ? AND revision = ? AND stable_at IS NULL',
  crSetGroups: 'UPDATE cluster_revisions SET nodegroups = ? WHERE cluster_id = ? AND revision = ?',
  crDelete: 'DELETE FROM cluster_revisions WHERE cluster_id = ?',
  clusterSetConfigs:
    'UPDATE clusters SET install_config_id = ?, uninstall_config_id = ?, input_values = ?, revision = ?, updated_at = ? WHERE id = ?',
  ngSetOwn:
    'UPDATE cluster_nodegroups SET install_config_id = ?, uninstall_config_id = ?, input_values = ? WHERE cluster_id = ? AND name = ?',
  cnSetRevision: 'UPDATE cluster_nodes SET revision = ? WHERE cluster_id = ? AND node = ?',
  cnSetGroupRevision: 'UPDATE cluster_nodes SET revision = ? WHERE cluster_id = ? AND nodegroup = ?',
  cnResetOne: `UPDATE cluster_nodes SET phase = 'pending', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ? AND node = ?`,
  cnSettle: `UPDATE cluster_nodes SET phase = 'complete', step_deadline_ms = NULL, uninstall_started_at = NULL, uninstall_finished_at = NULL,
                install_started_at = NULL, install_finished_at = NULL, reason = NULL, check_started_at = NULL, ended_at_ms = NULL
                WHERE cluster_id = ? AND node = ?`,
  cnDropUninstall: 'UPDATE cluster_nodes SET uninstall_deployment_id = NULL WHERE cluster_id = ? AND node = ?',
  depSetConfig: 'UPDATE deployments SET config_id = ? WHERE id = ?',
  // live output (docs/api.md; controller/store/output.ts)
  // the revision's row read with a lock a signal's update waits for (controller/store/output.ts append)
  outRevisionSignalled: 'SELECT signalled FROM revisions WHERE deployment_id = ? AND revision = ? FOR SHARE',
  outInsert: `INSERT INTO deployment_output (deployment_id, revision, seq, stream, text, bytes, dropped_bytes, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
  outTotal: 'SELECT COALESCE(SUM(bytes), 0) AS n FROM deployment_output WHERE deployment_id = ? AND revision = ?',
  outOldest:
    'SELECT seq, stream, bytes FROM deployment_output WHERE deployment_id = ? AND revision = ? ORDER BY seq LIMIT 64',
  outDelete: 'DELETE FROM deployment_output WHERE deployment_id = ? AND revision = ? AND seq = ?',
  outAddCut: `INSERT INTO deployment_output_cut (deployment_id, revision, stream, bytes) VALUES (?, ?, ?, ?)
       ON CONFLICT (deployment_id, revision, stream) DO UPDATE SET bytes = deployment_output_cut.bytes + excluded.bytes`,
  outChunks:
    'SELECT seq, stream, text, dropped_bytes FROM deployment_output WHERE deployment_id = ? AND revision = ? ORDER BY seq',
  outCuts: 'SELECT stream, bytes FROM deployment_output_cut WHERE deployment_id = ? AND revision = ?',
  // the newest chunk of the deployment's current revision (an index seek per deployment)
  outLast: `SELECT o.text FROM deployment_output o JOIN deployments d ON d.id = o.deployment_id AND d.revision = o.revision
       WHERE o.deployment_id = ? ORDER BY o.seq DESC LIMIT 1`,
  // who may do what (docs/access.md; controller/store/access-rows.ts)
  grantInsert: 'INSERT INTO access_grants (id, subject, role, scope, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?)',
  grantGet: 'SELECT * FROM access_grants WHERE id = ?',
  grantDelete: 'DELETE FROM access_grants WHERE id = ?',
  grantList: 'SELECT * FROM access_grants ORDER BY created_at, id',
  grantsOf: 'SELECT * FROM access_grants WHERE subject = ? ORDER BY created_at, id',
  labelsSet:
    'INSERT INTO node_labels (node, labels) VALUES (?, ?) ON CONFLICT (node) DO UPDATE SET labels = excluded.labels',
  labelsDelete: 'DELETE FROM node_labels WHERE node = ?',
  labelsAll: 'SELECT node, labels FROM node_labels',
  factsAll: FACTS_SELECT,
  // Heat's object store (docs/heat.md; controller/store/objects.ts)
  objAccountGet: 'SELECT temp_url_key FROM object_accounts WHERE project = ?',
  // the first key set stays (docs/heat.md "The temp-url key"): a second server's POST cannot orphan the first's TempURLs
  objAccountSetKey: `INSERT INTO object_accounts (project, temp_url_key, updated_at) VALUES (?, ?, ?)
       ON CONFLICT (project) DO UPDATE SET temp_url_key = excluded.temp_url_key, updated_at = excluded.updated_at
       WHERE object_accounts.temp_url_key IS NULL`,
  objContainerGet: `SELECT c.created_at, (SELECT COUNT(*) FROM objects o WHERE o.project = c.project AND o.container = c.name) AS n,
         (SELECT COALESCE(SUM(length(o.body)), 0) FROM objects o WHERE o.project = c.project AND o.container = c.name) AS bytes
       FROM object_containers c WHERE c.project = ? AND c.name = ?`,
  objContainerInsert:
    'INSERT INTO object_containers (project, name, created_at) VALUES (?, ?, ?) ON CONFLICT (project, name) DO NOTHING',
  objContainerDelete: 'DELETE FROM object_containers WHERE project = ? AND name = ?',
  objContainerCount: 'SELECT COUNT(*) AS n FROM object_containers WHERE project = ?',
  objContainerList: 'SELECT name FROM object_containers WHERE project = ? AND name > ? ORDER BY name LIMIT ?',
  objList: `SELECT name, length(body) AS bytes, content_type, etag, modified_ms FROM objects
       WHERE project = ? AND container = ? AND name > ? ORDER BY name LIMIT ?`,
  objHead:
    'SELECT length(body) AS bytes, content_type, etag, modified_ms FROM objects WHERE project = ? AND container = ? AND name = ?',
  objGet: 'SELECT body, content_type, etag, modified_ms FROM objects WHERE project = ? AND container = ? AND name = ?',
  objPut: `INSERT INTO objects (project, container, name, body, content_type, etag, modified_ms) VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (project, container, name) DO UPDATE SET body = excluded.body, content_type = excluded.content_type,
         etag = excluded.etag, modified_ms = excluded.modified_ms`,
  objDelete: 'DELETE FROM objects WHERE project = ? AND container = ? AND name = ?',
  objCount: 'SELECT COUNT(*) AS n FROM objects WHERE project = ? AND container = ?',
  heatLinksOf: 'SELECT * FROM heat_links WHERE node = ? AND source = ?',
  heatLinkGet: 'SELECT * FROM heat_links WHERE deployment_id = ?',
  heatLinkPut: `INSERT INTO heat_links (deployment_id, node, source, heat_key, heat_item_id, signal_project, signal_container, signal_object)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (deployment_id) DO UPDATE SET heat_item_id = excluded.heat_item_id, signal_project = excluded.signal_project,
         signal_container = excluded.signal_container, signal_object = excluded.signal_object`,
  heatLinkDelete: 'DELETE FROM heat_links WHERE deployment_id = ?',
} as const;

export type StatementName = keyof typeof SQL;

/**
 * A select list written once, as output name → expression: the SQL text, and each column's
 * place in a row read as an array (`VALUES_SQL`), so a reader names a column, never a number.
 */
function selectList<K extends string>(columns: Record<K, string>): { sql: string; at: Readonly<Record<K, number>> } {
  const names = Object.keys(columns) as K[];
  return {
    sql: names.map((k) => (columns[k] === k ? k : `${columns[k]} AS ${k}`)).join(', '),
    at: Object.fromEntries(names.map((k, i) => [k, i])) as Record<K, number>,
  };
}

const NODE_LIST = selectList({
  id: 'id',
  endpoint: 'endpoint',
  generation: 'generation',
  acked_generation: 'acked_generation',
  created_at: 'created_at',
  updated_at: 'updated_at',
});
/** Where each column of `VALUES_SQL.nodeValues` is in its row. */
export const NODE_AT = NODE_LIST.at;

// of each deployment only what its document carries (no results, status or bookkeeping: a node's
// earlier outputs are never parsed to answer a fetch), with its cluster's name and configs; its
// actions say whether it has an item at all (metadata-builder.ts inDocument)
const METADATA_DEPLOYMENT_LIST_COLUMNS = {
  id: 'd.id',
  node: 'd.node',
  config_id: 'd.config_id',
  name: 'd.name',
  actions: 'd.actions',
  cluster_id: 'd.cluster_id',
  d_created_at: 'd.created_at',
  revision: 'r.revision',
  item_id: 'r.item_id',
  action: 'r.action',
  input_values: 'r.input_values',
  signalled: 'r.signalled',
  cluster_name: 'c.name',
  cluster_install_config_id: 'c.install_config_id',
  cluster_uninstall_config_id: 'c.uninstall_config_id',
};
const METADATA_DEPLOYMENT_LIST = selectList(METADATA_DEPLOYMENT_LIST_COLUMNS);
/** Where each column of `VALUES_SQL.depForMetadata` is in its row. */
export const METADATA_DEPLOYMENT_AT = METADATA_DEPLOYMENT_LIST.at;

/**
 * A fetch's read on PostgreSQL, one statement (controller/store/pg/store.ts `metadataSource`): the
 * node's row as `VALUES_SQL.nodeValues` reads it and, unless its generation is one the caller
 * knows already (`$2`: any; `$3`: these), its deployments as `VALUES_SQL.depForMetadata` reads them,
 * as one JSON array of rows (each row's values at METADATA_DEPLOYMENT_AT, JSON's types for SQL's:
 * TEXT a string, INTEGER a number) whose last element (at METADATA_GROUP_CONFIGS_AT) is the
 * deployment's cluster's node groups' configs, `[install, uninstall]` pairs in SQL.ngConfigsOfCluster's
 * order (null for a deployment of no cluster, or of a cluster without groups). One statement is
 * one snapshot; PostgreSQL's own syntax, so SQLite reads the same with those two statements.
 */
export const PG_METADATA_SQL = `SELECT ${NODE_LIST.sql},
    CASE WHEN $2::boolean OR n.generation = ANY($3::bigint[]) THEN NULL ELSE (
      SELECT COALESCE(json_agg(json_build_array(${Object.values<string>(METADATA_DEPLOYMENT_LIST_COLUMNS).join(', ')},
        (SELECT json_agg(json_build_array(g.install_config_id, g.uninstall_config_id) ORDER BY g.position)
         FROM cluster_nodegroups g WHERE g.cluster_id = d.cluster_id)) ORDER BY d.id), '[]'::json)
      FROM ${DEPLOYMENT_FROM} LEFT JOIN clusters c ON c.id = d.cluster_id
      WHERE d.node = n.id) END AS deployments
  FROM nodes n WHERE n.id = $1`;
/** Where a PG_METADATA_SQL deployment row has its cluster's node groups' configs. */
export const METADATA_GROUP_CONFIGS_AT = Object.keys(METADATA_DEPLOYMENT_AT).length;

/**
 * Reads whose rows come back as arrays of the columns' values, in their select list's order
 * (SQLite's raw mode, postgres.js `values()`), read by the indices above: no row object is built.
 * They are a fetch's read (controller/store/tx.ts metadataSource), once per agent in a fan-out, where the
 * driver building each row as an object was a quarter of it: a node and its two deployments
 * read in 13.0 µs against 17.6 µs as objects (`store.metadataSource`, medians of interleaved
 * rounds on a store of three 10,000-node clusters, 2026-12-07).
 */
export const VALUES_SQL = {
  // the node, as SQL.nodeGet reads it
  nodeValues: `SELECT ${NODE_LIST.sql} FROM nodes WHERE id = ?`,
  // a node's deployments for its metadata, unsorted (the document has an order of its own); then
  // each cluster's nodegroups' configs (SQL.ngConfigsOfCluster)
  depForMetadata: `SELECT ${METADATA_DEPLOYMENT_LIST.sql}
    FROM ${DEPLOYMENT_FROM} LEFT JOIN clusters c ON c.id = d.cluster_id
    WHERE d.node = ?`,
} as const;

export type ValuesName = keyof typeof VALUES_SQL;

/** A read of `VALUES_SQL`: each row an array of its columns' values. */
export interface ValuesStmt {
  all(...params: unknown[]): unknown[][] | Promise<unknown[][]>;
}

/**
 * Reads of the rows matching any of many keys, in the keys' terms: PostgreSQL runs `many` once
 * (the keys bound as one text array); SQLite runs `one` per key (row locks taken out, as for
 * every statement). The rows come in no particular order.
 */
export const SELECT_MANY = {
  // a cluster's new members, held against a delete as nodeKeyLock holds one
  nodesKeyLock: {
    one: SQL.nodeKeyLock,
    many: 'SELECT id FROM nodes WHERE id = ANY(?::text[]) FOR KEY SHARE',
  },
  // the cluster each of them is in already, if any
  cnByNodes: {
    one: 'SELECT node, cluster_id FROM cluster_nodes WHERE node = ?',
    many: 'SELECT node, cluster_id FROM cluster_nodes WHERE node = ANY(?::text[])',
  },
  // a few nodes' labels and clusters, for a scope check (controller/store/access-rows.ts)
  factsByNodes: {
    one: `${FACTS_SELECT} WHERE n.id = ?`,
    many: `${FACTS_SELECT} WHERE n.id = ANY(?::text[])`,
  },
  labelsByNodes: {
    one: 'SELECT node, labels FROM node_labels WHERE node = ?',
    many: 'SELECT node, labels FROM node_labels WHERE node = ANY(?::text[])',
  },
} as const;

export type InsertManyName = keyof typeof INSERT_MANY;
export type SelectManyName = keyof typeof SELECT_MANY;

/** A many-row insert; each row's values in the columns' order. */
export interface InsertMany {
  run(rows: ReadonlyArray<readonly unknown[]>): void | Promise<void>;
}

/** A read of the rows matching any of `keys`. */
export interface SelectMany {
  all(keys: readonly string[]): unknown[] | Promise<unknown[]>;
}

export type Statements = Record<StatementName, Stmt> &
  Record<InsertManyName, InsertMany> &
  Record<SelectManyName, SelectMany> &
  Record<ValuesName, ValuesStmt>;

/** The one-statement form of a many-row insert (PostgreSQL's): each column one array parameter. */
export function insertUnnestSql(name: InsertManyName): string {
  const { table, columns } = INSERT_MANY[name];
  return `INSERT INTO ${table} (${columns.map(([c]) => c).join(', ')}) SELECT * FROM unnest(${columns.map(([, t]) => `?::${t}[]`).join(', ')})`;
}
