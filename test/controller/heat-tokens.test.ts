/**
 * Who may call the object store (controller/heat/tokens.ts, docs/heat.md): Keystone token
 * validation against a fake of Keystone's token API served over real HTTPS on 127.0.0.1 with a
 * certificate made by certs/ (test/helpers/keystone-fake.ts), with a fake clock; and the static
 * token file of standalone Heat, changed while the validator runs. Assertions are on codes and on
 * what the fake was asked.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  keystoneValidator,
  staticTokenValidator,
  tokenDigest,
  type KeystoneOptions,
  type TokenValidator,
} from '../../controller/heat/tokens.js';
import {
  KEYSTONE_INVALID_TOKEN_CACHE_MS,
  KEYSTONE_MAX_REQUESTS_IN_FLIGHT,
  KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS,
  KEYSTONE_TOKEN_CACHE_MS,
  MAX_OBJECT_STORE_TOKEN_BYTES,
} from '../../protocol/limits.js';
import { thrownCode } from '../helpers/codes.js';
import { FAKE_SERVICE, startKeystoneFake, type KeystoneFake } from '../helpers/keystone-fake.js';
import { makeTestPki, type TestPki } from '../helpers/pki.js';

const HOUR_MS = 3_600_000;

/** A pino logger whose lines the test can read. */
function capture(): { logger: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino(
    { level: 'info' },
    new Writable({
      write: (c: Buffer, _e, cb) => {
        lines.push(JSON.parse(c.toString('utf8')) as Record<string, unknown>);
        cb();
      },
    }),
  );
  return { logger, lines };
}

/** A keystonemiddleware-style section, as an operator would paste it, with keys Herald ignores. */
function credentialsIni(authUrl: string, over: Record<string, string | undefined> = {}): string {
  const keys: Record<string, string | undefined> = {
    www_authenticate_uri: authUrl,
    auth_url: authUrl,
    memcached_servers: '127.0.0.1:11211',
    auth_type: 'password',
    username: FAKE_SERVICE.user,
    user_domain_name: FAKE_SERVICE.domain,
    password: FAKE_SERVICE.password,
    project_name: FAKE_SERVICE.project,
    project_domain_name: FAKE_SERVICE.projectDomain,
    ...over,
  };
  const body = Object.entries(keys)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k} = ${v}`)
    .join('\n');
  return `[DEFAULT]\ndebug = true\ntransport_url = rabbit://a\n  rabbit://b\n\n; the section keystonemiddleware reads\n[keystone_authtoken]\n${body}\n\n[oslo_policy]\nenforce_scope = true\n`;
}

let pki: TestPki;
let dir: string;

beforeAll(async () => {
  pki = await makeTestPki();
});

afterAll(() => pki?.cleanup());

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-heat-tokens-'));
});

afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

describe('keystoneValidator', () => {
  let ks: KeystoneFake;
  let clock: number;
  let validators: TokenValidator[];
  let log: ReturnType<typeof capture>;

  const writeCredentials = (text: string, mode = 0o600): string => {
    const f = path.join(dir, 'keystone.ini');
    fs.writeFileSync(f, text, { mode });
    fs.chmodSync(f, mode);
    return f;
  };

  const validator = (o: Partial<KeystoneOptions> = {}): TokenValidator => {
    const v = keystoneValidator({
      caFile: pki.paths.caCrt,
      logger: log.logger,
      now: () => clock,
      ...o,
      credentialsFile: o.credentialsFile ?? writeCredentials(credentialsIni(ks.url)),
    });
    validators.push(v);
    return v;
  };

  beforeEach(async () => {
    clock = Date.parse('2026-12-08T12:00:00Z');
    validators = [];
    log = capture();
    ks = await startKeystoneFake({ tls: pki.cred('controller', 'controller'), now: () => clock });
    ks.addToken('tok-op', { project: 'p1', user: 'alice-id', roles: ['member', 'swiftoperator'] });
  });

  afterEach(async () => {
    for (const v of validators) v.close();
    await ks.close();
  });

  it('accepts a token of the account project holding an operator role, asking Keystone without the catalog', async () => {
    const v = validator();
    const r = await v.check('tok-op', 'p1');
    expect(r).toEqual({
      ok: true,
      project: 'p1',
      user: 'alice-id',
      roles: ['member', 'swiftoperator'],
      expiresAtMs: clock + HOUR_MS,
    });
    expect(ks.requests).toEqual({ post: 1, get: 1, refused401: 0 });
    expect(ks.lastQuery).toBe('?nocatalog');
  });

  it('reads the section as oslo.config does: a quoted value, ids for names, other sections left alone', async () => {
    const v = validator({
      credentialsFile: writeCredentials(credentialsIni(ks.url, { password: `"${FAKE_SERVICE.password}"` })),
    });
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    const ids = validator({
      credentialsFile: writeCredentials(
        credentialsIni(`${ks.url}/`, { user_domain_name: undefined, user_domain_id: 'default' }),
      ),
    });
    expect((await ids.check('tok-op', 'p1')).ok).toBe(true);
    expect(ks.requests.post).toBe(2);
  });

  it('refuses a token of another project token_wrong_project, and one scoped to no project', async () => {
    ks.addToken('tok-domain', { roles: ['admin'] });
    const v = validator();
    expect(await v.check('tok-op', 'p2')).toMatchObject({ ok: false, code: 'token_wrong_project' });
    expect(await v.check('tok-domain', 'p1')).toMatchObject({ ok: false, code: 'token_wrong_project' });
  });

  it('refuses a token without an operator role token_role_missing; roles compare case-insensitively', async () => {
    ks.addToken('tok-member', { project: 'p1', roles: ['member', 'reader'] });
    ks.addToken('tok-camel', { project: 'p1', roles: ['SwiftOperator'] });
    const v = validator();
    expect(await v.check('tok-member', 'p1')).toMatchObject({ ok: false, code: 'token_role_missing' });
    expect(await v.check('tok-camel', 'p1')).toMatchObject({ ok: true });
    // an operator who lets members write names the role
    const members = validator({ roles: ['member'] });
    expect(await members.check('tok-member', 'p1')).toMatchObject({ ok: true, project: 'p1' });
  });

  it('refuses a token Keystone does not know token_invalid, and keeps that answer for a while', async () => {
    const v = validator();
    expect(await v.check('tok-unknown', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(ks.requests.get).toBe(1);
    // a flood of the same bad token asks Keystone once
    for (let i = 0; i < 5; i++) expect((await v.check('tok-unknown', 'p1')).ok).toBe(false);
    expect(ks.requests.get).toBe(1);
    clock += KEYSTONE_INVALID_TOKEN_CACHE_MS;
    expect(await v.check('tok-unknown', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(ks.requests.get).toBe(2);
  });

  it('refuses an empty, overlong or unprintable token token_invalid without asking Keystone', async () => {
    const v = validator();
    for (const t of ['', 'a b', 'tok\r\nx-evil: 1', 'x'.repeat(MAX_OBJECT_STORE_TOKEN_BYTES + 1), 'tök'])
      expect(await v.check(t, 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(ks.requests).toEqual({ post: 0, get: 0, refused401: 0 });
  });

  it('answers again from its cache, for any account, until KEYSTONE_TOKEN_CACHE_MS has passed', async () => {
    const v = validator();
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    expect(await v.check('tok-op', 'p2')).toMatchObject({ ok: false, code: 'token_wrong_project' });
    expect(ks.requests.get).toBe(1);
    clock += KEYSTONE_TOKEN_CACHE_MS - 1;
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    expect(ks.requests.get).toBe(1);
    clock += 1;
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    expect(ks.requests.get).toBe(2);
  });

  it('never keeps a token past its expires_at', async () => {
    ks.addToken('tok-short', { project: 'p1', roles: ['admin'], expiresAtMs: clock + 30_000 });
    const v = validator();
    expect((await v.check('tok-short', 'p1')).ok).toBe(true);
    clock += 30_000;
    expect(await v.check('tok-short', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(ks.requests.get).toBe(2);
  });

  it('keeps at most validCacheEntries tokens, the least recently used going first', async () => {
    for (const t of ['a', 'b', 'c']) ks.addToken(`tok-${t}`, { project: 'p1', roles: ['admin'] });
    const v = validator({ validCacheEntries: 2 });
    for (const t of ['a', 'b', 'c']) expect((await v.check(`tok-${t}`, 'p1')).ok).toBe(true);
    expect(ks.requests.get).toBe(3);
    expect((await v.check('tok-c', 'p1')).ok).toBe(true);
    expect((await v.check('tok-b', 'p1')).ok).toBe(true);
    expect(ks.requests.get).toBe(3);
    expect((await v.check('tok-a', 'p1')).ok).toBe(true); // evicted by tok-c
    expect(ks.requests.get).toBe(4);
  });

  it('keeps at most invalidCacheEntries unknown tokens', async () => {
    const v = validator({ invalidCacheEntries: 2 });
    for (const t of ['x', 'y', 'z']) expect((await v.check(`bad-${t}`, 'p1')).ok).toBe(false);
    expect(ks.requests.get).toBe(3);
    expect(await v.check('bad-x', 'p1')).toMatchObject({ code: 'token_invalid' });
    expect(ks.requests.get).toBe(4);
  });

  it('asks once for concurrent checks of one token', async () => {
    const v = validator();
    const all = await Promise.all(Array.from({ length: 8 }, () => v.check('tok-op', 'p1')));
    expect(all.every((r) => r.ok)).toBe(true);
    expect(ks.requests).toEqual({ post: 1, get: 1, refused401: 0 });
  });

  it('lets at most KEYSTONE_MAX_REQUESTS_IN_FLIGHT validations wait for Keystone; one more is token_unverifiable at once', async () => {
    const v = validator();
    expect((await v.check('tok-op', 'p1')).ok).toBe(true); // its own token in hand
    ks.hang(true);
    const tokens = Array.from({ length: KEYSTONE_MAX_REQUESTS_IN_FLIGHT + 1 }, (_, i) => `tok-n${i}`);
    for (const t of tokens) ks.addToken(t, { project: 'p1', roles: ['admin'] });
    const checks = tokens.map((t) => v.check(t, 'p1'));
    const first = await Promise.race(checks.map((p, i) => p.then((r) => ({ i, r }))));
    expect(first).toMatchObject({ i: KEYSTONE_MAX_REQUESTS_IN_FLIGHT, r: { code: 'token_unverifiable' } });
    while (ks.held < KEYSTONE_MAX_REQUESTS_IN_FLIGHT) await new Promise((r) => setImmediate(r));
    ks.hang(false);
    const all = await Promise.all(checks);
    expect(all.slice(0, KEYSTONE_MAX_REQUESTS_IN_FLIGHT).every((r) => r.ok)).toBe(true);
    expect(ks.requests.get).toBe(1 + KEYSTONE_MAX_REQUESTS_IN_FLIGHT);
  });

  it('renews its own token before it expires', async () => {
    const v = validator();
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    expect(ks.requests.post).toBe(1);
    // the service token (an hour) is now within the renewal window, though Keystone still takes it
    clock += HOUR_MS - KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS;
    ks.addToken('tok-later', { project: 'p1', roles: ['admin'] });
    expect((await v.check('tok-later', 'p1')).ok).toBe(true);
    expect(ks.requests).toEqual({ post: 2, get: 2, refused401: 0 });
  });

  it('renews its own token when Keystone answers 401 to it, and checks again', async () => {
    const v = validator();
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
    ks.revokeServiceTokens();
    ks.addToken('tok-other', { project: 'p1', roles: ['admin'] });
    expect(await v.check('tok-other', 'p1')).toMatchObject({ ok: true, project: 'p1' });
    expect(ks.requests).toEqual({ post: 2, get: 3, refused401: 1 });
  });

  it('answers token_unverifiable when Keystone refuses its credentials, and logs why', async () => {
    const v = validator({
      credentialsFile: writeCredentials(credentialsIni(ks.url, { password: 'wrong' })),
    });
    expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    expect(ks.requests.get).toBe(0);
    const line = log.lines.find((l) => l.code === 'token_unverifiable');
    expect(line?.why).toMatch(/401/);
    expect(JSON.stringify(log.lines)).not.toContain('tok-op');
  });

  it('answers token_unverifiable when Keystone fails (5xx), without keeping that answer', async () => {
    const v = validator();
    ks.failWith(503);
    expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    ks.failWith(undefined);
    expect((await v.check('tok-op', 'p1')).ok).toBe(true);
  });

  it('answers token_unverifiable when Keystone is down', async () => {
    const v = validator();
    await ks.close();
    expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    expect(log.lines.some((l) => l.code === 'token_unverifiable')).toBe(true);
  });

  it('answers token_unverifiable when Keystone does not answer in time', async () => {
    const v = validator({ timeoutMs: 200 });
    ks.hang(true);
    expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    expect(ks.requests.post).toBe(1);
  });

  it("answers token_unverifiable when Keystone's certificate does not chain to the CA given", async () => {
    const other = await makeTestPki();
    try {
      const v = validator({ caFile: other.paths.caCrt });
      expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
      expect(ks.requests.post).toBe(0);
    } finally {
      other.cleanup();
    }
  });

  it('answers token_unverifiable once closed', async () => {
    const v = validator();
    v.close();
    v.close();
    expect(await v.check('tok-op', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
  });

  it('refuses at start a credentials file others may read, over plain HTTP, insecure, or incomplete', () => {
    const base = { caFile: pki.paths.caCrt, logger: log.logger };
    const start = (text: string, mode = 0o600): string | undefined =>
      thrownCode(() => keystoneValidator({ ...base, credentialsFile: writeCredentials(text, mode) }).close());
    expect(start(credentialsIni(ks.url))).toBeUndefined();
    expect(start(credentialsIni(ks.url), 0o640)).toBe('unsafe_file_mode');
    expect(start(credentialsIni(ks.url.replace('https:', 'http:')))).toBe('bad_option');
    expect(start(credentialsIni(ks.url, { insecure: 'true' }))).toBe('bad_option');
    expect(start(credentialsIni(ks.url, { password: undefined }))).toBe('bad_option');
    expect(start(credentialsIni(ks.url, { user_domain_name: undefined }))).toBe('bad_option');
    expect(start(credentialsIni(ks.url, { auth_type: 'v3token' }))).toBe('bad_option');
    expect(start(credentialsIni(ks.url, { cafile: pki.paths.caCrt }))).toBe('bad_option'); // and caFile too
  });
});

describe('staticTokenValidator', () => {
  let file: string;
  let v: TokenValidator | undefined;
  let log: ReturnType<typeof capture>;

  /** Replaces the file as an operator should: a new file renamed over it. */
  const replace = (text: string): void => {
    const tmp = `${file}.new`;
    fs.writeFileSync(tmp, text, { mode: 0o644 });
    fs.renameSync(tmp, file);
  };
  const line = (token: string, ...rest: string[]): string => [tokenDigest(token), ...rest].join(' ');

  beforeEach(() => {
    file = path.join(dir, 'tokens');
    log = capture();
  });

  afterEach(() => v?.close());

  it('accepts a token whose digest is listed, for any account when the line names no project', async () => {
    replace(`# heat operators\n${line('tok-any')}\n${line('tok-star', '*', 'ci')}\n`);
    v = staticTokenValidator({ file, logger: log.logger });
    expect(await v.check('tok-any', 'p1')).toEqual({
      ok: true,
      project: 'p1',
      user: `static:${tokenDigest('tok-any').slice(0, 12)}`,
      roles: [],
      expiresAtMs: Number.POSITIVE_INFINITY,
    });
    expect(await v.check('tok-star', 'admin')).toMatchObject({ ok: true, project: 'admin', user: 'ci' });
  });

  it('refuses a token whose digest is not listed token_invalid, and a malformed one', async () => {
    replace(`${line('tok-any')}\n`);
    v = staticTokenValidator({ file, logger: log.logger });
    expect(await v.check('tok-other', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(await v.check(tokenDigest('tok-any'), 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect(await v.check('', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
  });

  it('holds a scoped token to its projects: token_wrong_project elsewhere', async () => {
    replace(`${line('tok-p1', 'p1', 'alice')}\n${line('tok-both', 'p1')}\n${line('tok-both', 'p2')}\n`);
    v = staticTokenValidator({ file, logger: log.logger });
    expect(await v.check('tok-p1', 'p1')).toMatchObject({ ok: true, project: 'p1', user: 'alice' });
    expect(await v.check('tok-p1', 'p2')).toMatchObject({ ok: false, code: 'token_wrong_project' });
    expect(await v.check('tok-both', 'p2')).toMatchObject({ ok: true, project: 'p2' });
    expect(await v.check('tok-both', 'p3')).toMatchObject({ ok: false, code: 'token_wrong_project' });
  });

  it('reads the file again when it changes, without a restart', async () => {
    replace(`${line('tok-a')}\n`);
    v = staticTokenValidator({ file, logger: log.logger });
    expect((await v.check('tok-a', 'p1')).ok).toBe(true);
    expect((await v.check('tok-b', 'p1')).ok).toBe(false);
    replace(`${line('tok-b', 'p1')}\n`);
    expect(await v.check('tok-a', 'p1')).toMatchObject({ ok: false, code: 'token_invalid' });
    expect((await v.check('tok-b', 'p1')).ok).toBe(true);
    // edited in place (appended to)
    fs.appendFileSync(file, `${line('tok-c')}\n`);
    expect((await v.check('tok-c', 'p9')).ok).toBe(true);
    expect(log.lines.filter((l) => l.msg === 'the token file was read again')).toHaveLength(2);
  });

  it('answers token_unverifiable while the file is unusable, and recovers when it is fixed', async () => {
    replace(`${line('tok-a')}\n`);
    v = staticTokenValidator({ file, logger: log.logger });
    replace('tok-a\n'); // a token, not its digest
    expect(await v.check('tok-a', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    expect(await v.check('tok-a', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    expect(log.lines.filter((l) => l.code === 'token_unverifiable')).toHaveLength(1);
    fs.rmSync(file);
    expect(await v.check('tok-a', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    replace(`${line('tok-a')}\n`);
    fs.chmodSync(file, 0o666);
    expect(await v.check('tok-a', 'p1')).toMatchObject({ ok: false, code: 'token_unverifiable' });
    replace(`# fixed\n${line('tok-a')}\n`);
    expect((await v.check('tok-a', 'p1')).ok).toBe(true);
  });

  it('refuses at start a missing, unsafe or malformed file', () => {
    const start = (): string | undefined =>
      thrownCode(() => staticTokenValidator({ file, logger: log.logger }).close());
    expect(start()).toBe('bad_option');
    replace(`${line('tok-a')}\n`);
    expect(start()).toBeUndefined();
    fs.chmodSync(file, 0o664);
    expect(start()).toBe('unsafe_file_mode');
    replace('tok-a\n');
    expect(start()).toBe('bad_option');
    replace(`${line('tok-a', 'p1', 'name', 'extra')}\n`);
    expect(start()).toBe('bad_option');
  });
});
