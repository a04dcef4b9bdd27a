/**
 * Results and the push connection: a peer that holds a controller TLS certificate (the real
 * `controller/controller`, or another controller of `--controller-id`) but not the signing key
 * connects to a real `bin/herald agent`'s listener, offers to take signals, and keeps itself the
 * connection heard from last (it pings every 10 ms). While the agent runs a deployment of the real
 * controller (a real process), the peer must receive no result data: no signal frame, no byte of
 * the run's stdout, and the real controller records the result within a bound. A peer that also
 * holds a signing key proves its connection with a wake-up, but only while that key is trusted:
 * once the operator revokes it, the agent's next signal goes over HTTPS to the real controller.
 * (An answer not signed for the signal it answers is not taken: test/agent/push-fetch.test.ts.)
 */
import crypto from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { newSigningJwk } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { decodeAgentFrame, encodeSignalled, FEATURE_SIGNAL, FEATURES_HEADER } from '../../protocol/frames.js';
import { Signer } from '../../protocol/jws.js';
import { signSignalled } from '../../protocol/signal-answer.js';
import { Battery, isBuilt, waitFor, type AgentProc, type Cred } from './helpers/battery.js';
import { freePort } from '../helpers/procs.js';
import { validWake } from './helpers/wire.js';

const built = isBuilt();
/** How long the real controller may take to record a result, start of the run to COMPLETE. */
const RESULT_BOUND_MS = 20_000;
let b: Battery;
/** Pushed to by the real controller: the holder is a second controller connection. */
let r1: AgentProc;
/** Never reached by the real controller (it advertises a dead port): the holder is its only connection. */
let r2: AgentProc;

beforeAll(async () => {
  if (!built) return;
  b = await Battery.create();
  await b.issue('controller', 'c2');
  await b.startController();
  r1 = await b.startAgent('r1');
  r2 = await b.startAgent('r2', {
    // polls every second over HTTPS, push connection or not: the holder's pings make push look healthy
    extra: ['--advertise', `127.0.0.1:${await freePort()}`, '--poll-interval', '1s', '--poll-interval-healthy', '1s'],
    waitAnnounce: false,
  });
  await waitFor('r2 to announce its endpoint', () => r2.lines().some((l) => l.msg === 'endpoint announced'));
}, 120_000);

afterAll(async () => {
  await b?.close();
});

interface Holder {
  ws: WebSocket;
  /** Every frame the agent sent it, as text. */
  frames: string[];
  /** How many signal frames it was sent (and answered). */
  signals: number;
  close(): void;
}

/**
 * A controller TLS certificate without the signing key, on `port`: offers signals, answers each
 * one with `answer`, and pings every 10 ms to stay the connection the agent heard from last.
 */
async function holder(port: number, c: Cred, answer: (nonce: string, deployment: string, body: Buffer) => string) {
  const ws = new WebSocket(`wss://127.0.0.1:${port}/v1/wake`, {
    perMessageDeflate: false,
    ca: c.ca,
    cert: c.cert,
    key: c.key,
    minVersion: 'TLSv1.3',
    checkServerIdentity: () => undefined,
    headers: { [FEATURES_HEADER]: FEATURE_SIGNAL },
  } as unknown as WebSocket.ClientOptions);
  ws.on('error', () => undefined);
  const h: Holder = {
    ws,
    frames: [],
    signals: 0,
    close: () => {
      clearInterval(pinger);
      ws.terminate();
    },
  };
  ws.on('message', (d: Buffer) => {
    h.frames.push(d.toString('utf8'));
    try {
      const f = decodeAgentFrame(d);
      if (f.type !== 'signal') return;
      h.signals++;
      ws.send(answer(f.nonce, f.deployment, f.body));
    } catch {
      // an ack or nack of its own frames
    }
  });
  await once(ws, 'open');
  const pinger = setInterval(() => ws.readyState === WebSocket.OPEN && ws.ping(), 10);
  return h;
}

/**
 * Deploys to `a` a script that prints `secret`, then waits for the test's gate; `beforeGate` runs
 * once the script has started (its metadata fetched), then the gate opens. Resolves with the
 * deployment as the controller has it once COMPLETE or FAILED, within RESULT_BOUND_MS.
 */
async function deployGated(
  a: AgentProc,
  secret: string,
  beforeGate: () => Promise<void>,
): Promise<Record<string, any>> {
  const dir = fs.mkdtempSync(path.join(b.work, `gate-${a.node}-`));
  fs.chmodSync(dir, 0o777);
  const started = path.join(dir, 'started');
  const gate = path.join(dir, 'gate');
  const cfg = await b.asOperator('POST', '/v1/configs', {
    name: `result-${a.node}`,
    group: 'script',
    config: `#!/bin/sh\necho ${secret}\ntouch ${started}\nwhile [ ! -e ${gate} ]; do sleep 0.02; done\necho done\n`,
  });
  expect(cfg.status, cfg.raw).toBe(201);
  const d = await b.asOperator('POST', '/v1/deployments', { node: a.node, config_id: cfg.json.id });
  expect(d.status, d.raw).toBe(201);
  const t0 = Date.now();
  await waitFor(`the run on ${a.node} to start`, () => fs.existsSync(started), RESULT_BOUND_MS);
  await beforeGate();
  fs.writeFileSync(gate, '');
  return waitFor(
    `the controller to record ${a.node}'s result`,
    async () => {
      const r = await b.asOperator('GET', `/v1/deployments/${d.json.deployment_id as string}`);
      return ['COMPLETE', 'FAILED'].includes(r.json?.status) ? (r.json as Record<string, any>) : null;
    },
    Math.max(1, RESULT_BOUND_MS - (Date.now() - t0)),
    50,
  );
}

/** The holder is heard from last: its ping answered after everything the real controller sent. */
async function heardFromLast(h: Holder): Promise<void> {
  h.ws.ping();
  await once(h.ws, 'pong');
}

describe.skipIf(!built)('results channel: a controller TLS key without the signing key', () => {
  it('heard from last beside the real controller, having delivered no verified wake-up, it is sent no signal and no result data: the controller records the result', async () => {
    const secret = `RESULT-${crypto.randomBytes(8).toString('hex')}`;
    const h = await holder(r1.port, b.cred('controller', 'c2'), (nonce) => encodeSignalled({ nonce, status: 200 }));
    try {
      const d = await deployGated(r1, secret, () => heardFromLast(h));
      expect(d.status, d.status_reason).toBe('COMPLETE');
      expect(String(d.output_values?.deploy_stdout)).toContain(secret);
      expect(h.signals).toBe(0);
      expect(h.frames.filter((f) => f.includes(secret))).toEqual([]);
      expect(h.ws.readyState).toBe(WebSocket.OPEN);
    } finally {
      h.close();
    }
  });

  it("as the agent's only push connection (controller/controller), with wake-ups and answers signed by a key the agent does not trust, it gets no result data: the result goes over HTTPS", async () => {
    const secret = `RESULT-${crypto.randomBytes(8).toString('hex')}`;
    const wrong = new Signer({ ...newSigningJwk(), kid: b.signingJwk.kid });
    const iss = b.spiffe('controller', 'controller');
    const aud = b.spiffe('agent', 'r2');
    const h = await holder(r2.port, b.cred('controller', 'controller'), (nonce, deployment, body) => {
      const signature = signSignalled(wrong, {
        iss,
        aud,
        nonce,
        deployment,
        body,
        status: 200,
        nowS: Date.now() / 1000,
      });
      return encodeSignalled({ nonce, status: 200, signature });
    });
    try {
      // a wake-up it signs is refused, and proves nothing
      const nacked = once(h.ws, 'message');
      h.ws.send(validWake(wrong, iss, aud, 1_000_000, 'ping'));
      expect(JSON.parse(String((await nacked)[0]))).toMatchObject({ type: 'nack', error: 'bad_signature' });
      const d = await deployGated(r2, secret, () => heardFromLast(h));
      expect(d.status, d.status_reason).toBe('COMPLETE');
      expect(String(d.output_values?.deploy_stdout)).toContain(secret);
      expect(h.signals).toBe(0);
      expect(h.frames.filter((f) => f.includes(secret))).toEqual([]);
    } finally {
      h.close();
    }
  });
});

describe.skipIf(!built)('results channel: a controller TLS key and a signing key, the key then revoked', () => {
  it('proven by a wake-up signed with the stolen key, the connection is proven no more once that kid is revoked in revoked.json: the next signal goes over HTTPS', async () => {
    const secret = `RESULT-${crypto.randomBytes(8).toString('hex')}`;
    const stolen = b.signerOf('c2');
    const iss = b.spiffe('controller', 'c2');
    const aud = b.spiffe('agent', 'r2');
    const h = await holder(r2.port, b.cred('controller', 'c2'), (nonce, deployment, body) => {
      const signature = signSignalled(stolen, {
        iss,
        aud,
        nonce,
        deployment,
        body,
        status: 200,
        nowS: Date.now() / 1000,
      });
      return encodeSignalled({ nonce, status: 200, signature });
    });
    try {
      const acked = once(h.ws, 'message');
      h.ws.send(validWake(stolen, iss, aud, 1_000_000, 'ping'));
      expect(JSON.parse(String((await acked)[0]))).toMatchObject({ type: 'ack' });
      // the operator revokes the stolen key (c2's certificate stays valid)
      const reloads = r2.lines().filter((l) => l.msg === 'revoked.json reloaded').length;
      const revokedPath = pkiPaths(b.pkiDir).revoked;
      const r = JSON.parse(fs.readFileSync(revokedPath, 'utf8')) as { serials: string[]; kids: string[] };
      fs.writeFileSync(revokedPath, JSON.stringify({ ...r, kids: [...r.kids, stolen.kid] }));
      await waitFor(
        'r2 to reload revoked.json',
        () => r2.lines().filter((l) => l.msg === 'revoked.json reloaded').length > reloads,
      );
      const d = await deployGated(r2, secret, () => heardFromLast(h));
      expect(d.status, d.status_reason).toBe('COMPLETE');
      expect(String(d.output_values?.deploy_stdout)).toContain(secret);
      expect(h.signals).toBe(0);
      expect(h.frames.filter((f) => f.includes(secret))).toEqual([]);
      expect(r2.lines().some((l) => l.code === 'unknown_kid' && l.kid === stolen.kid)).toBe(true);
      expect(h.ws.readyState).toBe(WebSocket.OPEN);
    } finally {
      h.close();
    }
  });
});

describe.skipIf(!built)('results channel: teardown', () => {
  it('leaves no process, socket or temp file behind', async () => {
    await b.close();
    expect(await b.leftovers()).toEqual([]);
  });
});
