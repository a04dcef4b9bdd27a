import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as jose from 'jose';
import {
  bundle,
  initPki,
  issueCert,
  jwkThumbprint,
  listCerts,
  makeCertificate,
  newRsaKeyPem,
  randomSerial,
  revoke,
  rotateSigningKey,
  type Pem,
} from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { parseRevoked } from '../../certs/revoked.js';
import { codeOf } from '../../protocol/errors.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pki-test-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

const mode = (f: string): number => fs.statSync(f).mode & 0o777;
const readJson = (f: string): any => JSON.parse(fs.readFileSync(f, 'utf8'));
const openssl = (f: string): string =>
  execFileSync('openssl', ['x509', '-noout', '-text', '-in', f], { encoding: 'utf8' });
async function codeOfRejection(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    return codeOf(err) ?? `not a HeraldError: ${String(err)}`;
  }
  return 'resolved';
}

describe('initPki', () => {
  const dir = path.join(tmp, 'init');
  const p = pkiPaths(dir);
  beforeAll(async () => {
    await initPki({ dir, controllerDns: ['ctl.example'], controllerIp: ['10.1.2.3'] });
  });

  it('writes the documented layout with private keys 0600 and directories 0700', () => {
    for (const f of [p.caKey, p.signingJwk, p.key('controller', 'controller'), p.key('operator', 'admin')])
      expect(mode(f)).toBe(0o600);
    for (const f of [p.caCrt, p.jwks, p.revoked, p.cert('controller', 'controller'), p.cert('operator', 'admin')]) {
      expect(fs.existsSync(f)).toBe(true);
      expect(mode(f) & 0o022).toBe(0);
    }
    for (const d of [dir, p.roleDir('agent'), p.roleDir('controller'), p.roleDir('operator')])
      expect(mode(d)).toBe(0o700);
    expect(readJson(p.revoked)).toEqual({ serials: [], kids: [] });
  });

  it('writes a private signing JWK and a public JWKS with an RFC 7638 kid', async () => {
    const jwk = readJson(p.signingJwk);
    const jwks = readJson(p.jwks);
    expect(jwks.keys).toHaveLength(1);
    const pub = jwks.keys[0];
    expect(pub).toEqual({
      kty: 'OKP',
      crv: 'Ed25519',
      x: jwk.x,
      kid: jwk.kid,
      alg: 'EdDSA',
      use: 'sig',
      controller: 'controller',
    });
    expect('d' in pub).toBe(false);
    expect(typeof jwk.d).toBe('string');
    expect(pub.kid).toBe(await jose.calculateJwkThumbprint({ kty: 'OKP', crv: 'Ed25519', x: jwk.x }));
    expect(jwkThumbprint(pub)).toBe(pub.kid);
    // jose signs with the JWK and verifies against the JWKS (alg EdDSA matches the header)
    const jws = await new jose.CompactSign(new TextEncoder().encode('hi'))
      .setProtectedHeader({ alg: 'EdDSA', kid: jwk.kid })
      .sign(await jose.importJWK(jwk, 'EdDSA'));
    const v = await jose.compactVerify(jws, jose.createLocalJWKSet(jwks));
    expect(new TextDecoder().decode(v.payload)).toBe('hi');
  });

  it('makes the controller certificate with localhost, 127.0.0.1 and the given SANs, and operator admin', () => {
    const x = new crypto.X509Certificate(fs.readFileSync(p.cert('controller', 'controller')));
    expect(x.subjectAltName).toBe(
      'URI:spiffe://herald.local/controller/controller, DNS:localhost, DNS:ctl.example, IP Address:127.0.0.1, IP Address:10.1.2.3',
    );
    const op = new crypto.X509Certificate(fs.readFileSync(p.cert('operator', 'admin')));
    expect(op.subjectAltName).toBe('URI:spiffe://herald.local/operator/admin');
    const ca = new crypto.X509Certificate(fs.readFileSync(p.caCrt));
    expect(ca.ca).toBe(true);
    expect(x.verify(ca.publicKey) && op.verify(ca.publicKey)).toBe(true);
    expect(x.checkPrivateKey(crypto.createPrivateKey(fs.readFileSync(p.key('controller', 'controller'))))).toBe(true);
  });

  it('refuses to replace an existing CA and changes nothing', async () => {
    const before = [p.caCrt, p.caKey, p.jwks, p.signingJwk, p.cert('controller', 'controller')].map((f) =>
      fs.readFileSync(f),
    );
    expect(await codeOfRejection(initPki({ dir }))).toBe('pki_exists');
    expect(await codeOfRejection(initPki({ dir, trustDomain: 'other.example' }))).toBe('pki_exists');
    const after = [p.caCrt, p.caKey, p.jwks, p.signingJwk, p.cert('controller', 'controller')].map((f) =>
      fs.readFileSync(f),
    );
    after.forEach((b, i) => {
      expect(b.equals(before[i]!)).toBe(true);
    });
  });

  it('replaces the CA with force', async () => {
    const d2 = path.join(tmp, 'force');
    await initPki({ dir: d2 });
    const before = fs.readFileSync(pkiPaths(d2).caCrt);
    const r = await initPki({ dir: d2, force: true, trustDomain: 'second.example' });
    expect(fs.readFileSync(pkiPaths(d2).caCrt).equals(before)).toBe(false);
    expect(r.controller.spiffeId).toBe('spiffe://second.example/controller/controller');
  });

  it('checks its options before writing anything', async () => {
    const d3 = path.join(tmp, 'badopts');
    expect(await codeOfRejection(initPki({ dir: d3, trustDomain: 'Bad_Domain' }))).toBe('bad_option');
    expect(await codeOfRejection(initPki({ dir: d3, controllerIp: ['999.1.1.1'] }))).toBe('bad_option');
    expect(await codeOfRejection(initPki({ dir: d3, controllerDns: ['a b'] }))).toBe('bad_option');
    expect(fs.existsSync(d3)).toBe(false);
  });
});

describe('issueCert', () => {
  const dir = path.join(tmp, 'issue');
  const p = pkiPaths(dir);
  beforeAll(async () => {
    await initPki({ dir, trustDomain: 'td.example' });
  });

  it('issues an agent certificate with its URI SAN, DNS/IP SANs and both EKUs', async () => {
    const r = await issueCert({ dir, role: 'agent', name: 'n1', dns: ['n1.example'], ip: ['127.0.0.1', '::1'] });
    expect(r).toMatchObject({
      certPath: p.cert('agent', 'n1'),
      keyPath: p.key('agent', 'n1'),
      spiffeId: 'spiffe://td.example/agent/n1',
    });
    expect(mode(r.keyPath)).toBe(0o600);
    const text = openssl(r.certPath);
    expect(text).toMatch(/TLS Web Server Authentication, TLS Web Client Authentication/);
    expect(text).toMatch(/URI:spiffe:\/\/td\.example\/agent\/n1/);
    expect(text).toMatch(/DNS:n1\.example/);
    expect(text).toMatch(/IP Address:127\.0\.0\.1/);
    const x = new crypto.X509Certificate(fs.readFileSync(r.certPath));
    expect(x.serialNumber.toLowerCase()).toBe(r.serial);
    const days = (Date.parse(x.validTo) - Date.now()) / 86_400_000;
    expect(days).toBeGreaterThan(89.9);
    expect(days).toBeLessThan(90.1);
    expect(x.verify(new crypto.X509Certificate(fs.readFileSync(p.caCrt)).publicKey)).toBe(true);
  });

  it('gives operators clientAuth only and controllers both', async () => {
    const op = await issueCert({ dir, role: 'operator', name: 'alice', days: 7 });
    const t = openssl(op.certPath);
    expect(t).toMatch(/TLS Web Client Authentication/);
    expect(t).not.toMatch(/TLS Web Server Authentication/);
    expect((op.notAfter.getTime() - Date.now()) / 86_400_000).toBeCloseTo(7, 1);
    const ctl = await issueCert({ dir, role: 'controller', name: 'c2' });
    expect(openssl(ctl.certPath)).toMatch(/TLS Web Server Authentication, TLS Web Client Authentication/);
  });

  it('refuses bad roles and names without writing outside the layout', async () => {
    const ctl = fs.readFileSync(p.cert('controller', 'controller'));
    for (const name of ['../controller/controller', 'N1', 'a/b', '', '.hidden', '-x', 'x'.repeat(64), 'a b']) {
      expect(await codeOfRejection(issueCert({ dir, role: 'agent', name })), name).toBe('bad_identity');
    }
    expect(await codeOfRejection(issueCert({ dir, role: 'admin', name: 'x' }))).toBe('bad_identity');
    expect(await codeOfRejection(issueCert({ dir, role: 'agent', name: 'ok', ip: ['localhost'] }))).toBe('bad_option');
    expect(await codeOfRejection(issueCert({ dir, role: 'agent', name: 'ok', dns: ['*.example'] }))).toBe('bad_option');
    expect(await codeOfRejection(issueCert({ dir, role: 'agent', name: 'ok', days: 0 }))).toBe('bad_option');
    expect(await codeOfRejection(issueCert({ dir: path.join(tmp, 'nothing'), role: 'agent', name: 'ok' }))).toBe(
      'pki_missing',
    );
    expect(fs.readFileSync(p.cert('controller', 'controller')).equals(ctl)).toBe(true);
    expect(fs.existsSync(p.cert('agent', 'ok'))).toBe(false);
  });

  it('makes positive 128-bit serials with no leading zero byte (200 certificates)', () => {
    const ca: Pem = { cert: fs.readFileSync(p.caCrt, 'utf8'), key: fs.readFileSync(p.caKey, 'utf8') };
    const keyPem = newRsaKeyPem();
    const seen = new Set<string>();
    for (let i = 0; i < 200; i++) {
      const m = makeCertificate({
        issuer: ca,
        uris: ['spiffe://td.example/agent/s'],
        eku: { serverAuth: true, clientAuth: true },
        keyPem,
      });
      const serial = new crypto.X509Certificate(m.cert).serialNumber;
      expect(serial).toMatch(/^[4-7][0-9A-F]{31}$/);
      expect(serial.toLowerCase()).toBe(m.serial);
      seen.add(serial);
    }
    expect(seen.size).toBe(200);
    for (let i = 0; i < 10_000; i++) expect(randomSerial()).toMatch(/^[4-7][0-9a-f]{31}$/);
  }, 60_000);
});

describe('revoke, list, bundle, rotate', () => {
  const dir = path.join(tmp, 'ops');
  const p = pkiPaths(dir);
  beforeAll(async () => {
    await initPki({ dir });
    await issueCert({ dir, role: 'agent', name: 'n1' });
    await issueCert({ dir, role: 'agent', name: 'n2' });
    await issueCert({ dir, role: 'agent', name: 'dup' });
    await issueCert({ dir, role: 'operator', name: 'dup' });
  });
  const serialOf = (role: 'agent' | 'operator' | 'controller', name: string): string =>
    new crypto.X509Certificate(fs.readFileSync(p.cert(role, name))).serialNumber.toLowerCase();

  it('revokes by name, by role/name and by serial, idempotently', async () => {
    const s1 = serialOf('agent', 'n1');
    expect(await revoke({ dir, target: 'n1' })).toEqual({ serial: s1, certificate: 'agent/n1', already: false });
    expect(await revoke({ dir, target: 'n1' })).toMatchObject({ serial: s1, already: true });
    expect(await codeOfRejection(revoke({ dir, target: 'dup' }))).toBe('bad_option');
    expect(await revoke({ dir, target: 'operator/dup' })).toMatchObject({
      serial: serialOf('operator', 'dup'),
      already: false,
    });
    const s2 = serialOf('agent', 'n2');
    expect(await revoke({ dir, target: s2.toUpperCase() })).toEqual({ serial: s2, already: false });
    expect(await codeOfRejection(revoke({ dir, target: 'nobody' }))).toBe('pki_missing');
    expect(await codeOfRejection(revoke({ dir, target: 'operator/nobody' }))).toBe('pki_missing');
    // an agent identity is revoked whatever issued its certificates, with no file here
    expect(await revoke({ dir, target: 'agent/nobody' })).toMatchObject({
      revokedBefore: expect.any(String),
      already: false,
    });
    expect(await codeOfRejection(revoke({ dir }))).toBe('bad_option');
    const list = parseRevoked(fs.readFileSync(p.revoked));
    expect(list.serials).toEqual([s1, serialOf('operator', 'dup'), s2]);
    expect(mode(p.revoked) & 0o022).toBe(0);
    expect(fs.readdirSync(dir).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  });

  it('lists certificates with role, name, serial, expiry and revocation', async () => {
    const rows = await listCerts(dir);
    expect(rows.map((r) => `${r.role}/${r.name}`)).toEqual([
      'controller/controller',
      'agent/dup',
      'agent/n1',
      'agent/n2',
      'operator/admin',
      'operator/dup',
    ]);
    const n1 = rows.find((r) => r.name === 'n1')!;
    expect(n1).toMatchObject({
      role: 'agent',
      serial: serialOf('agent', 'n1'),
      revoked: true,
      spiffeId: 'spiffe://herald.local/agent/n1',
    });
    expect(n1.notAfter.getTime()).toBeGreaterThan(Date.now());
    expect(rows.find((r) => r.role === 'agent' && r.name === 'dup')!.revoked).toBe(false);
  });

  it('bundles exactly what an agent needs, never ca.key', async () => {
    const out = path.join(tmp, 'bundle-n1');
    const files = await bundle({ dir, role: 'agent', name: 'n1', out });
    const found = execFileSync('find', [out, '-type', 'f'], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .map((f) => path.relative(out, f))
      .sort();
    expect(found).toEqual(['agent/n1.crt', 'agent/n1.key', 'ca.crt', 'revoked.json', 'wake-signing.jwks']);
    expect(files.sort()).toEqual(found);
    expect(mode(path.join(out, 'agent/n1.key'))).toBe(0o600);
    expect(mode(out)).toBe(0o700);
    for (const f of found)
      expect(fs.readFileSync(path.join(out, f)).equals(fs.readFileSync(path.join(dir, f)))).toBe(true);
  });

  it('bundles the signing key for a controller', async () => {
    const out = path.join(tmp, 'bundle-ctl');
    await bundle({ dir, role: 'controller', name: 'controller', out });
    const found = execFileSync('find', [out, '-type', 'f'], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .map((f) => path.relative(out, f))
      .sort();
    expect(found).toEqual([
      'ca.crt',
      'controller/controller.crt',
      'controller/controller.key',
      'revoked.json',
      'wake-signing.jwk',
      'wake-signing.jwks',
    ]);
    expect(mode(path.join(out, 'wake-signing.jwk'))).toBe(0o600);
    expect(await codeOfRejection(bundle({ dir, role: 'agent', name: 'nobody', out: path.join(tmp, 'b3') }))).toBe(
      'pki_missing',
    );
    expect(await codeOfRejection(bundle({ dir, role: 'agent', name: 'n1', out: dir }))).toBe('bad_option');
  });

  it('rotates the signing key keeping the old public key, then revokes the old kid', async () => {
    const oldKid = readJson(p.signingJwk).kid;
    expect(await codeOfRejection(revoke({ dir, kid: oldKid }))).toBe('bad_option'); // the active key
    const r = await rotateSigningKey({ dir });
    expect(r.previousKids).toEqual([oldKid]);
    expect(readJson(p.signingJwk).kid).toBe(r.kid);
    expect(mode(p.signingJwk)).toBe(0o600);
    expect(readJson(p.jwks).keys.map((k: { kid: string }) => k.kid)).toEqual([r.kid, oldKid]);
    expect(await revoke({ dir, kid: oldKid })).toEqual({ kid: oldKid, already: false });
    expect(await codeOfRejection(revoke({ dir, kid: 'no-such-kid' }))).toBe('bad_option');
    expect(parseRevoked(fs.readFileSync(p.revoked)).kids).toEqual([oldKid]);
    // the next rotation drops the revoked kid from the JWKS
    const r2 = await rotateSigningKey({ dir });
    expect(readJson(p.jwks).keys.map((k: { kid: string }) => k.kid)).toEqual([r2.kid, r.kid]);
  });
});
