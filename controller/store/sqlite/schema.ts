/**
 * SQLite's side of the store: the schema and its migrations (versioned in code), and every
 * statement of controller/store/statements.ts, prepared once.
 */
import type Database from 'better-sqlite3';
import { OUTPUT_MIGRATION_SQL } from './output.js';
import { ENROLLMENT_MIGRATION_SQL, IDENTITY_FLOOR_MIGRATION_SQL } from './enrollment.js';
import { SQLITE_OBJECTS_MIGRATION_SQL } from '../objects-schema.js';
import { SQLITE_ACCESS_MIGRATION_SQL } from '../access-schema.js';
import {
  AUDIT_CHAINED_SQL,
  AUDIT_HEAD_INSERT_SQL,
  AUDIT_LAST_HASHED_SQL,
  AUDIT_UNHASHED_SQL,
  chainExisting,
  type ChainHead,
} from '../audit-chain.js';
import { AUDIT_PAGE_ENTRIES } from '../../../protocol/limits.js';
import { AUDIT_GENESIS_HASH } from '../../../protocol/audit-chain.js';
import {
  INSERT_MANY,
  insertOneSql,
  SELECT_MANY,
  SQL,
  type InsertManyName,
  type SelectManyName,
  type StatementName,
  type Statements,
  VALUES_SQL,
  type ValuesName,
} from '../statements.js';

interface Migration {
  version: number;
  name: string;
  sql: string;
  /**
   * Columns added after `sql`, each only when missing: SQLite has no ADD COLUMN IF NOT EXISTS,
   * and a migration must stay harmless when it runs again over its own result.
   */
  columns?: Array<{ table: string; column: string; decl: string }>;
  /** A step in code after `sql` and `columns`, in the same transaction (harmless run again, too). */
  run?: (db: Database.Database) => void;
}

/** cluster_nodes' columns after migration 3, which migration 6 copies. */
const CLUSTER_NODE_COLUMNS_V6 = `cluster_id, node, position, phase, install_deployment_id, uninstall_deployment_id,
  step_deadline_ms, uninstall_started_at, uninstall_finished_at, install_started_at, install_finished_at, reason,
  nodegroup, health_deployment_id, check_started_at, ended_at_ms`;

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
    // docs/api.md: node groups with a role and configs of their own; a restart's limits kept on the
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
    // docs/api.md live output: each chunk an agent streamed, kept once per sequence number, the
    // newest 1 MiB per revision (controller/store/sqlite/output.ts)
    sql: OUTPUT_MIGRATION_SQL,
  },
  {
    version: 5,
    name: 'enrollment',
    // docs/adding-nodes.md: join tokens (their SHA-256 only) and each node's certificate with its renewal
    // state (controller/store/sqlite/enrollment.ts)
    sql: ENROLLMENT_MIGRATION_SQL,
  },
  {
    version: 6,
    name: 'uninstall_deployment_at_first_uninstall',
    // a cluster node's uninstall deployment is made when its first uninstall starts (clusters/engine.ts
    // #startStep), so its id is null until then. SQLite cannot drop a NOT NULL: the table is made
    // again with the same rows and indexes, as SQLite's ALTER TABLE page describes (in this
    // migration's transaction; harmless run again over its own result)
    sql: `
      DROP TABLE IF EXISTS cluster_nodes_v6;
      CREATE TABLE cluster_nodes_v6 (
        cluster_id TEXT NOT NULL,
        node TEXT NOT NULL,
        position INTEGER NOT NULL,
        phase TEXT NOT NULL,
        install_deployment_id TEXT NOT NULL,
        uninstall_deployment_id TEXT,
        step_deadline_ms INTEGER,
        uninstall_started_at TEXT,
        uninstall_finished_at TEXT,
        install_started_at TEXT,
        install_finished_at TEXT,
        reason TEXT,
        nodegroup TEXT NOT NULL DEFAULT 'default-worker',
        health_deployment_id TEXT,
        check_started_at TEXT,
        ended_at_ms INTEGER,
        PRIMARY KEY (cluster_id, node)
      ) STRICT;
      INSERT INTO cluster_nodes_v6 (${CLUSTER_NODE_COLUMNS_V6}) SELECT ${CLUSTER_NODE_COLUMNS_V6} FROM cluster_nodes;
      DROP TABLE cluster_nodes;
      ALTER TABLE cluster_nodes_v6 RENAME TO cluster_nodes;
      CREATE INDEX cluster_nodes_by_node ON cluster_nodes (node);
      CREATE INDEX cluster_nodes_by_deadline ON cluster_nodes (cluster_id, phase, step_deadline_ms);
      CREATE INDEX cluster_nodes_by_position ON cluster_nodes (cluster_id, phase, position);
    `,
  },
  {
    version: 7,
    name: 'identity_floors',
    // each node's identity floor: a revoked node's certificates, and those a renewal superseded,
    // are refused whatever issued them (controller/store/sqlite/enrollment.ts)
    sql: IDENTITY_FLOOR_MIGRATION_SQL,
  },
  {
    version: 8,
    name: 'heat_object_store',
    // Heat's object store (docs/heat.md): temp-url keys, containers, objects, and the deployments
    // Heat's metadata made, linked to the objects they came from and answer to (controller/store/objects.ts)
    sql: SQLITE_OBJECTS_MIGRATION_SQL,
  },
  {
    version: 9,
    name: 'access',
    // docs/access.md: who may do what (grants of roles over scopes) and the labels grants select
    // nodes by (controller/store/access-schema.ts)
    sql: SQLITE_ACCESS_MIGRATION_SQL,
  },
  {
    version: 10,
    name: 'audit_chain',
    // docs/access.md "Audit trail": each row carries its outcome, the controller that wrote it and
    // its place in the hash chain; the head row is the lock every append takes. The rows written
    // before are chained here, in seq order (controller/store/audit-chain.ts)
    sql: `
      CREATE TABLE IF NOT EXISTS audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq INTEGER NOT NULL,
        hash TEXT NOT NULL
      ) STRICT;
      ${AUDIT_HEAD_INSERT_SQL};
    `,
    columns: [
      { table: 'audit', column: 'outcome', decl: 'TEXT' },
      { table: 'audit', column: 'controller', decl: 'TEXT' },
      { table: 'audit', column: 'prev_hash', decl: 'TEXT' },
      { table: 'audit', column: 'hash', decl: 'TEXT' },
    ],
    run: chainSqliteAudit,
  },
  {
    version: 11,
    name: 'cluster_revisions',
    // docs/api.md "Revisions": every change of a cluster's configs or input values is a numbered
    // revision (its groups' own configs and values with it), stable once a rollout to it
    // completed on every node; the cluster's revision, and each node's (the configs its install
    // deployment has). A cluster made before has revision 1, read from its rows until its next
    // revision writes it (controller/store/tx.ts).
    sql: `
      CREATE TABLE IF NOT EXISTS cluster_revisions (
        cluster_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        install_config_id TEXT NOT NULL,
        uninstall_config_id TEXT NOT NULL,
        input_values TEXT NOT NULL,
        nodegroups TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT NOT NULL,
        stable_at TEXT,
        source_revision INTEGER,
        PRIMARY KEY (cluster_id, revision)
      ) STRICT;
    `,
    columns: [
      { table: 'clusters', column: 'revision', decl: 'INTEGER NOT NULL DEFAULT 1' },
      { table: 'cluster_nodes', column: 'revision', decl: 'INTEGER NOT NULL DEFAULT 1' },
    ],
  },
];

/** Migration 10's step: the rows written before the chain, chained (controller/store/audit-chain.ts). */
function chainSqliteAudit(db: Database.Database): void {
  const last = db.prepare(AUDIT_LAST_HASHED_SQL).get() as ChainHead | undefined;
  const page = db.prepare(AUDIT_UNHASHED_SQL);
  const write = db.prepare(AUDIT_CHAINED_SQL);
  let head: ChainHead = last ?? { seq: 0, hash: AUDIT_GENESIS_HASH };
  for (;;) {
    const raws = page.all(head.seq, AUDIT_PAGE_ENTRIES) as Array<Record<string, unknown>>;
    if (raws.length === 0) break;
    const out = chainExisting(head, raws);
    for (const r of out.rows) write.run(r.outcome, r.prev_hash, r.hash, r.seq);
    head = out.head;
  }
  db.prepare('UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1').run(head.seq, head.hash);
}

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

/** Every statement, prepared once on `db`; SQLite's one writer is the lock, so row locks are left out. */
export function prepareStatements(db: Database.Database): Statements {
  const prepare = (sql: string) =>
    db.prepare(
      sql
        .replace(/ FOR (UPDATE|NO KEY UPDATE|SHARE|KEY SHARE)( OF \w+)?( SKIP LOCKED)?/g, '')
        .replace(/ OVERRIDING SYSTEM VALUE/g, ''),
    );
  const out: Partial<Statements> = {};
  for (const [name, sql] of Object.entries(SQL) as Array<[StatementName, string]>) out[name] = prepare(sql);
  for (const name of Object.keys(INSERT_MANY) as InsertManyName[]) {
    const one = prepare(insertOneSql(name));
    out[name] = {
      run: (rows) => {
        for (const r of rows) one.run(r);
      },
    };
  }
  for (const [name, sql] of Object.entries(VALUES_SQL) as Array<[ValuesName, string]>)
    out[name] = prepare(sql).raw(true) as { all(...params: unknown[]): unknown[][] };
  for (const [name, { one }] of Object.entries(SELECT_MANY) as Array<[SelectManyName, { one: string }]>) {
    const stmt = prepare(one);
    out[name] = { all: (keys) => keys.flatMap((k) => stmt.all(k)) };
  }
  return out as Statements;
}
