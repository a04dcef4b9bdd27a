/**
 * A hidden value is masked in every spelling a hook's JSON encoder is likely to print
 * (agent/hooks/hidden-forms.ts): Python's ASCII-only `\uXXXX` escapes and surrogate pairs, Go's
 * HTML-safe escapes, PHP's `\/` and `JSON_HEX_*` escapes, JSON's `\"` and `\\`, hex digits in
 * either case; in the final text and in streamed chunks, wherever the pipe splits the output.
 * The escaped forms below are written out literally (as those encoders print them), not made by
 * the code under test.
 */
import { describe, expect, it } from 'vitest';
import { hiddenValues, MASK, maskText } from '../../agent/hooks/mask.js';
import { OutputChunker } from '../../agent/hooks/output-chunker.js';
import type { MetadataInput } from '../../protocol/heat.js';

const hidden = (name: string, value: unknown, type: MetadataInput['type'] = 'String'): MetadataInput => ({
  name,
  type,
  value,
  hidden: true,
});

/** Each hidden value with the forms encoders print it in (`\\` here is one backslash printed). */
const CASES: Array<{ input: MetadataInput; forms: Record<string, string> }> = [
  {
    input: hidden('city', 'Zürich/2026'),
    forms: {
      raw: 'Zürich/2026',
      'python json.dumps': 'Z\\u00fcrich/2026',
      'php json_encode': 'Z\\u00fcrich\\/2026',
      'php JSON_UNESCAPED_UNICODE': 'Zürich\\/2026',
      'upper-case hex': 'Z\\u00FCrich\\/2026',
    },
  },
  {
    input: hidden('tag', '<b>"x"&amp;</b>'),
    forms: {
      raw: '<b>"x"&amp;</b>',
      'JSON.stringify': '<b>\\"x\\"&amp;</b>',
      'go encoding/json': '\\u003cb\\u003e\\"x\\"\\u0026amp;\\u003c/b\\u003e',
      'php json_encode': '<b>\\"x\\"&amp;<\\/b>',
      'php JSON_HEX_TAG|AMP|QUOT': '\\u003Cb\\u003E\\u0022x\\u0022\\u0026amp;\\u003C\\/b\\u003E',
      'go, upper-case hex': '\\u003Cb\\u003E\\"x\\"\\u0026amp;\\u003C/b\\u003E',
    },
  },
  {
    input: hidden('emoji', 'key-😀-Zz'),
    forms: {
      raw: 'key-😀-Zz',
      'python json.dumps (surrogate pair)': 'key-\\ud83d\\ude00-Zz',
      'upper-case surrogate pair': 'key-\\uD83D\\uDE00-Zz',
      'mixed-case surrogate pair': 'key-\\uD83D\\ude00-Zz',
    },
  },
  {
    input: hidden('lines', 'l1\nl2\t\\e\b\u2028'),
    forms: {
      raw: 'l1\nl2\t\\e\b\u2028',
      'JSON.stringify': 'l1\\nl2\\t\\\\e\\b\u2028',
      'go encoding/json': 'l1\\nl2\\t\\\\e\\u0008\\u2028',
      'python json.dumps': 'l1\\nl2\\t\\\\e\\b\\u2028',
    },
  },
  {
    input: hidden('keys', ['k1-ä', 'k/2'], 'CommaDelimitedList'),
    forms: {
      'the environment string': '["k1-ä","k/2"]',
      'python json.dumps of the list': '["k1-\\u00e4", "k/2"]',
      'python json.dumps of the string': '[\\"k1-\\u00e4\\",\\"k/2\\"]',
      'php json_encode of the list': '["k1-\\u00e4","k\\/2"]',
    },
  },
];

const ALL = hiddenValues(CASES.map((c) => c.input));

/** Feeds the pieces, taking what is ready after each, as the flush timer would. */
function stream(pieces: Buffer[]): string[] {
  const c = new OutputChunker(ALL);
  const out: string[] = [];
  for (const p of pieces) {
    c.write(p);
    out.push(...c.take());
  }
  out.push(...c.take(true));
  return out;
}

/** One row per value and form: `<input> as <encoder>`, the form. */
const ROWS: Array<[string, string]> = CASES.flatMap(({ input, forms }) =>
  Object.entries(forms).map(([how, form]): [string, string] => [`${input.name} as ${how}`, form]),
);

describe('hidden values in the forms JSON encoders print', () => {
  it.each(ROWS)('%s is masked in the final text', (_, form) => {
    expect(maskText(`a ${form} b "${form}"\n`, ALL)).toBe(`a ${MASK} b "${MASK}"\n`);
  });

  it.each(ROWS)('%s is masked in streamed chunks split at every point', (_, form) => {
    // split as a pipe may: at every byte, inside a multi-byte character too
    const text = Buffer.from(`before ${form} after\n`);
    for (let i = 1; i < text.length; i++) {
      // the chunks are all that leaves the node: together exactly the masked text, so no piece of the form is in any
      expect(stream([text.subarray(0, i), text.subarray(i)]).join('')).toBe(`before ${MASK} after\n`);
    }
  });

  it('keeps back as much as the longest form needs, and no more', () => {
    const longest = Math.max(...CASES.flatMap((c) => Object.values(c.forms).map((f) => f.length)));
    const c = new OutputChunker(ALL);
    c.write(Buffer.from('x'.repeat(longest * 2)));
    expect(c.take().join('').length).toBeLessThanOrEqual(longest + 1);
  });
});
