/**
 * The controller's Ed25519 signing (controller/ed25519.ts): libsodium where its addon loads,
 * giving the very bytes node:crypto gives, and the same refusals of a bad key.
 */
import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ed25519Engine, fastEd25519 } from '../../controller/ed25519.js';
import { KeySet, METADATA_TYP, nodeEd25519, Signer, WAKE_TYP } from '../../protocol/jws.js';
import { newJti, signWake, WakeVerifier } from '../../protocol/wake.js';
import { startTestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki } from '../helpers/controller-pki.js';
import { makeSigningKey } from '../helpers/signing-keys.js';

const CTRL = 'spiffe://herald.local/controller/controller';
const AGENT = 'spiffe://herald.local/agent/n1';

describe('the controller signing with libsodium', () => {
  it('loads the addon on this platform (linux-x64 has a prebuilt one)', () => {
    expect(ed25519Engine()).toBe('libsodium');
  });

  it('signs exactly what node:crypto signs, for many keys and inputs, and an agent verifies it', async () => {
    for (let k = 0; k < 8; k++) {
      const key = await makeSigningKey();
      const fast = new Signer(key.priv, fastEd25519);
      const plain = new Signer(key.priv, nodeEd25519);
      for (let i = 0; i < 16; i++) {
        const claims = { iss: CTRL, aud: AGENT, gen: k * 100 + i, salt: randomBytes(i * 7).toString('base64url') };
        expect(fast.sign(WAKE_TYP, claims)).toBe(plain.sign(WAKE_TYP, claims));
        expect(fast.sign(METADATA_TYP, claims)).toBe(plain.sign(METADATA_TYP, claims));
      }
      const nowS = 1_800_000_000;
      const token = signWake(fast, { iss: CTRL, aud: AGENT, gen: 5, reason: 'deployment', nowS, jti: newJti() });
      const verifier = new WakeVerifier({
        audience: AGENT,
        keys: () => new KeySet({ keys: [key.pub] }),
        startedAtS: nowS - 10,
        nowS: () => nowS,
      });
      expect(verifier.verify(token, CTRL).gen).toBe(5);
    }
  });

  it('refuses a key whose x is not the public key of d, or whose d is not a 32-byte seed, as node:crypto does', async () => {
    const a = await makeSigningKey();
    const b = await makeSigningKey();
    const mixed = { ...a.priv, x: b.priv.x };
    for (const signing of [fastEd25519, nodeEd25519]) {
      expect(() => new Signer(mixed, signing)).toThrow(/x is not the public key of d/);
      expect(() => new Signer({ ...a.priv, d: Buffer.alloc(31, 1).toString('base64url') }, signing)).toThrow(TypeError);
    }
  });

  it('a controller whose signing key file has an x that is not its d refuses to start: bad_option, field signing-key, naming the file', async () => {
    const pki = await makeControllerTestPki();
    try {
      const a = await makeSigningKey();
      const b = await makeSigningKey();
      const file = path.join(pki.dir, 'mixed.jwk');
      fs.writeFileSync(file, JSON.stringify({ ...a.priv, x: b.priv.x }), { mode: 0o600 });
      await expect(startTestController(pki, { signingKey: file })).rejects.toMatchObject({
        code: 'bad_option',
        field: 'signing-key',
        message: expect.stringContaining(
          `${file} is not a usable private Ed25519 JWK with a kid: signing key: x is not the public key of d`,
        ),
      });
    } finally {
      pki.cleanup();
    }
  });
});
