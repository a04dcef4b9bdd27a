import { describe, expect, it } from 'vitest';
import { checkFrameSize, decodeAnswer, encodeAck, encodeNack, NACK_CODES } from '../../protocol/frames.js';
import { codeOf, ERROR_CODES } from '../../protocol/errors.js';
import { fullJitterMs, jittered } from '../../protocol/backoff.js';

const code = (fn: () => unknown) => {
  try {
    fn();
  } catch (e) {
    return codeOf(e);
  }
  return undefined;
};

describe('answer frames', () => {
  it('round-trips an ack', () => {
    expect(decodeAnswer(encodeAck('j1', 9, 'queued'))).toEqual({ type: 'ack', jti: 'j1', gen: 9, fetch: 'queued' });
  });

  it.each(NACK_CODES)('round-trips a nack with %s', (c) => {
    expect(decodeAnswer(encodeNack(null, c))).toEqual({ type: 'nack', jti: null, error: c });
  });

  it('covers every wake-up code of SPEC §2 and documents each', () => {
    const spec = ['malformed', 'too_large', 'binary_frame', 'bad_algorithm', 'bad_header', 'missing_kid', 'unknown_kid',
      'wrong_type', 'bad_signature', 'expired', 'not_yet_valid', 'lifetime_too_long', 'issued_before_start',
      'wrong_audience', 'wrong_issuer', 'replayed', 'replay_cache_full', 'bad_gen'];
    for (const c of spec) expect(NACK_CODES).toContain(c);
    for (const c of NACK_CODES) expect(ERROR_CODES[c]).toBeTruthy();
  });

  it('refuses malformed answers with a code', () => {
    expect(code(() => decodeAnswer('not json'))).toBe('malformed');
    expect(code(() => decodeAnswer('{"type":"ack","jti":"x","gen":-1,"fetch":"started"}'))).toBe('malformed');
    expect(code(() => decodeAnswer('{"type":"nack","jti":"x","error":"made_up"}'))).toBe('malformed');
    expect(code(() => decodeAnswer('{"type":"hello"}'))).toBe('malformed');
    expect(code(() => decodeAnswer('x'.repeat(5000)))).toBe('too_large');
  });

  it('checks the 4 KiB frame limit', () => {
    expect(code(() => checkFrameSize(4096))).toBeUndefined();
    expect(code(() => checkFrameSize(4097))).toBe('too_large');
  });
});

describe('backoff', () => {
  it('draws below an exponentially growing, capped ceiling', () => {
    expect(fullJitterMs(0, 100, 1000, () => 0.999)).toBe(99);
    expect(fullJitterMs(3, 100, 1000, () => 0.999)).toBe(799);
    expect(fullJitterMs(20, 100, 1000, () => 0.5)).toBe(500);
    expect(fullJitterMs(5, 100, 1000, () => 0)).toBe(0);
  });

  it('jitters an interval by at most the fraction either way', () => {
    expect(jittered(1000, 0.1, () => 0)).toBe(900);
    expect(jittered(1000, 0.1, () => 1)).toBe(1100);
  });
});
