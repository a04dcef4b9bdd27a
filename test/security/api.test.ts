/**
 * Attacks on the controller API of a real `bin/herald controller` with real agents n1 and n2:
 * one node acting on another's routes, endpoints aimed elsewhere, the wrong roles on operator
 * and agent routes, bad certificates, oversized and malformed bodies, names that would steer a
 * loader or escape a directory, and signals for revisions that are not the current one. Each
 * asserts the status and `error.code`, that the target resource is unchanged, and from the
 * outside that nothing happened: no metadata fetch at the controller, no new entry in either
 * agent's state dir.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request, type Res } from '../helpers/controller-harness.js';
import { Attackers } from './helpers/attackers.js';
import { Battery, isBuilt, jsonLines, waitFor, type Cred } from './helpers/battery.js';
import { rawTcp } from './helpers/wire.js';
import tls from 'node:tls';

const built = isBuilt();
let b: Battery;
let atk: Attackers;
/** n2's deployment, at revision 2 and COMPLETE. */
let d2: string;
let configId: string;

beforeAll(async () => {
  if (!built) return;
  b = await Battery.create();
  atk = new Attackers(b);
  await b.issue('operator', 'lost');
  await b.issue('agent', 'meta', { ip: ['127.0.0.1', '169.254.169.254'], dns: ['localhost'] });
  await b.startController();
  await b.startAgent('n1');
  await b.startAgent('n2');
  const cfg = await b.asOperator('POST', '/v1/configs', {
    name: 'ok',
    group: 'script',
    config: '#!/bin/sh\necho "ok $x"\n',
    inputs: [{ name: 'x' }],
  });
  configId = cfg.json.id as string;
  const d = await b.asOperator('POST', '/v1/deployments', {
    node: 'n2',
    config_id: configId,
    input_values: { x: '1' },
  });
  d2 = d.json.deployment_id as string;
  await waitRevisionComplete(d2, 1);
  expect((await b.asOperator('PATCH', `/v1/deployments/${d2}`, { input_values: { x: '2' } })).status).toBe(200);
  await waitRevisionComplete(d2, 2);
  await b.revoke('operator', 'lost');
  await waitFor(
    'the controller to re-read revoked.json',
    async () => (await req(b.cred('operator', 'lost'), 'GET', '/v1/nodes')).json?.error?.code === 'revoked',
    10_000,
    50,
  );
  await b.quiesce(3_000); // past any start-up poll retry (a first retry comes within 1 s)
}, 120_000);

afterAll(async () => {
  await b?.close();
});

async function waitRevisionComplete(id: string, revision: number): Promise<void> {
  await waitFor(
    `deployment ${id} revision ${revision} to complete`,
    async () => {
      const j = (await b.asOperator('GET', `/v1/deployments/${id}`)).json;
      return j?.revision === revision && j?.status === 'COMPLETE';
    },
    20_000,
    50,
  );
}

function req(
  cred: Partial<Cred>,
  method: string,
  p: string,
  body?: unknown,
  o: { headers?: Record<string, string>; rawBody?: Buffer | string } = {},
): Promise<Res> {
  return request(b.ctl.port, cred, method, p, body, o);
}

/** The state an attack must not change: n1's and n2's node records, d2, the configs, the deployments. */
async function world(): Promise<string> {
  const strip = (n: Record<string, unknown>): unknown => ({ id: n.id, endpoint: n.endpoint, generation: n.generation });
  const nodes = ((await b.asOperator('GET', '/v1/nodes')).json.items as Array<Record<string, unknown>>).map(strip);
  const d = (await b.asOperator('GET', `/v1/deployments/${d2}`)).json as Record<string, unknown>;
  const configs = ((await b.asOperator('GET', '/v1/configs')).json.items as unknown[]).length;
  const deployments = ((await b.asOperator('GET', '/v1/deployments')).json.items as unknown[]).length;
  return JSON.stringify({
    nodes,
    d: { status: d.status, revision: d.revision, output_values: d.output_values, updated: d.updated_time },
    configs,
    deployments,
  });
}

/** Runs `attack`, asserts its status and code, and that nothing happened anywhere. */
async function refused(attack: () => Promise<Res>, status: number, code: string): Promise<Res> {
  const before = await world();
  const from = jsonLines(b.ctl.proc.log()).length;
  const r = await b.expectNoEffect(['n1', 'n2'], attack);
  expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status, code });
  expect(await world()).toBe(before);
  // the controller logged the refusal with its code and who (or what address) asked; a 403,
  // 413 or 429 like one logged in the last 10 s (the same code and caller, or the same code
  // before authentication) is counted in that line's next summary instead (docs/api.md), so the
  // line of that code may be an earlier one
  const lines = jsonLines(b.ctl.proc.log());
  const refusedLine = (l: Record<string, unknown>) => l.event === 'refused' && l.code === code;
  const logged =
    lines.slice(from).find(refusedLine) ?? ([403, 413, 429].includes(status) ? lines.findLast(refusedLine) : undefined);
  expect(typeof logged?.peer).toBe('string');
  return r;
}

const url = (host: string, port = 7443, p = '/v1/wake'): string => `wss://${host}:${port}${p}`;

describe.skipIf(!built)('api: one node against another', () => {
  it("node A reading node B's metadata is 403 wrong_node", async () => {
    await refused(
      () =>
        req(b.cred('agent', 'n1'), 'GET', '/v1/nodes/n2/metadata', undefined, {
          headers: { 'herald-nonce': 'AAAAAAAAAAAAAAAAAAAAAA' },
        }),
      403,
      'wrong_node',
    );
  });

  it("node A signalling node B's deployment is 403 wrong_node", async () => {
    await refused(
      () =>
        req(b.cred('agent', 'n1'), 'POST', `/v1/nodes/n2/deployments/${d2}/signal`, {
          revision: 2,
          deploy_status_code: 1,
          deploy_stdout: 'pwned',
        }),
      403,
      'wrong_node',
    );
  });

  it("node A signalling node B's deployment under its own node is 404 not_found", async () => {
    await refused(
      () =>
        req(b.cred('agent', 'n1'), 'POST', `/v1/nodes/n1/deployments/${d2}/signal`, {
          revision: 2,
          deploy_status_code: 1,
          deploy_stdout: 'pwned',
        }),
      404,
      'not_found',
    );
  });

  it("node A announcing node B's endpoint is 403 wrong_node", async () => {
    await refused(
      () => req(b.cred('agent', 'n1'), 'PUT', '/v1/nodes/n2/endpoint', { url: url('127.0.0.1', 9) }),
      403,
      'wrong_node',
    );
  });

  it('node A announcing an endpoint outside its own SANs is 403 endpoint_not_in_san', async () => {
    await refused(
      () => req(b.cred('agent', 'n1'), 'PUT', '/v1/nodes/n1/endpoint', { url: url('10.66.66.66') }),
      403,
      'endpoint_not_in_san',
    );
  });

  it('node A announcing the cloud metadata address 169.254.169.254 is 400 link_local_endpoint', async () => {
    await refused(
      () => req(b.cred('agent', 'n1'), 'PUT', '/v1/nodes/n1/endpoint', { url: url('169.254.169.254', 80) }),
      400,
      'link_local_endpoint',
    );
  });

  // fresh identities (announcements are rate-limited per identity); none of these nodes may appear
  const endpointCases: Array<[string, string, () => Promise<Cred>, string, number, string]> = [
    [
      "an agent announcing 169.254.169.254 even when it is one of the certificate's SANs is 400 link_local_endpoint",
      'meta',
      async () => b.cred('agent', 'meta'),
      url('169.254.169.254', 80),
      400,
      'link_local_endpoint',
    ],
    [
      'an agent announcing an IPv6 link-local address is 400 link_local_endpoint',
      'e1',
      () => b.issue('agent', 'e1'),
      url('[fe80::1]'),
      400,
      'link_local_endpoint',
    ],
    [
      'an agent announcing 169.254.169.254 written as an IPv4-mapped IPv6 address is 400 link_local_endpoint',
      'e2',
      () => b.issue('agent', 'e2'),
      url('[::ffff:169.254.169.254]'),
      400,
      'link_local_endpoint',
    ],
    [
      "an agent announcing a DNS name outside the certificate's SANs is 403 endpoint_not_in_san",
      'e3',
      () => b.issue('agent', 'e3'),
      url('evil.example'),
      403,
      'endpoint_not_in_san',
    ],
    [
      'an agent announcing a plain ws:// endpoint is 400 bad_endpoint',
      'e4',
      () => b.issue('agent', 'e4'),
      'ws://127.0.0.1:7443/v1/wake',
      400,
      'bad_endpoint',
    ],
    [
      'an agent announcing an endpoint with another path is 400 bad_endpoint',
      'e5',
      () => b.issue('agent', 'e5'),
      url('127.0.0.1', 7443, '/admin'),
      400,
      'bad_endpoint',
    ],
    [
      'an agent announcing an endpoint with user info pointing elsewhere is 400 bad_endpoint',
      'e6',
      () => b.issue('agent', 'e6'),
      'wss://127.0.0.1@10.66.66.66:7443/v1/wake',
      400,
      'bad_endpoint',
    ],
    [
      'an agent announcing the unspecified address 0.0.0.0 is 400 bad_endpoint',
      'e7',
      () => b.issue('agent', 'e7'),
      url('0.0.0.0'),
      400,
      'bad_endpoint',
    ],
  ];

  it.each(endpointCases)('%s', async (_title, node, cred, u, status, code) => {
    const c = await cred();
    await refused(() => req(c, 'PUT', `/v1/nodes/${node}/endpoint`, { url: u }), status, code);
    expect((await b.asOperator('GET', `/v1/nodes/${node}`)).status).toBe(404);
  });
});

describe.skipIf(!built)('api: roles on routes', () => {
  // each: [title, who, method, path, body]
  const cases: Array<[string, () => Cred, string, string, unknown]> = [
    [
      "the controller's certificate creating a config is 403 wrong_role",
      () => b.cred('controller', 'controller'),
      'POST',
      '/v1/configs',
      { name: 'x', group: 'script', config: 'id' },
    ],
    [
      "the controller's certificate creating a deployment is 403 wrong_role",
      () => b.cred('controller', 'controller'),
      'POST',
      '/v1/deployments',
      { node: 'n1', config_id: 'x' },
    ],
    [
      "the controller's certificate reading /metrics is 403 wrong_role",
      () => b.cred('controller', 'controller'),
      'GET',
      '/metrics',
      undefined,
    ],
    [
      "the controller's certificate reading the event stream is 403 wrong_role",
      () => b.cred('controller', 'controller'),
      'GET',
      '/v1/events',
      undefined,
    ],
    [
      "the controller's certificate deleting a node is 403 wrong_role",
      () => b.cred('controller', 'controller'),
      'DELETE',
      '/v1/nodes/n2',
      undefined,
    ],
    [
      "an agent's certificate creating a config is 403 wrong_role",
      () => b.cred('agent', 'n1'),
      'POST',
      '/v1/configs',
      { name: 'x', group: 'script', config: 'id' },
    ],
    [
      "an agent's certificate creating a deployment on its own node is 403 wrong_role",
      () => b.cred('agent', 'n1'),
      'POST',
      '/v1/deployments',
      { node: 'n1', config_id: 'x' },
    ],
    [
      "an agent's certificate reading another deployment is 403 wrong_role",
      () => b.cred('agent', 'n1'),
      'GET',
      '/v1/deployments/__D2__',
      undefined,
    ],
    [
      "an agent's certificate reading the event stream is 403 wrong_role",
      () => b.cred('agent', 'n1'),
      'GET',
      '/v1/events',
      undefined,
    ],
    [
      "an agent's certificate restarting a cluster is 403 wrong_role",
      () => b.cred('agent', 'n1'),
      'PATCH',
      '/v1/clusters/x/actions/restart',
      {},
    ],
    [
      "an operator's certificate fetching a node's metadata is 403 wrong_role",
      () => b.cred('operator', 'admin'),
      'GET',
      '/v1/nodes/n1/metadata',
      undefined,
    ],
    [
      "an operator's certificate signalling a deployment is 403 wrong_role",
      () => b.cred('operator', 'admin'),
      'POST',
      '/v1/nodes/n2/deployments/__D2__/signal',
      { revision: 2, deploy_status_code: 1 },
    ],
  ];

  it.each(cases)('%s', async (_title, who, method, p, body) => {
    await refused(() => req(who(), method, p.replace('__D2__', d2), body), 403, 'wrong_role');
  });
});

describe.skipIf(!built)('api: certificates', () => {
  const cases: Array<[string, () => Partial<Cred>, string]> = [
    ['no client certificate is 403 no_client_certificate', () => ({ ca: b.caBuf }), 'no_client_certificate'],
    [
      'operator/admin from a foreign CA is 403 untrusted_certificate',
      () => atk.foreign('operator', 'admin'),
      'untrusted_certificate',
    ],
    [
      'a self-signed operator/admin is 403 untrusted_certificate',
      () => atk.forged('operator', 'admin'),
      'untrusted_certificate',
    ],
    [
      'an expired operator certificate is 403 certificate_expired',
      () => atk.expired('operator', 'admin'),
      'certificate_expired',
    ],
    ['a revoked operator certificate is 403 revoked', () => b.cred('operator', 'lost'), 'revoked'],
    [
      'an operator certificate of another trust domain is 403 wrong_trust_domain',
      () => atk.otherTrustDomain('operator', 'admin'),
      'wrong_trust_domain',
    ],
  ];

  it.each(cases)('%s', async (_title, who, code) => {
    await refused(() => req(who(), 'POST', '/v1/configs', { name: 'x', group: 'script', config: 'id' }), 403, code);
  });

  it('a TLS 1.2 client with the operator certificate fails the handshake', async () => {
    const err = await b.expectNoEffect(
      ['n1', 'n2'],
      () =>
        new Promise<string>((resolve) => {
          const s = tls.connect({
            host: '127.0.0.1',
            port: b.ctl.port,
            ...b.op,
            maxVersion: 'TLSv1.2',
            checkServerIdentity: () => undefined,
          });
          s.on('secureConnect', () => {
            s.destroy();
            resolve('connected');
          });
          s.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
        }),
    );
    expect(err).toMatch(/PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL|VERSION/);
  });

  it('plain HTTP to the API port gets no HTTP answer', async () => {
    const r = await b.expectNoEffect(['n1', 'n2'], () =>
      rawTcp(
        b.ctl.port,
        'POST /v1/configs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}',
      ),
    );
    expect(r.reply.toString('latin1')).not.toContain('HTTP/');
    expect(r.closedAfterMs).not.toBeNull();
  });
});

describe.skipIf(!built)('api: bodies', () => {
  const op = (): Cred => b.cred('operator', 'admin');
  const config = (over: Record<string, unknown>): Record<string, unknown> => ({
    name: 'evil',
    group: 'script',
    config: '#!/bin/sh\nid\n',
    ...over,
  });
  // each: [title, method, path, raw body or JSON, content type, status, code]
  const cases: Array<[string, string, string, unknown, string | undefined, number, string]> = [
    [
      'a config body over 1 MiB is 413 body_too_large',
      'POST',
      '/v1/configs',
      Buffer.from(JSON.stringify(config({ config: 'x'.repeat(1024 * 1024) }))),
      'application/json',
      413,
      'body_too_large',
    ],
    [
      'malformed JSON is 400 invalid_json',
      'POST',
      '/v1/configs',
      Buffer.from('{"name":"evil",'),
      'application/json',
      400,
      'invalid_json',
    ],
    [
      'a body that is not application/json is 415 unsupported_media_type',
      'POST',
      '/v1/configs',
      Buffer.from('name=evil&group=script'),
      'application/x-www-form-urlencoded',
      415,
      'unsupported_media_type',
    ],
    [
      'a JSON array where an object belongs is 400 invalid_request',
      'POST',
      '/v1/configs',
      [config({})],
      undefined,
      400,
      'invalid_request',
    ],
    [
      'an unknown field is 400 invalid_request',
      'POST',
      '/v1/configs',
      config({ run_as: 'root' }),
      undefined,
      400,
      'invalid_request',
    ],
    [
      'a component tool "../x" is 400 bad_name',
      'POST',
      '/v1/configs',
      config({ group: 'component', config: { configs: [{ actions: ['CREATE'], tool: '../x', config: 'id' }] } }),
      undefined,
      400,
      'bad_name',
    ],
    [
      'an output named "../../etc/shadow" is 400 bad_name',
      'POST',
      '/v1/configs',
      config({ outputs: [{ name: '../../etc/shadow' }] }),
      undefined,
      400,
      'bad_name',
    ],
    [
      'an input named LD_PRELOAD is 400 forbidden_input',
      'POST',
      '/v1/configs',
      config({ inputs: [{ name: 'LD_PRELOAD', default: '/tmp/evil.so' }] }),
      undefined,
      400,
      'forbidden_input',
    ],
    [
      'an input named BASH_ENV is 400 forbidden_input',
      'POST',
      '/v1/configs',
      config({ inputs: [{ name: 'BASH_ENV' }] }),
      undefined,
      400,
      'forbidden_input',
    ],
    [
      'an input named NODE_OPTIONS is 400 forbidden_input',
      'POST',
      '/v1/configs',
      config({ inputs: [{ name: 'NODE_OPTIONS' }] }),
      undefined,
      400,
      'forbidden_input',
    ],
    [
      'an input shadowing deploy_signal_id is 400 bad_name',
      'POST',
      '/v1/configs',
      config({ inputs: [{ name: 'deploy_signal_id' }] }),
      undefined,
      400,
      'bad_name',
    ],
    [
      'a group with "/" is 400 bad_name',
      'POST',
      '/v1/configs',
      config({ group: 'script/../../bin/sh' }),
      undefined,
      400,
      'bad_name',
    ],
    [
      'a deployment value for LD_PRELOAD is 400 forbidden_input',
      'POST',
      '/v1/deployments',
      { node: 'n1', config_id: '__CFG__', input_values: { LD_PRELOAD: '/tmp/evil.so' } },
      undefined,
      400,
      'forbidden_input',
    ],
    [
      'a deployment value for PATH is 400 forbidden_input',
      'POST',
      '/v1/deployments',
      { node: 'n1', config_id: '__CFG__', input_values: { PATH: '/tmp/evil' } },
      undefined,
      400,
      'forbidden_input',
    ],
    [
      'a patch setting deploy_server_id is 400 bad_name',
      'PATCH',
      '/v1/deployments/__D2__',
      { input_values: { deploy_server_id: 'n1' } },
      undefined,
      400,
      'bad_name',
    ],
  ];

  it.each(cases)('%s', async (_title, method, p, body, type, status, code) => {
    const path = p.replace('__D2__', d2);
    const o = Buffer.isBuffer(body) ? { rawBody: body, headers: { 'content-type': type! } } : {};
    const json = Buffer.isBuffer(body) ? undefined : JSON.parse(JSON.stringify(body).replace('__CFG__', configId));
    await refused(() => req(op(), method, path, json, o), status, code);
  });

  it('a chunked body over 1 MiB without Content-Length is 413 body_too_large', async () => {
    const chunk = 'x'.repeat(64 * 1024);
    const chunks = Array.from({ length: 20 }, () => `${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    await refused(
      () =>
        rawHttps(
          b.op,
          'POST /v1/configs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n',
          [...chunks, '0\r\n\r\n'],
        ),
      413,
      'body_too_large',
    );
  });

  it('a signal over 4 MiB is 413 body_too_large', async () => {
    const body = JSON.stringify({ revision: 2, deploy_status_code: 1, deploy_stdout: 'x'.repeat(4 * 1024 * 1024) });
    const head = `POST /v1/nodes/n2/deployments/${d2}/signal HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    await refused(() => rawHttps(b.cred('agent', 'n2'), head, [body]), 413, 'body_too_large');
  });
});

/**
 * One request written by hand, its answer read as it comes: the server may answer (and close)
 * before the body is all sent, which a Node client reports as EPIPE instead of the answer.
 */
function rawHttps(cred: Cred, head: string, body: string[]): Promise<Res> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({
      host: '127.0.0.1',
      port: b.ctl.port,
      ...cred,
      minVersion: 'TLSv1.3',
      checkServerIdentity: () => undefined,
    });
    let got = '';
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`no answer: ${got.slice(0, 200)}`));
    }, 10_000);
    s.on('secureConnect', () => {
      s.write(head);
      for (const c of body) s.write(c);
    });
    s.on('data', (d: Buffer) => {
      got += d.toString();
      const end = got.indexOf('\r\n\r\n');
      if (end < 0) return;
      const text = got.slice(end + 4);
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        return; // more to come
      }
      clearTimeout(timer);
      s.destroy();
      resolve({ status: Number(got.split(' ')[1]), headers: {}, raw: Buffer.from(text), text, json });
    });
    s.on('error', () => undefined); // EPIPE while the server already answered
  });
}

describe.skipIf(!built)('api: signals for revisions that are not the current one', () => {
  const cases: Array<[string, () => string, number, number, string]> = [
    ['a signal for an unknown deployment is 404 not_found', () => 'no-such-deployment', 1, 404, 'not_found'],
    ['a signal for an older revision is 409 stale_revision', () => d2, 1, 409, 'stale_revision'],
    ['a signal for a newer revision is 409 unknown_revision', () => d2, 3, 409, 'unknown_revision'],
  ];

  it.each(cases)('%s', async (_title, id, revision, status, code) => {
    await refused(
      () =>
        req(b.cred('agent', 'n2'), 'POST', `/v1/nodes/n2/deployments/${id()}/signal`, {
          revision,
          deploy_status_code: 1,
          deploy_stdout: 'pwned',
        }),
      status,
      code,
    );
  });
});

describe.skipIf(!built)('api: teardown', () => {
  it('leaves no process, socket or temp file behind', async () => {
    await b.close();
    expect(await b.leftovers()).toEqual([]);
  });
});
