/**
 * Join tokens, `POST /v1/enroll` and renewal on a real controller (docs/adding-nodes.md), in-process over
 * real TLS 1.3 on 127.0.0.1: the one route without a client certificate issues a certificate
 * whose identity and SANs are the token's; every refusal is the same `enrollment_refused` with
 * the real reason in the log; attempts are limited per source address; every other route
 * still refuses a peer without a certificate exactly as before.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeCsr } from '../../certs/csr.js';
import { identityOf } from '../../certs/identity.js';
import { issueIssuer, issueWithIssuer, newRsaKeyPem, revoke } from '../../certs/pki.js';
import { tokenHash } from '../../controller/service/enrollment.js';
import { resolveOptions } from '../../controller/options.js';
import { codeOf } from '../../protocol/errors.js';
import { ENROLL_NETWORK_RATE_BURST, ENROLL_RATE_BURST } from '../../protocol/limits.js';
import { keptAlive } from '../helpers/kept-alive.js';
import { startTestController, waitFor, type Res, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, TD, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';

let pki: ControllerTestPki;
let t: TestController;
const admin = (): Cred => pki.cred('operator', 'admin');

beforeAll(async () => {
  pki = await makeControllerTestPki();
  await issueIssuer({ dir: pki.dir, name: 'i1' });
  // the refusal cases below come from one address: the per-address limit has its own test
  t = await startTestController(
    pki,
    { issuer: 'i1' },
    { rates: { enroll: { burst: 1000, perS: 1000 }, enrollNetwork: { burst: 1000, perS: 1000 } } },
  );
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

async function newToken(node: string, extra: Record<string, unknown> = {}): Promise<string> {
  const r = await t.req(admin(), 'POST', '/v1/enrollment-tokens', { node, ...extra });
  expect(r.status, r.text).toBe(201);
  return r.json.token as string;
}

function csrFor(node: string, o: { key?: string; uris?: string[]; dns?: string[]; ips?: string[]; cn?: string } = {}) {
  const key = o.key ?? newRsaKeyPem();
  return {
    key,
    csr: makeCsr({
      keyPem: key,
      commonName: o.cn ?? node,
      uris: o.uris ?? [`spiffe://${TD}/agent/${node}`],
      dns: o.dns ?? [],
      ips: o.ips ?? [],
    }),
  };
}

function enroll(body: unknown, on: TestController = t): Promise<Res> {
  return on.req(pki.noCert, 'POST', '/v1/enroll', body);
}

/**
 * The `enroll.refused` log lines' reasons so far: the first refusal of each kind of reason in a
 * summary interval is logged at once, later ones of that kind are counted into the next line.
 */
function refusals(): string[] {
  return t
    .logLines()
    .filter((l) => l.event === 'enroll.refused')
    .map((l) => String(l.reason));
}

describe('join tokens', () => {
  it('are made by operators only, shown once, listed without secrets, revoked', async () => {
    const r = await t.req(admin(), 'POST', '/v1/enrollment-tokens', { node: 'tk1', ips: ['127.0.0.1'], ttl_s: 600 });
    expect(r.status).toBe(201);
    expect(r.headers.location).toBe(`/v1/enrollment-tokens/${r.json.id}`);
    expect(r.json).toMatchObject({ node: 'tk1', ips: ['127.0.0.1'], dns: [], state: 'active' });
    expect(r.json.token).toMatch(/^hj1\.[A-Za-z0-9_-]{43}$/);
    expect(Date.parse(r.json.expires_at) - Date.now()).toBeGreaterThan(590_000);
    const list = await t.req(admin(), 'GET', '/v1/enrollment-tokens');
    expect(list.status).toBe(200);
    expect(list.text).not.toContain(r.json.token);
    expect(list.text).not.toContain(tokenHash(r.json.token));
    expect(list.json.items.find((x: { id: string }) => x.id === r.json.id)).toMatchObject({
      node: 'tk1',
      state: 'active',
    });
    const del = await t.req(admin(), 'DELETE', `/v1/enrollment-tokens/${r.json.id}`);
    expect(del.status).toBe(200);
    expect(del.json.state).toBe('revoked');
    expect((await t.req(admin(), 'DELETE', '/v1/enrollment-tokens/nope')).json.error.code).toBe('not_found');
    // the database holds its hash, never the token
    for (const f of [t.dbPath, `${t.dbPath}-wal`]) {
      if (fs.existsSync(f)) expect(fs.readFileSync(f).includes(Buffer.from(r.json.token))).toBe(false);
    }
    const audit = await t.req(admin(), 'GET', '/v1/audit');
    const actions = audit.json.items.map((a: { action: string }) => a.action);
    expect(actions).toContain('enrollment_token.create');
    expect(actions).toContain('enrollment_token.revoke');
  });

  it('are refused to agents (wrong_role) and checked (bad_name, invalid_request with field)', async () => {
    const a = await t.req(pki.cred('agent', 'n1'), 'POST', '/v1/enrollment-tokens', { node: 'n1' });
    expect(a.status).toBe(403);
    expect(a.json.error.code).toBe('wrong_role');
    const bad = [
      [{ node: 'Bad Name' }, 'bad_name', 'node'],
      [{ node: 'n9', ttl_s: 0 }, 'invalid_request', 'ttl_s'],
      [{ node: 'n9', ips: ['not-an-ip'] }, 'invalid_request', 'ips.0'],
      [{ node: 'n9', dns: ['under_score'] }, 'invalid_request', 'dns.0'],
    ] as const;
    for (const [body, code, field] of bad) {
      const r = await t.req(admin(), 'POST', '/v1/enrollment-tokens', body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.json.error).toMatchObject({ code, field });
    }
  });
});

describe('POST /v1/enroll', () => {
  it("issues the token's identity and SANs for a CSR asking less, once, chained through the issuer", async () => {
    const token = await newToken('e1', { ips: ['127.0.0.1'], dns: ['e1.example'] });
    const { key, csr } = csrFor('e1', { ips: ['127.0.0.1'] });
    const r = await enroll({ token, node: 'e1', csr });
    expect(r.status, r.text).toBe(200);
    expect(r.headers.connection).toBe('close');
    const id = identityOf(r.json.certificate, TD);
    expect(id.spiffeId).toBe(`spiffe://${TD}/agent/e1`);
    expect(id.dns).toEqual(['e1.example']);
    expect(id.ips).toEqual(['127.0.0.1']);
    expect(r.json.ca).toBe(pki.ca.toString());
    expect(r.json.jwks.keys.length).toBeGreaterThan(0);
    expect(r.json.revoked).toEqual({ serials: expect.any(Array), kids: expect.any(Array) });
    // the chain (leaf + issuer) authenticates at the API with the key that never left here
    const cred = { ca: pki.ca, cert: Buffer.from(r.json.certificate), key: Buffer.from(key) };
    const ann = await t.req(cred, 'PUT', '/v1/nodes/e1/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' });
    expect(ann.status, ann.text).toBe(200);
    const node = await t.req(admin(), 'GET', '/v1/nodes/e1');
    expect(node.json.certificate).toMatchObject({ serial: id.serial, renewal: 'ok', renewal_failures: 0 });
    expect(node.json.certificate.issued_at).not.toBeNull();
  });

  it('refuses every bad case with the same answer and logs the real reason', async () => {
    const answers: Res[] = [];
    const expectRefused = async (body: unknown, reason: RegExp): Promise<void> => {
      const before = refusals().length;
      const r = await enroll(body);
      answers.push(r);
      expect(r.status, r.text).toBe(403);
      expect(r.json.error.code).toBe('enrollment_refused');
      // one line at most; none when a refusal of the same kind was logged in this interval
      expect(refusals().length - before).toBeLessThanOrEqual(1);
      expect(
        refusals().some((l) => reason.test(l)),
        `no log line for ${reason}`,
      ).toBe(true);
    };
    // reused
    const used = await newToken('r1');
    expect((await enroll({ token: used, node: 'r1', csr: csrFor('r1').csr })).status).toBe(200);
    await expectRefused({ token: used, node: 'r1', csr: csrFor('r1').csr }, /already used/);
    // expired: a row whose time is over, written straight into the store
    const expired = 'hj1.expired-token-for-the-test';
    await t.ctl.store.createEnrollmentToken(
      {
        id: 'expired1',
        tokenHash: tokenHash(expired),
        node: 'x1',
        dns: [],
        ips: [],
        expiresAt: new Date(Date.now() - 1000).toISOString(),
      },
      'test',
    );
    await expectRefused({ token: expired, node: 'x1', csr: csrFor('x1').csr }, /expired/);
    // revoked
    const rv = await t.req(admin(), 'POST', '/v1/enrollment-tokens', { node: 'v1' });
    await t.req(admin(), 'DELETE', `/v1/enrollment-tokens/${rv.json.id}`);
    await expectRefused({ token: rv.json.token, node: 'v1', csr: csrFor('v1').csr }, /revoked/);
    // wrong node
    const w = await newToken('w1');
    await expectRefused({ token: w, node: 'w2', csr: csrFor('w2').csr }, /another node/);
    // unknown
    await expectRefused({ token: 'hj1.nothing-like-this', node: 'u1', csr: csrFor('u1').csr }, /unknown token/);
    // a CSR asking for other SANs, for another identity (URI or CN)
    const s1 = await newToken('s1', { ips: ['127.0.0.1'] });
    await expectRefused({ token: s1, node: 's1', csr: csrFor('s1', { ips: ['10.9.9.9'] }).csr }, /other SANs/);
    const s2 = await newToken('s2');
    await expectRefused({ token: s2, node: 's2', csr: csrFor('s2', { dns: ['evil.example'] }).csr }, /other SANs/);
    const s3 = await newToken('s3');
    await expectRefused(
      { token: s3, node: 's3', csr: csrFor('s3', { uris: [`spiffe://${TD}/operator/admin`] }).csr },
      /another identity/,
    );
    const s4 = await newToken('s4');
    await expectRefused({ token: s4, node: 's4', csr: csrFor('s4', { cn: 'admin' }).csr }, /another identity/);
    // a CSR whose signature does not verify (its content changed after signing)
    const s5 = await newToken('s5');
    const good = csrFor('s5').csr;
    const der = Buffer.from(good.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    der[der.indexOf(Buffer.from('agent/s5')) + 7] = '6'.charCodeAt(0);
    const forged = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
    await expectRefused({ token: s5, node: 's5', csr: forged }, /bad CSR/);
    // and the token of a bad-signature attempt was not spent
    expect((await enroll({ token: s5, node: 's5', csr: csrFor('s5').csr })).status).toBe(200);
    // malformed bodies
    await expectRefused({ node: 'm1' }, /no token/);
    await expectRefused([1, 2], /malformed/);
    // one answer for all
    const bodies = new Set(answers.map((a) => a.text));
    expect(bodies.size).toBe(1);
  });

  it('spends a token once when two enrolments race with it', async () => {
    const token = await newToken('race1');
    const [a, b] = await Promise.all([
      enroll({ token, node: 'race1', csr: csrFor('race1').csr }),
      enroll({ token, node: 'race1', csr: csrFor('race1').csr }),
    ]);
    expect([a.status, b.status].sort()).toEqual([200, 403]);
    // the store's consume, four at once on a fresh token: one wins
    const fresh = await newToken('race2');
    const racing = await Promise.all(
      [1, 2, 3, 4].map(() => t.ctl.store.consumeEnrollmentToken(tokenHash(fresh), 'race2', 'test')),
    );
    expect(racing.filter((r) => r.ok)).toHaveLength(1);
    expect(racing.filter((r) => !r.ok).map((r) => (r.ok ? '' : r.reason))).toEqual(['used', 'used', 'used']);
  });

  it('without --issuer answers enrollment_disabled, for tokens too', async () => {
    const plain = await startTestController(pki);
    try {
      const r = await enroll({ token: 'hj1.x', node: 'd1', csr: csrFor('d1').csr }, plain);
      expect(r.status).toBe(403);
      expect(r.json.error.code).toBe('enrollment_disabled');
      const tk = await plain.req(admin(), 'POST', '/v1/enrollment-tokens', { node: 'd1' });
      expect(tk.json.error.code).toBe('enrollment_disabled');
    } finally {
      await plain.close();
    }
  });

  it('limits attempts per source address (rate_limited with Retry-After), before reading anything', async () => {
    const limited = await startTestController(pki, { issuer: 'i1' });
    try {
      const codes: string[] = [];
      for (let i = 0; i <= ENROLL_RATE_BURST; i++) {
        const r = await enroll({ token: `hj1.guess-${i}`, node: 'g1', csr: 'x' }, limited);
        codes.push(r.json.error.code);
        if (i === ENROLL_RATE_BURST) {
          expect(r.status).toBe(429);
          expect(Number(r.headers['retry-after'])).toBeGreaterThanOrEqual(1);
        }
      }
      expect(codes).toEqual([...Array(ENROLL_RATE_BURST).fill('enrollment_refused'), 'rate_limited']);
    } finally {
      await limited.close();
    }
  });

  it('limits attempts per source network too, and logs the refusals of many addresses as a summary', async () => {
    // 127.0.0.0/8 is all loopback on Linux: each address below is another peer of one /24
    // the default burst; no refill while the test runs, so the count is exact
    const limited = await startTestController(
      pki,
      { issuer: 'i1' },
      { rates: { enrollNetwork: { burst: ENROLL_NETWORK_RATE_BURST, perS: 0.001 } } },
    );
    let closed = false;
    try {
      const addresses = Array.from({ length: 30 }, (_, i) => `127.0.0.${i + 2}`);
      const codes: string[] = [];
      for (let round = 0; round < 2; round++) {
        for (const a of addresses) {
          const r = await limited.req(
            pki.noCert,
            'POST',
            '/v1/enroll',
            { token: 'hj1.guess', node: 'g1', csr: 'x' },
            {
              localAddress: a,
            },
          );
          codes.push(r.json.error.code);
        }
      }
      // each address stays within its own burst: only the network's limit stops them
      expect(addresses.length * 2).toBeLessThanOrEqual(addresses.length * ENROLL_RATE_BURST);
      expect(codes.filter((c) => c === 'enrollment_refused')).toHaveLength(ENROLL_NETWORK_RATE_BURST);
      expect(codes.slice(ENROLL_NETWORK_RATE_BURST).every((c) => c === 'rate_limited')).toBe(true);
      // closing writes what the summary still holds
      await limited.close();
      closed = true;
      // every refusal is counted, in a line per kind of reason and interval, not a line each
      const lines = limited.logLines().filter((l) => l.event === 'enroll.refused');
      expect(lines.reduce((n, l) => n + Number(l.count), 0)).toBe(ENROLL_NETWORK_RATE_BURST);
      expect(lines.length).toBeLessThan(ENROLL_NETWORK_RATE_BURST / 5);
      expect(lines[0]).toMatchObject({
        code: 'enrollment_refused',
        kind: 'bad_csr',
        reason: expect.stringMatching(/^bad CSR/),
      });
    } finally {
      if (!closed) await limited.close();
    }
  });

  it('is the only route a peer without a certificate reaches: every other one refuses it as before', async () => {
    const cases: Array<[string, string, unknown?]> = [
      ['GET', '/healthz'],
      ['GET', '/v1/nodes'],
      ['GET', '/v1/enroll'],
      ['GET', '/v1/enrollment-tokens'],
      ['POST', '/v1/enrollment-tokens', { node: 'z1' }],
      ['POST', '/v1/nodes/z1/certificate', { csr: 'x' }],
      ['PUT', '/v1/nodes/z1/endpoint', { url: 'wss://127.0.0.1:1/v1/wake' }],
      ['POST', '/v1/enroll/x', {}],
    ];
    for (const [m, p, body] of cases) {
      const r = await t.req(pki.noCert, m, p, body);
      expect(r.status, `${m} ${p}`).toBe(403);
      expect(r.json.error.code, `${m} ${p}`).toBe('no_client_certificate');
    }
    // a forged certificate is no way around it either, but /v1/enroll ignores certificates
    const f = await t.req(pki.forgedOperator, 'GET', '/v1/enrollment-tokens');
    expect(f.json.error.code).toBe('untrusted_certificate');
  });
});

describe('POST /v1/nodes/{node}/certificate (renewal)', () => {
  let cred: Cred;
  let key: string;

  beforeAll(async () => {
    // made by the issuer on the CA host, not enrolled: an enrolment now would make a renewal now
    // too soon (RENEWAL_MIN_INTERVAL_FRACTION; test/integration/node-revocation.test.ts)
    const made = issueWithIssuer({
      issuer: {
        cert: fs.readFileSync(`${pki.dir}/issuer/i1.crt`, 'utf8'),
        key: fs.readFileSync(`${pki.dir}/issuer/i1.key`, 'utf8'),
      },
      role: 'agent',
      name: 'rn1',
      ip: ['127.0.0.1'],
      dns: ['localhost'],
    });
    key = made.key;
    cred = { ca: pki.ca, cert: Buffer.from(made.chain), key: Buffer.from(key) };
    const ann = await t.req(cred, 'PUT', '/v1/nodes/rn1/endpoint', { url: 'wss://127.0.0.1:7443/v1/wake' });
    expect(ann.status).toBe(200);
  });

  it('issues a new certificate for a new key with the same identity and SANs', async () => {
    const before = identityOf(cred.cert!, TD);
    const next = csrFor('rn1', { ips: ['127.0.0.1'], dns: ['localhost'] });
    const r = await t.req(cred, 'POST', '/v1/nodes/rn1/certificate', { csr: next.csr, failed_attempts: 0 });
    expect(r.status, r.text).toBe(200);
    const after = identityOf(r.json.certificate, TD);
    expect(after.spiffeId).toBe(before.spiffeId);
    expect(after.dns).toEqual(before.dns);
    expect(after.ips).toEqual(before.ips);
    expect(after.serial).not.toBe(before.serial);
    const pub = new crypto.X509Certificate(r.json.certificate).publicKey.export({ type: 'spki', format: 'der' });
    expect(pub.equals(crypto.createPublicKey(next.key).export({ type: 'spki', format: 'der' }))).toBe(true);
    cred = { ca: pki.ca, cert: Buffer.from(r.json.certificate), key: Buffer.from(next.key) };
    key = next.key;
    const node = await t.req(admin(), 'GET', '/v1/nodes/rn1');
    expect(node.json.certificate).toMatchObject({ serial: after.serial, renewal_failures: 0 });
  });

  it('refuses the same key, other SANs, another identity (bad_csr) and another node (wrong_node), counting failures', async () => {
    const same = await t.req(cred, 'POST', '/v1/nodes/rn1/certificate', { csr: csrFor('rn1', { key }).csr });
    expect(same.status).toBe(400);
    expect(same.json.error.code).toBe('bad_csr');
    const sans = await t.req(cred, 'POST', '/v1/nodes/rn1/certificate', {
      csr: csrFor('rn1', { ips: ['10.1.1.1'] }).csr,
    });
    expect(sans.json.error.code).toBe('bad_csr');
    const other = await t.req(cred, 'POST', '/v1/nodes/rn1/certificate', {
      csr: csrFor('rn1', { uris: [`spiffe://${TD}/agent/n1`] }).csr,
      failed_attempts: 7,
      last_error: 'bad_csr',
    });
    expect(other.json.error.code).toBe('bad_csr');
    const wrong = await t.req(cred, 'POST', '/v1/nodes/n1/certificate', { csr: csrFor('n1').csr });
    expect(wrong.status).toBe(403);
    expect(wrong.json.error.code).toBe('wrong_node');
    const node = await t.req(admin(), 'GET', '/v1/nodes/rn1');
    expect(node.json.certificate).toMatchObject({ renewal_failures: 7, last_renewal_error: 'bad_csr' });
  });
});

describe('revoking the issuer', () => {
  it('closes the live connection of an enrolled agent and refuses it afterwards (revoked)', async () => {
    const token = await newToken('ri1', { ips: ['127.0.0.1'] });
    const c = csrFor('ri1');
    const r = await enroll({ token, node: 'ri1', csr: c.csr });
    expect(r.status).toBe(200);
    const cred = { ca: pki.ca, cert: Buffer.from(r.json.certificate), key: Buffer.from(c.key) };
    const conn = keptAlive(t.port, cred);
    const get = conn.get;
    try {
      expect(await get()).toBe(200);
      await revoke({ dir: pki.dir, target: 'issuer/i1' });
      await waitFor('the enrolled agent connection to be closed', () => conn.socket()!.destroyed);
      const again = await t.req(cred, 'GET', '/healthz');
      expect(again.status).toBe(403);
      expect(again.json.error.code).toBe('revoked');
      // and the controller issues nothing more with the revoked issuer
      const more = await t.req(admin(), 'POST', '/v1/enrollment-tokens', { node: 'ri2' });
      expect(more.json.error.code).toBe('enrollment_disabled');
      const r2 = await enroll({ token: 'hj1.x', node: 'ri2', csr: csrFor('ri2').csr });
      expect(r2.status).toBe(403);
      expect(r2.json.error.code).toBe('enrollment_disabled');
    } finally {
      conn.close();
    }
  });
});

describe('--agent-cert-lifetime', () => {
  it('takes 7d, 12h, 90s (default 7 days, also from the environment) and refuses anything else naming the option', () => {
    const base = { pki: '/x', db: '/x.db' };
    expect(resolveOptions(base, {}).agentCertLifetimeS).toBe(7 * 86_400);
    expect(resolveOptions({ ...base, 'agent-cert-lifetime': '90s' }, {}).agentCertLifetimeS).toBe(90);
    expect(resolveOptions({ ...base, 'agent-cert-lifetime': '12h' }, {}).agentCertLifetimeS).toBe(43_200);
    expect(resolveOptions(base, { HERALD_CONTROLLER_AGENT_CERT_LIFETIME: '2d' }).agentCertLifetimeS).toBe(172_800);
    for (const bad of ['5s', '7', 'a week', '999d', '1.5d']) {
      let err: unknown;
      try {
        resolveOptions({ ...base, 'agent-cert-lifetime': bad }, {});
      } catch (e) {
        err = e;
      }
      expect(codeOf(err), bad).toBe('bad_option');
      expect((err as { field?: string }).field).toBe('agent-cert-lifetime');
    }
  });
});
