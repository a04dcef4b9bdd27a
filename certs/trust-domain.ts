/**
 * Which trust domain a PKI directory was made for (docs/configuration.md), for a party started without
 * `--trust-domain`: the CA host's `pki.json`, else the CA certificate's `spiffe://<domain>` SAN
 * (a bundle copied to an agent or operator has no pki.json). No node-forge here.
 */
import fs from 'node:fs';
import { HeraldError } from '../protocol/errors.js';
import { TRUST_DOMAIN_RE } from '../protocol/identity.js';
import { trustDomainOf } from './identity.js';
import { pkiPaths } from './paths.js';

export interface TrustDomainLookup {
  /** The CA certificate to ask when pki.json tells nothing (default `<dir>/ca.crt`). */
  caPath?: string | undefined;
  /** Returned when neither tells; without it that throws. */
  fallback?: string | undefined;
}

/**
 * The trust domain of the PKI in `dir`: a valid `trustDomain` in `<dir>/pki.json`, else the
 * domain the CA certificate names, else `fallback`.
 * @throws HeraldError `pki_missing` when neither tells and no fallback is given
 */
export function readTrustDomain(dir: string, o: TrustDomainLookup = {}): string {
  const p = pkiPaths(dir);
  try {
    const td = (JSON.parse(fs.readFileSync(p.meta, 'utf8')) as { trustDomain?: unknown } | null)?.trustDomain;
    if (typeof td === 'string' && TRUST_DOMAIN_RE.test(td)) return td;
  } catch {
    // no (or no valid) pki.json outside the CA host: ask the CA certificate
  }
  const caPath = o.caPath ?? p.caCrt;
  try {
    return trustDomainOf(fs.readFileSync(caPath));
  } catch (err) {
    if (o.fallback !== undefined) return o.fallback;
    throw new HeraldError(
      'pki_missing',
      `cannot tell the trust domain: no valid ${p.meta} and no spiffe:// SAN in ${caPath}`,
      { cause: err },
    );
  }
}
