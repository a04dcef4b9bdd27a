/**
 * certs/x509-parse.ts: a certificate's bytes are parsed once; the same bytes give the same
 * object, other bytes another; bytes that are not a certificate still throw and are not kept;
 * the cache keeps its bound, the least recently used going first.
 */
import crypto from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { X509ParseCache, x509Of } from '../../certs/x509-parse.js';
import { makeTestPki, type TestPki } from '../helpers/pki.js';

let pki: TestPki;
beforeAll(async () => {
  pki = await makeTestPki({ agents: ['n1', 'n2', 'n3'] });
});
afterAll(() => pki.cleanup());

const der = (name: string): Buffer => new crypto.X509Certificate(pki.cred('agent', name).cert).raw;

describe('x509Of', () => {
  it('gives the same parsed object for the same bytes, another for other bytes', () => {
    const a = x509Of(der('n1'));
    expect(x509Of(Buffer.from(der('n1')))).toBe(a);
    const b = x509Of(der('n2'));
    expect(b).not.toBe(a);
    expect(a.subjectAltName).toContain('/agent/n1');
    expect(b.subjectAltName).toContain('/agent/n2');
  });

  it('parses PEM bytes too', () => {
    expect(x509Of(pki.cred('agent', 'n3').cert).subjectAltName).toContain('/agent/n3');
  });
});

describe('X509ParseCache', () => {
  it('throws for bytes that are not a certificate, and keeps nothing for them', () => {
    const c = new X509ParseCache(4);
    expect(() => c.parse(Buffer.from('not a certificate'))).toThrow();
    expect(c.size).toBe(0);
  });

  it('keeps at most its bound, dropping the least recently used', () => {
    const c = new X509ParseCache(2);
    const n1 = c.parse(der('n1'));
    const n2 = c.parse(der('n2'));
    expect(c.parse(der('n1'))).toBe(n1); // n1 used again: n2 is now the oldest
    c.parse(der('n3'));
    expect(c.size).toBe(2);
    expect(c.parse(der('n1'))).toBe(n1);
    expect(c.parse(der('n2'))).not.toBe(n2); // n2 was dropped: parsed anew
  });
});
