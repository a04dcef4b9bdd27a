/** FNV-1a (32 bits) of a string's UTF-16 code units: a stable spread of names (node ids), the same in every run. Pure. */
export function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}
