import crypto from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { identityOf, normalizeSerial, parseSubjectAltName, trustDomainOf } from '../../certs/identity.js';
import { makeCa, makeCertificate, newRsaKeyPem, type MakeCertificateOptions, type Pem } from '../../certs/pki.js';
import { codeOf } from '../../protocol/errors.js';

const TD = 'herald.local';
let ca: Pem;
let keyPem: string;
beforeAll(() => {
  keyPem = newRsaKeyPem();
  ca = makeCa({ trustDomain: TD, keyPem: newRsaKeyPem() });
});

const both = { serverAuth: true, clientAuth: true };
function cert(o: Partial<MakeCertificateOptions>): string {
  return makeCertificate({ issuer: ca, uris: [], eku: both, keyPem, ...o }).cert;
}
function refusal(pem: string, td = TD): string | undefined {
  try {
    identityOf(pem, td);
  } catch (err) {
    return codeOf(err) ?? `not coded: ${String(err)}`;
  }
  return 'accepted';
}

describe('identityOf', () => {
  it('reads each role from its single URI SAN, as PEM, X509Certificate or peer certificate', () => {
    const agentPem = cert({ uris: ['spiffe://herald.local/agent/n1'], dns: ['n1.example'], ip: ['10.0.0.5'] });
    const x = new crypto.X509Certificate(agentPem);
    const id = identityOf(agentPem, TD);
    expect(id).toMatchObject({
      role: 'agent',
      name: 'n1',
      trustDomain: TD,
      spiffeId: 'spiffe://herald.local/agent/n1',
      dns: ['n1.example'],
      ips: ['10.0.0.5'],
    });
    expect(id.serial).toBe(x.serialNumber.toLowerCase());
    expect(id.validTo.getTime()).toBe(Date.parse(x.validTo));
    expect(identityOf(x, TD)).toEqual(id);
    expect(identityOf({ raw: x.raw } as never, TD)).toEqual(id);
    expect(identityOf(cert({ uris: ['spiffe://herald.local/controller/controller'] }), TD)).toMatchObject({
      role: 'controller',
      name: 'controller',
    });
    expect(
      identityOf(cert({ uris: ['spiffe://herald.local/operator/admin'], eku: { clientAuth: true } }), TD),
    ).toMatchObject({ role: 'operator', name: 'admin' });
    // an operator certificate that could also serve is still an operator
    expect(identityOf(cert({ uris: ['spiffe://herald.local/operator/ops.1'] }), TD)).toMatchObject({
      role: 'operator',
      name: 'ops.1',
    });
  });

  it('refuses a certificate with no URI SAN, or a non-SPIFFE one', () => {
    expect(refusal(cert({ uris: [] }))).toBe('no_identity');
    expect(refusal(cert({ uris: [], dns: ['spiffe.example'] }))).toBe('no_identity');
    expect(refusal(cert({ uris: ['https://herald.local/agent/n1'] }))).toBe('no_identity');
    expect(refusal('not a certificate')).toBe('no_identity');
  });

  it('refuses several URI SANs, even two equal ones', () => {
    expect(
      refusal(cert({ uris: ['spiffe://herald.local/agent/n1', 'spiffe://herald.local/controller/controller'] })),
    ).toBe('multiple_identities');
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n1', 'spiffe://herald.local/agent/n1'] }))).toBe(
      'multiple_identities',
    );
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n1', 'https://example.com/'] }))).toBe(
      'multiple_identities',
    );
  });

  it('refuses a foreign trust domain', () => {
    expect(refusal(cert({ uris: ['spiffe://other.example/agent/n1'] }))).toBe('wrong_trust_domain');
    expect(refusal(cert({ uris: ['spiffe://herald.local.evil/agent/n1'] }))).toBe('wrong_trust_domain');
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n1'] }), 'other.example')).toBe('wrong_trust_domain');
  });

  it('refuses a path that is not exactly <role>/<name>', () => {
    for (const uri of [
      'spiffe://herald.local/agent/n1/extra',
      'spiffe://herald.local/agent',
      'spiffe://herald.local/agent/',
      'spiffe://herald.local//agent/n1',
      'spiffe://herald.local/admin/n1',
      'spiffe://herald.local/Agent/n1',
      'spiffe://herald.local/agent/N1',
      'spiffe://herald.local/agent/..',
      'spiffe://herald.local/agent/n1?x=1',
      'spiffe://herald.local/agent/n1#f',
      'spiffe://herald.local/agent/a,b',
    ]) {
      expect(refusal(cert({ uris: [uri] })), uri).toBe('bad_identity');
    }
  });

  it('refuses percent-escapes anywhere in the id', () => {
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n%31'] }))).toBe('bad_identity');
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent%2fn1'] }))).toBe('bad_identity');
    expect(refusal(cert({ uris: ['spiffe://herald.local/%61gent/n1'] }))).toBe('bad_identity');
  });

  it('refuses a certificate whose EKUs do not fit its role', () => {
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n1'], eku: { clientAuth: true } }))).toBe('wrong_eku');
    expect(refusal(cert({ uris: ['spiffe://herald.local/agent/n1'], eku: { serverAuth: true } }))).toBe('wrong_eku');
    expect(refusal(cert({ uris: ['spiffe://herald.local/controller/c'], eku: { clientAuth: true } }))).toBe(
      'wrong_eku',
    );
    expect(refusal(cert({ uris: ['spiffe://herald.local/operator/admin'], eku: { serverAuth: true } }))).toBe(
      'wrong_eku',
    );
    expect(refusal(cert({ uris: ['spiffe://herald.local/operator/admin'], eku: {} }))).toBe('wrong_eku');
  });

  it('is not fooled by a DNS SAN that prints like a second URI SAN', () => {
    const pem = cert({
      uris: ['spiffe://herald.local/agent/n1'],
      dns: ['x, URI:spiffe://herald.local/controller/controller'],
    });
    expect(new crypto.X509Certificate(pem).subjectAltName).toMatch(/DNS:"x\\u002c URI:/);
    expect(identityOf(pem, TD)).toMatchObject({ role: 'agent', name: 'n1' });
    const pem2 = cert({ uris: [], dns: ['x, URI:spiffe://herald.local/controller/controller'] });
    expect(refusal(pem2)).toBe('no_identity');
  });
});

describe('helpers', () => {
  it('parses quoted subjectAltName values', () => {
    expect(parseSubjectAltName('DNS:a, URI:"spiffe://x/a, b", IP Address:1.2.3.4')).toEqual([
      { type: 'DNS', value: 'a' },
      { type: 'URI', value: 'spiffe://x/a, b' },
      { type: 'IP Address', value: '1.2.3.4' },
    ]);
    expect(parseSubjectAltName(undefined)).toEqual([]);
    expect(() => parseSubjectAltName('URI:"unterminated')).toThrow();
  });

  it('normalizes serials and reads a CA trust domain', () => {
    expect(normalizeSerial('0x00:4A:bc')).toBe('4abc');
    expect(normalizeSerial('4ABC')).toBe('4abc');
    expect(trustDomainOf(ca.cert)).toBe(TD);
  });
});
