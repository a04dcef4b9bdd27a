/**
 * Property-based fuzzing of every API body schema (configs, deployments and their patches,
 * nodes, endpoints, signals, clusters and restarts) over real TLS against an in-process
 * controller: random JSON, valid bodies with fields swapped for random values or extra keys,
 * random bytes under random content types, and valid bodies made extreme (nested deep, arrays
 * wide, strings long, objects with many keys) in every free-form and named field. Every answer
 * is a coded 4xx refusal whose status matches its code, or a 2xx; never a 500; each within a
 * bounded time; and whatever was accepted, every read route still answers after it.
 */
import https from 'node:https';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { statusOf } from '../../controller/error-status.js';
import { isErrorCode, type ErrorCode } from '../../protocol/errors.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, type TestController } from '../helpers/controller-harness.js';

const GENEROUS = { burst: 1_000_000, perS: 1_000_000 };
/**
 * Longest any one answer may take: a guard against an input that hangs the controller (a parse
 * blow-up), not a performance figure. The suite shares two cores with everything it starts, where
 * a refused body once took 2.2 s to answer, so the bound is well above scheduling delays.
 */
const MAX_ANSWER_MS = 10_000;
const RUNS = Number(process.env.HERALD_FUZZ_RUNS ?? 200);
const ALLOWED = new Set([200, 201, 202, 204, 400, 403, 404, 409, 413, 415, 422, 429]);

let pki: ControllerTestPki;
let t: TestController;
const agents = new Map<string, https.Agent>();
let configId: string;
let deploymentId: string;
let clusterId: string;
const slow: Array<{ ms: number; what: string }> = [];
const statuses = new Map<number, number>();

beforeAll(async () => {
  pki = await makeControllerTestPki();
  t = await startTestController(
    pki,
    {},
    { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS, signal: GENEROUS } },
  );
  const op = pki.cred('operator', 'admin');
  for (const n of ['n1', 'n2'])
    expect((await send(op, 'POST', '/v1/nodes', JSON.stringify({ id: n }))).status).toBe(201);
  const cfg = await send(
    op,
    'POST',
    '/v1/configs',
    JSON.stringify({
      name: 'c',
      group: 'script',
      config: '#!/bin/sh\ntrue\n',
      inputs: [
        { name: 'x', type: 'Number' },
        { name: 'j', type: 'Json' },
      ],
      outputs: [{ name: 'out' }],
    }),
  );
  configId = cfg.json.id as string;
  deploymentId = (await send(op, 'POST', '/v1/deployments', JSON.stringify({ node: 'n1', config_id: configId }))).json
    .deployment_id as string;
  clusterId = (
    await send(
      op,
      'POST',
      '/v1/clusters',
      JSON.stringify({ name: 'k', nodes: ['n2'], install_config_id: configId, uninstall_config_id: configId }),
    )
  ).json.id as string;
}, 60_000);

afterAll(async () => {
  for (const a of agents.values()) a.destroy();
  await t?.close();
  pki?.cleanup();
});

interface Answer {
  status: number;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  ms: number;
}

/** One request on a kept-alive connection of `cred`'s identity. */
function send(
  cred: Cred,
  method: string,
  p: string,
  body: string | Buffer | undefined,
  contentType = 'application/json',
): Promise<Answer> {
  // the whole certificate: its PEM's tail is the same END line for every one (the last 40 base64
  // characters of it differed by one character, so two identities could share a pool of sockets)
  const key = cred.cert?.toString('base64') ?? 'none';
  let agent = agents.get(key);
  if (!agent) {
    agent = new https.Agent({
      keepAlive: true,
      maxSockets: 4,
      maxCachedSessions: 0,
      ...cred,
      checkServerIdentity: () => undefined,
    });
    agents.set(key, agent);
  }
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(body);
    const req = https.request(
      {
        host: '127.0.0.1',
        port: t.port,
        method,
        path: p,
        agent,
        headers: data ? { 'content-type': contentType, 'content-length': String(data.length) } : {},
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json: unknown;
          try {
            json = text ? JSON.parse(text) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, json, ms: performance.now() - t0 });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
    req.end(data);
  });
}

/** The property every answer must have. */
function check(a: Answer, what: string): void {
  statuses.set(a.status, (statuses.get(a.status) ?? 0) + 1);
  if (a.ms > MAX_ANSWER_MS) slow.push({ ms: a.ms, what });
  expect(a.status, `${what} → ${a.status} ${JSON.stringify(a.json)?.slice(0, 200)}`).not.toBe(500);
  expect(ALLOWED.has(a.status), `${what} → ${a.status}`).toBe(true);
  if (a.status >= 400) {
    const code = a.json?.error?.code as unknown;
    expect(
      isErrorCode(code),
      `${what} → ${a.status} without a known code: ${JSON.stringify(a.json)?.slice(0, 200)}`,
    ).toBe(true);
    expect(statusOf(code as ErrorCode)).toBe(a.status);
    expect(typeof a.json.error.message).toBe('string');
  } else if (a.status !== 204) {
    expect(typeof a.json).toBe('object');
  }
}

const anyJson = fc.jsonValue({ maxDepth: 4 });
/** A valid field value, or anything at all. */
const or = <T>(valid: fc.Arbitrary<T>): fc.Arbitrary<unknown> =>
  fc.oneof({ weight: 3, arbitrary: valid }, { weight: 1, arbitrary: anyJson });
const maybe = <T>(a: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> => fc.option(a, { nil: undefined });
const name = fc.oneof(
  fc.constantFrom(
    'x',
    'PATH',
    'LD_PRELOAD',
    '../x',
    '__proto__',
    'constructor',
    'deploy_action',
    'a/b',
    'heat_outputs_path',
  ),
  fc.string({ maxLength: 20 }),
);
const types = fc.constantFrom('String', 'Number', 'CommaDelimitedList', 'Json', 'Boolean', 'Bogus');
const actions = fc.constantFrom('CREATE', 'UPDATE', 'DELETE', 'SUSPEND', 'RESUME', 'CHECK', 'RESTART', 'create', '');
const nodeIds = fc.oneof(fc.constantFrom('n1', 'n2', 'n9', 'N1', '../n1', ''), fc.string({ maxLength: 70 }));
/** A valid-shaped object with random extra keys, some fields dropped. */
const shaped = (fields: Record<string, fc.Arbitrary<unknown>>): fc.Arbitrary<Record<string, unknown>> =>
  fc
    .tuple(
      fc.record(fields, { requiredKeys: [] }),
      fc.dictionary(name, anyJson, { maxKeys: 2 }),
      fc.integer({ min: 0, max: 4 }),
    )
    .map(([o, extra, dice]) => (dice > 0 ? o : { ...o, ...extra }));

interface Target {
  name: string;
  who: () => Cred;
  method: string;
  path: () => string;
  body: fc.Arbitrary<unknown>;
}

const op = (): Cred => pki.cred('operator', 'admin');
const n1 = (): Cred => pki.cred('agent', 'n1');

const targets: Target[] = [
  {
    name: 'POST /v1/configs',
    who: op,
    method: 'POST',
    path: () => '/v1/configs',
    body: shaped({
      name: or(fc.string({ minLength: 1, maxLength: 30 })),
      group: or(fc.constantFrom('script', 'component', 'ansible', 'a/b', '../x', '')),
      config: or(
        fc.oneof(
          fc.string(),
          fc.record({
            configs: fc.array(
              shaped({
                actions: or(fc.array(actions)),
                tool: or(fc.constantFrom('script', '../x', 'component')),
                config: anyJson,
              }),
              { maxLength: 3 },
            ),
          }),
        ),
      ),
      inputs: or(
        fc.array(
          shaped({
            name: or(name),
            type: or(types),
            default: anyJson,
            description: or(fc.string()),
            hidden: or(fc.boolean()),
          }),
          { maxLength: 4 },
        ),
      ),
      outputs: or(
        fc.array(shaped({ name: or(name), type: or(types), error_output: or(fc.boolean()) }), { maxLength: 4 }),
      ),
      options: or(fc.record({ timeout: or(fc.oneof(fc.integer(), fc.double())) })),
    }),
  },
  {
    name: 'POST /v1/deployments',
    who: op,
    method: 'POST',
    path: () => '/v1/deployments',
    body: shaped({
      node: or(nodeIds),
      config_id: or(fc.constantFrom('__CFG__', 'nope', '')),
      name: or(fc.string({ maxLength: 30 })),
      actions: or(fc.array(actions, { maxLength: 8 })),
      action: or(actions),
      input_values: or(fc.dictionary(name, anyJson, { maxKeys: 4 })),
    }),
  },
  {
    name: 'PATCH /v1/deployments/{id}',
    who: op,
    method: 'PATCH',
    path: () => `/v1/deployments/${deploymentId}`,
    body: shaped({ input_values: or(fc.dictionary(name, anyJson, { maxKeys: 4 })), action: or(actions) }),
  },
  {
    name: 'POST /v1/nodes',
    who: op,
    method: 'POST',
    path: () => '/v1/nodes',
    body: shaped({
      id: or(nodeIds),
      endpoint: or(
        fc.oneof(
          fc.constant(null),
          fc.webUrl(),
          fc.constantFrom('wss://127.0.0.1:7443/v1/wake', 'wss://169.254.169.254/v1/wake'),
        ),
      ),
    }),
  },
  {
    name: 'PUT /v1/nodes/{node}/endpoint',
    who: n1,
    method: 'PUT',
    path: () => '/v1/nodes/n1/endpoint',
    body: shaped({
      url: or(
        fc.oneof(
          fc.webUrl(),
          fc.constantFrom(
            'wss://127.0.0.1:7443/v1/wake',
            'wss://[fe80::1]:7443/v1/wake',
            'wss://localhost:1/v1/wake',
            'wss://10.0.0.1:7443/v1/wake',
          ),
        ),
      ),
    }),
  },
  {
    name: 'POST /v1/nodes/{node}/deployments/{id}/signal',
    who: n1,
    method: 'POST',
    path: () => `/v1/nodes/n1/deployments/${deploymentId}/signal`,
    body: shaped({
      revision: or(fc.integer({ min: -2, max: 4 })),
      deploy_status_code: or(fc.integer()),
      deploy_stdout: or(fc.string()),
      deploy_stderr: or(fc.string()),
      outputs: or(fc.dictionary(name, anyJson, { maxKeys: 3 })),
      status_reason: or(fc.string()),
    }),
  },
  {
    name: 'POST /v1/clusters',
    who: op,
    method: 'POST',
    path: () => '/v1/clusters',
    body: shaped({
      name: or(fc.string({ minLength: 1, maxLength: 20 })),
      nodes: or(fc.array(nodeIds, { maxLength: 4 })),
      install_config_id: or(fc.constantFrom('__CFG__', 'nope')),
      uninstall_config_id: or(fc.constantFrom('__CFG__', 'nope')),
      input_values: or(fc.dictionary(name, anyJson, { maxKeys: 3 })),
    }),
  },
  {
    name: 'PATCH /v1/clusters/{id}/actions/restart',
    who: op,
    method: 'PATCH',
    path: () => `/v1/clusters/${clusterId}/actions/restart`,
    body: maybe(shaped({ max_unavailable: or(fc.integer({ min: -1, max: 5 })) })),
  },
  {
    // a dry run: the same checks as an upgrade, and nothing starts (the cluster stays idle for the others)
    name: 'PATCH /v1/clusters/{id}',
    who: op,
    method: 'PATCH',
    path: () => `/v1/clusters/${clusterId}`,
    body: shaped({
      install_config_id: or(fc.constantFrom('__CFG__', 'nope')),
      input_values: or(fc.dictionary(name, anyJson, { maxKeys: 3 })),
      canary: or(fc.oneof(fc.integer({ min: -1, max: 5 }), fc.constantFrom('10%', '0%', '200%'))),
      on_failure: or(fc.constantFrom('pause', 'abort', 'revert', 'retry')),
      gate: or(
        fc.record({
          url: or(fc.oneof(fc.webUrl(), fc.constantFrom('https://u:p@gate.example/'))),
          prometheus: or(fc.webUrl()),
          query: or(fc.string()),
        }),
      ),
      progress_deadline_s: or(fc.integer({ min: -1, max: 700_000 })),
    }).map((o) => ({ ...o, dry_run: true })),
  },
];

/** A value made extreme in one way, written as JSON text (a deep one is too deep to stringify). */
interface Extreme {
  what: string;
  json: string;
}

const extremeValue: fc.Arbitrary<Extreme> = fc.oneof(
  fc
    .constantFrom(63, 64, 65, 500, 5_000, 100_000)
    .map((d) => ({ what: `nested ${d}`, json: `${'['.repeat(d)}1${']'.repeat(d)}` })),
  fc
    .constantFrom(63, 64, 65, 3_000)
    .map((d) => ({ what: `objects nested ${d}`, json: `${'{"a":'.repeat(d)}1${'}'.repeat(d)}` })),
  fc
    .constantFrom(1_000, 20_000, 60_000)
    .map((n) => ({ what: `array of ${n}`, json: JSON.stringify(Array.from({ length: n }, (_, i) => ({ i }))) })),
  fc
    .constantFrom(1_000, 100_000, 900_000, 2_000_000)
    .map((n) => ({ what: `string of ${n}`, json: JSON.stringify('x\u00e9"\n'.repeat(Math.ceil(n / 6)).slice(0, n)) })),
  fc.constantFrom(100, 5_000, 40_000).map((n) => ({
    what: `${n} keys`,
    json: JSON.stringify(Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, i]))),
  })),
);

interface ExtremeTarget {
  name: string;
  who: () => Cred;
  method: string;
  path: () => string;
  /** A valid body with `v` in one of its free-form or named fields, as JSON text. */
  body: (v: Extreme) => Promise<string>;
}

/** Puts `v` where the placeholder string stands in `template`. */
const place = (template: unknown, v: Extreme): string =>
  JSON.stringify(template).replace('"__V__"', v.json).replaceAll('__CFG__', configId);
const pick = <T>(v: Extreme, options: T[]): T => options[v.json.length % options.length]!;

const extremeTargets: ExtremeTarget[] = [
  {
    name: 'POST /v1/configs',
    who: op,
    method: 'POST',
    path: () => '/v1/configs',
    body: async (v) =>
      place(
        pick(v, [
          { name: 'e', group: 'script', config: '__V__' },
          { name: 'e', group: 'script', config: 'x', options: { o: '__V__' } },
          { name: 'e', group: 'script', config: 'x', inputs: [{ name: 'j', type: 'Json', default: '__V__' }] },
          {
            name: 'e',
            group: 'component',
            config: { configs: [{ actions: ['CREATE'], tool: 'script', config: '__V__' }] },
          },
          { name: '__V__', group: 'script', config: 'x' },
        ]),
        v,
      ),
  },
  {
    name: 'POST /v1/deployments',
    who: op,
    method: 'POST',
    path: () => '/v1/deployments',
    body: async (v) =>
      place(
        pick(v, [
          { node: 'n1', config_id: '__CFG__', input_values: { j: '__V__' } },
          { node: 'n1', config_id: '__CFG__', input_values: '__V__' },
          { node: 'n1', config_id: '__CFG__', name: '__V__' },
        ]),
        v,
      ),
  },
  {
    name: 'PATCH /v1/deployments/{id}',
    who: op,
    method: 'PATCH',
    path: () => `/v1/deployments/${deploymentId}`,
    body: async (v) => place(pick(v, [{ input_values: { j: '__V__' } }, { input_values: '__V__' }]), v),
  },
  {
    name: 'POST /v1/nodes',
    who: op,
    method: 'POST',
    path: () => '/v1/nodes',
    body: async (v) => place(pick(v, [{ id: '__V__' }, { id: 'e1', endpoint: '__V__' }]), v),
  },
  {
    name: 'PUT /v1/nodes/{node}/endpoint',
    who: n1,
    method: 'PUT',
    path: () => '/v1/nodes/n1/endpoint',
    body: async (v) => place({ url: '__V__' }, v),
  },
  {
    name: 'POST /v1/nodes/{node}/deployments/{id}/signal',
    who: n1,
    method: 'POST',
    path: () => `/v1/nodes/n1/deployments/${deploymentId}/signal`,
    body: async (v) => {
      const revision = (await send(op(), 'GET', `/v1/deployments/${deploymentId}`, undefined)).json.revision as number;
      if (v.json.length % 2 === 0) await send(op(), 'PATCH', `/v1/deployments/${deploymentId}`, '{}'); // a fresh revision to record into
      const current = revision + (v.json.length % 2 === 0 ? 1 : 0);
      return place(
        pick(v, [
          { revision: current, deploy_status_code: 0, outputs: { out: '__V__' } },
          { revision: current, deploy_status_code: 0, outputs: '__V__' },
          { revision: current, deploy_status_code: 0, deploy_stdout: '__V__' },
          { revision: current, deploy_status_code: 1, status_reason: '__V__' },
        ]),
        v,
      );
    },
  },
  {
    name: 'POST /v1/clusters',
    who: op,
    method: 'POST',
    path: () => '/v1/clusters',
    body: async (v) =>
      place(
        pick(v, [
          {
            name: 'e',
            nodes: ['e9'],
            install_config_id: '__CFG__',
            uninstall_config_id: '__CFG__',
            input_values: { j: '__V__' },
          },
          { name: 'e', nodes: '__V__', install_config_id: '__CFG__', uninstall_config_id: '__CFG__' },
          { name: '__V__', nodes: ['e9'], install_config_id: '__CFG__', uninstall_config_id: '__CFG__' },
        ]),
        v,
      ),
  },
  {
    name: 'PATCH /v1/clusters/{id}/actions/restart',
    who: op,
    method: 'PATCH',
    path: () => `/v1/clusters/${clusterId}/actions/restart`,
    body: async (v) => place({ max_unavailable: '__V__' }, v),
  },
  {
    name: 'PATCH /v1/clusters/{id}',
    who: op,
    method: 'PATCH',
    path: () => `/v1/clusters/${clusterId}`,
    body: async (v) =>
      place(
        pick(v, [
          { install_config_id: '__CFG__', input_values: { j: '__V__' }, dry_run: true },
          { install_config_id: '__CFG__', gate: { url: '__V__' }, dry_run: true },
          { install_config_id: '__CFG__', canary: '__V__', dry_run: true },
        ]),
        v,
      ),
  },
];

function encode(body: unknown): string | undefined {
  return body === undefined ? undefined : (JSON.stringify(body) ?? 'null').replaceAll('__CFG__', configId);
}

describe('fuzz: API bodies', () => {
  it.each(targets.map((x) => [x.name, x] as const))(
    '%s: random JSON gets a coded 4xx or a 2xx, never a 500',
    async (_name, target) => {
      await fc.assert(
        fc.asyncProperty(anyJson, async (body) => {
          check(
            await send(target.who(), target.method, target.path(), encode(body)),
            `${target.name} ${JSON.stringify(body)?.slice(0, 100)}`,
          );
        }),
        { numRuns: RUNS },
      );
    },
  );

  it.each(targets.map((x) => [x.name, x] as const))(
    '%s: mutated valid bodies get a coded 4xx or a 2xx, never a 500',
    async (_name, target) => {
      await fc.assert(
        fc.asyncProperty(target.body, async (body) => {
          check(
            await send(target.who(), target.method, target.path(), encode(body)),
            `${target.name} ${encode(body)?.slice(0, 200)}`,
          );
        }),
        { numRuns: RUNS },
      );
    },
  );

  it('random bytes under random content types on every body route get a coded 4xx, never a 500', async () => {
    const contentType = fc.constantFrom(
      'application/json',
      'application/merge-patch+json',
      'text/plain',
      'application/x-www-form-urlencoded',
      '',
      'application/json; charset=utf-16',
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...targets),
        fc.uint8Array({ maxLength: 512 }),
        contentType,
        async (target, bytes, type) => {
          const a = await send(target.who(), target.method, target.path(), Buffer.from(bytes), type);
          check(a, `${target.name} ${bytes.length} random bytes as ${type}`);
        },
      ),
      { numRuns: RUNS * 2 },
    );
  });

  it('deeply nested JSON gets a coded 4xx or a 2xx, never a 500', async () => {
    for (const depth of [100, 1_000, 10_000]) {
      const deep = `${'['.repeat(depth)}${']'.repeat(depth)}`;
      for (const target of targets)
        check(
          await send(target.who(), target.method, target.path(), `{"config":${deep},"input_values":{"x":${deep}}}`),
          `${target.name} depth ${depth}`,
        );
    }
  });

  it.each(extremeTargets.map((x) => [x.name, x] as const))(
    '%s: valid bodies made extreme get a coded 4xx or a 2xx, and every read route answers after',
    async (_name, target) => {
      await fc.assert(
        fc.asyncProperty(extremeValue, async (v) => {
          const body = await target.body(v);
          check(await send(target.who(), target.method, target.path(), body), `${target.name} ${v.what}`);
        }),
        { numRuns: Math.max(20, RUNS / 5) },
      );
      for (const p of [
        '/v1/nodes',
        '/v1/configs',
        '/v1/deployments',
        `/v1/deployments/${deploymentId}`,
        `/v1/deployments/${deploymentId}/revisions`,
        '/v1/clusters',
        `/v1/clusters/${clusterId}`,
        '/v1/audit',
      ]) {
        const a = await send(op(), 'GET', p, undefined);
        expect({ p, status: a.status }).toEqual({ p, status: 200 });
      }
      const md = await send(n1(), 'GET', '/v1/nodes/n1/metadata', undefined);
      // (the answer in the message: a refusal here names its code)
      expect(md.status, `n1's metadata → ${md.status} ${JSON.stringify(md.json)?.slice(0, 300)}`).toBe(200);
    },
  );

  it('took bounded time per input and logged no unexpected error', () => {
    expect(slow).toEqual([]);
    expect(t.logText()).not.toContain('request failed unexpectedly');
    // the fuzzing reached both sides: refusals and acceptances
    const accepted = [...statuses].filter(([s]) => s < 300).reduce((n, [, c]) => n + c, 0);
    const refused = [...statuses].filter(([s]) => s >= 400).reduce((n, [, c]) => n + c, 0);
    expect(accepted).toBeGreaterThan(0);
    expect(refused).toBeGreaterThan(0);
  });
});
