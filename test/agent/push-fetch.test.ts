/**
 * Fetches and signals over the push connection at the agent (docs/protocol.md), over real TLS on
 * 127.0.0.1: the listener asks only a connection whose controller offers it, takes a metadata or
 * signalled frame only as the answer to its own request on that connection, and fails the request
 * when the connection closes or stays silent; the fetcher checks a metadata answer exactly as an
 * HTTPS one (signature, nonce, audience, issuer, digest), and fetches or signals over HTTPS when
 * the push connection gives no answer.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { tlsServerOptions, type PkiMaterial } from '../../certs/tls.js';
import {
  decodeAgentFrame,
  encodeMetadataFrame,
  encodeSignalled,
  FEATURE_FETCH,
  FEATURE_SIGNAL,
  FEATURES_HEADER,
  type FetchFrame,
  type SignalFrame,
  type FetchState,
  type MetadataFrameHead,
} from '../../protocol/frames.js';
import {
  MAX_PUSH_METADATA_FRAME_BYTES,
  MAX_PUSH_SIGNAL_FRAME_BYTES,
  MAX_WAKE_FRAME_BYTES,
} from '../../protocol/limits.js';
import { newSigningJwk, publicJwkOf } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { signSignalled, type SignSignalledInput } from '../../protocol/signal-answer.js';
import { newJti, signWake, WakeVerifier } from '../../protocol/wake.js';
import { Fetcher, keySetOf } from '../../agent/fetcher.js';
import { WakeListener } from '../../agent/listener.js';
import { makeAgentTestPki, memoryLog, quietLog, type AgentTestPki } from '../helpers/agent-pki.js';
import { thrownCodeAsync } from '../helpers/codes.js';

let pki: AgentTestPki;
let material: PkiMaterial;
/** A port nothing listens on: an HTTPS fetch there fails with ECONNREFUSED. */
let deadPort: number;
const open: Array<{ close(): unknown }> = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  material = pki.material('agent', 'n1');
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  deadPort = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
});
afterAll(() => pki?.cleanup());

/** Controller c2's own signing key. */
function c2Jwk(): Ed25519PrivateJwk {
  return JSON.parse(fs.readFileSync(pkiPaths(pki.dir).controllerJwk('c2'), 'utf8')) as Ed25519PrivateJwk;
}
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

async function listen(
  onWake: (listener: WakeListener) => FetchState = () => 'current',
  m: PkiMaterial = material,
): Promise<{ listener: WakeListener; port: number; lines: Array<Record<string, unknown>> }> {
  const { log, lines } = memoryLog();
  const listener: WakeListener = new WakeListener({
    material: m,
    verifier: new WakeVerifier({
      audience: pki.spiffe('agent', 'n1'),
      keys: keySetOf(m),
      startedAtS: Math.floor(Date.now() / 1000) - 5,
    }),
    onWake: () => onWake(listener),
    lastFetchedGen: () => 0,
    log,
  });
  const port = await listener.listen('127.0.0.1', 0);
  open.push(listener);
  return { listener, port, lines };
}

interface Ctl {
  ws: WebSocket;
  /** The fetch frames the agent sent, in order. */
  fetches: FetchFrame[];
  nextFetch(): Promise<FetchFrame>;
  /** The signal frames the agent sent, in order. */
  signals: SignalFrame[];
  nextSignal(): Promise<SignalFrame>;
  /** Every other frame the agent sent (answers). */
  others: string[];
}

/**
 * A controller connection (`controller/<name>`), offering fetches and signals unless `offer` is
 * false (nothing) or names the features.
 */
async function controller(port: number, o: { name?: string; offer?: boolean | string } = {}): Promise<Ctl> {
  const features = o.offer === undefined || o.offer === true ? `${FEATURE_FETCH}, ${FEATURE_SIGNAL}` : o.offer;
  const c = pki.cred('controller', o.name ?? 'controller');
  const ws = new WebSocket(`wss://127.0.0.1:${port}/v1/wake`, {
    perMessageDeflate: false,
    ca: c.ca,
    cert: c.cert,
    key: c.key,
    minVersion: 'TLSv1.3',
    checkServerIdentity: () => undefined,
    headers: features === false ? {} : { [FEATURES_HEADER]: features },
  } as unknown as WebSocket.ClientOptions);
  ws.on('error', () => undefined);
  open.push({ close: () => ws.terminate() });
  const fetches = queueOf<FetchFrame>();
  const signals = queueOf<SignalFrame>();
  const others: string[] = [];
  ws.on('message', (d: Buffer) => {
    try {
      const f = decodeAgentFrame(d);
      if (f.type === 'fetch') return fetches.add(f);
      if (f.type === 'signal') return signals.add(f);
    } catch {
      // not an agent frame
    }
    others.push(d.toString('utf8'));
  });
  await once(ws, 'open');
  return {
    ws,
    fetches: fetches.all,
    nextFetch: fetches.next,
    signals: signals.all,
    nextSignal: signals.next,
    others,
  };
}

/** Frames in arrival order; each `next()` takes the next one not yet taken, waiting for it. */
function queueOf<T>(): { all: T[]; add(x: T): void; next(): Promise<T> } {
  const all: T[] = [];
  const waiting: Array<(x: T) => void> = [];
  let taken = 0;
  return {
    all,
    add: (x) => {
      all.push(x);
      waiting.shift()?.(x);
    },
    next: () => {
      const i = taken++;
      return i < all.length ? Promise.resolve(all[i]!) : new Promise((r) => waiting.push(r));
    },
  };
}

/** A metadata frame is a text frame (ws sends a Buffer as binary unless told). */
function sendText(ws: WebSocket, frame: Buffer): void {
  ws.send(frame, { binary: false });
}

const NONCE = 'a'.repeat(22);
const head = (h: Partial<MetadataFrameHead>): MetadataFrameHead => ({
  type: 'metadata',
  nonce: NONCE,
  status: 200,
  ...h,
});

/** A signed 200 answer for node n1 at `gen`, as the controller `controller` builds it. */
function signed200(nonce: string, gen: number, tamper = false): Buffer {
  const body = Buffer.from(JSON.stringify({ node: 'n1', generation: gen, deployments: [] }));
  const signature = signMetadata(pki.signer, {
    iss: pki.spiffe('controller', 'controller'),
    aud: pki.spiffe('agent', 'n1'),
    gen,
    nonce,
    sha256: sha256b64url(body),
    nowS: Date.now() / 1000,
  });
  const sent = tamper ? Buffer.from(body.toString().replace('[]', '[{}]')) : body;
  return encodeMetadataFrame(head({ nonce, etag: `"${gen}"`, signature }), sent);
}

function fetcherOf(listener: WakeListener, timeoutMs = 5_000): Fetcher {
  const f = new Fetcher({
    controllerUrl: `https://127.0.0.1:${deadPort}`,
    node: 'n1',
    material,
    controllerSpiffeId: { controllers: '*' },
    lastAppliedGen: () => undefined,
    log: quietLog(),
    requestTimeoutMs: timeoutMs,
    pushFetch: (nonce, inm, ms) => listener.fetchOverPush(nonce, inm, ms),
    pushSignal: (nonce, deployment, revision, body, ms) =>
      listener.signalOverPush(nonce, deployment, revision, body, ms),
  });
  open.push({ close: () => f.close() });
  return f;
}

describe('the listener: fetches over the push connection', () => {
  it('asks no connection whose controller did not offer fetches', async () => {
    const { listener, port } = await listen();
    await controller(port, { offer: false });
    expect(listener.connections).toBe(1);
    expect(listener.fetchOverPush(NONCE, undefined, 1_000)).toBeNull();
  });

  it('sends the fetch on the offering connection and takes the answer with its nonce, naming that controller as issuer', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    const pending = listener.fetchOverPush(NONCE, '"4"', 5_000)!;
    expect(pending).not.toBeNull();
    const f = await ctl.nextFetch();
    expect(f).toEqual({ type: 'fetch', nonce: NONCE, if_none_match: '"4"' });
    // one fetch in flight per connection: a second one goes elsewhere (HTTPS)
    expect(listener.fetchOverPush('b'.repeat(22), undefined, 5_000)).toBeNull();
    sendText(ctl.ws, encodeMetadataFrame(head({ status: 304, etag: '"4"', signature: 'x.y.z' })));
    const a = await pending;
    expect(a.head).toMatchObject({ status: 304, etag: '"4"', signature: 'x.y.z' });
    expect(a.issuer).toBe(pki.spiffe('controller', 'controller'));
    expect(listener.stats).toMatchObject({ pushFetches: 1, pushFetchesAnswered: 1 });
  });

  it('a metadata frame that answers no fetch is refused unexpected_frame and closes the connection at once, not nacked', async () => {
    const { listener, port, lines } = await listen();
    const ctl = await controller(port);
    const closed = once(ctl.ws, 'close');
    sendText(ctl.ws, encodeMetadataFrame(head({ status: 304 })));
    const [code, reason] = (await closed) as [number, Buffer];
    expect(code).toBe(1008);
    expect(reason.toString()).toBe('unexpected_frame');
    expect(lines.filter((l) => l.code === 'unexpected_frame')).toHaveLength(1);
    expect(ctl.others).toHaveLength(0);
    expect(listener.stats.nacks).toBe(0);
  });

  it('an answer naming another nonce is refused unexpected_frame: the connection closes and its fetch fails push_fetch_failed', async () => {
    const { listener, port, lines } = await listen();
    const ctl = await controller(port);
    const pending = listener.fetchOverPush(NONCE, undefined, 5_000)!;
    await ctl.nextFetch();
    const closed = once(ctl.ws, 'close');
    sendText(ctl.ws, encodeMetadataFrame(head({ nonce: 'z'.repeat(22), status: 304 })));
    expect(await thrownCodeAsync(pending)).toBe('push_fetch_failed');
    expect(((await closed) as [number])[0]).toBe(1008);
    expect(lines.some((l) => l.code === 'unexpected_frame')).toBe(true);
  });

  it('the late answer of a fetch that timed out is dropped, and the connection serves the next fetch', async () => {
    const { listener, port, lines } = await listen();
    const ctl = await controller(port);
    const first = listener.fetchOverPush(NONCE, undefined, 200)!;
    await ctl.nextFetch();
    expect(await thrownCodeAsync(first)).toBe('push_fetch_failed');
    sendText(ctl.ws, encodeMetadataFrame(head({ status: 304 })));
    const next = 'n'.repeat(22);
    const second = listener.fetchOverPush(next, undefined, 5_000)!;
    expect((await ctl.nextFetch()).nonce).toBe(next);
    sendText(ctl.ws, encodeMetadataFrame(head({ nonce: next, status: 304 })));
    expect((await second).head.nonce).toBe(next);
    expect(lines.some((l) => l.code === 'unexpected_frame')).toBe(false);
    expect(listener.connections).toBe(1);
  });

  it('a fetch fails push_fetch_failed when its connection closes, and malformed on a frame that is not a metadata frame', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    const first = listener.fetchOverPush(NONCE, undefined, 5_000)!;
    await ctl.nextFetch();
    ctl.ws.send('{"type":"metadata","nonce":"x"}\n');
    expect(await thrownCodeAsync(first)).toBe('malformed');
    const second = listener.fetchOverPush(NONCE, undefined, 5_000)!;
    await ctl.nextFetch();
    ctl.ws.close();
    expect(await thrownCodeAsync(second)).toBe('push_fetch_failed');
  });

  it('on an offering connection a metadata frame may be larger than 64 KiB, a wake-up still not over 4 KiB, nothing over the frame limit', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    const pending = listener.fetchOverPush(NONCE, undefined, 5_000)!;
    await ctl.nextFetch();
    sendText(ctl.ws, encodeMetadataFrame(head({}), Buffer.alloc(200 * 1024, 0x20)));
    expect((await pending).body.length).toBe(200 * 1024);
    ctl.ws.send('e'.repeat(MAX_WAKE_FRAME_BYTES + 1));
    await new Promise<void>((r) => ctl.ws.once('message', () => r()));
    expect(ctl.others.at(-1)).toContain('"too_large"');
    const closed = once(ctl.ws, 'close');
    ctl.ws.send(Buffer.alloc(MAX_PUSH_METADATA_FRAME_BYTES + 1, 0x7b), { binary: false });
    expect(((await closed) as [number])[0]).toBe(1009);
  });

  it("a wake-up's ack and the fetch it starts reach the controller in one TLS record", async () => {
    // as the agent does: the wake-up handler starts a fetch on the connection the wake-up came on
    const { port } = await listen((l) => {
      void l.fetchOverPush(NONCE, undefined, 5_000)?.catch(() => undefined);
      return 'started';
    });
    const ctl = await controller(port);
    // each TLS record the agent sends is one chunk of plaintext here
    const records: Buffer[] = [];
    (ctl.ws as unknown as { _socket: import('node:tls').TLSSocket })._socket.on('data', (b: Buffer) => records.push(b));
    const jti = newJti();
    const token = signWake(pki.signer, {
      iss: pki.spiffe('controller', 'controller'),
      aud: pki.spiffe('agent', 'n1'),
      gen: 3,
      reason: 'deployment',
      nowS: Date.now() / 1000,
      jti,
    });
    ctl.ws.send(token);
    expect((await ctl.nextFetch()).nonce).toBe(NONCE);
    while (ctl.others.length === 0) await new Promise((r) => setImmediate(r));
    expect(decodeAgentFrame(ctl.others[0]!)).toMatchObject({ type: 'ack', jti, fetch: 'started' });
    expect(records).toHaveLength(1);
  });

  it('asks the connection heard from last', async () => {
    const { listener, port } = await listen();
    const a = await controller(port, { name: 'c2' });
    const b = await controller(port, { name: 'c3' });
    // a pong comes after the agent has read the ping; the clock moves on between the two
    a.ws.ping();
    await once(a.ws, 'pong');
    const t = Date.now();
    while (Date.now() === t) await new Promise((r) => setImmediate(r));
    b.ws.ping();
    await once(b.ws, 'pong');
    void listener.fetchOverPush(NONCE, undefined, 200)?.catch(() => undefined);
    expect((await b.nextFetch()).nonce).toBe(NONCE);
    expect(a.fetches).toHaveLength(0);
  });
});

describe('the fetcher: an answer over the push connection is checked like an HTTPS one', () => {
  it('applies a signed 200 from the push connection without asking HTTPS', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type === 'fetch') sendText(ctl.ws, signed200(f.nonce, 7));
    });
    const fetcher = fetcherOf(listener);
    const r = await fetcher.fetchMetadata();
    expect(r).toMatchObject({ status: 200, gen: 7 });
    expect(fetcher.pushFetches).toBe(1);
  });

  it('refuses a body that does not match its signed digest (digest_mismatch), and does not fall back to HTTPS', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type === 'fetch') sendText(ctl.ws, signed200(f.nonce, 7, true));
    });
    expect(await thrownCodeAsync(fetcherOf(listener).fetchMetadata())).toBe('digest_mismatch');
  });

  it('refuses an answer signed for another request (nonce_mismatch)', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type !== 'fetch') return;
      // the head names this fetch; the signature was made for another nonce (a replayed answer)
      const other = signed200('q'.repeat(22), 7);
      const sep = other.indexOf(0x0a);
      const h = JSON.parse(other.subarray(0, sep).toString()) as MetadataFrameHead;
      sendText(ctl.ws, encodeMetadataFrame({ ...h, nonce: f.nonce }, other.subarray(sep + 1)));
    });
    expect(await thrownCodeAsync(fetcherOf(listener).fetchMetadata())).toBe('nonce_mismatch');
  });

  it("refuses an answer that names another controller than the connection's (wrong_issuer)", async () => {
    const { listener, port } = await listen();
    // controller c2's connection answers with metadata signed as `controller`
    const ctl = await controller(port, { name: 'c2' });
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type === 'fetch') sendText(ctl.ws, signed200(f.nonce, 7));
    });
    expect(await thrownCodeAsync(fetcherOf(listener).fetchMetadata())).toBe('wrong_issuer');
  });

  it('fetches over HTTPS when the push connection gives no answer or cannot answer (5xx)', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    // silent: the push fetch times out, then HTTPS is asked (here a closed port)
    const silent = fetcherOf(listener, 300);
    await expect(silent.fetchMetadata()).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type === 'fetch')
        sendText(ctl.ws, encodeMetadataFrame(head({ nonce: f.nonce, status: 503, error: 'fetch_unavailable' })));
    });
    await expect(fetcherOf(listener).fetchMetadata()).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    expect(listener.stats.pushFetches).toBe(2);
  });

  it('a 429 over the push connection is the rate limit, with its Retry-After', async () => {
    const { listener, port } = await listen();
    const ctl = await controller(port);
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d.toString());
      if (f.type === 'fetch')
        sendText(
          ctl.ws,
          encodeMetadataFrame(head({ nonce: f.nonce, status: 429, error: 'rate_limited', retry_after_s: 3 })),
        );
    });
    await expect(fetcherOf(listener).fetchMetadata()).rejects.toMatchObject({
      code: 'rate_limited',
      retryAfterMs: 3_000,
    });
  });
});

describe('signals over the push connection', () => {
  const BODY = Buffer.from('{"revision":2,"deploy_status_code":0}');
  const RESULT = { revision: 2, deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} };
  type Answer = { status: number; error?: string; retry_after_s?: number };

  /** A signalled frame for `f` as the controller `controller` signs it; `sign` changes what is signed. */
  function signalled(f: SignalFrame, a: Answer, sign: Partial<SignSignalledInput> & { signer?: Signer } = {}): string {
    const { signer = pki.signer, ...over } = sign;
    const signature = signSignalled(signer, {
      iss: pki.spiffe('controller', 'controller'),
      aud: pki.spiffe('agent', 'n1'),
      nonce: f.nonce,
      deployment: f.deployment,
      body: f.body,
      status: a.status,
      error: a.error,
      retryAfterS: a.retry_after_s,
      nowS: Date.now() / 1000,
      ...over,
    });
    return encodeSignalled({ nonce: f.nonce, ...a, signature });
  }

  /** Proves `ctl`'s connection: a wake-up signed by controller `name`'s key (default: the real one), acked. */
  async function prove(ctl: Ctl, name = 'controller', signer: Signer = pki.signer): Promise<Record<string, unknown>> {
    const before = ctl.others.length;
    ctl.ws.send(
      signWake(signer, {
        iss: pki.spiffe('controller', name),
        aud: pki.spiffe('agent', 'n1'),
        gen: 1,
        reason: 'ping',
        nowS: Date.now() / 1000,
        jti: newJti(),
      }),
    );
    while (ctl.others.length === before) await new Promise((r) => setImmediate(r));
    return JSON.parse(ctl.others[before]!) as Record<string, unknown>;
  }

  /** A controller connection that has delivered a verified wake-up. */
  async function provenController(port: number, o: { offer?: boolean | string } = {}): Promise<Ctl> {
    const ctl = await controller(port, o);
    expect(await prove(ctl)).toMatchObject({ type: 'ack' });
    return ctl;
  }

  it('asks no connection whose controller did not offer signals, and none for a frame over the limit', async () => {
    const { listener, port } = await listen();
    await provenController(port, { offer: FEATURE_FETCH });
    expect(listener.connections).toBe(1);
    expect(listener.signalOverPush(NONCE, 'd1', 2, BODY, 1_000)).toBeNull();
    const fetch = listener.fetchOverPush(NONCE, undefined, 1_000);
    expect(fetch).not.toBeNull();
    void fetch?.catch(() => undefined); // unanswered: it fails when the connection closes
    const both = await controller(port, { name: 'c2' });
    expect(listener.signalOverPush(NONCE, 'd1', 2, Buffer.alloc(MAX_PUSH_SIGNAL_FRAME_BYTES), 1_000)).toBeNull();
    expect(both.signals).toHaveLength(0);
  });

  it('goes only on a connection that delivered a verified wake-up: not on one that did not, or whose wake-up was refused, even heard from last', async () => {
    const { listener, port } = await listen();
    // a controller certificate without the signing key: it connects, offers signals, pings
    const holder = await controller(port);
    expect(listener.signalOverPush(NONCE, 'd1', 2, BODY, 1_000)).toBeNull();
    // a wake-up signed with another key under the trusted kid is refused, and proves nothing
    const forged = new Signer({ ...newSigningJwk(), kid: pki.signer.kid });
    expect(await prove(holder, 'controller', forged)).toMatchObject({ type: 'nack', error: 'bad_signature' });
    expect(listener.signalOverPush(NONCE, 'd1', 2, BODY, 1_000)).toBeNull();
    // the real controller (another identity here) proves itself; the holder is then heard from last
    const real = await controller(port, { name: 'c2' });
    expect(await prove(real, 'c2', new Signer(c2Jwk()))).toMatchObject({ type: 'ack' });
    holder.ws.ping();
    await once(holder.ws, 'pong');
    const t = Date.now();
    while (Date.now() === t) await new Promise((r) => setImmediate(r));
    holder.ws.ping();
    await once(holder.ws, 'pong');
    void listener.signalOverPush(NONCE, 'd1', 2, BODY, 1_000)?.catch(() => undefined);
    expect((await real.nextSignal()).nonce).toBe(NONCE);
    expect(holder.signals).toHaveLength(0);
  });

  it('sends the signal as a text frame and takes the signalled answer with its nonce; one at a time per connection', async () => {
    const { listener, port } = await listen();
    const ctl = await provenController(port);
    const pending = listener.signalOverPush(NONCE, 'd1', 2, BODY, 5_000)!;
    const f = await ctl.nextSignal();
    expect({ ...f, body: f.body.toString() }).toEqual({
      type: 'signal',
      nonce: NONCE,
      deployment: 'd1',
      body: BODY.toString(),
    });
    expect(listener.signalOverPush('b'.repeat(22), 'd2', 2, BODY, 5_000)).toBeNull();
    // a fetch is its own request: it may go while the signal is answered
    const fetch = listener.fetchOverPush('c'.repeat(22), undefined, 5_000);
    expect(fetch).not.toBeNull();
    void fetch?.catch(() => undefined); // unanswered: it fails when the connection closes
    ctl.ws.send(signalled(f, { status: 409, error: 'stale_revision' }));
    expect(await pending).toMatchObject({ type: 'signalled', nonce: NONCE, status: 409, error: 'stale_revision' });
    expect(listener.stats).toMatchObject({ pushSignals: 1, pushSignalsAnswered: 1 });
  });

  it('a signalled frame that answers no signal is refused unexpected_frame and closes the connection', async () => {
    const { listener, port, lines } = await listen();
    const ctl = await controller(port);
    const closed = once(ctl.ws, 'close');
    ctl.ws.send(encodeSignalled({ nonce: NONCE, status: 200 }));
    const [code, reason] = (await closed) as [number, Buffer];
    expect([code, reason.toString()]).toEqual([1008, 'unexpected_frame']);
    expect(lines.filter((l) => l.code === 'unexpected_frame')).toHaveLength(1);
    expect(listener.stats.nacks).toBe(0);
  });

  it('a metadata frame does not answer a signal: unexpected_frame, and the signal fails push_signal_failed', async () => {
    const { listener, port } = await listen();
    const ctl = await provenController(port);
    const pending = listener.signalOverPush(NONCE, 'd1', 2, BODY, 5_000)!;
    await ctl.nextSignal();
    const closed = once(ctl.ws, 'close');
    sendText(ctl.ws, encodeMetadataFrame(head({ status: 304 })));
    expect(await thrownCodeAsync(pending)).toBe('push_signal_failed');
    expect(((await closed) as [number])[0]).toBe(1008);
  });

  it('the late answer of a signal that timed out is dropped; a signal fails push_signal_failed when its connection closes', async () => {
    const { listener, port, lines } = await listen();
    const ctl = await provenController(port);
    const first = listener.signalOverPush(NONCE, 'd1', 2, BODY, 200)!;
    const f = await ctl.nextSignal();
    expect(await thrownCodeAsync(first)).toBe('push_signal_failed');
    ctl.ws.send(signalled(f, { status: 200 }));
    const second = listener.signalOverPush('n'.repeat(22), 'd1', 2, BODY, 5_000)!;
    expect((await ctl.nextSignal()).nonce).toBe('n'.repeat(22));
    expect(lines.some((l) => l.code === 'unexpected_frame')).toBe(false);
    ctl.ws.close();
    expect(await thrownCodeAsync(second)).toBe('push_signal_failed');
  });

  // each: how the key that proved the connection stops being trusted
  const distrust: Array<[string, (p: ReturnType<typeof pkiPaths>, kid: string) => void]> = [
    [
      'its kid is revoked in revoked.json',
      (p, kid) => {
        const r = JSON.parse(fs.readFileSync(p.revoked, 'utf8')) as { serials: string[]; kids: string[] };
        fs.writeFileSync(p.revoked, JSON.stringify({ ...r, kids: [...r.kids, kid] }));
      },
    ],
    [
      'it is dropped from the JWKS',
      (p, kid) => {
        const j = JSON.parse(fs.readFileSync(p.jwks, 'utf8')) as { keys: Array<{ kid: string }> };
        fs.writeFileSync(p.jwks, JSON.stringify({ keys: j.keys.filter((k) => k.kid !== kid) }));
      },
    ],
  ];
  describe('a connection is proven only while the key that proved it is trusted:', () => {
    it.each(distrust)(
      'when %s, its signal in flight fails, no signal goes there, until a wake-up signed by a trusted key proves it again',
      async (_how, drop) => {
        const p = pkiPaths(pki.dir);
        const saved = { revoked: fs.readFileSync(p.revoked), jwks: fs.readFileSync(p.jwks) };
        // a second key of controller c2 (an old one, say) that the agent trusts: the stolen one
        const stolen = newSigningJwk();
        const jwks = JSON.parse(saved.jwks.toString()) as { keys: unknown[] };
        fs.writeFileSync(p.jwks, JSON.stringify({ keys: [...jwks.keys, publicJwkOf(stolen, 'c2')] }));
        try {
          const m = pki.material('agent', 'n1');
          const { listener, port, lines } = await listen(undefined, m);
          const ctl = await controller(port, { name: 'c2' });
          expect(await prove(ctl, 'c2', new Signer(stolen))).toMatchObject({ type: 'ack' });
          const inFlight = listener.signalOverPush(NONCE, 'd1', 2, BODY, 5_000);
          expect(inFlight).not.toBeNull();
          expect((await ctl.nextSignal()).nonce).toBe(NONCE);

          drop(p, stolen.kid);
          m.reload();
          expect(await thrownCodeAsync(inFlight!)).toBe('push_signal_failed');
          expect(lines.filter((l) => l.code === 'unknown_kid' && l.kid === stolen.kid)).toHaveLength(1);
          expect(listener.signalOverPush('b'.repeat(22), 'd1', 2, BODY, 5_000)).toBeNull();
          expect(listener.connections).toBe(1);
          // the dropped key proves nothing any more; c2's own key, still trusted, does
          expect(await prove(ctl, 'c2', new Signer(stolen))).toMatchObject({ type: 'nack', error: 'unknown_kid' });
          expect(listener.signalOverPush('b'.repeat(22), 'd1', 2, BODY, 5_000)).toBeNull();
          expect(await prove(ctl, 'c2', new Signer(c2Jwk()))).toMatchObject({ type: 'ack' });
          void listener.signalOverPush('c'.repeat(22), 'd1', 2, BODY, 5_000)?.catch(() => undefined);
          expect((await ctl.nextSignal()).nonce).toBe('c'.repeat(22));
          expect(ctl.signals.map((f) => f.nonce)).toEqual([NONCE, 'c'.repeat(22)]);
        } finally {
          fs.writeFileSync(p.revoked, saved.revoked);
          fs.writeFileSync(p.jwks, saved.jwks);
        }
      },
    );
  });

  // each: [what is wrong with the answer, how it is made, the refusal code]
  const unsigned: Array<[string, (f: SignalFrame) => string, string]> = [
    ['no signature', (f) => encodeSignalled({ nonce: f.nonce, status: 200 }), 'missing_signature'],
    [
      'signed by another key under the trusted kid',
      (f) => signalled(f, { status: 200 }, { signer: new Signer({ ...newSigningJwk(), kid: pki.signer.kid }) }),
      'bad_signature',
    ],
    [
      'signed by a key the agent does not trust',
      (f) => signalled(f, { status: 200 }, { signer: new Signer(newSigningJwk()) }),
      'unknown_kid',
    ],
    [
      'a metadata signature in its place',
      (f) => {
        const signature = signMetadata(pki.signer, {
          iss: pki.spiffe('controller', 'controller'),
          aud: pki.spiffe('agent', 'n1'),
          gen: 2,
          nonce: f.nonce,
          nowS: Date.now() / 1000,
        });
        return encodeSignalled({ nonce: f.nonce, status: 200, signature });
      },
      'wrong_type',
    ],
    ['signed for another nonce', (f) => signalled(f, { status: 200 }, { nonce: 'q'.repeat(22) }), 'nonce_mismatch'],
    [
      'signed for another agent',
      (f) => signalled(f, { status: 200 }, { aud: pki.spiffe('agent', 'n2') }),
      'wrong_audience',
    ],
    [
      "signed naming another controller than the connection's",
      (f) => signalled(f, { status: 200 }, { iss: pki.spiffe('controller', 'c2') }),
      'wrong_issuer',
    ],
    ['signed for another deployment', (f) => signalled(f, { status: 200 }, { deployment: 'd9' }), 'bad_response'],
    [
      'signed over another body than the one sent (digest_mismatch)',
      (f) => signalled(f, { status: 200 }, { body: Buffer.from(JSON.stringify({ ...RESULT, revision: 1 })) }),
      'digest_mismatch',
    ],
    [
      'a 503 signed, sent as a 200',
      (f) => {
        const real = JSON.parse(signalled(f, { status: 503, error: 'store_unavailable' })) as { signature: string };
        return encodeSignalled({ nonce: f.nonce, status: 200, signature: real.signature });
      },
      'bad_response',
    ],
  ];
  describe('an answer not signed for this signal is not taken, and the fetcher signals over HTTPS:', () => {
    for (const [what, make, code] of unsigned) {
      it(what, async () => {
        const { listener, port, lines } = await listen();
        const ctl = await provenController(port);
        const pending = listener.signalOverPush(NONCE, 'd1', 2, Buffer.from(JSON.stringify(RESULT)), 5_000)!;
        ctl.ws.send(make(await ctl.nextSignal()));
        expect(await thrownCodeAsync(pending)).toBe(code);
        expect(lines.some((l) => l.code === code)).toBe(true);
        ctl.ws.on('message', (d: Buffer) => {
          const f = decodeAgentFrame(d);
          if (f.type === 'signal') ctl.ws.send(make(f));
        });
        const fetcher = fetcherOf(listener);
        await expect(fetcher.signal('/v1/nodes/n1/deployments/d1/signal', RESULT, 'd1')).rejects.toMatchObject({
          code: 'ECONNREFUSED',
        });
        expect(fetcher.pushSignals).toBe(0);
        expect(listener.stats).toMatchObject({ pushSignals: 2, pushSignalsAnswered: 0 });
      });
    }
  });

  it('the fetcher signals over the push connection, and over HTTPS when it gives no answer or cannot take it', async () => {
    const { listener, port } = await listen();
    const ctl = await provenController(port);
    let answer: Answer | null = { status: 200 };
    ctl.ws.on('message', (d: Buffer) => {
      const f = decodeAgentFrame(d);
      if (f.type === 'signal' && answer !== null) ctl.ws.send(signalled(f, answer));
    });
    const fetcher = fetcherOf(listener, 300);
    const path = '/v1/nodes/n1/deployments/d1/signal';
    // answered over push: no HTTPS request (its URL is a closed port)
    expect(await fetcher.signal(path, RESULT, 'd1')).toEqual({ status: 200 });
    answer = { status: 404, error: 'not_found' };
    expect(await fetcher.signal(path, RESULT, 'd1')).toEqual({ status: 404 });
    // the route's own refusals, Retry-After and all, are the outbox's to handle: no second try over HTTPS
    answer = { status: 429, error: 'rate_limited', retry_after_s: 2 };
    expect(await fetcher.signal(path, RESULT, 'd1')).toEqual({ status: 429, retryAfterMs: 2_000 });
    answer = { status: 503, error: 'store_unavailable', retry_after_s: 1 };
    expect(await fetcher.signal(path, RESULT, 'd1')).toEqual({ status: 503, retryAfterMs: 1_000 });
    expect(fetcher.pushSignals).toBe(4);
    answer = { status: 503, error: 'signal_unavailable' };
    await expect(fetcher.signal(path, RESULT, 'd1')).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    answer = null; // silent: the signal times out, then HTTPS is asked
    await expect(fetcher.signal(path, RESULT, 'd1')).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    expect(fetcher.pushSignals).toBe(4);
    expect(listener.stats.pushSignals).toBe(6);
  });
});

describe('the fetcher keeps its API connections only while push is down', () => {
  /** An API stand-in with the controller's certificate: 200 to anything; counts open connections. */
  async function api(): Promise<{ port: number; open: () => number }> {
    const server = https.createServer(tlsServerOptions(pki.material('controller', 'controller')), (req, res) => {
      req.resume();
      req.on('end', () => res.end('{}'));
    });
    server.keepAliveTimeout = 60_000;
    let conns = 0;
    server.on('secureConnection', (s) => {
      conns++;
      s.on('close', () => conns--);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    open.push({
      close: () =>
        new Promise<void>((r) => {
          server.close(() => r());
          server.closeAllConnections();
        }),
    });
    return { port: (server.address() as net.AddressInfo).port, open: () => conns };
  }

  for (const healthy of [true, false]) {
    it(`push ${healthy ? 'healthy: an idle API connection is closed after apiIdleCloseMs' : 'down: an idle API connection is kept'}`, async () => {
      const a = await api();
      const f = new Fetcher({
        controllerUrl: `https://127.0.0.1:${a.port}`,
        node: 'n1',
        material,
        controllerSpiffeId: { controllers: '*' },
        lastAppliedGen: () => undefined,
        log: quietLog(),
        pushHealthy: () => healthy,
        apiIdleCloseMs: 100,
      });
      open.push({ close: () => f.close() });
      expect(await f.announce('wss://127.0.0.1:7443/v1/wake')).toBe(true);
      expect(a.open()).toBe(1);
      if (healthy) {
        const t0 = Date.now();
        while (a.open() > 0 && Date.now() - t0 < 5_000) await new Promise((r) => setTimeout(r, 20));
        expect(a.open()).toBe(0);
      } else {
        // ten times the idle time the healthy case closes after: still open
        await new Promise((r) => setTimeout(r, 1_000));
        expect(a.open()).toBe(1);
        // and closeIdleApiConnections (push became healthy) closes it
        f.closeIdleApiConnections();
        const t0 = Date.now();
        while (a.open() > 0 && Date.now() - t0 < 5_000) await new Promise((r) => setTimeout(r, 20));
        expect(a.open()).toBe(0);
      }
    });
  }
});
