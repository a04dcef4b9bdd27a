/**
 * Heat's object store as a client without a certificate meets it (controller/heat/server.ts,
 * docs/heat.md, docs/heat-object-store.md): a controller started in-process with its object store
 * on 127.0.0.1:0 and a static token file, real HTTPS requests that present no client certificate
 * (as python-swiftclient and python-requests), every refusal asserted on its status and code.
 * TempURLs (exact method and object, GET → HEAD, SHA-1 refused, expiry), the write-once temp-url
 * key, tokens and projects, the size and name limits, what a node's metadata from Heat does (and
 * that a malformed one stores nothing), Last-Modified's rounding, and the refusal log's summary.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lastModified } from '../../controller/heat/server.js';
import { tokenDigest } from '../../controller/heat/tokens.js';
import { OBJECT_STORE_MAX_HOST_CONNECTIONS, OBJECT_STORE_OBJECT_MAX_BYTES } from '../../protocol/limits.js';
import { startTestController, type TestController, waitFor } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';

/** Heat's "never": `2^31 - 1 - 60`, the expiry of every TempURL it mints (docs/heat-object-store.md). */
const HEAT_NEVER_S = 2147483586;
const KEY = 'a3f1c0ffee5eed0123456789abcdef01';
const OTHER_KEY = 'b3f1c0ffee5eed0123456789abcdef02';
/** The account Heat uses in the fixture, the static file's `admin` project. */
const ACCOUNT = '/v1/AUTH_admin';
const TOKEN = 'tok-admin-0123456789abcdef';
const OTHER_TOKEN = 'tok-other-0123456789abcdef';
const ANY_TOKEN = 'tok-any-0123456789abcdef';
const STACK = 'e9f4eada-06e8-445b-84bb-883c6e531bc5';
const SIGNAL = `${ACCOUNT}/${STACK}/st-deployment-pvgxugnsafp2`;

interface StoreRes {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  raw: Buffer;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

interface StoreReq {
  token?: string;
  headers?: Record<string, string>;
  body?: Buffer | string;
}

let pki: ControllerTestPki;
let op: Cred;
let tokenDir: string;
let tokenFile: string;

/** A token file as an operator writes it: digests, each line scoped to a project or to any (`*`). */
function writeTokenFile(): string {
  tokenDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-os-tokens-'));
  const file = path.join(tokenDir, 'tokens');
  fs.writeFileSync(
    file,
    [
      '# standalone Heat',
      `${tokenDigest(TOKEN)} admin heat`,
      `${tokenDigest(OTHER_TOKEN)} other other-heat`,
      `${tokenDigest(ANY_TOKEN)} * any`,
      '',
    ].join('\n'),
    { mode: 0o600 },
  );
  return file;
}

async function startStore(): Promise<TestController> {
  const t = await startTestController(pki, {
    objectStoreListen: { host: '127.0.0.1', port: 0 },
    objectStoreTokens: tokenFile,
    heatProjects: ['admin'],
  });
  expect(t.ctl.objectStoreAddress).not.toBeNull();
  return t;
}

/** One request to the object store on a fresh connection: the CA only, no client certificate. */
function storeReq(t: TestController, method: string, p: string, o: StoreReq = {}): Promise<StoreRes> {
  return new Promise((resolve, reject) => {
    const data = o.body === undefined ? undefined : Buffer.from(o.body);
    const req = https.request(
      {
        host: '127.0.0.1',
        port: t.ctl.objectStoreAddress!.port,
        method,
        path: p,
        ca: pki.ca,
        servername: 'localhost',
        agent: false,
        headers: {
          ...(o.token !== undefined ? { 'X-Auth-Token': o.token } : {}),
          ...(data ? { 'Content-Length': String(data.length) } : {}),
          ...o.headers,
        },
      },
      (res) => collect(res, resolve, reject),
    );
    req.on('error', reject);
    req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
    req.end(data);
  });
}

function collect(
  res: import('node:http').IncomingMessage,
  resolve: (r: StoreRes) => void,
  reject: (e: Error) => void,
): void {
  const chunks: Buffer[] = [];
  res.on('data', (c: Buffer) => chunks.push(c));
  res.on('end', () => {
    const raw = Buffer.concat(chunks);
    let json: unknown;
    try {
      json = raw.length ? JSON.parse(raw.toString('utf8')) : undefined;
    } catch {
      json = undefined;
    }
    resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, json });
  });
  res.on('error', reject);
}

/** A TempURL as python-swiftclient builds it: `?temp_url_sig=<hex HMAC>&temp_url_expires=<s>`. */
function tempUrl(
  p: string,
  method: string,
  o: { key?: string; expires?: number; digest?: 'sha1' | 'sha256' | 'sha512'; signedPath?: string } = {},
): string {
  const expires = o.expires ?? HEAT_NEVER_S;
  const sig = crypto
    .createHmac(o.digest ?? 'sha256', o.key ?? KEY)
    .update(`${method}\n${expires}\n${o.signedPath ?? p}`)
    .digest('hex');
  return `${p}?temp_url_sig=${sig}&temp_url_expires=${expires}`;
}

const code = (r: StoreRes): unknown => r.json?.error?.code;
/** Status and code of a refusal, for one assertion that shows both. */
const refusal = (r: StoreRes): [number, unknown] => [r.status, code(r)];

beforeAll(async () => {
  pki = await makeControllerTestPki();
  op = pki.cred('operator', 'admin');
  tokenFile = writeTokenFile();
}, 60_000);

afterAll(() => {
  pki?.cleanup();
  if (tokenDir) fs.rmSync(tokenDir, { recursive: true, force: true });
});

describe('object store: TempURLs', () => {
  let t: TestController;
  const OBJ = `${ACCOUNT}/c/o`;

  beforeAll(async () => {
    t = await startStore();
    expect(
      (await storeReq(t, 'POST', ACCOUNT, { token: TOKEN, headers: { 'X-Account-Meta-Temp-Url-Key': KEY } })).status,
    ).toBe(204);
    expect((await storeReq(t, 'PUT', `${ACCOUNT}/c`, { token: TOKEN })).status).toBe(201);
    expect((await storeReq(t, 'PUT', OBJ, { token: TOKEN, body: 'first' })).status).toBe(201);
    expect((await storeReq(t, 'PUT', `${ACCOUNT}/c/p`, { token: TOKEN, body: 'another' })).status).toBe(201);
  });

  afterAll(async () => {
    await t?.close();
  });

  it('a GET signature reads the object, with no token', async () => {
    const r = await storeReq(t, 'GET', tempUrl(OBJ, 'GET'));
    expect(r.status).toBe(200);
    expect(r.raw.toString()).toBe('first');
  });

  it('a PUT signature writes the object, with no token', async () => {
    const w = await storeReq(t, 'PUT', tempUrl(`${ACCOUNT}/c/w`, 'PUT'), { body: 'written by a TempURL' });
    expect(w.status).toBe(201);
    const r = await storeReq(t, 'GET', `${ACCOUNT}/c/w`, { token: TOKEN });
    expect([r.status, r.raw.toString()]).toEqual([200, 'written by a TempURL']);
  });

  it('a GET signature authorises HEAD (a node HEADs, then GETs)', async () => {
    const r = await storeReq(t, 'HEAD', tempUrl(OBJ, 'GET'));
    expect(r.status).toBe(200);
    expect(r.headers['content-length']).toBe('5');
  });

  it('a GET signature does not authorise PUT or DELETE, and nothing changes', async () => {
    const signed = tempUrl(OBJ, 'GET');
    expect(refusal(await storeReq(t, 'PUT', signed, { body: 'forged' }))).toEqual([401, 'tempurl_invalid']);
    expect(refusal(await storeReq(t, 'DELETE', signed))).toEqual([401, 'tempurl_invalid']);
    const r = await storeReq(t, 'GET', OBJ, { token: TOKEN });
    expect([r.status, r.raw.toString()]).toEqual([200, 'first']);
  });

  it('a PUT signature does not authorise GET or HEAD', async () => {
    const signed = tempUrl(OBJ, 'PUT');
    expect(refusal(await storeReq(t, 'GET', signed))).toEqual([401, 'tempurl_invalid']);
    const h = await storeReq(t, 'HEAD', signed);
    expect(h.status).toBe(401);
  });

  it("a signature for another object's path is tempurl_invalid", async () => {
    // signed for c/p, used on c/o
    const forged = tempUrl(OBJ, 'GET', { signedPath: `${ACCOUNT}/c/p` });
    expect(refusal(await storeReq(t, 'GET', forged))).toEqual([401, 'tempurl_invalid']);
    // the same object of another account
    const other = tempUrl('/v1/AUTH_other/c/o', 'GET', { signedPath: OBJ });
    expect(refusal(await storeReq(t, 'GET', other))).toEqual([401, 'tempurl_invalid']);
  });

  it('a signature under another key is tempurl_invalid', async () => {
    expect(refusal(await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { key: OTHER_KEY })))).toEqual([
      401,
      'tempurl_invalid',
    ]);
  });

  it('an expired TempURL is tempurl_expired', async () => {
    const past = Math.floor(Date.now() / 1000) - 10;
    expect(refusal(await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { expires: past })))).toEqual([401, 'tempurl_expired']);
  });

  it('an expiry of 2147483586 (Heat\'s "never") is accepted', async () => {
    expect((await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { expires: HEAT_NEVER_S }))).status).toBe(200);
  });

  it('an HMAC-SHA1 signature (40 hex digits) is tempurl_sha1_refused, even when it is right', async () => {
    expect(refusal(await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { digest: 'sha1' })))).toEqual([
      401,
      'tempurl_sha1_refused',
    ]);
  });

  it('an HMAC-SHA512 signature is accepted', async () => {
    const r = await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { digest: 'sha512' }));
    expect([r.status, r.raw.toString()]).toEqual([200, 'first']);
  });

  it('a prefix TempURL (temp_url_prefix) is tempurl_invalid', async () => {
    const sig = crypto.createHmac('sha256', KEY).update(`GET\n${HEAT_NEVER_S}\nprefix:${ACCOUNT}/c/`).digest('hex');
    const p = `${OBJ}?temp_url_sig=${sig}&temp_url_expires=${HEAT_NEVER_S}&temp_url_prefix=`;
    expect(refusal(await storeReq(t, 'GET', p))).toEqual([401, 'tempurl_invalid']);
    // the prefix parameter added to an otherwise right signature
    expect(refusal(await storeReq(t, 'GET', `${tempUrl(OBJ, 'GET')}&temp_url_prefix=`))).toEqual([
      401,
      'tempurl_invalid',
    ]);
  });

  it('a TempURL on an account with no key set is tempurl_invalid', async () => {
    expect(refusal(await storeReq(t, 'GET', tempUrl('/v1/AUTH_nokey/c/o', 'GET')))).toEqual([401, 'tempurl_invalid']);
  });

  it('a TempURL on an account or a container is tempurl_invalid', async () => {
    expect(refusal(await storeReq(t, 'GET', tempUrl(ACCOUNT, 'GET')))).toEqual([401, 'tempurl_invalid']);
    expect(refusal(await storeReq(t, 'GET', tempUrl(`${ACCOUNT}/c`, 'GET')))).toEqual([401, 'tempurl_invalid']);
    expect(refusal(await storeReq(t, 'PUT', tempUrl(`${ACCOUNT}/c2`, 'PUT')))).toEqual([401, 'tempurl_invalid']);
    expect((await storeReq(t, 'HEAD', `${ACCOUNT}/c2`, { token: TOKEN })).status).toBe(404);
  });

  it('a malformed signature or expiry is tempurl_invalid', async () => {
    const good = tempUrl(OBJ, 'GET');
    const sig = new URL(good, 'https://x').searchParams.get('temp_url_sig')!;
    for (const q of [
      `temp_url_sig=${sig}`, // no expiry
      `temp_url_sig=${sig}&temp_url_expires=2026-12-07T00:00:00Z`, // ISO 8601
      `temp_url_sig=${sig}&temp_url_expires=-1`,
      `temp_url_sig=${sig.slice(1)}&temp_url_expires=${HEAT_NEVER_S}`,
      `temp_url_sig=${'z'.repeat(64)}&temp_url_expires=${HEAT_NEVER_S}`,
      `temp_url_sig=&temp_url_expires=${HEAT_NEVER_S}`,
    ])
      expect([q, ...refusal(await storeReq(t, 'GET', `${OBJ}?${q}`))]).toEqual([q, 401, 'tempurl_invalid']);
  });
});

describe('object store: the temp-url key is write-once', () => {
  let t: TestController;
  const OBJ = `${ACCOUNT}/c/o`;

  beforeAll(async () => {
    t = await startStore();
  });

  afterAll(async () => {
    await t?.close();
  });

  it('a second POST with another key answers 204, the first stays, and TempURLs signed with it still work', async () => {
    const head0 = await storeReq(t, 'HEAD', ACCOUNT, { token: TOKEN });
    expect(head0.status).toBe(204);
    expect(head0.headers['x-account-meta-temp-url-key']).toBeUndefined();
    const set = (key: string) =>
      storeReq(t, 'POST', ACCOUNT, { token: TOKEN, headers: { 'X-Account-Meta-Temp-Url-Key': key } });
    expect((await set(KEY)).status).toBe(204);
    expect((await storeReq(t, 'PUT', OBJ, { token: TOKEN, body: 'x' })).status).toBe(201);
    expect((await storeReq(t, 'GET', tempUrl(OBJ, 'GET'))).status).toBe(200);

    expect((await set(OTHER_KEY)).status).toBe(204);
    const head = await storeReq(t, 'HEAD', ACCOUNT, { token: TOKEN });
    expect(head.headers['x-account-meta-temp-url-key']).toBe(KEY);
    expect((await storeReq(t, 'GET', tempUrl(OBJ, 'GET'))).status).toBe(200);
    expect(refusal(await storeReq(t, 'GET', tempUrl(OBJ, 'GET', { key: OTHER_KEY })))).toEqual([
      401,
      'tempurl_invalid',
    ]);
    // an empty value (Swift's "remove the key") removes nothing
    expect((await set('')).status).toBe(204);
    expect((await storeReq(t, 'HEAD', ACCOUNT, { token: TOKEN })).headers['x-account-meta-temp-url-key']).toBe(KEY);
    const kept = t.logLines().filter((l) => l.code === 'temp_url_key_kept');
    expect(kept).toHaveLength(1);
    expect(t.logText()).not.toContain(OTHER_KEY);
  });

  it("one account's key signs nothing in another account", async () => {
    const other = '/v1/AUTH_other';
    expect(
      (
        await storeReq(t, 'POST', other, {
          token: OTHER_TOKEN,
          headers: { 'X-Account-Meta-Temp-Url-Key': OTHER_KEY },
        })
      ).status,
    ).toBe(204);
    expect((await storeReq(t, 'PUT', `${other}/c/o`, { token: OTHER_TOKEN, body: 'theirs' })).status).toBe(201);
    expect(refusal(await storeReq(t, 'GET', tempUrl(`${other}/c/o`, 'GET', { key: KEY })))).toEqual([
      401,
      'tempurl_invalid',
    ]);
    expect((await storeReq(t, 'GET', tempUrl(`${other}/c/o`, 'GET', { key: OTHER_KEY }))).status).toBe(200);
  });
});

describe('object store: tokens', () => {
  let t: TestController;

  beforeAll(async () => {
    t = await startStore();
    expect((await storeReq(t, 'PUT', '/v1/AUTH_other/theirs', { token: OTHER_TOKEN })).status).toBe(201);
    expect(
      (await storeReq(t, 'PUT', '/v1/AUTH_other/theirs/secret', { token: OTHER_TOKEN, body: 'their secret' })).status,
    ).toBe(201);
  });

  afterAll(async () => {
    await t?.close();
  });

  it('no token and no signature is 401 token_missing', async () => {
    for (const [m, p] of [
      ['HEAD', ACCOUNT],
      ['GET', `${ACCOUNT}/c`],
      ['PUT', `${ACCOUNT}/c/o`],
    ] as const) {
      const r = await storeReq(t, m, p);
      expect(r.status).toBe(401);
      if (m !== 'HEAD') expect(code(r)).toBe('token_missing');
    }
    expect(refusal(await storeReq(t, 'GET', ACCOUNT, { headers: { 'X-Auth-Token': '' } }))).toEqual([
      401,
      'token_missing',
    ]);
  });

  it('an unknown token is 401 token_invalid', async () => {
    expect(refusal(await storeReq(t, 'GET', ACCOUNT, { token: 'not-a-listed-token' }))).toEqual([401, 'token_invalid']);
    // the digest itself, sent as the token, is not the token
    expect(refusal(await storeReq(t, 'GET', ACCOUNT, { token: tokenDigest(TOKEN) }))).toEqual([401, 'token_invalid']);
  });

  it('a token whose line names another project is 403 token_wrong_project', async () => {
    expect(refusal(await storeReq(t, 'GET', ACCOUNT, { token: OTHER_TOKEN }))).toEqual([403, 'token_wrong_project']);
  });

  it("a token cannot read or write another project's account", async () => {
    const theirs = '/v1/AUTH_other/theirs';
    const read = await storeReq(t, 'GET', `${theirs}/secret`, { token: TOKEN });
    expect(refusal(read)).toEqual([403, 'token_wrong_project']);
    expect(read.raw.toString()).not.toContain('their secret');
    expect(refusal(await storeReq(t, 'GET', theirs, { token: TOKEN }))).toEqual([403, 'token_wrong_project']);
    expect(refusal(await storeReq(t, 'HEAD', '/v1/AUTH_other', { token: TOKEN }))[0]).toBe(403);
    expect(refusal(await storeReq(t, 'PUT', `${theirs}/secret`, { token: TOKEN, body: 'overwritten' }))).toEqual([
      403,
      'token_wrong_project',
    ]);
    expect(refusal(await storeReq(t, 'DELETE', `${theirs}/secret`, { token: TOKEN }))).toEqual([
      403,
      'token_wrong_project',
    ]);
    expect(
      refusal(
        await storeReq(t, 'POST', '/v1/AUTH_other', {
          token: TOKEN,
          headers: { 'X-Account-Meta-Temp-Url-Key': KEY },
        }),
      ),
    ).toEqual([403, 'token_wrong_project']);
    const still = await storeReq(t, 'GET', `${theirs}/secret`, { token: OTHER_TOKEN });
    expect([still.status, still.raw.toString()]).toEqual([200, 'their secret']);
    const head = await storeReq(t, 'HEAD', '/v1/AUTH_other', { token: OTHER_TOKEN });
    expect(head.headers['x-account-meta-temp-url-key']).toBeUndefined();
  });

  it('a line scoped to any project (*) may act on any account', async () => {
    expect((await storeReq(t, 'GET', '/v1/AUTH_other/theirs/secret', { token: ANY_TOKEN })).status).toBe(200);
    expect((await storeReq(t, 'HEAD', ACCOUNT, { token: ANY_TOKEN })).status).toBe(204);
  });
});

describe('object store: limits', () => {
  let t: TestController;

  beforeAll(async () => {
    t = await startStore();
    expect((await storeReq(t, 'PUT', `${ACCOUNT}/c`, { token: TOKEN })).status).toBe(201);
  });

  afterAll(async () => {
    await t?.close();
  });

  it('a Content-Length over 4 MiB is 413 object_too_large before the body is read', async () => {
    // the headers alone, then nothing: the answer comes without a byte of the body
    const r = await new Promise<StoreRes>((resolve, reject) => {
      const req = https.request({
        host: '127.0.0.1',
        port: t.ctl.objectStoreAddress!.port,
        method: 'PUT',
        path: `${ACCOUNT}/c/big`,
        ca: pki.ca,
        servername: 'localhost',
        agent: false,
        headers: { 'X-Auth-Token': TOKEN, 'Content-Length': String(OBJECT_STORE_OBJECT_MAX_BYTES + 1) },
      });
      req.on('response', (res) => collect(res, resolve, reject));
      req.on('error', reject);
      req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
      req.flushHeaders();
    });
    expect(refusal(r)).toEqual([413, 'object_too_large']);
    expect(r.headers.connection).toBe('close');
    expect((await storeReq(t, 'HEAD', `${ACCOUNT}/c/big`, { token: TOKEN })).status).toBe(404);
  });

  it('a chunked body growing past 4 MiB is 413 object_too_large, and nothing is stored', async () => {
    const chunk = Buffer.alloc(256 * 1024, 0x61);
    const r = await new Promise<StoreRes>((resolve, reject) => {
      const req = https.request({
        host: '127.0.0.1',
        port: t.ctl.objectStoreAddress!.port,
        method: 'PUT',
        path: `${ACCOUNT}/c/chunked`,
        ca: pki.ca,
        servername: 'localhost',
        agent: false,
        headers: { 'X-Auth-Token': TOKEN, 'Transfer-Encoding': 'chunked' },
      });
      let answered = false;
      req.on('response', (res) => {
        answered = true;
        collect(res, resolve, reject);
      });
      req.on('error', reject);
      req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
      // write until the server answers, then stop: a client that streams without end
      let sent = 0;
      const more = (): void => {
        while (!answered && sent <= OBJECT_STORE_OBJECT_MAX_BYTES * 2) {
          sent += chunk.length;
          if (!req.write(chunk)) {
            req.once('drain', more);
            return;
          }
        }
        if (!answered) req.end();
      };
      more();
    });
    expect(refusal(r)).toEqual([413, 'object_too_large']);
    expect((await storeReq(t, 'HEAD', `${ACCOUNT}/c/chunked`, { token: TOKEN })).status).toBe(404);
  });

  it('a declared body over 4 MiB sent at once still gets its 413, not a reset', async () => {
    const r = await storeReq(t, 'PUT', `${ACCOUNT}/c/big2`, {
      token: TOKEN,
      body: Buffer.alloc(OBJECT_STORE_OBJECT_MAX_BYTES + 1024 * 1024, 0x61),
    });
    expect(refusal(r)).toEqual([413, 'object_too_large']);
    expect((await storeReq(t, 'HEAD', `${ACCOUNT}/c/big2`, { token: TOKEN })).status).toBe(404);
  });

  it('a refused PUT whose body is on its way (a bad TempURL, no token) gets its coded answer, not a reset', async () => {
    const body = Buffer.alloc(2 * 1024 * 1024, 0x61);
    expect(refusal(await storeReq(t, 'PUT', tempUrl(`${ACCOUNT}/c/x`, 'GET'), { body }))).toEqual([
      401,
      'tempurl_invalid',
    ]);
    expect(refusal(await storeReq(t, 'PUT', `${ACCOUNT}/c/x`, { body }))).toEqual([401, 'token_missing']);
    expect(refusal(await storeReq(t, 'PUT', `${ACCOUNT}/c/x%00`, { token: TOKEN, body }))).toEqual([404, 'not_found']);
  });

  it('a body of exactly 4 MiB is stored', async () => {
    const r = await storeReq(t, 'PUT', `${ACCOUNT}/c/full`, {
      token: TOKEN,
      body: Buffer.alloc(OBJECT_STORE_OBJECT_MAX_BYTES, 0x62),
    });
    expect(r.status).toBe(201);
    const h = await storeReq(t, 'HEAD', `${ACCOUNT}/c/full`, { token: TOKEN });
    expect(h.headers['content-length']).toBe(String(OBJECT_STORE_OBJECT_MAX_BYTES));
  });

  it('malformed percent-encoding in the path is 404 not_found', async () => {
    for (const p of [`${ACCOUNT}/c/%E0%A4%A`, `${ACCOUNT}/c/%zz`, `${ACCOUNT}/%`, '/v1/AUTH_%C0%AF/c/o'])
      expect([p, ...refusal(await storeReq(t, 'GET', p, { token: TOKEN }))]).toEqual([p, 404, 'not_found']);
  });

  it('control characters in an account, container or object name are 404 not_found', async () => {
    for (const p of [
      `${ACCOUNT}/c/a%00b`,
      `${ACCOUNT}/c/a%0Ab`,
      `${ACCOUNT}/c/a%7Fb`,
      `${ACCOUNT}/c%01/o`,
      `${ACCOUNT}/c%1F`,
      '/v1/AUTH_ad%0Dmin/c/o',
    ])
      expect([p, ...refusal(await storeReq(t, 'PUT', p, { token: TOKEN, body: 'x' }))]).toEqual([p, 404, 'not_found']);
  });

  it('names past their length are 404 not_found: a container over 256 bytes, an object over 1024', async () => {
    expect(refusal(await storeReq(t, 'PUT', `${ACCOUNT}/${'c'.repeat(257)}`, { token: TOKEN }))).toEqual([
      404,
      'not_found',
    ]);
    expect(refusal(await storeReq(t, 'PUT', `${ACCOUNT}/c/${'o'.repeat(1025)}`, { token: TOKEN, body: 'x' }))).toEqual([
      404,
      'not_found',
    ]);
    expect((await storeReq(t, 'PUT', `${ACCOUNT}/c/${'o'.repeat(1024)}`, { token: TOKEN, body: 'x' })).status).toBe(
      201,
    );
  });

  it('paths outside /v1/AUTH_<project> are 404 not_found', async () => {
    for (const p of ['/', '/v1', '/v1/', '/v2/AUTH_admin', '/v1/admin/c/o', '/info', '/v1/AUTH_/c'])
      expect([p, ...refusal(await storeReq(t, 'GET', p, { token: TOKEN }))]).toEqual([p, 404, 'not_found']);
  });

  it('an absolute-form request target that is not a URL is 404 not_found, not a 500', async () => {
    for (const p of ['http://[bad/v1/AUTH_admin/c/o', 'http://x:99999/v1/AUTH_admin', 'https://a%zz/v1'])
      expect([p, ...refusal(await storeReq(t, 'GET', p, { token: TOKEN }))]).toEqual([p, 404, 'not_found']);
    // a well-formed one is served by its path, whatever its host
    expect((await storeReq(t, 'HEAD', `http://elsewhere${ACCOUNT}/c`, { token: TOKEN })).status).toBe(204);
    expect(t.logLines().filter((l) => l.level === 50)).toEqual([]);
  });

  it('one host holds at most OBJECT_STORE_MAX_HOST_CONNECTIONS connections: the next is closed at its handshake, unread', async () => {
    const open = (): Promise<tls.TLSSocket> =>
      new Promise((resolve, reject) => {
        const s = tls.connect({
          host: '127.0.0.1',
          port: t.ctl.objectStoreAddress!.port,
          ca: pki.ca,
          servername: 'localhost',
        });
        s.once('secureConnect', () => resolve(s));
        s.once('error', reject);
      });
    const held: tls.TLSSocket[] = [];
    try {
      for (let i = 0; i < OBJECT_STORE_MAX_HOST_CONNECTIONS; i++) held.push(await open());
      // all held: a request on one more connection gets no answer, its connection is closed
      await expect(storeReq(t, 'HEAD', ACCOUNT, { token: TOKEN })).rejects.toThrow();
      expect(t.logLines().some((l) => l.event === 'refused' && l.code === 'too_many_connections')).toBe(true);
      // the held ones still work
      const answer = await new Promise<string>((resolve) => {
        held[0]!.once('data', (d: Buffer) => resolve(d.toString('latin1').split('\r\n')[0]!));
        held[0]!.write(`HEAD ${ACCOUNT} HTTP/1.1\r\nHost: x\r\nX-Auth-Token: ${TOKEN}\r\n\r\n`);
      });
      expect(answer).toBe('HTTP/1.1 204 No Content');
      // one closed: a new connection is served again (once the store has seen the close)
      held.pop()!.destroy();
      await waitFor('a free place', async () => {
        try {
          return (await storeReq(t, 'HEAD', ACCOUNT, { token: TOKEN })).status === 204;
        } catch {
          return false;
        }
      });
    } finally {
      for (const s of held) s.destroy();
    }
  });

  it('methods not served are 405 method_not_allowed, before any token is asked for', async () => {
    for (const [m, p] of [
      ['POST', `${ACCOUNT}/c/o`],
      ['POST', `${ACCOUNT}/c`],
      ['PUT', ACCOUNT],
      ['DELETE', ACCOUNT],
      ['COPY', `${ACCOUNT}/c/o`],
      ['PATCH', `${ACCOUNT}/c/o`],
      ['OPTIONS', `${ACCOUNT}/c/o`],
    ] as const)
      expect([m, p, ...refusal(await storeReq(t, m, p))]).toEqual([m, p, 405, 'method_not_allowed']);
  });
});

/** Heat's metadata for node `node` (docs/heat-object-store.md, as measured), one item. */
function metadata(
  o: {
    itemId?: string;
    greeting?: string;
    transport?: string;
    group?: string;
    greetingJson?: string;
    /** The signal object's path (default SIGNAL). */
    signal?: string;
  } = {},
): string {
  const text = JSON.stringify({
    deployments: [
      {
        id: o.itemId ?? '94cdc745-eca5-4c01-a8f6-4c05ee9496c5',
        name: 'hello',
        group: o.group ?? 'script',
        creation_time: '2026-12-07T15:56:37Z',
        config: '#!/bin/sh\necho "hello $greeting"\n',
        inputs: [
          { name: 'greeting', description: '', type: 'String', default: '', value: o.greeting ?? 'mars' },
          { name: 'deploy_server_id', type: 'String', value: 'a65e7166-d0fa-46d8-a508-1d3d3fc55d8d' },
          { name: 'deploy_action', type: 'String', value: 'UPDATE' },
          { name: 'deploy_stack_id', type: 'String', value: `st/${STACK}` },
          { name: 'deploy_resource_name', type: 'String', value: 'deployment' },
          { name: 'deploy_signal_transport', type: 'String', value: o.transport ?? 'TEMP_URL_SIGNAL' },
          {
            name: 'deploy_signal_id',
            type: 'String',
            value: `https://127.0.0.1:1${tempUrl(o.signal ?? SIGNAL, 'PUT')}`,
          },
          { name: 'deploy_signal_verb', type: 'String', value: 'PUT' },
        ],
        outputs: [{ name: 'result', description: '', type: 'String', error_output: false }],
        options: {},
      },
    ],
    'os-collect-config': {
      collectors: ['request', 'local'],
      request: { metadata_url: `https://127.0.0.1:1${tempUrl(`${ACCOUNT}/n1/metadata.json`, 'GET')}` },
    },
  });
  // a value given as JSON text: one too deep to build as an object here
  return o.greetingJson === undefined ? text : text.replace('"@greeting@"', o.greetingJson);
}

describe("object store: a node's metadata from Heat", () => {
  let t: TestController;
  const META = `${ACCOUNT}/n1/metadata.json`;
  const deployments = async (node: string): Promise<Array<Record<string, unknown>>> => {
    const r = await t.req(op, 'GET', `/v1/deployments?node=${node}`);
    expect(r.status).toBe(200);
    return r.json.items as Array<Record<string, unknown>>;
  };
  const putMeta = (body: string) => storeReq(t, 'PUT', tempUrl(META, 'PUT'), { body });

  beforeAll(async () => {
    t = await startStore();
    expect((await t.req(op, 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
    expect((await t.req(op, 'POST', '/v1/nodes', { id: 'n2' })).status).toBe(201);
    const set = await storeReq(t, 'POST', ACCOUNT, {
      token: TOKEN,
      headers: { 'X-Account-Meta-Temp-Url-Key': KEY },
    });
    expect(set.status).toBe(204);
    for (const c of ['n1', 'n2', STACK])
      expect((await storeReq(t, 'PUT', `${ACCOUNT}/${c}`, { token: TOKEN })).status).toBe(201);
    // Heat's first write: no deployments yet, by token
    const first = await storeReq(t, 'PUT', `${ACCOUNT}/n2/metadata.json`, {
      token: TOKEN,
      body: JSON.stringify({ deployments: [], 'os-collect-config': {} }),
    });
    expect(first.status).toBe(201);
  });

  afterAll(async () => {
    await t?.close();
  });

  it.each([
    ['a body that is not JSON', 'not json {'],
    ['a JSON list', '[]'],
    ['deployments that are not a list', JSON.stringify({ deployments: {} })],
    ['an item whose signal transport is HEAT_SIGNAL', metadata({ transport: 'HEAT_SIGNAL' })],
    ['an item whose group has a slash', metadata({ group: '../x' })],
    ['an item whose group has a space and a quote', metadata({ group: 'a "b' })],
    [
      'an input value nested 65 levels',
      metadata({ greeting: '@greeting@', greetingJson: `${'['.repeat(65)}${']'.repeat(65)}` }),
    ],
    [
      'an input value nested 200,000 levels',
      metadata({ greeting: '@greeting@', greetingJson: `${'['.repeat(200_000)}${']'.repeat(200_000)}` }),
    ],
  ])('%s is 400 heat_metadata_invalid, and nothing is stored', async (_what, body) => {
    const r = await putMeta(body);
    expect(refusal(r)).toEqual([400, 'heat_metadata_invalid']);
    expect(refusal(await storeReq(t, 'GET', META, { token: TOKEN }))).toEqual([404, 'not_found']);
    expect(await deployments('n1')).toEqual([]);
    expect(t.push.notified.filter((n) => n.node === 'n1')).toEqual([]);
  });

  it('a well-formed one makes one deployment on the node; the same item again changes nothing', async () => {
    const r = await putMeta(metadata());
    expect(r.status).toBe(201);
    const ds = await deployments('n1');
    expect(ds).toHaveLength(1);
    expect(ds[0]).toMatchObject({ node: 'n1', revision: 1, action: 'UPDATE' });
    const woken = t.push.notified.filter((n) => n.node === 'n1').length;
    expect(woken).toBe(1);

    expect((await putMeta(metadata())).status).toBe(201);
    const again = await deployments('n1');
    expect(again).toHaveLength(1);
    expect(again[0]).toMatchObject({ id: ds[0]!.id, revision: 1 });
    expect(t.push.notified.filter((n) => n.node === 'n1')).toHaveLength(woken);
    // the object is the body Heat wrote, for the node's collector
    const got = await storeReq(t, 'GET', tempUrl(META, 'GET'));
    expect([got.status, got.raw.toString()]).toEqual([200, metadata()]);
  });

  it("the node's Herald agent is given no TempURL: its signed metadata carries neither the metadata's nor the signal's", async () => {
    const r = await t.req(pki.cred('agent', 'n1'), 'GET', '/v1/nodes/n1/metadata');
    expect(r.status).toBe(200);
    expect(r.json.deployments).toHaveLength(1);
    expect(r.text).toContain('mars');
    expect(r.text).not.toContain('temp_url_sig');
    expect(r.text).not.toContain(`${STACK}/`);
  });

  it('a malformed one after it stores nothing: the object and the deployment stay as they were', async () => {
    const before = await deployments('n1');
    expect(refusal(await putMeta(metadata({ transport: 'HEAT_SIGNAL', itemId: 'x2' })))).toEqual([
      400,
      'heat_metadata_invalid',
    ]);
    const got = await storeReq(t, 'GET', META, { token: TOKEN });
    expect(got.raw.toString()).toBe(metadata());
    expect(await deployments('n1')).toEqual(before);
  });

  it('a new item id makes revision 2 and empties the signal object written for the first', async () => {
    // the node's result for revision 1, through the signal TempURL
    const result = JSON.stringify({ deploy_stdout: 'hello mars', deploy_stderr: '', deploy_status_code: 0 });
    expect((await storeReq(t, 'PUT', tempUrl(SIGNAL, 'PUT'), { body: result })).status).toBe(201);
    expect((await storeReq(t, 'GET', SIGNAL, { token: TOKEN })).raw.toString()).toBe(result);

    const r = await putMeta(metadata({ itemId: '0b5e1a55-0000-4000-8000-000000000002', greeting: 'venus' }));
    expect(r.status).toBe(201);
    const ds = await deployments('n1');
    expect(ds).toHaveLength(1);
    expect(ds[0]).toMatchObject({ revision: 2 });
    const signal = await storeReq(t, 'GET', SIGNAL, { token: TOKEN });
    expect(signal.status).toBe(200);
    expect(signal.raw.length).toBe(0);
  });

  it('an item whose signal object is in another account is 400 heat_metadata_invalid, and that object stays', async () => {
    const theirs = '/v1/AUTH_other/theirs/secret';
    expect((await storeReq(t, 'PUT', '/v1/AUTH_other/theirs', { token: OTHER_TOKEN })).status).toBe(201);
    expect((await storeReq(t, 'PUT', theirs, { token: OTHER_TOKEN, body: 'their secret' })).status).toBe(201);
    const before = await deployments('n1');
    const r = await putMeta(metadata({ itemId: 'i-foreign', signal: theirs }));
    expect(refusal(r)).toEqual([400, 'heat_metadata_invalid']);
    expect(r.json.error.field).toBe('deployments.0.inputs.deploy_signal_id');
    expect(await deployments('n1')).toEqual(before);
    // nor through an object whose container names no node, which is not refused but clears nothing
    const plain = await storeReq(t, 'PUT', `${ACCOUNT}/not-a-node/doc.json`, {
      token: TOKEN,
      body: metadata({ itemId: 'i-foreign-2', signal: theirs }),
    });
    expect(plain.status).toBe(201);
    const still = await storeReq(t, 'GET', theirs, { token: OTHER_TOKEN });
    expect([still.status, still.raw.toString()]).toEqual([200, 'their secret']);
  });

  it("in an account not named by --heat-project, a container named after a node is a plain object: another project's token cannot run code on it", async () => {
    expect((await storeReq(t, 'PUT', '/v1/AUTH_other/n2', { token: OTHER_TOKEN })).status).toBe(201);
    const r = await storeReq(t, 'PUT', '/v1/AUTH_other/n2/metadata.json', { token: OTHER_TOKEN, body: metadata() });
    expect(r.status).toBe(201);
    expect(await deployments('n2')).toEqual([]);
    expect(t.push.notified.filter((n) => n.node === 'n2')).toEqual([]);
  });

  it("a container that names no node is a plain object: nothing is made, and the other node's deployments stay", async () => {
    expect(
      (await storeReq(t, 'PUT', `${ACCOUNT}/not-a-node/metadata.json`, { token: TOKEN, body: 'not json' })).status,
    ).toBe(201);
    expect(await deployments('n2')).toEqual([]);
    expect(await deployments('n1')).toHaveLength(1);
  });
});

describe('object store: Last-Modified', () => {
  let t: TestController;

  beforeAll(async () => {
    t = await startStore();
    expect((await storeReq(t, 'PUT', `${ACCOUNT}/c`, { token: TOKEN })).status).toBe(201);
  });

  afterAll(async () => {
    await t?.close();
  });

  it('lastModified rounds up to the next whole second, and keeps a whole second', () => {
    expect(lastModified(Date.UTC(2026, 11, 7, 15, 56, 37, 1))).toBe('Mon, 07 Dec 2026 15:56:38 GMT');
    expect(lastModified(Date.UTC(2026, 11, 7, 15, 56, 37, 999))).toBe('Mon, 07 Dec 2026 15:56:38 GMT');
    expect(lastModified(Date.UTC(2026, 11, 7, 15, 56, 37, 0))).toBe('Mon, 07 Dec 2026 15:56:37 GMT');
  });

  it("an object's Last-Modified is its write time rounded up to the second, never before it", async () => {
    // written until the write time is not a whole second (999 times in 1,000 the first is not)
    for (let i = 0; ; i++) {
      const before = Date.now();
      expect((await storeReq(t, 'PUT', `${ACCOUNT}/c/o`, { token: TOKEN, body: `v${i}` })).status).toBe(201);
      const after = Date.now();
      const h = await storeReq(t, 'HEAD', `${ACCOUNT}/c/o`, { token: TOKEN });
      const writtenMs = Math.round(Number(h.headers['x-timestamp']) * 1000);
      expect(writtenMs).toBeGreaterThanOrEqual(before);
      expect(writtenMs).toBeLessThanOrEqual(after);
      if (writtenMs % 1000 === 0 && i < 5) continue;
      const lm = Date.parse(String(h.headers['last-modified']));
      expect(lm).toBe(Math.ceil(writtenMs / 1000) * 1000);
      expect(lm).toBeGreaterThanOrEqual(writtenMs);
      const g = await storeReq(t, 'GET', `${ACCOUNT}/c/o`, { token: TOKEN });
      expect(g.headers['last-modified']).toBe(h.headers['last-modified']);
      break;
    }
  });
});

describe('object store: the refusal log', () => {
  const SUMMARISED = ['token_missing', 'token_invalid', 'tempurl_invalid', 'not_found', 'method_not_allowed'];

  it('refusals before authorisation (401s, and 404s and 405s of routing) are summarised: one line per code per interval, with a count', async () => {
    const t = await startStore();
    const N = 30;
    const refusedLines = (c: string) => t.logLines().filter((l) => l.event === 'refused' && l.code === c);
    try {
      for (let i = 0; i < N; i++) {
        expect(code(await storeReq(t, 'GET', `${ACCOUNT}/c/o${i}`))).toBe('token_missing');
        expect(code(await storeReq(t, 'GET', `${ACCOUNT}/c/o${i}`, { token: `unknown-${i}` }))).toBe('token_invalid');
        expect(code(await storeReq(t, 'GET', tempUrl(`${ACCOUNT}/c/o${i}`, 'GET')))).toBe('tempurl_invalid');
        expect(code(await storeReq(t, 'GET', `/nowhere/${i}`))).toBe('not_found');
        expect(code(await storeReq(t, 'PATCH', `${ACCOUNT}/c/o${i}`))).toBe('method_not_allowed');
      }
      for (const c of SUMMARISED) {
        expect(refusedLines(c), c).toHaveLength(1);
        expect(refusedLines(c)[0]!.count, c).toBe(1);
      }
      expect(t.logText()).not.toContain('unknown-1');
    } finally {
      await t.close();
    }
    // closing writes what was counted since: the counts add up to every refusal
    const sum = (c: string) => refusedLines(c).reduce((n, l) => n + Number(l.count), 0);
    expect(SUMMARISED.map(sum)).toEqual(SUMMARISED.map(() => N));
  });

  it("an authorised caller's refusal is one line each, naming who", async () => {
    const t = await startStore();
    try {
      expect((await t.req(op, 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
      for (let i = 0; i < 3; i++)
        expect(code(await storeReq(t, 'PUT', `${ACCOUNT}/n1/metadata.json`, { token: TOKEN, body: 'no' }))).toBe(
          'heat_metadata_invalid',
        );
      const lines = t.logLines().filter((l) => l.event === 'refused' && l.code === 'heat_metadata_invalid');
      expect(lines).toHaveLength(3);
      expect(lines[0]).toMatchObject({ status: 400, who: 'heat:heat', container: 'n1' });
    } finally {
      await t.close();
    }
  });
});
