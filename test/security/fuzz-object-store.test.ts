/**
 * Property-based fuzzing of Heat's object store (controller/heat/server.ts, docs/heat.md) over
 * real TLS, with no client certificate, against an in-process controller: random and mutated
 * paths, methods, headers, query strings and bodies; TempURL parameters mutated from a valid
 * signature; and a node's metadata from Heat mutated field by field, made extreme, or replaced by
 * random bytes. Every answer is a 2xx or a coded refusal whose status is the code's, never a 500;
 * a TempURL is accepted exactly when it is the one signed; a refused metadata write leaves the
 * stored object and the node's deployments as they were; and the controller logs no unexpected
 * error and still serves afterwards.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tokenDigest } from '../../controller/heat/tokens.js';
import { type ErrorCode, isErrorCode } from '../../protocol/errors.js';
import { startTestController, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';

const RUNS = Number(process.env.HERALD_FUZZ_RUNS ?? 400);
/** A guard against an input that hangs the store, not a performance figure (two shared cores). */
const MAX_ANSWER_MS = 10_000;
const KEY = 'f00dfeed0123456789abcdef01234567';
const TOKEN = 'fuzz-admin-token-0123456789';
const OTHER_TOKEN = 'fuzz-other-token-0123456789';
const ACCOUNT = '/v1/AUTH_admin';
const NEVER_S = 2147483586;
const OBJ = `${ACCOUNT}/c/o`;
const META = `${ACCOUNT}/n1/metadata.json`;
const SIGNAL = `${ACCOUNT}/stack/sig`;

/** The object store's refusals and their statuses (docs/heat.md, docs/errors.md). */
const STATUS_OF: Partial<Record<ErrorCode, number>> = {
  tempurl_invalid: 401,
  tempurl_expired: 401,
  tempurl_sha1_refused: 401,
  token_missing: 401,
  token_invalid: 401,
  token_wrong_project: 403,
  not_found: 404,
  method_not_allowed: 405,
  container_not_empty: 409,
  object_too_large: 413,
  object_store_full: 413,
  heat_metadata_invalid: 400,
};
const TEMPURL_CODES = ['tempurl_invalid', 'tempurl_expired', 'tempurl_sha1_refused'];

let pki: ControllerTestPki;
let t: TestController;
let tokenDir: string;
let agent: https.Agent;
const statuses = new Map<number, number>();

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
  ms: number;
}

interface Ask {
  method: string;
  path: string;
  headers?: Record<string, string>;
  body?: Buffer | string;
}

/** One request on a kept-alive connection presenting no certificate. */
function ask(a: Ask): Promise<Answer> {
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const data = a.body === undefined ? undefined : Buffer.from(a.body);
    const req = https.request(
      {
        host: '127.0.0.1',
        port: t.ctl.objectStoreAddress!.port,
        method: a.method,
        path: a.path,
        agent,
        headers: { ...a.headers, ...(data ? { 'Content-Length': String(data.length) } : {}) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          let json: unknown;
          try {
            json = body.length ? JSON.parse(body.toString('utf8')) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body, json, ms: performance.now() - t0 });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.setTimeout(MAX_ANSWER_MS, () => req.destroy(new Error(`no answer within ${MAX_ANSWER_MS} ms`)));
    req.end(data);
  });
}

/** The property every answer has: a 2xx, or a known code with its own status; never a 500. */
function check(a: Answer, q: Ask): void {
  const what = `${q.method} ${q.path.slice(0, 200)}`;
  statuses.set(a.status, (statuses.get(a.status) ?? 0) + 1);
  expect(a.status, `${what} → ${a.status} ${a.body.toString().slice(0, 200)}`).not.toBe(500);
  expect(a.headers['x-trans-id'], what).toBeDefined();
  if (a.status < 300) return;
  if (q.method === 'HEAD') {
    // no body to carry the code: the status must still be one of the store's refusals
    expect(Object.values(STATUS_OF), `${what} → ${a.status}`).toContain(a.status);
    return;
  }
  const code = a.json?.error?.code as unknown;
  expect(isErrorCode(code), `${what} → ${a.status} without a known code: ${a.body.toString().slice(0, 200)}`).toBe(
    true,
  );
  expect([what, code, STATUS_OF[code as ErrorCode]]).toEqual([what, code, a.status]);
  expect(typeof a.json.error.message).toBe('string');
}

async function checked(q: Ask): Promise<Answer> {
  const a = await ask(q);
  check(a, q);
  return a;
}

const sign = (method: string, expires: string | number, p: string, digest = 'sha256', key = KEY): string =>
  crypto.createHmac(digest, key).update(`${method}\n${expires}\n${p}`).digest('hex');

/** A metadata document with one item, as Heat writes it (docs/heat-object-store.md). */
function heatDoc(itemId = 'item-1'): Record<string, unknown> {
  return {
    deployments: [
      {
        id: itemId,
        name: 'hello',
        group: 'script',
        config: '#!/bin/sh\necho hello\n',
        inputs: [
          { name: 'greeting', type: 'String', value: 'mars' },
          { name: 'count', type: 'Number', default: 1, value: 2 },
          { name: 'deploy_server_id', type: 'String', value: 'srv-1' },
          { name: 'deploy_action', type: 'String', value: 'CREATE' },
          { name: 'deploy_stack_id', type: 'String', value: 'st/stack' },
          { name: 'deploy_resource_name', type: 'String', value: 'deployment' },
          { name: 'deploy_signal_transport', type: 'String', value: 'TEMP_URL_SIGNAL' },
          {
            name: 'deploy_signal_id',
            type: 'String',
            value: `https://127.0.0.1:1${SIGNAL}?temp_url_sig=${sign('PUT', NEVER_S, SIGNAL)}&temp_url_expires=${NEVER_S}`,
          },
        ],
        outputs: [{ name: 'result', type: 'String', error_output: false }],
        options: {},
      },
    ],
    'os-collect-config': { collectors: ['request'], request: { metadata_url: 'https://x/y' } },
  };
}

beforeAll(async () => {
  pki = await makeControllerTestPki();
  tokenDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-fuzz-os-'));
  const tokens = path.join(tokenDir, 'tokens');
  fs.writeFileSync(tokens, `${tokenDigest(TOKEN)} admin heat\n${tokenDigest(OTHER_TOKEN)} other\n`, { mode: 0o600 });
  t = await startTestController(pki, {
    objectStoreListen: { host: '127.0.0.1', port: 0 },
    objectStoreTokens: tokens,
    heatProjects: ['admin'],
  });
  agent = new https.Agent({ keepAlive: true, maxSockets: 4, ca: pki.ca, servername: 'localhost' });
  const op = pki.cred('operator', 'admin');
  for (const n of ['n1', 'n2']) expect((await t.req(op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
  const tok = { 'X-Auth-Token': TOKEN };
  expect(
    (await ask({ method: 'POST', path: ACCOUNT, headers: { ...tok, 'X-Account-Meta-Temp-Url-Key': KEY } })).status,
  ).toBe(204);
  for (const c of ['c', 'n1', 'n2', 'stack'])
    expect((await ask({ method: 'PUT', path: `${ACCOUNT}/${c}`, headers: tok })).status).toBe(201);
  expect((await ask({ method: 'PUT', path: OBJ, headers: tok, body: 'the object' })).status).toBe(201);
  expect((await ask({ method: 'PUT', path: SIGNAL, headers: tok, body: '' })).status).toBe(201);
  expect((await ask({ method: 'PUT', path: META, headers: tok, body: JSON.stringify(heatDoc()) })).status).toBe(201);
}, 60_000);

afterAll(async () => {
  agent?.destroy();
  await t?.close();
  pki?.cleanup();
  if (tokenDir) fs.rmSync(tokenDir, { recursive: true, force: true });
});

// ---- arbitraries ------------------------------------------------------------------------------

/** Printable ASCII: what an HTTP client may put in a header value. */
const printable = fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)) });
/** A path segment: random text percent-encoded, raw escapes (some broken), dot segments, slashes. */
const segment = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom('c', 'o', 'n1', 'n2', 'stack', 'sig', 'metadata.json') },
  fc.constantFrom('AUTH_admin', 'AUTH_other', 'AUTH_'),
  fc.constantFrom('..', '.', '%2e%2e', '%2E', '%2F', '%00', '%0a', '%7f', '%', '%zz', '%E0%A4%A', '%C0%AF', '', '~'),
  fc.string({ maxLength: 40 }).map(encodeURIComponent),
  fc.uint8Array({ maxLength: 12 }).map((b) => [...b].map((x) => `%${x.toString(16).padStart(2, '0')}`).join('')),
  fc.constantFrom('c'.repeat(257), 'o'.repeat(1025)),
);
const prefix = fc.oneof(
  { weight: 8, arbitrary: fc.constant(ACCOUNT) },
  fc.constantFrom('/v1/AUTH_other', '/v1/AUTH_nokey', '/v1', '', '/v2/AUTH_admin', '/v1/admin'),
  fc.constantFrom('http://x/v1/AUTH_admin', 'http://[bad/v1/AUTH_admin', '//v1/AUTH_admin', '*'),
  segment.map((s) => `/v1/AUTH_${s}`),
);
const pathArb = fc
  .tuple(prefix, fc.array(segment, { maxLength: 3 }), fc.boolean())
  .map(([p, segs, slash]) => `${p}${segs.map((s) => `/${s}`).join('')}${slash ? '/' : ''}` || '/');
const queryKey = fc.oneof(
  fc.constantFrom(
    'temp_url_sig',
    'temp_url_expires',
    'temp_url_prefix',
    'format',
    'limit',
    'marker',
    'multipart-manifest',
    'filename',
  ),
  fc.string({ maxLength: 10 }),
);
const queryValue = fc.oneof(
  fc.constantFrom('json', 'xml', '0', '-1', '10001', '1e3', String(NEVER_S), '99999999999999', ''),
  fc.string({ maxLength: 130 }),
  fc.stringMatching(/^[0-9a-fA-F]{40}$|^[0-9a-f]{64}$|^[0-9a-f]{128}$/),
);
const queryArb = fc
  .oneof({ weight: 2, arbitrary: fc.constant([]) }, fc.array(fc.tuple(queryKey, queryValue), { maxLength: 4 }))
  .map((kv) =>
    kv.length ? `?${kv.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('&')}` : '',
  );
// every method Node's HTTP parser takes, but CONNECT (a tunnel, not a request: Node has no handler for it)
const methodArb = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom('GET', 'HEAD', 'PUT', 'POST', 'DELETE') },
  fc.constantFrom(...http.METHODS.filter((m) => m !== 'CONNECT')),
);
const tokenArb = fc.oneof(
  { weight: 6, arbitrary: fc.constant<string | undefined>(TOKEN) },
  fc.constantFrom<string | undefined>(OTHER_TOKEN, 'notused', undefined, ''),
  printable.filter((s) => s.trim() === s),
);
const otherHeadersArb = fc.dictionary(
  fc.constantFrom(
    'X-Account-Meta-Temp-Url-Key',
    'Content-Type',
    'X-Object-Meta-Foo',
    'X-Versions-Location',
    'If-None-Match',
    'Range',
    'Expect',
  ),
  fc.oneof(
    fc.constantFrom(KEY, 'application/json', 'bytes=0-1', '*'),
    printable.filter((s) => s.trim() === s),
  ),
  { maxKeys: 3 },
);
const headersArb = fc
  .tuple(tokenArb, otherHeadersArb)
  .map(([token, h]): Record<string, string> => (token === undefined ? h : { ...h, 'X-Auth-Token': token }));
const bodyArb = fc.option(
  fc.oneof(fc.uint8Array({ maxLength: 4096 }).map(Buffer.from), fc.string({ maxLength: 2000 })),
  { nil: undefined },
);

/** Every place in a JSON value, as the parent and the key to change there. */
function places(v: unknown, out: Array<[Record<string, unknown> | unknown[], string | number]> = []) {
  const children: Array<[string | number, unknown]> = Array.isArray(v)
    ? v.map((c, i) => [i, c])
    : v !== null && typeof v === 'object'
      ? Object.entries(v)
      : [];
  for (const [k, c] of children) {
    out.push([v as Record<string, unknown> | unknown[], k]);
    places(c, out);
  }
  return out;
}

const edit = fc.record({
  at: fc.nat(),
  op: fc.constantFrom('replace', 'delete', 'add'),
  value: fc.oneof(
    fc.jsonValue({ maxDepth: 3 }),
    fc.constantFrom('HEAT_SIGNAL', 'NO_SIGNAL', 'DELETE', 'LD_PRELOAD', '../x', 'a/b', '', null, 'Json', 'Bogus'),
  ),
  key: fc.constantFrom('id', 'name', 'group', 'config', 'inputs', 'outputs', 'options', 'value', 'type', 'x'),
});

/** Heat's document with a few random edits: values replaced, keys removed or added anywhere. */
const mutatedDoc = fc
  .tuple(fc.array(edit, { minLength: 1, maxLength: 4 }), fc.string({ maxLength: 8 }))
  .map(([edits, id]) => {
    const doc = heatDoc(`item-${id}`);
    for (const e of edits) {
      const all = places(doc);
      // every key removed: an edit adds one to the document itself
      const [parent, key] = all.length ? all[e.at % all.length]! : [doc, e.key];
      if (e.op === 'replace') (parent as Record<string | number, unknown>)[key] = e.value;
      else if (e.op === 'delete') {
        if (Array.isArray(parent)) parent.splice(Number(key), 1);
        else delete parent[key as string];
      } else if (!Array.isArray(parent)) parent[e.key] = e.value;
    }
    return JSON.stringify(doc);
  });

/** Heat's document with one value made extreme, written as text (a deep one cannot be built as an object). */
const extremeDoc = fc
  .tuple(
    fc.constantFrom('"mars"', '"#!/bin/sh\\necho hello\\n"', '{}', '"hello"'),
    fc.oneof(
      fc.constantFrom(63, 64, 65, 5_000, 200_000).map((d) => `${'['.repeat(d)}1${']'.repeat(d)}`),
      fc.constantFrom(1_000, 100_000).map((n) => JSON.stringify('x'.repeat(n))),
      fc
        .constantFrom(500, 5_000)
        .map((n) => JSON.stringify(Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, i])))),
    ),
    fc.string({ maxLength: 8 }),
  )
  .map(([where, value, id]) => JSON.stringify(heatDoc(`x-${id}`)).replace(where, value));

/** Several items, some listed twice. */
const manyItems = fc.array(fc.string({ maxLength: 4 }), { minLength: 0, maxLength: 12 }).map((ids) => {
  const items = ids.map((id, i) => {
    const it = (heatDoc(`m-${id}`).deployments as Array<{ inputs: Array<{ name: string; value: unknown }> }>)[0]!;
    for (const inp of it.inputs) if (inp.name === 'deploy_resource_name') inp.value = `r-${id || i}`;
    return it;
  });
  return JSON.stringify({ deployments: items });
});

const metadataBody = fc.oneof(
  { weight: 4, arbitrary: mutatedDoc },
  { weight: 2, arbitrary: extremeDoc },
  { weight: 1, arbitrary: manyItems },
  { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)) },
  { weight: 1, arbitrary: fc.string({ maxLength: 300 }) },
);

/** The first of `values` more often than any other: mutations one or two at a time. */
const mostly = <T>(...values: T[]): fc.Arbitrary<T> =>
  fc.oneof({ weight: 3, arbitrary: fc.constant(values[0]!) }, fc.constantFrom(...values));

// ---- properties -------------------------------------------------------------------------------

describe('fuzz: the object store', () => {
  it('random paths, methods, headers, query strings and bodies get a 2xx or a coded refusal, never a 500', async () => {
    await fc.assert(
      fc.asyncProperty(methodArb, pathArb, queryArb, headersArb, bodyArb, async (method, p, query, headers, body) => {
        // Expect is answered by Node itself before the handler (100-continue, or 417 for anything else)
        if (headers.Expect !== undefined && headers.Expect.toLowerCase() !== '100-continue') delete headers.Expect;
        await checked({ method, path: `${p}${query}`, headers, ...(body !== undefined ? { body } : {}) });
      }),
      { numRuns: RUNS },
    );
  });

  it('a TempURL is accepted exactly when it is the one signed: mutated signatures, expiries, methods and paths', async () => {
    const mutation = fc.record({
      method: mostly('GET', 'HEAD', 'PUT', 'DELETE', 'POST'),
      signedFor: mostly('GET', 'HEAD', 'PUT', 'DELETE'),
      path: mostly(OBJ, `${ACCOUNT}/c/O`, `${ACCOUNT}/c/o/`, `${ACCOUNT}/c`, ACCOUNT, '/v1/AUTH_other/c/o'),
      signedPath: mostly(OBJ, `${ACCOUNT}/c/O`, `${ACCOUNT}/c`, `${ACCOUNT}/c/o2`, ACCOUNT),
      expires: fc.oneof(
        { weight: 3, arbitrary: fc.constant(String(NEVER_S)) },
        // a minute ago: right but expired
        { weight: 2, arbitrary: fc.constant(String(Math.floor(Date.now() / 1000) - 60)) },
        fc.constantFrom('1', '0', '-5', '2147483586.0', '+2147483586', ' 2147483586', '1e12', ''),
        fc.integer({ min: 0, max: 2 ** 40 }).map(String),
        fc.string({ maxLength: 14 }),
      ),
      digest: mostly('sha256', 'sha512', 'sha1', 'md5'),
      key: mostly(KEY, KEY.toUpperCase(), `${KEY} `, 'another-key'),
      sigEdit: fc.oneof(
        { weight: 4, arbitrary: fc.constant<'none' | 'upper'>('none') },
        fc.constant<'none' | 'upper'>('upper'),
        fc.record({ at: fc.nat(200), char: fc.constantFrom('0', 'f', 'g', 'Z', '%', '') }),
      ),
      extra: mostly('', '&temp_url_prefix=', '&temp_url_sig=00', '&x=1', '&temp_url_expires=1'),
      body: fc.option(fc.string({ maxLength: 100 }), { nil: undefined }),
    });
    // (the random requests before may have written it)
    let lastPut = 'the object';
    expect((await ask({ method: 'PUT', path: OBJ, headers: { 'X-Auth-Token': TOKEN }, body: lastPut })).status).toBe(
      201,
    );
    let served = 0;
    const codes = new Set<string>();
    await fc.assert(
      fc.asyncProperty(mutation, async (m) => {
        const expiresWritten = m.expires;
        let sig = sign(m.signedFor, expiresWritten, m.signedPath, m.digest, m.key);
        if (m.sigEdit === 'upper') sig = sig.toUpperCase();
        else if (m.sigEdit !== 'none') {
          const at = m.sigEdit.at % (sig.length + 1);
          sig = sig.slice(0, at) + m.sigEdit.char + sig.slice(at + 1);
        }
        const q = `temp_url_sig=${encodeURIComponent(sig)}&temp_url_expires=${encodeURIComponent(expiresWritten)}${m.extra}`;
        const body = m.method === 'PUT' ? (m.body ?? 'x') : undefined;
        const a = await checked({ method: m.method, path: `${m.path}?${q}`, ...(body !== undefined ? { body } : {}) });
        // the one signed: right key and path, SHA-256 or SHA-512, not expired, its method (GET's also
        // HEAD), on an object, with the signature as signed (hex of either case) and nothing added
        // but a parameter the store does not read (a second temp_url_sig or expiry: the first counts)
        const asSigned =
          m.sigEdit === 'none' ||
          m.sigEdit === 'upper' ||
          sig === sign(m.signedFor, expiresWritten, m.signedPath, m.digest, m.key);
        const good =
          m.key === KEY &&
          m.signedPath === m.path &&
          m.path !== `${ACCOUNT}/c` &&
          m.path !== ACCOUNT &&
          (m.digest === 'sha256' || m.digest === 'sha512') &&
          /^[0-9]{1,12}$/.test(expiresWritten) &&
          Number(expiresWritten) > Date.now() / 1000 &&
          ['GET', 'HEAD', 'PUT'].includes(m.method) &&
          (m.signedFor === m.method || (m.method === 'HEAD' && m.signedFor === 'GET')) &&
          asSigned &&
          m.extra !== '&temp_url_prefix=';
        if (good) {
          // served: a 2xx, or a GET or HEAD of an object that is not there
          expect([m, a.status]).toEqual([m, a.status < 300 ? a.status : 404]);
          if (m.method === 'PUT' && m.path === OBJ) lastPut = body!;
          served++;
        } else {
          expect([m, a.status < 300]).toEqual([m, false]);
          if (m.method !== 'HEAD' && a.status === 401) expect(TEMPURL_CODES).toContain(a.json.error.code);
          if (m.method !== 'HEAD' && a.status >= 400) codes.add(a.json.error.code as string);
        }
      }),
      { numRuns: RUNS },
    );
    // the mutations were near enough to be served at times, and were refused for every reason
    expect(served).toBeGreaterThan(0);
    for (const c of [...TEMPURL_CODES, 'method_not_allowed']) expect([c, codes.has(c)]).toEqual([c, true]);
    // only a TempURL signed for PUT wrote the object
    const o = await ask({ method: 'GET', path: OBJ, headers: { 'X-Auth-Token': TOKEN } });
    expect([o.status, o.body.toString()]).toEqual([200, lastPut]);
  });

  it("a node's metadata, mutated, made extreme or random, is stored whole or refused heat_metadata_invalid with nothing stored", async () => {
    const tok = { 'X-Auth-Token': TOKEN };
    let stored = JSON.stringify(heatDoc());
    expect((await ask({ method: 'PUT', path: META, headers: tok, body: stored })).status).toBe(201);
    const outcomes = { stored: 0, refused: 0 };
    const itemsIn = (text: string): number => {
      const d = JSON.parse(text) as { deployments?: unknown[] };
      return d.deployments?.length ?? 0;
    };
    const deployments = async (): Promise<number> => {
      const r = await t.req(pki.cred('operator', 'admin'), 'GET', '/v1/deployments?node=n1');
      expect(r.status).toBe(200);
      return (r.json.items as unknown[]).length;
    };
    await fc.assert(
      fc.asyncProperty(metadataBody, fc.boolean(), async (body, byTempUrl) => {
        const q: Ask = byTempUrl
          ? {
              method: 'PUT',
              path: `${META}?temp_url_sig=${sign('PUT', NEVER_S, META)}&temp_url_expires=${NEVER_S}`,
              body,
            }
          : { method: 'PUT', path: META, headers: tok, body };
        const a = await checked(q);
        outcomes[a.status === 201 ? 'stored' : 'refused']++;
        if (a.status === 201) stored = body;
        else
          expect([body.slice(0, 300), a.status, a.json?.error?.code]).toEqual([
            body.slice(0, 300),
            400,
            'heat_metadata_invalid',
          ]);
        const now = await ask({ method: 'GET', path: META, headers: tok });
        expect(now.body.toString()).toBe(stored);
        expect(await deployments()).toBe(itemsIn(stored));
      }),
      { numRuns: Math.ceil(RUNS / 4) },
    );
    expect(outcomes.stored).toBeGreaterThan(0);
    expect(outcomes.refused).toBeGreaterThan(0);
  });

  it('answered every input in bounded time, covered the refusals, logged no unexpected error and still serves', async () => {
    for (const s of [200, 201, 204, 400, 401, 403, 404, 405]) expect([s, statuses.has(s)]).toEqual([s, true]);
    expect(t.logLines().filter((l) => l.level === 50)).toEqual([]);
    const r = await ask({ method: 'GET', path: OBJ, headers: { 'X-Auth-Token': TOKEN } });
    expect(r.status).toBe(200);
    const h = await ask({
      method: 'HEAD',
      path: `${META}?temp_url_sig=${sign('GET', NEVER_S, META)}&temp_url_expires=${NEVER_S}`,
    });
    expect(h.status).toBe(200);
  });
});
