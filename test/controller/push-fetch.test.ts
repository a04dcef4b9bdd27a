/**
 * Fetches and signals over the push connection at the controller (docs/protocol.md): the dialer, in this
 * process and in worker processes (PushPool), hands an agent's `fetch` frame to the handler the
 * API serves and answers with a `metadata` frame carrying the handler's reply byte for byte, and
 * a `signal` frame likewise, answered by a `signalled` frame, always for the connection's node;
 * one of each per node at a time; 503 `fetch_unavailable` / `signal_unavailable` before a
 * handler is set. The API answers both as its routes would. The agent side is the real listener
 * (test/helpers/wake-listener.ts) over TLS 1.3 on 127.0.0.1.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import https from 'node:https';
import type WebSocket from 'ws';
import { WebSocketServer } from 'ws';
import { PkiMaterial, tlsServerOptions } from '../../certs/tls.js';
import {
  decodeControllerAnswer,
  decodeMetadataFrame,
  encodeAck,
  encodeFetch,
  encodeSignal,
} from '../../protocol/frames.js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PushDialer } from '../../controller/push/dialer.js';
import { defaultWorkerScript, PushPool } from '../../controller/push/pool.js';
import type { PushReply, PushRequest } from '../../controller/push/types.js';
import { materialPaths } from '../../certs/paths.js';
import { makeCa, newRsaKeyPem } from '../../certs/pki.js';
import { newNonce, verifyMetadataResponse } from '../../protocol/metadata.js';
import { startTestController, type TestController, waitFor } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';
import { nextPushEvent } from '../helpers/push-events.js';
import { CONTROLLER_ID, makePushPki, TD, TestWakeListener, type PushPki } from '../helpers/wake-listener.js';

let pki: PushPki;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki(['n1']);
}, 60_000);
afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});
afterAll(() => pki?.cleanup());

const NONCE = 'f'.repeat(22);

/** The two requests an agent makes on its push connection, each as a raw agent sends its `i`-th. */
const requestKinds: Array<[string, (ws: WebSocket, i: number) => void]> = [
  ['fetches', (ws, i) => ws.send(encodeFetch(`${i}`.repeat(22)))],
  [
    'signals',
    (ws, i) => ws.send(encodeSignal(`${i}`.repeat(22), 'd1', Buffer.from('{"revision":1}')), { binary: false }),
  ],
];

/** The head of the controller's answer to either request. */
function headOf(frame: Buffer): { status: number; error?: string; retry_after_s?: number } {
  const a = decodeControllerAnswer(frame);
  return a.type === 'metadata' ? a.head : a;
}

/**
 * A bare agent listener (n1's certificate, no Herald code behind it): acks every wake-up and
 * hands out the other frames the controller sends, so a test can send what the real agent never
 * would (two fetches at once).
 */
async function rawAgent(): Promise<{
  url: string;
  connected: Promise<WebSocket>;
  /** The next connection after the first (a redial). */
  nextConnection(): Promise<WebSocket>;
  nextFrame(): Promise<Buffer>;
}> {
  const material = new PkiMaterial({ ...materialPaths(pki.dir, 'agent', 'n1'), trustDomain: TD, watch: false });
  const server = https.createServer(tlsServerOptions(material));
  const wss = new WebSocketServer({ server, perMessageDeflate: false });
  const frames: Buffer[] = [];
  const waiting: Array<(b: Buffer) => void> = [];
  const later: WebSocket[] = [];
  const laterWaiting: Array<(ws: WebSocket) => void> = [];
  let connections = 0;
  const connected = new Promise<WebSocket>((resolve) => {
    wss.on('connection', (ws) => {
      const first = connections++ === 0;
      let handed = false;
      ws.on('message', (d: Buffer) => {
        const text = d.toString();
        if (text.startsWith('ey')) {
          const { jti } = JSON.parse(Buffer.from(text.split('.')[1]!, 'base64url').toString()) as { jti: string };
          ws.send(encodeAck(jti, 2, 'current'));
          if (handed) return;
          handed = true;
          if (first) resolve(ws);
          else {
            const w = laterWaiting.shift();
            if (w) w(ws);
            else later.push(ws);
          }
          return;
        }
        const w = waiting.shift();
        if (w) w(d);
        else frames.push(d);
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  open.push({
    close: async () => {
      for (const c of wss.clients) c.terminate();
      wss.close();
      await new Promise<void>((r) => server.close(() => r()));
      material.close();
    },
  });
  return {
    url: `wss://127.0.0.1:${(server.address() as { port: number }).port}/v1/wake`,
    connected,
    nextConnection: () => {
      const ws = later.shift();
      return ws ? Promise.resolve(ws) : new Promise((r) => laterWaiting.push(r));
    },
    nextFrame: () => {
      const f = frames.shift();
      return f ? Promise.resolve(f) : new Promise((r) => waiting.push(r));
    },
  };
}

function inProcess(over: { clock?: () => number } = {}): PushDialer {
  return new PushDialer({
    signer: pki.signer(),
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: pki.controllerMaterial(),
    logger: pki.logger,
    ...over,
  });
}

function inWorker(over: { requestsInFlight?: number; requestAnswerTimeoutMs?: number } = {}): PushPool {
  return new PushPool({
    ...over,
    workers: 1,
    signingJwk: pki.signingJwk,
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: materialPaths(pki.dir, 'controller', 'controller'),
    logger: pki.logger,
  });
}

/** `push` connected to a new listener of n1, past its first ping wake-up. */
async function connectedTo(push: PushDialer | PushPool): Promise<{ l: TestWakeListener }> {
  const l = await TestWakeListener.start({ pkiDir: pki.dir, node: 'n1' });
  open.push(l);
  const acked = nextPushEvent(push, 'ack', (e) => e.node === 'n1');
  await push.start([{ node: 'n1', url: l.url, generation: 2, ackedGeneration: 1 }]);
  await acked;
  return { l };
}

/**
 * Has `push` hold every request until the test answers it: `asked(n)` resolves once `n` have
 * reached the handler, `answer(i, r)` answers the `i`-th (from 0).
 */
function holdRequests(push: PushDialer | PushPool): {
  asked(n: number): Promise<void>;
  answer(i: number, r: PushReply): void;
  /** The requests that have reached the handler so far. */
  readonly requests: PushRequest[];
} {
  const requests: PushRequest[] = [];
  const answers: Array<(r: PushReply) => void> = [];
  const waiting: Array<{ n: number; resolve: () => void }> = [];
  push.serveRequests(
    (req) =>
      new Promise((r) => {
        requests.push(req);
        answers.push(r);
        for (const w of waiting.filter((x) => answers.length >= x.n)) {
          waiting.splice(waiting.indexOf(w), 1);
          w.resolve();
        }
      }),
  );
  return {
    asked: (n) => (answers.length >= n ? Promise.resolve() : new Promise((resolve) => waiting.push({ n, resolve }))),
    answer: (i, r) => answers[i]!(r),
    requests,
  };
}

/** `push` (closed after the test) connected to a raw agent whose first fetch its handler holds. */
async function fetchHeldBy(push: PushDialer | PushPool): Promise<{
  agent: Awaited<ReturnType<typeof rawAgent>>;
  held: ReturnType<typeof holdRequests>;
  /** The first connection's close code. */
  closed: Promise<number>;
}> {
  const agent = await rawAgent();
  open.push(push);
  const held = holdRequests(push);
  await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
  const ws = await agent.connected;
  const closed = new Promise<number>((r) => ws.once('close', (code: number) => r(code)));
  ws.send(encodeFetch('a'.repeat(22)));
  await held.asked(1);
  return { agent, held, closed };
}

/** `make`'s service connected to n1's listener, past its first ping wake-up. */
async function connected(
  make: () => PushDialer | PushPool,
): Promise<{ push: PushDialer | PushPool; l: TestWakeListener }> {
  const l = await TestWakeListener.start({ pkiDir: pki.dir, node: 'n1' });
  open.push(l);
  const push = make();
  open.push(push);
  const acked = nextPushEvent(push, 'ack', (e) => e.node === 'n1');
  await push.start([{ node: 'n1', url: l.url, generation: 2, ackedGeneration: 1 }]);
  await acked;
  return { push, l };
}

/** The same cases for the dialer in this process and behind the worker pool. */
function dialerCases(make: () => PushDialer | PushPool): void {
  it("hands the agent's fetch to the handler and carries its reply to the agent byte for byte", async () => {
    const { push, l } = await connected(make);
    const seen: PushRequest[] = [];
    const body = Buffer.from(`{"node":"n1","generation":2,"deployments":[],"x":"${'é'.repeat(40_000)}"}`);
    push.serveRequests(async (r) => {
      seen.push(r);
      return { status: 200, etag: '"2"', signature: 'h.p.s', body };
    });
    const a = await l.fetchOverPush(NONCE, '"1"')!;
    expect(seen).toEqual([{ kind: 'fetch', node: 'n1', nonce: NONCE, ifNoneMatch: '"1"' }]);
    expect(a.head).toEqual({ type: 'metadata', nonce: NONCE, status: 200, etag: '"2"', signature: 'h.p.s' });
    expect(a.body.equals(body)).toBe(true);
    expect(a.issuer).toBe(CONTROLLER_ID);
    // a refusal travels as its status and code, with no body
    push.serveRequests(async () => ({ status: 429, error: 'rate_limited', retryAfterS: 2 }));
    const r = await l.fetchOverPush(NONCE)!;
    expect(r.head).toMatchObject({ status: 429, error: 'rate_limited', retry_after_s: 2 });
    expect(r.body.length).toBe(0);
  });

  it('answers 503 fetch_unavailable while no handler is set, and 500 internal when the handler fails', async () => {
    const { push, l } = await connected(make);
    expect((await l.fetchOverPush(NONCE)!).head).toMatchObject({ status: 503, error: 'fetch_unavailable' });
    push.serveRequests(() => Promise.reject(new Error('boom')));
    expect((await l.fetchOverPush(NONCE)!).head).toMatchObject({ status: 500, error: 'internal' });
  });

  it('one fetch per node at a time: a second one while the first is answered is 503 fetch_unavailable at once (the agent asks HTTPS)', async () => {
    const agent = await rawAgent();
    const push = make();
    open.push(push);
    const held = holdRequests(push);
    await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
    const ws = await agent.connected;
    ws.send(encodeFetch('a'.repeat(22)));
    ws.send(encodeFetch('b'.repeat(22)));
    const busy = decodeMetadataFrame(await agent.nextFrame());
    expect(busy.head).toMatchObject({ nonce: 'b'.repeat(22), status: 503, error: 'fetch_unavailable' });
    await held.asked(1);
    held.answer(0, { status: 304, etag: '"2"', signature: 'h.p.s' });
    expect(decodeMetadataFrame(await agent.nextFrame()).head).toMatchObject({ nonce: 'a'.repeat(22), status: 304 });
  });

  it('closing while a fetch is answered does not wait for the answer: the connection closes 1001 (the agent then asks HTTPS)', async () => {
    const push = make();
    const { held, closed } = await fetchHeldBy(push);
    // the handler never answers before the close: close() must end anyway
    await push.close();
    expect(await closed).toBe(1001);
    held.answer(0, { status: 304, etag: '"2"', signature: 'h.p.s' }); // late: goes nowhere, throws nothing
  });

  it("hands the agent's signal to the handler for the connection's node, and carries the status back", async () => {
    const { push, l } = await connected(make);
    const seen: PushRequest[] = [];
    push.serveRequests(async (r) => {
      seen.push(r);
      return { status: 409, error: 'stale_revision' };
    });
    const body = { revision: 3, deploy_status_code: 0, deploy_stdout: 'é'.repeat(1_000), outputs: {} };
    // the agent's listener resolves only with an answer signed for this very signal
    const a = await l.signalOverPush(NONCE, 'd1', body)!;
    expect(a).toMatchObject({ type: 'signalled', nonce: NONCE, status: 409, error: 'stale_revision' });
    expect(a.signature).toMatch(/^ey[\w-]+\.[\w-]+\.[\w-]+$/);
    expect(seen).toHaveLength(1);
    const r = seen[0]!;
    expect(r.kind === 'signal' && { node: r.node, deploymentId: r.deploymentId }).toEqual({
      node: 'n1',
      deploymentId: 'd1',
    });
    expect(r.kind === 'signal' && JSON.parse(Buffer.from(r.body).toString('utf8'))).toEqual(body);
    push.serveRequests(async () => ({ status: 200 }));
    expect(await l.signalOverPush(NONCE, 'd1', body)!).toMatchObject({ type: 'signalled', nonce: NONCE, status: 200 });
  });

  it('answers a signal 503 signal_unavailable while no handler is set, and 500 internal when the handler fails', async () => {
    const { push, l } = await connected(make);
    expect(await l.signalOverPush(NONCE, 'd1', { revision: 1 })!).toMatchObject({
      status: 503,
      error: 'signal_unavailable',
    });
    push.serveRequests(() => Promise.reject(new Error('boom')));
    expect(await l.signalOverPush(NONCE, 'd1', { revision: 1 })!).toMatchObject({ status: 500, error: 'internal' });
  });

  it('one signal per node at a time: a second one while the first is answered is 503 signal_unavailable; a fetch meanwhile is answered', async () => {
    const agent = await rawAgent();
    const push = make();
    open.push(push);
    let release: (r: PushReply) => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      push.serveRequests((r) =>
        r.kind === 'fetch'
          ? Promise.resolve({ status: 304, etag: '"2"', signature: 'h.p.s' })
          : new Promise((answer) => {
              release = answer;
              resolve();
            }),
      );
    });
    await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
    const ws = await agent.connected;
    const body = Buffer.from('{"revision":1}');
    ws.send(encodeSignal('a'.repeat(22), 'd1', body), { binary: false });
    ws.send(encodeSignal('b'.repeat(22), 'd1', body), { binary: false });
    expect(decodeControllerAnswer(await agent.nextFrame())).toMatchObject({
      type: 'signalled',
      nonce: 'b'.repeat(22),
      status: 503,
      error: 'signal_unavailable',
    });
    await held;
    ws.send(encodeFetch('c'.repeat(22)));
    expect(decodeMetadataFrame(await agent.nextFrame()).head).toMatchObject({ nonce: 'c'.repeat(22), status: 304 });
    release({ status: 200 });
    expect(decodeControllerAnswer(await agent.nextFrame())).toMatchObject({
      type: 'signalled',
      nonce: 'a'.repeat(22),
      status: 200,
    });
  });

  it('takes the node from the connection: a signal head naming another node is still for n1', async () => {
    const agent = await rawAgent();
    const push = make();
    open.push(push);
    const seen: PushRequest[] = [];
    push.serveRequests(async (r) => {
      seen.push(r);
      return { status: 200 };
    });
    await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
    const ws = await agent.connected;
    const head = JSON.stringify({ type: 'signal', nonce: 'a'.repeat(22), deployment: 'd9', node: 'n2' });
    ws.send(`${head}\n{"revision":1}`);
    expect(decodeControllerAnswer(await agent.nextFrame())).toMatchObject({ status: 200 });
    expect(seen.map((r) => [r.kind, r.node])).toEqual([['signal', 'n1']]);
  });
}

describe('fetches and signals over the push connection, dialer in this process (PushDialer)', () => {
  dialerCases(() => inProcess());

  it.each(requestKinds)(
    'refuses the %s of an agent whose certificate expired since the dial (403 certificate_expired) and closes it',
    async (_kind, ask) => {
      const agent = await rawAgent();
      // the dial is checked at the real time; the dialer's clock is two years on by the request
      const push = inProcess({ clock: () => Date.now() + 2 * 365 * 86_400_000 });
      open.push(push);
      let asked = 0;
      push.serveRequests(async () => {
        asked++;
        return { status: 304, etag: '"2"', signature: 'h.p.s' };
      });
      await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
      const ws = await agent.connected;
      const closed = new Promise<number>((r) => ws.once('close', (code: number) => r(code)));
      ask(ws, 0);
      expect(headOf(await agent.nextFrame())).toMatchObject({ status: 403, error: 'certificate_expired' });
      expect(await closed).toBe(1008);
      expect(asked).toBe(0);
      expect(push.state('n1').last_error).toBe('certificate_expired');
    },
  );

  it('another CA closes every push connection, which is dialled and verified again; a renewal of its own certificate closes none', async () => {
    // the dialer's own copy of its material, whose CA bundle this test changes
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-push-ca-'));
    const src = materialPaths(pki.dir, 'controller', 'controller');
    const paths = {
      caPath: path.join(dir, 'ca.crt'),
      certPath: path.join(dir, 'c.crt'),
      keyPath: path.join(dir, 'c.key'),
      revokedPath: src.revokedPath,
      jwksPath: src.jwksPath,
    };
    for (const [from, to] of [
      [src.caPath, paths.caPath],
      [src.certPath, paths.certPath],
      [src.keyPath, paths.keyPath],
    ] as const)
      fs.copyFileSync(from, to);
    fs.chmodSync(paths.keyPath, 0o600);
    const material = new PkiMaterial({ ...paths, trustDomain: TD, watch: false });
    open.push({
      close: async () => {
        material.close();
        fs.rmSync(dir, { recursive: true, force: true });
      },
    });
    const push = new PushDialer({
      signer: pki.signer(),
      issuer: CONTROLLER_ID,
      trustDomain: TD,
      material,
      logger: pki.logger,
      backoffBaseMs: 20,
      backoffMaxMs: 50,
    });
    open.push(push);
    const { l } = await connectedTo(push);
    // the same CA and certificate again (a renewal): nothing closes
    fs.copyFileSync(src.certPath, paths.certPath);
    material.reload();
    expect(l.connections).toBe(1);
    // another CA beside ours: the connection is closed and dialled again
    fs.appendFileSync(paths.caPath, makeCa({ keyPem: newRsaKeyPem() }).cert);
    const again = nextPushEvent(push, 'ack', (e) => e.node === 'n1');
    material.reload();
    await again;
    expect(l.connections).toBe(2);
    expect(l.closeCodes).toContain(1008);
  });

  it.each(requestKinds)(
    'closes a connection whose %s are refused 429 three times in a row, as the API does',
    async (_kind, ask) => {
      const agent = await rawAgent();
      const push = inProcess();
      open.push(push);
      push.serveRequests(async () => ({ status: 429, error: 'rate_limited', retryAfterS: 1 }));
      await push.start([{ node: 'n1', url: agent.url, generation: 2, ackedGeneration: 1 }]);
      const ws = await agent.connected;
      const closed = new Promise<number>((r) => ws.once('close', (code: number) => r(code)));
      for (let i = 0; i < 3; i++) {
        ask(ws, i);
        expect(headOf(await agent.nextFrame())).toMatchObject({ status: 429, retry_after_s: 1 });
      }
      expect(await closed).toBe(1008);
      expect(push.state('n1').last_error).toBe('rate_limited');
    },
  );
});
describe.skipIf(!fs.existsSync(defaultWorkerScript()))(
  'fetches and signals over the push connection, dialer in a worker process (PushPool)',
  () => {
    dialerCases(inWorker);

    /**
     * A pool answering one request at a time, its fetch held by the handler and a signal of the
     * same agent waiting its turn in the controller's process behind it.
     */
    async function signalWaitingBehindFetch() {
      const pool = inWorker({ requestsInFlight: 1 });
      const { agent, held } = await fetchHeldBy(pool);
      const ws = await agent.connected;
      ws.send(encodeSignal('s'.repeat(22), 'd1', Buffer.from('{"revision":1}')), { binary: false });
      await waitFor('the signal to wait its turn', () => pool.requestsWaiting === 1);
      return { pool, agent, held };
    }

    it('answers the requests of its workers a bounded number at a time, in the order they came', async () => {
      const { pool, agent, held } = await signalWaitingBehindFetch();
      expect(held.requests.map((r) => r.kind)).toEqual(['fetch']);
      held.answer(0, { status: 304, etag: '"2"', signature: 'h.p.s' });
      expect(decodeMetadataFrame(await agent.nextFrame()).head).toMatchObject({ nonce: 'a'.repeat(22), status: 304 });
      await held.asked(2);
      expect(held.requests.map((r) => r.kind)).toEqual(['fetch', 'signal']);
      expect(pool.requestsWaiting).toBe(0);
      held.answer(1, { status: 200 });
      expect(headOf(await agent.nextFrame())).toMatchObject({ status: 200 });
    });

    it('requests still waiting their turn when the pool closes are never started', async () => {
      const { pool, held } = await signalWaitingBehindFetch();
      await pool.close();
      expect(pool.requestsWaiting).toBe(0);
      // the held fetch ends after the close: its place is free, and nothing waits for it
      held.answer(0, { status: 304, etag: '"2"', signature: 'h.p.s' });
      await new Promise((r) => setImmediate(r));
      expect(held.requests.map((r) => r.kind)).toEqual(['fetch']);
    });

    it('a request waiting its turn when its worker dies is never started', async () => {
      const { pool, held } = await signalWaitingBehindFetch();
      const [pid] = pool.workerPids;
      process.kill(pid!, 'SIGKILL');
      await waitFor('the worker to be replaced', () => pool.workerPids.length === 1 && !pool.workerPids.includes(pid!));
      held.answer(0, { status: 304, etag: '"2"', signature: 'h.p.s' });
      await new Promise((r) => setImmediate(r));
      expect(held.requests.map((r) => r.kind)).toEqual(['fetch']);
      expect(pool.requestsWaiting).toBe(0);
    });

    it('a handler that never answers: the agent is told 503 once the worker stops waiting, the place frees for the next request, and the late answer goes nowhere', async () => {
      const pool = inWorker({ requestsInFlight: 1, requestAnswerTimeoutMs: 1_000 });
      const { agent, held } = await fetchHeldBy(pool);
      const ws = await agent.connected;
      expect(headOf(await agent.nextFrame())).toMatchObject({
        nonce: 'a'.repeat(22),
        status: 503,
        error: 'fetch_unavailable',
      });
      // the held fetch still holds nothing: the signal after it is started and answered
      ws.send(encodeSignal('s'.repeat(22), 'd1', Buffer.from('{"revision":1}')), { binary: false });
      await held.asked(2);
      expect(held.requests.map((r) => r.kind)).toEqual(['fetch', 'signal']);
      held.answer(1, { status: 200 });
      expect(headOf(await agent.nextFrame())).toMatchObject({ nonce: 's'.repeat(22), status: 200 });
      // the first fetch's answer comes at last: dropped; the next frame the agent gets answers its next fetch
      held.answer(0, { status: 200, etag: '"9"', signature: 'late.answer.x', body: Buffer.from('{"late":true}') });
      ws.send(encodeFetch('c'.repeat(22)));
      await held.asked(3);
      held.answer(2, { status: 304, etag: '"2"', signature: 'h.p.s' });
      expect(decodeMetadataFrame(await agent.nextFrame()).head).toMatchObject({ nonce: 'c'.repeat(22), status: 304 });
    });

    it.each([0, 1.5, Number.NaN, 2 ** 31])('refuses requestAnswerTimeoutMs %s with a ConfigError naming it', (ms) => {
      expect(() => inWorker({ requestAnswerTimeoutMs: ms })).toThrow(
        expect.objectContaining({ code: 'bad_option', field: 'requestAnswerTimeoutMs' }),
      );
    });

    it('two requests that never get answers: each frees its place when its worker stops waiting, the later one by the sweep the first one left armed', async () => {
      const pool = inWorker({ requestsInFlight: 2, requestAnswerTimeoutMs: 1_000 });
      const { agent, held } = await fetchHeldBy(pool);
      const ws = await agent.connected;
      // the second comes half a deadline after the first: the sweep due for the first finds it
      // not yet overdue, and must be armed again for it
      await new Promise((r) => setTimeout(r, 500));
      ws.send(encodeSignal('s'.repeat(22), 'd1', Buffer.from('{"revision":1}')), { binary: false });
      await held.asked(2);
      expect(pool.requestsAnswering).toBe(2);
      expect(headOf(await agent.nextFrame())).toMatchObject({ nonce: 'a'.repeat(22), status: 503 });
      expect(headOf(await agent.nextFrame())).toMatchObject({
        nonce: 's'.repeat(22),
        status: 503,
        error: 'signal_unavailable',
      });
      await waitFor('both places to be free', () => pool.requestsAnswering === 0);
    });

    it("a worker killed while its fetch is answered: the late answer never reaches the new worker's fetch of the same id", async () => {
      const pool = inWorker();
      const { agent, held, closed } = await fetchHeldBy(pool);
      const [pid] = pool.workerPids;
      process.kill(pid!, 'SIGKILL');
      expect(await closed).toBe(1006); // the worker's socket died with it
      // the restarted worker dials n1 again (it held a connection) and numbers its requests anew
      const ws2 = await agent.nextConnection();
      ws2.send(encodeFetch('b'.repeat(22)));
      await held.asked(2);
      held.answer(0, { status: 200, etag: '"9"', signature: 'stale.answer.x', body: Buffer.from('{"stale":true}') });
      held.answer(1, { status: 304, etag: '"2"', signature: 'h.p.s' });
      const answer = decodeMetadataFrame(await agent.nextFrame());
      expect(answer.head).toMatchObject({ nonce: 'b'.repeat(22), status: 304, etag: '"2"' });
      expect(pool.workerPids).not.toContain(pid);
    }, 20_000);
  },
);

/**
 * A controller of this describe block whose `rates` do not refill within a test (their 429 is the
 * test's to see); `cpki` and `t` are set before its tests run.
 */
function apiController(rates: NonNullable<Parameters<typeof startTestController>[2]>['rates']): {
  cpki: ControllerTestPki;
  t: TestController;
} {
  const c = {} as { cpki: ControllerTestPki; t: TestController };
  beforeAll(async () => {
    c.cpki = await makeControllerTestPki();
    c.t = await startTestController(c.cpki, {}, { rates });
  }, 60_000);
  afterAll(async () => {
    await c.t?.close();
    c.cpki?.cleanup();
  });
  return c;
}

describe('the API answers a fetch over the push connection as its metadata route', () => {
  const c = apiController({ fetch: { burst: 3, perS: 0.001 } });

  it('a signed 200 and 304 for that node, the route rate limit shared with HTTPS, a wake-up exempts, an unknown node 404', async () => {
    const { cpki, t } = c;
    const agent = await cpki.issueAgent('pf1');
    expect((await t.req(agent, 'PUT', '/v1/nodes/pf1/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' })).status).toBe(
      200,
    );
    const fetch = t.push.requestHandler!;
    expect(fetch).toBeTypeOf('function');
    const nonce = newNonce();
    const full = await fetch({ kind: 'fetch', node: 'pf1', nonce, ifNoneMatch: null });
    expect(full.status).toBe(200);
    const v = verifyMetadataResponse({
      status: 200,
      signature: full.signature,
      body: Buffer.from(full.body!),
      nonce,
      audience: cpki.spiffe('agent', 'pf1'),
      issuer: cpki.spiffe('controller', 'controller'),
      keys: cpki.keys,
    });
    expect(v.document?.node).toBe('pf1');
    const same = await fetch({ kind: 'fetch', node: 'pf1', nonce: newNonce(), ifNoneMatch: full.etag! });
    expect(same).toMatchObject({ status: 304, etag: full.etag });
    expect(same.body).toBeUndefined();
    // the third token of the budget, then the route's limit, over HTTPS as well
    expect((await fetch({ kind: 'fetch', node: 'pf1', nonce: newNonce(), ifNoneMatch: null })).status).toBe(200);
    const limited = await fetch({ kind: 'fetch', node: 'pf1', nonce: newNonce(), ifNoneMatch: null });
    expect(limited).toMatchObject({ status: 429, error: 'rate_limited' });
    expect(limited.retryAfterS).toBeGreaterThanOrEqual(1);
    expect((await t.req(agent, 'GET', '/v1/nodes/pf1/metadata')).status).toBe(429);
    // a change wakes the node: the fetch that answers it is never limited (docs/api.md)
    const op = cpki.cred('operator', 'admin');
    const cfg = await t.req(op, 'POST', '/v1/configs', { name: 'c', group: 'script', config: 'true' });
    const dep = await t.req(op, 'POST', '/v1/deployments', { node: 'pf1', config_id: cfg.json.id, action: 'CREATE' });
    expect(dep.status, dep.text).toBe(201);
    expect((await fetch({ kind: 'fetch', node: 'pf1', nonce: newNonce(), ifNoneMatch: null })).status).toBe(200);
    expect(await fetch({ kind: 'fetch', node: 'nobody', nonce: newNonce(), ifNoneMatch: null })).toMatchObject({
      status: 404,
      error: 'not_found',
    });
    const m = (await t.req(op, 'GET', '/metrics')).text;
    expect(m).toMatch(/herald_metadata_fetches_total\{status="429",channel="push"\} 1/);
  });
});

describe('the API answers a signal over the push connection as its signal route', () => {
  const c = apiController({ signal: { burst: 8, perS: 0.001 } });

  it("records the node's result (first wins), refuses what the route refuses, and shares its rate limit with HTTPS", async () => {
    const { cpki, t } = c;
    const op = cpki.cred('operator', 'admin');
    const agent = await cpki.issueAgent('ps1');
    await cpki.issueAgent('ps2');
    for (const n of ['ps1', 'ps2']) expect((await t.req(op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
    const cfg = await t.req(op, 'POST', '/v1/configs', { name: 'c', group: 'script', config: 'true' });
    const mine = await t.req(op, 'POST', '/v1/deployments', { node: 'ps1', config_id: cfg.json.id, action: 'CREATE' });
    const theirs = await t.req(op, 'POST', '/v1/deployments', {
      node: 'ps2',
      config_id: cfg.json.id,
      action: 'CREATE',
    });
    expect([mine.status, theirs.status]).toEqual([201, 201]);
    const handle = t.push.requestHandler!;
    const signal = (node: string, deploymentId: string, body: unknown) =>
      handle({
        kind: 'signal',
        node,
        deploymentId,
        body: Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)),
      });
    const result = { revision: 1, deploy_status_code: 0, deploy_stdout: 'out', deploy_stderr: '', outputs: {} };
    // 1-2: recorded (the signal the deployment's wake-up asked for: not counted), then a repeat
    // answered 200 without change (the first of the budget of 8)
    expect(await signal('ps1', mine.json.id, result)).toEqual({ status: 200 });
    expect(await signal('ps1', mine.json.id, { ...result, deploy_status_code: 3 })).toEqual({ status: 200 });
    const view = await t.req(op, 'GET', `/v1/deployments/${mine.json.id}`);
    expect(view.json).toMatchObject({ status: 'COMPLETE', signalled: true, output_values: { deploy_stdout: 'out' } });
    // 3-6: another node's deployment, a revision not yet made, a body that is not JSON or not a signal
    expect(await signal('ps1', theirs.json.id, result)).toEqual({ status: 404, error: 'not_found' });
    expect(await signal('ps1', mine.json.id, { ...result, revision: 2 })).toEqual({
      status: 409,
      error: 'unknown_revision',
    });
    expect(await signal('ps1', mine.json.id, '{"revision":')).toEqual({ status: 400, error: 'invalid_json' });
    expect(await signal('ps1', mine.json.id, { revision: 'one' })).toEqual({ status: 400, error: 'invalid_request' });
    expect((await t.req(op, 'GET', `/v1/deployments/${theirs.json.id}`)).json.signalled).toBe(false);
    // 7: over HTTPS, from the same budget; 8-9: its last two tokens; then both channels are limited
    const url = `/v1/nodes/ps1/deployments/${mine.json.id}/signal`;
    expect((await t.req(agent, 'POST', url, result)).status).toBe(200);
    expect(await signal('ps1', mine.json.id, result)).toEqual({ status: 200 });
    expect(await signal('ps1', mine.json.id, result)).toEqual({ status: 200 });
    const limited = await signal('ps1', mine.json.id, result);
    expect(limited).toMatchObject({ status: 429, error: 'rate_limited' });
    expect(limited.retryAfterS).toBeGreaterThanOrEqual(1);
    expect((await t.req(agent, 'POST', url, result)).status).toBe(429);
    const m = (await t.req(op, 'GET', '/metrics')).text;
    expect(m).toMatch(/herald_api_refusals_total\{code="rate_limited"\} [2-9]/);
  });
});
