/**
 * The stored shapes of enrolment (docs/adding-nodes.md): join tokens (only the SHA-256 of the secret is
 * kept) and what the controller knows of each node's certificate and its renewal. Every store
 * (SQLite, PostgreSQL) returns these.
 */

export interface NewEnrollmentToken {
  /** Public id (list, revoke). */
  id: string;
  /** Lowercase hex SHA-256 of the whole token string. */
  tokenHash: string;
  node: string;
  dns: string[];
  ips: string[];
  /** ISO 8601 */
  expiresAt: string;
}

export interface EnrollmentTokenRecord {
  id: string;
  node: string;
  dns: string[];
  ips: string[];
  createdAt: string;
  createdBy: string;
  expiresAt: string;
  usedAt: string | null;
  /** Who used it: the SPIFFE id issued and the source address. */
  usedBy: string | null;
  revokedAt: string | null;
}

/** Why a token was not consumed; the caller logs it, the client sees only `enrollment_refused`. */
export type TokenRefusal = 'unknown' | 'used' | 'revoked' | 'expired' | 'wrong_node';

export type ConsumeResult = { ok: true; token: EnrollmentTokenRecord } | { ok: false; reason: TokenRefusal };

export interface NodeCertificateRecord {
  node: string;
  /** Lowercase hex. */
  serial: string;
  notBefore: string;
  notAfter: string;
  /** When this controller issued it; null when it was made elsewhere (the CA host). */
  issuedAt: string | null;
  renewalFailures: number;
  lastRenewalError: string | null;
  lastRenewalAttemptAt: string | null;
}

/** A certificate the controller saw or issued. */
export interface SeenCertificate {
  serial: string;
  notBefore: string;
  notAfter: string;
  /** True when this controller issued it now (resets the failure count). */
  issued: boolean;
}

/**
 * A node's identity floor (docs/certificates-over-time.md, "Revoking a node"): every certificate
 * of `agent/<node>` whose notBefore is earlier than `notBefore` is refused, whatever issued it.
 * Kept after the node is deleted, so a certificate of a deleted node stays refused if a node of
 * that name is added again.
 */
export interface IdentityFloorRecord {
  node: string;
  /** ISO 8601. */
  notBefore: string;
  /** The certificate the last renewal issued, not used yet: its first use raises the floor to `renewedNotBefore`. */
  renewedSerial: string | null;
  renewedNotBefore: string | null;
}

/** Why a node's floor is raised: an operator revoked it, or a renewal superseded its certificates. */
export type FloorReason = 'revoke' | 'renewal';

// ---- rows as both stores keep them (controller/store/sqlite/enrollment.ts, controller/store/pg/enrollment.ts) -------------------

/** JSON arrays as text, times as ISO 8601 text. */
export interface TokenRow {
  id: string;
  /** Read only where it is compared (never returned). */
  token_hash?: string;
  node: string;
  dns: string;
  ips: string;
  created_at: string;
  created_by: string;
  expires_at: string;
  used_at: string | null;
  used_by: string | null;
  revoked_at: string | null;
}

export interface CertRow {
  node: string;
  serial: string;
  not_before: string;
  not_after: string;
  issued_at: string | null;
  renewal_failures: number;
  last_renewal_error: string | null;
  last_renewal_attempt_at: string | null;
}

export interface FloorRow {
  node: string;
  not_before: string;
  renewed_serial: string | null;
  renewed_not_before: string | null;
}

export function floorRecord(r: FloorRow): IdentityFloorRecord {
  return {
    node: r.node,
    notBefore: r.not_before,
    renewedSerial: r.renewed_serial,
    renewedNotBefore: r.renewed_not_before,
  };
}

export function tokenRecord(r: TokenRow): EnrollmentTokenRecord {
  return {
    id: r.id,
    node: r.node,
    dns: JSON.parse(r.dns) as string[],
    ips: JSON.parse(r.ips) as string[],
    createdAt: r.created_at,
    createdBy: r.created_by,
    expiresAt: r.expires_at,
    usedAt: r.used_at,
    usedBy: r.used_by,
    revokedAt: r.revoked_at,
  };
}

export function certRecord(r: CertRow): NodeCertificateRecord {
  return {
    node: r.node,
    serial: r.serial,
    notBefore: r.not_before,
    notAfter: r.not_after,
    issuedAt: r.issued_at,
    renewalFailures: r.renewal_failures,
    lastRenewalError: r.last_renewal_error,
    lastRenewalAttemptAt: r.last_renewal_attempt_at,
  };
}
