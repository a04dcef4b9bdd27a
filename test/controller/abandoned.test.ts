/**
 * A request whose client has left is not run (controller/api/abandoned.ts, asked by the API server
 * just before a handler runs, after the body is read): decided on the connection, logged
 * `request.abandoned` with its code.
 */
import type http from 'node:http';
import { describe, expect, it } from 'vitest';
import { abandoned } from '../../controller/api/abandoned.js';

function requestOn(destroyed: boolean): http.IncomingMessage {
  return { method: 'POST', socket: { destroyed, remoteAddress: '192.0.2.7' } } as unknown as http.IncomingMessage;
}

function recorder(): { lines: Array<Record<string, unknown>>; debug: (o: Record<string, unknown>) => void } {
  const lines: Array<Record<string, unknown>> = [];
  return { lines, debug: (o) => lines.push(o) };
}

describe('a request whose client has left', () => {
  it('is not run when its connection is gone, logged request.abandoned with code client_gone', () => {
    const log = recorder();
    expect(abandoned(requestOn(true), '/v1/enroll', log as never)).toBe(true);
    expect(log.lines).toEqual([
      { event: 'request.abandoned', code: 'client_gone', route: '/v1/enroll', method: 'POST', remote: '192.0.2.7' },
    ]);
  });

  it('is run while its connection is open, and nothing is logged', () => {
    const log = recorder();
    expect(abandoned(requestOn(false), '/v1/enroll', log as never)).toBe(false);
    expect(log.lines).toEqual([]);
  });
});
