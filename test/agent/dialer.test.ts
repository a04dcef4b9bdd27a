/**
 * The agent dialling out (agent/dialer.ts, docs/dial-out.md) over real TLS on 127.0.0.1, against
 * a stand-in for the controller's connect listener (test/helpers/connect-stand-in.ts): wake-ups on
 * the dialled connection verified as on the listener's (same refusals, same nack codes) and turned
 * into fetches over that connection; the server checked before a byte is sent (a non-controller,
 * a controller outside --controller-id: refused, the next URL dialled); liveness by the agent's
 * own pings (a blackholed path is dropped as half_open and the next URL dialled); 1012 moves to
 * the next URL at once; the backoff grows to its cap and resets after a stable connection;
 * HTTPS_PROXY / NO_PROXY through a small CONNECT proxy; the start URL FNV-1a(node) mod n.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { issueCert, revoke } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import type { PkiMaterial } from '../../certs/tls.js';
import { FetchCoalescer } from '../../agent/coalescer.js';
import { parseDialProxy, proxyEnvOf, proxyFor } from '../../agent/dial-proxy.js';
import { Dialer, parseDialOutUrls, type DialEnd, type DialerOptions } from '../../agent/dialer.js';
import { Fetcher, keySetOf } from '../../agent/fetcher.js';
import { encodeMetadataFrame, encodeSignalled } from '../../protocol/frames.js';
import { fnv1a32 } from '../../protocol/fnv.js';
import { parseControllerIds } from '../../protocol/identity.js';
import { Signer, WAKE_TYP, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import {
  AGENT_DIAL_PING_INTERVAL_MS,
  AGENT_DIAL_PONG_TIMEOUT_MS,
  AGENT_DIAL_TIMEOUT_MS,
} from '../../protocol/limits.js';
import { sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { signSignalled } from '../../protocol/signal-answer.js';
import { newJti, WakeVerifier } from '../../protocol/wake.js';
import { makeAgentTestPki, memoryLog, type AgentTestPki } from '../helpers/agent-pki.js';
import { thrownCode } from '../helpers/codes.js';
import { ConnectStandIn, type ConnectStandInOptions } from '../helpers/connect-stand-in.js';
import { deadPort, TcpProxy } from '../helpers/tcp-proxy.js';
import { FakeClock } from './fake-clock.js';

let pki: AgentTestPki;
let material: PkiMaterial;
const open: Array<{ close(): unknown }> = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  material = pki.material('agent', 'n1');
});
afterAll(() => pki?.cleanup());
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

const nowS = (): number => Math.floor(Date.now() / 1000);
const CONTROLLER = (): string => pki.spiffe('controller', 'controller');
const N1 = (): string => pki.spiffe('agent', 'n1');

/** A stand-in controller `controller` (its TLS certificate and signing key) unless told otherwise. */
async function standIn(o: Partial<ConnectStandInOptions> = {}): Promise<ConnectStandIn> {
  const s = await ConnectStandIn.start({
    material: pki.material('controller', 'controller'),
    signer: pki.signer,
    issuer: CONTROLLER(),
    audience: N1(),
    ...o,
  });
  open.push(s);
  return s;
}

/** `urls` put in the order that makes `first` the one node n1 dials first (FNV-1a(n1) mod n). */
function startingAt(first: string, ...rest: string[]): string {
  const n = rest.length + 1;
  const at = fnv1a32('n1') % n;
  const out = [...rest];
  out.splice(at, 0, first);
  return out.join(',');
}

interface Setup {
  dialer: Dialer;
  coalescer: FetchCoalescer;
  lines: Array<Record<string, unknown>>;
  downs: DialEnd[];
  nextDown(): Promise<DialEnd>;
  connected(): Promise<{ url: string }>;
}

/** A dialer for node n1 with the agent's own coalescer behind it; fetches answer `fetchGen` at once. */
function dial(urls: string, o: Partial<DialerOptions> & { fetch?: () => Promise<{ gen: number }> } = {}): Setup {
  const coalescer = new FetchCoalescer({ fetch: o.fetch ?? (() => Promise.resolve({ gen: 0 })) });
  const { log, lines } = memoryLog();
  const dialer = new Dialer({
    urls: parseDialOutUrls(urls),
    node: 'n1',
    material,
    controllers: parseControllerIds('controller'),
    verifier: new WakeVerifier({ audience: N1(), keys: keySetOf(material), startedAtS: Date.now() / 1000 - 5 }),
    onWake: (c) => coalescer.wake(c.gen),
    lastFetchedGen: () => coalescer.lastFetchedGen,
    log,
    ...o,
  });
  open.push(dialer);
  const downs: DialEnd[] = [];
  let taken = 0;
  dialer.on('down', (d: DialEnd) => downs.push(d));
  dialer.start();
  return {
    dialer,
    coalescer,
    lines,
    downs,
    nextDown: async () => {
      const i = taken++;
      while (downs.length <= i) await once(dialer, 'down');
      return downs[i]!;
    },
    connected: async () => ((await once(dialer, 'connected')) as [{ url: string }])[0],
  };
}

/** A signed 200 answer for node n1 at `gen`, as controller `controller` builds it. */
function signed200(nonce: string, gen: number): Buffer {
  const body = Buffer.from(JSON.stringify({ node: 'n1', generation: gen, deployments: [] }));
  const signature = signMetadata(pki.signer, {
    iss: CONTROLLER(),
    aud: N1(),
    gen,
    nonce,
    sha256: sha256b64url(body),
    nowS: Date.now() / 1000,
  });
  return encodeMetadataFrame({ type: 'metadata', nonce, status: 200, etag: `"${gen}"`, signature }, body);
}

/** A token signed by the PKI's key with these claims (any of them wrong on purpose). */
function token(claims: Record<string, unknown>): string {
  const now = Math.floor(Date.now() / 1000);
  return pki.signer.sign(WAKE_TYP, {
    iss: CONTROLLER(),
    aud: N1(),
    iat: now,
    exp: now + 60,
    jti: newJti(),
    gen: 1,
    reason: 'deployment',
    ...claims,
  });
}

describe('the dialled connection carries the push connection', () => {
  it('verifies the ping wake-up sent on connect, acks it, and fetches over the same connection with the answer checked as over HTTPS', async () => {
    const s = await standIn({ pingGen: 7 });
    let fetcher: Fetcher | undefined;
    const d = dial(s.url, { fetch: async () => ({ gen: (await fetcher!.fetchMetadata()).gen }) });
    fetcher = new Fetcher({
      // nothing listens there: the fetch must go over the dialled connection
      controllerUrl: `https://127.0.0.1:${await deadPort()}`,
      node: 'n1',
      material,
      controllerSpiffeId: { controllers: parseControllerIds('controller') },
      lastAppliedGen: () => undefined,
      log: memoryLog().log,
      pushFetch: (nonce, inm, ms) => d.dialer.fetchOverPush(nonce, inm, ms),
    });
    open.push({ close: () => fetcher!.close() });
    const c = await s.connection();
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack', fetch: 'started' });
    const f = await c.nextFetch();
    c.send(signed200(f.nonce, 7));
    await vi.waitFor(() => expect(d.coalescer.lastFetchedGen).toBe(7));
    // the same generation again: nothing to fetch
    c.send(s.wake(7));
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack', gen: 7, fetch: 'current' });
    expect(c.fetches).toHaveLength(1);
    expect(d.dialer.stats).toMatchObject({ acks: 2, nacks: 0, pushFetches: 1, pushFetchesAnswered: 1 });
    expect(d.dialer.isPushHealthy()).toBe(true);
  });

  it('sends a signal only once a wake-up proved the connection, and takes the signed answer', async () => {
    const s = await standIn({ pingGen: null });
    const d = dial(s.url);
    const c = await s.connection();
    const body = Buffer.from(JSON.stringify({ revision: 2, deploy_status_code: 0 }));
    expect(d.dialer.signalOverPush('a'.repeat(22), 'd1', 2, body, 5_000)).toBeNull();
    c.send(s.wake(1, 'ping'));
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack' });
    const pending = d.dialer.signalOverPush('b'.repeat(22), 'd1', 2, body, 5_000)!;
    await vi.waitFor(() => expect(c.signals).toHaveLength(1));
    const f = c.signals[0]!;
    expect(f).toMatchObject({ nonce: 'b'.repeat(22), deployment: 'd1' });
    const signature = signSignalled(pki.signer, {
      iss: CONTROLLER(),
      aud: N1(),
      nonce: f.nonce,
      deployment: f.deployment,
      body: f.body,
      status: 200,
      nowS: Date.now() / 1000,
    });
    c.send(encodeSignalled({ nonce: f.nonce, status: 200, signature }));
    expect((await pending).status).toBe(200);
    expect(d.dialer.stats).toMatchObject({ pushSignals: 1, pushSignalsAnswered: 1 });
  });

  it('takes the features from the upgrade response: a controller offering nothing gets no fetch', async () => {
    const s = await standIn({ features: null });
    const d = dial(s.url);
    await d.connected();
    expect(d.dialer.fetchOverPush('a'.repeat(22), undefined, 1_000)).toBeNull();
  });

  it.each([
    ['a signature that does not verify', 'bad_signature', (s: ConnectStandIn) => `${s.wake(2).slice(0, -4)}AAAA`],
    ['a wake-up for another node', 'wrong_audience', () => token({ aud: pki.spiffe('agent', 'n2') })],
    [
      'a wake-up naming another controller as issuer',
      'wrong_issuer',
      () => token({ iss: pki.spiffe('controller', 'c2') }),
    ],
    ['a generation that is not a non-negative integer', 'bad_gen', () => token({ gen: -1 })],
    ['an expired wake-up', 'expired', () => token({ iat: nowS() - 200, exp: nowS() - 100 })],
  ] as const)('nacks %s with %s, as the listener does', async (_name, code, make) => {
    const s = await standIn({ pingGen: null });
    const d = dial(s.url);
    const c = await s.connection();
    c.send(make(s));
    expect(await c.nextAnswer()).toMatchObject({ type: 'nack', error: code });
    expect(d.coalescer.fetchCount).toBe(0);
    expect(d.lines.some((l) => l.code === code)).toBe(true);
  });

  it('nacks a replayed wake-up, and answers a stale generation current without a fetch', async () => {
    const s = await standIn({ pingGen: 5 });
    const d = dial(s.url, { fetch: () => Promise.resolve({ gen: 5 }) });
    const c = await s.connection();
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack', fetch: 'started' });
    await vi.waitFor(() => expect(d.coalescer.lastFetchedGen).toBe(5));
    const w = s.wake(6);
    c.send(w);
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack', fetch: 'started' });
    c.send(w);
    expect(await c.nextAnswer()).toMatchObject({ type: 'nack', error: 'replayed' });
    c.send(s.wake(3));
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack', fetch: 'current' });
    expect(d.coalescer.fetchCount).toBe(2);
  });
});

describe('whom the agent dials', () => {
  it('starts at FNV-1a(node) mod n', () => {
    const urls = ['wss://a:1/v1/connect', 'wss://b:1/v1/connect', 'wss://c:1/v1/connect'];
    const d = new Dialer({
      urls: parseDialOutUrls(urls.join(',')),
      node: 'n1',
      material,
      controllers: '*',
      verifier: new WakeVerifier({ audience: N1(), keys: keySetOf(material), startedAtS: 0 }),
      onWake: () => 'current',
      lastFetchedGen: () => 0,
      log: memoryLog().log,
    });
    expect(d.url.href).toBe(urls[fnv1a32('n1') % 3]);
    expect(fnv1a32('n1')).toBe(fnv1a32('n1'));
  });

  it.each([
    ['an agent certificate', () => pki.material('agent', 'n2')],
    ['a controller outside --controller-id', () => pki.material('controller', 'c2')],
  ])(
    'refuses a server presenting %s before a byte is sent (wrong_peer) and dials the next URL',
    async (_name, served) => {
      const bad = await standIn({ material: served() });
      const good = await standIn();
      const d = dial(startingAt(bad.url, good.url), { random: () => 0 });
      const down = await d.nextDown();
      expect(down).toMatchObject({ url: bad.url, code: 'wrong_peer', wasOpen: false, next: good.url });
      expect((await d.connected()).url).toBe(good.url);
      // the TLS handshake was cut by the agent: the bad server never saw an upgrade
      expect(bad.connections).toHaveLength(0);
      expect(bad.refusals).toHaveLength(0);
      expect(d.lines.some((l) => l.code === 'wrong_peer' && l.url === bad.url)).toBe(true);
    },
  );

  it('closes the dialled connection of a controller revoked meanwhile (1008 revoked), and refuses it at the next dial', async () => {
    const own = await makeAgentTestPki();
    open.push({ close: () => own.cleanup() });
    const m = own.material('agent', 'n1');
    const c2 = (): Signer =>
      new Signer(JSON.parse(fs.readFileSync(pkiPaths(own.dir).controllerJwk('c2'), 'utf8')) as Ed25519PrivateJwk);
    const s = await standIn({
      material: own.material('controller', 'c2'),
      signer: c2(),
      issuer: own.spiffe('controller', 'c2'),
      audience: own.spiffe('agent', 'n1'),
    });
    const d = dial(s.url, {
      material: m,
      controllers: '*',
      verifier: new WakeVerifier({ audience: N1(), keys: keySetOf(m), startedAtS: nowS() - 5 }),
      random: () => 0,
    });
    const c = await s.connection();
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack' });
    await revoke({ dir: own.dir, target: 'controller/c2' });
    m.reload();
    expect(await c.closed).toEqual([1008, 'revoked']);
    expect(await d.nextDown()).toMatchObject({ code: 'revoked', wasOpen: true });
    expect(await d.nextDown()).toMatchObject({ code: 'revoked', wasOpen: false });
  });

  it('presents a renewed certificate at the next dial (its TLS context is made again when the PKI changes)', async () => {
    const own = await makeAgentTestPki();
    open.push({ close: () => own.cleanup() });
    const m = own.material('agent', 'n1');
    const s = await standIn({ material: own.material('controller', 'controller'), signer: own.signer });
    const d = dial(s.url, {
      material: m,
      verifier: new WakeVerifier({ audience: N1(), keys: keySetOf(m), startedAtS: nowS() - 5 }),
      random: () => 0,
    });
    const first = await s.connection(0);
    const before = first.identity.serial;
    const renewed = await issueCert({
      dir: own.dir,
      role: 'agent',
      name: 'n1',
      keyPem: fs.readFileSync(pkiPaths(own.dir).key('agent', 'n1'), 'utf8'),
    });
    m.reload();
    first.ws.close(1011, 'internal_error');
    await d.nextDown();
    const second = await s.connection(1);
    expect(second.identity.serial).toBe(renewed.serial);
    expect(second.identity.serial).not.toBe(before);
    // and the dial after that keeps presenting it
    second.ws.close(1011, 'internal_error');
    await d.nextDown();
    expect((await s.connection(2)).identity.serial).toBe(renewed.serial);
  });

  it("keeps the controller's refusal code from its 403 before the upgrade, else upgrade_refused", async () => {
    const coded = await standIn({ refuse: { status: 403, code: 'revoked' } });
    expect((await dial(coded.url).nextDown()).code).toBe('revoked');
    const bare = await standIn({ refuse: { status: 503, code: 'not a code' } });
    expect((await dial(bare.url).nextDown()).code).toBe('upgrade_refused');
  });

  it('a refused TCP connection is connection_refused; a dial that does not finish in time is dial_timeout', async () => {
    const refused = `wss://127.0.0.1:${await deadPort()}/v1/connect`;
    expect((await dial(refused).nextDown()).code).toBe('connection_refused');
    // a server that takes the TCP connection and never answers
    const mute = net.createServer(() => undefined);
    mute.listen(0, '127.0.0.1');
    await once(mute, 'listening');
    open.push({ close: () => new Promise((r) => mute.close(r)) });
    const clock = new FakeClock();
    const t = dial(`wss://127.0.0.1:${(mute.address() as net.AddressInfo).port}/v1/connect`, { timers: clock });
    await clock.advance(AGENT_DIAL_TIMEOUT_MS);
    expect((await t.nextDown()).code).toBe('dial_timeout');
  });
});

describe('runDial', () => {
  it('runs every dial through runDial: nothing is dialled before it starts one, and its promise ends when the dial failed or the connection is up', async () => {
    const s = await standIn({ pingGen: 1 });
    const refused = `wss://127.0.0.1:${await deadPort()}/v1/connect`;
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    const ends: string[] = [];
    let d: Setup | undefined;
    d = dial(startingAt(refused, s.url), {
      random: () => 0,
      runDial: async (go) => {
        await held;
        await go();
        // connections up / dials failed, when this dial was over
        ends.push(`${d!.dialer.stats.connected}/${d!.dialer.stats.dialFailures}`);
      },
    });
    expect(d.dialer.stats.dials).toBe(0);
    release();
    await s.connection();
    await vi.waitFor(() => expect(ends).toEqual(['0/1', '1/1']));
    expect(d.dialer.stats.dials).toBe(2);
  });
});

describe('liveness and reconnects', () => {
  it('pings; a pong in time keeps the connection, none within the pong timeout drops it half_open and dials the next URL', async () => {
    const a = await standIn();
    const b = await standIn();
    const relay = await new TcpProxy(a.port).start();
    open.push({ close: () => relay.stop() });
    const viaRelay = `wss://127.0.0.1:${relay.port}/v1/connect`;
    const clock = new FakeClock();
    const d = dial(startingAt(viaRelay, b.url), { timers: clock, random: () => 0.5 });
    await d.connected();
    await clock.advance(AGENT_DIAL_PING_INTERVAL_MS);
    await vi.waitFor(() => expect(d.dialer.stats.pongs).toBe(1));
    await clock.advance(AGENT_DIAL_PONG_TIMEOUT_MS);
    expect(d.downs).toHaveLength(0);
    // the NAT mapping is dropped silently: nothing passes, nothing is closed
    relay.blackhole();
    await clock.advance(AGENT_DIAL_PING_INTERVAL_MS - AGENT_DIAL_PONG_TIMEOUT_MS);
    await clock.advance(AGENT_DIAL_PONG_TIMEOUT_MS);
    const down = await d.nextDown();
    expect(down).toMatchObject({ url: viaRelay, code: 'half_open', wasOpen: true, next: b.url, delayMs: 125 });
    expect(d.dialer.isPushHealthy()).toBe(false);
    const next = d.connected();
    await clock.advance(down.delayMs);
    expect((await next).url).toBe(b.url);
    expect(d.lines.some((l) => l.code === 'half_open')).toBe(true);
  });

  it('a close with 1012 (the controller restarts) dials the next URL after a random delay below 1 s', async () => {
    const a = await standIn();
    const b = await standIn();
    const clock = new FakeClock();
    const d = dial(startingAt(a.url, b.url), { timers: clock, random: () => 0.25 });
    await d.connected();
    (await a.connection()).ws.close(1012, 'controller restarting');
    const down = await d.nextDown();
    expect(down).toMatchObject({ url: a.url, closeCode: 1012, wasOpen: true, next: b.url, delayMs: 250 });
    const next = d.connected();
    await clock.advance(250);
    expect((await next).url).toBe(b.url);
  });

  it('backs off with full jitter, doubling from 250 ms to the 30 s cap, over the URLs in turn; a connection that lived 60 s resets it', async () => {
    const dead = [`wss://127.0.0.1:${await deadPort()}/v1/connect`, `wss://127.0.0.1:${await deadPort()}/v1/connect`];
    const clock = new FakeClock();
    const d = dial(dead.join(','), { timers: clock, random: () => 0.999 });
    const delays: number[] = [];
    const urls: string[] = [];
    for (let i = 0; i < 10; i++) {
      const down = await d.nextDown();
      expect(down.code).toBe('connection_refused');
      delays.push(down.delayMs);
      urls.push(down.url);
      await clock.advance(down.delayMs);
    }
    expect(delays).toEqual([249, 499, 999, 1998, 3996, 7992, 15984, 29970, 29970, 29970]);
    expect(new Set(urls.filter((_, i) => i % 2 === 0)).size).toBe(1);
    expect(urls[0]).not.toBe(urls[1]);
    // one summary line per code and URL within the log interval, not one a failure
    expect(d.lines.filter((l) => l.code === 'connection_refused' && l.level === 40).length).toBeLessThan(10);

    const s = await standIn();
    const clock2 = new FakeClock();
    const e = dial(startingAt(dead[0]!, s.url), { timers: clock2, random: () => 0.999 });
    const first = await e.nextDown();
    const up = e.connected();
    await clock2.advance(first.delayMs);
    await up;
    for (let pongs = 1; pongs <= 2; pongs++) {
      await clock2.advance(AGENT_DIAL_PING_INTERVAL_MS);
      await vi.waitFor(() => expect(e.dialer.stats.pongs).toBe(pongs));
    }
    (await s.connection()).ws.close(1000);
    const after = await e.nextDown();
    expect(after).toMatchObject({ url: s.url, wasOpen: true, code: 'connection_closed' });
    expect(after.delayMs).toBe(249);
  });
});

/** A tiny HTTP CONNECT proxy: it tunnels to what it is asked, or answers `status` and closes. */
async function connectProxy(status = 200): Promise<{ port: number; asked: Array<{ target: string; auth?: string }> }> {
  const asked: Array<{ target: string; auth?: string }> = [];
  const server = net.createServer((client) => {
    let head = '';
    const onData = (d: Buffer): void => {
      head += d.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      client.off('data', onData);
      const target = /^CONNECT (\S+) HTTP\/1\.1/.exec(head)?.[1] ?? '';
      const auth = /\r\nProxy-Authorization: ([^\r]+)/i.exec(head)?.[1];
      asked.push({ target, ...(auth ? { auth } : {}) });
      if (status !== 200) {
        client.end(`HTTP/1.1 ${status} Forbidden\r\nContent-Length: 0\r\n\r\n`);
        return;
      }
      const [host, port] = [
        target.slice(0, target.lastIndexOf(':')),
        Number(target.slice(target.lastIndexOf(':') + 1)),
      ];
      const up = net.connect(port, host, () => {
        client.write('HTTP/1.1 200 Connection established\r\n\r\n');
        client.pipe(up);
        up.pipe(client);
      });
      up.on('error', () => client.destroy());
      client.on('error', () => up.destroy());
      client.on('close', () => up.destroy());
    };
    client.on('data', onData);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const sockets = new Set<net.Socket>();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  open.push({
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((r) => server.close(r));
    },
  });
  return { port: (server.address() as net.AddressInfo).port, asked };
}

describe('through an HTTP CONNECT proxy', () => {
  it('dials through HTTPS_PROXY with its basic auth, the controller still checked end to end', async () => {
    const s = await standIn();
    const p = await connectProxy();
    const proxy = parseDialProxy(proxyEnvOf({ HTTPS_PROXY: `http://agent:s%40cret@127.0.0.1:${p.port}` }));
    const d = dial(s.url, { proxy });
    await d.connected();
    expect(p.asked).toEqual([
      { target: `127.0.0.1:${s.port}`, auth: `Basic ${Buffer.from('agent:s@cret').toString('base64')}` },
    ]);
    const c = await s.connection();
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack' });
  });

  it('through a proxy, a server that is not an accepted controller is still refused wrong_peer', async () => {
    const bad = await standIn({ material: pki.material('controller', 'c2') });
    const p = await connectProxy();
    const d = dial(bad.url, { proxy: parseDialProxy({ httpsProxy: `http://127.0.0.1:${p.port}` }), random: () => 0 });
    expect((await d.nextDown()).code).toBe('wrong_peer');
    expect(p.asked.length).toBeGreaterThanOrEqual(1);
  });

  it('skips the proxy for a NO_PROXY host', async () => {
    const s = await standIn();
    const p = await connectProxy();
    const proxy = parseDialProxy(
      proxyEnvOf({ https_proxy: `http://127.0.0.1:${p.port}`, no_proxy: 'example.org, 127.0.0.1:9999' }),
    );
    const d = dial(s.url, { proxy });
    await d.connected();
    expect(p.asked).toHaveLength(0);
  });

  it('a proxy answering 403 is proxy_refused', async () => {
    const s = await standIn();
    const p = await connectProxy(403);
    const d = dial(s.url, { proxy: parseDialProxy({ httpsProxy: `http://127.0.0.1:${p.port}` }), random: () => 0 });
    const down = await d.nextDown();
    expect(down.code).toBe('proxy_refused');
    expect(s.tcpConnections).toBe(0);
    expect(d.lines.some((l) => l.code === 'proxy_refused' && /403/.test(String(l.msg)))).toBe(true);
  });

  it('reads the proxy variables and NO_PROXY rules as documented', () => {
    expect(proxyEnvOf({ HTTPS_PROXY: 'http://a:1', https_proxy: 'http://b:1' }).httpsProxy).toBe('http://a:1');
    expect(proxyEnvOf({ HTTPS_PROXY: '', https_proxy: 'http://b:1' }).httpsProxy).toBe('http://b:1');
    expect(parseDialProxy({})).toBeUndefined();
    expect(thrownCode(() => parseDialProxy({ httpsProxy: 'https://p:3128' }))).toBe('bad_option');
    expect(thrownCode(() => parseDialProxy({ httpsProxy: 'p:3128' }))).toBe('bad_option');
    const p = parseDialProxy({ httpsProxy: 'http://p:3128', noProxy: 'corp.example, .lan:8443,[::1], *.svc' })!;
    const via = (u: string): string | undefined => proxyFor(new URL(u), p)?.host;
    expect(via('wss://ctl.corp.example:9443/v1/connect')).toBeUndefined();
    expect(via('wss://corp.example:9443/v1/connect')).toBeUndefined();
    expect(via('wss://ctl.lan/v1/connect')).toBeUndefined();
    expect(via('wss://[::1]:9443/v1/connect')).toBeUndefined();
    expect(via('wss://a.svc:1/v1/connect')).toBeUndefined();
    expect(via('wss://notcorp.example:9443/v1/connect')).toBe('p:3128');
    expect(via('wss://10.0.0.1:9443/v1/connect')).toBe('p:3128');
    const all = parseDialProxy({ httpsProxy: 'http://p:3128', noProxy: '*' })!;
    expect(proxyFor(new URL('wss://anything:1/v1/connect'), all)).toBeUndefined();
  });
});

describe('--dial-out URLs', () => {
  it.each([
    'https://ctl:9443/v1/connect',
    'ws://ctl:9443/v1/connect',
    'wss://ctl:9443/',
    'wss://ctl:9443/v1/wake',
    'wss://ctl:9443/v1/connect?x=1',
    'wss://user@ctl:9443/v1/connect',
    'wss://ctl:9443/v1/connect,',
    'not a url',
  ])('refuses %s with bad_option', (u) => {
    expect(thrownCode(() => parseDialOutUrls(u))).toBe('bad_option');
  });

  it('takes one or several wss://host:port/v1/connect', () => {
    expect(parseDialOutUrls('wss://a:9443/v1/connect, wss://[::1]:9443/v1/connect').map((u) => u.host)).toEqual([
      'a:9443',
      '[::1]:9443',
    ]);
  });
});
