/**
 * Admission of connections without a valid certificate (controller/admission.ts): the pool, one
 * host (IPv4 address, IPv6 /64) and one network (IPv4 /24, IPv6 /48: the networks the enrolment
 * rate limits key on, protocol/address.ts peerNetworks) are each capped, whatever an address's
 * spelling, and a released place is free again.
 */
import { describe, expect, it } from 'vitest';
import { ConnectionAdmission } from '../../controller/admission.js';

describe('ConnectionAdmission', () => {
  it('caps one host, then its network, then the pool, and names the cap', () => {
    const a = new ConnectionAdmission({ total: 8, perHost: 2, perNetwork: 3 });
    expect(a.admit('10.0.0.1').ok).toBe(true);
    expect(a.admit('::ffff:10.0.0.1').ok).toBe(true);
    expect(a.admit('10.0.0.1')).toEqual({ ok: false, scope: 'host' });
    expect(a.admit('10.0.0.2').ok).toBe(true);
    expect(a.admit('10.0.0.3')).toEqual({ ok: false, scope: 'network' });
    // an IPv6 /64 is one host, whichever of its addresses a connection comes from
    expect(a.admit('2001:db8:0:1::1').ok).toBe(true);
    expect(a.admit('2001:db8:0:1:ffff::1').ok).toBe(true);
    expect(a.admit('2001:db8:0:1::3')).toEqual({ ok: false, scope: 'host' });
    // an IPv6 /48 is one network, whichever of its 65,536 /64s a connection comes from
    expect(a.admit('2001:db8:0:2::1').ok).toBe(true);
    expect(a.admit('2001:db8:0:3::1')).toEqual({ ok: false, scope: 'network' });
    expect(a.admit('2001:db8:0:ffff::1')).toEqual({ ok: false, scope: 'network' });
    expect(a.admit('2001:db8:1::1').ok).toBe(true);
    expect(a.admit('10.0.1.1').ok).toBe(true);
    expect(a.size).toBe(8);
    expect(a.admit('10.0.2.1')).toEqual({ ok: false, scope: 'total' });
  });

  it('frees a place when a connection is released, once however often release is called', () => {
    const a = new ConnectionAdmission({ total: 2, perHost: 1, perNetwork: 2 });
    const first = a.admit('10.0.0.1');
    expect(first.ok).toBe(true);
    expect(a.admit('10.0.0.1')).toEqual({ ok: false, scope: 'host' });
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
    expect(() => new ConnectionAdmission({ total: 0, perHost: 1, perNetwork: 1 })).toThrow(TypeError);
    expect(() => new ConnectionAdmission({ total: 1, perHost: 1.5, perNetwork: 1 })).toThrow(TypeError);
  });
});
