/**
 * The agent listener URL a node announces (SPEC §3): `wss://host:port/v1/wake`, whose host must
 * be one of the announcing certificate's DNS or IP SANs, so a stolen agent key cannot aim the
 * controller's dialer at another host. Link-local addresses (169.254/16, fe80::/10, cloud
 * metadata services live there) and unspecified ones are refused. Names are compared exactly
 * (no wildcard SANs) and are not resolved here.
 */
import net from 'node:net';
import { HeraldError } from '../protocol/errors.js';

export const WAKE_PATH = '/v1/wake';

export interface ParsedEndpoint {
  /** The URL as normalised by WHATWG URL parsing (IPv4 forms, IPv6 compression, case). */
  url: string;
  /** Hostname without IPv6 brackets. */
  host: string;
}

/**
 * Parses and checks an endpoint URL's form.
 * @throws HeraldError bad_endpoint | link_local_endpoint (field `field`)
 */
export function parseEndpoint(raw: string, field = 'url'): ParsedEndpoint {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new HeraldError('bad_endpoint', 'the endpoint is not a URL', { field });
  }
  if (u.protocol !== 'wss:') throw new HeraldError('bad_endpoint', 'the endpoint must use wss://', { field });
  if (u.pathname !== WAKE_PATH) throw new HeraldError('bad_endpoint', `the endpoint path must be ${WAKE_PATH}`, { field });
  if (u.username || u.password || u.search || u.hash) throw new HeraldError('bad_endpoint', 'the endpoint must not carry user info, query or fragment', { field });
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
  if (host === '') throw new HeraldError('bad_endpoint', 'the endpoint has no host', { field });
  if (isUnspecified(host)) throw new HeraldError('bad_endpoint', 'the endpoint host is an unspecified address', { field });
  if (isLinkLocal(host)) throw new HeraldError('link_local_endpoint', 'the endpoint host is a link-local address', { field });
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

export function isLinkLocal(host: string): boolean {
  if (net.isIPv4(host)) return host.startsWith('169.254.');
  if (!net.isIPv6(host)) return false;
  const n = normalizeIp(host);
  const first = parseInt(n.split(':')[0] || '0', 16);
  if ((first & 0xffc0) === 0xfe80) return true;
  // IPv4-mapped (::ffff:169.254.x.y, shown as ::ffff:a9fe:xxxx)
  const mapped = /^::ffff:([0-9a-f]{1,4}):[0-9a-f]{1,4}$/.exec(n);
  return mapped !== null && parseInt(mapped[1]!, 16) >> 8 === 0xa9 && (parseInt(mapped[1]!, 16) & 0xff) === 0xfe;
}

function isUnspecified(host: string): boolean {
  if (net.isIPv4(host)) return host === '0.0.0.0';
  return net.isIPv6(host) && normalizeIp(host) === '::';
}
