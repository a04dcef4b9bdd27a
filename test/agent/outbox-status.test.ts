import { describe, expect, it } from 'vitest';
import { isFinalStatus } from '../../agent/outbox.js';

describe("outbox: which answers end a signal's retries", () => {
  it.each([200, 201, 204, 400, 404, 409, 413, 422])('%i is final: resending the same signal cannot change it', (s) => {
    expect(isFinalStatus(s)).toBe(true);
  });
  it.each([403, 408, 429, 500, 502, 503])('%i is retried: the controller or the network may recover', (s) => {
    expect(isFinalStatus(s)).toBe(false);
  });
});
