/**
 * The worker's events as they cross the channel (controller/push/ipc.ts): written flat, cloned
 * as `child_process.fork`'s `advanced` serialization clones them (v8.serialize), and read back
 * as the same objects, in the order written.
 */
import v8 from 'node:v8';
import { describe, expect, it } from 'vitest';
import {
  MalformedBatchError,
  readWorkerCommands,
  readWorkerEvents,
  WorkerCommands,
  WorkerEvents,
  type CommandWord,
  type EventWord,
  type ToWorkerCommand,
} from '../../controller/push/ipc.js';
import type { AckEvent, PushReply, PushRequest, PushState } from '../../controller/push/types.js';

type Seen =
  | ['state', string, PushState]
  | ['ack', AckEvent]
  | ['nack', { node: string; jti: string | null; code: string }]
  | ['request', number, PushRequest]
  | ['attach', string]
  | ['detach', string];

function readAll(words: readonly EventWord[]): Seen[] {
  const seen: Seen[] = [];
  readWorkerEvents(words, {
    state: (node, s) => seen.push(['state', node, s]),
    ack: (e) => seen.push(['ack', e]),
    nack: (e) => seen.push(['nack', e]),
    request: (id, r) => seen.push(['request', id, r]),
    attach: (node) => seen.push(['attach', node]),
    detach: (node) => seen.push(['detach', node]),
  });
  return seen;
}

describe('worker events on the IPC channel', () => {
  it('reads back every kind of event, field for field and in order, after the structured clone', () => {
    const connected: PushState = {
      state: 'connected',
      connected: true,
      via: 'dialled-in',
      generation_pushed: 7,
      generation_acked: 6,
      last_ack_at: '2026-12-05T19:00:00.000Z',
      last_error: null,
      last_error_at: null,
    };
    const failed: PushState = {
      state: 'disconnected',
      connected: false,
      via: null,
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
    w.attach('n1');
    w.state('n1', connected);
    w.ack(ack);
    w.request(1, fetch);
    w.nack(nack);
    w.state('n2', failed);
    w.request(2, signal);
    w.request(3, fetch2);
    w.detach('n1');
    expect(w.empty).toBe(false);
    const words = w.take();
    expect(w.empty).toBe(true);

    const seen = readAll(v8.deserialize(v8.serialize(words)) as EventWord[]);
    // the body comes back as the clone makes it: a Uint8Array with the same bytes
    const [, , signalBack] = seen[6] as ['request', number, PushRequest & { kind: 'signal' }];
    expect(Buffer.from(signalBack.body).toString()).toBe('{"a":1}\n');
    expect(
      seen.map((x) => (x[0] === 'request' && x[2].kind === 'signal' ? ['request', x[1], { ...x[2], body: null }] : x)),
    ).toEqual([
      ['attach', 'n1'],
      ['state', 'n1', connected],
      ['ack', ack],
      ['request', 1, fetch],
      ['nack', nack],
      ['state', 'n2', failed],
      ['request', 2, { ...signal, body: null }],
      ['request', 3, fetch2],
      ['detach', 'n1'],
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
        attach: () => seen.push('attach'),
        detach: () => seen.push('detach'),
      }),
    ).toThrow(/the event at word 6 is cut short/);
    expect(seen).toEqual(['ack']); // the whole one before it was
  });
});

type Command = ['notify', string, number, string] | ['answer', number, string, PushReply] | ['other', ToWorkerCommand];

function readCommands(words: readonly CommandWord[]): Command[] {
  const seen: Command[] = [];
  readWorkerCommands(words, {
    notify: (node, gen, reason) => seen.push(['notify', node, gen, reason]),
    answer: (id, kind, r) => seen.push(['answer', id, kind, r]),
    other: (cmd) => seen.push(['other', cmd]),
  });
  return seen;
}

describe('commands to a worker on the IPC channel', () => {
  it('reads back every kind of command, field for field and in order, after the structured clone', () => {
    const ok: PushReply = { status: 200, etag: '"7"', signature: 'e.s.j', body: Buffer.from('{"node":"n1"}') };
    const notModified: PushReply = { status: 304, etag: '"7"', signature: 'e.s.k' };
    const limited: PushReply = { status: 429, error: 'rate_limited', retryAfterS: 2 };
    const endpoint: ToWorkerCommand = { t: 'endpoint', node: 'n2', url: 'wss://127.0.0.1:9/n2', gen: 3 };
    const c = new WorkerCommands();
    expect(c.empty).toBe(true);
    c.notify('n1', 7, 'deployment');
    c.answer(1, 'fetch', ok);
    c.other(endpoint);
    c.answer(2, 'fetch', notModified);
    c.notify('n3', 8, 'ping');
    c.answer(3, 'signal', limited);
    c.other({ t: 'remove', node: 'n4' });
    expect(c.empty).toBe(false);
    const words = c.take();
    expect(c.empty).toBe(true);

    const seen = readCommands(v8.deserialize(v8.serialize(words)) as CommandWord[]);
    // the body comes back as the clone makes it: a Uint8Array with the same bytes
    const [, , , okBack] = seen[1] as ['answer', number, string, PushReply];
    expect(Buffer.from(okBack.body!).toString()).toBe('{"node":"n1"}');
    // a reply has only the fields it was given (no nulls for the ones it had not)
    expect(
      seen.map((x) => (x[0] === 'answer' && x[3].body ? ['answer', x[1], x[2], { ...x[3], body: 'bytes' }] : x)),
    ).toStrictEqual([
      ['notify', 'n1', 7, 'deployment'],
      ['answer', 1, 'fetch', { ...ok, body: 'bytes' }],
      ['other', endpoint],
      ['answer', 2, 'fetch', notModified],
      ['notify', 'n3', 8, 'ping'],
      ['answer', 3, 'signal', limited],
      ['other', { t: 'remove', node: 'n4' }],
    ]);
  });

  it('refuses a batch with a word out of place or a command cut short (a bug on one side), not misreads it', () => {
    const c = new WorkerCommands();
    c.notify('n1', 1, 'deployment');
    const words = c.take();
    expect(() => readCommands(words.slice(1))).toThrow(/no command tag at word 0/);
    expect(() => readCommands([...words, 'stray'])).toThrow(/no command tag at word 4/);
    expect(() => readCommands([...words, 99])).toThrow(MalformedBatchError);
    // a command with fields missing is not handed over with holes in it
    const seen: string[] = [];
    expect(() =>
      readWorkerCommands([...words, ...words.slice(0, -1)], {
        notify: (node) => seen.push(node),
        answer: () => seen.push('answer'),
        other: () => seen.push('other'),
      }),
    ).toThrow(/the command at word 4 is cut short/);
    expect(seen).toEqual(['n1']); // the whole one before it was
  });
});
