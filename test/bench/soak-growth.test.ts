/**
 * The soak's verdict compares levels, not single samples: RSS under a garbage collector is a
 * sawtooth, so a sample taken in a trough must not read as growth, and growth of the level must.
 */
import { describe, expect, it } from 'vitest';
import { levelGrowth, type SoakSample } from '../../bench/soak.js';

/** 40 samples, 5 s apart; `agent(i)` gives the agent's RSS (kB) at sample i. */
function samples(agent: (i: number) => number): SoakSample[] {
  return Array.from({ length: 40 }, (_, i) => ({
    atS: i * 5,
    changes: i * 100,
    controllerMainKb: 80_000,
    pushWorkersKb: 60_000,
    agentsKb: [agent(i)],
  }));
}

describe('the soak: growth of the level', () => {
  it('a trough at the end of the first quarter is not growth', () => {
    // a sawtooth between 60 and 64 MB, with one deep trough at the quarter mark
    const s = samples((i) => (i === 10 ? 56_000 : i % 4 === 0 ? 64_000 : 60_000));
    expect(levelGrowth(s).agentsMax).toBe(0);
  });

  it('a level that rises is growth', () => {
    // the same sawtooth, 20 % higher in the last quarter
    const s = samples((i) => (i % 4 === 0 ? 64_000 : 60_000) * (i >= 30 ? 1.2 : 1));
    expect(levelGrowth(s).agentsMax).toBeCloseTo(20, 1);
    expect(levelGrowth(s).controllerMain).toBe(0);
  });
});
