/**
 * The controller's Ed25519 signing: libsodium's (the `sodium-native` addon) when it loads, else
 * `node:crypto`'s. Each wake-up and each metadata answer is signed (two signatures per agent in
 * a fan-out); OpenSSL 3.0, which Node 20 carries, signs with its portable C code in ~37 µs here,
 * libsodium in ~18 µs, and the signatures are the same bytes (Ed25519 is deterministic, and
 * test/controller/ed25519.test.ts holds the two side by side). Only the controller loads the
 * addon: the agent signs nothing and its package has no native module (docs/installing.md).
 */
import { createRequire } from 'node:module';
import { nodeEd25519, type Ed25519PrivateJwk, type Ed25519Signing } from '../protocol/jws.js';

/** The part of sodium-native used here. */
interface Sodium {
  crypto_sign_BYTES: number;
  crypto_sign_PUBLICKEYBYTES: number;
  crypto_sign_SECRETKEYBYTES: number;
  crypto_sign_SEEDBYTES: number;
  crypto_sign_seed_keypair(pk: Buffer, sk: Buffer, seed: Buffer): void;
  crypto_sign_detached(sig: Buffer, message: Buffer, sk: Buffer): void;
  /** Guarded, locked memory, freed when the buffer is collected. */
  sodium_malloc(size: number): Buffer;
  sodium_memzero(buf: Buffer): void;
}

let loaded: Sodium | null | undefined;

function sodium(): Sodium | null {
  if (loaded === undefined) {
    try {
      loaded = createRequire(import.meta.url)('sodium-native') as Sodium;
    } catch {
      loaded = null; // no prebuilt addon for this platform: node:crypto signs
    }
  }
  return loaded;
}

/** Which implementation `fastEd25519` signs with in this process (logged at start). */
export function ed25519Engine(): 'libsodium' | 'node:crypto' {
  return sodium() === null ? 'node:crypto' : 'libsodium';
}

/**
 * libsodium's signing where the addon loads, else node:crypto's: the key's secret half in
 * libsodium's guarded memory, made from the JWK's seed `d`.
 * @throws TypeError when `d` is not a 32-byte seed or `x` is not its public key
 */
export const fastEd25519: Ed25519Signing = (jwk: Ed25519PrivateJwk) => {
  const na = sodium();
  if (na === null) return nodeEd25519(jwk);
  const seed = Buffer.from(jwk.d, 'base64url');
  if (seed.length !== na.crypto_sign_SEEDBYTES) throw new TypeError('signing key must be a private Ed25519 JWK');
  const pk = Buffer.alloc(na.crypto_sign_PUBLICKEYBYTES);
  const sk = na.sodium_malloc(na.crypto_sign_SECRETKEYBYTES);
  na.crypto_sign_seed_keypair(pk, sk, seed);
  na.sodium_memzero(seed);
  if (pk.toString('base64url') !== jwk.x) throw new TypeError('signing key: x is not the public key of d');
  return (input) => {
    const sig = Buffer.allocUnsafe(na.crypto_sign_BYTES);
    na.crypto_sign_detached(sig, input, sk);
    return sig;
  };
};
