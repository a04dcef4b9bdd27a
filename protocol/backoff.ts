/** Exponential backoff with full jitter: a delay drawn uniformly below min(cap, base * 2^attempt). */
export function fullJitterMs(
  attempt: number,
  baseMs: number,
  capMs: number,
  random: () => number = Math.random,
): number {
  const ceiling = Math.min(capMs, baseMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * ceiling);
}

/** `intervalMs` moved by at most ±`fraction` of itself. */
export function jittered(intervalMs: number, fraction: number, random: () => number = Math.random): number {
  return Math.round(intervalMs * (1 + (random() * 2 - 1) * fraction));
}
