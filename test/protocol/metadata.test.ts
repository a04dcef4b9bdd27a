import { beforeAll, describe, expect, it } from 'vitest';
import { KeySet, Signer, WAKE_TYP } from '../../protocol/jws.js';
import {
  newNonce,
  sha256b64url,
  signMetadata,
  verifyMetadataResponse,
  type VerifyMetadataInput,
} from '../../protocol/metadata.js';
import { signWake } from '../../protocol/wake.js';
import { codeOf } from '../../protocol/errors.js';
import { makeSigningKey, type TestSigningKey } from '../helpers/signing-keys.js';

const CTRL = 'spiffe://herald.local/controller/controller';
const AGENT = 'spiffe://herald.local/agent/n1';
let key: TestSigningKey;
let signer: Signer;
let keys: KeySet;

beforeAll(async () => {
  key = await makeSigningKey();
  signer = new Signer(key.priv);
  keys = new KeySet({ keys: [key.pub] });
});

const doc = (gen: number) => Buffer.from(JSON.stringify({ node: 'n1', generation: gen, deployments: [] }));

function response(gen: number, nonce: string, over: Partial<Parameters<typeof signMetadata>[1]> = {}) {
  const body = doc(gen);
  const signature = signMetadata(signer, {
    iss: CTRL,
    aud: AGENT,
    gen,
    nonce,
    sha256: sha256b64url(body),
    nowS: 1,
    ...over,
  });
  return { body, signature };
}

function check(over: Partial<VerifyMetadataInput>): string | undefined {
  try {
    verifyMetadataResponse({
      status: 200,
      signature: undefined,
      nonce: 'x',
      audience: AGENT,
      issuer: CTRL,
      keys,
      ...over,
    });
  } catch (e) {
    return codeOf(e) ?? String(e);
  }
  return undefined;
}

describe('metadata signatures', () => {
  it('verifies a 200 and returns the document and generation', () => {
    const nonce = newNonce();
    const r = response(5, nonce);
    const v = verifyMetadataResponse({
      status: 200,
      signature: r.signature,
      body: r.body,
      nonce,
      audience: AGENT,
      issuer: CTRL,
      keys,
      lastAppliedGen: 4,
    });
    expect(v.gen).toBe(5);
    expect(v.document?.node).toBe('n1');
  });

  it("verifies a 304 signed with this request's nonce", () => {
    const nonce = newNonce();
    const signature = signMetadata(signer, { iss: CTRL, aud: AGENT, gen: 5, nonce, nowS: 1 });
    expect(verifyMetadataResponse({ status: 304, signature, nonce, audience: AGENT, issuer: CTRL, keys }).gen).toBe(5);
  });

  it('refuses a body changed by one byte', () => {
    const nonce = newNonce();
    const r = response(5, nonce);
    const body = Buffer.from(r.body);
    body[body.length - 2] = 0x20;
    expect(check({ signature: r.signature, body, nonce })).toBe('digest_mismatch');
  });

  it('refuses a wrong audience (a signature for another node)', () => {
    const nonce = newNonce();
    const r = response(5, nonce, { aud: 'spiffe://herald.local/agent/n2' });
    expect(check({ signature: r.signature, body: r.body, nonce })).toBe('wrong_audience');
  });

  it('refuses a wrong nonce (a replayed old response)', () => {
    const r = response(5, newNonce());
    expect(check({ signature: r.signature, body: r.body, nonce: newNonce() })).toBe('nonce_mismatch');
  });

  it('refuses a lower generation than the last applied (rollback)', () => {
    const nonce = newNonce();
    const r = response(3, nonce);
    expect(check({ signature: r.signature, body: r.body, nonce, lastAppliedGen: 4 })).toBe('rollback');
  });

  it('refuses a 304 signature replayed with another nonce', () => {
    const signature = signMetadata(signer, { iss: CTRL, aud: AGENT, gen: 5, nonce: newNonce(), nowS: 1 });
    expect(check({ status: 304, signature, nonce: newNonce() })).toBe('nonce_mismatch');
  });

  it("refuses a 200's signature pasted onto a 304", () => {
    const nonce = newNonce();
    const r = response(5, nonce);
    expect(check({ status: 304, signature: r.signature, nonce })).toBe('bad_response');
  });

  it('refuses a missing signature, a wake-up token, a foreign issuer and a body of another generation', () => {
    const nonce = newNonce();
    expect(check({ signature: undefined, body: doc(1), nonce })).toBe('missing_signature');
    const wake = signWake(signer, { iss: CTRL, aud: AGENT, gen: 1, reason: 'ping', nowS: 1 });
    expect(check({ signature: wake, body: doc(1), nonce })).toBe('wrong_type');
    const foreign = response(5, nonce, { iss: 'spiffe://herald.local/controller/x' });
    expect(check({ signature: foreign.signature, body: foreign.body, nonce })).toBe('wrong_issuer');
    const body = doc(6);
    const sig = signMetadata(signer, { iss: CTRL, aud: AGENT, gen: 5, nonce, sha256: sha256b64url(body), nowS: 1 });
    expect(check({ signature: sig, body, nonce })).toBe('bad_response');
    expect(WAKE_TYP).not.toBe('herald-metadata+jwt');
  });
});
