/**
 * The push dialer against real listeners on 127.0.0.1 (TLS 1.3 mutual auth, certificates made by
 * certs/ for the run). Every wait is for an event, with a bound.
 */
import { nextPushEvent } from '../helpers/push-events.js';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Registry } from 'prom-client';
import { PushDialer, type PushDialerOptions } from '../../controller/push/dialer.js';
import type { AckEvent, PushState } from '../../controller/push/types.js';
import { materialPaths, pkiPaths } from '../../certs/paths.js';
import { PkiMaterial, tlsServerOptions } from '../../certs/tls.js';
import type { Ed25519PrivateJwk } from '../../protocol/jws.js';
import { CONTROLLER_ID, makePushPki, TD, TestWakeListener, type PushPki } from '../helpers/wake-listener.js';

let pki: PushPki;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki(['n1', 'n2', 'n3', 'n4']);
}, 60_000);

afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});

afterAll(() => pki?.cleanup());

function dialer(over: Partial<PushDialerOptions> = {}): PushDialer {
  const d = new PushDialer({
    signer: pki.signer(),
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: pki.controllerMaterial(),
    logger: pki.logger,
    backoffBaseMs: 50,
    backoffMaxMs: 200,
    ...over,
  });
  open.push(d);
  return d;
}

async function listener(
  node: string,
  opts: { certName?: string; mode?: 'answer' | 'silent' } = {},
): Promise<TestWakeListener> {
  const l = await TestWakeListener.start({ pkiDir: pki.dir, node, ...opts });
  open.push(l);
  return l;
}

const next = nextPushEvent;

const stateIs = (node: string, want: (s: PushState) => boolean) => (n: string, s: PushState) => n === node && want(s);

/** Connects n1 through a first ping wake-up and waits for its ack. */
async function connected(d: PushDialer, l: TestWakeListener, gen: number): Promise<void> {
  const acked = next(d, 'ack', (e) => e.node === l.node);
  await d.start([{ node: l.node, url: l.url, generation: gen, ackedGeneration: gen - 1 }]);
  await acked;
}

async function closedPort(): Promise<number> {
  const s = net.createServer().listen(0, '127.0.0.1');
  await once(s, 'listening');
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

interface MaskedFrame {
  masked: boolean;
  key: Buffer;
  payload: Buffer;
}

/** The client frame at the start of `buf` as sent (payload not unmasked), or null while it is incomplete. */
function maskedFrameOf(buf: Buffer): MaskedFrame | null {
  if (buf.length < 2) return null;
  const len7 = buf[1]! & 0x7f;
  if (len7 === 127) throw new Error('a frame over 64 KiB: not a wake-up');
  const keyAt = len7 === 126 ? 4 : 2;
  if (buf.length < keyAt + 4) return null;
  const size = len7 === 126 ? buf.readUInt16BE(2) : len7;
  if (buf.length < keyAt + 4 + size) return null;
  return {
    masked: (buf[1]! & 0x80) !== 0,
    key: buf.subarray(keyAt, keyAt + 4),
    payload: buf.subarray(keyAt + 4, keyAt + 4 + size),
  };
}

describe('push dialer', () => {
  it('connects at start to a node that is behind and sends a ping wake-up with its generation', async () => {
    const l = await listener('n1');
    const d = dialer();
    await connected(d, l, 7);
    expect(l.wakes).toHaveLength(1);
    expect(l.wakes[0]!.claims).toMatchObject({
      gen: 7,
      reason: 'ping',
      iss: CONTROLLER_ID,
      aud: `spiffe://${TD}/agent/n1`,
    });
    expect(d.state('n1')).toMatchObject({
      state: 'connected',
      connected: true,
      generation_pushed: 7,
      generation_acked: 7,
      last_error: null,
    });
    expect(d.state('n1').last_ack_at).not.toBeNull();
  });

  it('a change sends exactly one wake-up with the new generation', async () => {
    const l = await listener('n1');
    const d = dialer();
    await connected(d, l, 3);
    const ack = next(d, 'ack', (e) => e.gen === 4);
    d.notify('n1', 4, 'deployment');
    const [ev] = await ack;
    expect(ev.fetch).toBe('started');
    expect(ev.latencyMs).toBeGreaterThanOrEqual(0);
    expect(l.wakes.map((w) => [w.claims.gen, w.claims.reason])).toEqual([
      [3, 'ping'],
      [4, 'deployment'],
    ]);
    expect(d.wakesInFlight).toBe(0);
  });

  it('coalesces a burst of 50 changes into at most two wake-ups, the last with the newest generation', async () => {
    const l = await listener('n1');
    const d = dialer();
    await connected(d, l, 100);
    const last = next(d, 'ack', (e) => e.gen === 150);
    for (let g = 101; g <= 150; g++) d.notify('n1', g, 'deployment');
    await last;
    const burst = l.wakes.slice(1);
    expect(burst.length).toBeGreaterThanOrEqual(1);
    expect(burst.length).toBeLessThanOrEqual(2);
    expect(burst.at(-1)!.claims.gen).toBe(150);
    expect(d.wakesInFlight).toBe(0);
    expect(d.state('n1').generation_pushed).toBe(150);
  });

  it('first need: a node not behind at start is dialled on its first notify', async () => {
    const l = await listener('n1');
    const d = dialer();
    await d.start([{ node: 'n1', url: l.url, generation: 5, ackedGeneration: 5 }]);
    expect(d.state('n1').state).toBe('idle');
    expect(l.connections).toBe(0);
    const ack = next(d, 'ack', (e) => e.gen === 6);
    d.notify('n1', 6, 'deployment');
    await ack;
    // the connect wake-up already carries the change: one wake-up, not two
    expect(l.wakes.map((w) => w.claims.gen)).toEqual([6]);
  });

  it('detects a listener that accepts but never answers as half-open within 2 s', async () => {
    const l = await listener('n1', { mode: 'silent' });
    const d = dialer({ backoffBaseMs: 5_000, backoffMaxMs: 5_000 });
    const up = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'connected'),
    );
    const half = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'half_open'),
      4_000,
    );
    await d.start([{ node: 'n1', url: l.url, generation: 2, ackedGeneration: 1 }]);
    await up;
    const t0 = Date.now();
    const [, s] = await half;
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(s).toMatchObject({ state: 'half_open', connected: false, last_error: 'half_open', generation_pushed: 2 });
    expect(d.state('n1').state).toBe('half_open');
    expect(d.wakesInFlight).toBe(0);
    await l.waitFor('close'); // the dialer dropped the connection
  });

  it('a down listener leaves the node disconnected with a code, retried with backoff, while other nodes are woken', async () => {
    const port = await closedPort();
    const l2 = await listener('n2');
    const registry = new Registry();
    const d = dialer({ metrics: registry, backoffBaseMs: 20, backoffMaxMs: 100 });
    let failures = 0;
    const retried = next(d, 'state', (n, s) => n === 'n1' && s.state === 'disconnected' && ++failures >= 3);
    const acked = next(d, 'ack', (e) => e.node === 'n2');
    await d.start([
      { node: 'n1', url: `wss://127.0.0.1:${port}/v1/wake`, generation: 2, ackedGeneration: 1 },
      { node: 'n2', url: l2.url, generation: 9, ackedGeneration: 1 },
    ]);
    await Promise.all([retried, acked]);
    expect(d.state('n1')).toMatchObject({ state: 'disconnected', connected: false, last_error: 'connection_refused' });
    expect(d.state('n2')).toMatchObject({ state: 'connected', generation_acked: 9 });
    const text = await registry.metrics();
    expect(text).toMatch(/herald_push_dial_failures_total\{code="connection_refused"\} ([3-9]|\d\d+)/);
    expect(text).toMatch(/herald_push_connected_agents 1/);
    expect(text).toMatch(/herald_wakeups_acked_total 1/);
  });

  it('refuses a listener presenting agent/n2 when n1 is dialled (wrong_peer) and sends it nothing', async () => {
    const impostor = await listener('n1', { certName: 'n2' });
    const d = dialer({ backoffBaseMs: 5_000, backoffMaxMs: 5_000 });
    const failed = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'disconnected'),
    );
    await d.start([{ node: 'n1', url: impostor.url, generation: 2, ackedGeneration: 1 }]);
    const [, s] = await failed;
    expect(s.last_error).toBe('wrong_peer');
    expect(impostor.connections).toBe(0);
    expect(impostor.wakes).toHaveLength(0);
  });

  it('a restarted dialer connects to a node that is behind and pings it unprompted', async () => {
    const l = await listener('n1');
    const first = dialer();
    await connected(first, l, 5);
    await first.close();
    const ack = new Promise<AckEvent>((resolve) => {
      const second = dialer();
      second.on('ack', resolve);
      // the store says gen 8 exists and only 5 was acked: nothing calls notify
      void second.start([{ node: 'n1', url: l.url, generation: 8, ackedGeneration: 5 }]);
    });
    const ev = await Promise.race([
      ack,
      new Promise<never>((_, rej) => setTimeout(() => rej(new Error('no ack')), 5_000)),
    ]);
    expect(ev.gen).toBe(8);
    expect(l.wakes.at(-1)!.claims).toMatchObject({ gen: 8, reason: 'ping' });
  });

  it('reconnects after the listener went away and sends a ping wake-up with the current generation', async () => {
    const l = await listener('n1');
    const d = dialer({ backoffBaseMs: 20, backoffMaxMs: 50 });
    await connected(d, l, 10);
    const down = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'disconnected'),
    );
    await l.stop();
    await down;
    d.notify('n1', 11, 'deployment'); // nothing to send it on: the reconnect must carry it
    d.notify('n1', 12, 'restart');
    const ack = next(d, 'ack', (e) => e.gen === 12);
    await l.listen();
    await ack;
    expect(l.wakes.slice(1).map((w) => [w.claims.gen, w.claims.reason])).toEqual([[12, 'ping']]);
    expect(d.state('n1')).toMatchObject({ state: 'connected', generation_acked: 12 });
  });

  it('setEndpoint with a new URL closes the old connection and dials the new one', async () => {
    const a = await listener('n1');
    const b = await listener('n1');
    const d = dialer();
    await connected(d, a, 3);
    const closed = a.waitFor<number>('close');
    const ack = next(d, 'ack', () => b.wakes.length > 0);
    d.setEndpoint('n1', b.url, 3);
    expect(await closed).toBe(1001);
    await ack;
    expect(b.wakes[0]!.claims).toMatchObject({ gen: 3, reason: 'ping' });
  });

  it('remove() closes and forgets the node', async () => {
    const l = await listener('n1');
    const d = dialer();
    await connected(d, l, 3);
    const closed = l.waitFor<number>('close');
    d.remove('n1');
    expect(await closed).toBe(1001);
    expect(d.state('n1').state).toBe('idle');
    expect(d.connectedCount).toBe(0);
  });

  it('close() closes every connection with 1001 and is idempotent', async () => {
    const l1 = await listener('n1');
    const l3 = await listener('n3');
    const d = dialer();
    const both = Promise.all([next(d, 'ack', (e) => e.node === 'n1'), next(d, 'ack', (e) => e.node === 'n3')]);
    await d.start([
      { node: 'n1', url: l1.url, generation: 1, ackedGeneration: null },
      { node: 'n3', url: l3.url, generation: 1, ackedGeneration: 0 },
    ]);
    await both;
    const codes = Promise.all([l1.waitFor<number>('close'), l3.waitFor<number>('close')]);
    const p = d.close();
    expect(d.close()).toBe(p);
    await p;
    expect(await codes).toEqual([1001, 1001]);
    d.notify('n1', 2, 'deployment'); // after close: ignored, no throw
  });

  it('finds each of two unanswered wake-ups sent apart half-open in its turn (one timer, armed again for the later one)', async () => {
    const l1 = await listener('n1', { mode: 'silent' });
    const l2 = await listener('n2', { mode: 'silent' });
    // (the whole backoff, not a jittered part of it: no reconnect puts a wake-up in flight meanwhile)
    const d = dialer({ answerTimeoutMs: 300, backoffBaseMs: 5_000, backoffMaxMs: 5_000, random: () => 0.999 });
    const half = (node: string) =>
      next(
        d,
        'state',
        stateIs(node, (s) => s.state === 'half_open'),
        4_000,
      );
    const n1up = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'connected'),
    );
    const n1half = half('n1');
    const n2half = half('n2');
    await d.start([
      { node: 'n1', url: l1.url, generation: 1, ackedGeneration: 0 },
      { node: 'n2', url: null, generation: 1, ackedGeneration: 0 },
    ]);
    await n1up;
    expect(d.wakesInFlight).toBe(1);
    // n2's wake-up goes out a while after n1's, so it falls due after the timer has fired for n1
    await new Promise((r) => setTimeout(r, 150));
    d.setEndpoint('n2', l2.url, 2);
    await n1half;
    expect(d.state('n2').state).toBe('connected'); // not yet due
    const [, s2] = await n2half;
    expect(s2).toMatchObject({ last_error: 'half_open', generation_pushed: 2 });
    expect(d.wakesInFlight).toBe(0);
  });

  it('bounds wake-ups in flight and serves waiting nodes in turn', async () => {
    const l1 = await listener('n1', { mode: 'silent' });
    const l3 = await listener('n3');
    const d = dialer({ maxWakesInFlight: 1, answerTimeoutMs: 300, backoffBaseMs: 5_000, backoffMaxMs: 5_000 });
    const n1up = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'connected'),
    );
    await d.start([{ node: 'n1', url: l1.url, generation: 1, ackedGeneration: 0 }]);
    await n1up;
    expect(d.wakesInFlight).toBe(1); // n1's unanswered ping holds the only slot
    const n3up = next(
      d,
      'state',
      stateIs('n3', (s) => s.state === 'connected'),
    );
    const n3ack = next(d, 'ack', (e) => e.node === 'n3');
    d.setEndpoint('n3', l3.url, 4);
    await n3up;
    expect(l3.wakes).toHaveLength(0); // waiting for the slot
    await n3ack; // n1 went half-open, which freed the slot
    expect(d.state('n1').state).toBe('half_open');
    expect(l3.wakes[0]!.claims.gen).toBe(4);
  });

  it('sends its frames with a zero masking key: the wake-up is on the wire (inside TLS) as signed', async () => {
    // a hand-made agent end: TLS with n1's certificate, the upgrade answered by hand, the first
    // frame read byte for byte (a WebSocket server would unmask it before anyone could look)
    const material = new PkiMaterial({ ...materialPaths(pki.dir, 'agent', 'n1'), trustDomain: TD, watch: false });
    const first = new Promise<MaskedFrame>((resolve, reject) => {
      const server = tls.createServer(tlsServerOptions(material), (socket) => {
        socket.on('error', reject);
        let buf = Buffer.alloc(0);
        let upgraded = false;
        socket.on('data', (d: Buffer) => {
          buf = Buffer.concat([buf, d]);
          if (!upgraded) {
            const end = buf.indexOf('\r\n\r\n');
            if (end < 0) return;
            const key = /sec-websocket-key: *(\S+)/i.exec(buf.subarray(0, end).toString('latin1'))![1]!;
            const accept = createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
            socket.write(
              `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
            );
            upgraded = true;
            buf = buf.subarray(end + 4);
          }
          // the whole first frame (its header and payload may come in separate TLS records)
          const frame = maskedFrameOf(buf);
          if (frame) resolve(frame);
        });
      });
      open.push({ close: () => new Promise<void>((r) => server.close(() => r())) });
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as net.AddressInfo;
        void dialer().start([
          { node: 'n1', url: `wss://127.0.0.1:${port}/v1/wake`, generation: 5, ackedGeneration: 4 },
        ]);
      });
    });
    const frame = await first;
    expect(frame.masked).toBe(true); // MASK set, as RFC 6455 requires of a client
    expect([...frame.key]).toEqual([0, 0, 0, 0]);
    // the payload is the compact JWS itself, readable without unmasking
    const [, claims] = frame.payload.toString('latin1').split('.');
    expect(JSON.parse(Buffer.from(claims!, 'base64url').toString('utf8'))).toMatchObject({ gen: 5, reason: 'ping' });
  });

  it('signs wake-ups with a rotated signing key from the moment it is handed over', async () => {
    const { rotateSigningKey } = await import('../../certs/pki.js');
    const oldKid = pki.signingJwk.kid;
    const { kid: newKid } = await rotateSigningKey({ dir: pki.dir });
    const newJwk = JSON.parse(fs.readFileSync(pkiPaths(pki.dir).signingJwk, 'utf8')) as Ed25519PrivateJwk;
    expect(newJwk.kid).toBe(newKid);
    const l = await listener('n1'); // trusts both kids, as agents do during a rotation
    const d = dialer();
    await connected(d, l, 2);
    d.setSigningKey(newJwk);
    const ack = next(d, 'ack', (e) => e.gen === 3);
    d.notify('n1', 3, 'deployment');
    await ack;
    expect(l.wakes.map((w) => w.kid)).toEqual([oldKid, newKid]);
  });

  it('an endpoint changed while its dial is in flight: the new dial still times out (dial_timeout)', async () => {
    // two silent TCP listeners: a dial to either stays in its TLS handshake until its timeout
    const held = new Set<net.Socket>();
    const sinks = await Promise.all(
      [0, 1].map(async () => {
        const s = net.createServer((c) => {
          held.add(c.on('error', () => undefined));
        });
        s.listen(0, '127.0.0.1');
        await once(s, 'listening');
        return s;
      }),
    );
    open.push({
      close: async () => {
        for (const c of held) c.destroy();
        await Promise.all(sinks.map((s) => new Promise<void>((r) => s.close(() => r()))));
      },
    });
    const urlOf = (s: net.Server): string => `wss://127.0.0.1:${(s.address() as net.AddressInfo).port}/v1/wake`;
    const d = dialer({ dialTimeoutMs: 300, backoffBaseMs: 10_000, backoffMaxMs: 10_000 });
    const first = once(sinks[0]!, 'connection');
    await d.start([{ node: 'n1', url: urlOf(sinks[0]!), generation: 2, ackedGeneration: 1 }]);
    await first;
    // the first dial is retired while in flight; its socket closes after the second dial began
    const failed = next(
      d,
      'state',
      stateIs('n1', (s) => s.state === 'disconnected'),
    );
    d.setEndpoint('n1', urlOf(sinks[1]!), 2);
    const [, s] = await failed;
    expect(s).toMatchObject({ connected: false, last_error: 'dial_timeout' });
  });
});
