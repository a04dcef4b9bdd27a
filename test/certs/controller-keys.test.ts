/**
 * Per-controller signing keys (docs/several-controllers.md): `certs issue controller <name>` makes
 * `<pki>/controller/<name>.jwk` and adds its public key to the JWKS naming its controller; a
 * bundle carries only that controller's key; the controller picks its own key file; revoking a
 * controller revokes its serial and its kid, and no other controller's.
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bundle, initPki, issueCert, revoke, rotateSigningKey } from '../../certs/pki.js';
import { pkiPaths, signingKeyFileOf } from '../../certs/paths.js';
import { parseRevoked } from '../../certs/revoked.js';
import { codeOf } from '../../protocol/errors.js';
import { KeySet, Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { signWake, WakeVerifier } from '../../protocol/wake.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ctl-keys-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
const dir = path.join(tmp, 'pki');
const p = pkiPaths(dir);
const TD = 'herald.local';
const AGENT = `spiffe://${TD}/agent/n1`;
const ctl = (n: string): string => `spiffe://${TD}/controller/${n}`;

const mode = (f: string): number => fs.statSync(f).mode & 0o777;
const readJson = (f: string): any => JSON.parse(fs.readFileSync(f, 'utf8'));
const jwksKeys = (): Array<Record<string, string>> => readJson(p.jwks).keys;
const filesUnder = (d: string): string[] =>
  execFileSync('find', [d, '-type', 'f'], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .map((f) => path.relative(d, f))
    .sort();

function keySet(): KeySet {
  return new KeySet(readJson(p.jwks), parseRevoked(fs.readFileSync(p.revoked)).kids);
}

/** What an agent answers a wake-up from controller `from`, signed with the key in `keyFile`. */
function wakeAnswer(keyFile: string, from: string): string {
  const signer = new Signer(readJson(keyFile) as Ed25519PrivateJwk);
  const now = Math.floor(Date.now() / 1000);
  const v = new WakeVerifier({ audience: AGENT, keys: keySet, startedAtS: now - 10 });
  try {
    v.verify(signWake(signer, { iss: ctl(from), aud: AGENT, gen: 1, reason: 'ping', nowS: now }), ctl(from));
    return 'ok';
  } catch (err) {
    return codeOf(err) ?? String(err);
  }
}

let firstKid: string;
let c2Kid: string;

beforeAll(async () => {
  await initPki({ dir });
  firstKid = readJson(p.signingJwk).kid;
  const r = await issueCert({ dir, role: 'controller', name: 'c2', ip: ['127.0.0.1'] });
  c2Kid = r.signingKey!.kid;
  await issueCert({ dir, role: 'controller', name: 'c3', ip: ['127.0.0.1'] });
});

describe('certs issue controller <name>', () => {
  it('makes <pki>/controller/c2.jwk, a private Ed25519 JWK with a kid, mode 0600', () => {
    const jwk = readJson(p.controllerJwk('c2'));
    expect(mode(p.controllerJwk('c2'))).toBe(0o600);
    expect(jwk).toMatchObject({ kty: 'OKP', crv: 'Ed25519', kid: c2Kid, alg: 'EdDSA' });
    expect(typeof jwk.d).toBe('string');
    expect(c2Kid).not.toBe(firstKid);
  });

  it('names each key of the JWKS after its controller, and keeps the first one in wake-signing.jwk', () => {
    const byKid = Object.fromEntries(jwksKeys().map((k) => [k.kid, k.controller]));
    expect(byKid).toEqual({
      [firstKid]: 'controller',
      [c2Kid]: 'c2',
      [readJson(p.controllerJwk('c3')).kid]: 'c3',
    });
    for (const k of jwksKeys()) expect('d' in k).toBe(false);
    expect(fs.existsSync(p.controllerJwk('controller'))).toBe(false);
  });

  it('issuing c2 again keeps its key (no orphaned kid), and the JWKS does not grow', async () => {
    const before = jwksKeys();
    const r = await issueCert({ dir, role: 'controller', name: 'c2', ip: ['127.0.0.1'] });
    expect(r.signingKey).toMatchObject({ kid: c2Kid, made: false });
    expect(readJson(p.controllerJwk('c2')).kid).toBe(c2Kid);
    expect(jwksKeys()).toEqual(before);
  });

  it('each controller picks its own key file; --signing-key still wins', () => {
    expect(signingKeyFileOf(dir, 'c2')).toBe(p.controllerJwk('c2'));
    expect(signingKeyFileOf(dir, 'controller')).toBe(p.signingJwk);
    expect(signingKeyFileOf(dir, 'c9')).toBe(p.signingJwk); // no key of its own: the legacy file
    expect(signingKeyFileOf(dir, 'c2', '/elsewhere.jwk')).toBe('/elsewhere.jwk');
  });

  it("a controller's key speaks for that controller alone", () => {
    expect(wakeAnswer(p.controllerJwk('c2'), 'c2')).toBe('ok');
    expect(wakeAnswer(p.signingJwk, 'controller')).toBe('ok');
    expect(wakeAnswer(p.controllerJwk('c2'), 'controller')).toBe('wrong_issuer');
    expect(wakeAnswer(p.signingJwk, 'c2')).toBe('wrong_issuer');
    expect(wakeAnswer(p.controllerJwk('c3'), 'c2')).toBe('wrong_issuer');
  });
});

describe('certs bundle controller <name>', () => {
  it("copies c2's own key and none of the other controllers' keys", async () => {
    const out = path.join(tmp, 'bundle-c2');
    const files = await bundle({ dir, role: 'controller', name: 'c2', out });
    expect(filesUnder(out)).toEqual([
      'ca.crt',
      'controller/c2.crt',
      'controller/c2.jwk',
      'controller/c2.key',
      'revoked.json',
      'wake-signing.jwks',
    ]);
    expect(files.sort()).toEqual(filesUnder(out));
    expect(mode(path.join(out, 'controller/c2.jwk'))).toBe(0o600);
    expect(fs.readFileSync(path.join(out, 'controller/c2.jwk')).equals(fs.readFileSync(p.controllerJwk('c2')))).toBe(
      true,
    );
    // the bundle's controller picks the key it was given
    expect(signingKeyFileOf(out, 'c2')).toBe(pkiPaths(out).controllerJwk('c2'));
  });

  it('the first controller still gets wake-signing.jwk, and no other controller key', async () => {
    const out = path.join(tmp, 'bundle-first');
    await bundle({ dir, role: 'controller', name: 'controller', out });
    expect(filesUnder(out)).toEqual([
      'ca.crt',
      'controller/controller.crt',
      'controller/controller.key',
      'revoked.json',
      'wake-signing.jwk',
      'wake-signing.jwks',
    ]);
  });
});

describe('rotate-signing-key --controller', () => {
  it("rotates c3's key alone: its new key names c3, the old one stays until revoked", async () => {
    const dir3 = path.join(tmp, 'pki-rotate');
    await initPki({ dir: dir3 });
    const p3 = pkiPaths(dir3);
    const old = (await issueCert({ dir: dir3, role: 'controller', name: 'c3' })).signingKey!.kid;
    const first = readJson(p3.signingJwk).kid;
    expect(codeOf(await revoke({ dir: dir3, kid: old }).catch((e: unknown) => e))).toBe('bad_option'); // active
    const r = await rotateSigningKey({ dir: dir3, controller: 'c3' });
    expect(r).toMatchObject({ controller: 'c3', previousKids: [old] });
    expect(readJson(p3.controllerJwk('c3')).kid).toBe(r.kid);
    expect(readJson(p3.signingJwk).kid).toBe(first);
    const owners = Object.fromEntries(readJson(p3.jwks).keys.map((k: any) => [k.kid, k.controller]));
    expect(owners).toEqual({ [r.kid]: 'c3', [old]: 'c3', [first]: 'controller' });
  });
});

describe('certs revoke controller/c2', () => {
  it("revokes c2's serial and kid, and leaves the other controllers trusted", async () => {
    const c2Serial = (await issueCert({ dir, role: 'controller', name: 'c2', ip: ['127.0.0.1'] })).serial;
    const r = await revoke({ dir, target: 'controller/c2' });
    expect(r).toEqual({ serial: c2Serial, certificate: 'controller/c2', kids: [c2Kid], already: false });
    const list = parseRevoked(fs.readFileSync(p.revoked));
    expect(list.serials).toEqual([c2Serial]);
    expect(list.kids).toEqual([c2Kid]);
    // an agent no longer trusts c2's key, and still trusts the others
    const keys = keySet();
    expect(keys.has(c2Kid)).toBe(false);
    expect(keys.has(firstKid)).toBe(true);
    expect(wakeAnswer(p.controllerJwk('c2'), 'c2')).toBe('unknown_kid');
    expect(wakeAnswer(p.signingJwk, 'controller')).toBe('ok');
    expect(wakeAnswer(p.controllerJwk('c3'), 'c3')).toBe('ok');
    expect(await revoke({ dir, target: 'controller/c2' })).toMatchObject({ already: true });
  });

  it('issuing a revoked controller again makes a new key, replacing the revoked kid in the JWKS', async () => {
    const r = await issueCert({ dir, role: 'controller', name: 'c2', ip: ['127.0.0.1'] });
    expect(r.signingKey).toMatchObject({ made: true, replacedKid: c2Kid });
    const kids = jwksKeys().map((k) => k.kid);
    expect(kids).not.toContain(c2Kid);
    expect(kids).toContain(r.signingKey!.kid);
    expect(wakeAnswer(p.controllerJwk('c2'), 'c2')).toBe('ok');
  });
});

describe('herald certs (bin/herald, built from dist/)', () => {
  const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
  const built = fs.existsSync(path.join(repo, 'dist', 'certs', 'cli.js'));
  const h = (...args: string[]): string =>
    execFileSync(path.join(repo, 'bin', 'herald'), args, { encoding: 'utf8', cwd: repo });

  it.skipIf(!built)(
    'issue controller c4 names its key; rotate-signing-key --controller c4; revoke controller/c4 names its kids',
    () => {
      const issued = h('certs', 'issue', 'controller', 'c4', '--dir', dir, '--ip', '127.0.0.1');
      const kid = readJson(p.controllerJwk('c4')).kid as string;
      expect(issued).toContain(`signing key  ${p.controllerJwk('c4')} (0600, kid ${kid}, new)`);
      expect(h('certs', 'issue', 'controller', 'c4', '--dir', dir)).toContain(`kid ${kid}, kept`);
      const rotated = h('certs', 'rotate-signing-key', '--controller', 'c4', '--dir', dir);
      const newKid = readJson(p.controllerJwk('c4')).kid as string;
      expect(rotated).toContain(`new signing key ${newKid} of controller c4`);
      expect(rotated).toContain(`still trusted: ${kid}`);
      const revoked = h('certs', 'revoke', 'controller/c4', '--dir', dir);
      expect(revoked).toContain('revoked serial');
      expect(revoked).toMatch(new RegExp(`signing keys (${kid}, ${newKid}|${newKid}, ${kid})`));
      expect(parseRevoked(fs.readFileSync(p.revoked)).kids).toEqual(expect.arrayContaining([kid, newKid]));
    },
  );
});
