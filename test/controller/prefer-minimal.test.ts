/** Reading `Prefer: return=minimal` (RFC 7240) off a request: what asks for it and what does not. */
import type http from 'node:http';
import { describe, expect, it } from 'vitest';
import { prefersMinimal } from '../../controller/api/server.js';

const req = (prefer?: string | string[]): http.IncomingMessage =>
  ({ headers: prefer === undefined ? {} : { prefer } }) as unknown as http.IncomingMessage;

describe('Prefer: return=minimal', () => {
  it.each([
    'return=minimal',
    'RETURN=minimal',
    'return="minimal"',
    'return = minimal',
    'respond-async, return=minimal',
    'return=minimal; foo=bar, wait=10',
  ])('%s asks for it', (h) => {
    expect(prefersMinimal(req(h))).toBe(true);
  });

  it('on one of several Prefer headers', () => {
    expect(prefersMinimal(req(['respond-async', 'return=minimal']))).toBe(true);
  });

  it.each([
    undefined,
    '',
    'return=representation',
    'return=Minimal',
    'respond-async',
    'return',
    'minimal',
    'x-return=minimal',
    'return=representation, return=minimal',
    'foo="a,return=minimal"',
  ])('%s does not', (h) => {
    expect(prefersMinimal(req(h))).toBe(false);
  });
});
