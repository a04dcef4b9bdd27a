/**
 * Property-based fuzzing of the wake-up decoder: random and mutated frames never crash the
 * verifier, always end in a coded refusal, and take bounded time each.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { KeySet, Signer } from '../../protocol/jws.js';
import { signWake, WakeVerifier } from '../../protocol/wake.js';
import { decodeAnswer, NACK_CODES } from '../../protocol/frames.js';
import { codeOf, isErrorCode } from '../../protocol/errors.js';
import { makeSigningKey } from '../helpers/signing-keys.js';

const CTRL = 'spiffe://herald.local/controller/controller';
const AGENT = 'spiffe://herald.local/agent/n1';
const NOW = 1_800_000_000;
let signer: Signer;
let verifier: WakeVerifier;
let valid: string;

beforeAll(async () => {
  const key = await makeSigningKey();
  signer = new Signer(key.priv);
  const keys = new KeySet({ keys: [key.pub] });
  verifier = new WakeVerifier({ audience: AGENT, keys: () => keys, startedAtS: NOW - 60, nowS: () => NOW });
  valid = signWake(signer, { iss: CTRL, aud: AGENT, gen: 3, reason: 'deployment', nowS: NOW });
});

/** Runs the verifier on one frame; returns its refusal code, or 'accepted'. Never throws. */
function outcome(frame: string): string {
  try {
    verifier.verify(frame, CTRL);
    return 'accepted';
  } catch (e) {
    const c = codeOf(e);
    if (c === undefined) throw new Error(`uncoded failure for ${JSON.stringify(frame.slice(0, 80))}: ${String(e)}`);
    return c;
  }
}

const slow: number[] = [];
function timed(frame: string): string {
  const t0 = performance.now();
  const r = outcome(frame);
  const ms = performance.now() - t0;
  if (ms > 250) slow.push(ms); // wall time on a shared 2-core machine: a loose bound, still catching anything super-linear
  return r;
}

describe('fuzz: wake-up decoder', () => {
  it('random strings are refused with a nack code', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 6000 }), (s) => {
        const r = timed(s);
        expect((NACK_CODES as readonly string[]).includes(r)).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });

  it('random three-part base64url tokens are refused with a nack code', () => {
    const part = fc.uint8Array({ maxLength: 300 }).map((b) => Buffer.from(b).toString('base64url'));
    const json = fc.jsonValue().map((v) => Buffer.from(JSON.stringify(v) ?? 'null').toString('base64url'));
    fc.assert(
      fc.property(fc.oneof(part, json), fc.oneof(part, json), part, (h, p, s) => {
        expect((NACK_CODES as readonly string[]).includes(timed(`${h}.${p}.${s}`))).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });

  it('single-byte mutations of a valid token are never accepted', () => {
    fc.assert(
      fc.property(fc.nat(), fc.integer({ min: 1, max: 255 }), (at, x) => {
        const b = Buffer.from(valid);
        const i = at % b.length;
        b[i] = b[i]! ^ x;
        const r = timed(b.toString('latin1'));
        // a mutation may land in base64url padding bits and decode to the same bytes: then it is the
        // same token, already used once below or now, and the replay cache must refuse it
        expect(r).not.toBe('accepted');
      }),
      { numRuns: 2000 },
    );
  });

  it('headers with random extra parameters are refused before any signature work', () => {
    fc.assert(
      fc.property(
        fc.dictionary(fc.string({ minLength: 1, maxLength: 8 }), fc.jsonValue(), { minKeys: 1, maxKeys: 4 }),
        (extra) => {
          const header = { alg: 'EdDSA', kid: 'k', typ: 'herald-wake+jwt', ...extra };
          const t = `${Buffer.from(JSON.stringify(header)).toString('base64url')}.e30.AAAA`;
          const r = timed(t);
          expect(isErrorCode(r)).toBe(true);
          expect(r).not.toBe('accepted');
        },
      ),
      { numRuns: 500 },
    );
  });

  it('answer-frame decoding of random JSON never crashes and refuses with a code', () => {
    fc.assert(
      fc.property(fc.jsonValue(), (v) => {
        try {
          decodeAnswer(JSON.stringify(v) ?? 'null');
        } catch (e) {
          expect(isErrorCode(codeOf(e))).toBe(true);
        }
      }),
      { numRuns: 2000 },
    );
  });

  it('took bounded time per input', () => {
    expect(slow).toEqual([]);
  });
});
