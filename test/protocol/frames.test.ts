import { describe, expect, it } from 'vitest';
import {
  checkFrameSize,
  decodeAgentFrame,
  decodeAnswer,
  decodeControllerAnswer,
  decodeMetadataFrame,
  encodeAck,
  encodeFetch,
  encodeMetadataFrame,
  encodeNack,
  encodeSignal,
  encodeSignalled,
  NACK_CODES,
  offersFeature,
} from '../../protocol/frames.js';
import { ERROR_CODES } from '../../protocol/errors.js';
import { fullJitterMs, jittered } from '../../protocol/backoff.js';
import { fitSignalBody } from '../../protocol/heat.js';
import { thrownCode as code } from '../helpers/codes.js';

describe('answer frames', () => {
  it('round-trips an ack', () => {
    expect(decodeAnswer(encodeAck('j1', 9, 'queued'))).toEqual({ type: 'ack', jti: 'j1', gen: 9, fetch: 'queued' });
  });

  it.each(NACK_CODES)('round-trips a nack with %s', (c) => {
    expect(decodeAnswer(encodeNack(null, c))).toEqual({ type: 'nack', jti: null, error: c });
  });

  it('covers every wake-up code of docs/protocol.md and documents each', () => {
    const spec = [
      'malformed',
      'too_large',
      'binary_frame',
      'bad_algorithm',
      'bad_header',
      'missing_kid',
      'unknown_kid',
      'wrong_type',
      'bad_signature',
      'expired',
      'not_yet_valid',
      'lifetime_too_long',
      'issued_before_start',
      'wrong_audience',
      'wrong_issuer',
      'replayed',
      'replay_cache_full',
      'bad_gen',
    ];
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

describe('signal and signalled frames (signal over the push connection)', () => {
  const nonce = 's'.repeat(22);
  const body = Buffer.from('{"revision":2,"deploy_stdout":"a\\nb\n"}\n');

  it('round-trips a signal with its body byte for byte, newlines and all', () => {
    const f = decodeAgentFrame(encodeSignal(nonce, 'dep-1', body));
    expect(f.type === 'signal' && { nonce: f.nonce, deployment: f.deployment, same: f.body.equals(body) }).toEqual({
      nonce,
      deployment: 'dep-1',
      same: true,
    });
    expect(code(() => decodeAnswer(encodeSignal(nonce, 'dep-1', body).toString()))).toBe('malformed');
  });

  it.each([
    ['no body line', Buffer.from(JSON.stringify({ type: 'signal', nonce, deployment: 'd' }))],
    ['a bad nonce', Buffer.from(`{"type":"signal","nonce":"x","deployment":"d"}\n{}`)],
    ['no deployment', Buffer.from(`{"type":"signal","nonce":"${nonce}"}\n{}`)],
    ['a deployment id over 200 characters', encodeSignal(nonce, 'd'.repeat(201), body)],
    ['another frame with a body', Buffer.from(`${encodeFetch(nonce)}\n{}`)],
  ])('refuses a signal frame with %s (malformed)', (_what, frame) => {
    expect(code(() => decodeAgentFrame(frame))).toBe('malformed');
  });

  it('takes any other frame as one JSON value, newlines and all (as the text it was before signals)', () => {
    const ack = `${encodeAck('j1', 3, 'started')}\n`;
    expect(decodeAgentFrame(Buffer.from(ack))).toEqual({ type: 'ack', jti: 'j1', gen: 3, fetch: 'started' });
    const pretty = JSON.stringify({ type: 'fetch', nonce }, null, 2);
    expect(decodeAgentFrame(Buffer.from(pretty))).toEqual({ type: 'fetch', nonce });
  });

  it('refuses a head over 4 KiB (too_large), whatever follows', () => {
    const head = JSON.stringify({ type: 'signal', nonce, deployment: 'd', pad: 'x'.repeat(4_200) });
    expect(code(() => decodeAgentFrame(Buffer.from(`${head}\n{}`)))).toBe('too_large');
    expect(code(() => decodeAgentFrame(Buffer.alloc(5_000, 0x20)))).toBe('too_large');
  });

  it('round-trips a signalled answer; a metadata frame is told apart from it', () => {
    const s = encodeSignalled({ nonce, status: 429, error: 'rate_limited', retry_after_s: 2, signature: 'h.p.s' });
    expect(decodeControllerAnswer(Buffer.from(s))).toEqual({
      type: 'signalled',
      nonce,
      status: 429,
      error: 'rate_limited',
      retry_after_s: 2,
      signature: 'h.p.s',
    });
    expect(code(() => decodeMetadataFrame(Buffer.from(s)))).toBe('malformed');
    const m = decodeControllerAnswer(encodeMetadataFrame({ type: 'metadata', nonce, status: 304, etag: '"1"' }));
    expect(m.type).toBe('metadata');
  });

  it.each([
    ['a body', `{"type":"signalled","nonce":"${nonce}","status":200}\nbody`],
    ['a status out of range', `{"type":"signalled","nonce":"${nonce}","status":700}`],
    ['an error code too long', `{"type":"signalled","nonce":"${nonce}","status":400,"error":"${'e'.repeat(65)}"}`],
    ['another type', `{"type":"ack","nonce":"${nonce}","status":200}`],
    ['a signature that is not a string', `{"type":"signalled","nonce":"${nonce}","status":200,"signature":1}`],
    ['a signature too long', `{"type":"signalled","nonce":"${nonce}","status":200,"signature":"${'s'.repeat(2_049)}"}`],
  ])('refuses a signalled frame with %s (malformed)', (_what, frame) => {
    expect(code(() => decodeControllerAnswer(Buffer.from(frame)))).toBe('malformed');
  });
});

describe('fetch and metadata frames (fetch over the push connection)', () => {
  const nonce = 'n'.repeat(22);

  it('round-trips a fetch, with and without If-None-Match', () => {
    expect(decodeAgentFrame(encodeFetch(nonce))).toEqual({ type: 'fetch', nonce });
    expect(decodeAgentFrame(encodeFetch(nonce, '"7"'))).toEqual({ type: 'fetch', nonce, if_none_match: '"7"' });
  });

  it('refuses a fetch without a valid nonce or with an oversized If-None-Match, and a fetch where an answer is due', () => {
    expect(code(() => decodeAgentFrame('{"type":"fetch"}'))).toBe('malformed');
    expect(code(() => decodeAgentFrame('{"type":"fetch","nonce":"short"}'))).toBe('malformed');
    expect(code(() => decodeAgentFrame(JSON.stringify({ type: 'fetch', nonce, if_none_match: 'x'.repeat(201) })))).toBe(
      'malformed',
    );
    expect(code(() => decodeAnswer(encodeFetch(nonce)))).toBe('malformed');
  });

  it('carries the body after the head line byte for byte, newlines and all', () => {
    const body = Buffer.from('{"a":"line\\none","b":"é"}\n');
    const f = decodeMetadataFrame(
      encodeMetadataFrame({ type: 'metadata', nonce, status: 200, etag: '"3"', signature: 'a.b.c' }, body),
    );
    expect(f.head).toEqual({ type: 'metadata', nonce, status: 200, etag: '"3"', signature: 'a.b.c' });
    expect(f.body.equals(body)).toBe(true);
    const r = decodeMetadataFrame(
      encodeMetadataFrame({ type: 'metadata', nonce, status: 429, error: 'rate_limited', retry_after_s: 2 }),
    );
    expect(r.head).toMatchObject({ status: 429, error: 'rate_limited', retry_after_s: 2 });
    expect(r.body.length).toBe(0);
  });

  it.each([
    ['no head line', '{"type":"metadata"}'],
    ['a head that is not JSON', 'nope\n'],
    ['another type', `{"type":"ack","nonce":"${nonce}","status":200}\n`],
    ['a bad nonce', '{"type":"metadata","nonce":"x","status":200}\n'],
    ['a status out of range', `{"type":"metadata","nonce":"${nonce}","status":99}\n`],
    ['a non-200 with a body', `{"type":"metadata","nonce":"${nonce}","status":304}\nbody`],
    ['a signature too long', `{"type":"metadata","nonce":"${nonce}","status":200,"signature":"${'s'.repeat(2049)}"}\n`],
    ['a head over 4 KiB', `{"type":"metadata","nonce":"${nonce}","status":200,"x":"${'x'.repeat(4200)}"}\n`],
  ])('refuses a metadata frame with %s (malformed)', (_what, frame) => {
    expect(code(() => decodeMetadataFrame(Buffer.from(frame)))).toBe('malformed');
  });

  it('reads the feature list of Herald-Features', () => {
    expect(offersFeature('fetch', 'fetch')).toBe(true);
    expect(offersFeature('other, Fetch', 'fetch')).toBe(true);
    expect(offersFeature(['x', 'fetch'], 'fetch')).toBe(true);
    expect(offersFeature('fetcher', 'fetch')).toBe(false);
    expect(offersFeature(undefined, 'fetch')).toBe(false);
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

describe('fitSignalBody', () => {
  const base = { revision: 1, deploy_status_code: 0, deploy_stdout: 'ok', deploy_stderr: '', outputs: { a: 'b' } };
  const size = (b: object) => Buffer.byteLength(JSON.stringify(b));

  it('leaves a body that fits alone', () => {
    expect(fitSignalBody(base, 1024)).toBe(base);
  });

  it('keeps the tails of stdout and stderr, with the cut marker, until the body fits', () => {
    const big = { ...base, deploy_stdout: `${'x'.repeat(300_000)}THE END`, deploy_stderr: `${'"'.repeat(300_000)}ERR` };
    const fitted = fitSignalBody(big, 200_000);
    expect(size(fitted)).toBeLessThanOrEqual(200_000);
    expect(fitted.deploy_stdout.endsWith('THE END')).toBe(true);
    expect(fitted.deploy_stdout.startsWith('[herald: ')).toBe(true);
    expect(fitted.deploy_stderr.endsWith('ERR')).toBe(true);
    expect(fitted.outputs).toEqual({ a: 'b' });
    expect(fitted.deploy_status_code).toBe(0);
  });

  it('drops outputs that cannot fit and fails the deployment with signal_too_large', () => {
    const huge = { ...base, outputs: { blob: 'y'.repeat(300_000) } };
    const fitted = fitSignalBody(huge, 100_000);
    expect(size(fitted)).toBeLessThanOrEqual(100_000);
    expect(fitted.outputs).toEqual({});
    expect(fitted.deploy_status_code).not.toBe(0);
    expect(fitted.status_reason).toMatch(/^signal_too_large/);
  });
});
