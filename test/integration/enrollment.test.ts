/**
 * Enrolment and renewal with real processes (docs/adding-nodes.md): `bin/herald controller --issuer` with
 * 15 s agent certificates, `herald enroll token` and `herald agent enroll` as a node would run
 * them, every refusal the same `enrollment_refused` with the real reason in the controller's
 * log, the per-address limit, an agent that renews again and again without a restart and keeps
 * working (its push connection re-dialled by a restarted controller, with the renewed
 * certificate, once the first one has expired), and an agent whose renewal keeps failing.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { identityOf } from '../../certs/identity.js';
import { issueWithIssuer } from '../../certs/pki.js';
import { ENROLL_RATE_BURST } from '../../protocol/limits.js';
import { makeEnrolBed, type CliRun, type EnrolBed } from '../helpers/enrollment.js';
import {
  api,
  freePort,
  hasExited,
  heraldSync,
  isBuilt,
  stopProc,
  waitFor,
  type Cred,
  type Proc,
} from '../helpers/procs.js';

const built = isBuilt();
const LIFETIME_S = 15;
let e: EnrolBed;
let work: string;
let pki: string;
let op: Cred;
let fingerprint: string;
let port: number;
let ctl: Proc;
/** The agent of the renewal test, still running for the issuer's revocation at the end. */
let rnAgent: { proc: Proc; dir: string } | undefined;

function startController(extra: string[] = [], p = port, db = path.join(work, 'herald.db')): Promise<Proc> {
  return e.startController(['--push-workers', '0', ...extra], p, db);
}

function token(node: string, extra: string[] = [], p = port): string {
  return e.token(node, extra, p);
}

/** A join token as the API's JSON (`--json`). */
function tokenJson(node: string, extra: string[], p: number): { id: string; token: string; expires_at: string } {
  const r = heraldSync([
    'enroll',
    'token',
    '--node',
    node,
    '--controller',
    `https://127.0.0.1:${p}`,
    '--pki',
    pki,
    '--json',
    ...extra,
  ]);
  expect(r.code, r.err).toBe(0);
  return JSON.parse(r.out) as { id: string; token: string; expires_at: string };
}

function enrollCli(node: string, tok: string, dir: string, fp = fingerprint, p = port): CliRun {
  return e.enroll(node, tok, dir, { fingerprint: fp, url: `https://127.0.0.1:${p}` });
}

/** The controller's `enroll.refused` reasons so far. */
function refusedReasons(proc: Proc = ctl): string[] {
  return proc
    .log()
    .split('\n')
    .filter((l) => l.includes('"enroll.refused"'))
    .map((l) => String((JSON.parse(l) as { reason?: unknown }).reason));
}

describe.skipIf(!built)('enrolment and renewal with real processes', { timeout: 120_000 }, () => {
  beforeAll(async () => {
    e = await makeEnrolBed({
      prefix: 'herald-enroll-',
      controllerArgs: ['--push-workers', '0', '--issuer', 'i1', '--agent-cert-lifetime', `${LIFETIME_S}s`],
    });
    ({ work, pki, op, port, ctl } = e);
    // as `openssl x509 -noout -fingerprint -sha256` prints it
    fingerprint = e.fingerprint.toUpperCase().match(/../g)!.join(':');
  });

  afterAll(async () => {
    await e?.close();
  });

  it('refuses a reused, expired, revoked or wrong-node token with one answer, and logs the real reason', async () => {
    // a controller of its own: these five attempts are the per-address burst
    const p3 = await freePort();
    const own = await startController(['--issuer', 'i1'], p3, path.join(work, 'refusals.db'));
    const cases: Array<{ why: RegExp; run: () => Promise<{ code: number | null; err: string }> }> = [];
    const used = token('u1', [], p3);
    expect(enrollCli('u1', used, path.join(work, 'node-u1'), fingerprint, p3).code).toBe(0);
    cases.push({
      why: /already used/,
      run: async () => enrollCli('u1', used, path.join(work, 'node-u1b'), fingerprint, p3),
    });
    const rv = tokenJson('v1', [], p3);
    expect(heraldSync(['enroll', 'revoke', rv.id, '--controller', `https://127.0.0.1:${p3}`, '--pki', pki]).code).toBe(
      0,
    );
    cases.push({
      why: /revoked/,
      run: async () => enrollCli('v1', rv.token, path.join(work, 'node-v1'), fingerprint, p3),
    });
    const other = token('w1', [], p3);
    cases.push({
      why: /another node/,
      run: async () => enrollCli('w2', other, path.join(work, 'node-w2'), fingerprint, p3),
    });
    const ex = tokenJson('x1', ['--ttl', '1s'], p3);
    cases.push({
      why: /expired/,
      run: async () => {
        // the token's own time runs out (a clock, not an event)
        await waitFor('the token to expire', () => Date.now() > Date.parse(ex.expires_at) + 50, 5_000, 20);
        return enrollCli('x1', ex.token, path.join(work, 'node-x1'), fingerprint, p3);
      },
    });
    for (const c of cases) {
      const before = refusedReasons(own).length;
      const r = await c.run();
      expect(r.code, r.err).not.toBe(0);
      expect(r.err.trim()).toMatch(
        /^herald: enrollment_refused: the controller answered 403 enrollment_refused: POST \/v1\/enroll refused/,
      );
      await waitFor('the refusal log line', () => refusedReasons(own).length > before, 5_000, 20);
      expect(refusedReasons(own).slice(before)).toEqual([expect.stringMatching(c.why)]);
    }
    // nothing was written for a refused node
    expect(fs.existsSync(path.join(work, 'node-w2', 'agent', 'w2.key'))).toBe(false);
    await stopProc(own);
  });

  it('refuses a wrong CA fingerprint before sending anything: the token stays usable', async () => {
    const tok = token('f1', ['--ip', '127.0.0.1']);
    const before = ctl.log().length;
    const wrong = enrollCli('f1', tok, path.join(work, 'node-f1'), 'ab'.repeat(32));
    expect(wrong.code).not.toBe(0);
    expect(wrong.err).toMatch(/^herald: ca_fingerprint_mismatch: /);
    expect(ctl.log().slice(before)).not.toMatch(/enroll/);
    expect(fs.existsSync(path.join(work, 'node-f1'))).toBe(false);
    const right = enrollCli('f1', tok, path.join(work, 'node-f1'), fingerprint.toLowerCase().replace(/:/g, ''));
    expect(right.code, right.err).toBe(0);
  });

  it('renews a short-lived certificate again and again without a restart, with a new key each time, and keeps working', async () => {
    const tok = token('rn1', ['--ip', '127.0.0.1']);
    const dir = path.join(work, 'node-rn1');
    expect(enrollCli('rn1', tok, dir).code).toBe(0);
    const certFile = path.join(dir, 'agent', 'rn1.crt');
    const keyFile = path.join(dir, 'agent', 'rn1.key');
    const first = identityOf(fs.readFileSync(certFile), 'herald.local');
    const agent = await e.startAgent('rn1', dir);
    const serials = new Set<string>([first.serial]);
    const keys = new Set<string>([fs.readFileSync(keyFile, 'utf8')]);
    await waitFor(
      'two renewals',
      async () => {
        if (hasExited(agent)) throw new Error(`agent exited: ${agent.log()}`);
        const s = identityOf(fs.readFileSync(certFile), 'herald.local').serial;
        if (!serials.has(s)) {
          serials.add(s);
          keys.add(fs.readFileSync(keyFile, 'utf8'));
          // the certificate on disk is for the key beside it
          expect(
            new crypto.X509Certificate(fs.readFileSync(certFile)).checkPrivateKey(
              crypto.createPrivateKey(fs.readFileSync(keyFile)),
            ),
          ).toBe(true);
        }
        return serials.size >= 3;
      },
      LIFETIME_S * 3_000,
      100,
    );
    expect(keys.size).toBe(3);
    expect(fs.statSync(keyFile).mode & 0o777).toBe(0o600);
    // the controller saw the renewals; the same process did them all
    const node = await api(port, op, 'GET', '/v1/nodes/rn1');
    expect(node.json.certificate.renewal_failures).toBe(0);
    expect(serials.has(node.json.certificate.serial)).toBe(true);
    expect(agent.log().match(/"event":"certificate.renewed"/g)!.length).toBeGreaterThanOrEqual(2);
    expect(agent.log()).not.toMatch(/"msg":"agent started"[\s\S]*"msg":"agent started"/);
    // a deployment after the renewals (the API client uses the new certificate)
    const deploy = async (label: string): Promise<void> => {
      const cfg = await api(port, op, 'POST', '/v1/configs', {
        name: `c-${label}`,
        group: 'script',
        config: `#!/bin/sh\necho ${label}\n`,
      });
      expect(cfg.status).toBe(201);
      const d = await api(port, op, 'POST', '/v1/deployments', { node: 'rn1', config_id: cfg.json.id });
      expect(d.status).toBe(201);
      const done = await waitFor(
        `deployment ${label}`,
        async () => {
          const r = await api(port, op, 'GET', `/v1/deployments/${d.json.id}`);
          return r.json.status !== 'IN_PROGRESS' ? r.json : undefined;
        },
        30_000,
        100,
      );
      expect(done.status, done.status_reason).toBe('COMPLETE');
      expect(done.output_values.deploy_stdout).toContain(label);
    };
    await deploy('after-renewals');
    // the first certificate has expired by now; a controller started again dials the listener,
    // which presents the renewed one, and pushes the next deployment
    await waitFor(
      'the first certificate to expire',
      () => Date.now() > first.validTo.getTime() + 1_000,
      LIFETIME_S * 2_000,
      200,
    );
    await stopProc(ctl);
    ctl = await startController(['--issuer', 'i1', '--agent-cert-lifetime', `${LIFETIME_S}s`]);
    await waitFor(
      'the push connection again',
      async () => (await api(port, op, 'GET', '/v1/nodes/rn1')).json.push.connected === true,
      30_000,
      100,
    );
    await deploy('after-restart');
    expect(hasExited(agent)).toBe(false);
    rnAgent = { proc: agent, dir };
  });

  it('limits enrolment attempts per source address (429 rate_limited with Retry-After)', async () => {
    const p4 = await freePort();
    const own = await startController(['--issuer', 'i1'], p4, path.join(work, 'limit.db'));
    const statuses: number[] = [];
    let retryAfter: string | undefined;
    for (let i = 0; i < ENROLL_RATE_BURST + 3 && !statuses.includes(429); i++) {
      const r = await new Promise<{ status: number; code: string; retry?: string }>((resolve, reject) => {
        const body = JSON.stringify({ token: `hj1.guess-${i}`, node: 'g1', csr: 'x' });
        const q = https.request(
          {
            host: '127.0.0.1',
            port: p4,
            method: 'POST',
            path: '/v1/enroll',
            ca: fs.readFileSync(path.join(pki, 'ca.crt')),
            servername: 'localhost',
            agent: false,
            headers: { 'content-type': 'application/json', 'content-length': String(body.length) },
          },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () =>
              resolve({
                status: res.statusCode ?? 0,
                code: JSON.parse(text).error.code,
                retry: res.headers['retry-after'] as string,
              }),
            );
          },
        );
        q.on('error', reject);
        q.end(body);
      });
      statuses.push(r.status);
      if (r.status === 429) {
        expect(r.code).toBe('rate_limited');
        retryAfter = r.retry;
      } else expect(r.code).toBe('enrollment_refused');
    }
    expect(statuses).toEqual([...Array(ENROLL_RATE_BURST).fill(403), 429]);
    expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
    // the refusals are summarised: the first at once, the rest counted when the controller stops
    await stopProc(own);
    const lines = own
      .log()
      .split('\n')
      .filter((l) => l.includes('"enroll.refused"'))
      .map((l) => JSON.parse(l) as { count: number });
    expect(lines.length).toBeLessThan(ENROLL_RATE_BURST);
    expect(lines.reduce((n, l) => n + l.count, 0)).toBe(ENROLL_RATE_BURST);
  });

  it('an agent whose renewal keeps failing warns from 90 % on and shows it in GET /v1/nodes/{id}', async () => {
    // a controller that cannot issue (no --issuer) and an agent certificate the issuer made for 12 s
    const p2 = await freePort();
    const plain = await startController([], p2, path.join(work, 'plain.db'));
    const dir = path.join(work, 'node-rf1');
    fs.mkdirSync(path.join(dir, 'agent'), { recursive: true });
    for (const f of ['ca.crt', 'wake-signing.jwks', 'revoked.json'])
      fs.copyFileSync(path.join(pki, f), path.join(dir, f));
    const issuer = {
      cert: fs.readFileSync(path.join(pki, 'issuer', 'i1.crt'), 'utf8'),
      key: fs.readFileSync(path.join(pki, 'issuer', 'i1.key'), 'utf8'),
    };
    const made = issueWithIssuer({
      issuer,
      role: 'agent',
      name: 'rf1',
      ip: ['127.0.0.1'],
      notBefore: new Date(Date.now() - 1_000),
      notAfter: new Date(Date.now() + 20_000),
    });
    fs.writeFileSync(path.join(dir, 'agent', 'rf1.key'), made.key, { mode: 0o600 });
    fs.writeFileSync(path.join(dir, 'agent', 'rf1.crt'), made.chain);
    const agent = await e.startAgent('rf1', dir, { controllerPort: p2 });
    // the agent's own schedule: X.509 keeps whole seconds
    const x = new crypto.X509Certificate(made.cert);
    const from = Date.parse(x.validFrom);
    const warnAt = from + 0.9 * (Date.parse(x.validTo) - from);
    const line = await waitFor(
      'the renewal_overdue warning',
      () =>
        agent
          .log()
          .split('\n')
          .find((l) => l.includes('"code":"renewal_overdue"')),
      30_000,
      100,
    );
    const w = JSON.parse(line) as { level: number; time: number; cause: string };
    expect(w.level).toBe(40);
    expect(w.cause, agent.log()).toBe('enrollment_disabled');
    expect(w.time).toBeGreaterThanOrEqual(warnAt - 50);
    // failures before 90 % were plain warnings, not renewal_overdue
    const before = agent
      .log()
      .split('\n')
      .filter((l) => l.includes('certificate renewal failed; retrying'));
    for (const l of before) expect((JSON.parse(l) as { time: number }).time).toBeLessThan(warnAt + 50);
    const node = await api(p2, op, 'GET', '/v1/nodes/rf1');
    expect(node.json.certificate).toMatchObject({ last_renewal_error: 'enrollment_disabled' });
    expect(node.json.certificate.renewal_failures).toBeGreaterThanOrEqual(1);
    expect(['overdue', 'expired']).toContain(node.json.certificate.renewal);
    await stopProc(agent);
    await stopProc(plain);
  });

  it("revoking the issuer closes the enrolled agent's push connection and refuses it (revoked)", async () => {
    const a = rnAgent!;
    expect((await api(port, op, 'GET', '/v1/nodes/rn1')).json.push.connected).toBe(true);
    const r = heraldSync(['certs', 'revoke', 'issuer/i1', '--dir', pki]);
    expect(r.code, r.err).toBe(0);
    const node = await waitFor(
      'the push connection to be closed',
      async () => {
        const n = (await api(port, op, 'GET', '/v1/nodes/rn1')).json;
        return n.push.connected === false ? n : undefined;
      },
      15_000,
      100,
    );
    expect(node.push.last_error).toBe('revoked');
    // and its own requests, with the renewed certificate it holds now, are refused
    const cred = {
      ca: fs.readFileSync(path.join(pki, 'ca.crt')),
      cert: fs.readFileSync(path.join(a.dir, 'agent', 'rn1.crt')),
      key: fs.readFileSync(path.join(a.dir, 'agent', 'rn1.key')),
    };
    const res = await api(port, cred, 'GET', '/v1/nodes/rn1/metadata');
    expect(res.status).toBe(403);
    expect(res.json.error.code).toBe('revoked');
    await stopProc(a.proc);
  });
});
