/**
 * The worker's events as they cross the channel (controller/push-ipc.ts): written flat, cloned
 * as `child_process.fork`'s `advanced` serialization clones them (v8.serialize), and read back
 * as the same objects, in the order written.
 */
import v8 from 'node:v8';
import { describe, expect, it } from 'vitest';
import { MalformedBatchError, readWorkerEvents, WorkerEvents, type EventWord } from '../../controller/push-ipc.js';
import type { AckEvent, PushRequest, PushState } from '../../controller/push-types.js';

type Seen =
  | ['state', string, PushState]
  | ['ack', AckEvent]
  | ['nack', { node: string; jti: string | null; code: string }]
  | ['request', number, PushRequest];

function readAll(words: readonly EventWord[]): Seen[] {
  const seen: Seen[] = [];
  readWorkerEvents(words, {
    state: (node, s) => seen.push(['state', node, s]),
    ack: (e) => seen.push(['ack', e]),
    nack: (e) => seen.push(['nack', e]),
    request: (id, r) => seen.push(['request', id, r]),
  });
  return seen;
}

describe('worker events on the IPC channel', () => {
  it('reads back every kind of event, field for field and in order, after the structured clone', () => {
    const connected: PushState = {
      state: 'connected',
      connected: true,
      generation_pushed: 7,
      generation_acked: 6,
      last_ack_at: '2026-12-05T19:00:00.000Z',
      last_error: null,
      last_error_at: null,
    };
    const failed: PushState = {
      state: 'disconnected',
      connected: false,
      generation_pushed: null,
      generation_acked: null,
      last_ack_at: null,
      last_error: 'tls_failed',
      last_error_at: '2026-12-05T19:00:01.000Z',
    };
    const ack: AckEvent = { node: 'n1', jti: 'j1', gen: 7, fetch: 'started', latencyMs: 1.25 };
    const nack = { node: 'n2', jti: null, code: 'stale_generation' };
    const fetch: PushRequest = { kind: 'fetch', node: 'n1', nonce: 'abc', ifNoneMatch: null };
    const fetch2: PushRequest = { kind: 'fetch', node: 'n3', nonce: 'def', ifNoneMatch: '"6"' };
    const signal: PushRequest = { kind: 'signal', node: 'n2', deploymentId: 'd-1', body: Buffer.from('{"a":1}\n') };

    const w = new WorkerEvents();
    expect(w.empty).toBe(true);
    w.state('n1', connected);
    w.ack(ack);
    w.request(1, fetch);
    w.nack(nack);
    w.state('n2', failed);
    w.request(2, signal);
    w.request(3, fetch2);
    expect(w.empty).toBe(false);
    const words = w.take();
    expect(w.empty).toBe(true);

    const seen = readAll(v8.deserialize(v8.serialize(words)) as EventWord[]);
    // the body comes back as the clone makes it: a Uint8Array with the same bytes
    const [, , signalBack] = seen[5] as ['request', number, PushRequest & { kind: 'signal' }];
    expect(Buffer.from(signalBack.body).toString()).toBe('{"a":1}\n');
    expect(
      seen.map((x) => (x[0] === 'request' && x[2].kind === 'signal' ? ['request', x[1], { ...x[2], body: null }] : x)),
    ).toEqual([
      ['state', 'n1', connected],
      ['ack', ack],
      ['request', 1, fetch],
      ['nack', nack],
      ['state', 'n2', failed],
      ['request', 2, { ...signal, body: null }],
      ['request', 3, fetch2],
    ]);
  });

  it('refuses a batch with a word out of place or an event cut short (a bug on one side), not misreads it', () => {
    const w = new WorkerEvents();
    w.ack({ node: 'n1', jti: 'j1', gen: 1, fetch: 'current', latencyMs: 1 });
    const words = w.take();
    expect(() => readAll(words.slice(1))).toThrow(/no event tag at word 0/);
    expect(() => readAll([...words, 'stray'])).toThrow(/no event tag at word 6/);
    expect(() => readAll([...words, 99])).toThrow(MalformedBatchError);
    // an event with fields missing is not handed over with holes in it
    const seen: string[] = [];
    expect(() =>
      readWorkerEvents([...words, ...words.slice(0, -1)], {
        state: () => seen.push('state'),
        ack: () => seen.push('ack'),
        nack: () => seen.push('nack'),
        request: () => seen.push('request'),
      }),
    ).toThrow(/the event at word 6 is cut short/);
    expect(seen).toEqual(['ack']); // the whole one before it was
  });
});
