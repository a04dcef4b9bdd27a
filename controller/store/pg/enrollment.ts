/**
 * Enrolment's rows in PostgreSQL (docs/adding-nodes.md): the same tables, semantics and audit rows as
 * controller/store/sqlite/enrollment.ts (join tokens by the SHA-256 of their secret, single use; each node's
 * certificate and its renewal failures). `consume` marks a token used in the statement that
 * checks it is still usable, so two controllers enrolling with one token cannot both win.
 */
import type postgres from 'postgres';
import type { AuditEntry } from '../audit-chain.js';
import {
  certRecord,
  floorRecord,
  type FloorReason,
  type FloorRow,
  type IdentityFloorRecord,
  tokenRecord,
  type CertRow,
  type ConsumeResult,
  type EnrollmentTokenRecord,
  type NewEnrollmentToken,
  type NodeCertificateRecord,
  type SeenCertificate,
  type TokenRow,
} from '../enrollment-records.js';

type Sql = postgres.Sql<Record<string, never>> | postgres.TransactionSql<Record<string, never>>;

/** PostgreSQL migration 2's SQL (controller/store/pg/schema.ts). */
export const PG_ENROLLMENT_MIGRATION_SQL = `
  CREATE TABLE enrollment_tokens (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    node TEXT NOT NULL,
    dns TEXT NOT NULL,
    ips TEXT NOT NULL,
    created_at TEXT NOT NULL,
    created_by TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at TEXT,
    used_by TEXT,
    revoked_at TEXT
  );
  CREATE TABLE node_certificates (
    node TEXT PRIMARY KEY,
    serial TEXT NOT NULL,
    not_before TEXT NOT NULL,
    not_after TEXT NOT NULL,
    issued_at TEXT,
    renewal_failures INTEGER NOT NULL DEFAULT 0,
    last_renewal_error TEXT,
    last_renewal_attempt_at TEXT
  );
  CREATE FUNCTION node_certificates_removed() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    DELETE FROM node_certificates WHERE node = OLD.id;
    RETURN OLD;
  END $$;
  CREATE TRIGGER node_certificates_removed AFTER DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION node_certificates_removed();
`;

/** PostgreSQL migration 5's SQL (controller/store/pg/schema.ts): SQLite's migration 7, identity_floors. */
export const PG_IDENTITY_FLOOR_MIGRATION_SQL = `
  CREATE TABLE identity_floors (
    node TEXT PRIMARY KEY,
    not_before TEXT NOT NULL,
    renewed_serial TEXT,
    renewed_not_before TEXT,
    updated_at TEXT NOT NULL
  );
`;

/** Appends to the audit chain in the transaction given (controller/store/audit-chain.ts). */
export type AppendAudit = (e: AuditEntry) => Promise<void>;
const TOKEN_COLUMNS = 'id, node, dns, ips, created_at, created_by, expires_at, used_at, used_by, revoked_at';

async function q<T>(sql: Sql, text: string, params: unknown[] = []): Promise<T[]> {
  return [...(await sql.unsafe(text, params as never[], { prepare: true }))] as T[];
}

/** Each function runs in the transaction (or on the pool) it is given. */
export const pgEnrollment = {
  async create(
    tx: Sql,
    audit: AppendAudit,
    t: NewEnrollmentToken,
    who: string,
    at: string,
  ): Promise<EnrollmentTokenRecord> {
    await q(
      tx,
      `INSERT INTO enrollment_tokens (id, token_hash, node, dns, ips, created_at, created_by, expires_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
      [t.id, t.tokenHash, t.node, JSON.stringify(t.dns), JSON.stringify(t.ips), at, who, t.expiresAt],
    );
    await audit({
      at,
      who,
      action: 'enrollment_token.create',
      target: t.id,
      detail: { node: t.node, dns: t.dns, ips: t.ips, expires_at: t.expiresAt },
    });
    const [row] = await q<TokenRow>(tx, `SELECT ${TOKEN_COLUMNS} FROM enrollment_tokens WHERE id = $1`, [t.id]);
    return tokenRecord(row!);
  },

  async list(sql: Sql): Promise<EnrollmentTokenRecord[]> {
    return (await q<TokenRow>(sql, `SELECT ${TOKEN_COLUMNS} FROM enrollment_tokens ORDER BY created_at, id`)).map(
      tokenRecord,
    );
  },

  async revoke(
    tx: Sql,
    audit: AppendAudit,
    id: string,
    who: string,
    at: string,
  ): Promise<EnrollmentTokenRecord | undefined> {
    const [row] = await q<TokenRow>(tx, `SELECT ${TOKEN_COLUMNS} FROM enrollment_tokens WHERE id = $1 FOR UPDATE`, [
      id,
    ]);
    if (!row) return undefined;
    if (row.revoked_at === null) {
      await q(tx, 'UPDATE enrollment_tokens SET revoked_at = $1 WHERE id = $2', [at, id]);
      await audit({ at, who, action: 'enrollment_token.revoke', target: id, detail: { node: row.node } });
      row.revoked_at = at;
    }
    return tokenRecord(row);
  },

  async consume(
    tx: Sql,
    audit: AppendAudit,
    tokenHash: string,
    node: string,
    usedBy: string,
    at: string,
  ): Promise<ConsumeResult> {
    const used = await q<TokenRow>(
      tx,
      `UPDATE enrollment_tokens SET used_at = $1, used_by = $2
       WHERE token_hash = $3 AND used_at IS NULL AND revoked_at IS NULL AND expires_at > $1 AND node = $4
       RETURNING ${TOKEN_COLUMNS}`,
      [at, usedBy, tokenHash, node],
    );
    if (used.length === 1) {
      await audit({ at, who: usedBy, action: 'enrollment_token.use', target: used[0]!.id, detail: { node } });
      return { ok: true, token: tokenRecord(used[0]!) };
    }
    const [row] = await q<TokenRow>(tx, `SELECT ${TOKEN_COLUMNS} FROM enrollment_tokens WHERE token_hash = $1`, [
      tokenHash,
    ]);
    if (!row) return { ok: false, reason: 'unknown' };
    if (row.revoked_at !== null) return { ok: false, reason: 'revoked' };
    if (row.used_at !== null) return { ok: false, reason: 'used' };
    if (row.expires_at <= at) return { ok: false, reason: 'expired' };
    return { ok: false, reason: 'wrong_node' };
  },

  async certificate(sql: Sql, node: string): Promise<NodeCertificateRecord | undefined> {
    const [r] = await q<CertRow>(sql, 'SELECT * FROM node_certificates WHERE node = $1', [node]);
    return r ? certRecord(r) : undefined;
  },

  async noteCertificate(
    tx: Sql,
    audit: AppendAudit,
    node: string,
    c: SeenCertificate,
    who: string,
    at: string,
  ): Promise<void> {
    if (c.issued) {
      await q(
        tx,
        `INSERT INTO node_certificates (node, serial, not_before, not_after, issued_at, renewal_failures,
           last_renewal_error, last_renewal_attempt_at) VALUES ($1, $2, $3, $4, $5, 0, NULL, $5)
         ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, not_before = excluded.not_before,
           not_after = excluded.not_after, issued_at = excluded.issued_at, renewal_failures = 0,
           last_renewal_error = NULL, last_renewal_attempt_at = excluded.last_renewal_attempt_at`,
        [node, c.serial, c.notBefore, c.notAfter, at],
      );
      await audit({
        at,
        who,
        action: 'certificate.issue',
        target: node,
        detail: { serial: c.serial, not_after: c.notAfter },
      });
      return;
    }
    // a certificate seen on a request: its dates, keeping what is known of its renewal
    await q(
      tx,
      `INSERT INTO node_certificates (node, serial, not_before, not_after) VALUES ($1, $2, $3, $4)
       ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, not_before = excluded.not_before,
         not_after = excluded.not_after WHERE node_certificates.serial <> excluded.serial`,
      [node, c.serial, c.notBefore, c.notAfter],
    );
  },

  async floors(sql: Sql): Promise<IdentityFloorRecord[]> {
    return (
      await q<FloorRow>(
        sql,
        'SELECT node, not_before, renewed_serial, renewed_not_before FROM identity_floors ORDER BY node',
      )
    ).map(floorRecord);
  },

  async raiseFloor(
    tx: Sql,
    audit: AppendAudit,
    node: string,
    notBefore: string,
    renewed: { serial: string; notBefore: string } | null,
    reason: FloorReason,
    who: string,
    at: string,
  ): Promise<void> {
    // a floor never goes down: a renewal after a revocation cannot bring revoked certificates back
    await q(
      tx,
      `INSERT INTO identity_floors (node, not_before, renewed_serial, renewed_not_before, updated_at)
       VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (node) DO UPDATE SET not_before = GREATEST(identity_floors.not_before, excluded.not_before),
         renewed_serial = excluded.renewed_serial, renewed_not_before = excluded.renewed_not_before,
         updated_at = excluded.updated_at`,
      [node, notBefore, renewed?.serial ?? null, renewed?.notBefore ?? null, at],
    );
    if (reason === 'revoke')
      await audit({ at, who, action: 'node.revoke', target: node, detail: { revoked_before: notBefore } });
  },

  async retireSuperseded(sql: Sql, node: string, serial: string, at: string): Promise<boolean> {
    const r = await q(
      sql,
      `UPDATE identity_floors SET not_before = GREATEST(not_before, renewed_not_before), renewed_serial = NULL,
         renewed_not_before = NULL, updated_at = $1 WHERE node = $2 AND renewed_serial = $3 RETURNING node`,
      [at, node, serial],
    );
    return r.length === 1;
  },

  async noteRenewalFailure(sql: Sql, node: string, code: string, reported: number, at: string): Promise<void> {
    await q(
      sql,
      `UPDATE node_certificates SET renewal_failures = GREATEST(renewal_failures + 1, $1), last_renewal_error = $2,
         last_renewal_attempt_at = $3 WHERE node = $4`,
      [reported, code, at, node],
    );
  },
};
