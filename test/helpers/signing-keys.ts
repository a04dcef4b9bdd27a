/** Ed25519 signing keys for unit tests, made the way `herald certs init` makes them. */
import { generateKeyPairSync } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import type { Ed25519PrivateJwk, Ed25519PublicJwk } from '../../protocol/jws.js';

export interface TestSigningKey {
  priv: Ed25519PrivateJwk;
  pub: Ed25519PublicJwk;
}

export async function makeSigningKey(): Promise<TestSigningKey> {
  const { privateKey } = generateKeyPairSync('ed25519');
  const jwk = privateKey.export({ format: 'jwk' }) as { kty: 'OKP'; crv: 'Ed25519'; x: string; d: string };
  const kid = await calculateJwkThumbprint({ kty: jwk.kty, crv: jwk.crv, x: jwk.x });
  const pub: Ed25519PublicJwk = { kty: 'OKP', crv: 'Ed25519', x: jwk.x, kid, alg: 'EdDSA', use: 'sig' };
  return { priv: { ...pub, d: jwk.d }, pub };
}

/** Signs an arbitrary header and payload with an Ed25519 private JWK: for crafting bad tokens. */
export { sign as rawSign } from 'node:crypto';
