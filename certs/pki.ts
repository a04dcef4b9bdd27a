/**
 * The PKI itself (docs/configuration.md): make the CA, issue, revoke, list, bundle, rotate the signing key.
 * node-forge signs certificates here and nowhere else; Node (OpenSSL) makes the keys and does all
 * verification. Every function takes the PKI directory and prints nothing; `certs/cli.ts` is
 * the only caller that talks to a person.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import forge from 'node-forge';
import { expandedIp } from '../protocol/address.js';
import { HeraldError } from '../protocol/errors.js';
import { CA_CERT_DAYS, DEFAULT_CERT_DAYS, DEFAULT_TRUST_DOMAIN, RSA_KEY_BITS } from '../protocol/limits.js';
import { isRole, isValidName, ROLES, spiffeIdOf, TRUST_DOMAIN_RE, type Role } from '../protocol/identity.js';
import { normalizeSerial } from './identity.js';
import { ensureDir, PRIVATE_FILE_MODE, PUBLIC_FILE_MODE, readIfExists, writeFileAtomic } from './files.js';
import { CERT_DIRS, FIRST_CONTROLLER, pkiPaths, type CertDir, type PkiPaths } from './paths.js';
import { ISSUER_ROLE } from './chain.js';
import { parseRevoked, type RevokedList } from './revoked.js';
import { readTrustDomain } from './trust-domain.js';

const DAY_MS = 86_400_000;
/** Intermediates a cluster CA allows below it: one Herald issuer. */
const ROOT_PATH_LEN = 1;
/** Default lifetime of an issuer certificate (`herald certs issue issuer`). */
export const DEFAULT_ISSUER_DAYS = 365;
/** Certificates start this long before "now", so a peer whose clock is a little behind accepts them. */
export const CERT_BACKDATE_MS = 5 * 60_000;
/** Longest `--days` for a party's certificate. */
export const MAX_CERT_DAYS = CA_CERT_DAYS;
const DNS_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

// ---- low level: keys, serials, certificates -----------------------------------------------------

/**
 * A 128-bit random serial as lowercase hex. The top bit is cleared (or forge's serial reads as
 * negative) and the next one set (or a leading zero byte makes OpenSSL refuse the DER).
 */
export function randomSerial(): string {
  const b = crypto.randomBytes(16);
  b[0] = (b[0]! & 0x7f) | 0x40;
  return b.toString('hex');
}

/** A new RSA private key as PKCS#8 PEM (made by Node, much faster than forge). */
export function newRsaKeyPem(): string {
  return crypto
    .generateKeyPairSync('rsa', { modulusLength: RSA_KEY_BITS })
    .privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
}

async function newRsaKeyPemAsync(): Promise<string> {
  const { privateKey } = await new Promise<crypto.KeyPairKeyObjectResult>((resolve, reject) =>
    crypto.generateKeyPair('rsa', { modulusLength: RSA_KEY_BITS }, (err, publicKey, privateKey) =>
      err ? reject(err) : resolve({ publicKey, privateKey }),
    ),
  );
  return privateKey.export({ type: 'pkcs8', format: 'pem' }) as string;
}

/** DER prefix of a PKCS#1 v1.5 DigestInfo for SHA-256 (RFC 8017 §9.2, note 1). */
const SHA256_DIGEST_INFO_PREFIX = Buffer.from('3031300d060960864801650304020105000420', 'hex');

/**
 * A signer for forge's `cert.sign(key, md)`: forge builds and hashes the TBSCertificate, Node
 * (OpenSSL) does the RSA PKCS#1 v1.5 signature, ~30 times faster than forge's own RSA.
 */
function rsaSigner(keyPem: string): forge.pki.rsa.PrivateKey {
  const key = crypto.createPrivateKey(keyPem);
  const sign = (md: forge.md.MessageDigest): forge.Bytes => {
    if (md.algorithm !== 'sha256') throw new HeraldError('internal', `unexpected digest ${md.algorithm}`);
    const digestInfo = Buffer.concat([SHA256_DIGEST_INFO_PREFIX, Buffer.from(md.digest().getBytes(), 'binary')]);
    return crypto.privateEncrypt({ key, padding: crypto.constants.RSA_PKCS1_PADDING }, digestInfo).toString('binary');
  };
  return { sign } as unknown as forge.pki.rsa.PrivateKey;
}

export interface Pem {
  cert: string;
  key: string;
}

export interface MakeCertificateOptions {
  /** The CA that signs, or `'self'` for a self-signed certificate (an attacker's). */
  issuer: Pem | 'self';
  /** URI SANs, as given: 0, 1 or several (tests make the wrong counts on purpose). */
  uris: string[];
  dns?: string[];
  ip?: string[];
  /** Extended key usages; neither set leaves the extension out. */
  eku: { serverAuth?: boolean; clientAuth?: boolean };
  /** Default: now minus CERT_BACKDATE_MS. */
  notBefore?: Date;
  /** Default: notBefore plus DEFAULT_CERT_DAYS. */
  notAfter?: Date;
  /** Informational only: Herald never trusts the CN. Default: the last path segment of the first URI. */
  commonName?: string;
  /** Reuse this private key (PKCS#8 PEM) instead of making one: thousands of test certs stay fast. */
  keyPem?: string;
  /**
   * Certify this public key (SPKI PEM, from a CSR) instead: no private key is made or returned
   * (`key` is ''). Not with `issuer: 'self'`.
   */
  publicKeyPem?: string;
  /** Default: `randomSerial()`. */
  serial?: string;
  /**
   * Make a CA certificate (keyCertSign, cRLSign) instead of a leaf; `pathLen` absent means
   * unconstrained. Tests make bad intermediates with this too.
   */
  ca?: { pathLen?: number };
}

export interface MadeCertificate extends Pem {
  /** Lowercase hex. */
  serial: string;
  notAfter: Date;
}

/**
 * Makes a leaf certificate, signed by `issuer` with SHA-256. No validation of names: this is
 * also how tests make the bad certificates Herald must refuse.
 */
export function makeCertificate(opts: MakeCertificateOptions): MadeCertificate {
  const keyPem = opts.publicKeyPem !== undefined ? '' : (opts.keyPem ?? newRsaKeyPem());
  const pub = crypto.createPublicKey(opts.publicKeyPem ?? keyPem).export({ type: 'spki', format: 'pem' }) as string;
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(pub);
  const serial = opts.serial ?? randomSerial();
  cert.serialNumber = serial;
  const notBefore = opts.notBefore ?? new Date(Date.now() - CERT_BACKDATE_MS);
  const notAfter = opts.notAfter ?? new Date(notBefore.getTime() + DEFAULT_CERT_DAYS * DAY_MS);
  cert.validity.notBefore = notBefore;
  cert.validity.notAfter = notAfter;
  const cn = opts.commonName ?? (opts.uris[0]?.split('/').pop() || 'herald');
  cert.setSubject([{ name: 'commonName', value: cn }]);

  let signerPem: string;
  let authorityKeyId: string;
  if (opts.issuer === 'self') {
    cert.setIssuer(cert.subject.attributes);
    signerPem = keyPem;
    authorityKeyId = cert.generateSubjectKeyIdentifier().getBytes();
  } else {
    const ca = forge.pki.certificateFromPem(opts.issuer.cert);
    cert.setIssuer(ca.subject.attributes);
    signerPem = opts.issuer.key;
    authorityKeyId = ca.generateSubjectKeyIdentifier().getBytes();
  }

  const altNames = [
    ...opts.uris.map((value) => ({ type: 6, value })),
    ...(opts.dns ?? []).map((value) => ({ type: 2, value })),
    ...(opts.ip ?? []).map((ip) => ({ type: 7, ip })),
  ];
  const extensions: object[] = [
    opts.ca
      ? {
          name: 'basicConstraints',
          cA: true,
          critical: true,
          ...(opts.ca.pathLen !== undefined ? { pathLenConstraint: opts.ca.pathLen } : {}),
        }
      : { name: 'basicConstraints', cA: false, critical: true },
    opts.ca
      ? { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true }
      : { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'subjectKeyIdentifier' },
    { name: 'authorityKeyIdentifier', keyIdentifier: authorityKeyId },
  ];
  if (opts.eku.serverAuth || opts.eku.clientAuth) {
    extensions.push({ name: 'extKeyUsage', serverAuth: !!opts.eku.serverAuth, clientAuth: !!opts.eku.clientAuth });
  }
  // a certificate with an empty SAN sequence is malformed DER: leave the extension out instead
  if (altNames.length > 0) extensions.push({ name: 'subjectAltName', altNames });
  cert.setExtensions(extensions);
  cert.sign(rsaSigner(signerPem), forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(cert), key: keyPem, serial: normalizeSerial(serial), notAfter };
}

export interface MakeCaOptions {
  trustDomain?: string;
  days?: number;
  commonName?: string;
  keyPem?: string;
}

/**
 * Makes a CA certificate and key. Its one URI SAN, `spiffe://<trustDomain>`, records the trust
 * domain it was made for; tests also use this for a second, foreign CA. pathLen 1: one Herald
 * issuer may stand between it and a leaf (docs/adding-nodes.md), and no more.
 */
export function makeCa(opts: MakeCaOptions = {}): Pem {
  const trustDomain = opts.trustDomain ?? DEFAULT_TRUST_DOMAIN;
  const keyPem = opts.keyPem ?? newRsaKeyPem();
  const pub = crypto.createPublicKey(keyPem).export({ type: 'spki', format: 'pem' }) as string;
  const cert = forge.pki.createCertificate();
  cert.publicKey = forge.pki.publicKeyFromPem(pub);
  cert.serialNumber = randomSerial();
  const notBefore = new Date(Date.now() - CERT_BACKDATE_MS);
  cert.validity.notBefore = notBefore;
  cert.validity.notAfter = new Date(notBefore.getTime() + (opts.days ?? CA_CERT_DAYS) * DAY_MS);
  const subject = [
    { name: 'commonName', value: opts.commonName ?? `Herald CA ${trustDomain}` },
    { name: 'organizationName', value: 'Herald' },
  ];
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, pathLenConstraint: ROOT_PATH_LEN, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
    { name: 'subjectAltName', altNames: [{ type: 6, value: `spiffe://${trustDomain}` }] },
  ]);
  cert.sign(rsaSigner(keyPem), forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(cert), key: keyPem };
}

// ---- signing key (Ed25519 JWK) ----------------------------------------------------------------

export interface PublicJwk {
  kty: 'OKP';
  crv: 'Ed25519';
  x: string;
  kid: string;
  alg: 'EdDSA';
  use: 'sig';
  /**
   * The controller that signs with it (docs/several-controllers.md). In the JWKS only; a key without it (a PKI made
   * before per-controller keys) is the first controller's, `controller`.
   */
  controller?: string;
}
export interface PrivateJwk extends PublicJwk {
  d: string;
}
export interface Jwks {
  keys: PublicJwk[];
}

/** RFC 7638 thumbprint (SHA-256, base64url) of an Ed25519 public key. */
export function jwkThumbprint(jwk: { crv: string; kty: string; x: string }): string {
  const canonical = JSON.stringify({ crv: jwk.crv, kty: jwk.kty, x: jwk.x });
  return crypto.createHash('sha256').update(canonical).digest('base64url');
}

/** A new Ed25519 signing key as a private JWK, `kid` its thumbprint and `alg` EdDSA (jose needs it so). */
export function newSigningJwk(): PrivateJwk {
  const { privateKey } = crypto.generateKeyPairSync('ed25519');
  const j = privateKey.export({ format: 'jwk' }) as { x?: string; d?: string };
  if (!j.x || !j.d) throw new HeraldError('internal', 'Ed25519 key export gave no x/d');
  const base = { kty: 'OKP' as const, crv: 'Ed25519' as const, x: j.x };
  return { ...base, d: j.d, kid: jwkThumbprint(base), alg: 'EdDSA', use: 'sig' };
}

/** The public half of `jwk`, naming `controller` as its owner when given (the JWKS entry). */
export function publicJwkOf(jwk: PrivateJwk | PublicJwk, controller?: string): PublicJwk {
  const pub: PublicJwk = { kty: jwk.kty, crv: jwk.crv, x: jwk.x, kid: jwk.kid, alg: 'EdDSA', use: 'sig' };
  return controller === undefined ? pub : { ...pub, controller };
}

/** The controller a JWKS key belongs to: its `controller`, else the first controller. */
export function jwkControllerOf(k: { controller?: unknown }): string {
  return typeof k.controller === 'string' ? k.controller : FIRST_CONTROLLER;
}

function readJwks(p: PkiPaths): PublicJwk[] {
  const raw = readIfExists(p.jwks);
  if (!raw) return [];
  return (JSON.parse(raw.toString()) as Jwks).keys ?? [];
}

function writeJwks(p: PkiPaths, keys: PublicJwk[]): void {
  writeFileAtomic(p.jwks, `${JSON.stringify({ keys }, null, 2)}\n`, PUBLIC_FILE_MODE);
}

/** The private JWK in `file`, or undefined when it is missing or is not one. */
function readPrivateJwk(file: string): PrivateJwk | undefined {
  const raw = readIfExists(file);
  if (!raw) return undefined;
  try {
    const j = JSON.parse(raw.toString()) as Partial<PrivateJwk>;
    return j.kty === 'OKP' && j.crv === 'Ed25519' && typeof j.x === 'string' && typeof j.d === 'string' && j.kid
      ? (j as PrivateJwk)
      : undefined;
  } catch {
    return undefined;
  }
}

/** The private signing key file of controller `name`: wake-signing.jwk for the first one. */
function controllerKeyFile(p: PkiPaths, name: string): string {
  return name === FIRST_CONTROLLER ? p.signingJwk : p.controllerJwk(name);
}

export interface ControllerKeyResult {
  kid: string;
  path: string;
  /** A new key was made (none was there, it did not parse, or its kid is revoked). */
  made: boolean;
  /** The kid it replaced in the JWKS, when a new key replaced one. */
  replacedKid?: string;
}

/**
 * Makes sure controller `name` (not the first one, which keeps wake-signing.jwk) has its own
 * signing key `<pki>/controller/<name>.jwk` (0600) and that the JWKS holds its public key naming
 * it (docs/several-controllers.md). Re-issuing a controller's certificate keeps its key: renewing a certificate is
 * not a key rotation (that is `rotate-signing-key --controller <name>`), and agents keep trusting
 * it. A new key is made only when there is none, it does not parse, or its kid is revoked (a
 * controller revoked and issued again); it replaces the old kid's JWKS entry. The private key is
 * written before the JWKS, so a controller that reloads on a JWKS change finds it in place.
 */
function ensureControllerKey(p: PkiPaths, name: string): ControllerKeyResult {
  const file = p.controllerJwk(name);
  const revoked = new Set(readRevoked(p).kids);
  const keys = readJwks(p);
  const old = readPrivateJwk(file);
  if (old && !revoked.has(old.kid)) {
    const entry = keys.find((k) => k.kid === old.kid);
    if (!entry || entry.controller !== name)
      writeJwks(p, [...keys.filter((k) => k.kid !== old.kid), publicJwkOf(old, name)]);
    return { kid: old.kid, path: file, made: false };
  }
  const jwk = newSigningJwk();
  writeFileAtomic(file, `${JSON.stringify(jwk, null, 2)}\n`, PRIVATE_FILE_MODE);
  writeJwks(p, [...keys.filter((k) => k.kid !== old?.kid), publicJwkOf(jwk, name)]);
  return { kid: jwk.kid, path: file, made: true, ...(old ? { replacedKid: old.kid } : {}) };
}

// ---- revoked.json -------------------------------------------------------------------------------

function writeRevoked(p: PkiPaths, list: RevokedList): void {
  const body = {
    serials: list.serials,
    kids: list.kids,
    ...(list.identities && Object.keys(list.identities).length > 0 ? { identities: list.identities } : {}),
  };
  writeFileAtomic(p.revoked, `${JSON.stringify(body, null, 2)}\n`, PUBLIC_FILE_MODE);
}

// ---- the PKI directory -------------------------------------------------------------------------

export interface InitPkiOptions {
  dir: string;
  trustDomain?: string;
  /** Extra DNS SANs of the controller certificate, beside `localhost`. */
  controllerDns?: string[];
  /** Extra IP SANs of the controller certificate, beside `127.0.0.1`. */
  controllerIp?: string[];
  /** Replace an existing CA (and everything `init` writes). */
  force?: boolean;
}

export interface InitPkiResult {
  dir: string;
  trustDomain: string;
  kid: string;
  controller: IssueResult;
  operator: IssueResult;
}

/**
 * Makes a new PKI in `dir`: the CA, the signing key and its JWKS, an empty revoked.json, the
 * controller certificate `controller/controller` and the operator certificate `operator/admin`.
 * All options are checked before anything is written.
 * @throws HeraldError `pki_exists` (and changes nothing) when `<dir>/ca.key` exists without
 *   `force`; `bad_option` for a bad trust domain, DNS name or IP
 */
export async function initPki(opts: InitPkiOptions): Promise<InitPkiResult> {
  const trustDomain = opts.trustDomain ?? DEFAULT_TRUST_DOMAIN;
  if (!TRUST_DOMAIN_RE.test(trustDomain))
    throw new HeraldError(
      'bad_option',
      `--trust-domain ${JSON.stringify(trustDomain)} is not a lowercase DNS-like name`,
    );
  const dns = uniq(['localhost', ...checkDns(opts.controllerDns ?? [], '--controller-dns')]);
  const ip = uniq(['127.0.0.1', ...checkIps(opts.controllerIp ?? [], '--controller-ip')]);
  const p = pkiPaths(opts.dir);
  if (fs.existsSync(p.caKey) && !opts.force) {
    throw new HeraldError('pki_exists', `${p.caKey} exists; refusing to replace the CA without --force`);
  }

  const [caKey, opKey, ctlKey] = await Promise.all([newRsaKeyPemAsync(), newRsaKeyPemAsync(), newRsaKeyPemAsync()]);
  const ca = makeCa({ trustDomain, keyPem: caKey });
  const jwk = newSigningJwk();

  ensureDir(p.dir);
  for (const role of ROLES) ensureDir(p.roleDir(role));
  writeFileAtomic(p.caKey, ca.key, PRIVATE_FILE_MODE);
  writeFileAtomic(p.caCrt, ca.cert, PUBLIC_FILE_MODE);
  writeFileAtomic(p.meta, `${JSON.stringify({ trustDomain }, null, 2)}\n`, PUBLIC_FILE_MODE);
  writeFileAtomic(p.signingJwk, `${JSON.stringify(jwk, null, 2)}\n`, PRIVATE_FILE_MODE);
  writeJwks(p, [publicJwkOf(jwk, FIRST_CONTROLLER)]);
  writeRevoked(p, { serials: [], kids: [] });
  const controller = issueWith(p, ca, trustDomain, { role: 'controller', name: 'controller', dns, ip, keyPem: ctlKey });
  const operator = issueWith(p, ca, trustDomain, { role: 'operator', name: 'admin', keyPem: opKey });
  return { dir: p.dir, trustDomain, kid: jwk.kid, controller, operator };
}

export interface IssueCertOptions {
  dir: string;
  role: string;
  name: string;
  dns?: string[];
  ip?: string[];
  /** Lifetime in days (default DEFAULT_CERT_DAYS); ignored when notAfter is given. */
  days?: number;
  notBefore?: Date;
  notAfter?: Date;
  /** Reuse a private key (PKCS#8 PEM) instead of making one. */
  keyPem?: string;
}

export interface IssueResult {
  certPath: string;
  keyPath: string;
  /** Lowercase hex. */
  serial: string;
  spiffeId: string;
  notAfter: Date;
  /** For a controller other than the first: its signing key (docs/several-controllers.md). */
  signingKey?: ControllerKeyResult;
}

/**
 * Issues (or renews: the files are replaced) the certificate of `role/name`, with the single
 * URI SAN `spiffe://<trust domain>/<role>/<name>` and the EKUs of its role.
 * @throws HeraldError `bad_identity` for a bad role or name; `bad_option` for bad DNS, IP or
 *   days; `pki_missing` when the CA is not there
 */
export async function issueCert(opts: IssueCertOptions): Promise<IssueResult> {
  if (opts.role === ISSUER_ROLE) {
    if ((opts.dns ?? []).length > 0 || (opts.ip ?? []).length > 0)
      throw new HeraldError('bad_option', 'an issuer certificate has no DNS or IP SANs: drop --dns and --ip');
    return issueIssuer({ dir: opts.dir, name: opts.name, days: opts.days, keyPem: opts.keyPem });
  }
  if (!isRole(opts.role))
    throw new HeraldError(
      'bad_identity',
      `role must be one of ${CERT_DIRS.join(', ')}, not ${JSON.stringify(opts.role)}`,
    );
  if (!isValidName(opts.name))
    throw new HeraldError(
      'bad_identity',
      `name ${JSON.stringify(opts.name)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`,
    );
  const dns = checkDns(opts.dns ?? [], '--dns');
  const ip = checkIps(opts.ip ?? [], '--ip');
  if (opts.days !== undefined && (!Number.isInteger(opts.days) || opts.days < 1 || opts.days > MAX_CERT_DAYS)) {
    throw new HeraldError('bad_option', `--days must be a whole number from 1 to ${MAX_CERT_DAYS}`);
  }
  const p = pkiPaths(opts.dir);
  const ca = loadCa(p);
  const trustDomain = readTrustDomain(p.dir);
  const keyPem = opts.keyPem ?? (await newRsaKeyPemAsync());
  const role = opts.role;
  ensureDir(p.roleDir(role));
  const issued = issueWith(p, ca, trustDomain, {
    role,
    name: opts.name,
    dns,
    ip,
    keyPem,
    days: opts.days,
    notBefore: opts.notBefore,
    notAfter: opts.notAfter,
  });
  if (role !== 'controller' || opts.name === FIRST_CONTROLLER) return issued;
  return { ...issued, signingKey: ensureControllerKey(p, opts.name) };
}

export interface IssueIssuerOptions {
  dir: string;
  name: string;
  /** Lifetime in days (default DEFAULT_ISSUER_DAYS), at most the cluster CA's remaining life. */
  days?: number | undefined;
  keyPem?: string | undefined;
}

/**
 * Makes (or replaces) the issuing CA `<dir>/issuer/<name>.crt` and `.key` (0600), signed by the
 * cluster CA (docs/adding-nodes.md): CA with pathLen 0, keyCertSign and cRLSign, the single URI SAN
 * `spiffe://<td>/issuer/<name>`. Only this needs the root `ca.key`; the issuer then signs agent
 * certificates (`issueWithIssuer`) where the root key is not.
 * @throws HeraldError `bad_identity` (bad name), `bad_option` (days; a cluster CA made before
 *   issuers existed, whose pathLen 0 forbids any intermediate), `pki_missing` (no CA)
 */
export async function issueIssuer(opts: IssueIssuerOptions): Promise<IssueResult> {
  if (!isValidName(opts.name))
    throw new HeraldError(
      'bad_identity',
      `name ${JSON.stringify(opts.name)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`,
    );
  if (opts.days !== undefined && (!Number.isInteger(opts.days) || opts.days < 1 || opts.days > MAX_CERT_DAYS))
    throw new HeraldError('bad_option', `--days must be a whole number from 1 to ${MAX_CERT_DAYS}`);
  const p = pkiPaths(opts.dir);
  const ca = loadCa(p);
  const root = forge.pki.certificateFromPem(ca.cert);
  const bc = root.getExtension('basicConstraints') as { pathLenConstraint?: number } | undefined;
  if (bc?.pathLenConstraint === 0)
    throw new HeraldError(
      'bad_option',
      `${p.caCrt} was made with pathLen 0 (before Herald had issuers) and cannot hold an issuer: make a new CA`,
    );
  const trustDomain = readTrustDomain(p.dir);
  const keyPem = opts.keyPem ?? (await newRsaKeyPemAsync());
  const notBefore = new Date(Date.now() - CERT_BACKDATE_MS);
  const wanted = notBefore.getTime() + (opts.days ?? DEFAULT_ISSUER_DAYS) * DAY_MS + CERT_BACKDATE_MS;
  const notAfter = new Date(Math.min(wanted, root.validity.notAfter.getTime()));
  const spiffeId = `spiffe://${trustDomain}/${ISSUER_ROLE}/${opts.name}`;
  const made = makeCertificate({
    issuer: ca,
    uris: [spiffeId],
    eku: {},
    ca: { pathLen: 0 },
    notBefore,
    notAfter,
    commonName: `Herald issuer ${opts.name}`,
    keyPem,
  });
  ensureDir(p.roleDir(ISSUER_ROLE));
  const certPath = p.cert(ISSUER_ROLE, opts.name);
  const keyPath = p.key(ISSUER_ROLE, opts.name);
  writeFileAtomic(keyPath, made.key, PRIVATE_FILE_MODE);
  writeFileAtomic(certPath, made.cert, PUBLIC_FILE_MODE);
  return { certPath, keyPath, serial: made.serial, spiffeId, notAfter };
}

export interface IssueWithIssuerOptions {
  /** The issuer's certificate and key (`<pki>/issuer/<name>.crt/.key`). */
  issuer: Pem;
  /** Only `agent`: an issuer signs nothing else. */
  role: string;
  name: string;
  dns?: string[];
  ip?: string[];
  /** Lifetime in days (default DEFAULT_CERT_DAYS); ignored when notAfter is given. */
  days?: number;
  notBefore?: Date;
  /** Never later than the issuer's own notAfter (cut to it). */
  notAfter?: Date;
  /** The leaf's private key (PKCS#8 PEM); default a new one. */
  keyPem?: string;
  /** Certify this public key (SPKI PEM, from a CSR) instead; `key` is then ''. */
  publicKeyPem?: string;
}

export interface IssuedWithIssuer extends MadeCertificate {
  spiffeId: string;
  /** The leaf's PEM followed by the issuer's: what the agent presents (its `.crt` file). */
  chain: string;
}

/**
 * Issues an agent certificate signed by a Herald issuer instead of the root (docs/adding-nodes.md). Writes
 * nothing: the caller stores `chain` (leaf + issuer) as the agent's certificate, so every peer
 * can build the chain to the cluster CA. The trust domain is the issuer's.
 * @throws HeraldError `bad_issuer` for another role than agent, or an `issuer` that is not a
 *   Herald issuer; `bad_identity` (name), `bad_option` (DNS, IP, days)
 */
export function issueWithIssuer(opts: IssueWithIssuerOptions): IssuedWithIssuer {
  if (opts.role !== 'agent')
    throw new HeraldError(
      'bad_issuer',
      `an issuer signs agent certificates only, not ${JSON.stringify(String(opts.role).slice(0, 40))}`,
    );
  if (!isValidName(opts.name))
    throw new HeraldError(
      'bad_identity',
      `name ${JSON.stringify(opts.name)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`,
    );
  const dns = checkDns(opts.dns ?? [], '--dns');
  const ip = checkIps(opts.ip ?? [], '--ip');
  if (opts.days !== undefined && (!Number.isInteger(opts.days) || opts.days < 1 || opts.days > MAX_CERT_DAYS))
    throw new HeraldError('bad_option', `--days must be a whole number from 1 to ${MAX_CERT_DAYS}`);
  const x = readIssuer(opts.issuer);
  const trustDomain = /^spiffe:\/\/([^/]+)\//.exec(x.uri)![1]!;
  const spiffeId = spiffeIdOf(trustDomain, 'agent', opts.name);
  const notBefore = opts.notBefore ?? new Date(Date.now() - CERT_BACKDATE_MS);
  const wanted =
    opts.notAfter ?? new Date(notBefore.getTime() + (opts.days ?? DEFAULT_CERT_DAYS) * DAY_MS + CERT_BACKDATE_MS);
  const notAfter = new Date(Math.min(wanted.getTime(), x.notAfter.getTime()));
  const made = makeCertificate({
    issuer: opts.issuer,
    uris: [spiffeId],
    dns,
    ip,
    eku: { serverAuth: true, clientAuth: true },
    notBefore,
    notAfter,
    commonName: opts.name,
    ...(opts.keyPem !== undefined ? { keyPem: opts.keyPem } : {}),
    ...(opts.publicKeyPem !== undefined ? { publicKeyPem: opts.publicKeyPem } : {}),
  });
  return { ...made, spiffeId, chain: `${made.cert.trimEnd()}\n${opts.issuer.cert.trimEnd()}\n` };
}

/**
 * Checks that `pem` is a Herald issuer (a CA with pathLen 0 and a `spiffe://<td>/issuer/<name>`
 * URI SAN) whose key is `pem.key`.
 * @throws HeraldError `bad_issuer`
 */
export function readIssuer(pem: Pem): { uri: string; name: string; notAfter: Date; serial: string } {
  let cert: forge.pki.Certificate;
  try {
    cert = forge.pki.certificateFromPem(pem.cert);
  } catch (err) {
    throw new HeraldError('bad_issuer', 'the issuer certificate does not parse', { cause: err });
  }
  const bc = cert.getExtension('basicConstraints') as { cA?: boolean; pathLenConstraint?: number } | undefined;
  const san = cert.getExtension('subjectAltName') as { altNames?: Array<{ type: number; value: string }> } | undefined;
  const uris = (san?.altNames ?? []).filter((a) => a.type === 6).map((a) => a.value);
  const m = uris.length === 1 ? /^spiffe:\/\/([^/]+)\/issuer\/([^/]+)$/.exec(uris[0]!) : null;
  if (!bc?.cA || bc.pathLenConstraint !== 0 || !m || !isValidName(m[2]!))
    throw new HeraldError(
      'bad_issuer',
      'not a Herald issuer certificate (CA, pathLen 0, URI SAN spiffe://<td>/issuer/<name>)',
    );
  let matches = false;
  try {
    matches = new crypto.X509Certificate(pem.cert).checkPrivateKey(crypto.createPrivateKey(pem.key));
  } catch (err) {
    throw new HeraldError('bad_issuer', 'the issuer key does not parse', { cause: err });
  }
  if (!matches) throw new HeraldError('bad_issuer', 'the issuer key does not match its certificate');
  return { uri: uris[0]!, name: m[2]!, notAfter: cert.validity.notAfter, serial: normalizeSerial(cert.serialNumber) };
}

export interface LoadedIssuer extends Pem {
  name: string;
  /** Lowercase hex. */
  serial: string;
  notAfter: Date;
  certPath: string;
  keyPath: string;
}

/**
 * Loads the issuer `<dir>/issuer/<name>.crt/.key` for a controller (`--issuer`): both files
 * there, a Herald issuer whose key matches, signed by the CA in `caPath`.
 * @throws HeraldError `pki_missing` (a file is missing), `bad_option` (anything else wrong)
 */
export function loadIssuer(dir: string, name: string, caPath = pkiPaths(dir).caCrt): LoadedIssuer {
  if (!isValidName(name))
    throw new HeraldError('bad_option', `--issuer ${JSON.stringify(name)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`);
  const p = pkiPaths(dir);
  const certPath = p.cert(ISSUER_ROLE, name);
  const keyPath = p.key(ISSUER_ROLE, name);
  const cert = readIfExists(certPath);
  const key = readIfExists(keyPath);
  const ca = readIfExists(caPath);
  for (const [file, data] of [
    [certPath, cert],
    [keyPath, key],
    [caPath, ca],
  ] as const) {
    if (!data)
      throw new HeraldError('pki_missing', `--issuer ${name}: ${file} is missing (herald certs issue issuer ${name})`);
  }
  const pem = { cert: cert!.toString(), key: key!.toString() };
  let info: ReturnType<typeof readIssuer>;
  try {
    info = readIssuer(pem);
  } catch (err) {
    throw new HeraldError('bad_option', `--issuer ${name}: ${certPath}: ${(err as Error).message}`, { cause: err });
  }
  const x = new crypto.X509Certificate(pem.cert);
  const roots = (ca!.toString().match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? []).map(
    (b) => new crypto.X509Certificate(b),
  );
  if (!roots.some((r) => x.checkIssued(r) && x.verify(r.publicKey)))
    throw new HeraldError('bad_option', `--issuer ${name}: ${certPath} is not signed by the cluster CA ${caPath}`);
  return { ...pem, name: info.name, serial: info.serial, notAfter: info.notAfter, certPath, keyPath };
}

function issueWith(
  p: PkiPaths,
  ca: Pem,
  trustDomain: string,
  o: {
    role: Role;
    name: string;
    dns?: string[];
    ip?: string[];
    keyPem: string;
    days?: number | undefined;
    notBefore?: Date | undefined;
    notAfter?: Date | undefined;
  },
): IssueResult {
  const spiffeId = spiffeIdOf(trustDomain, o.role, o.name);
  const notBefore = o.notBefore ?? new Date(Date.now() - CERT_BACKDATE_MS);
  const notAfter =
    o.notAfter ?? new Date(notBefore.getTime() + (o.days ?? DEFAULT_CERT_DAYS) * DAY_MS + CERT_BACKDATE_MS);
  const made = makeCertificate({
    issuer: ca,
    uris: [spiffeId],
    dns: o.dns ?? [],
    ip: o.ip ?? [],
    eku: o.role === 'operator' ? { clientAuth: true } : { serverAuth: true, clientAuth: true },
    notBefore,
    notAfter,
    commonName: o.name,
    keyPem: o.keyPem,
  });
  const certPath = p.cert(o.role, o.name);
  const keyPath = p.key(o.role, o.name);
  // key first: a watcher that sees the new key before the new certificate keeps its last good
  // pair until both match (certs/tls.ts)
  writeFileAtomic(keyPath, made.key, PRIVATE_FILE_MODE);
  writeFileAtomic(certPath, made.cert, PUBLIC_FILE_MODE);
  return { certPath, keyPath, serial: made.serial, spiffeId, notAfter };
}

function loadCa(p: PkiPaths): Pem {
  const cert = readIfExists(p.caCrt);
  const key = readIfExists(p.caKey);
  if (!cert || !key) throw new HeraldError('pki_missing', `no CA in ${p.dir} (run herald certs init --dir ${p.dir})`);
  return { cert: cert.toString(), key: key.toString() };
}

export interface RevokeOptions {
  dir: string;
  /** A certificate name (`n1`), `role/name`, or a serial in hex. */
  target?: string;
  /** A signing key id to distrust. Exactly one of target and kid. */
  kid?: string;
}

export interface RevokeResult {
  serial?: string;
  kid?: string;
  /** `role/name` when the target was a certificate in the PKI. */
  certificate?: string;
  /**
   * For a controller's certificate: its signing key ids, revoked with it (docs/several-controllers.md), so that
   * revoking one controller cuts off that controller alone.
   */
  kids?: string[];
  /**
   * For `agent/<name>`: the identity floor now in revoked.json; every certificate of the agent
   * issued before it is refused, whatever issued it (docs/certificates-over-time.md).
   */
  revokedBefore?: string;
  /** It was listed already; nothing changed. */
  already: boolean;
}

/**
 * Adds a certificate's serial, or a signing key id, to revoked.json (atomic replace). Revoking a
 * controller's certificate also revokes its signing keys: the JWKS keys that name it (for the
 * first controller, `controller`, also those that name no controller) and the key in its key file.
 * A name held by several roles must be given as `role/name`.
 * @throws HeraldError `bad_option` (ambiguous or malformed target, a controller's active
 *   signing kid given with --kid, an unknown kid), `pki_missing` (no such certificate)
 */
export async function revoke(opts: RevokeOptions): Promise<RevokeResult> {
  if ((opts.target === undefined) === (opts.kid === undefined)) {
    throw new HeraldError('bad_option', 'give exactly one of a certificate (name, role/name or serial) and --kid');
  }
  const p = pkiPaths(opts.dir);
  const current = readRevoked(p);
  if (opts.kid !== undefined) {
    const kid = opts.kid;
    const keys = readJwks(p);
    const owner = keys.find((k) => k.kid === kid);
    const ownerName = owner ? jwkControllerOf(owner) : undefined;
    if (
      ownerName !== undefined &&
      isValidName(ownerName) &&
      readPrivateJwk(controllerKeyFile(p, ownerName))?.kid === kid
    ) {
      throw new HeraldError(
        'bad_option',
        `kid ${kid} is the active signing key of controller ${ownerName}; run herald certs rotate-signing-key${ownerName === FIRST_CONTROLLER ? '' : ` --controller ${ownerName}`} first, or revoke controller/${ownerName}`,
      );
    }
    if (!owner && !current.kids.includes(kid))
      throw new HeraldError('bad_option', `kid ${JSON.stringify(kid)} is not in ${p.jwks}`);
    if (current.kids.includes(kid)) return { kid, already: true };
    writeRevoked(p, { ...current, kids: [...current.kids, kid] });
    return { kid, already: false };
  }

  const target = opts.target!.trim();
  const agent = /^agent\/([a-z0-9][a-z0-9._-]{0,62})$/.exec(target)?.[1];
  if (agent !== undefined) return revokeAgent(p, current, agent);
  const found = findCertificate(p, target);
  let serial: string;
  let certificate: string | undefined;
  let kids: string[] = [];
  if (found) {
    serial = normalizeSerial(new crypto.X509Certificate(fs.readFileSync(found.path)).serialNumber);
    certificate = `${found.role}/${found.name}`;
    if (found.role === 'controller') kids = controllerKids(p, found.name);
  } else if (/^(0x)?[0-9a-fA-F:]+$/.test(target) && !target.includes('/')) {
    serial = normalizeSerial(target);
  } else {
    throw new HeraldError(
      'pki_missing',
      `no certificate ${JSON.stringify(target)} in ${p.dir} (give a name, role/name or hex serial)`,
    );
  }
  const base = {
    serial,
    ...(certificate ? { certificate } : {}),
    ...(found?.role === 'controller' ? { kids } : {}),
  };
  const newKids = kids.filter((k) => !current.kids.includes(k));
  if (current.serials.includes(serial) && newKids.length === 0) return { ...base, already: true };
  writeRevoked(p, {
    ...current,
    serials: current.serials.includes(serial) ? current.serials : [...current.serials, serial],
    kids: [...current.kids, ...newKids],
  });
  return { ...base, already: false };
}

/**
 * Revokes the identity `agent/<name>`: every certificate of it issued up to now, made here or by a
 * controller's issuer (enrolment, renewal), whose serials this directory never saw. The floor is
 * the next whole second (certificate times have whole seconds); the PKI's own certificate file, if
 * any, is revoked by serial too.
 */
function revokeAgent(p: PkiPaths, current: RevokedList, name: string): RevokeResult {
  const key = `agent/${name}`;
  const floor = new Date(Math.floor(Date.now() / 1000) * 1000 + 1000).toISOString();
  const file = p.cert('agent', name);
  const serial = fs.existsSync(file)
    ? normalizeSerial(new crypto.X509Certificate(fs.readFileSync(file)).serialNumber)
    : undefined;
  const identities = { ...(current.identities ?? {}) };
  const had = identities[key];
  identities[key] = had !== undefined && Date.parse(had) > Date.parse(floor) ? had : floor;
  writeRevoked(p, {
    serials: serial === undefined || current.serials.includes(serial) ? current.serials : [...current.serials, serial],
    kids: current.kids,
    identities,
  });
  return {
    ...(serial !== undefined ? { serial, certificate: key } : {}),
    revokedBefore: identities[key],
    already: false,
  };
}

/** The signing key ids of controller `name`: those the JWKS gives it, and the one in its key file. */
function controllerKids(p: PkiPaths, name: string): string[] {
  const kids = readJwks(p)
    .filter((k) => jwkControllerOf(k) === name)
    .map((k) => k.kid);
  const own = readPrivateJwk(controllerKeyFile(p, name))?.kid;
  return uniq(own === undefined ? kids : [...kids, own]);
}

function findCertificate(p: PkiPaths, target: string): { role: CertDir; name: string; path: string } | undefined {
  const slash = target.split('/');
  if (slash.length === 2) {
    const [role = '', name = ''] = slash;
    if (!isCertDir(role) || !isValidName(name))
      throw new HeraldError('bad_option', `${JSON.stringify(target)} is not role/name`);
    const file = p.cert(role, name);
    if (!fs.existsSync(file)) throw new HeraldError('pki_missing', `no certificate ${target} in ${p.dir}`);
    return { role, name, path: file };
  }
  if (slash.length > 2)
    throw new HeraldError('bad_option', `${JSON.stringify(target)} is not a name, role/name or serial`);
  if (!isValidName(target)) return undefined;
  const hits = CERT_DIRS.filter((r) => fs.existsSync(p.cert(r, target)));
  if (hits.length > 1) {
    throw new HeraldError(
      'bad_option',
      `${target} names certificates of several roles (${hits.join(', ')}): give role/name`,
    );
  }
  const role = hits[0];
  return role ? { role, name: target, path: p.cert(role, target) } : undefined;
}

function readRevoked(p: PkiPaths): RevokedList {
  const raw = readIfExists(p.revoked);
  return raw ? parseRevoked(raw, p.revoked) : { serials: [], kids: [] };
}

export interface CertListing {
  /** A party role, or `issuer` for an issuing CA. */
  role: CertDir;
  name: string;
  serial: string;
  spiffeId: string | undefined;
  notAfter: Date;
  revoked: boolean;
}

/** Every certificate under the PKI's role and issuer directories, sorted by role then name. */
export async function listCerts(dir: string): Promise<CertListing[]> {
  const p = pkiPaths(dir);
  const revoked = new Set(readRevoked(p).serials);
  const out: CertListing[] = [];
  for (const role of CERT_DIRS) {
    let names: string[];
    try {
      names = fs.readdirSync(p.roleDir(role));
    } catch {
      continue;
    }
    for (const f of names.sort()) {
      if (!f.endsWith('.crt')) continue;
      const name = f.slice(0, -4);
      let x: crypto.X509Certificate;
      try {
        x = new crypto.X509Certificate(fs.readFileSync(path.join(p.roleDir(role), f)));
      } catch {
        continue; // not a certificate: not ours to list
      }
      const serial = normalizeSerial(x.serialNumber);
      let spiffeId: string | undefined;
      const m = /(?:^|, )URI:(spiffe:\/\/[^,"]*)/.exec(x.subjectAltName ?? '');
      if (m) spiffeId = m[1];
      out.push({ role, name, serial, spiffeId, notAfter: new Date(x.validTo), revoked: revoked.has(serial) });
    }
  }
  return out;
}

export interface BundleOptions {
  dir: string;
  role: string;
  name: string;
  /** A new or empty directory; made 0700. */
  out: string;
}

/**
 * Copies out exactly what `role/name` needs, in the PKI layout: ca.crt, wake-signing.jwks,
 * revoked.json, its certificate and key, and for a controller its own signing key
 * (wake-signing.jwk for the first controller, `controller/<name>.jwk` for any other; never
 * another controller's). Never ca.key.
 * @returns the relative paths written
 * @throws HeraldError `bad_identity`, `pki_missing`, `bad_option` (out is the PKI dir itself,
 *   or already holds a ca.key)
 */
export async function bundle(opts: BundleOptions): Promise<string[]> {
  // `issuer`: what a controller host needs for --issuer, beside its own controller bundle
  if (!isCertDir(opts.role)) throw new HeraldError('bad_identity', `role must be one of ${CERT_DIRS.join(', ')}`);
  if (!isValidName(opts.name)) throw new HeraldError('bad_identity', `bad name ${JSON.stringify(opts.name)}`);
  const role = opts.role;
  const src = pkiPaths(opts.dir);
  const dst = pkiPaths(opts.out);
  if (path.resolve(opts.out) === path.resolve(opts.dir))
    throw new HeraldError('bad_option', '--out must not be the PKI directory');
  if (fs.existsSync(dst.caKey))
    throw new HeraldError('bad_option', `${opts.out} holds a ca.key: not a bundle directory`);
  const files: Array<[from: string, to: string, mode: number]> = [
    [src.caCrt, dst.caCrt, PUBLIC_FILE_MODE],
    [src.jwks, dst.jwks, PUBLIC_FILE_MODE],
    [src.revoked, dst.revoked, PUBLIC_FILE_MODE],
    [src.cert(role, opts.name), dst.cert(role, opts.name), PUBLIC_FILE_MODE],
    [src.key(role, opts.name), dst.key(role, opts.name), PRIVATE_FILE_MODE],
  ];
  if (role === 'controller')
    files.push(
      opts.name === FIRST_CONTROLLER
        ? [src.signingJwk, dst.signingJwk, PRIVATE_FILE_MODE]
        : [src.controllerJwk(opts.name), dst.controllerJwk(opts.name), PRIVATE_FILE_MODE],
    );
  const data = files.map(([from]) => {
    const d = readIfExists(from);
    if (!d)
      throw new HeraldError(
        'pki_missing',
        from === src.controllerJwk(opts.name)
          ? `missing ${from} (a controller issued before per-controller keys: herald certs issue controller ${opts.name} makes it)`
          : `missing ${from}`,
      );
    return d;
  });
  ensureDir(dst.dir);
  ensureDir(dst.roleDir(role));
  files.forEach(([, to, mode], i) => {
    writeFileAtomic(to, data[i]!, mode);
  });
  return files.map(([, to]) => path.relative(dst.dir, to));
}

export interface RotateResult {
  kid: string;
  /** The controller whose key it is. */
  controller: string;
  /** Kids still in the JWKS beside the new one; revoke them with `revoke --kid` once agents have it. */
  previousKids: string[];
}

/**
 * Makes a new signing key for `controller` (default the first one, whose key is
 * wake-signing.jwk; another's is `controller/<name>.jwk`). The JWKS is written after the private
 * key, holding the new public key (naming its controller) and every earlier one not yet revoked,
 * so agents keep trusting the old kid until it is revoked.
 * @throws HeraldError `pki_missing` when there is no JWKS, or no certificate for that controller;
 *   `bad_option` for a bad name
 */
export async function rotateSigningKey(opts: { dir: string; controller?: string }): Promise<RotateResult> {
  const p = pkiPaths(opts.dir);
  const name = opts.controller ?? FIRST_CONTROLLER;
  if (!isValidName(name))
    throw new HeraldError(
      'bad_option',
      `--controller ${JSON.stringify(name)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`,
    );
  const raw = readIfExists(p.jwks);
  if (!raw) throw new HeraldError('pki_missing', `no ${p.jwks}`);
  if (name !== FIRST_CONTROLLER && !fs.existsSync(p.cert('controller', name)))
    throw new HeraldError('pki_missing', `no certificate controller/${name} in ${p.dir}`);
  const old = (JSON.parse(raw.toString()) as Jwks).keys ?? [];
  const revokedKids = new Set(readRevoked(p).kids);
  const jwk = newSigningJwk();
  const kept = old.filter((k) => k.kid !== jwk.kid && !revokedKids.has(k.kid));
  // the private key first: a controller on this host reloads its key when the JWKS changes, so
  // the key must already be in place by then
  writeFileAtomic(controllerKeyFile(p, name), `${JSON.stringify(jwk, null, 2)}\n`, PRIVATE_FILE_MODE);
  writeJwks(p, [publicJwkOf(jwk, name), ...kept]);
  return {
    kid: jwk.kid,
    controller: name,
    previousKids: kept.filter((k) => jwkControllerOf(k) === name).map((k) => k.kid),
  };
}

// ---- option checks ----------------------------------------------------------------------------

function checkDns(names: string[], option: string): string[] {
  return names.map((n) => {
    const d = n.toLowerCase();
    if (d.length > 253 || !DNS_RE.test(d))
      throw new HeraldError('bad_option', `${option} ${JSON.stringify(n)} is not a DNS name`);
    return d;
  });
}

/**
 * Each IP SAN in the one text form node-forge encodes correctly (protocol/address.ts
 * `expandedIp`): it throws on a dotted IPv4 tail (`::ffff:169.254.169.254`) and miscounts some
 * compressed forms, so an address is checked and rewritten here, before any key is made.
 */
function checkIps(ips: string[], option: string): string[] {
  return ips.map((ip) => {
    const expanded = net.isIP(ip.trim()) === 0 ? null : expandedIp(ip);
    if (expanded === null)
      throw new HeraldError(
        'bad_option',
        `${option} ${JSON.stringify(ip)} is not an IP address (a dotted IPv4 address or an IPv6 address without a zone)`,
      );
    return expanded;
  });
}

function isCertDir(x: string): x is CertDir {
  return (CERT_DIRS as readonly string[]).includes(x);
}

function uniq(xs: string[]): string[] {
  return [...new Set(xs)];
}
