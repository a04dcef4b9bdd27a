/**
 * Herald identities are SPIFFE ids, `spiffe://<trust-domain>/<role>/<name>` (SPEC §1). This
 * module only parses and formats them; reading them out of certificates is `certs/identity.ts`.
 */
import { RefusalError } from './errors.js';

export const ROLES = ['controller', 'agent', 'operator'] as const;
export type Role = (typeof ROLES)[number];

/** Every name, of every role. */
export const NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** A trust domain: a DNS-like name, lowercase. */
export const TRUST_DOMAIN_RE = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;

export interface Identity {
  role: Role;
  name: string;
  trustDomain: string;
  /** `spiffe://<trustDomain>/<role>/<name>` */
  spiffeId: string;
}

export function isRole(x: string): x is Role {
  return (ROLES as readonly string[]).includes(x);
}

export function isValidName(name: string): boolean {
  // `.` and `..` match the pattern's shape in spirit only; the leading-char rule already refuses them
  return NAME_RE.test(name);
}

export function spiffeIdOf(trustDomain: string, role: Role, name: string): string {
  return `spiffe://${trustDomain}/${role}/${name}`;
}

/**
 * Parses a SPIFFE URI into an identity, refusing anything but exactly
 * `spiffe://<trustDomain>/<role>/<name>`: no percent-escapes, query, fragment, port, user info or
 * extra segments.
 * @throws RefusalError `wrong_trust_domain` or `bad_identity`
 */
export function parseSpiffeId(uri: string, trustDomain: string): Identity {
  const m = /^spiffe:\/\/([^/]*)\/([^/]*)\/([^/]*)$/.exec(uri);
  if (!m)
    throw new RefusalError('bad_identity', `not spiffe://<domain>/<role>/<name>: ${JSON.stringify(uri.slice(0, 200))}`);
  const [, domain = '', role = '', name = ''] = m;
  if (domain !== trustDomain)
    throw new RefusalError(
      'wrong_trust_domain',
      `trust domain ${JSON.stringify(domain.slice(0, 100))} is not ${trustDomain}`,
    );
  if (!isRole(role)) throw new RefusalError('bad_identity', `unknown role ${JSON.stringify(role.slice(0, 40))}`);
  if (!isValidName(name)) throw new RefusalError('bad_identity', `bad name ${JSON.stringify(name.slice(0, 80))}`);
  return { role, name, trustDomain, spiffeId: uri };
}
