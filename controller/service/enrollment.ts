/**
 * Enrolment and renewal on the controller (docs/adding-nodes.md): join tokens (made, listed, revoked by
 * operators), `POST /v1/enroll` (a token and a CSR, no client certificate) and
 * `POST /v1/nodes/{node}/certificate` (a renewal over mTLS). Certificates are signed by the
 * `--issuer` CA; their identity and SANs are the token's (or the current certificate's),
 * whatever the CSR asks. Every enrolment failure is answered with the same
 * `enrollment_refused`; the error carries the real reason, which the API logs in its summary of
 * refusals before authentication (one line per kind of reason per interval, with a count).
 */
import crypto from 'node:crypto';
import type { Logger } from 'pino';
import type { ReadCsr } from '../../certs/csr-verify.js';
import { normalizeSerial, type CertIdentity } from '../../certs/identity.js';
import type { LoadedIssuer } from '../../certs/pki.js';
import type { PkiMaterial } from '../../certs/tls.js';
import { expandedIp, parseIp } from '../../protocol/address.js';
import type { CertificateBundle, EnrollmentTokenView, NodeCertificateView } from '../../protocol/enroll.js';
import { renewAtMs, renewalState } from '../../protocol/enroll.js';
import { codeOf, ERROR_CODES, HeraldError, isErrorCode } from '../../protocol/errors.js';
import { isValidName, spiffeIdOf } from '../../protocol/identity.js';
import {
  JOIN_TOKEN_SECRET_BYTES,
  JOIN_TOKEN_TTL_S,
  MAX_JOIN_TOKEN_TTL_S,
  RENEWAL_MIN_INTERVAL_FRACTION,
} from '../../protocol/limits.js';
import { identityKey } from '../../certs/revoked.js';
import type { IdentityFloors } from './identity-floors.js';
import type { EnrollmentTokenRecord, NodeCertificateRecord, TokenRefusal } from '../store/enrollment-records.js';
import { EnrollReplay } from './enroll-replay.js';
import type { Store } from '../store/store.js';

/** Prefix of every join token, so one is recognisable in a config file or a leak scanner. */
export const JOIN_TOKEN_PREFIX = 'hj1.';
const DNS_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;
const MAX_SANS = 16;
/** The most an issued certificate is backdated for clock skew (as certs/pki.ts CERT_BACKDATE_MS). */
const MAX_BACKDATE_MS = 5 * 60_000;

export interface EnrollmentOptions {
  store: Store;
  /** The `--issuer` CA; undefined: enrolment and renewal answer `enrollment_disabled`. */
  issuer: LoadedIssuer | undefined;
  /** The controller's material: ca.crt, the JWKS and revoked.json handed to enrolled nodes. */
  material: PkiMaterial;
  /** `--agent-cert-lifetime`. */
  agentCertLifetimeS: number;
  logger: Logger;
  now?: () => number;
  /** Node revocation and the retirement of superseded certificates (identity-floors.ts). */
  floors?: IdentityFloors | undefined;
}

/** `renewal_too_soon`, with the seconds after which a renewal is taken again (the API's Retry-After). */
export class RenewalTooSoon extends HeraldError {
  readonly retryAfterS: number;
  constructor(retryAfterS: number) {
    super('renewal_too_soon', `this node renewed its certificate lately; retry after ${retryAfterS} s`);
    this.retryAfterS = retryAfterS;
  }
}

/**
 * Why an enrolment was refused, as a closed set: the key of the refusal summary, which a peer
 * must not be able to vary at will (protocol/refusal-summary.ts).
 */
export type EnrollRefusalKind = 'malformed' | 'bad_csr' | 'bad_key' | CsrMismatch['kind'] | `token_${TokenRefusal}`;

/** The one answer to every failed enrolment; `reason` and `fields` are for the log only. */
export class EnrollmentRefused extends HeraldError {
  constructor(
    readonly kind: EnrollRefusalKind = 'malformed',
    readonly reason: string = 'malformed request',
    readonly fields: Record<string, unknown> = {},
  ) {
    super('enrollment_refused', ERROR_CODES.enrollment_refused);
  }
}

/** Hex SHA-256 of a join token: what the store keeps and looks up. */
export function tokenHash(token: string): string {
  return crypto.createHash('sha256').update(token, 'utf8').digest('hex');
}

export class Enrollment {
  readonly #o: EnrollmentOptions;
  readonly #now: () => number;
  readonly #log: Logger;
  /** Answers a node whose answer was lost can ask for again (controller/service/enroll-replay.ts). */
  readonly #replay: EnrollReplay;

  constructor(o: EnrollmentOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
    this.#log = o.logger;
    this.#replay = new EnrollReplay(this.#now);
  }

  get enabled(): boolean {
    return this.#o.issuer !== undefined;
  }

  // ---- join tokens (operators) -------------------------------------------------------------

  /**
   * `POST /v1/enrollment-tokens` `{"node","ttl_s"?,"ips"?,"dns"?}`: the token is in this answer
   * only. @throws HeraldError `invalid_request`/`bad_name` (with `field`), `enrollment_disabled`
   */
  async createToken(body: unknown, who: string): Promise<EnrollmentTokenView & { token: string }> {
    this.#requireIssuer();
    const b = objectBody(body);
    const node = b.node;
    if (typeof node !== 'string' || !isValidName(node))
      throw new HeraldError('bad_name', 'node must match ^[a-z0-9][a-z0-9._-]{0,62}$', { field: 'node' });
    const ttl = b.ttl_s ?? JOIN_TOKEN_TTL_S;
    if (typeof ttl !== 'number' || !Number.isInteger(ttl) || ttl < 1 || ttl > MAX_JOIN_TOKEN_TTL_S)
      throw new HeraldError(
        'invalid_request',
        `ttl_s must be a whole number of seconds from 1 to ${MAX_JOIN_TOKEN_TTL_S}`,
        {
          field: 'ttl_s',
        },
      );
    const ips = sanList(b.ips, 'ips', (s) => expandedIp(s) ?? undefined);
    const dns = sanList(b.dns, 'dns', (s) => (DNS_RE.test(s.toLowerCase()) ? s.toLowerCase() : undefined));
    const token = JOIN_TOKEN_PREFIX + crypto.randomBytes(JOIN_TOKEN_SECRET_BYTES).toString('base64url');
    const rec = await this.#o.store.createEnrollmentToken(
      {
        id: crypto.randomBytes(8).toString('hex'),
        tokenHash: tokenHash(token),
        node,
        dns,
        ips,
        expiresAt: new Date(this.#now() + ttl * 1000).toISOString(),
      },
      who,
    );
    this.#log.info(
      { event: 'enrollment_token.create', id: rec.id, node, expires_at: rec.expiresAt, who },
      'join token made',
    );
    return { token, ...this.#tokenView(rec) };
  }

  async listTokens(): Promise<EnrollmentTokenView[]> {
    return (await this.#o.store.listEnrollmentTokens()).map((r) => this.#tokenView(r));
  }

  /** @throws HeraldError `not_found` */
  async revokeToken(id: string, who: string): Promise<EnrollmentTokenView> {
    const rec = await this.#o.store.revokeEnrollmentToken(id, who);
    this.#log.info({ event: 'enrollment_token.revoke', id, node: rec.node, who }, 'join token revoked');
    return this.#tokenView(rec);
  }

  // ---- enrolment (no client certificate) ---------------------------------------------------

  /**
   * `POST /v1/enroll` `{"token","node","csr"}` from `remote`.
   * @throws EnrollmentRefused for every refusal (the reason is logged), HeraldError
   *   `enrollment_disabled` without an issuer
   */
  async enroll(body: unknown, remote: string): Promise<CertificateBundle> {
    const issuer = this.#requireIssuer();
    const b =
      body !== null && typeof body === 'object' && !Array.isArray(body) ? (body as Record<string, unknown>) : {};
    const node = typeof b.node === 'string' && isValidName(b.node) ? b.node : undefined;
    const refuse = (kind: EnrollRefusalKind, reason: string, extra: Record<string, unknown> = {}): never => {
      throw new EnrollmentRefused(kind, reason, { remote, node: node ?? null, ...extra });
    };
    if (node === undefined) return refuse('malformed', 'malformed request: node is not a valid name');
    if (typeof b.token !== 'string' || b.token.length === 0 || b.token.length > 256)
      return refuse('malformed', 'malformed request: no token');
    let csr: ReadCsr;
    try {
      csr = (await forgeParts()).readCsr(b.csr);
    } catch (err) {
      return refuse(codeOf(err) === 'bad_key' ? 'bad_key' : 'bad_csr', `bad CSR: ${(err as Error).message}`);
    }
    const spiffeId = spiffeIdOf(this.#trustDomain(), 'agent', node);
    const hash = tokenHash(b.token);
    const keySha256 = crypto
      .createHash('sha256')
      .update(crypto.createPublicKey(csr.publicKeyPem).export({ type: 'spki', format: 'der' }))
      .digest('hex');
    const again = this.#replay.find(hash, node, keySha256);
    if (again !== undefined) {
      const bundle = await again.answer;
      this.#log.info(
        { event: 'enroll.replayed', node, token: again.tokenId, remote },
        'enrolment asked again with its key: same certificate',
      );
      return bundle;
    }
    // the secret is never compared: its SHA-256 is looked up (an equal hash is an equal token)
    const used = await this.#o.store.consumeEnrollmentToken(hash, node, `${spiffeId} from ${remote}`);
    if (!used.ok) return refuse(`token_${used.reason}`, TOKEN_REASONS[used.reason]);
    const token = used.token;
    const wrong = csrMismatch(csr, spiffeId, node, token.dns, token.ips);
    if (wrong) return refuse(wrong.kind, `${wrong.why} (the token ${token.id} is spent)`, { token: token.id });
    const issued = this.#issue(issuer, node, token.dns, token.ips, csr.publicKeyPem, spiffeId);
    this.#replay.remember(hash, node, keySha256, token.id, issued);
    const bundle = await issued;
    this.#log.info(
      { event: 'enroll.issued', node, token: token.id, remote, not_after: bundle.not_after },
      'node enrolled',
    );
    return bundle;
  }

  // ---- renewal (mTLS with the current certificate) -----------------------------------------

  /**
   * `POST /v1/nodes/{node}/certificate` `{"csr","failed_attempts"?,"last_error"?}` from the node's
   * agent (the API checked the caller is it).
   * @param currentKey the SPKI DER of the certificate the caller presented
   * Only a node that exists renews, at most once per RENEWAL_MIN_INTERVAL_FRACTION of the
   * certificate lifetime; the certificates before the presented one are then refused, and the
   * presented one once the new one is used (identity-floors.ts).
   * @throws HeraldError `bad_csr`, `invalid_request`, `enrollment_disabled`, `node_deleted`,
   *   `not_found`, `renewal_too_soon` (RenewalTooSoon)
   */
  async renew(node: string, body: unknown, identity: CertIdentity, currentKey: Buffer): Promise<CertificateBundle> {
    await this.noteSeen(identity);
    const b = objectBody(body);
    const reported =
      typeof b.failed_attempts === 'number' && Number.isInteger(b.failed_attempts) ? b.failed_attempts : 0;
    const fail = async (err: HeraldError): Promise<never> => {
      await this.#o.store.noteRenewalFailure(node, err.code, Math.max(0, Math.min(reported, 1_000_000)));
      this.#log.warn(
        { event: 'renew.refused', code: err.code, node, reason: err.message, failed_attempts: reported },
        'certificate renewal refused',
      );
      throw err;
    };
    let issuer: LoadedIssuer;
    try {
      issuer = this.#requireIssuer();
    } catch (err) {
      return fail(err as HeraldError);
    }
    let csr: ReadCsr;
    try {
      csr = (await forgeParts()).readCsr(b.csr);
    } catch (err) {
      return fail(err instanceof HeraldError ? err : new HeraldError('bad_csr', String(err)));
    }
    const dns = identity.dns.map((d) => d.toLowerCase());
    const ips = identity.ips.map((i) => expandedIp(i) ?? i);
    const wrong = csrMismatch(csr, identity.spiffeId, node, dns, ips);
    if (wrong) return fail(new HeraldError('bad_csr', wrong.why));
    const requested = crypto.createPublicKey(csr.publicKeyPem).export({ type: 'spki', format: 'der' });
    if (requested.equals(currentKey))
      return fail(
        new HeraldError('bad_csr', 'the CSR is for the key of the current certificate: renewal needs a new key'),
      );
    const lastError = typeof b.last_error === 'string' && isErrorCode(b.last_error) ? b.last_error : undefined;
    // a certificate outlives its node's deletion, but is not renewed past it
    if ((await this.#o.store.getNode(node)) === undefined)
      return fail(
        (await this.#o.store.isTombstoned(node))
          ? new HeraldError('node_deleted', `node ${node} was deleted: its certificate is not renewed`)
          : new HeraldError('not_found', `no node ${node}: only a node that exists renews its certificate`),
      );
    // one renewal per interval: a stolen certificate cannot mint a fleet of live ones
    const last = (await this.#o.store.getNodeCertificate(node))?.issuedAt;
    const intervalMs = this.#o.agentCertLifetimeS * 1000 * RENEWAL_MIN_INTERVAL_FRACTION;
    const sinceMs = last ? this.#now() - Date.parse(last) : Number.POSITIVE_INFINITY;
    if (sinceMs < intervalMs) return fail(new RenewalTooSoon(Math.max(1, Math.ceil((intervalMs - sinceMs) / 1000))));
    const bundle = await this.#issue(issuer, node, dns, ips, csr.publicKeyPem, identity.spiffeId);
    const made = new crypto.X509Certificate(bundle.certificate);
    await this.#o.floors?.renewed(node, identity, {
      serial: normalizeSerial(made.serialNumber),
      notBefore: new Date(made.validFrom).toISOString(),
    });
    this.#log.info(
      {
        event: 'renew.issued',
        node,
        old_serial: identity.serial,
        not_after: bundle.not_after,
        failed_attempts: reported,
        ...(lastError ? { last_error: lastError } : {}),
      },
      'agent certificate renewed',
    );
    return bundle;
  }

  /** Records the certificate an agent presented (its announcement, its renewal). */
  async noteSeen(identity: CertIdentity): Promise<void> {
    if (identity.role !== 'agent') return;
    await this.#o.store.noteNodeCertificate(
      identity.name,
      {
        serial: identity.serial,
        notBefore: identity.validFrom.toISOString(),
        notAfter: identity.validTo.toISOString(),
        issued: false,
      },
      identity.spiffeId,
    );
  }

  /** The node's certificate and renewal state for `GET /v1/nodes/{id}`; null when unknown. */
  async nodeCertificate(node: string): Promise<NodeCertificateView | null> {
    const r = await this.#o.store.getNodeCertificate(node);
    return r ? certificateView(r, this.#now()) : null;
  }

  // ---- helpers -----------------------------------------------------------------------------

  #requireIssuer(): LoadedIssuer {
    const issuer = this.#o.issuer;
    if (!issuer)
      throw new HeraldError(
        'enrollment_disabled',
        'this controller runs without --issuer: it cannot issue certificates (herald certs issue issuer <name>, then --issuer <name>)',
      );
    // a certificate under a revoked issuer is refused everywhere: issuing one would only hide it
    if (this.#o.material.current().revokedSerials.has(issuer.serial)) {
      this.#log.error(
        { code: 'enrollment_disabled', issuer: issuer.name, serial: issuer.serial },
        'the --issuer CA is revoked: no certificate is issued until the controller runs with a new one',
      );
      throw new HeraldError('enrollment_disabled', `the issuer ${issuer.name} is revoked`);
    }
    return issuer;
  }

  #trustDomain(): string {
    return this.#o.material.current().trustDomain;
  }

  async #issue(
    issuer: LoadedIssuer,
    node: string,
    dns: string[],
    ips: string[],
    publicKeyPem: string,
    who: string,
  ): Promise<CertificateBundle> {
    const now = this.#now();
    const lifetimeMs = this.#o.agentCertLifetimeS * 1000;
    // never under the node's identity floor (a revoked node enrolled again): it would be refused
    const floor = this.#o.material.current().identityFloors.get(identityKey('agent', node)) ?? 0;
    const made = (await forgeParts()).issueWithIssuer({
      issuer,
      role: 'agent',
      name: node,
      dns,
      ip: ips,
      // backdated for clock skew, but by a tenth of a short lifetime at most: the agent renews
      // at two thirds of notBefore..notAfter, which a 5 min backdate would put in the past
      notBefore: new Date(Math.max(floor, now - Math.min(MAX_BACKDATE_MS, lifetimeMs / 10))),
      notAfter: new Date(now + lifetimeMs),
      publicKeyPem,
    });
    const x = new crypto.X509Certificate(made.cert);
    await this.#o.store.noteNodeCertificate(
      node,
      {
        serial: made.serial,
        notBefore: new Date(x.validFrom).toISOString(),
        notAfter: new Date(x.validTo).toISOString(),
        issued: true,
      },
      who,
    );
    const m = this.#o.material.current();
    return {
      node,
      certificate: made.chain,
      ca: m.ca.toString('utf8'),
      jwks: { keys: [...(m.jwks?.keys ?? [])] },
      revoked: { serials: [...m.revokedSerials], kids: [...m.revokedKids] },
      not_after: new Date(x.validTo).toISOString(),
    };
  }

  #tokenView(r: EnrollmentTokenRecord): EnrollmentTokenView {
    const now = new Date(this.#now()).toISOString();
    const state: EnrollmentTokenView['state'] =
      r.revokedAt !== null ? 'revoked' : r.usedAt !== null ? 'used' : r.expiresAt <= now ? 'expired' : 'active';
    return {
      id: r.id,
      node: r.node,
      dns: r.dns,
      ips: r.ips,
      created_at: r.createdAt,
      created_by: r.createdBy,
      expires_at: r.expiresAt,
      used_at: r.usedAt,
      revoked_at: r.revokedAt,
      state,
    };
  }
}

/** node-forge loads at the first enrolment or renewal, not with every controller. */
async function forgeParts(): Promise<{
  readCsr: typeof import('../../certs/csr-verify.js').readCsr;
  issueWithIssuer: typeof import('../../certs/pki.js').issueWithIssuer;
}> {
  const [{ readCsr }, { issueWithIssuer }] = await Promise.all([
    import('../../certs/csr-verify.js'),
    import('../../certs/pki.js'),
  ]);
  return { readCsr, issueWithIssuer };
}

const TOKEN_REASONS: Record<TokenRefusal, string> = {
  unknown: 'unknown token',
  used: 'token already used',
  revoked: 'token revoked',
  expired: 'token expired',
  wrong_node: 'token made for another node',
};

/**
 * Why a CSR asks for more than `spiffeId` with these SANs (undefined: it does not). It may ask
 * for less: the certificate carries the allowed SANs anyway.
 */
interface CsrMismatch {
  kind: 'csr_other_identity' | 'csr_other_sans';
  why: string;
}

function csrMismatch(
  csr: ReadCsr,
  spiffeId: string,
  node: string,
  dns: string[],
  ips: string[],
): CsrMismatch | undefined {
  const identity = (why: string): CsrMismatch => ({ kind: 'csr_other_identity', why });
  const sans = (why: string): CsrMismatch => ({ kind: 'csr_other_sans', why });
  const otherUri = csr.uris.find((u) => u !== spiffeId);
  if (otherUri !== undefined) return identity(`the CSR asks for another identity (${otherUri.slice(0, 120)})`);
  if (csr.commonName !== undefined && csr.commonName !== node)
    return identity(`the CSR asks for another identity (CN ${csr.commonName.slice(0, 64)})`);
  const otherDns = csr.dns.find((d) => !dns.includes(d));
  if (otherDns !== undefined) return sans(`the CSR asks for other SANs (DNS ${otherDns.slice(0, 120)})`);
  const otherIp = csr.ips.find((i) => !ips.includes(i));
  if (otherIp !== undefined) return sans(`the CSR asks for other SANs (IP ${otherIp})`);
  return undefined;
}

function certificateView(r: NodeCertificateRecord, nowMs: number): NodeCertificateView {
  const from = Date.parse(r.notBefore);
  const to = Date.parse(r.notAfter);
  return {
    serial: r.serial,
    not_before: r.notBefore,
    not_after: r.notAfter,
    renew_at: new Date(renewAtMs(from, to)).toISOString(),
    renewal: renewalState(from, to, nowMs),
    issued_at: r.issuedAt,
    renewal_failures: r.renewalFailures,
    last_renewal_error: r.lastRenewalError,
    last_renewal_attempt_at: r.lastRenewalAttemptAt,
  };
}

function objectBody(body: unknown): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw new HeraldError('invalid_request', 'the body must be a JSON object');
  return body as Record<string, unknown>;
}

function sanList(v: unknown, field: string, norm: (s: string) => string | undefined): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || v.length > MAX_SANS)
    throw new HeraldError('invalid_request', `${field} must be a list of at most ${MAX_SANS} strings`, { field });
  const out: string[] = [];
  v.forEach((x, i) => {
    const n = typeof x === 'string' && x.length <= 253 ? norm(x.trim()) : undefined;
    if (n === undefined || (field === 'ips' && parseIp(String(x).trim()) === null))
      throw new HeraldError(
        'invalid_request',
        `${field}[${i}] is not a valid ${field === 'ips' ? 'IP address' : 'DNS name'}`,
        {
          field: `${field}.${i}`,
        },
      );
    if (!out.includes(n)) out.push(n);
  });
  return out;
}
