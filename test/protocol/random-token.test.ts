import { describe, expect, it } from 'vitest';
import { newNonce, isValidNonce } from '../../protocol/metadata.js';
import { randomToken128 } from '../../protocol/random-token.js';
import { newJti } from '../../protocol/wake.js';

describe('randomToken128', () => {
  it('gives 128-bit base64url tokens that never repeat across several refills of the pool', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 2_000; i++) {
      const t = randomToken128();
      expect(t).toMatch(/^[A-Za-z0-9_-]{22}$/);
      expect(Buffer.from(t, 'base64url')).toHaveLength(16);
      seen.add(t);
    }
    expect(seen.size).toBe(2_000);
  });

  it('wake-up ids and fetch nonces are valid 128-bit tokens, and two differ', () => {
    const jti = newJti();
    const nonce = newNonce();
    expect(jti).toMatch(/^[A-Za-z0-9_-]{22}$/);
    expect(isValidNonce(nonce)).toBe(true);
    expect(jti).not.toBe(nonce);
  });
});
