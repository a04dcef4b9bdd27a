/**
 * The TLS helper every listener and dialer uses (docs/configuration.md): the party's own PKI material, watched
 * and reloaded from disk; server and client options for TLS 1.3 mutual authentication; and
 * `authorizePeer`, the one function that decides whether a peer certificate may talk to us.
 *
 * Servers request a client certificate without letting OpenSSL reject it
 * (`rejectUnauthorized: false`), so the refusal can be answered with a code at the HTTP or
 * WebSocket layer; `authorizePeer` then checks the chain result, dates, revocation and identity
 * on every connection, resumed TLS sessions included (they skip verification).
 */
import crypto from 'node:crypto';
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import type net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { codeOf, ConfigError, HeraldError, RefusalError, type ErrorCode } from '../protocol/errors.js';
import { API_KEEP_ALIVE_TIMEOUT_MS } from '../protocol/limits.js';
import type { Role } from '../protocol/identity.js';
import { describeExpectedServer, isExpectedServer, type ExpectedServer } from './expected-server.js';
import { checkChain, leafRoleAllowed, MAX_REMEMBERED_ISSUERS, presentedAbove } from './chain.js';
import { identityOf, normalizeSerial, type CertIdentity } from './identity.js';
import { identityKey, parseRevoked } from './revoked.js';
import { belowIdentityFloor, peerOf, TlsSessionStore, type SessionPeer } from './session-store.js';
import { tlsCodeOf } from './tls-codes.js';
import { x509Of } from './x509-parse.js';

/** Quiet time after the last file event before the material is re-read. */
export const RELOAD_DEBOUNCE_MS = 50;

export interface Logger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

const stderrLogger: Logger = {
  info: () => {},
  warn: (obj, msg) => process.stderr.write(`herald: warning: ${msg ?? ''} ${JSON.stringify(obj, errReplacer)}\n`),
  error: (obj, msg) => process.stderr.write(`herald: error: ${msg ?? ''} ${JSON.stringify(obj, errReplacer)}\n`),
};
function errReplacer(_k: string, v: unknown): unknown {
  return v instanceof Error ? { message: v.message, code: (v as { code?: unknown }).code } : v;
}

export interface PkiMaterialOptions {
  caPath: string;
  certPath: string;
  keyPath: string;
  revokedPath: string;
  /** The trusted signing keys; agents need it, operators do not. */
  jwksPath?: string | undefined;
  trustDomain: string;
  /** pino-like; default writes warnings and errors to stderr. */
  logger?: Logger | undefined;
  /** Default RELOAD_DEBOUNCE_MS. */
  debounceMs?: number | undefined;
  /** Watch the files' directories (default true); tests may call reload() instead. */
  watch?: boolean | undefined;
  /**
   * Called with each file's path after it is read and before its content is used, at start and
   * at every reload; throws to refuse the file (an agent running as root: agent/root-owned.ts).
   * At start the refusal is thrown as is; at a reload the file keeps its last good content.
   */
  checkFile?: ((file: string) => void) | undefined;
}

/** The parsed JWKS as read from disk; its keys are checked by protocol/, not here. */
export interface JwksJson {
  keys: Array<Record<string, unknown>>;
}

export interface MaterialSnapshot {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  /** Every certificate in the CA file (several during a CA rotation). */
  caCerts: readonly crypto.X509Certificate[];
  /** Lowercase hex. */
  revokedSerials: ReadonlySet<string>;
  revokedKids: ReadonlySet<string>;
  /**
   * Revoked identities, by `role/name`: a certificate of one whose notBefore (ms) is earlier is
   * refused. revoked.json's `identities` and `setIdentityFloors` (the controller's database)
   * together, the later floor winning.
   */
  identityFloors: ReadonlyMap<string, number>;
  jwks: JwksJson | undefined;
  trustDomain: string;
  /** Our own identity, read from our certificate. */
  identity: CertIdentity;
}

interface TlsPart {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  caCerts: crypto.X509Certificate[];
  identity: CertIdentity;
}
interface RevokedPart {
  raw: Buffer | undefined;
  serials: Set<string>;
  kids: Set<string>;
  floors: Map<string, number>;
}
interface JwksPart {
  raw: Buffer | undefined;
  jwks: JwksJson | undefined;
}

export interface ReloadResult {
  tls: boolean;
  revoked: boolean;
  jwks: boolean;
}

/**
 * A party's PKI material, kept current from disk. Watches the files' directories (a watch on a
 * file stops after its first atomic replace); a file that fails to load keeps the last good
 * content and is logged. A new certificate is taken only once it matches the key, so renewing
 * the two files one after the other never serves a mismatched pair.
 *
 * Events: `'tls-change'` (snapshot) when ca, cert or key changed; `'revoked-change'`
 * (serials, kids); `'jwks-change'` (jwks); `'load-error'` ({ file, error }) when a changed file
 * was refused.
 */
export class PkiMaterial extends EventEmitter {
  readonly options: Readonly<PkiMaterialOptions>;
  #log: Logger;
  #tls: TlsPart;
  #revoked: RevokedPart;
  #jwks: JwksPart;
  /** Floors given by `setIdentityFloors`, beside revoked.json's. */
  #extraFloors: ReadonlyMap<string, number> = new Map();
  #snapshot: MaterialSnapshot;
  #watchers: fs.FSWatcher[] = [];
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  /** Issuers whose chains passed a full check, by SHA-256 fingerprint (oldest first). */
  #issuers = new Map<string, crypto.X509Certificate>();

  /**
   * Loads every file at once.
   * @throws ConfigError `pki_missing` when the CA, certificate, key (or a given JWKS) is
   *   missing; `bad_option` when one does not parse, the key does not match the certificate,
   *   revoked.json is malformed, or the certificate is not a valid Herald identity
   */
  constructor(options: PkiMaterialOptions) {
    super();
    this.options = { debounceMs: RELOAD_DEBOUNCE_MS, watch: true, ...options };
    this.#log = options.logger ?? stderrLogger;
    try {
      this.#tls = this.#loadTls();
      this.#revoked = this.#loadRevoked(undefined);
      this.#jwks = this.#loadJwks(undefined);
    } catch (err) {
      if (err instanceof ConfigError) throw err;
      if (err instanceof HeraldError && err.code === 'pki_missing')
        throw new ConfigError(err.message, { cause: err, code: 'pki_missing' });
      throw new ConfigError(err instanceof Error ? err.message : String(err), { cause: err });
    }
    this.#snapshot = this.#makeSnapshot();
    if (this.options.watch) this.#watch();
  }

  /**
   * Revoked identities from elsewhere than revoked.json (the controller's database), `role/name`
   * -> floor in ms; replaces the previous set. Emits `'revoked-change'` when it changed, so live
   * connections of a newly revoked identity are closed as for a serial.
   */
  setIdentityFloors(floors: ReadonlyMap<string, number>): void {
    const prev = this.#extraFloors;
    if (prev.size === floors.size && [...floors].every(([k, v]) => prev.get(k) === v)) return;
    this.#extraFloors = new Map(floors);
    this.#snapshot = this.#makeSnapshot();
    this.emit('revoked-change', this.#snapshot.revokedSerials, this.#snapshot.revokedKids);
  }

  /** The current material: an immutable snapshot, replaced (never mutated) on change. */
  current(): MaterialSnapshot {
    return this.#snapshot;
  }

  /**
   * Re-reads every file now, emits the change events and returns what changed. A file that
   * fails keeps its last good content (logged, and `'load-error'` emitted).
   */
  reload(): ReloadResult {
    const result: ReloadResult = { tls: false, revoked: false, jwks: false };
    if (this.#closed) return result;
    try {
      const t = this.#loadTls();
      if (!t.ca.equals(this.#tls.ca) || !t.cert.equals(this.#tls.cert) || !t.key.equals(this.#tls.key)) {
        if (t.identity.spiffeId !== this.#tls.identity.spiffeId) {
          throw new HeraldError(
            'bad_identity',
            `the new certificate is ${t.identity.spiffeId}, not ${this.#tls.identity.spiffeId}`,
          );
        }
        this.#tls = t;
        result.tls = true;
      }
    } catch (err) {
      this.#loadError(this.options.certPath, err);
    }
    try {
      const r = this.#loadRevoked(this.#revoked);
      if (r !== this.#revoked) {
        this.#revoked = r;
        result.revoked = true;
      }
    } catch (err) {
      this.#loadError(this.options.revokedPath, err);
    }
    try {
      const j = this.#loadJwks(this.#jwks);
      if (j !== this.#jwks) {
        this.#jwks = j;
        result.jwks = true;
      }
    } catch (err) {
      this.#loadError(this.options.jwksPath ?? '', err);
    }
    if (result.tls || result.revoked || result.jwks) {
      this.#snapshot = this.#makeSnapshot();
      if (result.tls) {
        this.#log.info(
          { serial: this.#tls.identity.serial, spiffeId: this.#tls.identity.spiffeId },
          'TLS material reloaded',
        );
        this.emit('tls-change', this.#snapshot);
      }
      if (result.revoked) {
        this.#log.info({ serials: this.#revoked.serials.size, kids: this.#revoked.kids.size }, 'revoked.json reloaded');
        this.emit('revoked-change', this.#snapshot.revokedSerials, this.#snapshot.revokedKids);
      }
      if (result.jwks) {
        this.#log.info({ keys: this.#jwks.jwks?.keys.length ?? 0 }, 'JWKS reloaded');
        this.emit('jwks-change', this.#snapshot.jwks);
      }
    }
    return result;
  }

  /**
   * Remembers an issuer certificate that passed `checkChain`, so a resumed TLS session (which
   * shows the leaf but not the chain) can still be checked against it, revocation included.
   * It is re-checked against the current CA at every use. Keeps MAX_REMEMBERED_ISSUERS.
   */
  rememberIssuer(x: crypto.X509Certificate): void {
    const key = x.fingerprint256;
    if (this.#issuers.has(key)) return;
    this.#issuers.set(key, x);
    if (this.#issuers.size > MAX_REMEMBERED_ISSUERS) this.#issuers.delete(this.#issuers.keys().next().value!);
  }

  /** The issuers `rememberIssuer` kept. */
  rememberedIssuers(): Iterable<crypto.X509Certificate> {
    return this.#issuers.values();
  }

  /** Stops watching. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    for (const w of this.#watchers) w.close();
    this.#watchers = [];
  }

  #loadError(part: string, err: unknown): void {
    // a refusal names its own file (the CA, say, while reloading the certificate and key)
    const named = (err as { path?: unknown }).path;
    const file = typeof named === 'string' ? named : part;
    if (err instanceof KeyMismatchError) {
      // usual mid-renewal (key and certificate are replaced one after the other): the second
      // replace triggers another reload
      this.#log.warn({ file, err }, 'key and certificate do not match (yet); keeping the last good pair');
    } else {
      this.#log.error({ file, code: codeOf(err), err }, 'PKI file not loaded; keeping the last good content');
    }
    this.emit('load-error', { file, error: err });
  }

  #watch(): void {
    const o = this.options;
    const files = [o.caPath, o.certPath, o.keyPath, o.revokedPath, ...(o.jwksPath ? [o.jwksPath] : [])];
    for (const dir of new Set(files.map((f) => path.dirname(path.resolve(f))))) {
      try {
        // any event in the directory: atomic replaces show up under temp names, symlink swaps
        // (Kubernetes' ..data) under neither name; reload() compares contents anyway
        const w = fs.watch(dir, { persistent: false }, () => this.#schedule());
        w.on('error', (err) => this.#log.error({ dir, err }, 'watching the PKI directory failed'));
        this.#watchers.push(w);
      } catch (err) {
        this.#log.error({ dir, err }, 'cannot watch the PKI directory; changes need a restart');
      }
    }
  }

  #schedule(): void {
    if (this.#closed) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.reload(), this.options.debounceMs);
    this.#timer.unref();
  }

  #loadTls(): TlsPart {
    const o = this.options;
    const ca = this.#read(o.caPath, 'CA certificate');
    const cert = this.#read(o.certPath, 'certificate');
    const key = this.#read(o.keyPath, 'private key');
    const caCerts = splitPemCertificates(ca, o.caPath);
    let x: crypto.X509Certificate;
    let k: crypto.KeyObject;
    try {
      x = new crypto.X509Certificate(cert);
    } catch (err) {
      throw new HeraldError('bad_option', `${o.certPath} is not a PEM certificate`, { cause: err });
    }
    try {
      k = crypto.createPrivateKey(key);
    } catch (err) {
      throw new HeraldError('bad_option', `${o.keyPath} is not a PEM private key`, { cause: err });
    }
    if (!x.checkPrivateKey(k)) throw new KeyMismatchError(`${o.keyPath} does not match ${o.certPath}`);
    const identity = identityOf(x, o.trustDomain);
    // a certificate made by a Herald issuer comes with it in the same file (leaf first)
    const above = splitPemCertificates(cert, o.certPath).slice(1);
    const chained = checkChain(x, above, {
      roots: caCerts,
      trustDomain: o.trustDomain,
      revokedSerials: new Set(),
      now: Date.now(),
    });
    if (!chained.ok && chained.code !== 'certificate_expired') {
      this.#log.warn(
        { cert: o.certPath, ca: o.caPath },
        'our certificate is not signed by the CA we trust; peers will refuse it',
      );
    }
    return { ca, cert, key, caCerts, identity };
  }

  #loadRevoked(prev: RevokedPart | undefined): RevokedPart {
    const file = this.options.revokedPath;
    let raw: Buffer;
    try {
      raw = fs.readFileSync(file);
    } catch (err) {
      if (prev) throw err;
      this.#log.warn({ file }, 'no revoked.json: no certificate or signing key is revoked');
      return { raw: undefined, serials: new Set(), kids: new Set(), floors: new Map() };
    }
    this.options.checkFile?.(file);
    if (prev?.raw && raw.equals(prev.raw)) return prev;
    const list = parseRevoked(raw, file);
    const floors = new Map(Object.entries(list.identities ?? {}).map(([k, v]) => [k, Date.parse(v)] as const));
    return { raw, serials: new Set(list.serials), kids: new Set(list.kids), floors };
  }

  #loadJwks(prev: JwksPart | undefined): JwksPart {
    const file = this.options.jwksPath;
    if (!file) return prev ?? { raw: undefined, jwks: undefined };
    const raw = this.#read(file, 'JWKS');
    if (prev?.raw && raw.equals(prev.raw)) return prev;
    let j: unknown;
    try {
      j = JSON.parse(raw.toString());
    } catch (err) {
      throw new HeraldError('bad_option', `${file} is not JSON`, { cause: err });
    }
    const keys = (j as { keys?: unknown } | null)?.keys;
    if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'object' && k !== null)) {
      throw new HeraldError('bad_option', `${file} is not a JWKS ({"keys":[..]})`);
    }
    return { raw, jwks: { keys: keys as Array<Record<string, unknown>> } };
  }

  /** Every file is read through here (revoked.json aside, which may be missing): none escapes `checkFile`. */
  #read(file: string, what: string): Buffer {
    const raw = mustRead(file, what);
    this.options.checkFile?.(file);
    return raw;
  }

  #makeSnapshot(): MaterialSnapshot {
    return Object.freeze({
      ca: this.#tls.ca,
      cert: this.#tls.cert,
      key: this.#tls.key,
      caCerts: this.#tls.caCerts,
      revokedSerials: this.#revoked.serials,
      revokedKids: this.#revoked.kids,
      identityFloors: mergeFloors(this.#revoked.floors, this.#extraFloors),
      jwks: this.#jwks.jwks,
      trustDomain: this.options.trustDomain,
      identity: this.#tls.identity,
    });
  }
}

function mergeFloors(a: ReadonlyMap<string, number>, b: ReadonlyMap<string, number>): ReadonlyMap<string, number> {
  if (b.size === 0) return a;
  const out = new Map(a);
  for (const [k, v] of b) out.set(k, Math.max(v, out.get(k) ?? v));
  return out;
}

/**
 * Why a certificate of `identity` (whose notBefore is `validFrom`) stands under its identity's
 * revocation floor, or undefined: a revoked node's every certificate, whatever issued it, and
 * the certificates a renewal superseded (docs/certificates-over-time.md).
 */
export function identityFloorRefusal(
  identity: { role: string; name: string },
  validFrom: Date,
  m: MaterialSnapshot,
): string | undefined {
  const floor = m.identityFloors.get(identityKey(identity.role, identity.name));
  if (floor === undefined || validFrom.getTime() >= floor) return undefined;
  return `the certificates of ${identityKey(identity.role, identity.name)} issued before ${new Date(floor).toISOString()} are revoked`;
}

class KeyMismatchError extends HeraldError {
  constructor(message: string) {
    super('bad_option', message);
  }
}

function mustRead(file: string, what: string): Buffer {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'pki_missing' : 'bad_option';
    throw new HeraldError(code, `cannot read the ${what} ${file}: ${(err as Error).message}`, { cause: err });
  }
}

function splitPemCertificates(pem: Buffer, file: string): crypto.X509Certificate[] {
  const blocks = pem.toString().match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  if (blocks.length === 0) throw new HeraldError('bad_option', `${file} holds no PEM certificate`);
  try {
    return blocks.map((b) => new crypto.X509Certificate(b));
  } catch (err) {
    throw new HeraldError('bad_option', `${file} holds a certificate that does not parse`, { cause: err });
  }
}

// ---- servers ----------------------------------------------------------------------------------

export interface HeraldServerTlsOptions {
  key: Buffer;
  cert: Buffer;
  ca: Buffer;
  requestCert: true;
  rejectUnauthorized: false;
  minVersion: 'TLSv1.3';
  maxVersion: 'TLSv1.3';
}

/**
 * Options for `https.createServer`/`tls.createServer` (and `setSecureContext`). Servers ignore
 * a `secureContext` option, hence key/cert/ca. Every connection must then pass `authorizePeer`.
 */
export function tlsServerOptions(material: PkiMaterial): HeraldServerTlsOptions {
  const m = material.current();
  return {
    key: m.key,
    cert: m.cert,
    ca: m.ca,
    requestCert: true,
    rejectUnauthorized: false,
    minVersion: 'TLSv1.3',
    maxVersion: 'TLSv1.3',
  };
}

/**
 * The TLS session id context of a server that is `spiffeId` (at most 32 bytes): sessions made
 * with that server resume with it alone, and across its restarts (Node's default context is a
 * hash of the process's argv).
 */
export function sessionIdContextOf(spiffeId: string): string {
  return crypto.createHash('sha256').update(`herald-session:${spiffeId}`).digest('hex').slice(0, 32);
}

/**
 * Keeps `server` on the current certificate: a renewed certificate, key or CA is taken by new
 * connections without a restart. `extra` gives options to set with each new context (the API's
 * `ticketKeys`, `sessionTimeout`, `sessionIdContext`: a new context would otherwise fall back
 * to the ones the server was made with). Returns a function that stops following.
 */
export function watchServer(
  server: tls.Server,
  material: PkiMaterial,
  extra: () => tls.SecureContextOptions = () => ({}),
): () => void {
  const onChange = (): void => server.setSecureContext({ ...tlsServerOptions(material), ...extra() });
  material.on('tls-change', onChange);
  return () => material.off('tls-change', onChange);
}

export type AuthorizeResult = { ok: true; identity: CertIdentity } | { ok: false; code: ErrorCode; message: string };

/**
 * THE authorization of a TLS peer, for servers (and for dialers after connect, see
 * `checkServerSocket`): TLS 1.3; a certificate; chained to our CA (re-checked against the
 * current CA, as a resumed session skips verification); within its dates now; serial not
 * revoked; a valid Herald identity of our trust domain whose role is in `want`. A leaf may come
 * through one Herald issuer (docs/adding-nodes.md): the issuer must be unrevoked and the leaf an agent.
 * Synchronous. Codes: `tls_version`, `no_client_certificate`, `untrusted_certificate`,
 * `certificate_expired`, `revoked`, `bad_issuer`, the identity codes of `identityOf`,
 * `wrong_role`.
 */
export function authorizePeer(
  socket: tls.TLSSocket,
  want: Role | readonly Role[],
  material: PkiMaterial,
): AuthorizeResult {
  const protocol = socket.getProtocol();
  if (protocol !== 'TLSv1.3') return refuse('tls_version', `the peer negotiated ${protocol ?? 'no TLS'}, not TLSv1.3`);
  // the first getPeerX509Certificate() of a socket carries the presented chain as parsed
  // objects (`issuerCertificate`); later calls show the leaf alone. Not getPeerCertificate(true):
  // it builds the legacy objects of the whole chain, fingerprints and keys included, and each
  // would be parsed again (~0.5 ms a connection; `npm run bench -- --profile`, fan-out)
  const x = socket.getPeerX509Certificate();
  if (!x) return refuse('no_client_certificate', 'the peer presented no certificate');
  const above = presentedAbove(x);
  if (!socket.authorized) {
    const e = socket.authorizationError as unknown;
    const code = typeof e === 'string' ? e : ((e as { code?: string } | null)?.code ?? String(e));
    if (tlsCodeOf(code) === 'certificate_expired')
      return refuse('certificate_expired', `the certificate is not valid now (${code})`);
    return refuse('untrusted_certificate', `the certificate does not verify against the cluster CA (${code})`);
  }
  return authorizeCertificate(x, want, material, Date.now(), above);
}

/**
 * The checks of `authorizePeer` that need no socket: chain to the current CA (directly or
 * through one Herald issuer, certs/chain.ts), dates now, revocation (of the issuer too),
 * identity and role. For a certificate whose chain OpenSSL has already verified.
 * @param above the certificates the peer sent above the leaf (default: `cert.issuerCertificate`
 *   and up); an issuer remembered from an earlier full handshake is also accepted
 */
export function authorizeCertificate(
  cert: crypto.X509Certificate,
  want: Role | readonly Role[],
  material: PkiMaterial,
  now = Date.now(),
  above: readonly crypto.X509Certificate[] = presentedAbove(cert),
): AuthorizeResult {
  const m = material.current();
  const chain = checkChain(cert, above, {
    roots: m.caCerts,
    trustDomain: m.trustDomain,
    revokedSerials: m.revokedSerials,
    remembered: material.rememberedIssuers(),
    now,
  });
  if (!chain.ok) return chain;
  const from = Date.parse(cert.validFrom);
  const to = Date.parse(cert.validTo);
  if (!(now >= from && now <= to))
    return refuse('certificate_expired', `the certificate is valid from ${cert.validFrom} to ${cert.validTo}`);
  const serial = normalizeSerial(cert.serialNumber);
  if (m.revokedSerials.has(serial)) return refuse('revoked', `serial ${serial} is revoked`);
  let identity: CertIdentity;
  try {
    identity = identityOf(cert, m.trustDomain);
  } catch (err) {
    if (err instanceof HeraldError) return refuse(err.code, err.message);
    throw err;
  }
  const below = identityFloorRefusal(identity, identity.validFrom, m);
  if (below !== undefined) return refuse('revoked', below);
  const underIssuer = leafRoleAllowed(identity.role, chain.issuerName);
  if (underIssuer && !underIssuer.ok) return underIssuer;
  if (chain.issuer) material.rememberIssuer(chain.issuer);
  const roles: readonly Role[] = typeof want === 'string' ? [want] : want;
  if (!roles.includes(identity.role))
    return refuse('wrong_role', `the ${identity.role} role may not use this endpoint (wants ${roles.join(' or ')})`);
  return { ok: true, identity };
}

function refuse(code: ErrorCode, message: string): AuthorizeResult {
  return { ok: false, code, message };
}

// ---- dialers ----------------------------------------------------------------------------------

export interface HeraldClientTlsOptions {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  minVersion: 'TLSv1.3';
  maxVersion: 'TLSv1.3';
  rejectUnauthorized: true;
  checkServerIdentity: (host: string, cert: tls.PeerCertificate) => Error | undefined;
}

export { describeExpectedServer, isExpectedServer, type ExpectedServer } from './expected-server.js';

/**
 * Options for `tls.connect`, `https.request` or a `ws` client dialling `expectedSpiffeId`.
 * The hostname is ignored: the server must present exactly that SPIFFE id (else `wrong_peer`),
 * a valid identity with its role's EKUs, and an unrevoked serial, all checked before a byte is
 * sent. Do not resume TLS sessions with these options alone: Node skips `checkServerIdentity`
 * on a resumed session and a resumed client session does not even show the server's
 * certificate (measured on Node 20), so revocation could not be re-checked. `httpsAgentFor`
 * turns Node's session cache off and resumes only through a `TlsSessionStore`
 * (certs/session-store.ts), whose sessions carry what their full handshake checked; `ws` and a
 * plain `tls.connect` without `session` do not resume.
 */
export function tlsClientOptions(material: PkiMaterial, expectedSpiffeId: ExpectedServer): HeraldClientTlsOptions {
  const m = material.current();
  return {
    ca: m.ca,
    cert: m.cert,
    key: m.key,
    minVersion: 'TLSv1.3',
    maxVersion: 'TLSv1.3',
    rejectUnauthorized: true,
    checkServerIdentity: (_host, cert) => checkServerCertificate(material, expectedSpiffeId, cert),
  };
}

/** What `getPeerCertificate(true)` answers while connectCheckingX509 waits for its check (nothing of it is read). */
const NO_LEGACY_CERTIFICATE = Object.freeze({}) as tls.DetailedPeerCertificate;

/**
 * `tls.connect` whose server check reads the presented chain as X509Certificate objects (the
 * first `getPeerX509Certificate()`: the leaf with its `issuerCertificate`s) instead of the legacy
 * objects Node builds for `checkServerIdentity` on every full handshake: `getPeerCertificate(true)`
 * makes the whole chain with fingerprints, keys and extensions, and was the largest item of a
 * push worker's CPU in a 10,000-agent reconnect storm, and of an agent's polls after a
 * controller restart (`npm run bench -- --profile`). The push dialer and the API client
 * (`resumingConnection`) both dial through here. Node calls it
 * in one place, just before `checkServerIdentity`; that call is answered with an empty object,
 * and the socket's own method answers again at once (on a resumed session, which skips the check,
 * it always does). The override is an own property that is never deleted: deleting a
 * property Node added others after puts the socket's properties in dictionary mode, ~3 KB per
 * push connection (a heap snapshot of a push worker at 10,000 agents). `check` must refuse a
 * missing certificate, and keep what it needs of the certificate: on a client socket Node 20
 * hands the chain over to that first `getPeerX509Certificate()`, and the socket shows no peer
 * certificate after it.
 */
export function connectCheckingX509(
  options: tls.ConnectionOptions,
  check: (cert: crypto.X509Certificate | undefined) => Error | undefined,
): tls.TLSSocket {
  let socket: tls.TLSSocket | undefined;
  let checking = true;
  const s = tls.connect({
    ...options,
    checkServerIdentity: () => {
      checking = false;
      return check(socket?.getPeerX509Certificate());
    },
  });
  socket = s;
  s.getPeerCertificate = function (this: tls.TLSSocket, detailed?: boolean) {
    if (checking && detailed === true && !this.isSessionReused()) return NO_LEGACY_CERTIFICATE;
    return tls.TLSSocket.prototype.getPeerCertificate.call(this, detailed);
  } as tls.TLSSocket['getPeerCertificate'];
  return s;
}

/**
 * `connectCheckingX509` that offers `sessions`' entry for `key` and keeps the sessions the server
 * gives, as `resumingConnection` does for the API client:
 * - a full handshake's sessions are kept with the peer `check` accepted (identity, the serials of
 *   its chain, notAfter), read from the certificate it checked;
 * - a resumed handshake, for which Node 20 runs no check and shows no certificate, inherits the
 *   peer of the session offered (`offer` checked it: unrevoked, unexpired, young enough, the
 *   expected server); one the server resumed unoffered is destroyed;
 * - tickets that arrive before the peer is known wait for it; a handshake that fails after
 *   offering a session drops it (a connection refused or unreachable keeps it).
 * `onPeer` is told the peer either way, before 'secureConnect' is emitted to others.
 */
export function connectResumingX509(
  options: tls.ConnectionOptions,
  sessions: TlsSessionStore,
  key: string,
  expected: ExpectedServer,
  material: PkiMaterial,
  check: (cert: crypto.X509Certificate | undefined) => Error | undefined,
  onPeer: (peer: SessionPeer) => void,
): tls.TLSSocket {
  const epoch = sessions.epoch;
  const stored = sessions.offer(key, expected);
  // the listeners below live as long as the socket: they hold the offered session's peer, never
  // its bytes (the session file keeps those, certs/session-file.ts)
  const offered = stored === undefined ? undefined : peerOf(stored);
  let peer: SessionPeer | undefined;
  const early: Buffer[] = [];
  const known = (p: SessionPeer): void => {
    peer = p;
    onPeer(p);
    for (const t of early.splice(0)) sessions.save(key, p, t, epoch);
  };
  // a socket handed in that is already through to the server (a proxy's tunnel): tls.connect
  // sends its hello at once, so the session goes in its options, not onto the socket after
  const through = options.socket !== undefined && !(options.socket as net.Socket).connecting;
  const socket = connectCheckingX509(through && stored ? { ...options, session: stored.session } : options, (cert) => {
    const err = check(cert);
    if (err !== undefined || cert === undefined) return err;
    const p = sessionPeerOfX509(cert, material);
    if (p === undefined) return new RefusalError('untrusted_certificate', 'the server certificate does not parse');
    known(p);
    return undefined;
  });
  let secured = false;
  if (stored && !through) offerSession(socket, stored.session);
  socket.on('session', (t: Buffer) => {
    if (forgotten.has(socket)) return;
    if (peer) sessions.save(key, peer, t, epoch);
    else early.push(t);
  });
  socket.prependOnceListener('secureConnect', () => {
    secured = true;
    if (!socket.isSessionReused()) return;
    if (offered === undefined) {
      socket.destroy(new RefusalError('untrusted_certificate', 'the server resumed a session that was not offered'));
      return;
    }
    // what `offer` checked, once more: a revocation, an expiry or a clear() (CA or own
    // certificate changed) while this dial was in flight is not seen by the sweeps of live
    // connections, which skip a dial that has no peer yet
    const now = Date.now();
    const m = material.current();
    if (
      sessions.epoch !== epoch ||
      now >= offered.notAfterMs ||
      offered.serials.some((x) => m.revokedSerials.has(x)) ||
      belowIdentityFloor(offered, m.identityFloors) !== undefined
    ) {
      forgotten.add(socket);
      sessions.delete(key);
      socket.destroy(
        new RefusalError('revoked', 'the session offered is no longer good (revoked, expired or cleared)'),
      );
      return;
    }
    resumedVia.set(socket, { sessions, key });
    known(offered);
  });
  // a resumption that failed in its handshake drops its session; a connection that never reached
  // the server (refused, unreachable: a restarting peer) says nothing of the session and keeps it,
  // as does one that completed and failed later (a reset); one whose upgrade the server refused is
  // forgotten by the dialer (`forgetResumedSession`)
  if (offered) {
    let reached = through;
    socket.once('connect', () => {
      reached = true;
    });
    socket.once('close', (hadError) => hadError && reached && !secured && sessions.delete(key));
  }
  return socket;
}

/**
 * Offers `session` on a socket `tls.connect` has just made (its handshake starts once TCP is
 * up), as `tls.connect` itself does with its `session` option, which Node 20 also hands to the
 * socket's constructor: each session (~2 KB then, the peer's certificate in it) was parsed twice,
 * ~15 % of the push worker's time in a 10,000-agent reconnect (`npm run bench -- --profile`).
 */
function offerSession(socket: tls.TLSSocket, session: Buffer): void {
  // the method tls.connect calls for its `session` option (in Node since 0.x; @types/node omits it)
  (socket as unknown as { setSession(s: Buffer): void }).setSession(session);
}

/** The peer record of a server certificate that passed `checkServerCertificate`. */
function sessionPeerOfX509(cert: crypto.X509Certificate, material: PkiMaterial): SessionPeer | undefined {
  let id: CertIdentity;
  try {
    id = identityOf(cert, material.current().trustDomain);
  } catch {
    return undefined;
  }
  const notAfterMs = Date.parse(cert.validTo);
  if (!Number.isFinite(notAfterMs)) return undefined;
  return {
    spiffeId: id.spiffeId,
    role: id.role,
    name: id.name,
    serials: chainSerialsOf(cert, material),
    notAfterMs,
    notBeforeMs: id.validFrom.getTime(),
  };
}

/** The server side of a dial: undefined when `cert` is `expectedSpiffeId`, else a RefusalError. */
export function checkServerCertificate(
  material: PkiMaterial,
  expectedSpiffeId: ExpectedServer,
  cert: tls.PeerCertificate | crypto.X509Certificate,
): RefusalError | undefined {
  const m = material.current();
  let id: CertIdentity;
  try {
    id = identityOf(cert, m.trustDomain);
  } catch (err) {
    if (err instanceof RefusalError) return err;
    return new RefusalError('bad_identity', err instanceof Error ? err.message : String(err), { cause: err });
  }
  if (!isExpectedServer(expectedSpiffeId, id))
    return new RefusalError(
      'wrong_peer',
      `the server is ${id.spiffeId}, not ${describeExpectedServer(expectedSpiffeId)}`.slice(0, 600),
    );
  if (m.revokedSerials.has(id.serial))
    return new RefusalError('revoked', `the server's serial ${id.serial} is revoked`);
  const below = identityFloorRefusal(id, id.validFrom, m);
  if (below !== undefined) return new RefusalError('revoked', below);
  // OpenSSL verified the chain; whether its intermediate (if any) is a Herald issuer, of our
  // trust domain, unrevoked, and allowed to sign this role is ours to check
  const leaf = toX509OrUndefined(cert);
  if (leaf === undefined) return new RefusalError('untrusted_certificate', 'the server certificate does not parse');
  const chain = checkChain(leaf, presentedAbove(cert), {
    roots: m.caCerts,
    trustDomain: m.trustDomain,
    revokedSerials: m.revokedSerials,
    now: Date.now(),
  });
  if (!chain.ok) return new RefusalError(chain.code, chain.message);
  const underIssuer = leafRoleAllowed(id.role, chain.issuerName);
  if (underIssuer && !underIssuer.ok) return new RefusalError(underIssuer.code, underIssuer.message);
  return undefined;
}

function toX509OrUndefined(cert: tls.PeerCertificate | crypto.X509Certificate): crypto.X509Certificate | undefined {
  if (cert instanceof crypto.X509Certificate) return cert;
  try {
    return Buffer.isBuffer(cert.raw) ? x509Of(cert.raw) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The serials a peer's certificate stands on, lowercase hex: its own and, for a leaf made by a
 * Herald issuer, the issuer's (from the presented chain, else one remembered from an earlier
 * full handshake). A live connection is closed when any of them is revoked.
 */
export function chainSerialsOf(cert: tls.PeerCertificate | crypto.X509Certificate, material?: PkiMaterial): string[] {
  const leaf = toX509OrUndefined(cert);
  if (leaf === undefined) return [];
  const serials = [normalizeSerial(leaf.serialNumber)];
  const roots = material?.current().caCerts ?? [];
  const candidates = [...presentedAbove(cert), ...(material?.rememberedIssuers() ?? [])];
  for (const c of candidates) {
    if (c.checkIssued(c) || roots.some((r) => r.fingerprint256 === c.fingerprint256)) continue;
    if (leaf.checkIssued(c) && leaf.verify(c.publicKey)) {
      serials.push(normalizeSerial(c.serialNumber));
      break;
    }
  }
  return serials;
}

/**
 * The first of `chainSerialsOf(cert)` that is revoked now, or the leaf's serial when its identity
 * is revoked since before it was issued (`identityFloorRefusal`); undefined when neither.
 */
export function revokedSerialOf(
  cert: tls.PeerCertificate | crypto.X509Certificate | undefined,
  material: PkiMaterial,
): string | undefined {
  if (cert === undefined) return undefined;
  const m = material.current();
  const serials = chainSerialsOf(cert, material);
  const serial = serials.find((s) => m.revokedSerials.has(s));
  if (serial !== undefined || m.identityFloors.size === 0) return serial;
  const leaf = toX509OrUndefined(cert);
  if (leaf === undefined) return undefined;
  try {
    const id = identityOf(leaf, m.trustDomain);
    return identityFloorRefusal(id, id.validFrom, m) === undefined ? undefined : id.serial;
  } catch {
    return undefined;
  }
}

/**
 * Checks a connected client socket's server with `authorizeCertificate` rules (current CA,
 * dates, revocation) and the expected id, e.g. for a long-lived connection after
 * 'revoked-change'. Undefined when fine. A resumed session shows no certificate on the client:
 * it is checked against the peer its `TlsSessionStore` entry recorded in the full handshake
 * (serials unrevoked now, notAfter not passed, the expected id), and refused when it has none.
 */
export function checkServerSocket(
  socket: tls.TLSSocket,
  material: PkiMaterial,
  expectedSpiffeId: ExpectedServer,
): RefusalError | undefined {
  if (socket.getProtocol() !== 'TLSv1.3')
    return new RefusalError('tls_version', 'the server did not negotiate TLSv1.3');
  // a socket of `resumingConnection` has its peer recorded, resumed or not (after a full handshake
  // the client socket has handed its chain to the check and shows no certificate)
  const recorded = sessionPeers.get(socket);
  if (recorded !== undefined) return checkSessionPeer(recorded, material, expectedSpiffeId);
  const x = socket.getPeerX509Certificate();
  if (!x) {
    const why = socket.isSessionReused()
      ? 'a resumed session does not show the server certificate; dial without session resumption'
      : 'the server presented no certificate';
    return new RefusalError('untrusted_certificate', why);
  }
  const expectedRole =
    typeof expectedSpiffeId === 'string'
      ? (/^spiffe:\/\/[^/]+\/([^/]+)\//.exec(expectedSpiffeId)?.[1] as Role | undefined)
      : 'controller';
  const r = authorizeCertificate(x, expectedRole ? [expectedRole] : [], material);
  if (!r.ok) return new RefusalError(r.code, r.message);
  return isExpectedServer(expectedSpiffeId, r.identity)
    ? undefined
    : new RefusalError(
        'wrong_peer',
        `the server is ${r.identity.spiffeId}, not ${describeExpectedServer(expectedSpiffeId)}`.slice(0, 600),
      );
}

/**
 * Maps an error from a TLS connection to a Herald code: our own HeraldErrors keep theirs;
 * OpenSSL's and Node's TLS codes map as `tlsCodeOf` (certs/tls-codes.ts) says. Anything else
 * (ECONNREFUSED, a generic handshake failure, ...) gives undefined.
 */
export function refusalCodeOf(err: unknown): ErrorCode | undefined {
  if (err instanceof HeraldError) return err.code;
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? tlsCodeOf(code) : undefined;
}

/** Why a session peer may not be resumed with now, or undefined when it may. */
function checkSessionPeer(
  peer: SessionPeer,
  material: PkiMaterial,
  expected: ExpectedServer,
  now = Date.now(),
): RefusalError | undefined {
  const m = material.current();
  const serial = peer.serials.find((s) => m.revokedSerials.has(s));
  if (serial !== undefined) return new RefusalError('revoked', `the server's serial ${serial} is revoked`);
  const floor = belowIdentityFloor(peer, m.identityFloors);
  if (floor !== undefined)
    return new RefusalError(
      'revoked',
      `the certificates of ${identityKey(peer.role, peer.name)} issued before ${new Date(floor).toISOString()} are revoked`,
    );
  if (now >= peer.notAfterMs)
    return new RefusalError(
      'certificate_expired',
      `the server certificate expired at ${new Date(peer.notAfterMs).toISOString()}`,
    );
  if (!isExpectedServer(expected, peer))
    return new RefusalError(
      'wrong_peer',
      `the server is ${peer.spiffeId}, not ${describeExpectedServer(expected)}`.slice(0, 600),
    );
  return undefined;
}

export interface HttpsAgentOptions {
  keepAlive?: boolean;
  maxSockets?: number;
  /** Idle keep-alive socket timeout. */
  timeoutMs?: number;
  /**
   * Instead of `timeoutMs`: the idle timeout a socket gets each time it becomes free, asked then
   * (0: Node's own, the server's Keep-Alive hint).
   */
  idleTimeoutMs?: () => number;
  /**
   * Resume TLS sessions through this store (the agent's API client). Without it, no session is
   * ever resumed.
   */
  sessions?: TlsSessionStore | undefined;
  /**
   * The byte stream a new connection to host:port goes over (an HTTP CONNECT proxy's tunnel, once
   * it is open), or undefined to connect directly. TLS then runs over it with the same checks and
   * session resumption as on a direct connection: the tunnel sees none of it.
   */
  via?: ConnectVia | undefined;
}

/**
 * Opens what a connection to `host:port` goes over: a promise of a connected socket (rejected with
 * why it could not be opened), or undefined to connect directly.
 */
export type ConnectVia = (host: string, port: number) => Promise<net.Socket> | undefined;

/**
 * An https.Agent that dials only `expectedSpiffeId` (tlsClientOptions), with keep-alive. Node's
 * own session cache is off (`maxCachedSessions: 0`): without `opts.sessions` every new
 * connection is a full handshake that checks the server's identity and revocation. With it,
 * a new connection offers the store's session for its host:port (see `resumingConnection`).
 * One agent per expected id. Rebuild it on 'tls-change' (`HttpsAgentHolder` does).
 */
export function httpsAgentFor(
  material: PkiMaterial,
  expectedSpiffeId: ExpectedServer,
  opts: HttpsAgentOptions = {},
): https.Agent {
  const base = tlsClientOptions(material, expectedSpiffeId);
  const agent = new https.Agent({
    ...base,
    // one context for all of this agent's connections: without it every new connection parses
    // the key and certificates into a context of its own (~1-4 ms of CPU each; measured by
    // `npm run bench`, where 10,000 agents each open one for a fan-out)
    secureContext: tls.createSecureContext({
      ca: base.ca,
      cert: base.cert,
      key: base.key,
      minVersion: base.minVersion,
      maxVersion: base.maxVersion,
    }),
    keepAlive: opts.keepAlive ?? true,
    // http.Agent turns TCP keep-alive on for its sockets with this idle time (default 1 s): an
    // idle kept-alive connection would then send a probe and get an ACK every second, 2 packets
    // a second per agent (`npm run bench`, idle traffic). The API closes idle connections first.
    keepAliveMsecs: API_KEEP_ALIVE_TIMEOUT_MS,
    maxSockets: opts.maxSockets ?? Infinity,
    maxCachedSessions: 0,
    ...(opts.timeoutMs !== undefined ? { timeout: opts.timeoutMs } : {}),
  });
  const idle = opts.idleTimeoutMs;
  if (idle !== undefined) {
    // http.Agent's documented hook for a socket going back to the free list: its timeout there
    // destroys a free socket (and a request sets its own while it runs)
    // (@types/node says void; Node's returns whether the socket may be kept)
    const keep = agent.keepSocketAlive.bind(agent) as unknown as (socket: tls.TLSSocket) => boolean;
    (agent as unknown as { keepSocketAlive: (socket: tls.TLSSocket) => boolean }).keepSocketAlive = (socket) => {
      if (!keep(socket)) return false;
      const ms = idle();
      if (ms > 0) socket.setTimeout(ms);
      return true;
    };
  }
  const sessions = opts.sessions;
  const connect = (options: tls.ConnectionOptions): tls.TLSSocket =>
    sessions !== undefined ? resumingConnection(options, sessions, material, expectedSpiffeId) : tls.connect(options);
  const via = opts.via;
  if (via !== undefined) {
    // http.Agent's asynchronous form: return nothing and call back with the socket once it exists
    agent.createConnection = ((
      options: tls.ConnectionOptions & { keepAlive?: boolean },
      cb: (err: Error | null, socket?: tls.TLSSocket) => void,
    ): tls.TLSSocket | undefined => {
      const tunnel = via(options.host ?? 'localhost', Number(options.port ?? 443));
      if (tunnel === undefined) return connect(options);
      tunnel.then(
        (socket) => {
          // what net.connect does for a direct connection of a keep-alive agent
          if (options.keepAlive) socket.setKeepAlive(true, API_KEEP_ALIVE_TIMEOUT_MS);
          let s: tls.TLSSocket;
          try {
            s = connect({ ...options, socket });
          } catch (err) {
            socket.destroy();
            cb(err as Error);
            return;
          }
          cb(null, s);
        },
        (err: unknown) => cb(err instanceof Error ? err : new Error(String(err))),
      );
      return undefined;
    }) as unknown as https.Agent['createConnection'];
  } else if (sessions !== undefined) {
    agent.createConnection = (options) => connect(options as tls.ConnectionOptions);
  }
  return agent;
}

/**
 * `connectResumingX509` for the API client: the session of options' host:port offered and the
 * sessions given kept, the server checked as `tlsClientOptions` checks it (on a full handshake,
 * from the chain as X509Certificate objects, not the legacy objects Node would build for
 * `checkServerIdentity`). The socket's peer, from its full handshake or from the session it
 * resumed, is recorded for `serverIdentityOf`, `sessionPeerOf` and `checkServerSocket`.
 */
function resumingConnection(
  options: tls.ConnectionOptions,
  sessions: TlsSessionStore,
  material: PkiMaterial,
  expected: ExpectedServer,
): tls.TLSSocket {
  const socket: tls.TLSSocket = connectResumingX509(
    options,
    sessions,
    `${options.host ?? 'localhost'}:${options.port ?? 443}`,
    expected,
    material,
    (cert) =>
      cert === undefined
        ? new RefusalError('untrusted_certificate', 'the server presented no certificate')
        : checkServerCertificate(material, expected, cert),
    (peer) => {
      sessionPeers.set(socket, peer);
      peerIdentities.set(socket, { trustDomain: material.current().trustDomain, spiffeId: peer.spiffeId });
    },
  );
  return socket;
}

/**
 * For each connection that resumed a session of a `TlsSessionStore` (`resumingConnection`,
 * `connectResumingX509`), set at its handshake (a closed socket no longer says it resumed): the
 * store and its key.
 */
const resumedVia = new WeakMap<tls.TLSSocket, { sessions: TlsSessionStore; key: string }>();
/** Connections whose session was forgotten: their later tickets are not kept either. */
const forgotten = new WeakSet<tls.TLSSocket>();

/**
 * When `socket` resumed a session of a `TlsSessionStore` (`resumingConnection`,
 * `connectResumingX509`): forgets that session (and any ticket the connection still brings),
 * destroys the connection and returns true, so the caller can try again on a full handshake. For
 * when the server refused what a resumed session showed it: after a restart it no longer knows the
 * Herald issuer above our certificate (a resumed session carries the leaf alone), which a full
 * handshake presents again; or our certificate, renewed or revoked while we were stopped, is not
 * what the session carries. Otherwise false, and nothing changes.
 */
export function forgetResumedSession(socket: tls.TLSSocket): boolean {
  const via = resumedVia.get(socket);
  if (via === undefined) return false;
  forgotten.add(socket);
  via.sessions.delete(via.key);
  socket.destroy();
  return true;
}

/**
 * The peer a connection of `resumingConnection` talks to: from its full handshake, or from the
 * session it resumed. Undefined for any other socket.
 */
export function sessionPeerOf(socket: tls.TLSSocket): SessionPeer | undefined {
  return sessionPeers.get(socket);
}

const sessionPeers = new WeakMap<tls.TLSSocket, SessionPeer>();

export interface HttpsAgentHolderOptions extends Omit<HttpsAgentOptions, 'sessions'> {
  /**
   * Resume TLS sessions with the servers dialled, through a `TlsSessionStore` of the holder's
   * own, dropped whole on 'tls-change' and 'revoked-change' (default false).
   */
  resumeSessions?: boolean;
}

/**
 * Holds the current `httpsAgentFor` agent and replaces it when our certificate, key or CA
 * changes; the old agent finishes its requests and closes its sockets. `close()` is idempotent.
 */
export class HttpsAgentHolder {
  #agent: https.Agent;
  #material: PkiMaterial;
  #expected: ExpectedServer;
  #opts: HttpsAgentOptions;
  /** The sessions of `resumeSessions`. */
  readonly sessions: TlsSessionStore | undefined;
  #onChange = (): void => this.rebuild();
  #onRevoked = (): void => this.sessions?.clear();
  #closed = false;

  constructor(material: PkiMaterial, expectedSpiffeId: ExpectedServer, opts: HttpsAgentHolderOptions = {}) {
    const { resumeSessions, ...agentOpts } = opts;
    this.#material = material;
    this.#expected = expectedSpiffeId;
    this.sessions = resumeSessions ? new TlsSessionStore(material) : undefined;
    this.#opts = { ...agentOpts, sessions: this.sessions };
    this.#agent = httpsAgentFor(material, expectedSpiffeId, this.#opts);
    material.on('tls-change', this.#onChange);
    material.on('revoked-change', this.#onRevoked);
  }

  get agent(): https.Agent {
    return this.#agent;
  }

  /**
   * Replaces the agent now (also done on 'tls-change'), and forgets every session: one made with
   * our old certificate would present it again.
   */
  rebuild(): void {
    if (this.#closed) return;
    this.sessions?.clear();
    const old = this.#agent;
    this.#agent = httpsAgentFor(this.#material, this.#expected, this.#opts);
    retire(old);
  }

  /** Closes the connections that are idle now (in the agent's free list); busy ones are left. */
  closeIdle(): void {
    for (const list of Object.values(this.#agent.freeSockets)) for (const s of [...(list ?? [])]) s.destroy();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#material.off('tls-change', this.#onChange);
    this.#material.off('revoked-change', this.#onRevoked);
    this.sessions?.clear();
    this.#agent.destroy();
  }
}

/**
 * The SPIFFE id of the server a connected client socket talks to (one that `tlsClientOptions`
 * checked), or undefined when it shows no certificate or none that reads as an identity. A
 * socket that resumed through a `TlsSessionStore` answers with the identity its session was
 * made with (a resumed client socket shows no certificate); one that resumed otherwise has none.
 */
export function serverIdentityOf(socket: tls.TLSSocket, material: PkiMaterial): string | undefined {
  const trustDomain = material.current().trustDomain;
  // a socket's peer is fixed at its handshake (TLS 1.3, no renegotiation): parse its certificate
  // once per kept-alive connection, not once per response (~1.5 ms of CPU per fetch)
  const known = peerIdentities.get(socket);
  if (known !== undefined && known.trustDomain === trustDomain) return known.spiffeId;
  let spiffeId: string | undefined;
  // getPeerCertificate, not getPeerX509Certificate: on Node 20 the latter's first call takes the
  // chain, which the revocation checks of certs/chain.ts read
  const c = socket.getPeerCertificate?.();
  if (!c || !Buffer.isBuffer(c.raw)) return undefined;
  try {
    spiffeId = identityOf(c, trustDomain).spiffeId;
  } catch {
    spiffeId = undefined;
  }
  peerIdentities.set(socket, { trustDomain, spiffeId });
  return spiffeId;
}

/** The identity `serverIdentityOf` found for each live socket's peer. */
const peerIdentities = new WeakMap<tls.TLSSocket, { trustDomain: string; spiffeId: string | undefined }>();

/** Lets in-flight requests finish, then closes their sockets instead of keeping them alive. */
function retire(agent: https.Agent): void {
  // http.Agent's 'free' handler reads this: a socket freed from now on is destroyed, not pooled
  (agent as unknown as { keepAlive: boolean }).keepAlive = false;
  for (const list of Object.values(agent.freeSockets)) for (const s of list ?? []) s.destroy();
}
