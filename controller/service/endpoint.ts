/**
 * The agent listener URL a node announces (docs/api.md): `wss://host:port/v1/wake`, whose host must
 * be one of the announcing certificate's DNS or IP SANs, so a stolen agent key cannot aim the
 * controller's dialer at another host. An IP host is checked by the one address classifier
 * (protocol/address.ts): unspecified, link-local and cloud metadata addresses are refused in
 * every spelling. Names are compared exactly (no wildcard SANs) and are not resolved here: the
 * push dialer checks what they resolve to, by the same rules, when it dials.
 */
import net from 'node:net';
import { addressRefusal } from '../../protocol/address.js';
import { HeraldError } from '../../protocol/errors.js';

export const WAKE_PATH = '/v1/wake';

export interface ParsedEndpoint {
  /** The URL as normalised by WHATWG URL parsing (IPv4 forms, IPv6 compression, case). */
  url: string;
  /** Hostname without IPv6 brackets. */
  host: string;
}

/**
 * Parses and checks an endpoint URL's form.
 * @throws HeraldError bad_endpoint | link_local_endpoint | forbidden_endpoint (field `field`)
 */
export function parseEndpoint(raw: string, field = 'url'): ParsedEndpoint {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new HeraldError('bad_endpoint', 'the endpoint is not a URL', { field });
  }
  if (u.protocol !== 'wss:') throw new HeraldError('bad_endpoint', 'the endpoint must use wss://', { field });
  if (u.pathname !== WAKE_PATH)
    throw new HeraldError('bad_endpoint', `the endpoint path must be ${WAKE_PATH}`, { field });
  if (u.username || u.password || u.search || u.hash)
    throw new HeraldError('bad_endpoint', 'the endpoint must not carry user info, query or fragment', { field });
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
  if (host === '') throw new HeraldError('bad_endpoint', 'the endpoint has no host', { field });
  const refusal = addressRefusal(host);
  if (refusal !== null)
    throw new HeraldError(
      refusal.code,
      `the endpoint host is ${REFUSAL_TEXT[refusal.kind]}${refusal.carriedIpv4 ? ` (it carries ${refusal.carriedIpv4})` : ''}`,
      { field },
    );
  return { url: u.toString(), host };
}

/** Whether `host` (an address or a name) is one of the SANs; IP forms are normalised first. */
export function hostInSans(host: string, dns: readonly string[], ips: readonly string[]): boolean {
  const kind = net.isIP(host);
  if (kind !== 0) {
    const want = normalizeIp(host);
    return ips.some((ip) => normalizeIp(ip) === want);
  }
  const name = host.toLowerCase().replace(/\.$/, '');
  return dns.some((d) => d.toLowerCase().replace(/\.$/, '') === name);
}

/** A canonical text form of an IPv4 or IPv6 address (IPv6 compressed, lowercase). */
export function normalizeIp(ip: string): string {
  const trimmed = ip.trim();
  if (net.isIPv4(trimmed)) return trimmed;
  try {
    return new URL(`http://[${trimmed}]/`).hostname.slice(1, -1);
  } catch {
    return trimmed.toLowerCase();
  }
}

const REFUSAL_TEXT = {
  unspecified: 'an unspecified address',
  link_local: 'a link-local address',
  metadata: 'a cloud metadata service address',
} as const;

/** Whether `host` is a link-local address in any spelling (protocol/address.ts decides). */
export function isLinkLocal(host: string): boolean {
  return addressRefusal(host)?.kind === 'link_local';
}
