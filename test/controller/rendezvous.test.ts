/** Rendezvous spreading (docs/several-controllers.md): the same owner from the same list, even spread, minimal moves. */
import { describe, expect, it } from 'vitest';
import { ownerOf } from '../../controller/fleet/rendezvous.js';

const nodes = Array.from({ length: 3000 }, (_, i) => `node-${i}`);

describe('rendezvous hashing', () => {
  it('gives every node one owner, the same whatever the order of the list', () => {
    for (const n of nodes.slice(0, 200)) expect(ownerOf(n, ['c1', 'c2', 'c3'])).toBe(ownerOf(n, ['c3', 'c1', 'c2']));
    expect(ownerOf('n1', [])).toBeUndefined();
  });

  it('spreads 3,000 nodes evenly over three controllers (each within 10 % of a third)', () => {
    const count = new Map<string, number>();
    for (const n of nodes) {
      const o = ownerOf(n, ['c1', 'c2', 'c3'])!;
      count.set(o, (count.get(o) ?? 0) + 1);
    }
    for (const c of ['c1', 'c2', 'c3']) expect(Math.abs(count.get(c)! - 1000)).toBeLessThan(100);
  });

  it('moves only the nodes of a controller that leaves, and only to a controller that joins', () => {
    const three = new Map(nodes.map((n) => [n, ownerOf(n, ['c1', 'c2', 'c3'])!]));
    const two = new Map(nodes.map((n) => [n, ownerOf(n, ['c1', 'c2'])!]));
    for (const n of nodes) if (three.get(n) !== 'c3') expect(two.get(n)).toBe(three.get(n));
    const four = new Map(nodes.map((n) => [n, ownerOf(n, ['c1', 'c2', 'c3', 'c4'])!]));
    for (const n of nodes) if (four.get(n) !== three.get(n)) expect(four.get(n)).toBe('c4');
    const moved = nodes.filter((n) => four.get(n) === 'c4').length;
    expect(Math.abs(moved - 750)).toBeLessThan(100);
  });
});
