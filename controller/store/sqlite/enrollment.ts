/**
 * Enrolment's rows in SQLite (docs/adding-nodes.md; migration 5): join tokens, kept by the SHA-256 of their
 * secret (never the secret), single use, bound to a node and its SANs; and each node's
 * certificate as the controller last saw or issued it, with its renewal failures (shown in
 * `GET /v1/nodes/{id}`). Every change is one transaction with its audit row; `consume` marks a
 * token used in the same statement that checks it is still usable, so two enrolments racing
 * with one token cannot both win.
 */
import type Database from 'better-sqlite3';
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

/**
 * Migration 5's SQL (listed in controller/store/sqlite/schema.ts MIGRATIONS); idempotent. Plain SQL (TEXT,
 * INTEGER), so a PostgreSQL store can run the same DDL without `STRICT`.
 */
export const ENROLLMENT_MIGRATION_SQL = `
  CREATE TABLE IF NOT EXISTS enrollment_tokens (
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
  ) STRICT;
  CREATE TABLE IF NOT EXISTS node_certificates (
    node TEXT PRIMARY KEY,
    serial TEXT NOT NULL,
    not_before TEXT NOT NULL,
    not_after TEXT NOT NULL,
    issued_at TEXT,
    renewal_failures INTEGER NOT NULL DEFAULT 0,
    last_renewal_error TEXT,
    last_renewal_attempt_at TEXT
  ) STRICT;
  -- a deleted node's certificate state goes with it
  CREATE TRIGGER IF NOT EXISTS node_certificates_removed AFTER DELETE ON nodes BEGIN
    DELETE FROM node_certificates WHERE node = OLD.id;
  END;
`;

/**
 * Migration 7's SQL: each node's identity floor (enrollment-records.ts IdentityFloorRecord). Not
 * removed with the node: a deleted node's certificates stay refused. Plain SQL, as migration 5.
 */
export const IDENTITY_FLOOR_MIGRATION_SQL = `
  CREATE TABLE IF NOT EXISTS identity_floors (
    node TEXT PRIMARY KEY,
    not_before TEXT NOT NULL,
    renewed_serial TEXT,
    renewed_not_before TEXT,
    updated_at TEXT NOT NULL
  ) STRICT;
`;

export class SqliteEnrollmentRows {
  readonly #db: Database.Database;
  /** Appends to the audit chain in the transaction open on `db` (controller/store/audit-chain.ts). */
  readonly #audit: (e: AuditEntry) => void;
  readonly #insert: Database.Statement;
  readonly #list: Database.Statement;
  readonly #byId: Database.Statement;
  readonly #byHash: Database.Statement;
  readonly #revoke: Database.Statement;
  readonly #use: Database.Statement;
  readonly #certGet: Database.Statement;
  readonly #certSeen: Database.Statement;
  readonly #certIssued: Database.Statement;
  readonly #certFailed: Database.Statement;
  readonly #floors: Database.Statement;
  readonly #floorRaise: Database.Statement;
  readonly #floorRetire: Database.Statement;

  constructor(db: Database.Database, audit: (e: AuditEntry) => void) {
    this.#db = db;
    const p = (sql: string): Database.Statement => db.prepare(sql);
    this.#audit = audit;
    this.#insert = p(
      `INSERT INTO enrollment_tokens (id, token_hash, node, dns, ips, created_at, created_by, expires_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
    );
    this.#list = p('SELECT * FROM enrollment_tokens ORDER BY created_at, id');
    this.#byId = p('SELECT * FROM enrollment_tokens WHERE id = ?');
    this.#byHash = p('SELECT * FROM enrollment_tokens WHERE token_hash = ?');
    this.#revoke = p('UPDATE enrollment_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL');
    this.#use = p(
      `UPDATE enrollment_tokens SET used_at = ?, used_by = ?
       WHERE token_hash = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ? AND node = ?`,
    );
    this.#certGet = p('SELECT * FROM node_certificates WHERE node = ?');
    // a certificate seen on a request: its dates, keeping what is known of its renewal
    this.#certSeen = p(
      `INSERT INTO node_certificates (node, serial, not_before, not_after) VALUES (?, ?, ?, ?)
       ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, not_before = excluded.not_before,
         not_after = excluded.not_after`,
    );
    this.#certIssued = p(
      `INSERT INTO node_certificates (node, serial, not_before, not_after, issued_at, renewal_failures,
         last_renewal_error, last_renewal_attempt_at) VALUES (?, ?, ?, ?, ?, 0, NULL, ?)
       ON CONFLICT (node) DO UPDATE SET serial = excluded.serial, not_before = excluded.not_before,
         not_after = excluded.not_after, issued_at = excluded.issued_at, renewal_failures = 0,
         last_renewal_error = NULL, last_renewal_attempt_at = excluded.last_renewal_attempt_at`,
    );
    this.#certFailed = p(
      `UPDATE node_certificates SET renewal_failures = MAX(renewal_failures + 1, ?), last_renewal_error = ?,
         last_renewal_attempt_at = ? WHERE node = ?`,
    );
    this.#floors = p('SELECT node, not_before, renewed_serial, renewed_not_before FROM identity_floors ORDER BY node');
    // a floor never goes down: a renewal after a revocation cannot bring revoked certificates back
    this.#floorRaise = p(
      `INSERT INTO identity_floors (node, not_before, renewed_serial, renewed_not_before, updated_at)
       VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (node) DO UPDATE SET not_before = MAX(not_before, excluded.not_before),
         renewed_serial = excluded.renewed_serial, renewed_not_before = excluded.renewed_not_before,
         updated_at = excluded.updated_at`,
    );
    this.#floorRetire = p(
      `UPDATE identity_floors SET not_before = MAX(not_before, renewed_not_before), renewed_serial = NULL,
         renewed_not_before = NULL, updated_at = ? WHERE node = ? AND renewed_serial = ?`,
    );
  }

  floors(): IdentityFloorRecord[] {
    return (this.#floors.all() as FloorRow[]).map(floorRecord);
  }

  /** Raises the node's floor (never lowers it) and sets or clears its renewed certificate; a revocation is audited. */
  raiseFloor(
    node: string,
    notBefore: string,
    renewed: { serial: string; notBefore: string } | null,
    reason: FloorReason,
    who: string,
    at: string,
  ): void {
    this.#db.transaction(() => {
      this.#floorRaise.run(node, notBefore, renewed?.serial ?? null, renewed?.notBefore ?? null, at);
      if (reason === 'revoke')
        this.#audit({ at, who, action: 'node.revoke', target: node, detail: { revoked_before: notBefore } });
    })();
  }

  /** The renewed certificate `serial` was used: the floor rises to it. False when it is not the node's renewed one. */
  retireSuperseded(node: string, serial: string, at: string): boolean {
    return this.#floorRetire.run(at, node, serial).changes === 1;
  }

  create(t: NewEnrollmentToken, who: string, at: string): EnrollmentTokenRecord {
    return this.#db.transaction(() => {
      this.#insert.run(t.id, t.tokenHash, t.node, JSON.stringify(t.dns), JSON.stringify(t.ips), at, who, t.expiresAt);
      this.#audit({
        at,
        who,
        action: 'enrollment_token.create',
        target: t.id,
        detail: { node: t.node, dns: t.dns, ips: t.ips, expires_at: t.expiresAt },
      });
      return tokenRecord(this.#byId.get(t.id) as TokenRow);
    })();
  }

  list(): EnrollmentTokenRecord[] {
    return (this.#list.all() as TokenRow[]).map(tokenRecord);
  }

  /** Undefined when there is no such token; revoking twice changes nothing the second time. */
  revoke(id: string, who: string, at: string): EnrollmentTokenRecord | undefined {
    return this.#db.transaction(() => {
      const row = this.#byId.get(id) as TokenRow | undefined;
      if (!row) return undefined;
      if (this.#revoke.run(at, id).changes === 1)
        this.#audit({ at, who, action: 'enrollment_token.revoke', target: id, detail: { node: row.node } });
      return tokenRecord(this.#byId.get(id) as TokenRow);
    })();
  }

  consume(tokenHash: string, node: string, usedBy: string, at: string): ConsumeResult {
    return this.#db.transaction((): ConsumeResult => {
      const row = this.#byHash.get(tokenHash) as TokenRow | undefined;
      if (!row) return { ok: false, reason: 'unknown' };
      if (this.#use.run(at, usedBy, tokenHash, at, node).changes !== 1) {
        if (row.revoked_at !== null) return { ok: false, reason: 'revoked' };
        if (row.used_at !== null) return { ok: false, reason: 'used' };
        if (row.expires_at <= at) return { ok: false, reason: 'expired' };
        return { ok: false, reason: 'wrong_node' };
      }
      this.#audit({ at, who: usedBy, action: 'enrollment_token.use', target: row.id, detail: { node } });
      return { ok: true, token: tokenRecord(this.#byHash.get(tokenHash) as TokenRow) };
    })();
  }

  certificate(node: string): NodeCertificateRecord | undefined {
    const r = this.#certGet.get(node) as CertRow | undefined;
    return r ? certRecord(r) : undefined;
  }

  /** Records a certificate seen or issued; an issue gets its audit row. */
  noteCertificate(node: string, c: SeenCertificate, who: string, at: string): void {
    this.#db.transaction(() => {
      if (c.issued) {
        this.#certIssued.run(node, c.serial, c.notBefore, c.notAfter, at, at);
        this.#audit({
          at,
          who,
          action: 'certificate.issue',
          target: node,
          detail: { serial: c.serial, not_after: c.notAfter },
        });
      } else {
        const have = this.#certGet.get(node) as CertRow | undefined;
        if (have?.serial === c.serial) return;
        this.#certSeen.run(node, c.serial, c.notBefore, c.notAfter);
      }
    })();
  }

  /** Counts a failed renewal: at least `reported` failures (the agent's own count), one more than known otherwise. */
  noteRenewalFailure(node: string, code: string, reported: number, at: string): void {
    this.#certFailed.run(reported, code, at, node);
  }
}
