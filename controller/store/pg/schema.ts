/**
 * PostgreSQL's side of the store (docs/several-controllers.md): its schema and migrations (versioned in code, run
 * by the first controller to start under an advisory lock), and the statements of
 * controller/store/statements.ts in PostgreSQL's placeholders. The tables are SQLite's (the same columns and
 * values: JSON and times as TEXT, flags 0/1), plus what several controllers share: the change
 * log every controller reads in commit order, membership, and node ownership.
 */
import { PG_ENROLLMENT_MIGRATION_SQL, PG_IDENTITY_FLOOR_MIGRATION_SQL } from './enrollment.js';
import { PG_OBJECTS_MIGRATION_SQL } from '../objects-schema.js';
import { PG_ACCESS_MIGRATION_SQL } from '../access-schema.js';
import { AUDIT_GENESIS_HASH } from '../../../protocol/audit-chain.js';
import { AUDIT_PAGE_ENTRIES } from '../../../protocol/limits.js';
import {
  AUDIT_HEAD_INSERT_SQL,
  AUDIT_LAST_HASHED_SQL,
  AUDIT_UNHASHED_SQL,
  chainExisting,
  type ChainHead,
} from '../audit-chain.js';
import {
  INSERT_MANY,
  insertUnnestSql,
  SELECT_MANY,
  SQL,
  type InsertManyName,
  type SelectManyName,
  type StatementName,
  VALUES_SQL,
  type ValuesName,
} from '../statements.js';

export interface PgMigration {
  version: number;
  name: string;
  sql: string;
  /** A step in code after `sql`, in the same transaction. */
  run?: (tx: MigrationSql) => Promise<void>;
}

/** What a migration's step runs its statements on (the migrating transaction). */
export interface MigrationSql {
  unsafe(query: string, params?: unknown[]): Promise<ArrayLike<unknown> & Iterable<unknown>>;
}

/** Applied in order, each in its own transaction; never edit one that has shipped. */
export const PG_MIGRATIONS: PgMigration[] = [
  {
    version: 1,
    name: 'initial',
    // SQLite's migrations 1-4 in one, and the tables of several controllers
    sql: `
      CREATE TABLE sequence (name TEXT PRIMARY KEY, value BIGINT NOT NULL, changes BIGINT NOT NULL DEFAULT 0);
      INSERT INTO sequence (name, value) VALUES ('generation', 0);
      CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        endpoint TEXT,
        generation BIGINT NOT NULL,
        acked_generation BIGINT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      );
      CREATE TABLE node_tombstones (id TEXT PRIMARY KEY, deleted_at TEXT NOT NULL, deleted_by TEXT NOT NULL);
      CREATE TABLE configs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        grp TEXT NOT NULL,
        config TEXT NOT NULL,
        inputs TEXT NOT NULL,
        outputs TEXT NOT NULL,
        options TEXT NOT NULL,
        created_at TEXT NOT NULL
      );
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
      );
      CREATE INDEX deployments_by_node ON deployments (node);
      CREATE INDEX deployments_by_cluster ON deployments (cluster_id);
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
      );
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
        updated_at TEXT NOT NULL,
        rollout TEXT
      );
      CREATE TABLE cluster_nodegroups (
        cluster_id TEXT NOT NULL,
        name TEXT NOT NULL,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        install_config_id TEXT,
        uninstall_config_id TEXT,
        input_values TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (cluster_id, name)
      );
      CREATE TABLE cluster_nodes (
        cluster_id TEXT NOT NULL,
        node TEXT NOT NULL,
        position INTEGER NOT NULL,
        phase TEXT NOT NULL,
        install_deployment_id TEXT NOT NULL,
        uninstall_deployment_id TEXT NOT NULL,
        step_deadline_ms BIGINT,
        uninstall_started_at TEXT,
        uninstall_finished_at TEXT,
        install_started_at TEXT,
        install_finished_at TEXT,
        reason TEXT,
        nodegroup TEXT NOT NULL DEFAULT 'default-worker',
        health_deployment_id TEXT,
        check_started_at TEXT,
        ended_at_ms BIGINT,
        PRIMARY KEY (cluster_id, node)
      );
      -- a node is in one cluster at most (SqlTx checks; this settles two controllers racing)
      CREATE UNIQUE INDEX cluster_nodes_by_node ON cluster_nodes (node);
      CREATE INDEX cluster_nodes_by_deadline ON cluster_nodes (cluster_id, phase, step_deadline_ms);
      CREATE INDEX cluster_nodes_by_position ON cluster_nodes (cluster_id, phase, position);
      CREATE INDEX cluster_nodes_by_install ON cluster_nodes (install_deployment_id);
      CREATE INDEX cluster_nodes_by_uninstall ON cluster_nodes (uninstall_deployment_id);
      CREATE TABLE audit (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at TEXT NOT NULL,
        who TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT
      );
      CREATE TABLE deployment_output (
        deployment_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        stream TEXT NOT NULL,
        text TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        dropped_bytes INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        PRIMARY KEY (deployment_id, revision, seq)
      );
      CREATE TABLE deployment_output_cut (
        deployment_id TEXT NOT NULL,
        revision INTEGER NOT NULL,
        stream TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        PRIMARY KEY (deployment_id, revision, stream)
      );
      CREATE FUNCTION deployment_output_removed() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        DELETE FROM deployment_output WHERE deployment_id = OLD.id;
        DELETE FROM deployment_output_cut WHERE deployment_id = OLD.id;
        RETURN OLD;
      END $$;
      CREATE TRIGGER deployment_output_removed AFTER DELETE ON deployments
        FOR EACH ROW EXECUTE FUNCTION deployment_output_removed();

      -- every committed change set, numbered in commit order (the numbers are taken under the
      -- sequence row's lock, held to the commit); controllers read it after a NOTIFY
      CREATE TABLE change_log (
        seq BIGINT PRIMARY KEY,
        origin TEXT NOT NULL,
        generation BIGINT,
        at TIMESTAMPTZ NOT NULL DEFAULT now(),
        body TEXT NOT NULL
      );
      CREATE INDEX change_log_by_at ON change_log (at);
      -- membership: a controller is live while lease_until (database time) is ahead
      CREATE TABLE controllers (
        name TEXT PRIMARY KEY,
        api_url TEXT NOT NULL,
        incarnation TEXT NOT NULL,
        started_at TIMESTAMPTZ NOT NULL,
        heartbeat_at TIMESTAMPTZ NOT NULL,
        lease_until TIMESTAMPTZ NOT NULL,
        nodes_held INTEGER NOT NULL DEFAULT 0
      );
      -- ownership: one owner per node, its fencing epoch raised at every change of owner; the
      -- node's lease is its owner's membership lease
      CREATE TABLE node_owners (
        node_id TEXT PRIMARY KEY,
        controller TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        since TIMESTAMPTZ NOT NULL DEFAULT now()
      );
      CREATE INDEX node_owners_by_controller ON node_owners (controller);
    `,
  },
  {
    version: 2,
    name: 'enrollment',
    // docs/adding-nodes.md: SQLite's migration 5 (controller/store/pg/enrollment.ts)
    sql: PG_ENROLLMENT_MIGRATION_SQL,
  },
  {
    version: 3,
    name: 'uninstall_deployment_at_first_uninstall',
    // SQLite's migration 6: a cluster node's uninstall deployment is made when its first uninstall starts
    sql: 'ALTER TABLE cluster_nodes ALTER COLUMN uninstall_deployment_id DROP NOT NULL',
  },
  {
    version: 4,
    name: 'controller_certificates',
    // a lease counts only while its holder's certificate does (controller/fleet/fleet.ts liveRow): each
    // controller writes the serial and end of its certificate; NULL for one that does not yet
    sql: 'ALTER TABLE controllers ADD COLUMN cert_serial TEXT, ADD COLUMN cert_not_after TIMESTAMPTZ',
  },
  {
    version: 5,
    name: 'identity_floors',
    // SQLite's migration 7: each node's identity floor (controller/store/pg/enrollment.ts)
    sql: PG_IDENTITY_FLOOR_MIGRATION_SQL,
  },
  {
    version: 6,
    name: 'heat_object_store',
    // SQLite's migration 8: Heat's object store (controller/store/objects-schema.ts)
    sql: PG_OBJECTS_MIGRATION_SQL,
  },
  {
    version: 7,
    name: 'access',
    // SQLite's migration 9: grants and node labels (controller/store/access-schema.ts)
    sql: PG_ACCESS_MIGRATION_SQL,
  },
  {
    version: 8,
    name: 'audit_chain',
    // SQLite's migration 10 (docs/access.md "Audit trail"): outcome, controller and the hash chain;
    // the head row every append locks (FOR UPDATE), so appends of several controllers form one
    // line; the rows written before are chained here, in seq order
    sql: `
      ALTER TABLE audit ADD COLUMN IF NOT EXISTS outcome TEXT, ADD COLUMN IF NOT EXISTS controller TEXT,
        ADD COLUMN IF NOT EXISTS prev_hash TEXT, ADD COLUMN IF NOT EXISTS hash TEXT;
      CREATE TABLE IF NOT EXISTS audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        seq BIGINT NOT NULL,
        hash TEXT NOT NULL
      );
      ${AUDIT_HEAD_INSERT_SQL};
    `,
    run: chainPgAudit,
  },
  {
    version: 9,
    name: 'cluster_revisions',
    // SQLite's migration 11: cluster revisions, the cluster's and each node's (docs/api.md "Revisions")
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
      );
      ALTER TABLE clusters ADD COLUMN IF NOT EXISTS revision INTEGER NOT NULL DEFAULT 1;
      ALTER TABLE cluster_nodes ADD COLUMN IF NOT EXISTS revision INTEGER NOT NULL DEFAULT 1;
    `,
  },
];

/** Migration 8's step: the rows written before the chain, chained a page at a time (controller/store/audit-chain.ts). */
async function chainPgAudit(tx: MigrationSql): Promise<void> {
  const [last] = [...(await tx.unsafe(AUDIT_LAST_HASHED_SQL))] as ChainHead[];
  let head: ChainHead = last ? { seq: Number(last.seq), hash: last.hash } : { seq: 0, hash: AUDIT_GENESIS_HASH };
  const page = numbered(AUDIT_UNHASHED_SQL);
  for (;;) {
    const raws = [...(await tx.unsafe(page, [head.seq, AUDIT_PAGE_ENTRIES]))] as Array<Record<string, unknown>>;
    if (raws.length === 0) break;
    const out = chainExisting(head, raws);
    // one statement a page: each column an array
    await tx.unsafe(
      `UPDATE audit a SET outcome = v.outcome, prev_hash = v.prev_hash, hash = v.hash
       FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS v(seq, outcome, prev_hash, hash) WHERE a.seq = v.seq`,
      [
        out.rows.map((r) => r.seq),
        out.rows.map((r) => r.outcome),
        out.rows.map((r) => r.prev_hash),
        out.rows.map((r) => r.hash),
      ],
    );
    head = out.head;
  }
  await tx.unsafe('UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1', [head.seq, head.hash]);
}

/** `?` placeholders numbered `$1, $2, ...`. */
function numbered(sql: string): string {
  let n = 0;
  return sql.replace(/\?/g, () => `$${++n}`);
}

export const PG_SCHEMA_VERSION = PG_MIGRATIONS[PG_MIGRATIONS.length - 1]!.version;

/** Every statement's PostgreSQL text: the shared ones, and the many-row forms (controller/store/statements.ts). */
export type PgStatementName = StatementName | InsertManyName | SelectManyName | ValuesName;

/** The statements with `?` numbered `$1, $2, ...` (none of them has a `?` in a literal). */
export function pgStatementTexts(): Record<PgStatementName, string> {
  const out = {} as Record<PgStatementName, string>;
  const texts: Array<[PgStatementName, string]> = [
    ...(Object.entries(SQL) as Array<[StatementName, string]>),
    ...(Object.entries(VALUES_SQL) as Array<[ValuesName, string]>),
    ...(Object.keys(INSERT_MANY) as InsertManyName[]).map((n): [PgStatementName, string] => [n, insertUnnestSql(n)]),
    ...(Object.entries(SELECT_MANY) as Array<[SelectManyName, { many: string }]>).map(
      ([n, { many }]): [PgStatementName, string] => [n, many],
    ),
  ];
  for (const [name, sql] of texts) out[name] = numbered(sql);
  return out;
}
