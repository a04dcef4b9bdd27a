/**
 * The fan-out's memory per agent is read from a window of samples, not one: RSS under a garbage
 * collector is a sawtooth, so one sample taken on a peak (or in a trough) must not decide it.
 */
import { describe, expect, it } from 'vitest';
import { rssPerAgent } from '../../bench/fanout.js';

describe('the fan-out: controller memory per connected agent', () => {
  it('is the window median over the empty controller, with its highest sample beside it', () => {
    // 128 MB empty; 10,000 agents at ~840 MB with one peak at 916 MB
    const samples = [840_000, 916_000, 840_000, 838_000, 842_000];
    const r = rssPerAgent(128_000, samples, 10_000);
    expect(r.connected).toBe(840_000);
    expect(r.perAgent).toBe(71.2);
    expect(r.connectedMax).toBe(916_000);
    expect(r.perAgentMax).toBe(78.8);
    expect(r.samples).toBe(5);
  });

  it('a level that is high all through the window reads high', () => {
    const r = rssPerAgent(128_000, [916_000, 915_000, 917_000], 10_000);
    expect(r.perAgent).toBe(78.8);
  });

  it('refuses an empty window or no agents', () => {
    expect(() => rssPerAgent(128_000, [], 10_000)).toThrow(/no samples/);
    expect(() => rssPerAgent(128_000, [200_000], 0)).toThrow(/no agents/);
  });
});
