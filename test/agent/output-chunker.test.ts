import { describe, expect, it } from 'vitest';
import { OutputChunker, splitUtf8 } from '../../agent/hooks/output-chunker.js';
import { hiddenValues } from '../../agent/hooks/mask.js';

const hidden = hiddenValues([{ name: 'pw', type: 'String', value: 's3cr3t-value', hidden: true }]);

/** Feeds the pieces, taking what is ready after each, as the flush timer would. */
function stream(pieces: string[], values = hidden): string[] {
  const c = new OutputChunker(values);
  const out: string[] = [];
  for (const p of pieces) {
    c.write(Buffer.from(p));
    out.push(...c.take());
  }
  out.push(...c.take(true));
  return out;
}

describe('OutputChunker', () => {
  it('masks a hidden value printed whole', () => {
    const out = stream(['before s3cr3t-value after\n']);
    expect(out.join('')).toBe('before *** after\n');
    for (const c of out) expect(c).not.toContain('s3cr3t');
  });

  it('masks a hidden value split across two writes, never sending a piece of it', () => {
    const out = stream(['line one s3cr', '3t-value line two\n']);
    expect(out.join('')).toBe('line one *** line two\n');
    for (const c of out) {
      expect(c).not.toContain('s3cr');
      expect(c).not.toContain('3t-value');
    }
  });

  it('masks a value split at every possible point', () => {
    const text = 'x s3cr3t-value y s3cr3t-value z\n';
    for (let i = 1; i < text.length; i++) {
      const out = stream([text.slice(0, i), text.slice(i)]);
      expect(out.join('')).toBe('x *** y *** z\n');
      for (const c of out) for (let k = 3; k <= 12; k++) expect(c).not.toContain('s3cr3t-value'.slice(0, k));
    }
  });

  it('sends everything at once when nothing is hidden, and keeps back only what may be a value', () => {
    const c = new OutputChunker([]);
    c.write(Buffer.from('abc'));
    expect(c.take()).toEqual(['abc']);
    const m = new OutputChunker(hidden);
    m.write(Buffer.from('0123456789abcdef'));
    expect(m.take()).toEqual(['01234']); // the last 11 characters wait
    expect(m.take(true)).toEqual(['56789abcdef']);
  });

  it('keeps a multi-byte character split by the pipe whole', () => {
    const b = Buffer.from('héllo\n');
    const c = new OutputChunker([]);
    c.write(b.subarray(0, 2));
    c.write(b.subarray(2));
    expect(c.take(true).join('')).toBe('héllo\n');
  });

  it('splits on character boundaries within the byte limit', () => {
    const s = 'é'.repeat(10);
    const parts = splitUtf8(s, 5);
    expect(parts.join('')).toBe(s);
    for (const p of parts) expect(Buffer.byteLength(p)).toBeLessThanOrEqual(5);
  });
});
