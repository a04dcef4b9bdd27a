/**
 * Rendezvous (highest random weight) hashing: each node goes to the live controller with the
 * highest score for the pair, so every controller computes the same owner from the same list,
 * and a controller joining or leaving moves only the nodes it gains or loses (docs/several-controllers.md).
 * Pure: no I/O.
 */

/** A 32-bit score for (controller, node): FNV-1a over both names, then murmur3's finaliser to spread the bits. */
export function score(controller: string, node: string): number {
  let h = 0x811c9dc5;
  const mix = (s: string) => {
    for (let i = 0; i < s.length; i++) {
      h ^= s.charCodeAt(i);
      h = Math.imul(h, 0x01000193);
    }
  };
  mix(controller);
  h ^= 0;
  h = Math.imul(h, 0x01000193);
  mix(node);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The owner of `node` among `controllers` (undefined when there is none); ties go to the lower name. */
export function ownerOf(node: string, controllers: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestScore = -1;
  for (const c of controllers) {
    const s = score(c, node);
    if (s > bestScore || (s === bestScore && best !== undefined && c < best)) {
      best = c;
      bestScore = s;
    }
  }
  return best;
}
