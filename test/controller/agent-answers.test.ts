/**
 * The answers to an agent's fetch and signal have one home (controller/service/agent-answers.ts):
 * the HTTPS route (real TLS on 127.0.0.1) and a frame on the push connection (the handler the
 * controller gives its push service, called as the dialer would) get the same answer for the same
 * node state, from a real controller on a SQLite file in a temp dir.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newNonce, sha256b64url, verifyMetadataResponse } from '../../protocol/metadata.js';
import type { PushReply, PushRequestHandler } from '../../controller/push/types.js';
import { startTestController, type Res, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';

let cpki: ControllerTestPki;
let t: TestController;
let agent: Cred;
let op: Cred;
let push: PushRequestHandler;

beforeAll(async () => {
  cpki = await makeControllerTestPki();
  t = await startTestController(cpki);
  agent = cpki.cred('agent', 'n1');
  op = cpki.cred('operator', 'admin');
  push = t.push.requestHandler!;
  expect((await t.req(op, 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
}, 60_000);
afterAll(async () => {
  await t?.close();
  cpki?.cleanup();
});

/** A deployment of `node`, made by the operator. */
async function deploy(node: string): Promise<string> {
  const cfg = await t.req(op, 'POST', '/v1/configs', { name: 'c', group: 'script', config: 'true' });
  const dep = await t.req(op, 'POST', '/v1/deployments', { node, config_id: cfg.json.id, action: 'CREATE' });
  expect(dep.status, dep.text).toBe(201);
  return dep.json.id as string;
}

/** Checks a metadata answer's signature for n1 and this nonce; its generation. */
function verified(status: 200 | 304, signature: string | undefined, nonce: string, body?: Uint8Array): number {
  return verifyMetadataResponse({
    status,
    signature,
    ...(body === undefined ? {} : { body: Buffer.from(body) }),
    nonce,
    audience: cpki.spiffe('agent', 'n1'),
    issuer: cpki.spiffe('controller', 'controller'),
    keys: cpki.keys,
  }).gen;
}

/** The HTTPS fetch of n1's metadata. */
function fetchHttps(nonce: string, ifNoneMatch?: string): Promise<Res> {
  return t.req(agent, 'GET', '/v1/nodes/n1/metadata', undefined, {
    headers: { 'herald-nonce': nonce, ...(ifNoneMatch === undefined ? {} : { 'if-none-match': ifNoneMatch }) },
  });
}

/** An HTTPS answer in the push reply's terms: its status and error code. */
function asReply(r: Res): PushReply {
  return r.status < 300 ? { status: r.status } : { status: r.status, error: r.json?.error?.code };
}

describe('one answer to an agent, over HTTPS and over its push connection', () => {
  it('a fetch: the same 200 (ETag, body bytes and digest, signed generation), then the same 304 for that ETag', async () => {
    await deploy('n1');
    const httpsNonce = newNonce();
    const pushNonce = newNonce();
    const https = await fetchHttps(httpsNonce);
    const overPush = await push({ kind: 'fetch', node: 'n1', nonce: pushNonce, ifNoneMatch: null });
    expect(https.status, https.text).toBe(200);
    expect(overPush.status).toBe(200);
    expect(overPush.etag).toBe(https.headers.etag);
    expect(sha256b64url(overPush.body!)).toBe(sha256b64url(https.raw));
    expect(Buffer.compare(Buffer.from(overPush.body!), https.raw)).toBe(0);
    const gen = verified(200, https.headers['herald-signature'] as string, httpsNonce, https.raw);
    expect(verified(200, overPush.signature, pushNonce, overPush.body)).toBe(gen);
    expect(https.headers.etag).toBe(`"${gen}"`);
    // the module itself, as both call it
    const direct = await t.ctl.answers.metadata('n1', cpki.spiffe('agent', 'n1'), undefined, undefined, 'https');
    expect(direct).toMatchObject({ status: 200, etag: https.headers.etag });
    expect(direct.status === 200 && sha256b64url(direct.body)).toBe(sha256b64url(https.raw));

    const etag = https.headers.etag as string;
    const https304 = await fetchHttps(httpsNonce, etag);
    const push304 = await push({ kind: 'fetch', node: 'n1', nonce: pushNonce, ifNoneMatch: etag });
    expect(https304.status).toBe(304);
    expect(https304.raw.length).toBe(0);
    expect(push304).toMatchObject({ status: 304, etag });
    expect(push304.body).toBeUndefined();
    expect(https304.headers.etag).toBe(etag);
    expect(verified(304, https304.headers['herald-signature'] as string, httpsNonce)).toBe(gen);
    expect(verified(304, push304.signature, pushNonce)).toBe(gen);
  });

  it('a fetch for a deleted node: the same refusal', async () => {
    const n = 'n2';
    expect((await t.req(op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
    expect((await t.req(op, 'DELETE', `/v1/nodes/${n}`)).status).toBe(204);
    const https = await t.req(cpki.cred('agent', n), 'GET', `/v1/nodes/${n}/metadata`);
    const overPush = await push({ kind: 'fetch', node: n, nonce: newNonce(), ifNoneMatch: null });
    expect(asReply(https)).toEqual({ status: 403, error: 'node_deleted' });
    expect(overPush).toEqual(asReply(https));
  });

  it('a signal: the same result recorded, and the same status and code for the same state', async () => {
    const viaHttps = await deploy('n1');
    const viaPush = await deploy('n1');
    const result = { revision: 1, deploy_status_code: 0, deploy_stdout: 'out', deploy_stderr: '', outputs: {} };
    const signalHttps = (id: string, body: unknown) =>
      t.req(agent, 'POST', `/v1/nodes/n1/deployments/${id}/signal`, body).then(asReply);
    const signalPush = (id: string, body: unknown) =>
      push({ kind: 'signal', node: 'n1', deploymentId: id, body: Buffer.from(JSON.stringify(body)) });

    // recorded: each way on a deployment of its own, the views alike
    expect(await signalHttps(viaHttps, result)).toEqual({ status: 200 });
    expect(await signalPush(viaPush, result)).toEqual({ status: 200 });
    const view = async (id: string) => {
      const v = (await t.req(op, 'GET', `/v1/deployments/${id}`)).json;
      return { status: v.status, signalled: v.signalled, output_values: v.output_values };
    };
    expect(await view(viaPush)).toEqual(await view(viaHttps));
    expect(await view(viaHttps)).toMatchObject({ status: 'COMPLETE', signalled: true });

    // the same state, the same answer: a repeat, a revision not made, another body, no such deployment
    for (const [id, body] of [
      [viaHttps, { ...result, deploy_status_code: 3 }],
      [viaHttps, { ...result, revision: 2 }],
      [viaHttps, { revision: 'one' }],
      ['no-such-deployment', result],
    ] as const) {
      const https = await signalHttps(id, body);
      expect(await signalPush(id, body), JSON.stringify(body)).toEqual(https);
    }
    expect(await signalHttps(viaHttps, { ...result, revision: 2 })).toEqual({ status: 409, error: 'unknown_revision' });
    expect(await signalHttps('no-such-deployment', result)).toEqual({ status: 404, error: 'not_found' });
  });
});
