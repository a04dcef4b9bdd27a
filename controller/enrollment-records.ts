/**
 * The stored shapes of enrolment (SPEC §9): join tokens (only the SHA-256 of the secret is
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
