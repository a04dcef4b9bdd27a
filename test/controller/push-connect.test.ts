/**
 * Dialled-in connections at the controller (docs/protocol.md, "Dialled-in connections"): an agent
 * that cannot be dialled opens its push connection to `--connect-listen` (`wss://…/v1/connect`),
 * and the controller treats it as that node's push connection: the ping with the node's
 * generation on connect, a wake-up per change, acks recorded, fetch and signal frames answered,
 * a newer connection replacing an older one, silence read as half-open, and a stop that closes
 * them with 1012 spread over the drain window. The controller is real (API, SQLite, its own push
 * service in this process or in one or two worker processes); the agent is a bare `ws` client
 * with an agent certificate made by certs/ (test/helpers/connect-agent.ts), over TLS 1.3 on
 * 127.0.0.1.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeCertificate } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { revoke } from '../../certs/pki.js';
import { decodeControllerAnswer, FEATURE_FETCH, FEATURE_SIGNAL } from '../../protocol/frames.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { newNonce, verifyMetadataResponse } from '../../protocol/metadata.js';
import { verifySignalled } from '../../protocol/signal-answer.js';
import type { NodeView } from '../../protocol/rest.js';
import { dialIn, refusalOf, type DialledInAgent, type DialInOptions } from '../helpers/connect-agent.js';
import { startTestController, type TestController, waitFor } from '../helpers/controller-harness.js';
import { TestWakeListener } from '../helpers/wake-listener.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';

let pki: ControllerTestPki;
const running: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makeControllerTestPki();
}, 60_000);
afterEach(async () => {
  await Promise.all(running.splice(0).map((x) => x.close()));
});
afterAll(() => pki?.cleanup());

const CONTROLLER = spiffeIdOf('herald.local', 'controller', 'controller');

async function controller(
  workers: number,
  o: { silenceMs?: number; drainMs?: number } = {},
): Promise<TestController & { connectPort: number }> {
  const t = await startTestController(
    pki,
    {
      pushWorkers: workers,
      connectListen: { host: '127.0.0.1', port: 0 },
      ...(o.drainMs === undefined ? {} : { connectDrainMs: o.drainMs }),
    },
    { realPush: true, ...(o.silenceMs === undefined ? {} : { pushTuning: { connectSilenceMaxMs: o.silenceMs } }) },
  );
  running.push(t);
  return { ...t, connectPort: t.ctl.connectAddress!.port };
}

function agentOf(node: string, cred = pki.cred('agent', node)): DialInOptions {
  return { node, cred, keys: pki.keys, controller: CONTROLLER };
}

async function dial(port: number, node: string): Promise<DialledInAgent> {
  const a = await dialIn(port, agentOf(node));
  running.push(a);
  return a;
}

const op = (): ReturnType<ControllerTestPki['cred']> => pki.cred('operator', 'admin');

async function nodeView(t: TestController, node: string): Promise<NodeView> {
  const r = await t.req(op(), 'GET', `/v1/nodes/${node}`);
  expect(r.status, r.text).toBe(200);
  return r.json as NodeView;
}

/** A deployment of a one-line script on `node`: a change that gives its agent work. */
async function deploy(t: TestController, node: string): Promise<{ id: string; revision: number }> {
  const cfg = await t.req(op(), 'POST', '/v1/configs', {
    name: `c-${crypto.randomUUID()}`,
    group: 'script',
    config: 'true',
  });
  expect(cfg.status, cfg.text).toBe(201);
  const dep = await t.req(op(), 'POST', '/v1/deployments', { node, config_id: cfg.json.id, action: 'CREATE' });
  expect(dep.status, dep.text).toBe(201);
  return { id: dep.json.id as string, revision: dep.json.revision as number };
}

/** Where the connections are held: each test runs in each. */
const WHERE: Array<[string, number]> = [
  ['held in the main process (--push-workers 0)', 0],
  ['held in one push worker', 1],
  ['held in two push workers', 2],
];

describe('dialled-in connections', () => {
  it.each(WHERE)(
    '%s: an agent that dials in gets a ping with its generation, a wake-up per change, and its ack is recorded',
    async (_where, workers) => {
      const t = await controller(workers);
      expect((await t.req(op(), 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
      await deploy(t, 'n1');
      const generation = (await nodeView(t, 'n1')).generation;

      const a = await dial(t.connectPort, 'n1');
      // the upgrade offers what a dialling controller offers in its request
      expect(a.features?.split(',').map((f) => f.trim())).toEqual([FEATURE_FETCH, FEATURE_SIGNAL]);
      const ping = await a.nextWake();
      expect(ping).toMatchObject({ reason: 'ping', gen: generation, aud: spiffeIdOf('herald.local', 'agent', 'n1') });
      a.ack(ping, generation, 'started');
      const acked = await waitFor('the ack in the node view', async () => {
        const v = await nodeView(t, 'n1');
        return v.push.generation_acked === generation && v.push.connected ? v : undefined;
      });
      expect(acked.push).toMatchObject({ state: 'connected', via: 'dialled-in', generation_pushed: generation });
      expect(acked.endpoint).toBeNull(); // it announced none: nothing is ever dialled

      // a change wakes it on this connection, with the newest generation
      await deploy(t, 'n1');
      const next = (await nodeView(t, 'n1')).generation;
      expect(next).toBeGreaterThan(generation);
      const wake = await a.nextWake();
      expect(wake).toMatchObject({ reason: 'deployment', gen: next });
      a.ack(wake, next, 'started');
      await waitFor('the second ack', async () => (await nodeView(t, 'n1')).push.generation_acked === next);

      const m = (await t.req(op(), 'GET', '/metrics')).text;
      expect(m).toMatch(/^herald_push_dialled_in_agents 1$/m);
      expect(m).toMatch(/^herald_push_connected_agents 1$/m);
    },
  );

  it.each(WHERE)(
    '%s: answers a fetch frame with the signed metadata frame and a signal frame with a signed signalled frame',
    async (_where, workers) => {
      const t = await controller(workers);
      expect((await t.req(op(), 'POST', '/v1/nodes', { id: 'n2' })).status).toBe(201);
      const dep = await deploy(t, 'n2');
      const a = await dial(t.connectPort, 'n2');
      const ping = await a.nextWake();
      a.ack(ping, 0, 'started');

      const nonce = newNonce();
      a.fetch(nonce);
      const frame = decodeControllerAnswer(await a.nextAnswer());
      if (frame.type !== 'metadata') throw new Error(`a ${frame.type} frame answered a fetch`);
      expect(frame.head).toMatchObject({ nonce, status: 200 });
      const v = verifyMetadataResponse({
        status: 200,
        signature: frame.head.signature,
        body: Buffer.from(frame.body!),
        nonce,
        audience: spiffeIdOf('herald.local', 'agent', 'n2'),
        issuer: CONTROLLER,
        keys: pki.keys,
      });
      expect(v.gen).toBe(ping.gen);
      expect(v.document?.deployments.map((d) => d.deployment_id)).toEqual([dep.id]);

      const body = Buffer.from(
        JSON.stringify({ revision: dep.revision, deploy_status_code: 0, deploy_stdout: 'ok', deploy_stderr: '' }),
      );
      const sNonce = newNonce();
      a.signal(sNonce, dep.id, body);
      const answer = decodeControllerAnswer(await a.nextAnswer());
      if (answer.type !== 'signalled') throw new Error(`a ${answer.type} frame answered a signal`);
      expect(answer).toMatchObject({ nonce: sNonce, status: 200 });
      verifySignalled({
        signature: answer.signature,
        status: answer.status,
        error: answer.error,
        retryAfterS: answer.retry_after_s,
        nonce: sNonce,
        deployment: dep.id,
        revision: dep.revision,
        body,
        audience: spiffeIdOf('herald.local', 'agent', 'n2'),
        issuer: CONTROLLER,
        keys: pki.keys,
      });
      const d = await t.req(op(), 'GET', `/v1/deployments/${dep.id}`);
      expect(d.json).toMatchObject({ status: 'COMPLETE', signalled: true });
    },
  );

  it.each(WHERE)(
    '%s: a newer connection of the same node replaces the older one (close 4000 connection_replaced)',
    async (_where, workers) => {
      const t = await controller(workers);
      expect((await t.req(op(), 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
      const first = await dial(t.connectPort, 'n1');
      first.ack(await first.nextWake(), 0);
      // with two workers the second lands on the other one (they take sockets in turn)
      const second = await dial(t.connectPort, 'n1');
      expect(await first.closed).toEqual({ code: 4000, reason: 'connection_replaced' });
      const ping = await second.nextWake();
      expect(ping.reason).toBe('ping');
      second.ack(ping, 0);
      // the node's wake-ups go to the newer connection alone
      await deploy(t, 'n1');
      const wake = await second.nextWake();
      expect(wake.reason).toBe('deployment');
      second.ack(wake, wake.gen);
      const v = await waitFor('the node held by the newer connection', async () => {
        const n = await nodeView(t, 'n1');
        return n.push.generation_acked === wake.gen && n.push.connected ? n : undefined;
      });
      expect(v.push.via).toBe('dialled-in');
      expect((await t.req(op(), 'GET', '/metrics')).text).toMatch(/^herald_push_dialled_in_agents 1$/m);
    },
  );

  it.each(WHERE)(
    '%s: a connection silent for the silence limit is half-open: destroyed, the node reads half_open, and no ping came from the controller',
    async (_where, workers) => {
      const t = await controller(workers, { silenceMs: 400 });
      expect((await t.req(op(), 'GET', '/v1/nodes')).status).toBe(200);
      expect((await t.req(op(), 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
      const a = await dial(t.connectPort, 'n1');
      let pings = 0;
      a.ws.on('ping', () => pings++);
      a.ack(await a.nextWake(), 0);
      // from now on the agent says nothing: no ping, no frame
      const closed = await a.closed;
      expect(closed.code).toBe(1006); // destroyed, not closed
      const v = await waitFor('the half-open state', async () => {
        const n = await nodeView(t, 'n1');
        return n.push.state === 'half_open' ? n : undefined;
      });
      expect(v.push).toMatchObject({ connected: false, via: null, last_error: 'half_open' });
      expect(pings).toBe(0);
    },
  );

  it.each(WHERE)(
    '%s: an open connection whose agent certificate gets revoked is closed (1008 revoked), and its next one refused 403 revoked',
    async (_where, workers) => {
      const name = `rl${workers}`;
      const cred = await pki.issueAgent(name);
      const t = await controller(workers);
      expect((await t.req(op(), 'POST', '/v1/nodes', { id: name })).status).toBe(201);
      const a = await dialIn(t.connectPort, agentOf(name, cred));
      running.push(a);
      a.ack(await a.nextWake(), 0);
      // revoked.json changes on disk: the process holding the connection reads it again
      await revoke({ dir: pki.dir, target: name });
      expect(await a.closed).toEqual({ code: 1008, reason: 'revoked' });
      expect(await refusalOf(t.connectPort, agentOf(name, cred))).toEqual({ status: 403, code: 'revoked' });
      const v = await waitFor('the node disconnected', async () => {
        const n = await nodeView(t, name);
        return n.push.connected ? undefined : n;
      });
      expect(v.push.last_error).toBe('revoked');
    },
  );

  // n2: with two workers its shard is worker 1, and the first socket goes to worker 0
  it.each(WHERE)(
    '%s: an agent with an announced endpoint too: dialled until it dials in, then pushed to there alone, and dialled again once that connection ends',
    async (_where, workers) => {
      const t = await controller(workers);
      const listener = await TestWakeListener.start({ pkiDir: pki.dir, node: 'n2' });
      running.push(listener);
      const dialled = new Promise<void>((resolve) => listener.once('wake', () => resolve()));
      const put = await t.req(pki.cred('agent', 'n2'), 'PUT', '/v1/nodes/n2/endpoint', { url: listener.url });
      expect(put.status, put.text).toBe(200);
      await dialled;
      const firstClosed = new Promise<number>((resolve) => listener.once('close', resolve));
      const a = await dial(t.connectPort, 'n2');
      a.ack(await a.nextWake(), 0);
      // the dialled connection goes (1001): one push connection per node
      expect(await firstClosed).toBe(1001);
      await deploy(t, 'n2');
      const wake = await a.nextWake();
      expect(wake.reason).toBe('deployment');
      a.ack(wake, wake.gen);
      expect((await nodeView(t, 'n2')).push.via).toBe('dialled-in');
      expect(listener.connections).toBe(1);
      // the agent's dialled-in connection ends: the controller dials its listener again
      const redialled = new Promise<void>((resolve) => listener.once('connection', () => resolve()));
      await a.close();
      await redialled;
      const v = await waitFor('the node dialled again', async () => {
        const n = await nodeView(t, 'n2');
        return n.push.connected && n.push.via === 'dialled' ? n : undefined;
      });
      expect(v.push.state).toBe('connected');
      expect(listener.connections).toBe(2);
    },
  );

  it.each(WHERE)(
    '%s: a stop closes the dialled-in connections with 1012, spread over the drain window',
    async (_where, workers) => {
      const drainMs = 600;
      const t = await controller(workers, { drainMs });
      const nodes = ['n1', 'n2', 'n3'];
      const agents: DialledInAgent[] = [];
      for (const n of nodes) {
        expect((await t.req(op(), 'POST', '/v1/nodes', { id: n })).status).toBe(201);
        const a = await dial(t.connectPort, n);
        a.ack(await a.nextWake(), 0);
        agents.push(a);
      }
      const at: number[] = [];
      const closes = agents.map((a) =>
        a.closed.then((c) => {
          at.push(performance.now());
          return c;
        }),
      );
      const t0 = performance.now();
      running.splice(running.indexOf(t), 1);
      await t.close();
      for (const c of await Promise.all(closes)) expect(c).toEqual({ code: 1012, reason: 'shutting_down' });
      at.sort((x, y) => x - y);
      // the i-th of n is closed at i/n of the window: timers never fire early, so the last one
      // came no sooner than 2/3 of the window after the stop began
      expect(at[2]! - t0).toBeGreaterThanOrEqual((drainMs * 2) / 3 - 5);
      // and the listener took no new connection meanwhile: the port is closed
      await expect(dialIn(t.connectPort, agentOf('n1'))).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    },
  );
});

describe('dialled-in connections refused before the upgrade', () => {
  /** A controller serving them in its main process, and one in a push worker: each case is tried on both. */
  const both: Array<TestController & { connectPort: number; workers: number }> = [];
  const HANDSHAKE_MS = 1_500;
  const MAX_PENDING = 4;
  beforeAll(async () => {
    // an agent revoked before the controllers start
    await pki.issueAgent('rv1');
    await revoke({ dir: pki.dir, target: 'agent/rv1' });
    for (const workers of [0, 1]) {
      const c = await startTestController(
        pki,
        { pushWorkers: workers, connectListen: { host: '127.0.0.1', port: 0 } },
        { realPush: true, pushTuning: { connectHandshakeTimeoutMs: HANDSHAKE_MS, connectMaxPending: MAX_PENDING } },
      );
      both.push({ ...c, connectPort: c.ctl.connectAddress!.port, workers });
      expect((await c.req(op(), 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
    }
  }, 30_000);
  afterAll(async () => {
    await Promise.all(both.map((t) => t.close()));
  });

  const ca = (): { cert: string; key: string } => {
    const p = pkiPaths(pki.dir);
    return { cert: fs.readFileSync(p.caCrt, 'utf8'), key: fs.readFileSync(p.caKey, 'utf8') };
  };

  /** The count of `herald_push_connect_refusals_total{code}` at `t`. */
  async function refusals(t: TestController, code: string): Promise<number> {
    const text = (await t.req(op(), 'GET', '/metrics')).text;
    return Number(
      new RegExp(`^herald_push_connect_refusals_total\\{code="${code}"\\} (\\d+)$`, 'm').exec(text)?.[1] ?? 0,
    );
  }

  it.each([
    ['no client certificate', () => ({ ca: pki.ca }), 'no_client_certificate'],
    ["a controller's certificate (controller/controller)", () => pki.cred('controller', 'controller'), 'wrong_role'],
    ["an operator's certificate (operator/admin)", () => pki.cred('operator', 'admin'), 'wrong_role'],
    ['a revoked agent certificate', () => pki.cred('agent', 'rv1'), 'revoked'],
    [
      'an agent certificate of another trust domain, from the cluster CA',
      () => {
        const m = makeCertificate({
          issuer: ca(),
          uris: ['spiffe://evil.example/agent/n1'],
          ip: ['127.0.0.1'],
          eku: { serverAuth: true, clientAuth: true },
        });
        return { ca: pki.ca, cert: Buffer.from(m.cert), key: Buffer.from(m.key) };
      },
      'wrong_trust_domain',
    ],
    ['a certificate from a foreign CA', () => pki.foreignOperator, 'untrusted_certificate'],
  ])('%s is 403 with its code, and counted, in the main process and in a push worker', async (_what, cred, code) => {
    const c = cred();
    for (const t of both) {
      const before = await refusals(t, code);
      expect(await refusalOf(t.connectPort, agentOf('n1', c)), `workers ${t.workers}`).toEqual({ status: 403, code });
      await waitFor('the refusal counted', async () => (await refusals(t, code)) > before);
      expect((await t.req(op(), 'GET', '/metrics')).text).toMatch(/^herald_push_dialled_in_agents 0$/m);
    }
  });

  it('another path is 404 not_found for a valid agent, in the main process and in a push worker', async () => {
    for (const t of both)
      expect(await refusalOf(t.connectPort, { ...agentOf('n1'), path: '/v1/wake' })).toEqual({
        status: 404,
        code: 'not_found',
      });
  });

  it('sockets past the pending cap are cut at accept, idle ones at the handshake bound, and a valid agent connects once they are gone, in the main process and in a push worker', async () => {
    for (const t of both) {
      const cutBefore = await refusals(t, 'too_many_connections');
      const timedOutBefore = await refusals(t, 'handshake_timeout');
      const closedOrder: number[] = [];
      const idle = Array.from({ length: MAX_PENDING + 1 }, (_, i) => {
        const s = net.connect(t.connectPort, '127.0.0.1');
        s.on('error', () => {});
        const closed = new Promise<void>((resolve) =>
          s.once('close', () => {
            closedOrder.push(i);
            resolve();
          }),
        );
        return { s, closed, connected: new Promise<void>((r) => s.once('connect', () => r())) };
      });
      // the first MAX_PENDING connect and say nothing; the last one over the cap is cut at once
      for (const x of idle) await x.connected;
      await idle[MAX_PENDING]!.closed;
      expect(closedOrder).toEqual([MAX_PENDING]);
      await waitFor('the cut counted', async () => (await refusals(t, 'too_many_connections')) > cutBefore);
      // the silent ones are destroyed at the handshake bound
      await Promise.all(idle.map((x) => x.closed));
      await waitFor(
        'the timeouts counted',
        async () => (await refusals(t, 'handshake_timeout')) >= timedOutBefore + MAX_PENDING,
      );
      const a = await dial(t.connectPort, 'n1');
      expect((await a.nextWake()).reason).toBe('ping');
      await a.close();
    }
  });
});
