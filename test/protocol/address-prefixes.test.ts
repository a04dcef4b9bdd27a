import { describe, expect, it } from 'vitest';
import { peerNetworks } from '../../protocol/address.js';

describe('peerNetworks (the keys of every limit before authentication)', () => {
  it('counts every address of an IPv6 /64 as one host and of a /48 as one network', () => {
    const a = peerNetworks('2001:db8:1:2::1');
    const b = peerNetworks('2001:db8:1:2:ffff:ffff:ffff:fffe');
    const c = peerNetworks('2001:db8:1:3::1');
    expect(a).toEqual({ host: '2001:db8:1:2::/64', network: '2001:db8:1::/48' });
    expect(b).toEqual(a);
    expect(c.host).not.toBe(a.host);
    expect(c.network).toBe(a.network);
    expect(peerNetworks('2001:db8:2::1').network).not.toBe(a.network);
  });

  it('counts IPv4 per /32 and /24, whatever IPv6 form carries it', () => {
    const v4 = peerNetworks('192.0.2.7');
    expect(v4).toEqual({ host: '192.0.2.7/32', network: '192.0.2.0/24' });
    expect(peerNetworks('::ffff:192.0.2.7')).toEqual(v4);
    expect(peerNetworks('::ffff:c000:207')).toEqual(v4);
    expect(peerNetworks('64:ff9b::192.0.2.7')).toEqual(v4);
    expect(peerNetworks('192.0.2.8').network).toBe(v4.network);
    expect(peerNetworks('192.0.3.7').network).not.toBe(v4.network);
  });

  it('reads every IPv6 spelling alike (case, zeros, where the :: is)', () => {
    expect(peerNetworks('2001:DB8:1:2:0:0:0:1')).toEqual(peerNetworks('2001:0db8:0001:0002::0001'));
    expect(peerNetworks(' 2001:db8:1:2::1 ')).toEqual(peerNetworks('2001:db8:1:2::1'));
  });

  it('keeps text that is not an address as its own key', () => {
    expect(peerNetworks('?')).toEqual({ host: '?', network: '?' });
  });
});
