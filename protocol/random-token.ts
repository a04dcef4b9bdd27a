/**
 * 128-bit random tokens (a wake-up's `jti`, a fetch's `nonce`), base64url, drawn from a pool the
 * CSPRNG refills: `randomBytes(16)` per token costs a native call and a Buffer each (~6 µs here),
 * the pool a slice (~0.4 µs), and a fan-out makes one per node. The pool's bytes are handed out
 * once and never again (tokens are public on the wire; what the pool holds is the next ones, as
 * Node's own `randomUUID` cache holds its next UUIDs).
 */
import { randomFillSync } from 'node:crypto';
import { RANDOM_TOKEN_POOL_BYTES } from './limits.js';

const TOKEN_BYTES = 16;

const pool = Buffer.alloc(RANDOM_TOKEN_POOL_BYTES);
let offset = pool.length;

/** A fresh 128-bit random token, base64url (22 characters). */
export function randomToken128(): string {
  if (offset + TOKEN_BYTES > pool.length) {
    randomFillSync(pool);
    offset = 0;
  }
  const token = pool.toString('base64url', offset, offset + TOKEN_BYTES);
  offset += TOKEN_BYTES;
  return token;
}
