/**
 * Herald identities are SPIFFE ids, `spiffe://<trust-domain>/<role>/<name>` (docs/configuration.md). This
 * module only parses and formats them; reading them out of certificates is `certs/identity.ts`.
 */
import { ConfigError, RefusalError } from './errors.js';

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

/** The controllers an agent accepts (`--controller-id`, docs/several-controllers.md): these names, or `*` for every one of the trust domain. */
export type ControllerIds = '*' | readonly string[];

/**
 * Parses `--controller-id`: a comma-separated list of controller names, or `*`.
 * @throws ConfigError `bad_option` naming `--controller-id` for an empty list or a bad name
 */
export function parseControllerIds(value: string): ControllerIds {
  const v = value.trim();
  if (v === '*') return '*';
  const names = v.split(',').map((n) => n.trim());
  for (const n of names) {
    if (!isValidName(n))
      throw new ConfigError(
        `--controller-id ${JSON.stringify(value.slice(0, 200))}: ${JSON.stringify(n.slice(0, 80))} is not a controller name (^[a-z0-9][a-z0-9._-]{0,62}$), and the list is names separated by commas, or *`,
        { field: 'controller-id' },
      );
  }
  return [...new Set(names)];
}

/** Whether `ids` accepts the controller named `name`. */
export function acceptsController(ids: ControllerIds, name: string): boolean {
  return ids === '*' ? isValidName(name) : ids.includes(name);
}

/** `ids` for a message: `controller/a, controller/b` or `any controller`. */
export function describeControllerIds(ids: ControllerIds): string {
  return ids === '*' ? 'any controller' : ids.map((n) => `controller/${n}`).join(', ');
}
