/**
 * The lifecycle of an agent identity with real processes (docs/certificates-over-time.md,
 * "Revoking a node"): renewal only for a node that exists and at most once per
 * RENEWAL_MIN_INTERVAL_FRACTION of the lifetime; a renewed certificate's first use retires the
 * one it renewed; `herald node revoke` (POST /v1/nodes/{id}/revoke) refuses every certificate of
 * the node, one renewed from a stolen one included, and closes its live connections; and
 * `herald certs revoke agent/<node>` revokes an enrolled node whose certificate the PKI never saw.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeCsr } from '../../certs/csr.js';
import { RENEWAL_MIN_INTERVAL_FRACTION } from '../../protocol/limits.js';
import { makeEnrolBed, type EnrolBed } from '../helpers/enrollment.js';
import { api, credOf, heraldSync, isBuilt, waitFor, type Cred } from '../helpers/procs.js';

const built = isBuilt();
const LIFETIME_S = 20;
let e: EnrolBed;
let work: string;
let pki: string;
let op: Cred;
let port: number;

/** A node enrolled with a join token, as `herald agent enroll` writes it; its credentials. */
function enroll(node: string, dirName = `node-${node}`): Cred {
  const dir = path.join(work, dirName);
  const r = e.enroll(node, e.token(node), dir);
  expect(r.code, r.err).toBe(0);
  return credOf(dir, 'agent', node);
}

/** POST /v1/nodes/{node}/certificate with `c`, for a fresh key; the new credentials when issued. */
async function renew(node: string, c: Cred): Promise<{ status: number; code?: string; retry?: string; cred?: Cred }> {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const keyPem = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const csr = makeCsr({ keyPem, commonName: node, uris: [`spiffe://herald.local/agent/${node}`] });
  const r = await api(port, c, 'POST', `/v1/nodes/${node}/certificate`, { csr });
  if (r.status !== 200)
    return { status: r.status, code: r.json?.error?.code, retry: r.headers['retry-after'] as string | undefined };
  return { status: 200, cred: { ca: c.ca, cert: Buffer.from(r.json.certificate), key: Buffer.from(keyPem) } };
}

/** The error code (or 'ok') of an agent request with `c`. */
async function codeOf(node: string, c: Cred): Promise<string> {
  const r = await api(port, c, 'GET', `/v1/nodes/${node}/metadata`);
  return r.status === 200 ? 'ok' : String(r.json?.error?.code);
}

/** The time after which the enrolment of now may be renewed (a clock, not an event). */
function renewableAt(): number {
  return Date.now() + LIFETIME_S * 1000 * RENEWAL_MIN_INTERVAL_FRACTION + 1_000;
}

describe.skipIf(!built)('the lifecycle of an agent identity with real processes', { timeout: 120_000 }, () => {
  beforeAll(async () => {
    e = await makeEnrolBed({
      prefix: 'herald-revoke-',
      controllerArgs: ['--push-workers', '0', '--issuer', 'i1', '--agent-cert-lifetime', `${LIFETIME_S}s`],
    });
    ({ work, pki, op, port } = e);
  });

  afterAll(async () => {
    await e?.close();
  });

  it('refuses the renewal of a node that was never created, or was deleted', async () => {
    const never = enroll('nx1');
    expect(await renew('nx1', never)).toMatchObject({ status: 404, code: 'not_found' });
    expect((await api(port, op, 'POST', '/v1/nodes', { id: 'dl1' })).status).toBe(201);
    const deleted = enroll('dl1');
    expect((await api(port, op, 'DELETE', '/v1/nodes/dl1')).status).toBe(204);
    expect(await renew('dl1', deleted)).toMatchObject({ status: 403, code: 'node_deleted' });
  });

  it('renews at most once per interval; the renewed certificate in use retires the one it renewed; revoking the node refuses the stolen and the renewed certificate, live connections closed', async () => {
    for (const n of ['sp1', 'st1']) expect((await api(port, op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
    const sp0 = enroll('sp1');
    const stolen = enroll('st1');
    const at = renewableAt();
    // just enrolled: a renewal now is refused, with the time to wait
    const early = await renew('st1', stolen);
    expect(early).toMatchObject({ status: 429, code: 'renewal_too_soon' });
    expect(Number(early.retry)).toBeGreaterThanOrEqual(1);
    await waitFor('the renewal interval to pass', () => Date.now() > at, LIFETIME_S * 1000, 100);

    // a renewal, then a use of the renewed certificate: the one it renewed is refused
    const sp1 = (await renew('sp1', sp0)).cred!;
    expect(await codeOf('sp1', sp0)).toBe('ok');
    // the renewed certificate's first use (a renewal at once: refused, one per interval)
    expect(await renew('sp1', sp1)).toMatchObject({ status: 429, code: 'renewal_too_soon' });
    await waitFor(
      'the superseded certificate refused',
      async () => (await codeOf('sp1', sp0)) === 'revoked',
      10_000,
      50,
    );
    expect(await codeOf('sp1', sp1)).toBe('ok');

    // a thief renews from the stolen certificate; both hold live keep-alive connections
    const renewed = (await renew('st1', stolen)).cred!;
    const live = async (c: Cred): Promise<{ closed: Promise<void> }> => {
      const agent = new https.Agent({ keepAlive: true, ca: c.ca, cert: c.cert, key: c.key, servername: 'localhost' });
      await new Promise<void>((resolve, reject) => {
        https
          .get({ host: '127.0.0.1', port, path: '/v1/nodes/st1/metadata', agent }, (res) => {
            expect(res.statusCode).toBe(200);
            res.resume();
            res.on('end', resolve);
          })
          .on('error', reject);
      });
      const socket = Object.values(agent.freeSockets).flat()[0]!;
      return { closed: new Promise((resolve) => socket.once('close', () => resolve())) };
    };
    const liveStolen = await live(stolen);
    // the operator revokes the node (POST /v1/nodes/st1/revoke)
    const r = heraldSync([
      'node',
      'revoke',
      'st1',
      '--controller',
      `https://127.0.0.1:${port}`,
      '--pki',
      pki,
      '--json',
    ]);
    expect(r.code, r.err).toBe(0);
    expect(JSON.parse(r.out)).toMatchObject({ node: 'st1', revoked_before: expect.any(String) });
    await liveStolen.closed;
    expect(await codeOf('st1', stolen)).toBe('revoked');
    expect(await codeOf('st1', renewed)).toBe('revoked');
    expect(await renew('st1', renewed)).toMatchObject({ status: 403, code: 'revoked' });
    // other nodes are untouched; an agent may not revoke
    expect(await codeOf('sp1', sp1)).toBe('ok');
    const byAgent = await api(port, sp1, 'POST', '/v1/nodes/sp1/revoke', {});
    expect([byAgent.status, byAgent.json.error.code]).toEqual([403, 'wrong_role']);
    // enrolled again after the revocation, the node is let in: its certificate starts no earlier
    // than the revocation, whole seconds in X.509, so within the revocation's second it is not
    // valid yet (certificate_expired) until that second has passed
    const again = enroll('st1', 'node-st1-again');
    const from = Date.parse(new crypto.X509Certificate(again.cert).validFrom);
    await waitFor('the new certificate to be valid', () => Date.now() >= from, 5_000);
    expect(await codeOf('st1', again)).toBe('ok');
  });

  it('herald certs revoke agent/<node> revokes an enrolled node whose certificate the PKI never saw', async () => {
    expect((await api(port, op, 'POST', '/v1/nodes', { id: 'pk1' })).status).toBe(201);
    const c = enroll('pk1');
    expect(await codeOf('pk1', c)).toBe('ok');
    const r = heraldSync(['certs', 'revoke', 'agent/pk1', '--dir', pki]);
    expect(r.code, r.err).toBe(0);
    const revoked = JSON.parse(fs.readFileSync(path.join(pki, 'revoked.json'), 'utf8'));
    expect(Object.keys(revoked.identities)).toEqual(['agent/pk1']);
    // the controller follows revoked.json without a restart
    await waitFor('the enrolled certificate refused', async () => (await codeOf('pk1', c)) === 'revoked', 10_000, 50);
  });
});
