/**
 * The wake-up listener over real TLS on 127.0.0.1: refusals before the upgrade (403 + code),
 * every nack code over a live connection, frame limits, bad-frame close, coalescing, the
 * connection caps, replacement, handshake and idle timeouts, revocation.
 */
import { once } from 'node:events';
import { createPrivateKey, sign as edSign } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import WebSocket from 'ws';
import { revoke } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import type { PkiMaterial } from '../../certs/tls.js';
import { decodeAnswer, type AnswerFrame } from '../../protocol/frames.js';
import { acceptsController, parseControllerIds } from '../../protocol/identity.js';
import { WAKE_TYP } from '../../protocol/jws.js';
import { MAX_PENDING_CONNECTIONS, MAX_WAKE_FRAME_BYTES } from '../../protocol/limits.js';
import { newJti, signWake, WakeVerifier } from '../../protocol/wake.js';
import { FetchCoalescer } from '../../agent/coalescer.js';
import { keySetOf } from '../../agent/fetcher.js';
import { WakeListener, type WakeListenerOptions } from '../../agent/listener.js';
import { makeAgentTestPki, memoryLog, type AgentTestPki, type Cred } from '../helpers/agent-pki.js';

let pki: AgentTestPki;
let agentMaterial: PkiMaterial;
const open: Array<{ close(): unknown }> = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  agentMaterial = pki.material('agent', 'n1');
});
afterAll(() => pki?.cleanup());
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

const nowS = (): number => Math.floor(Date.now() / 1000);

interface Setup {
  listener: WakeListener;
  port: number;
  fetches: () => number;
  release: (gen: number) => void;
  coalescer: FetchCoalescer;
  lines: Array<Record<string, unknown>>;
}

/** A listener with a fake fetch that waits until `release(gen)` is called. */
async function setup(
  opts: Partial<WakeListenerOptions> & { initialFetchedGen?: number; material?: PkiMaterial } = {},
): Promise<Setup> {
  const material = opts.material ?? agentMaterial;
  let fetches = 0;
  const waiting: Array<(gen: number) => void> = [];
  const coalescer = new FetchCoalescer({
    initialFetchedGen: opts.initialFetchedGen,
    fetch: () => {
      fetches++;
      return new Promise((resolve) => waiting.push((gen) => resolve({ gen })));
    },
  });
  const verifier = new WakeVerifier({
    audience: pki.spiffe('agent', 'n1'),
    keys: keySetOf(material),
    startedAtS: nowS() - 5,
  });
  const { log, lines } = memoryLog();
  const listener = new WakeListener({
    material,
    verifier,
    onWake: (c) => coalescer.wake(c.gen),
    lastFetchedGen: () => coalescer.lastFetchedGen,
    log,
    ...opts,
  });
  const port = await listener.listen('127.0.0.1', 0);
  open.push(listener);
  return {
    listener,
    port,
    coalescer,
    lines,
    fetches: () => fetches,
    release: (gen) => waiting.shift()?.(gen),
  };
}

function wsOptions(c: Partial<Cred> | undefined): WebSocket.ClientOptions {
  return {
    perMessageDeflate: false,
    ca: pki.cred('agent', 'n1').ca,
    ...(c?.cert ? { cert: c.cert, key: c.key } : {}),
    minVersion: 'TLSv1.3',
    checkServerIdentity: noCheck,
  } as unknown as WebSocket.ClientOptions;
}

/** The agent's server name is not what these tests are about. */
const noCheck = (): undefined => undefined;

/** Ends a test socket whatever state it is in. */
function track(ws: WebSocket): WebSocket {
  ws.on('error', () => undefined);
  open.push({ close: () => ws.terminate() });
  return ws;
}

/** Opens a WebSocket; resolves with it once open. */
async function connect(
  port: number,
  c: Partial<Cred> | undefined = pki.cred('controller', 'controller'),
  p = '/v1/wake',
): Promise<WebSocket> {
  const ws = track(new WebSocket(`wss://127.0.0.1:${port}${p}`, wsOptions(c)));
  await once(ws, 'open');
  return ws;
}

/** Tries to open a WebSocket; resolves with the HTTP status and error code it was refused with. */
async function refusal(
  port: number,
  c: Partial<Cred> | undefined,
  p = '/v1/wake',
): Promise<{ status: number; code: string }> {
  const ws = track(new WebSocket(`wss://127.0.0.1:${port}${p}`, wsOptions(c)));
  return new Promise((resolve, reject) => {
    ws.on('open', () => reject(new Error('the upgrade was accepted')));
    ws.on('unexpected-response', (_req, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => {
        const body = JSON.parse(Buffer.concat(chunks).toString()) as { error: { code: string } };
        resolve({ status: res.statusCode ?? 0, code: body.error.code });
      });
    });
  });
}

function ask(ws: WebSocket, frame: string | Buffer, binary = false): Promise<AnswerFrame> {
  const answer = once(ws, 'message').then(([d]) => decodeAnswer((d as Buffer).toString()));
  ws.send(frame, { binary });
  return answer;
}

function wake(gen = 1, over: Record<string, unknown> = {}): string {
  if (Object.keys(over).length === 0) {
    return signWake(pki.signer, {
      iss: pki.spiffe('controller', 'controller'),
      aud: pki.spiffe('agent', 'n1'),
      gen,
      reason: 'deployment',
      nowS: nowS(),
    });
  }
  const claims = {
    iss: pki.spiffe('controller', 'controller'),
    aud: pki.spiffe('agent', 'n1'),
    iat: nowS(),
    exp: nowS() + 60,
    jti: newJti(),
    gen,
    reason: 'deployment',
    ...over,
  };
  return pki.signer.sign(WAKE_TYP, claims);
}

const b64 = (x: unknown): string => Buffer.from(JSON.stringify(x)).toString('base64url');
/** A compact JWS with any header, signed with the PKI's real signing key. */
function craft(header: Record<string, unknown>, payload: Record<string, unknown> = {}): string {
  const jwk = JSON.parse(fs.readFileSync(pkiPaths(pki.dir).signingJwk, 'utf8')) as {
    x: string;
    d: string;
    kid: string;
  };
  const claims = {
    iss: pki.spiffe('controller', 'controller'),
    aud: pki.spiffe('agent', 'n1'),
    iat: nowS(),
    exp: nowS() + 60,
    jti: newJti(),
    gen: 1,
    reason: 'ping',
    ...payload,
  };
  const input = `${b64(header)}.${b64(claims)}`;
  const key = createPrivateKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x, d: jwk.d }, format: 'jwk' });
  return `${input}.${edSign(null, Buffer.from(input), key).toString('base64url')}`;
}

describe('refusals before the upgrade', () => {
  it('answers 403 with a code to anyone but a valid controller, and logs each refusal', async () => {
    const s = await setup();
    expect(await refusal(s.port, undefined)).toEqual({ status: 403, code: 'no_client_certificate' });
    expect(await refusal(s.port, pki.cred('agent', 'n2'))).toEqual({ status: 403, code: 'wrong_role' });
    expect(await refusal(s.port, pki.cred('operator', 'admin'))).toEqual({ status: 403, code: 'wrong_role' });
    expect(await refusal(s.port, pki.foreign)).toEqual({ status: 403, code: 'untrusted_certificate' });
    expect(await refusal(s.port, pki.expired)).toEqual({ status: 403, code: 'certificate_expired' });
    const codes = s.lines.filter((l) => typeof l.code === 'string' && l.peer).map((l) => l.code);
    expect(codes).toEqual(
      expect.arrayContaining(['no_client_certificate', 'wrong_role', 'untrusted_certificate', 'certificate_expired']),
    );
    expect(s.listener.connections).toBe(0);
  });

  it('serves only /v1/wake, and only as an upgrade', async () => {
    const s = await setup();
    expect(await refusal(s.port, pki.cred('controller', 'controller'), '/other')).toEqual({
      status: 404,
      code: 'not_found',
    });
    const res = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const c = pki.cred('controller', 'controller');
      const sock = tls.connect(
        { host: '127.0.0.1', port: s.port, ca: c.ca, cert: c.cert, key: c.key, checkServerIdentity: () => undefined },
        () => {
          sock.write('GET /v1/wake HTTP/1.1\r\nHost: x\r\n\r\n');
        },
      );
      let data = '';
      sock.on('data', (d) => (data += d.toString()));
      sock.on('end', () =>
        resolve({ status: Number(data.split(' ')[1]), body: data.slice(data.indexOf('\r\n\r\n') + 4) }),
      );
      sock.on('error', reject);
    });
    expect(res.status).toBe(426);
    expect(JSON.parse(res.body)).toMatchObject({ error: { code: 'upgrade_required' } });
  });

  it('refuses TLS below 1.3', async () => {
    const s = await setup();
    const c = pki.cred('controller', 'controller');
    const err = await new Promise<Error>((resolve) => {
      const sock = tls.connect({
        host: '127.0.0.1',
        port: s.port,
        ca: c.ca,
        cert: c.cert,
        key: c.key,
        maxVersion: 'TLSv1.2',
        checkServerIdentity: () => undefined,
      });
      sock.on('error', resolve);
      sock.on('secureConnect', () => resolve(new Error('connected')));
    });
    expect(err.message).not.toBe('connected');
  });
});

describe('--controller-id at the listener', () => {
  it('a list accepts exactly its controllers: another controller of the trust domain is 403 wrong_peer before the upgrade', async () => {
    const ids = parseControllerIds('controller,c2');
    const s = await setup({ acceptController: (name) => acceptsController(ids, name) });
    expect(await refusal(s.port, pki.cred('controller', 'c3'))).toEqual({ status: 403, code: 'wrong_peer' });
    (await connect(s.port, pki.cred('controller', 'c2'))).close();
    const ws = await connect(s.port, pki.cred('controller', 'controller'));
    expect(await ask(ws, wake(1))).toMatchObject({ type: 'ack' });
    expect(s.lines.some((l) => l.code === 'wrong_peer')).toBe(true);
  });

  it('* accepts every controller of the trust domain, and still no other role', async () => {
    const s = await setup({ acceptController: (name) => acceptsController('*', name) });
    (await connect(s.port, pki.cred('controller', 'c3'))).close();
    (await connect(s.port, pki.cred('controller', 'c2'))).close();
    expect(await refusal(s.port, pki.cred('agent', 'n2'))).toEqual({ status: 403, code: 'wrong_role' });
  });
});

describe('frames over a live connection', () => {
  it('acks a valid wake-up and nacks every kind of bad frame with its code', async () => {
    const s = await setup();
    const ws = await connect(s.port);
    const ok = await ask(ws, wake(3));
    expect(ok).toMatchObject({ type: 'ack', fetch: 'started', gen: 0 });
    const kid = pki.signer.kid;
    const good = { alg: 'EdDSA', kid, typ: WAKE_TYP };
    const cases: Array<[string | Buffer, string, boolean?]> = [
      ['not a jws', 'malformed'],
      [craft({ ...good, alg: 'HS256' }), 'bad_algorithm'],
      [craft({ ...good, jwk: { kty: 'OKP' } }), 'bad_header'],
      [craft({ alg: 'EdDSA', typ: WAKE_TYP }), 'missing_kid'],
      [craft({ ...good, kid: 'someone-else' }), 'unknown_kid'],
      [craft({ ...good, typ: 'herald-metadata+jwt' }), 'wrong_type'],
      [`${wake(1).slice(0, -4)}AAAA`, 'bad_signature'],
      [wake(1, { iat: nowS() - 200, exp: nowS() - 100 }), 'expired'],
      [wake(1, { iat: nowS() + 100, exp: nowS() + 160 }), 'not_yet_valid'],
      [wake(1, { exp: nowS() + 301 }), 'lifetime_too_long'],
      [wake(1, { iat: nowS() - 60, exp: nowS() + 60 }), 'issued_before_start'],
      [wake(1, { aud: pki.spiffe('agent', 'n2') }), 'wrong_audience'],
      [wake(1, { iss: pki.spiffe('controller', 'c2') }), 'wrong_issuer'],
      [wake(1, { gen: -1 }), 'bad_gen'],
    ];
    let n = 0;
    for (const [frame, code] of cases) {
      const a = await ask(ws, frame);
      expect(a, code).toMatchObject({ type: 'nack', error: code });
      if (++n === 9) break; // nine bad frames; the tenth would close the connection
    }
    const ws2 = await connect(s.port); // replaces ws (same identity); a fresh bad-frame count
    for (const [frame, code] of cases.slice(9))
      expect(await ask(ws2, frame), code).toMatchObject({ type: 'nack', error: code });
    const replay = wake(5);
    expect(await ask(ws2, replay)).toMatchObject({ type: 'ack' });
    expect(await ask(ws2, replay)).toMatchObject({ type: 'nack', error: 'replayed' });
    expect(await ask(ws2, Buffer.from('x'), true)).toMatchObject({ type: 'nack', error: 'binary_frame', jti: null });
    expect(await ask(ws2, 'x'.repeat(MAX_WAKE_FRAME_BYTES + 1))).toMatchObject({ type: 'nack', error: 'too_large' });
  });

  it('answers replay_cache_full when its cache is full of live entries', async () => {
    const { ReplayCache } = await import('../../protocol/replay-cache.js');
    const verifier = new WakeVerifier({
      audience: pki.spiffe('agent', 'n1'),
      keys: keySetOf(agentMaterial),
      startedAtS: nowS() - 5,
      replayCache: new ReplayCache(1),
    });
    const s = await setup({ verifier });
    const ws = await connect(s.port);
    expect(await ask(ws, wake(1))).toMatchObject({ type: 'ack' });
    expect(await ask(ws, wake(2))).toMatchObject({ type: 'nack', error: 'replay_cache_full' });
  });

  it('closes the connection with 1008 at the tenth bad frame', async () => {
    const s = await setup();
    const ws = await connect(s.port);
    const closed = once(ws, 'close');
    for (let i = 0; i < 10; i++) ws.send('garbage');
    const [code, reason] = (await closed) as [number, Buffer];
    expect(code).toBe(1008);
    expect(reason.toString()).toBe('too_many_bad_frames');
  });

  it('closes a frame over the WebSocket layer limit (64 KiB) with 1009', async () => {
    const s = await setup();
    const ws = await connect(s.port);
    const closed = once(ws, 'close');
    ws.send('x'.repeat(65 * 1024));
    const [code] = (await closed) as [number];
    expect(code).toBe(1009);
  });
});

describe('coalescing', () => {
  it('1,000 valid wake-ups cause at most 2 fetches', async () => {
    const s = await setup();
    const ws = await connect(s.port);
    const answers: AnswerFrame[] = [];
    const all = new Promise<void>((resolve) => {
      ws.on('message', (d: Buffer) => {
        answers.push(decodeAnswer(d.toString()));
        if (answers.length === 1000) resolve();
      });
    });
    for (let i = 1; i <= 1000; i++) ws.send(wake(i));
    await all;
    expect(answers.every((a) => a.type === 'ack')).toBe(true);
    expect(answers.filter((a) => a.type === 'ack' && a.fetch === 'started')).toHaveLength(1);
    expect(s.fetches()).toBe(1);
    s.release(999); // the first fetch saw 999: the queued one (for 1000) must still run
    await vi.waitFor(() => expect(s.fetches()).toBe(2));
    s.release(1000);
    await s.coalescer.idle();
    expect(s.fetches()).toBe(2);
    expect(s.coalescer.lastFetchedGen).toBe(1000);
  });

  it('a wake-up claiming gen 2^53-1 does not mute later ones: gen is compared only with the generation fetched', async () => {
    const s = await setup({ initialFetchedGen: 10 });
    const ws = await connect(s.port);
    expect(await ask(ws, wake(Number.MAX_SAFE_INTEGER))).toMatchObject({ type: 'ack', fetch: 'started', gen: 10 });
    s.release(11); // the controller's real generation: the claim was false
    await s.coalescer.idle();
    expect(s.coalescer.lastFetchedGen).toBe(11);
    // the next real wake-ups are fetched, and the ack names what was fetched, never the claim
    expect(await ask(ws, wake(12))).toMatchObject({ type: 'ack', fetch: 'started', gen: 11 });
    s.release(12);
    await s.coalescer.idle();
    expect(await ask(ws, wake(13))).toMatchObject({ type: 'ack', fetch: 'started', gen: 12 });
    s.release(13);
    await s.coalescer.idle();
    expect(s.fetches()).toBe(3);
    expect(await ask(ws, wake(13))).toMatchObject({ type: 'ack', fetch: 'current', gen: 13 });
  });

  it('answers current for a generation already fetched and fetches nothing', async () => {
    const s = await setup({ initialFetchedGen: 10 });
    const ws = await connect(s.port);
    expect(await ask(ws, wake(10))).toMatchObject({ type: 'ack', fetch: 'current', gen: 10 });
    expect(await ask(ws, wake(4))).toMatchObject({ type: 'ack', fetch: 'current', gen: 10 });
    expect(s.fetches()).toBe(0);
  });
});

describe('connection limits', () => {
  it('destroys a silent socket when the handshake timeout passes', async () => {
    const s = await setup({ handshakeTimeoutMs: 300 });
    const t0 = Date.now();
    const sock = net.connect(s.port, '127.0.0.1');
    sock.on('error', () => undefined);
    await once(sock, 'close');
    const ms = Date.now() - t0;
    expect(ms).toBeGreaterThanOrEqual(280);
    expect(ms).toBeLessThan(3000);
    expect(s.lines.some((l) => l.code === 'handshake_timeout')).toBe(true);
  });

  it('also times out a peer that finished TLS but never upgrades', async () => {
    const s = await setup({ handshakeTimeoutMs: 300 });
    const c = pki.cred('controller', 'controller');
    const sock = tls.connect({
      host: '127.0.0.1',
      port: s.port,
      ca: c.ca,
      cert: c.cert,
      key: c.key,
      checkServerIdentity: () => undefined,
    });
    sock.on('error', () => undefined);
    await once(sock, 'secureConnect');
    const t0 = Date.now();
    await once(sock, 'close');
    expect(Date.now() - t0).toBeLessThan(3000);
  });

  it('holds at most maxPending sockets pending; one more is destroyed at once', async () => {
    const s = await setup({ maxPending: 3, handshakeTimeoutMs: 20_000 });
    const socks = [0, 1, 2].map(() => net.connect(s.port, '127.0.0.1'));
    for (const x of socks) open.push({ close: () => x.destroy() });
    await vi.waitFor(() => expect(s.listener.pendingConnections).toBe(3));
    const t0 = Date.now();
    const extra = net.connect(s.port, '127.0.0.1');
    extra.on('error', () => undefined);
    await once(extra, 'close');
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(s.lines.some((l) => l.code === 'too_many_connections')).toBe(true);
    // once they go, a controller gets in again
    for (const x of socks) x.destroy();
    await vi.waitFor(() => expect(s.listener.pendingConnections).toBe(0));
    await connect(s.port);
    expect(s.listener.connections).toBe(1);
  });

  it('with the 16 pending slots held, 500 more connects are counted and logged as a summary, not a line each', async () => {
    const s = await setup({ handshakeTimeoutMs: 30_000 });
    const held: net.Socket[] = [];
    for (let i = 0; i < MAX_PENDING_CONNECTIONS; i++) {
      const sock = net.connect(s.port, '127.0.0.1');
      sock.on('error', () => undefined);
      held.push(sock);
      open.push({ close: () => sock.destroy() });
    }
    await vi.waitFor(() => expect(s.listener.pendingConnections).toBe(MAX_PENDING_CONNECTIONS));
    const before = s.listener.stats.refusedBeforeAuth;
    const EXTRA = 500;
    await Promise.all(
      Array.from(
        { length: EXTRA },
        () =>
          new Promise<void>((resolve) => {
            const sock = net.connect(s.port, '127.0.0.1');
            sock.on('error', () => undefined);
            sock.on('close', () => resolve());
          }),
      ),
    );
    await vi.waitFor(() => expect(s.listener.stats.refusedBeforeAuthByCode.too_many_connections).toBe(EXTRA));
    expect(s.listener.stats.refusedBeforeAuth - before).toBe(EXTRA);
    const summaryLines = (): Array<Record<string, unknown>> => s.lines.filter((l) => l.code === 'too_many_connections');
    // one line at the first refusal; the rest wait for the interval (or close) to be logged with a count
    expect(summaryLines().length).toBeLessThanOrEqual(2);
    for (const h of held) h.destroy();
    await s.listener.close();
    const lines = summaryLines();
    expect(lines.length).toBeLessThanOrEqual(3);
    expect(lines.reduce((n, l) => n + Number(l.count), 0)).toBe(EXTRA);
    expect(lines[0]).toMatchObject({
      code: 'too_many_connections',
      count: 1,
      peer: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
    });
  });

  it('holds at most maxAuthenticated controllers, one connection per identity', async () => {
    const s = await setup({ maxAuthenticated: 2 });
    const first = await connect(s.port);
    await connect(s.port, pki.cred('controller', 'c2'));
    expect(await refusal(s.port, pki.cred('controller', 'c3'))).toEqual({ status: 503, code: 'too_many_connections' });
    const replaced = once(first, 'close');
    const newer = await connect(s.port);
    const [code, reason] = (await replaced) as [number, Buffer];
    expect(code).toBe(4000);
    expect(reason.toString()).toBe('connection_replaced');
    expect(s.listener.connections).toBe(2);
    expect(await ask(newer, wake(1))).toMatchObject({ type: 'ack' });
  });

  it('closes a connection that sent neither ping nor frame for the idle time', async () => {
    const s = await setup({ idleCloseMs: 300 });
    const ws = await connect(s.port);
    expect(s.listener.isPushHealthy()).toBe(true);
    const t0 = Date.now();
    const [code, reason] = (await once(ws, 'close')) as [number, Buffer];
    expect(code).toBe(1000);
    expect(reason.toString()).toBe('idle_timeout');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    expect(s.listener.connections).toBe(0);
    expect(s.listener.isPushHealthy()).toBe(false);
  });

  it('keeps a connection that pings', async () => {
    const s = await setup({ idleCloseMs: 400 });
    const ws = await connect(s.port);
    let closed = false;
    ws.on('close', () => (closed = true));
    for (let i = 0; i < 6; i++) {
      ws.ping();
      await new Promise((r) => setTimeout(r, 150));
    }
    expect(closed).toBe(false);
  });
});

describe('revocation', () => {
  it('closes a live connection of a controller revoked meanwhile with 1008, and refuses it after', async () => {
    const dirPki = await makeAgentTestPki();
    try {
      const material = dirPki.material('agent', 'n1');
      const s = await setup({
        material,
        verifier: new WakeVerifier({
          audience: dirPki.spiffe('agent', 'n1'),
          keys: keySetOf(material),
          startedAtS: nowS() - 5,
        }),
      });
      const c = dirPki.cred('controller', 'c2');
      const opts = {
        perMessageDeflate: false,
        ca: c.ca,
        cert: c.cert,
        key: c.key,
        checkServerIdentity: noCheck,
      } as unknown as WebSocket.ClientOptions;
      const ws = track(new WebSocket(`wss://127.0.0.1:${s.port}/v1/wake`, opts));
      await once(ws, 'open');
      const closed = once(ws, 'close');
      await revoke({ dir: dirPki.dir, target: 'controller/c2' });
      material.reload();
      const [code, reason] = (await closed) as [number, Buffer];
      expect(code).toBe(1008);
      expect(reason.toString()).toBe('revoked');
      const again = track(new WebSocket(`wss://127.0.0.1:${s.port}/v1/wake`, opts));
      const [, res] = (await once(again, 'unexpected-response')) as [unknown, { statusCode: number }];
      expect(res.statusCode).toBe(403);
    } finally {
      dirPki.cleanup();
    }
  });
});
