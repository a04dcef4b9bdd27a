/**
 * The signed answer to a signal over the push connection (protocol/signal-answer.ts): what the
 * controller signs, and the agent's check that it was signed for exactly its request and frame.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { KeySet, Signer } from '../../protocol/jws.js';
import { revisionOf, signSignalled, verifySignalled, type VerifySignalledInput } from '../../protocol/signal-answer.js';
import { thrownCode } from '../helpers/codes.js';
import { makeSigningKey, type TestSigningKey } from '../helpers/signing-keys.js';

const ISS = 'spiffe://herald.local/controller/controller';
const AUD = 'spiffe://herald.local/agent/n1';
const NONCE = 'n'.repeat(22);
const BODY = Buffer.from('{"revision":3,"deploy_status_code":0,"deploy_stdout":"ok"}');
let key: TestSigningKey;
let keys: KeySet;

beforeAll(async () => {
  key = await makeSigningKey();
  keys = new KeySet({ keys: [key.pub] });
});

/** The agent's check of an answer signed with `over` changed, the frame saying `frame`. */
function check(
  over: Partial<Parameters<typeof signSignalled>[1]> = {},
  frame: Partial<VerifySignalledInput> = {},
): void {
  const signature = signSignalled(new Signer(key.priv), {
    iss: ISS,
    aud: AUD,
    nonce: NONCE,
    deployment: 'd1',
    body: BODY,
    status: 429,
    error: 'rate_limited',
    retryAfterS: 2,
    nowS: Date.now() / 1000,
    ...over,
  });
  verifySignalled({
    signature,
    status: 429,
    error: 'rate_limited',
    retryAfterS: 2,
    nonce: NONCE,
    deployment: 'd1',
    revision: 3,
    body: BODY,
    audience: AUD,
    issuer: ISS,
    keys,
    ...frame,
  });
}

describe('signed signalled answers', () => {
  it('verifies an answer signed for this request and frame', () => {
    expect(() => check()).not.toThrow();
  });

  it.each([
    ['another status in the frame', {}, { status: 200 }, 'bad_response'],
    ['no error code in the frame', {}, { error: undefined }, 'bad_response'],
    ['another Retry-After in the frame', {}, { retryAfterS: 0 }, 'bad_response'],
    ['another deployment', { deployment: 'd2' }, {}, 'bad_response'],
    ['another revision asked', {}, { revision: 4 }, 'bad_response'],
    ['another body', { body: Buffer.from('{"revision":3}') }, {}, 'digest_mismatch'],
    ['another nonce', { nonce: 'm'.repeat(22) }, {}, 'nonce_mismatch'],
    ['another agent', { aud: 'spiffe://herald.local/agent/n2' }, {}, 'wrong_audience'],
    ['another controller named', { iss: 'spiffe://herald.local/controller/c2' }, {}, 'wrong_issuer'],
    ['no signature', {}, { signature: undefined }, 'missing_signature'],
    ['an untrusted key', {}, { keys: new KeySet({ keys: [] }) }, 'unknown_kid'],
  ] as const)('refuses %s', (_what, over, frame, code) => {
    expect(thrownCode(() => check(over, frame as Partial<VerifySignalledInput>))).toBe(code);
  });

  it("reads the body's revision, or null when there is none", () => {
    expect(revisionOf(BODY)).toBe(3);
    expect(revisionOf(Buffer.from('{"revision":"3"}'))).toBeNull();
    expect(revisionOf(Buffer.from('not json'))).toBeNull();
    expect(revisionOf(new Uint8Array(Buffer.from('xx{"revision":7}')).subarray(2))).toBe(7);
  });
});
