/**
 * Admission of connections without a valid certificate (controller/api/admission.ts): the pool, one
 * address and one network (IPv4 /24, IPv6 /64) are each capped, whatever an address's spelling,
 * and a released place is free again.
 */
import { describe, expect, it } from 'vitest';
import { ConnectionAdmission } from '../../controller/api/admission.js';
import { peerAddressKey, peerPrefixKey } from '../../protocol/address.js';

describe('peer address and network keys', () => {
  it('reads an IPv4-mapped IPv6 address as its IPv4 address, and every IPv6 spelling alike', () => {
    expect(peerAddressKey('::ffff:10.1.2.3')).toBe('10.1.2.3');
    expect(peerAddressKey('::FFFF:a01:203')).toBe('10.1.2.3');
    expect(peerAddressKey('2001:DB8::1')).toBe(peerAddressKey('2001:0db8:0:0:0:0:0:0001'));
    expect(peerPrefixKey('10.1.2.3')).toBe('10.1.2.0/24');
    expect(peerPrefixKey('::ffff:10.1.2.200')).toBe('10.1.2.0/24');
    expect(peerPrefixKey('2001:db8:1:2:aaaa::1')).toBe('2001:0db8:0001:0002::/64');
    expect(peerPrefixKey('2001:db8:1:3::1')).not.toBe(peerPrefixKey('2001:db8:1:2::1'));
    expect(peerPrefixKey('not-an-ip')).toBe('not-an-ip');
  });
});

describe('ConnectionAdmission', () => {
  it('caps one address, then its network, then the pool, and names the cap', () => {
    const a = new ConnectionAdmission({ total: 7, perAddress: 2, perPrefix: 3 });
    expect(a.admit('10.0.0.1').ok).toBe(true);
    expect(a.admit('::ffff:10.0.0.1').ok).toBe(true);
    expect(a.admit('10.0.0.1')).toEqual({ ok: false, scope: 'address' });
    expect(a.admit('10.0.0.2').ok).toBe(true);
    expect(a.admit('10.0.0.3')).toEqual({ ok: false, scope: 'prefix' });
    expect(a.admit('2001:db8::1').ok).toBe(true);
    expect(a.admit('2001:db8::ffff:1').ok).toBe(true);
    expect(a.admit('2001:db8::3').ok).toBe(true);
    expect(a.admit('2001:db8::4')).toEqual({ ok: false, scope: 'prefix' });
    expect(a.admit('10.0.1.1').ok).toBe(true);
    expect(a.size).toBe(7);
    expect(a.admit('10.0.2.1')).toEqual({ ok: false, scope: 'total' });
  });

  it('frees a place when a connection is released, once however often release is called', () => {
    const a = new ConnectionAdmission({ total: 2, perAddress: 1, perPrefix: 2 });
    const first = a.admit('10.0.0.1');
    expect(first.ok).toBe(true);
    expect(a.admit('10.0.0.1')).toEqual({ ok: false, scope: 'address' });
    if (first.ok) {
      first.release();
      first.release();
    }
    expect(a.size).toBe(0);
    expect(a.admit('10.0.0.1').ok).toBe(true);
    expect(a.admit('10.0.0.2').ok).toBe(true);
    expect(a.admit('10.0.0.3')).toEqual({ ok: false, scope: 'total' });
  });

  it('refuses caps that are not whole numbers of at least 1', () => {
    expect(() => new ConnectionAdmission({ total: 0, perAddress: 1, perPrefix: 1 })).toThrow(TypeError);
    expect(() => new ConnectionAdmission({ total: 1, perAddress: 1.5, perPrefix: 1 })).toThrow(TypeError);
  });
});
