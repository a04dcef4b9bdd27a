/**
 * The one address classifier (protocol/address.ts) and the endpoint check built on it
 * (controller/service/endpoint.ts): every spelling of a refused address is refused with its code, and
 * the addresses Herald must keep dialling (loopback, private ranges, public ones) are not.
 * Socket-free; the dial-time check is test/controller/endpoint-dial.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { addressRefusal, carriedIpv4, expandedIp, parseIp } from '../../protocol/address.js';
import { parseEndpoint } from '../../controller/service/endpoint.js';
import { HeraldError } from '../../protocol/errors.js';

function endpointCode(host: string): string | null {
  try {
    parseEndpoint(`wss://${host}:7443/v1/wake`);
    return null;
  } catch (err) {
    if (err instanceof HeraldError) return err.code;
    throw err;
  }
}

/** [spelling, as a URL host, the code both the classifier and the endpoint check give] */
const REFUSED: Array<[string, string, string]> = [
  // the cloud metadata address, every way it can be written
  ['169.254.169.254', '169.254.169.254', 'link_local_endpoint'],
  ['169.254.169.254 as one decimal number', '2852039166', 'link_local_endpoint'],
  ['169.254.169.254 in hex octets', '0xa9.0xfe.0xa9.0xfe', 'link_local_endpoint'],
  ['169.254.169.254 in octal octets', '0251.0376.0251.0376', 'link_local_endpoint'],
  ['IPv4-mapped, dotted tail', '[::ffff:169.254.169.254]', 'link_local_endpoint'],
  ['IPv4-mapped, hex', '[::ffff:a9fe:a9fe]', 'link_local_endpoint'],
  ['IPv4-mapped, uncompressed with leading zeros', '[0000:0000:0000:0000:0000:FFFF:A9FE:A9FE]', 'link_local_endpoint'],
  ['IPv4-translated (SIIT)', '[::ffff:0:a9fe:a9fe]', 'link_local_endpoint'],
  ['IPv4-compatible, hex', '[::a9fe:a9fe]', 'link_local_endpoint'],
  ['IPv4-compatible, dotted tail', '[::169.254.169.254]', 'link_local_endpoint'],
  ['NAT64, hex', '[64:ff9b::a9fe:a9fe]', 'link_local_endpoint'],
  ['NAT64, dotted tail', '[64:ff9b::169.254.169.254]', 'link_local_endpoint'],
  ['NAT64, uncompressed', '[0064:ff9b:0:0:0:0:a9fe:a9fe]', 'link_local_endpoint'],
  // link-local space
  ['169.254.0.1', '169.254.0.1', 'link_local_endpoint'],
  ['fe80::1', '[fe80::1]', 'link_local_endpoint'],
  ['febf:ffff::1 (top of fe80::/10)', '[febf:ffff::1]', 'link_local_endpoint'],
  ['FE80::1 uppercase', '[FE80::1]', 'link_local_endpoint'],
  ['NAT64 of 169.254.1.1', '[64:ff9b::169.254.1.1]', 'link_local_endpoint'],
  // unspecified
  ['0.0.0.0', '0.0.0.0', 'bad_endpoint'],
  ['0 as one number', '0', 'bad_endpoint'],
  ['::', '[::]', 'bad_endpoint'],
  ['::ffff:0:0 (mapped 0.0.0.0)', '[::ffff:0:0]', 'bad_endpoint'],
  ['::ffff:0.0.0.0', '[::ffff:0.0.0.0]', 'bad_endpoint'],
  ['64:ff9b:: (NAT64 of 0.0.0.0)', '[64:ff9b::]', 'bad_endpoint'],
  ['0:0:0:0:0:0:0:0', '[0:0:0:0:0:0:0:0]', 'bad_endpoint'],
  // metadata services outside link-local space
  ['fd00:ec2::254', '[fd00:ec2::254]', 'forbidden_endpoint'],
  ['fd00:ec2::254 uncompressed, uppercase', '[FD00:0EC2:0000:0000:0000:0000:0000:0254]', 'forbidden_endpoint'],
  ['100.100.100.200', '100.100.100.200', 'forbidden_endpoint'],
  ['100.100.100.200 as one number', '1684301000', 'forbidden_endpoint'],
  ['100.100.100.200 IPv4-mapped', '[::ffff:100.100.100.200]', 'forbidden_endpoint'],
  ['100.100.100.200 NAT64', '[64:ff9b::6464:64c8]', 'forbidden_endpoint'],
  ['100.100.100.200 IPv4-compatible', '[::6464:64c8]', 'forbidden_endpoint'],
  ['168.63.129.16', '168.63.129.16', 'forbidden_endpoint'],
  ['168.63.129.16 IPv4-mapped hex', '[::ffff:a83f:8110]', 'forbidden_endpoint'],
  ['168.63.129.16 NAT64', '[64:ff9b::168.63.129.16]', 'forbidden_endpoint'],
];

const ALLOWED: string[] = [
  '127.0.0.1',
  '[::1]',
  '[::ffff:127.0.0.1]',
  '10.0.0.5',
  '192.168.1.10',
  '100.64.0.1',
  '100.100.100.201',
  '168.63.129.17',
  '169.253.255.255',
  '169.255.0.1',
  '[fec0::1]',
  '[fd00:ec2::253]',
  '[fd00:ec3::254]',
  '[2001:db8::1]',
  '[64:ff9b::a01:5]',
  '[64:ff9b:1::a9fe:a9fe]',
  'localhost',
  'agent-1.example',
];

describe('address classifier: refused in every spelling', () => {
  it.each(REFUSED)('%s (%s) is refused at announcement with %s', (_what, host, code) => {
    expect(endpointCode(host)).toBe(code);
  });

  it.each(REFUSED)('%s (%s) is refused by the classifier the dialer uses with %s', (_what, host, code) => {
    // the dialer sees resolver output and URL hostnames, which WHATWG URL has normalised
    const h = new URL(`wss://${host}:1/`).hostname.replace(/^\[|\]$/g, '');
    expect(addressRefusal(h)?.code).toBe(code);
  });

  it('the raw text forms, not only URL-normalised ones, are refused', () => {
    for (const ip of [
      '::ffff:169.254.169.254',
      '0:0:0:0:0:ffff:169.254.169.254',
      '::169.254.169.254',
      '64:ff9b::169.254.169.254',
      '64:FF9B:0000::A9FE:A9FE',
      '::ffff:0:0',
      'fd00:ec2:0::254',
      'FE80::1',
    ]) {
      expect(addressRefusal(ip), ip).not.toBeNull();
    }
  });
});

describe('address classifier: what stays allowed', () => {
  it.each(ALLOWED)('%s is allowed', (host) => {
    expect(endpointCode(host)).toBeNull();
    expect(addressRefusal(host.replace(/^\[|\]$/g, ''))).toBeNull();
  });
});

describe('address parsing', () => {
  it('reads the IPv4 address a mapped, translated, compatible or NAT64 address carries, and not ::1', () => {
    const v4 = (s: string) => {
      const b = carriedIpv4(parseIp(s)!);
      return b === null ? null : Array.from(b).join('.');
    };
    expect(v4('::ffff:a9fe:a9fe')).toBe('169.254.169.254');
    expect(v4('::ffff:0:a9fe:a9fe')).toBe('169.254.169.254');
    expect(v4('::a9fe:a9fe')).toBe('169.254.169.254');
    expect(v4('64:ff9b::a9fe:a9fe')).toBe('169.254.169.254');
    expect(v4('::1')).toBeNull();
    expect(v4('2001:db8::a9fe:a9fe')).toBeNull();
  });

  it('refuses what is not an address: zones, too many groups, two ::, leading-zero IPv4, a dotted part not at the end', () => {
    for (const s of [
      'fe80::1%eth0',
      '1:2:3:4:5:6:7:8:9',
      '1::2::3',
      '01.2.3.4',
      '1.2.3',
      '1.2.3.4.5',
      '::1.2.3.4:5',
      '1.2.3.4::',
      '12345::',
      ':1::',
      '',
      'localhost',
    ]) {
      expect(parseIp(s), s).toBeNull();
    }
  });

  it('expands IPv6 to eight four-digit groups and keeps IPv4 dotted', () => {
    expect(expandedIp('::ffff:169.254.169.254')).toBe('0000:0000:0000:0000:0000:ffff:a9fe:a9fe');
    expect(expandedIp('fd00:ec2::254')).toBe('fd00:0ec2:0000:0000:0000:0000:0000:0254');
    expect(expandedIp('::')).toBe('0000:0000:0000:0000:0000:0000:0000:0000');
    expect(expandedIp('10.0.0.5')).toBe('10.0.0.5');
    expect(expandedIp('not-an-ip')).toBeNull();
  });
});
