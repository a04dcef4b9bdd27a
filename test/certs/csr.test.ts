import crypto from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { certificateSha256, makeCsr } from '../../certs/csr.js';
import { readCsr } from '../../certs/csr-verify.js';
import { newRsaKeyPem } from '../../certs/pki.js';
import { codeOf } from '../../protocol/errors.js';
import { normalizeFingerprint, renewAtMs, renewalState, renewalWarnAtMs } from '../../protocol/enroll.js';

const key = newRsaKeyPem();

describe('CSRs made without node-forge (certs/csr.ts), read with it (certs/csr-verify.ts)', () => {
  it('carries the key and the SANs asked for, and verifies', () => {
    const pem = makeCsr({
      keyPem: key,
      commonName: 'n1',
      uris: ['spiffe://herald.local/agent/n1'],
      dns: ['n1.example'],
      ips: ['127.0.0.1', '::1'],
    });
    const r = readCsr(pem);
    expect(r.commonName).toBe('n1');
    expect(r.uris).toEqual(['spiffe://herald.local/agent/n1']);
    expect(r.dns).toEqual(['n1.example']);
    expect(r.ips).toEqual(['127.0.0.1', '0000:0000:0000:0000:0000:0000:0000:0001']);
    const want = crypto.createPublicKey(key).export({ type: 'spki', format: 'der' });
    expect(crypto.createPublicKey(r.publicKeyPem).export({ type: 'spki', format: 'der' }).equals(want)).toBe(true);
  });

  it('is a request OpenSSL reads and verifies too', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-csr-'));
    try {
      const f = path.join(dir, 'r.csr');
      fs.writeFileSync(f, makeCsr({ keyPem: key, commonName: 'n1', uris: ['spiffe://herald.local/agent/n1'] }));
      const out = execFileSync('openssl', ['req', '-in', f, '-noout', '-verify', '-text'], {
        encoding: 'utf8',
        stdio: 'pipe',
      });
      expect(out).toContain('URI:spiffe://herald.local/agent/n1');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a request whose signature does not match its content (bad_csr)', () => {
    const pem = makeCsr({ keyPem: key, commonName: 'n1', uris: ['spiffe://herald.local/agent/n1'] });
    const der = Buffer.from(pem.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    // the URI's last character, inside the signed part
    const i = der.indexOf(Buffer.from('agent/n1')) + 7;
    der[i] = 'x'.charCodeAt(0);
    const forged = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
    let code: unknown;
    try {
      readCsr(forged);
    } catch (err) {
      code = codeOf(err);
    }
    expect(code).toBe('bad_csr');
    for (const junk of ['', 'x', 42, `-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----`]) {
      expect(() => readCsr(junk)).toThrow(expect.objectContaining({ code: 'bad_csr' }));
    }
  });

  it('fingerprints as openssl prints them are normalised; anything else is bad_option', () => {
    const hex = 'ab'.repeat(32);
    expect(normalizeFingerprint(hex.toUpperCase().match(/../g)!.join(':'))).toBe(hex);
    expect(normalizeFingerprint(`sha256 Fingerprint=${hex}`)).toBe(hex);
    expect(() => normalizeFingerprint('abc')).toThrow(expect.objectContaining({ code: 'bad_option' }));
    expect(certificateSha256(Buffer.from('x'))).toHaveLength(64);
  });

  it('renewal is due at two thirds of the lifetime and overdue from 90 %', () => {
    expect(renewAtMs(0, 90_000)).toBe(60_000);
    expect(renewalWarnAtMs(0, 90_000)).toBe(81_000);
    expect(renewalState(0, 90_000, 59_999)).toBe('ok');
    expect(renewalState(0, 90_000, 60_000)).toBe('due');
    expect(renewalState(0, 90_000, 81_000)).toBe('overdue');
    expect(renewalState(0, 90_000, 90_001)).toBe('expired');
  });
});
