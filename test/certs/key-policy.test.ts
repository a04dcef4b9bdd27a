/**
 * The key policy (certs/key-policy.ts) and the CSR reader in front of it (certs/csr-verify.ts):
 * every key and request shape a peer may send before it is known is refused with a code, and
 * refused before any signature work, so none costs more than a valid request does.
 */
import crypto from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { makeCsr } from '../../certs/csr.js';
import { readCsr } from '../../certs/csr-verify.js';
import { admitKey, admitSpki } from '../../certs/key-policy.js';
import { codeOf } from '../../protocol/errors.js';
import { oddCsrs, oddNumber, rsaSpki } from '../helpers/odd-keys.js';

const goodKey = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;

function codeOfCall(fn: () => unknown): unknown {
  try {
    fn();
  } catch (err) {
    return codeOf(err);
  }
  return 'accepted';
}

describe('key policy', () => {
  it('admits RSA 2048-4096 with e = 65537, ECDSA P-256/P-384 and Ed25519 only', () => {
    const admitted = [
      crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }),
      // a 4096-bit modulus written by hand: generating one takes seconds
      {
        publicKey: crypto.createPublicKey({
          key: rsaSpki(oddNumber(512), Buffer.from([1, 0, 1])),
          format: 'der',
          type: 'spki',
        }),
      },
      crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' }),
      crypto.generateKeyPairSync('ec', { namedCurve: 'secp384r1' }),
      crypto.generateKeyPairSync('ed25519'),
    ];
    for (const k of admitted) {
      expect(admitSpki(k.publicKey.export({ type: 'spki', format: 'der' })).key.asymmetricKeyType).toBe(
        k.publicKey.asymmetricKeyType,
      );
      expect(admitKey(k.publicKey).key).toBe(k.publicKey);
    }
    const refused = [
      crypto.generateKeyPairSync('rsa', { modulusLength: 1024 }),
      crypto.generateKeyPairSync('rsa', { modulusLength: 2048, publicExponent: 3 }),
      crypto.generateKeyPairSync('ec', { namedCurve: 'secp521r1' }),
      crypto.generateKeyPairSync('ed448'),
      crypto.generateKeyPairSync('x25519'),
      crypto.generateKeyPairSync('dsa', { modulusLength: 2048, divisorLength: 256 }),
    ];
    for (const k of refused) {
      expect(codeOfCall(() => admitKey(k.publicKey))).toBe('bad_key');
      expect(codeOfCall(() => admitSpki(k.publicKey.export({ type: 'spki', format: 'der' })))).toBe('bad_key');
    }
    // an entry point narrows the families: the issuer certifies RSA only
    const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' }).publicKey;
    expect(codeOfCall(() => admitKey(ec, ['rsa']))).toBe('bad_key');
  });

  it('refuses an RSA key of any modulus or exponent outside the policy from its DER, before OpenSSL uses it', () => {
    for (const [n, e] of [
      [oddNumber(1024), oddNumber(1024, 2)],
      [oddNumber(256), Buffer.from([1])],
      [oddNumber(256), Buffer.from([1, 0, 0])],
      [oddNumber(2048), Buffer.from([1, 0, 1])],
      [oddNumber(513), Buffer.from([1, 0, 1])],
    ] as const) {
      expect(codeOfCall(() => admitSpki(rsaSpki(n, e)))).toBe('bad_key');
    }
  });
});

describe('CSRs of extreme shapes', () => {
  it('a valid CSR still reads: its key, its names', () => {
    const pem = makeCsr({
      keyPem: goodKey.export({ type: 'pkcs8', format: 'pem' }) as string,
      commonName: 'n1',
      uris: ['spiffe://herald.local/agent/n1'],
      dns: ['N1.example'],
      ips: ['10.0.0.1', '::1'],
    });
    const r = readCsr(pem);
    expect(r).toMatchObject({
      commonName: 'n1',
      uris: ['spiffe://herald.local/agent/n1'],
      dns: ['n1.example'],
      ips: ['10.0.0.1', '0000:0000:0000:0000:0000:0000:0000:0001'],
    });
  });

  it('every odd key is refused bad_key and every malformed request bad_csr, none with a stack', () => {
    const cases = oddCsrs('odd1', goodKey);
    const got = cases.map((c) => ({ what: c.what, code: codeOfCall(() => readCsr(c.csr)) }));
    expect(got).toEqual(cases.map((c) => ({ what: c.what, code: c.code })));
  });
});
