import { createPrivateKey, sign as edSign } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { CompactSign, SignJWT, importJWK } from 'jose';
import { KeySet, METADATA_TYP, Signer, WAKE_TYP } from '../../protocol/jws.js';
import { signWake, WakeVerifier, newJti, peekJti } from '../../protocol/wake.js';
import { ReplayCache } from '../../protocol/replay-cache.js';
import { codeOf } from '../../protocol/errors.js';
import { MAX_WAKE_FRAME_BYTES } from '../../protocol/limits.js';
import { makeSigningKey, type TestSigningKey } from '../helpers/signing-keys.js';

const CTRL = 'spiffe://herald.local/controller/controller';
const AGENT = 'spiffe://herald.local/agent/n1';
const NOW = 1_800_000_000;

let key: TestSigningKey;
let other: TestSigningKey;
let signer: Signer;

beforeAll(async () => {
  key = await makeSigningKey();
  other = await makeSigningKey();
  signer = new Signer(key.priv);
});

function verifier(
  opts: { now?: number; started?: number; revoked?: string[]; cache?: ReplayCache } = {},
): WakeVerifier {
  const keys = new KeySet({ keys: [key.pub] }, opts.revoked ?? []);
  return new WakeVerifier({
    audience: AGENT,
    keys: () => keys,
    startedAtS: opts.started ?? NOW - 3600,
    nowS: () => opts.now ?? NOW,
    ...(opts.cache ? { replayCache: opts.cache } : {}),
  });
}

function claims(over: Record<string, unknown> = {}): Record<string, unknown> {
  return { iss: CTRL, aud: AGENT, iat: NOW, exp: NOW + 60, jti: newJti(), gen: 7, reason: 'deployment', ...over };
}

const b64 = (x: unknown): string => Buffer.from(typeof x === 'string' ? x : JSON.stringify(x)).toString('base64url');

/** A compact JWS with any header, signed with `k` (Ed25519), so a test can craft what it likes. */
function craft(header: Record<string, unknown>, payload: Record<string, unknown>, k: TestSigningKey = key): string {
  const input = `${b64(header)}.${b64(payload)}`;
  const pk = createPrivateKey({ key: { kty: 'OKP', crv: 'Ed25519', x: k.priv.x, d: k.priv.d }, format: 'jwk' });
  return `${input}.${edSign(null, Buffer.from(input), pk).toString('base64url')}`;
}

function refusal(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    return codeOf(e) ?? `uncoded: ${String(e)}`;
  }
  return undefined;
}

describe('wake-up sign and verify', () => {
  it('accepts a token signed by signWake and returns its claims', () => {
    const t = signWake(signer, { iss: CTRL, aud: AGENT, gen: 42, reason: 'ping', nowS: NOW });
    const c = verifier().verify(t, CTRL);
    expect(c).toMatchObject({ iss: CTRL, aud: AGENT, gen: 42, reason: 'ping', iat: NOW });
    expect(c.exp - c.iat).toBeLessThanOrEqual(300);
    expect(Buffer.from(t.split('.')[0]!, 'base64url').toString()).toBe(
      JSON.stringify({ alg: 'EdDSA', kid: key.priv.kid, typ: WAKE_TYP }),
    );
  });

  it('signs byte for byte as jose does (Ed25519 is deterministic)', async () => {
    const payload = claims();
    const ours = signer.sign(WAKE_TYP, payload);
    const k = await importJWK({ ...key.priv }, 'EdDSA');
    const theirs = await new CompactSign(new TextEncoder().encode(JSON.stringify(payload)))
      .setProtectedHeader({ alg: 'EdDSA', kid: key.priv.kid, typ: WAKE_TYP })
      .sign(k);
    expect(ours).toBe(theirs);
  });

  const h = (over: Record<string, unknown> = {}) => ({ alg: 'EdDSA', kid: key.priv.kid, typ: WAKE_TYP, ...over });
  const cases: Array<[string, () => string, string, Parameters<typeof verifier>[0]?]> = [
    [
      'tampered payload',
      () => {
        const [a, , c] = craft(h(), claims()).split('.');
        return `${a}.${b64(claims({ gen: 8 }))}.${c}`;
      },
      'bad_signature',
    ],
    [
      'tampered signature',
      () => {
        const t = craft(h(), claims());
        const s = Buffer.from(t.split('.')[2]!, 'base64url');
        s[5] = s[5]! ^ 1;
        return `${t.split('.').slice(0, 2).join('.')}.${s.toString('base64url')}`;
      },
      'bad_signature',
    ],
    ['signature by a key of the same kid but another secret', () => craft(h(), claims(), other), 'bad_signature'],
    [
      'a signature spelled non-canonically (stray bits in its last character)',
      () => {
        const t = craft(h(), claims());
        const c = t.at(-1)!;
        const alt = 'AQgw'.includes(c) ? String.fromCharCode(c.charCodeAt(0) + 1) : c;
        expect(alt).not.toBe(c);
        return t.slice(0, -1) + alt;
      },
      'bad_signature',
    ],
    ['alg none', () => `${b64({ alg: 'none', kid: key.priv.kid, typ: WAKE_TYP })}.${b64(claims())}.`, 'bad_algorithm'],
    ['no kid', () => craft({ alg: 'EdDSA', typ: WAKE_TYP }, claims()), 'missing_kid'],
    ['unknown kid', () => craft(h({ kid: other.priv.kid }), claims(), other), 'unknown_kid'],
    ['wrong typ', () => craft(h({ typ: 'JWT' }), claims()), 'wrong_type'],
    ['a metadata token used as a wake-up', () => craft(h({ typ: METADATA_TYP }), claims()), 'wrong_type'],
    ['extra jwk header', () => craft(h({ jwk: other.pub }), claims()), 'bad_header'],
    ['extra jku header', () => craft(h({ jku: 'https://evil.example/jwks' }), claims()), 'bad_header'],
    ['extra x5c header', () => craft(h({ x5c: ['MIIB'] }), claims()), 'bad_header'],
    ['extra crit header', () => craft(h({ crit: ['exp'] }), claims()), 'bad_header'],
    ['wrong aud', () => craft(h(), claims({ aud: 'spiffe://herald.local/agent/n2' })), 'wrong_audience'],
    ['wrong iss', () => craft(h(), claims({ iss: 'spiffe://herald.local/controller/other' })), 'wrong_issuer'],
    ['expired', () => craft(h(), claims({ iat: NOW - 200, exp: NOW - 31 })), 'expired'],
    ['iat beyond the skew in the future', () => craft(h(), claims({ iat: NOW + 31, exp: NOW + 91 })), 'not_yet_valid'],
    ['lifetime over 300 s', () => craft(h(), claims({ iat: NOW, exp: NOW + 301 })), 'lifetime_too_long'],
    [
      'issued before the agent started',
      () => craft(h(), claims({ iat: NOW - 100, exp: NOW + 100 })),
      'issued_before_start',
      { started: NOW - 60 },
    ],
    ['non-integer gen', () => craft(h(), claims({ gen: 1.5 })), 'bad_gen'],
    ['negative gen', () => craft(h(), claims({ gen: -1 })), 'bad_gen'],
    ['string gen', () => craft(h(), claims({ gen: '7' })), 'bad_gen'],
    ['malformed compact form (two parts)', () => 'abc.def', 'malformed'],
    ['malformed compact form (not base64url)', () => 'a+b.c/d.e=f', 'malformed'],
    ['header not JSON', () => `${b64('not json')}.${b64(claims())}.AAAA`, 'malformed'],
    ['over 4 KiB', () => craft(h(), claims({ pad: 'x'.repeat(MAX_WAKE_FRAME_BYTES) })), 'too_large'],
    ['missing jti', () => craft(h(), claims({ jti: undefined })), 'bad_claims'],
  ];
  it.each(cases)('refuses %s', (_name, make, code, opts) => {
    expect(refusal(() => verifier(opts).verify(make(), CTRL))).toBe(code);
  });

  it('refuses HS256 keyed with the public JWKS bytes (algorithm confusion)', async () => {
    const secret = new TextEncoder().encode(JSON.stringify({ keys: [key.pub] }));
    const t = await new SignJWT(claims())
      .setProtectedHeader({ alg: 'HS256', kid: key.priv.kid, typ: WAKE_TYP })
      .sign(secret);
    expect(refusal(() => verifier().verify(t, CTRL))).toBe('bad_algorithm');
  });

  it('refuses a revoked kid', () => {
    const t = signWake(signer, { iss: CTRL, aud: AGENT, gen: 1, reason: 'ping', nowS: NOW });
    expect(refusal(() => verifier({ revoked: [key.priv.kid] }).verify(t, CTRL))).toBe('unknown_kid');
  });

  it('refuses a token whose iss is not the TLS peer', () => {
    const t = signWake(signer, { iss: CTRL, aud: AGENT, gen: 1, reason: 'ping', nowS: NOW });
    expect(refusal(() => verifier().verify(t, 'spiffe://herald.local/controller/other'))).toBe('wrong_issuer');
  });

  it('refuses a replayed jti, and accepts it again only once it can no longer verify', () => {
    let now = NOW;
    const keys = new KeySet({ keys: [key.pub] });
    const v = new WakeVerifier({ audience: AGENT, keys: () => keys, startedAtS: NOW - 100, nowS: () => now });
    const t = signWake(signer, { iss: CTRL, aud: AGENT, gen: 1, reason: 'ping', nowS: NOW });
    v.verify(t, CTRL);
    expect(refusal(() => v.verify(t, CTRL))).toBe('replayed');
    now = NOW + 60 + 29;
    expect(refusal(() => v.verify(t, CTRL))).toBe('replayed');
    now = NOW + 60 + 31;
    expect(refusal(() => v.verify(t, CTRL))).toBe('expired');
  });

  it('accepts tokens within the skew either way', () => {
    expect(
      refusal(() => verifier().verify(craft(h(), claims({ iat: NOW + 29, exp: NOW + 89 })), CTRL)),
    ).toBeUndefined();
    expect(
      refusal(() => verifier().verify(craft(h(), claims({ iat: NOW - 89, exp: NOW - 29 })), CTRL)),
    ).toBeUndefined();
  });

  it('answers replay_cache_full instead of forgetting an unexpired entry', () => {
    const cache = new ReplayCache(3);
    const v = verifier({ cache });
    const tokens = Array.from({ length: 4 }, () =>
      signWake(signer, { iss: CTRL, aud: AGENT, gen: 1, reason: 'ping', nowS: NOW }),
    );
    for (const t of tokens.slice(0, 3)) v.verify(t, CTRL);
    expect(refusal(() => v.verify(tokens[3]!, CTRL))).toBe('replay_cache_full');
    // the first token is still remembered: a replay is not accepted because the cache is full
    expect(refusal(() => v.verify(tokens[0]!, CTRL))).toBe('replayed');
  });

  it('peekJti reads the jti of an unverified token for nack correlation only', () => {
    const jti = newJti();
    expect(peekJti(craft(h(), claims({ jti })))).toBe(jti);
    expect(peekJti('garbage')).toBeNull();
  });
});
