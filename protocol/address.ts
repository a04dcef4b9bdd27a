/**
 * The one address classifier (docs/api.md, agent routes): which IP addresses the controller must
 * never dial, used when an agent announces its endpoint (controller/service/endpoint.ts) and again when
 * the push dialer connects, on every address a DNS name resolves to (controller/push/dialer.ts).
 *
 * An IPv6 address that carries an IPv4 address is read as that IPv4 address: IPv4-mapped
 * (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) and
 * NAT64 (`64:ff9b::a.b.c.d`), whatever the spelling (dotted tail, hex groups, leading zeros,
 * case, `::` anywhere). Refused: unspecified addresses, link-local ones (169.254/16, fe80::/10)
 * and the well-known cloud metadata services. Loopback and private ranges stay allowed (tests
 * and private networks dial them).
 *
 * Pure: text in, bytes and verdicts out; no resolver and no sockets (node:net is not needed,
 * the parser below is strict and is what the verdict is computed on).
 */
import type { ErrorCode } from './errors.js';

/** Why an address is refused. */
export type AddressRefusalKind = 'unspecified' | 'link_local' | 'metadata';

export interface AddressRefusal {
  kind: AddressRefusalKind;
  /**
   * The refusal code: `bad_endpoint` for an unspecified address and `link_local_endpoint` for a
   * link-local one (the codes these had before), `forbidden_endpoint` for a metadata address
   * outside link-local space.
   */
  code: ErrorCode;
  /** The IPv4 address an IPv6 form carried, when that is what was refused. */
  carriedIpv4?: string;
}

/** IPv4 cloud metadata services: AWS/GCP/Azure/OCI (link-local anyway), Alibaba, Azure's wire server. */
const METADATA_IPV4 = ['169.254.169.254', '100.100.100.200', '168.63.129.16'];
/** IPv6 cloud metadata services: AWS IMDS on Nitro. */
const METADATA_IPV6 = ['fd00:ec2::254'];

const IPV4_RE =
  /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;
const HEX_GROUP_RE = /^[0-9a-fA-F]{1,4}$/;

/** Four bytes of a dotted-quad IPv4 address (no leading zeros: those are ambiguous), or null. */
export function parseIpv4(text: string): Uint8Array | null {
  const m = IPV4_RE.exec(text);
  if (!m) return null;
  return Uint8Array.from(m.slice(1, 5).map(Number));
}

/**
 * Sixteen bytes of an IPv6 address in any RFC 4291 text form (a dotted IPv4 tail included), or
 * null. A zone (`%eth0`) is not an address: null.
 */
export function parseIpv6(text: string): Uint8Array | null {
  if (text.length > 45 || !text.includes(':')) return null;
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const groupsOf = (s: string): number[] | null => {
    if (s === '') return [];
    const parts = s.split(':');
    const out: number[] = [];
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i]!;
      if (i === parts.length - 1 && p.includes('.')) {
        const v4 = parseIpv4(p);
        if (!v4) return null;
        out.push((v4[0]! << 8) | v4[1]!, (v4[2]! << 8) | v4[3]!);
      } else if (HEX_GROUP_RE.test(p)) {
        out.push(parseInt(p, 16));
      } else {
        return null;
      }
    }
    return out;
  };
  const head = groupsOf(halves[0]!);
  const tail = halves.length === 2 ? groupsOf(halves[1]!) : [];
  if (head === null || tail === null) return null;
  // a dotted tail may only end the address
  if (halves.length === 2 && halves[0]!.includes('.')) return null;
  let groups: number[];
  if (halves.length === 2) {
    const fill = 8 - head.length - tail.length;
    if (fill < 1) return null;
    groups = [...head, ...new Array<number>(fill).fill(0), ...tail];
  } else {
    groups = head;
  }
  if (groups.length !== 8) return null;
  const b = new Uint8Array(16);
  groups.forEach((g, i) => {
    b[2 * i] = g >> 8;
    b[2 * i + 1] = g & 0xff;
  });
  return b;
}

/** 4 or 16 bytes of an IP address in text, or null when `text` is not one (a DNS name, say). */
export function parseIp(text: string): Uint8Array | null {
  return parseIpv4(text) ?? parseIpv6(text);
}

function zero(b: Uint8Array, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (b[i] !== 0) return false;
  return true;
}

/**
 * The IPv4 address an IPv6 address carries in its last 32 bits, when its prefix says it does:
 * `::ffff:0:0/96` (mapped), `::ffff:0:0:0/96` (translated), `64:ff9b::/96` (NAT64) and
 * `::/96` (compatible; `::1` is IPv6 loopback, not 0.0.0.1). Null otherwise.
 */
export function carriedIpv4(b: Uint8Array): Uint8Array | null {
  if (b.length !== 16) return null;
  const last = b.subarray(12, 16);
  const mapped = zero(b, 0, 10) && b[10] === 0xff && b[11] === 0xff;
  const translated = zero(b, 0, 8) && b[8] === 0xff && b[9] === 0xff && b[10] === 0 && b[11] === 0;
  const nat64 = b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zero(b, 4, 12);
  const compatible = zero(b, 0, 12) && !(zero(b, 12, 15) && b[15] === 1);
  return mapped || translated || nat64 || compatible ? Uint8Array.from(last) : null;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

const METADATA_V4_BYTES = METADATA_IPV4.map((s) => parseIpv4(s)!);
const METADATA_V6_BYTES = METADATA_IPV6.map((s) => parseIpv6(s)!);

function classifyV4(b: Uint8Array): AddressRefusalKind | null {
  if (zero(b, 0, 4)) return 'unspecified';
  if (b[0] === 169 && b[1] === 254) return 'link_local';
  if (METADATA_V4_BYTES.some((m) => sameBytes(m, b))) return 'metadata';
  return null;
}

function classifyV6(b: Uint8Array): AddressRefusalKind | null {
  if (zero(b, 0, 16)) return 'unspecified';
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0x80) return 'link_local';
  if (METADATA_V6_BYTES.some((m) => sameBytes(m, b))) return 'metadata';
  return null;
}

const CODE_OF: Record<AddressRefusalKind, ErrorCode> = {
  unspecified: 'bad_endpoint',
  link_local: 'link_local_endpoint',
  metadata: 'forbidden_endpoint',
};

/**
 * Whether the controller may dial `ip`: null when it may, the refusal when it may not. A text
 * that is not an IP address (a DNS name) is null here: names are checked on what they resolve to.
 */
export function addressRefusal(ip: string): AddressRefusal | null {
  const b = parseIp(ip);
  if (b === null) return null;
  if (b.length === 4) {
    const kind = classifyV4(b);
    return kind === null ? null : { kind, code: CODE_OF[kind] };
  }
  const own = classifyV6(b);
  if (own !== null) return { kind: own, code: CODE_OF[own] };
  const v4 = carriedIpv4(b);
  if (v4 === null) return null;
  const kind = classifyV4(v4);
  return kind === null ? null : { kind, code: CODE_OF[kind], carriedIpv4: Array.from(v4).join('.') };
}

/**
 * The text form of an IP address that every encoder reads the same way: dotted quad for IPv4,
 * eight four-digit lowercase hex groups for IPv6 (no `::`, no dotted tail: node-forge refuses the
 * one and miscounts some forms of the other). Null when `text` is not an IP address.
 */
export function expandedIp(text: string): string | null {
  const b = parseIp(text.trim());
  return b === null ? null : textOf(b);
}

function peerBytes(ip: string): Uint8Array | null {
  const b = parseIp(ip.trim());
  if (b === null || b.length === 4) return b;
  return carriedIpv4(b) ?? b;
}

function textOf(b: Uint8Array): string {
  if (b.length === 4) return Array.from(b).join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((b[i]! << 8) | b[i + 1]!).toString(16).padStart(4, '0'));
  return groups.join(':');
}

/** The prefix lengths of a peer's host and network (peerNetworks). */
export const PEER_HOST_BITS_IPV4 = 32;
export const PEER_HOST_BITS_IPV6 = 64;
export const PEER_NETWORK_BITS_IPV4 = 24;
export const PEER_NETWORK_BITS_IPV6 = 48;

/** `b` cut to its first `bits` bits, written as `a.b.c.0/24` or `2001:db8:1::/48`. */
function prefixText(b: Uint8Array, bits: number): string {
  if (b.length === 4) return `${Array.from(b, (x, i) => (i * 8 >= bits ? 0 : x)).join('.')}/${bits}`;
  const groups: string[] = [];
  for (let i = 0; i < bits / 8; i += 2) groups.push(((b[i]! << 8) | b[i + 1]!).toString(16));
  return `${groups.join(':')}::/${bits}`;
}

/**
 * The one answer to "which peer is this" before the peer is known, for every limit kept per
 * peer: the pre-authentication connection caps (controller/admission.ts) and the enrolment
 * rate limits (controller/api/server.ts, SECURITY.md "Enrolment") key on the same two networks.
 * A host is an IPv4 /32 or an IPv6 /64 (the smallest prefix a site is given: a host can pick any
 * of its 2^64 addresses); its network is an IPv4 /24 or an IPv6 /48 (one site's allocation). An
 * IPv6 address that carries an IPv4 address (mapped, NAT64, ...: a dual-stack server reports
 * `::ffff:a.b.c.d`) counts as that IPv4 address, whatever the spelling. Text that is not an
 * address is its own host and network.
 */
export function peerNetworks(ip: string): { host: string; network: string } {
  const b = peerBytes(ip);
  if (b === null) return { host: ip, network: ip };
  if (b.length === 4)
    return { host: prefixText(b, PEER_HOST_BITS_IPV4), network: prefixText(b, PEER_NETWORK_BITS_IPV4) };
  return { host: prefixText(b, PEER_HOST_BITS_IPV6), network: prefixText(b, PEER_NETWORK_BITS_IPV6) };
}
