/**
 * The PKI directory's fixed layout (docs/configuration.md), so every process finds its files from `--pki <dir>`:
 *
 * ```
 * <pki>/ca.crt  <pki>/ca.key            cluster CA (ca.key belongs on the CA host only)
 * <pki>/wake-signing.jwk                the first controller's (`controller`) Ed25519 signing key (0600)
 * <pki>/wake-signing.jwks               public JWKS that agents trust; each key names its controller
 * <pki>/controller/<name>.jwk           the signing key of every other controller (0600, docs/several-controllers.md)
 * <pki>/controller/<name>.tls-ticket-key the controller's own TLS session-ticket key (0600, made and
 *                                       rotated by that controller; never bundled, never shared)
 * <pki>/revoked.json                    {"serials":[..],"kids":[..]}
 * <pki>/pki.json                        {"trustDomain":".."} (CA host only; Herald's own addition)
 * <pki>/<role>/<name>.crt  .key         role: controller | agent | operator
 * <pki>/issuer/<name>.crt  .key         an issuing CA under the cluster CA (docs/adding-nodes.md)
 * ```
 */
import fs from 'node:fs';
import path from 'node:path';
import { ROLES, type Role } from '../protocol/identity.js';

/** The layout's certificate directories: the party roles, and `issuer` for issuing CAs (docs/adding-nodes.md). */
export const CERT_DIRS = [...ROLES, 'issuer'] as const;
export type CertDir = (typeof CERT_DIRS)[number];

export interface PkiPaths {
  dir: string;
  caCrt: string;
  caKey: string;
  signingJwk: string;
  jwks: string;
  revoked: string;
  /** `pki.json`: the trust domain the CA was made for. */
  meta: string;
  roleDir(role: CertDir): string;
  cert(role: CertDir, name: string): string;
  key(role: CertDir, name: string): string;
  /** `<dir>/controller/<name>.jwk`: the private signing key of controller `name` (docs/several-controllers.md). */
  controllerJwk(name: string): string;
  /**
   * `<dir>/controller/<name>.tls-ticket-key`: the API's TLS session-ticket key of controller
   * `name` (certs/ticket-key.ts). Not `.key`: a controller named `<name>.tls-ticket` would own it.
   */
  ticketKey(name: string): string;
  /**
   * `<dir>/controller/<name>.push-sessions-<worker>`: the TLS client sessions push dialer `worker`
   * (0 in the main process) of controller `name` keeps with the agents (certs/session-file.ts).
   */
  pushSessions(name: string, worker: number): string;
}

/** The controller that keeps `wake-signing.jwk` (the one `certs init` makes). */
export const FIRST_CONTROLLER = 'controller';

/** Paths of the PKI layout under `dir`. Does no I/O and validates nothing. */
export function pkiPaths(dir: string): PkiPaths {
  return {
    dir,
    caCrt: path.join(dir, 'ca.crt'),
    caKey: path.join(dir, 'ca.key'),
    signingJwk: path.join(dir, 'wake-signing.jwk'),
    jwks: path.join(dir, 'wake-signing.jwks'),
    revoked: path.join(dir, 'revoked.json'),
    meta: path.join(dir, 'pki.json'),
    roleDir: (role) => path.join(dir, role),
    cert: (role, name) => path.join(dir, role, `${name}.crt`),
    key: (role, name) => path.join(dir, role, `${name}.key`),
    controllerJwk: (name) => path.join(dir, 'controller', `${name}.jwk`),
    ticketKey: (name) => path.join(dir, 'controller', `${name}.tls-ticket-key`),
    pushSessions: (name, worker) => path.join(dir, 'controller', `${name}.push-sessions-${worker}`),
  };
}

/**
 * The private signing key file of a controller whose certificate is `controller/<name>` (docs/several-controllers.md): `override` (`--signing-key`) when given, else `<dir>/controller/<name>.jwk` when it
 * exists, else `<dir>/wake-signing.jwk` (the first controller's, and a PKI made before
 * per-controller keys). Looks only at whether the file exists; reading it is the caller's.
 */
export function signingKeyFileOf(dir: string, name: string, override?: string): string {
  if (override !== undefined) return override;
  const p = pkiPaths(dir);
  const own = p.controllerJwk(name);
  return fs.existsSync(own) ? own : p.signingJwk;
}

/** The files one party loads into a `PkiMaterial` (certs/tls.ts), from the PKI layout. */
export interface MaterialPaths {
  caPath: string;
  certPath: string;
  keyPath: string;
  revokedPath: string;
  jwksPath: string;
}

export function materialPaths(dir: string, role: Role, name: string): MaterialPaths {
  const p = pkiPaths(dir);
  return {
    caPath: p.caCrt,
    certPath: p.cert(role, name),
    keyPath: p.key(role, name),
    revokedPath: p.revoked,
    jwksPath: p.jwks,
  };
}
