/**
 * The agent as `herald agent` assembles it (agent/assemble.ts) with `--dial-out`, over real TLS on
 * 127.0.0.1: a stand-in for the controller's connect listener (test/helpers/connect-stand-in.ts)
 * and a fake controller API (test/security/helpers/fake-controller.ts). Without `--listen` the agent
 * listens on nothing and announces nothing; with both, a wake-up that comes both ways is acted on
 * once; the options are checked at start with codes naming them.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import WebSocket from 'ws';
import { assembleAgent, type AgentConfig, type AssembledAgent } from '../../agent/assemble.js';
import { decodeAnswer, encodeMetadataFrame, type AnswerFrame } from '../../protocol/frames.js';
import { sha256b64url, signMetadata } from '../../protocol/metadata.js';
import type { WakeClaims } from '../../protocol/wake.js';
import { makeAgentTestPki, memoryLog, type AgentTestPki } from '../helpers/agent-pki.js';
import { thrownCodeAsync } from '../helpers/codes.js';
import { ConnectStandIn, type StandInConnection } from '../helpers/connect-stand-in.js';
import { FakeController } from '../security/helpers/fake-controller.js';

let pki: AgentTestPki;
let tmp: string;
const open: Array<{ close(): unknown }> = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-dial-out-'));
});
afterAll(() => {
  pki?.cleanup();
  fs.rmSync(tmp, { recursive: true, force: true });
});
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

/** A stand-in connect listener of controller `controller` that answers every fetch with `served()`'s generation. */
async function connectListener(served: () => number): Promise<ConnectStandIn> {
  const s = await ConnectStandIn.start({
    material: pki.material('controller', 'controller'),
    signer: pki.signer,
    issuer: pki.spiffe('controller', 'controller'),
    audience: pki.spiffe('agent', 'n1'),
    pingGen: served(),
  });
  s.on('connection', (c: StandInConnection) =>
    c.on('frame', (f: { type: string; nonce?: string }) => {
      if (f.type === 'fetch') c.send(signed200(f.nonce!, served()));
    }),
  );
  open.push(s);
  return s;
}

function signed200(nonce: string, gen: number): Buffer {
  const body = Buffer.from(JSON.stringify({ node: 'n1', generation: gen, deployments: [] }));
  const signature = signMetadata(pki.signer, {
    iss: pki.spiffe('controller', 'controller'),
    aud: pki.spiffe('agent', 'n1'),
    gen,
    nonce,
    sha256: sha256b64url(body),
    nowS: Date.now() / 1000,
  });
  return encodeMetadataFrame({ type: 'metadata', nonce, status: 200, etag: `"${gen}"`, signature }, body);
}

async function api(): Promise<FakeController> {
  const f = await new FakeController(pki.cred('controller', 'controller')).listen();
  open.push(f);
  return f;
}

function config(over: Partial<AgentConfig>): AgentConfig {
  return {
    node: 'n1',
    controller: 'https://127.0.0.1:1',
    pki: pki.dir,
    stateDir: fs.mkdtempSync(path.join(tmp, 'state-')),
    controllerId: 'controller',
    pollIntervalMs: 3_600_000,
    pollIntervalHealthyMs: 3_600_000,
    renew: false,
    ...over,
  };
}

async function agent(cfg: AgentConfig, wakes: WakeClaims[] = []): Promise<AssembledAgent> {
  const a = await assembleAgent(cfg, {
    log: memoryLog().log,
    watchPki: false,
    observe: { wake: (c) => wakes.push(c) },
  });
  open.push({ close: () => a.stop('test over') });
  return a;
}

describe('an agent dialling out', () => {
  it('without --listen listens on nothing, announces no endpoint, and gets its wake-ups and fetches on the dialled connection', async () => {
    const ctl = await api();
    const s = await connectListener(() => 3);
    const a = await agent(config({ controller: ctl.url, dialOut: s.url }));
    expect(await a.start()).toBe(0);
    expect(a.parts.listener).toBeNull();
    const c = await s.connection();
    expect(await c.nextAnswer()).toMatchObject({ type: 'ack' });
    await vi.waitFor(() => expect(a.parts.coalescer.lastFetchedGen).toBe(3));
    expect(await a.announced()).toBe(false);
    expect(ctl.requests.filter((r) => r.path.endsWith('/endpoint'))).toEqual([]);
    expect(a.parts.fetcher.pushFetches).toBeGreaterThanOrEqual(1);
  });

  it('with --listen too, announces the listener, and a wake-up that comes both ways is acted on once', async () => {
    const ctl = await api();
    let served = 3;
    const s = await connectListener(() => served);
    const wakes: WakeClaims[] = [];
    const a = await agent(
      config({ controller: ctl.url, dialOut: s.url, listen: { host: '127.0.0.1', port: 0 } }),
      wakes,
    );
    const port = await a.start();
    expect(await a.announced()).toBe(true);
    expect(ctl.requests.filter((r) => r.path.endsWith('/endpoint'))).toHaveLength(1);
    const dialled = await s.connection();
    expect(await dialled.nextAnswer()).toMatchObject({ type: 'ack' }); // the ping's
    await vi.waitFor(() => expect(a.parts.coalescer.lastFetchedGen).toBe(3));

    // the controller at the listener: the same wake-up there, and on the dialled connection
    const cred = pki.cred('controller', 'controller');
    const ws = new WebSocket(`wss://127.0.0.1:${port}/v1/wake`, {
      perMessageDeflate: false,
      ca: cred.ca,
      cert: cred.cert,
      key: cred.key,
      minVersion: 'TLSv1.3',
      checkServerIdentity: () => undefined,
    } as unknown as WebSocket.ClientOptions);
    ws.on('error', () => undefined);
    open.push({ close: () => ws.terminate() });
    await once(ws, 'open');
    const ask = async (frame: string): Promise<AnswerFrame> => {
      const answer = once(ws, 'message').then(([d]) => decodeAnswer(String(d)));
      ws.send(frame);
      return answer;
    };
    served = 4;
    const w = s.wake(4);
    expect((await ask(w)).type).toBe('ack');
    dialled.send(w);
    expect(await dialled.nextAnswer()).toMatchObject({ type: 'nack', error: 'replayed' });
    await vi.waitFor(() => expect(a.parts.coalescer.lastFetchedGen).toBe(4));
    await a.parts.coalescer.idle();
    // another token for the same generation, on the dialled connection: nothing left to fetch
    dialled.send(s.wake(4));
    expect(await dialled.nextAnswer()).toMatchObject({ type: 'ack', gen: 4, fetch: 'current' });
    const jti = JSON.parse(Buffer.from(w.split('.')[1]!, 'base64url').toString()).jti as string;
    expect(wakes.filter((x) => x.jti === jti)).toHaveLength(1);
    expect(wakes.filter((x) => x.gen === 4)).toHaveLength(2);
  });

  it.each([
    ['neither --listen nor --dial-out', {}, 'listen'],
    [
      '--advertise without --listen',
      { dialOut: 'wss://127.0.0.1:1/v1/connect', advertise: { host: 'a', port: 1 } },
      'advertise',
    ],
    [
      'a --dial-out URL that is not wss://host:port/v1/connect',
      { dialOut: 'https://127.0.0.1:1/v1/connect' },
      'dial-out',
    ],
    [
      'an HTTPS_PROXY that is not http://',
      { dialOut: 'wss://127.0.0.1:1/v1/connect', proxyEnv: { httpsProxy: 'socks5://p:1' } },
      'HTTPS_PROXY',
    ],
  ] as const)('refuses %s at start, naming the option (bad_option)', async (_name, over, field) => {
    const err = await assembleAgent(config({ listen: undefined, ...over }), {
      log: memoryLog().log,
      watchPki: false,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(await thrownCodeAsync(Promise.reject(err))).toBe('bad_option');
    expect((err as { field?: string }).field).toBe(field);
  });
});
