/**
 * The enrolment answer replay cache (controller/service/enroll-replay.ts), on a fake clock: a
 * spent token's answer is given again only to the same node with the same CSR key, only within
 * ENROLL_REPLAY_WINDOW_MS, and forgotten after it (or when issuing failed).
 */
import { describe, expect, it } from 'vitest';
import { EnrollReplay } from '../../controller/service/enroll-replay.js';
import type { CertificateBundle } from '../../protocol/enroll.js';
import { ENROLL_REPLAY_WINDOW_MS } from '../../protocol/limits.js';

const bundle = { certificate: 'cert' } as unknown as CertificateBundle;

function cache(): { replay: EnrollReplay; clock: { now: number } } {
  const clock = { now: 1_000_000 };
  return { replay: new EnrollReplay(() => clock.now), clock };
}

describe('enrolment replay cache', () => {
  it('gives the answer again to the same token, node and key, naming the token spent', async () => {
    const { replay } = cache();
    const answer = Promise.resolve(bundle);
    replay.remember('hash1', 'n1', 'key1', 'tok-1', answer);
    const again = replay.find('hash1', 'n1', 'key1');
    expect(again?.tokenId).toBe('tok-1');
    expect(await again?.answer).toBe(bundle);
  });

  it('refuses another CSR key for the same token and node', () => {
    const { replay } = cache();
    replay.remember('hash1', 'n1', 'key1', 'tok-1', Promise.resolve(bundle));
    expect(replay.find('hash1', 'n1', 'key2')).toBeUndefined();
    // and the holder of the first key still gets its answer
    expect(replay.find('hash1', 'n1', 'key1')).toBeDefined();
  });

  it('refuses another node for the same token and key', () => {
    const { replay } = cache();
    replay.remember('hash1', 'n1', 'key1', 'tok-1', Promise.resolve(bundle));
    expect(replay.find('hash1', 'n2', 'key1')).toBeUndefined();
    expect(replay.find('hash2', 'n1', 'key1')).toBeUndefined();
  });

  it('forgets the answer once ENROLL_REPLAY_WINDOW_MS have passed', () => {
    const { replay, clock } = cache();
    replay.remember('hash1', 'n1', 'key1', 'tok-1', Promise.resolve(bundle));
    clock.now += ENROLL_REPLAY_WINDOW_MS;
    expect(replay.find('hash1', 'n1', 'key1')).toBeDefined();
    clock.now += 1;
    expect(replay.find('hash1', 'n1', 'key1')).toBeUndefined();
    expect(replay.size).toBe(0);
    // even if the clock were set back: it is gone, not hidden
    clock.now -= 1;
    expect(replay.find('hash1', 'n1', 'key1')).toBeUndefined();
  });

  it('forgets an answer whose issue failed (nothing was issued to give again)', async () => {
    const { replay } = cache();
    const failed = Promise.reject(new Error('issuer down'));
    replay.remember('hash1', 'n1', 'key1', 'tok-1', failed);
    await failed.catch(() => {});
    await Promise.resolve();
    expect(replay.find('hash1', 'n1', 'key1')).toBeUndefined();
  });
});
