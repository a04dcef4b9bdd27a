/**
 * Fuzzing of what a peer sends before it is authenticated, or with no more than an agent's
 * certificate (SECURITY.md, "Enrolment"): keys and CSRs of extreme shapes (RSA of any modulus
 * and exponent, e = 1, even e, DSA, Ed448, curves Herald does not name, explicit parameters,
 * truncated DER, deep nesting, oversized), random and mutated requests, over real TLS against an
 * in-process controller with an issuer, on `POST /v1/enroll` and on the renewal route; client
 * certificates with odd keys at the API's TLS handshake; and JWS of other algorithms and shapes.
 * Every answer is the route's coded refusal, never a 500, and the controller logs no
 * unexpected error. How long a request beside them waits is a benchmark figure
 * (`npm run bench -- --pre-auth`, BENCHMARKS.md), not asserted here.
 */
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeCsr } from '../../certs/csr.js';
import { issueIssuer } from '../../certs/pki.js';
import { codeOf } from '../../protocol/errors.js';
import { KeySet, verifyCompact, WAKE_TYP } from '../../protocol/jws.js';
import { startTestController, type Res, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, TD, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { derOf, oddCsrs, pemOf } from '../helpers/odd-keys.js';

const GENEROUS = { burst: 1_000_000, perS: 1_000_000 };
const RUNS = Number(process.env.HERALD_FUZZ_RUNS ?? 60);

let pki: ControllerTestPki;
let t: TestController;
let agent: Cred;
let agentKey: crypto.KeyObject;
let goodCsr: string;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  await issueIssuer({ dir: pki.dir, name: 'i1' });
  t = await startTestController(
    pki,
    { issuer: 'i1' },
    { rates: { enroll: GENEROUS, enrollNetwork: GENEROUS, other: GENEROUS, announce: GENEROUS } },
  );
  // an enrolled agent, for the renewal route
  const tk = await t.req(pki.cred('operator', 'admin'), 'POST', '/v1/enrollment-tokens', { node: 'fz1' });
  agentKey = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
  const keyPem = agentKey.export({ type: 'pkcs8', format: 'pem' }) as string;
  goodCsr = makeCsr({ keyPem, commonName: 'fz1', uris: [`spiffe://${TD}/agent/fz1`] });
  const r = await t.req(pki.noCert, 'POST', '/v1/enroll', { token: tk.json.token, node: 'fz1', csr: goodCsr });
  expect(r.status, r.text).toBe(200);
  agent = { ca: pki.ca, cert: Buffer.from(r.json.certificate), key: Buffer.from(keyPem) };
}, 60_000);

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

const enroll = (csr: unknown, token = 'hj1.fuzz-unknown-token'): Promise<Res> =>
  t.req(pki.noCert, 'POST', '/v1/enroll', { token, node: 'fz2', csr });
const renew = (csr: unknown): Promise<Res> => t.req(agent, 'POST', '/v1/nodes/fz1/certificate', { csr });

/** The controller logged no request that failed unexpectedly (a 500's line). */
function noUnexpected(): void {
  expect(t.logLines().filter((l) => l.msg === 'request failed unexpectedly')).toEqual([]);
}

describe('fuzz: keys and CSRs before authentication', () => {
  it('POST /v1/enroll refuses every extreme key and CSR shape with enrollment_refused, for the reason of its kind', async () => {
    const cases = oddCsrs('fz2', agentKey);
    for (const c of cases) {
      const r = await enroll(c.csr);
      expect([c.what, r.status, r.json?.error?.code]).toEqual([c.what, 403, 'enrollment_refused']);
    }
    // each kind of reason was logged (summarised), naming the key policy for the keys
    const kinds = new Set(
      t
        .logLines()
        .filter((l) => l.event === 'enroll.refused')
        .map((l) => l.kind),
    );
    expect([...kinds].sort()).toEqual(['bad_csr', 'bad_key']);
    noUnexpected();
  });

  it('the renewal route refuses every extreme key with bad_key and every bad request with bad_csr', async () => {
    for (const c of oddCsrs('fz1', agentKey)) {
      const r = await renew(c.csr);
      expect([c.what, r.status, r.json?.error?.code]).toEqual([c.what, 400, c.code]);
    }
    noUnexpected();
  });

  it('random bytes and mutations of a valid CSR get a coded refusal on both routes, never a 500', async () => {
    const der = derOf(goodCsr);
    const mutated = fc
      .tuple(fc.nat(der.length - 1), fc.integer({ min: 0, max: 255 }), fc.nat(der.length))
      .map(([i, byte, cut]) => {
        const b = Buffer.from(der);
        b[i] = byte;
        return pemOf(b.subarray(0, Math.max(1, cut)));
      });
    const random = fc.uint8Array({ minLength: 0, maxLength: 6000 }).map((b) => pemOf(Buffer.from(b)));
    await fc.assert(
      fc.asyncProperty(fc.oneof(mutated, random, fc.string({ maxLength: 9000 })), async (csr) => {
        const e = await enroll(csr);
        expect(e.status).toBe(403);
        expect(e.json.error.code).toBe('enrollment_refused');
        const r = await renew(csr);
        // a mutation may leave the CSR valid (a byte set to its own value): the renewal is issued
        if (r.status !== 200) {
          expect(r.status).toBe(400);
          expect(['bad_csr', 'bad_key']).toContain(r.json.error.code);
        }
      }),
      { numRuns: RUNS },
    );
    noUnexpected();
  });
});

describe('fuzz: odd client certificates at the TLS handshake', () => {
  it('self-signed certificates with odd keys are refused with a code (or by TLS), and the API answers after', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-oddcert-'));
    try {
      const keys: Array<[string, string[]]> = [
        ['ed448', ['-newkey', 'ed448']],
        ['ed25519', ['-newkey', 'ed25519']],
        ['p521', ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:secp521r1']],
        ['secp256k1', ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:secp256k1']],
        ['rsa1024-e3', ['-newkey', 'rsa:1024', '-pkeyopt', 'rsa_keygen_pubexp:3']],
        ['dsa', ['-newkey', 'dsa:2048']],
      ];
      for (const [name, newkey] of keys) {
        const keyFile = path.join(dir, `${name}.key`);
        const certFile = path.join(dir, `${name}.crt`);
        const extra = name === 'dsa' ? dsaParams(dir) : newkey;
        execFileSync(
          'openssl',
          [
            'req',
            '-x509',
            ...extra,
            '-nodes',
            '-keyout',
            keyFile,
            '-out',
            certFile,
            '-days',
            '1',
            '-subj',
            `/CN=${name}`,
          ],
          { stdio: 'pipe', env: { ...process.env, OPENSSL_CONF: '/dev/null' } },
        );
        const cred: Cred = { ca: pki.ca, cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) };
        let code: string;
        try {
          const r = await t.req(cred, 'GET', '/v1/nodes');
          code = `${r.status} ${r.json?.error?.code}`;
        } catch (err) {
          // a handshake TLS refused itself (OpenSSL would not use the key): no request was read
          code = `tls ${(err as NodeJS.ErrnoException).code ?? 'error'}`;
        }
        expect(code, name).toMatch(/^(403 (untrusted_certificate|no_client_certificate)|tls \w+)$/);
        expect((await t.req(agent, 'GET', '/v1/nodes/fz1')).status, `after ${name}`).not.toBe(500);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    noUnexpected();
  });
});

describe('fuzz: JWS of other algorithms and key shapes', () => {
  it('a JWKS keeps only Ed25519 keys, and a token of any other algorithm or signature shape is refused with a code', () => {
    const ed = crypto.generateKeyPairSync('ed25519');
    const x = ed.publicKey.export({ format: 'jwk' }).x!;
    const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({ format: 'jwk' });
    const ed448 = crypto.generateKeyPairSync('ed448').publicKey.export({ format: 'jwk' });
    const keys = new KeySet({
      keys: [
        { ...rsa, kid: 'rsa' },
        { ...ed448, kid: 'ed448' },
        { kty: 'OKP', crv: 'Ed25519', x: `${x}${x}`, kid: 'long' },
        { kty: 'OKP', crv: 'Ed25519', x, kid: 'good' },
      ] as never,
    });
    const b64 = (o: unknown): string => Buffer.from(JSON.stringify(o)).toString('base64url');
    const claims = b64({ iss: 'x', aud: 'y', iat: 1, exp: 2, jti: 'j', gen: 1 });
    const cases: Array<[string, string]> = [];
    for (const alg of ['RS256', 'ES256', 'ES512', 'PS256', 'HS256', 'none', 'Ed448', 'EdDSA'])
      for (const kid of ['rsa', 'ed448', 'long', 'good'])
        for (const sig of [Buffer.alloc(0), Buffer.alloc(64, 1), Buffer.alloc(114, 1), crypto.randomBytes(1024)])
          cases.push([
            `${alg}/${kid}/${sig.length}`,
            `${b64({ alg, kid, typ: WAKE_TYP })}.${claims}.${sig.toString('base64url')}`,
          ]);
    for (const [what, token] of cases) {
      let code: unknown = 'accepted';
      try {
        verifyCompact(token, WAKE_TYP, keys);
      } catch (err) {
        code = codeOf(err);
      }
      expect(['bad_algorithm', 'unknown_kid', 'bad_signature', 'malformed', 'wrong_type'], what).toContain(code);
    }
  });
});

/** `-newkey dsa:<file>` needs parameters made first. */
function dsaParams(dir: string): string[] {
  const f = path.join(dir, 'dsa.params');
  execFileSync('openssl', ['dsaparam', '-out', f, '2048'], { stdio: 'pipe' });
  return ['-newkey', `dsa:${f}`];
}
