/**
 * The controller API over real TLS on 127.0.0.1:0 with certificates made by certs/: every
 * route, each refusal with its code, validation fields, body limits, ETag/304 with verifiable
 * signatures, Heat-shaped metadata, signals, and hidden inputs kept out of responses, events and
 * logs.
 */
import https from 'node:https';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { verifyMetadataResponse, newNonce } from '../../protocol/metadata.js';
import { DERIVED_INPUT_NAMES } from '../../protocol/heat.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import {
  PushStub,
  request,
  startTestController,
  waitFor,
  type Res,
  type TestController,
} from '../helpers/controller-harness.js';
import { freePort } from '../helpers/procs.js';

let pki: ControllerTestPki;
let t: TestController;
let op: Cred, n1: Cred, n2: Cred, n3: Cred, ctlCred: Cred;

const GENEROUS = { burst: 10_000, perS: 10_000 };

beforeAll(async () => {
  pki = await makeControllerTestPki();
  op = pki.cred('operator', 'admin');
  n1 = pki.cred('agent', 'n1');
  n2 = pki.cred('agent', 'n2');
  n3 = pki.cred('agent', 'n3');
  ctlCred = pki.cred('controller', 'controller');
  t = await startTestController(pki, {}, { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS } });
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

function expectError(r: Res, status: number, code: string, field?: string): void {
  expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status, code });
  if (field !== undefined) expect(r.json.error.field).toBe(field);
  expect(r.headers['cache-control']).toBe('no-store');
  expect(r.headers['x-content-type-options']).toBe('nosniff');
}

async function mkConfig(body: Record<string, unknown>): Promise<string> {
  const r = await t.req(op, 'POST', '/v1/configs', body);
  expect(r.status, r.text).toBe(201);
  return r.json.id as string;
}

async function mkDeployment(body: Record<string, unknown>): Promise<Record<string, any>> {
  const r = await t.req(op, 'POST', '/v1/deployments', body);
  expect(r.status, r.text).toBe(201);
  return r.json;
}

async function fetchMetadata(
  cred: Cred,
  node: string,
  headers: Record<string, string> = {},
): Promise<{ r: Res; nonce: string }> {
  const nonce = newNonce();
  const r = await t.req(cred, 'GET', `/v1/nodes/${node}/metadata`, undefined, {
    headers: { 'herald-nonce': nonce, ...headers },
  });
  return { r, nonce };
}

function verify(r: Res, nonce: string, node: string) {
  return verifyMetadataResponse({
    status: r.status as 200 | 304,
    signature: r.headers['herald-signature'] as string | undefined,
    ...(r.status === 200 ? { body: r.raw } : {}),
    nonce,
    audience: pki.spiffe('agent', node),
    issuer: pki.spiffe('controller', 'controller'),
    keys: pki.keys,
  });
}

async function announce(cred: Cred, node: string, url = 'wss://127.0.0.1:7443/v1/wake'): Promise<Res> {
  return t.req(cred, 'PUT', `/v1/nodes/${node}/endpoint`, { url });
}

describe('authorization before routing', () => {
  it('refuses a client without a certificate with 403 no_client_certificate, even on /healthz', async () => {
    expectError(await t.req(pki.noCert, 'GET', '/healthz'), 403, 'no_client_certificate');
    expectError(await t.req(pki.noCert, 'GET', '/v1/nodes'), 403, 'no_client_certificate');
  });

  it('refuses a certificate from a second CA', async () => {
    expectError(await t.req(pki.foreignOperator, 'GET', '/v1/nodes'), 403, 'untrusted_certificate');
  });

  it('refuses a self-signed certificate forging the operator URI', async () => {
    expectError(await t.req(pki.forgedOperator, 'GET', '/v1/nodes'), 403, 'untrusted_certificate');
  });

  it('serves /healthz on the TLS port to any valid identity', async () => {
    for (const c of [op, n1, ctlCred]) {
      const r = await t.req(c, 'GET', '/healthz');
      expect(r.status).toBe(200);
      expect(r.json).toEqual({ status: 'ok' });
    }
  });

  it('answers /healthz 503 starting until the controller has started, 200 ok, then 503 stopping', async () => {
    let open!: () => void;
    const stub = new PushStub();
    stub.startGate = new Promise<void>((r) => {
      open = r;
    });
    const port = await freePort();
    const starting = startTestController(pki, { listen: { host: '127.0.0.1', port } }, { pushStub: stub });
    starting.catch(() => {}); // (awaited below; a start that fails while the check polls is reported there)
    try {
      // the API listens before the service starts; the push service's start is held
      const r = await waitFor('the API to listen', () => request(port, op, 'GET', '/healthz').catch(() => null));
      expect(r.status).toBe(503);
      expect(r.json).toEqual({ status: 'starting' });
      expect(r.headers['retry-after']).toBe('1');
      expect(stub.started).toBeNull();
    } finally {
      open();
    }
    const c = await starting;
    try {
      const r = await c.req(op, 'GET', '/healthz');
      expect(r.status).toBe(200);
      expect(r.json).toEqual({ status: 'ok' });
      // close() says so first, while the API drains its requests
      c.ctl.service.beginStop();
      const s = await c.req(op, 'GET', '/healthz');
      expect(s.status).toBe(503);
      expect(s.json).toEqual({ status: 'stopping' });
    } finally {
      await c.close();
    }
  });

  it('refuses agent and controller certificates on operator routes (wrong_role)', async () => {
    expectError(await t.req(n1, 'GET', '/v1/nodes'), 403, 'wrong_role');
    expectError(await t.req(ctlCred, 'GET', '/v1/nodes'), 403, 'wrong_role');
    expectError(
      await t.req(ctlCred, 'POST', '/v1/configs', { name: 'x', group: 'script', config: 'x' }),
      403,
      'wrong_role',
    );
    expectError(await t.req(ctlCred, 'GET', '/metrics'), 403, 'wrong_role');
  });

  it('refuses operator and controller certificates on agent routes (wrong_role)', async () => {
    expectError(await t.req(op, 'GET', '/v1/nodes/n1/metadata'), 403, 'wrong_role');
    expectError(
      await t.req(ctlCred, 'PUT', '/v1/nodes/n1/endpoint', { url: 'wss://127.0.0.1:1/v1/wake' }),
      403,
      'wrong_role',
    );
  });

  it('answers unknown routes 404 and wrong methods 405, with the headers', async () => {
    expectError(await t.req(op, 'GET', '/v1/nope'), 404, 'not_found');
    const r = await t.req(op, 'PUT', '/v1/configs');
    expectError(r, 405, 'method_not_allowed');
    expect(r.headers.allow).toContain('POST');
  });

  it('logs refusals with code and peer identity', async () => {
    await t.req(n2, 'GET', '/v1/nodes/n1/metadata');
    const line = t.logLines().find((l) => l.event === 'refused' && l.code === 'wrong_node');
    expect(line).toMatchObject({ peer: pki.spiffe('agent', 'n2'), status: 403 });
  });
});

describe('endpoint announcements', () => {
  it('registers the node on first announce and keeps the URL', async () => {
    const r = await announce(n1, 'n1', 'wss://127.0.0.1:7443/v1/wake');
    expect(r.status, r.text).toBe(200);
    expect(r.json).toMatchObject({ id: 'n1', endpoint: 'wss://127.0.0.1:7443/v1/wake' });
    expect(t.push.endpoints.at(-1)).toMatchObject({ node: 'n1', url: 'wss://127.0.0.1:7443/v1/wake' });
    const again = await announce(n1, 'n1', 'wss://localhost:7444/v1/wake');
    expect(again.json.endpoint).toBe('wss://localhost:7444/v1/wake');
    expect(t.push.endpoints.at(-1)).toMatchObject({ node: 'n1', url: 'wss://localhost:7444/v1/wake' });
    const n = await t.req(op, 'GET', '/v1/nodes/n1');
    expect(n.json.endpoint).toBe('wss://localhost:7444/v1/wake');
    expect(n.json.push).toMatchObject({ state: 'idle', connected: false });
  });

  it('refuses announcing another node (wrong_node)', async () => {
    expectError(await announce(n2, 'n1'), 403, 'wrong_node');
  });

  it('refuses a host that is not among the caller certificate SANs', async () => {
    expectError(await announce(n1, 'n1', 'wss://10.1.2.3:7443/v1/wake'), 403, 'endpoint_not_in_san', 'url');
    expectError(await announce(n1, 'n1', 'wss://evil.example:7443/v1/wake'), 403, 'endpoint_not_in_san', 'url');
    expectError(await announce(n3, 'n3', 'wss://127.0.0.1:7443/v1/wake'), 403, 'endpoint_not_in_san');
    expect((await announce(n3, 'n3', 'wss://n3.example:7443/v1/wake')).status).toBe(200);
  });

  it('refuses link-local endpoints and malformed URLs', async () => {
    const ll = await pki.issueAgent('ll', { ip: ['169.254.169.254', 'fe80::1'], dns: [] });
    expectError(
      await t.req(ll, 'PUT', '/v1/nodes/ll/endpoint', { url: 'wss://169.254.169.254:7443/v1/wake' }),
      400,
      'link_local_endpoint',
      'url',
    );
    expectError(
      await t.req(ll, 'PUT', '/v1/nodes/ll/endpoint', { url: 'wss://[fe80::1]:7443/v1/wake' }),
      400,
      'link_local_endpoint',
      'url',
    );
    expectError(await announce(n1, 'n1', 'ws://127.0.0.1:7443/v1/wake'), 400, 'bad_endpoint', 'url');
    expectError(await announce(n1, 'n1', 'wss://127.0.0.1:7443/other'), 400, 'bad_endpoint', 'url');
    expectError(await t.req(n1, 'PUT', '/v1/nodes/n1/endpoint', { uri: 'x' }), 400, 'invalid_request');
  });

  it('keeps a deleted node refused until an operator adds it again, with a higher generation', async () => {
    const before = (await announce(n2, 'n2')).json;
    const gen0 = before.generation as number;
    expect((await t.req(op, 'DELETE', '/v1/nodes/n2')).status).toBe(204);
    expect(t.push.removed).toContain('n2');
    expectError(await announce(n2, 'n2'), 403, 'node_deleted');
    expectError((await fetchMetadata(n2, 'n2')).r, 403, 'node_deleted');
    const again = await t.req(op, 'POST', '/v1/nodes', { id: 'n2' });
    expect(again.status).toBe(201);
    expect(again.headers.location).toBe('/v1/nodes/n2');
    expect(again.json.generation).toBeGreaterThan(gen0);
    expect((await announce(n2, 'n2')).status).toBe(200);
  });
});

describe('operator routes', () => {
  it('nodes: create, conflict, list, show, delete', async () => {
    const r = await t.req(op, 'POST', '/v1/nodes', { id: 'op1', endpoint: 'wss://10.0.0.9:7443/v1/wake' });
    expect(r.status).toBe(201);
    expect(r.json).toMatchObject({ id: 'op1', endpoint: 'wss://10.0.0.9:7443/v1/wake' });
    expectError(await t.req(op, 'POST', '/v1/nodes', { id: 'op1' }), 409, 'node_exists');
    expectError(await t.req(op, 'POST', '/v1/nodes', { id: 'Bad Id' }), 400, 'invalid_request', 'id');
    const list = await t.req(op, 'GET', '/v1/nodes');
    expect(list.json.items.map((n: { id: string }) => n.id)).toContain('op1');
    expectError(await t.req(op, 'GET', '/v1/nodes/none'), 404, 'not_found');
    expect((await t.req(op, 'DELETE', '/v1/nodes/op1')).status).toBe(204);
    expectError(await t.req(op, 'DELETE', '/v1/nodes/op1'), 404, 'not_found');
  });

  it('configs: create (201 + Location), list, show; names are checked with field paths', async () => {
    const r = await t.req(op, 'POST', '/v1/configs', {
      name: 'web',
      group: 'script',
      config: '#!/bin/sh\necho hi\n',
      inputs: [{ name: 'port', type: 'Number', default: 80 }],
      outputs: [{ name: 'result' }],
      options: { timeout: 30 },
    });
    expect(r.status).toBe(201);
    expect(r.headers.location).toBe(`/v1/configs/${r.json.id}`);
    expect(r.json).toMatchObject({
      name: 'web',
      group: 'script',
      inputs: [{ name: 'port', type: 'Number', default: 80 }],
      outputs: [{ name: 'result', type: 'String', error_output: false }],
    });
    expect((await t.req(op, 'GET', `/v1/configs/${r.json.id}`)).json.id).toBe(r.json.id);
    expect((await t.req(op, 'GET', '/v1/configs')).json.items.length).toBeGreaterThan(0);
    expectError(await t.req(op, 'GET', '/v1/configs/nope'), 404, 'not_found');

    const base = { name: 'c', group: 'script', config: 'x' };
    expectError(await t.req(op, 'POST', '/v1/configs', { ...base, group: 'Bad Group' }), 400, 'bad_name', 'group');
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, inputs: [{ name: 'ok' }, { name: '9bad' }] }),
      400,
      'bad_name',
      'inputs.1.name',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, inputs: [{ name: 'LD_PRELOAD' }] }),
      400,
      'forbidden_input',
      'inputs.0.name',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, inputs: [{ name: 'deploy_action' }] }),
      400,
      'bad_name',
      'inputs.0.name',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, outputs: [{ name: 'a-b' }] }),
      400,
      'bad_name',
      'outputs.0.name',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, inputs: [{ name: 'p', type: 'Number', default: 'abc' }] }),
      400,
      'bad_input_value',
      'inputs.0.default',
    );
    expectError(await t.req(op, 'POST', '/v1/configs', { ...base, colour: 'red' }), 400, 'invalid_request', 'colour');
    expectError(
      await t.req(op, 'POST', '/v1/configs', { ...base, inputs: [{ name: 'p', type: 'Float' }] }),
      400,
      'invalid_request',
      'inputs.0.type',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', {
        name: 'comp',
        group: 'component',
        config: { configs: [{ actions: ['CREATE'], tool: 'Bad Tool', config: 'x' }] },
      }),
      400,
      'bad_name',
      'config.configs.0.tool',
    );
    expect(
      (
        await t.req(op, 'POST', '/v1/configs', {
          name: 'comp',
          group: 'component',
          config: { configs: [{ actions: ['CREATE', 'RESTART'], tool: 'script', config: 'x' }] },
        })
      ).status,
    ).toBe(201);
  });

  it('refuses non-JSON and broken bodies', async () => {
    expectError(
      await t.req(op, 'POST', '/v1/configs', undefined, {
        rawBody: 'name=x',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
      }),
      415,
      'unsupported_media_type',
    );
    expectError(
      await t.req(op, 'POST', '/v1/configs', undefined, {
        rawBody: '{"name":',
        headers: { 'content-type': 'application/json' },
      }),
      400,
      'invalid_json',
    );
    expectError(await t.req(op, 'POST', '/v1/configs'), 400, 'invalid_request');
  });

  it('refuses bodies over 1 MiB (413) by Content-Length and while reading', async () => {
    const big = { name: 'big', group: 'script', config: 'x'.repeat(1024 * 1024 + 10) };
    expectError(await t.req(op, 'POST', '/v1/configs', big), 413, 'body_too_large');
    // chunked, no Content-Length: counted while reading
    const r = await new Promise<Res>((resolve, reject) => {
      const req = https.request(
        {
          host: '127.0.0.1',
          port: t.port,
          method: 'POST',
          path: '/v1/configs',
          ...op,
          servername: 'localhost',
          agent: false,
          headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const raw = Buffer.concat(chunks);
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              raw,
              text: raw.toString(),
              json: JSON.parse(raw.toString()),
            });
          });
        },
      );
      req.on('error', reject);
      req.write(JSON.stringify(big));
      req.end();
    });
    expectError(r, 413, 'body_too_large');
  });

  it('deployments: 201 + Location, unknown node 422, unknown config 422, input values checked by field', async () => {
    const cfg = await mkConfig({
      name: 'app',
      group: 'script',
      config: 'x',
      inputs: [
        { name: 'port', type: 'Number' },
        { name: 'debug', type: 'Boolean', default: false },
      ],
    });
    await t.req(op, 'POST', '/v1/nodes', { id: 'd1' });
    const r = await t.req(op, 'POST', '/v1/deployments', {
      node: 'd1',
      config_id: cfg,
      input_values: { port: '8080' },
    });
    expect(r.status).toBe(201);
    expect(r.headers.location).toBe(`/v1/deployments/${r.json.id}`);
    expect(r.json).toMatchObject({
      deployment_id: r.json.id,
      node: 'd1',
      config_id: cfg,
      name: 'app',
      action: 'CREATE',
      actions: ['CREATE', 'UPDATE'],
      revision: 1,
      status: 'IN_PROGRESS',
      status_reason: 'Deploy data available',
      input_values: { port: 8080 },
      output_values: null,
    });
    expect(t.push.notified.at(-1)).toMatchObject({ node: 'd1', reason: 'deployment' });
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'ghost', config_id: cfg }),
      422,
      'unknown_node',
      'node',
    );
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'd1', config_id: 'nope' }),
      422,
      'unknown_config',
      'config_id',
    );
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'd1', config_id: cfg, input_values: { port: 'abc' } }),
      400,
      'bad_input_value',
      'input_values.port',
    );
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'd1', config_id: cfg, input_values: { PATH: '/tmp' } }),
      400,
      'forbidden_input',
      'input_values.PATH',
    );
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'd1', config_id: cfg, action: 'EXPLODE' }),
      400,
      'invalid_request',
      'action',
    );
    expectError(
      await t.req(op, 'POST', '/v1/deployments', { node: 'd1', config_id: cfg, action: 'DELETE' }),
      400,
      'invalid_request',
      'action',
    );
    const list = await t.req(op, 'GET', '/v1/deployments?node=d1');
    expect(list.json.items.map((d: { id: string }) => d.id)).toEqual([r.json.id]);
  });

  it('PATCH makes a new revision with a new item id; an action outside actions completes at once', async () => {
    const cfg = await mkConfig({ name: 'p', group: 'script', config: 'x', inputs: [{ name: 'a' }, { name: 'b' }] });
    await t.req(op, 'POST', '/v1/nodes', { id: 'd2' });
    const d = await mkDeployment({ node: 'd2', config_id: cfg, input_values: { a: '1', b: '2' } });
    const p = await t.req(op, 'PATCH', `/v1/deployments/${d.id}`, { input_values: { b: '3' } });
    expect(p.status).toBe(200);
    expect(p.json).toMatchObject({
      revision: 2,
      action: 'UPDATE',
      status: 'IN_PROGRESS',
      input_values: { a: '1', b: '3' },
    });
    expect(p.json.item_id).not.toBe(d.item_id);
    const s = await t.req(op, 'PATCH', `/v1/deployments/${d.id}`, { action: 'SUSPEND' });
    expect(s.json).toMatchObject({ revision: 3, action: 'SUSPEND', status: 'COMPLETE', signalled: true });
    expect(s.json.status_reason).toMatch(/not triggered/);
    const revs = await t.req(op, 'GET', `/v1/deployments/${d.id}/revisions`);
    expect(revs.json.items.map((r: { revision: number }) => r.revision)).toEqual([1, 2, 3]);
    expectError(await t.req(op, 'PATCH', '/v1/deployments/nope', {}), 404, 'not_found');
  });

  it('DELETE removes at once unless DELETE is in actions; then runs a DELETE revision, removed once signalled', async () => {
    const cfg = await mkConfig({ name: 'del', group: 'script', config: 'x' });
    await announce(n1, 'n1');
    const plain = await mkDeployment({ node: 'n1', config_id: cfg });
    expect((await t.req(op, 'DELETE', `/v1/deployments/${plain.id}`)).status).toBe(204);
    expectError(await t.req(op, 'GET', `/v1/deployments/${plain.id}`), 404, 'not_found');

    const withDelete = await mkDeployment({ node: 'n1', config_id: cfg, actions: ['CREATE', 'DELETE'] });
    const del = await t.req(op, 'DELETE', `/v1/deployments/${withDelete.id}`);
    expect(del.status).toBe(202);
    expect(del.json).toMatchObject({ action: 'DELETE', revision: 2, status: 'IN_PROGRESS' });
    expectError(await t.req(op, 'PATCH', `/v1/deployments/${withDelete.id}`, {}), 409, 'deployment_deleting');
    const { r: md } = await fetchMetadata(n1, 'n1');
    const item = md.json.deployments.find((x: { deployment_id: string }) => x.deployment_id === withDelete.id);
    expect(item.inputs.find((i: { name: string }) => i.name === 'deploy_action').value).toBe('DELETE');
    const sig = await t.req(n1, 'POST', `/v1/nodes/n1/deployments/${withDelete.id}/signal`, {
      revision: 2,
      deploy_status_code: 0,
      deploy_stdout: '',
      deploy_stderr: '',
      outputs: {},
    });
    expect(sig.status).toBe(200);
    expectError(await t.req(op, 'GET', `/v1/deployments/${withDelete.id}`), 404, 'not_found');
    const { r: md2 } = await fetchMetadata(n1, 'n1');
    expect(md2.json.deployments.some((x: { deployment_id: string }) => x.deployment_id === withDelete.id)).toBe(false);
  });

  it('a deployment born not triggered has no item in the metadata until a later revision of it (as Heat creates none)', async () => {
    const cfg = await mkConfig({ name: 'uninstall-only', group: 'script', config: 'x' });
    await announce(n1, 'n1');
    const items = async (): Promise<
      Array<{ deployment_id: string; revision: number; inputs: Array<{ name: string; value: unknown }> }>
    > => (await fetchMetadata(n1, 'n1')).r.json.deployments;
    const onDelete = await mkDeployment({ node: 'n1', config_id: cfg, actions: ['DELETE'] });
    expect(onDelete).toMatchObject({ revision: 1, status: 'COMPLETE', signalled: true });
    const runs = await mkDeployment({ node: 'n1', config_id: cfg, actions: ['CREATE', 'DELETE'] });
    const before = await items();
    expect(before.some((x) => x.deployment_id === runs.id)).toBe(true);
    expect(before.some((x) => x.deployment_id === onDelete.id)).toBe(false);
    // its DELETE runs: from then on it has its item, as any other
    expect((await t.req(op, 'DELETE', `/v1/deployments/${onDelete.id}`)).status).toBe(202);
    const item = (await items()).find((x) => x.deployment_id === onDelete.id)!;
    expect(item.revision).toBe(2);
    expect(item.inputs.find((i) => i.name === 'deploy_action')!.value).toBe('DELETE');
    // one that has run keeps its item through a revision that runs nothing
    const quiet = await t.req(op, 'PATCH', `/v1/deployments/${runs.id}`, { action: 'SUSPEND' });
    expect(quiet.json).toMatchObject({ revision: 2, status: 'COMPLETE', signalled: true });
    const kept = (await items()).find((x) => x.deployment_id === runs.id)!;
    expect(kept.revision).toBe(2);
    expect(kept.inputs.find((i) => i.name === 'deploy_action')!.value).toBe('SUSPEND');
  });

  it('GET /v1/audit records who changed what', async () => {
    const r = await t.req(op, 'GET', '/v1/audit?limit=500');
    expect(r.status).toBe(200);
    expect(
      r.json.items.some(
        (a: { who: string; action: string }) =>
          a.who === pki.spiffe('operator', 'admin') && a.action === 'config.create',
      ),
    ).toBe(true);
    expect(
      r.json.items.some(
        (a: { who: string; action: string }) => a.who === pki.spiffe('agent', 'n1') && a.action === 'node.register',
      ),
    ).toBe(true);
  });
});

describe('metadata', () => {
  let cfgA: string;
  let depB: Record<string, any>;
  let depA: Record<string, any>;

  beforeAll(async () => {
    await announce(pki.cred('agent', 'n1'), 'n1');
    await t.req(op, 'POST', '/v1/nodes', { id: 'm1' });
    cfgA = await mkConfig({
      name: 'zeta',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [
        { name: 'greeting', description: 'hello' },
        { name: 'count', type: 'Number', default: 3 },
      ],
      outputs: [{ name: 'result' }, { name: 'err', error_output: true }],
    });
    const m1 = await pki.issueAgent('m1');
    void m1;
    depB = await mkDeployment({
      node: 'm1',
      config_id: cfgA,
      name: 'bravo',
      input_values: { greeting: 'hi', extra: 42 },
    });
    depA = await mkDeployment({ node: 'm1', config_id: cfgA, name: 'alpha' });
  });

  it('is Heat-shaped, sorted by name, with derived inputs, signed, with ETag', async () => {
    const m1 = pki.cred('agent', 'm1');
    const { r, nonce } = await fetchMetadata(m1, 'm1');
    expect(r.status).toBe(200);
    expect(r.headers['cache-control']).toBe('no-store');
    const v = verify(r, nonce, 'm1');
    expect(r.headers.etag).toBe(`"${v.gen}"`);
    const doc = r.json;
    expect(doc).toMatchObject({ node: 'm1', generation: v.gen });
    expect(doc.deployments.map((d: { name: string }) => d.name)).toEqual(['alpha', 'bravo']);
    const b = doc.deployments[1];
    expect(Object.keys(b).sort()).toEqual(
      [
        'config',
        'creation_time',
        'deployment_id',
        'group',
        'id',
        'inputs',
        'name',
        'options',
        'outputs',
        'revision',
        'signalled',
      ].sort(),
    );
    expect(b).toMatchObject({
      id: depB.item_id,
      deployment_id: depB.id,
      revision: 1,
      signalled: false,
      group: 'script',
      config: '#!/bin/sh\n',
    });
    const inputs = Object.fromEntries(b.inputs.map((i: { name: string; value: unknown }) => [i.name, i]));
    expect(inputs.greeting).toEqual({ name: 'greeting', type: 'String', value: 'hi', description: 'hello' });
    expect(inputs.count.value).toBe(3);
    expect(inputs.extra).toEqual({ name: 'extra', type: 'String', value: '42' });
    for (const n of DERIVED_INPUT_NAMES) expect(inputs[n], n).toBeDefined();
    expect(inputs.deploy_server_id.value).toBe('m1');
    expect(inputs.deploy_action.value).toBe('CREATE');
    expect(inputs.deploy_signal_transport.value).toBe('HERALD_SIGNAL');
    expect(inputs.deploy_signal_verb.value).toBe('POST');
    expect(inputs.deploy_signal_id.value).toBe(`https://127.0.0.1:${t.port}/v1/nodes/m1/deployments/${depB.id}/signal`);
    expect(inputs.deploy_resource_name.value).toBe('bravo');
    // derived inputs follow the user's
    expect(b.inputs.findIndex((i: { name: string }) => i.name === 'deploy_server_id')).toBeGreaterThan(
      b.inputs.findIndex((i: { name: string }) => i.name === 'extra'),
    );
    expect(b.outputs).toEqual([
      { name: 'result', type: 'String', error_output: false },
      { name: 'err', type: 'String', error_output: true },
    ]);
  });

  it('answers If-None-Match (exact, W/, lists, *) with a signed 304, and mismatches with 200', async () => {
    const m1 = pki.cred('agent', 'm1');
    const { r } = await fetchMetadata(m1, 'm1');
    const etag = r.headers.etag as string;
    for (const inm of [etag, `W/${etag}`, `"0", ${etag}`, '*']) {
      const { r: nm, nonce } = await fetchMetadata(m1, 'm1', { 'if-none-match': inm });
      expect(nm.status, inm).toBe(304);
      expect(nm.headers.etag).toBe(etag);
      expect(nm.headers['cache-control']).toBe('no-store');
      expect(verify(nm, nonce, 'm1').gen).toBe(Number(etag.replaceAll('"', '')));
    }
    const { r: full, nonce } = await fetchMetadata(m1, 'm1', { 'if-none-match': '"0"' });
    expect(full.status).toBe(200);
    verify(full, nonce, 'm1');
  });

  it('a 304 reads no metadata (the generation answers it); a 200 of a new generation builds its document once', async () => {
    const m1 = pki.cred('agent', 'm1');
    const store = t.ctl.store;
    // the reads that went on to the node's deployments (a 304 reads the node's generation alone)
    const sourced: string[] = [];
    const original = store.metadataSource.bind(store);
    store.metadataSource = async (node, wanted) => {
      const read = await original(node, wanted);
      if (read?.source) sourced.push(node);
      return read;
    };
    try {
      const { r } = await fetchMetadata(m1, 'm1');
      const etag = r.headers.etag as string;
      sourced.length = 0;
      for (let i = 0; i < 3; i++) {
        const { r: nm, nonce } = await fetchMetadata(m1, 'm1', { 'if-none-match': etag });
        expect(nm.status).toBe(304);
        expect(verify(nm, nonce, 'm1').gen).toBe(Number(etag.replaceAll('"', '')));
      }
      expect(sourced).toEqual([]);
      // a new generation: built for its first 200, then served from the cache
      const cfg = await mkConfig({ name: `c-${Date.now()}`, group: 'script', config: 'true' });
      await mkDeployment({ config_id: cfg, node: 'm1' });
      for (let i = 0; i < 2; i++) {
        const { r: full, nonce } = await fetchMetadata(m1, 'm1', { 'if-none-match': etag });
        expect(full.status).toBe(200);
        verify(full, nonce, 'm1');
      }
      expect(sourced).toEqual(['m1']);
    } finally {
      store.metadataSource = original;
    }
  });

  it('answers without a nonce header too (a person with curl), signing no nonce', async () => {
    const r = await t.req(pki.cred('agent', 'm1'), 'GET', '/v1/nodes/m1/metadata');
    expect(r.status).toBe(200);
    const payload = JSON.parse(
      Buffer.from((r.headers['herald-signature'] as string).split('.')[1]!, 'base64url').toString(),
    );
    expect(payload.nonce).toBeUndefined();
    expect(payload.sha256).toBeDefined();
    expectError(
      await t.req(pki.cred('agent', 'm1'), 'GET', '/v1/nodes/m1/metadata', undefined, {
        headers: { 'herald-nonce': 'short' },
      }),
      400,
      'invalid_request',
      'Herald-Nonce',
    );
  });

  it("refuses agent A reading B's metadata (wrong_node) and unknown nodes (404)", async () => {
    expectError((await fetchMetadata(n1, 'm1')).r, 403, 'wrong_node');
    const ghost = await pki.issueAgent('ghost');
    expectError((await fetchMetadata(ghost, 'ghost')).r, 404, 'not_found');
  });

  it('signals: first result wins, repeats are 200 without change, stale/unknown revisions 409, Heat status rules; no wake-up', async () => {
    const m1 = pki.cred('agent', 'm1');
    const { r: before } = await fetchMetadata(m1, 'm1');
    const wakes = t.push.notified.length;
    const url = `/v1/nodes/m1/deployments/${depA.id}/signal`;
    const first = await t.req(m1, 'POST', url, {
      revision: 1,
      deploy_status_code: 0,
      deploy_stdout: 'out',
      deploy_stderr: 'err',
      outputs: { result: 'r1', undeclared: 'x' },
    });
    expect(first.status, first.text).toBe(200);
    // the answer is a summary: the outputs are not echoed back to the agent
    expect(first.json).toMatchObject({
      deployment_id: depA.id,
      revision: 1,
      status: 'COMPLETE',
      status_reason: 'Outputs received',
      signalled: true,
    });
    expect(first.json.output_values).toBeUndefined();
    const view = await t.req(op, 'GET', `/v1/deployments/${depA.id}`);
    expect(view.json).toMatchObject({
      output_values: { result: 'r1', deploy_stdout: 'out', deploy_stderr: 'err', deploy_status_code: 0 },
    });
    expect(view.json.output_values.undeclared).toBeUndefined();
    const dup = await t.req(m1, 'POST', url, {
      revision: 1,
      deploy_status_code: 3,
      deploy_stdout: 'other',
      deploy_stderr: '',
      outputs: {},
    });
    expect(dup.status).toBe(200);
    expect(dup.json.status).toBe('COMPLETE');
    expect(t.push.notified.length).toBe(wakes); // a signal wakes nobody
    const { r: after, nonce } = await fetchMetadata(m1, 'm1');
    expect(verify(after, nonce, 'm1').gen).toBeGreaterThan(Number((before.headers.etag as string).replaceAll('"', '')));
    expect(after.json.deployments.find((d: { deployment_id: string }) => d.deployment_id === depA.id).signalled).toBe(
      true,
    );

    // new revision: older is stale, newer unknown
    await t.req(op, 'PATCH', `/v1/deployments/${depA.id}`, {});
    expectError(
      await t.req(m1, 'POST', url, { revision: 1, deploy_status_code: 0, outputs: {} }),
      409,
      'stale_revision',
    );
    expectError(
      await t.req(m1, 'POST', url, { revision: 3, deploy_status_code: 0, outputs: {} }),
      409,
      'unknown_revision',
    );
    const failed = await t.req(m1, 'POST', url, {
      revision: 2,
      deploy_status_code: 0,
      deploy_stdout: '',
      deploy_stderr: '',
      outputs: { err: 'boom' },
    });
    expect(failed.json).toMatchObject({ status: 'FAILED', revision: 2 });
    expect(failed.json.status_reason).toContain('err : boom');

    await t.req(op, 'PATCH', `/v1/deployments/${depA.id}`, {});
    const nz = await t.req(m1, 'POST', url, {
      revision: 3,
      deploy_status_code: 2,
      deploy_stdout: '',
      deploy_stderr: 'bad',
      outputs: {},
      status_reason: 'interrupted',
    });
    expect(nz.json).toMatchObject({ status: 'FAILED', status_reason: 'interrupted' });
    const shown = await t.req(op, 'GET', `/v1/deployments/${depA.id}`);
    expect(shown.json).toMatchObject({
      status: 'FAILED',
      revision: 3,
      status_reason: 'interrupted',
      output_values: { deploy_status_code: 2 },
    });
  });

  it("signals are only for the node's own deployments", async () => {
    const m1 = pki.cred('agent', 'm1');
    const body = { revision: 1, deploy_status_code: 0, outputs: {} };
    expectError(await t.req(n1, 'POST', `/v1/nodes/m1/deployments/${depB.id}/signal`, body), 403, 'wrong_node');
    expectError(await t.req(n1, 'POST', `/v1/nodes/n1/deployments/${depB.id}/signal`, body), 404, 'not_found');
    expectError(
      await t.req(m1, 'POST', `/v1/nodes/m1/deployments/${depB.id}/signal`, { revision: 'one' }),
      400,
      'invalid_request',
      'revision',
    );
  });

  it('accepts signals up to 4 MiB and refuses larger (413)', async () => {
    const m1 = pki.cred('agent', 'm1');
    const url = `/v1/nodes/m1/deployments/${depB.id}/signal`;
    const ok = await t.req(m1, 'POST', url, {
      revision: 1,
      deploy_status_code: 0,
      deploy_stdout: 'y'.repeat(2 * 1024 * 1024),
      deploy_stderr: '',
      outputs: {},
    });
    expect(ok.status, ok.text.slice(0, 200)).toBe(200);
    expectError(
      await t.req(m1, 'POST', url, {
        revision: 1,
        deploy_status_code: 0,
        deploy_stdout: 'y'.repeat(4 * 1024 * 1024 + 1),
        deploy_stderr: '',
        outputs: {},
      }),
      413,
      'body_too_large',
    );
  });
});

describe('hidden inputs', () => {
  it('are "***" in responses and events, absent from logs, and delivered to the agent', async () => {
    const SECRET = `hunter2-${Math.random().toString(36).slice(2)}`;
    const events: string[] = [];
    const stream = await new Promise<{ close: () => void }>((resolve, reject) => {
      const req = https.request(
        { host: '127.0.0.1', port: t.port, path: '/v1/events', ...op, servername: 'localhost', agent: false },
        (res) => {
          expect(res.statusCode).toBe(200);
          expect(res.headers['content-type']).toContain('text/event-stream');
          res.on('data', (c: Buffer) => events.push(c.toString()));
          resolve({ close: () => req.destroy() });
        },
      );
      req.on('error', (e) => (events.length ? undefined : reject(e)));
      req.end();
    });
    try {
      await t.req(op, 'POST', '/v1/nodes', { id: 'h1' });
      const h1 = await pki.issueAgent('h1');
      const cfg = await t.req(op, 'POST', '/v1/configs', {
        name: 'sec',
        group: 'script',
        config: 'x',
        inputs: [{ name: 'password', hidden: true, default: `${SECRET}-default` }, { name: 'user' }],
      });
      expect(cfg.text).not.toContain(SECRET);
      expect(cfg.json.inputs[0].default).toBe('***');
      const d = await t.req(op, 'POST', '/v1/deployments', {
        node: 'h1',
        config_id: cfg.json.id,
        input_values: { password: SECRET, user: 'bob' },
      });
      expect(d.text).not.toContain(SECRET);
      expect(d.json.input_values).toEqual({ password: '***', user: 'bob' });
      const p = await t.req(op, 'PATCH', `/v1/deployments/${d.json.id}`, { input_values: { user: 'alice' } });
      expect(p.json.input_values).toEqual({ password: '***', user: 'alice' });
      for (const path of [
        `/v1/deployments/${d.json.id}`,
        '/v1/deployments',
        `/v1/configs/${cfg.json.id}`,
        '/v1/configs',
        `/v1/deployments/${d.json.id}/revisions`,
        '/v1/audit?limit=1000',
      ]) {
        const r = await t.req(op, 'GET', path);
        expect(r.text, path).not.toContain(SECRET);
      }
      const md = await t.req(h1, 'GET', '/v1/nodes/h1/metadata');
      expect(md.text).toContain(SECRET);
      await t.req(h1, 'POST', `/v1/nodes/h1/deployments/${d.json.id}/signal`, {
        revision: 2,
        deploy_status_code: 0,
        deploy_stdout: '',
        deploy_stderr: '',
        outputs: {},
      });
      await waitFor(
        'events for the deployment',
        () => events.join('').includes(`"id":"${d.json.id}"`) && events.join('').includes('"status":"COMPLETE"'),
      );
      const all = events.join('');
      expect(all).toContain('event: deployment');
      expect(all).toContain('"password":"***"');
      expect(all).not.toContain(SECRET);
      expect(t.logText()).not.toContain(SECRET);
    } finally {
      stream.close();
    }
  });
});

describe('metrics', () => {
  it('serves Prometheus text with the API, fetch and signal counters', async () => {
    const r = await t.req(op, 'GET', '/metrics');
    expect(r.status).toBe(200);
    expect(r.headers['content-type']).toContain('text/plain');
    const lines = r.text.split('\n').filter((l) => l !== '');
    for (const l of lines) {
      expect(l, l).toMatch(
        /^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+|[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? -?([0-9.e+-]+|NaN|\+Inf|-Inf))$/,
      );
    }
    expect(r.text).toMatch(
      /herald_api_requests_total\{route="\/v1\/nodes\/:node\/metadata",method="GET",status="200"\} \d+/,
    );
    expect(r.text).toMatch(/herald_metadata_fetches_total\{status="304",channel="https"\} \d+/);
    expect(r.text).toMatch(/herald_signals_total\{outcome="recorded",status="COMPLETE"\} \d+/);
    // the main process's memory, read when scraped: this process's own (the controller runs in it)
    const gauge = (name: string): number => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(r.text)?.[1]);
    const used = gauge('nodejs_heap_size_used_bytes');
    expect(used).toBeGreaterThan(1_000_000);
    expect(gauge('nodejs_heap_size_total_bytes')).toBeGreaterThanOrEqual(used);
    expect(gauge('process_resident_memory_bytes')).toBeGreaterThan(gauge('nodejs_heap_size_total_bytes'));
    expect(gauge('nodejs_external_memory_bytes')).toBeGreaterThan(0);
  });
});

describe('rate limits (docs/limits.md defaults)', () => {
  let rt: TestController;
  beforeAll(async () => {
    rt = await startTestController(pki);
  });
  afterAll(async () => {
    await rt?.close();
  });

  // sent at once, so the refill during the burst stays well under one token
  it('allows 5 announcements at once, then answers 429 with Retry-After', async () => {
    const r1 = await pki.issueAgent('r1');
    const results = await Promise.all(
      Array.from({ length: 8 }, () =>
        rt.req(r1, 'PUT', '/v1/nodes/r1/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' }),
      ),
    );
    const ok = results.filter((r) => r.status === 200).length;
    expect(ok).toBeGreaterThanOrEqual(5);
    expect(ok).toBeLessThanOrEqual(6);
    const limited = results.filter((r) => r.status === 429);
    expect(limited.length).toBe(8 - ok);
    expectError(limited[0]!, 429, 'rate_limited');
    expect(Number(limited[0]!.headers['retry-after'])).toBeGreaterThanOrEqual(1);
  });

  it('allows 10 metadata fetches at once, then 429', async () => {
    const r2 = await pki.issueAgent('r2');
    await rt.req(r2, 'PUT', '/v1/nodes/r2/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' });
    const statuses = (
      await Promise.all(Array.from({ length: 16 }, () => rt.req(r2, 'GET', '/v1/nodes/r2/metadata')))
    ).map((r) => r.status);
    const ok = statuses.filter((s) => s === 200).length;
    expect(ok).toBeGreaterThanOrEqual(10);
    expect(ok).toBeLessThan(16);
    expect(statuses.filter((s) => s !== 200).every((s) => s === 429)).toBe(true);
  });
});

describe('kept-alive connections per agent (API_AGENT_MAX_CONNECTIONS)', () => {
  /** `n` requests at once from one agent identity, each on a connection of its own, all kept open. */
  async function burst(agent: https.Agent, node: string, n: number): Promise<Res[]> {
    return Promise.all(
      Array.from(
        { length: n },
        () =>
          new Promise<Res>((resolve, reject) => {
            const req = https.request(
              { host: '127.0.0.1', port: t.port, path: `/v1/nodes/${node}/metadata`, servername: 'localhost', agent },
              (res) => {
                const chunks: Buffer[] = [];
                res.on('data', (c: Buffer) => chunks.push(c));
                res.on('end', () => {
                  const text = Buffer.concat(chunks).toString();
                  let json: unknown;
                  try {
                    json = JSON.parse(text);
                  } catch {
                    json = undefined;
                  }
                  resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json } as unknown as Res);
                });
              },
            );
            req.on('error', reject);
            req.end();
          }),
      ),
    );
  }

  it('answers the 9th open connection of one agent 429 too_many_connections and closes it; other identities are not counted', async () => {
    const kc = await pki.issueAgent('kc1');
    const other = await pki.issueAgent('kc2');
    await t.req(kc, 'PUT', '/v1/nodes/kc1/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' });
    const a = new https.Agent({ ...kc, keepAlive: true, maxSockets: 9, maxCachedSessions: 0 });
    const b = new https.Agent({ ...other, keepAlive: true, maxSockets: 9, maxCachedSessions: 0 });
    try {
      const rs = await burst(a, 'kc1', 9);
      const refused = rs.filter((r) => r.status === 429);
      expect(refused.length).toBe(1);
      expectError(refused[0]!, 429, 'too_many_connections');
      expect(refused[0]!.headers.connection).toBe('close');
      expect(rs.filter((r) => r.status === 200).length).toBe(8);
      // another agent's connections are its own count (its node is unknown: 404, not 429)
      const os = await burst(b, 'kc2', 8);
      expect(os.map((r) => r.status)).toEqual(Array(8).fill(404));
      // with 8 of kc1's connections still open, a new one is refused again
      const more = await t.req(kc, 'GET', '/v1/nodes/kc1/metadata');
      expectError(more, 429, 'too_many_connections');
      // once they are closed, new connections are served
      a.destroy();
      await waitFor(
        'kc1 served again',
        async () => (await t.req(kc, 'GET', '/v1/nodes/kc1/metadata')).status === 200,
        5_000,
      );
    } finally {
      a.destroy();
      b.destroy();
    }
  });
});

describe('plain health listener', () => {
  it('serves GET /healthz without TLS when --health-listen is set', async () => {
    const h = await startTestController(pki, { healthListen: { host: '127.0.0.1', port: 0 } });
    try {
      const port = h.ctl.healthAddress!.port;
      const res = await fetch(`http://127.0.0.1:${port}/healthz`);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ status: 'ok' });
      expect(res.headers.get('cache-control')).toBe('no-store');
      expect((await fetch(`http://127.0.0.1:${port}/v1/nodes`)).status).toBe(404);
      // the TLS /healthz's phase: shutting down is not healthy
      h.ctl.service.beginStop();
      const stopping = await fetch(`http://127.0.0.1:${port}/healthz`);
      expect(stopping.status).toBe(503);
      expect(await stopping.json()).toEqual({ status: 'stopping' });
      expect(stopping.headers.get('retry-after')).toBe('1');
    } finally {
      await h.close();
    }
  });
});

describe('revocation and unexpected errors', () => {
  it('refuses a revoked certificate at its next request, on a live connection too', async () => {
    const rv = await pki.issueAgent('rv');
    const agent = new https.Agent({ keepAlive: true, ...rv });
    const get = () =>
      new Promise<number>((resolve, reject) => {
        const r = https.request(
          { host: '127.0.0.1', port: t.port, path: '/healthz', servername: 'localhost', agent },
          (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          },
        );
        r.on('error', reject);
        r.end();
      });
    try {
      expect(await get()).toBe(200);
      const { revoke } = await import('../../certs/pki.js');
      await revoke({ dir: pki.dir, target: 'agent/rv' });
      await waitFor('the revocation to take effect', async () => {
        const r = await t.req(rv, 'GET', '/healthz');
        return r.status === 403 && r.json.error.code === 'revoked';
      });
      // the kept-alive connection was closed or is refused; it does not get a 200
      expect(await get().catch(() => 0)).not.toBe(200);
    } finally {
      agent.destroy();
    }
  });

  it('answers an unexpected failure 500 internal without detail, and logs the stack', async () => {
    const x = await startTestController(pki);
    try {
      await x.ctl.store.close();
      const r = await x.req(op, 'GET', '/v1/nodes');
      expectError(r, 500, 'internal');
      expect(r.json.error.message).toBe('an unexpected error; details are in the controller log only');
      const line = x.logLines().find((l) => l.msg === 'request failed unexpectedly') as
        | { err?: { stack?: string } }
        | undefined;
      expect(line?.err?.stack).toMatch(/not open|closed/);
    } finally {
      await x.close().catch(() => undefined);
    }
  });
});
