/**
 * The controller and a Herald issuer (docs/adding-nodes.md), in-process over real TLS 1.3 on 127.0.0.1:
 * `--issuer <name>` loads `<pki>/issuer/<name>` (or refuses to start with a code), and the API
 * serves agents whose certificates the issuer made, until the issuer is revoked: then a
 * kept-alive connection under it is closed and new ones are refused.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pkiPaths } from '../../certs/paths.js';
import { issueIssuer, issueWithIssuer, revoke, type Pem } from '../../certs/pki.js';
import { resolveOptions } from '../../controller/options.js';
import { codeOf } from '../../protocol/errors.js';
import { keptAlive } from '../helpers/kept-alive.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';

let pki: ControllerTestPki;
let issuer: Pem;
let t: TestController;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  const r = await issueIssuer({ dir: pki.dir, name: 'i1' });
  issuer = { cert: fs.readFileSync(r.certPath, 'utf8'), key: fs.readFileSync(r.keyPath, 'utf8') };
  t = await startTestController(pki, { issuer: 'i1' });
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

function agentVia(name: string, by: Pem = issuer): Cred {
  const made = issueWithIssuer({ issuer: by, role: 'agent', name, ip: ['127.0.0.1'], dns: ['localhost'] });
  return { ca: pki.ca, cert: Buffer.from(made.chain), key: Buffer.from(made.key) };
}

async function startError(over: Record<string, unknown>): Promise<{ code: string | undefined; field: unknown }> {
  try {
    const x = await startTestController(pki, over);
    await x.close();
    return { code: 'started', field: undefined };
  } catch (err) {
    return { code: codeOf(err), field: (err as { field?: unknown }).field };
  }
}

describe('herald controller --issuer', () => {
  it('loads the issuer and keeps it', () => {
    expect(t.ctl.issuer?.name).toBe('i1');
    expect(t.ctl.issuer?.cert).toBe(issuer.cert);
  });

  it('refuses to start without the issuer files (pki_missing)', async () => {
    expect(await startError({ issuer: 'nope' })).toEqual({ code: 'pki_missing', field: 'issuer' });
  });

  it('refuses to start with a certificate that is not an issuer (bad_option)', async () => {
    const p = pkiPaths(pki.dir);
    fs.copyFileSync(p.cert('agent', 'n1'), p.cert('issuer', 'fake'));
    fs.copyFileSync(p.key('agent', 'n1'), p.key('issuer', 'fake'));
    expect(await startError({ issuer: 'fake' })).toEqual({ code: 'bad_option', field: 'issuer' });
  });

  it('bin/herald controller --issuer without the files exits non-zero with pki_missing naming the file', () => {
    const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
    const r = spawnSync(
      path.join(repo, 'bin', 'herald'),
      [
        'controller',
        '--pki',
        pki.dir,
        '--db',
        path.join(pki.dir, 'x.db'),
        '--listen',
        '127.0.0.1:0',
        '--issuer',
        'nope',
      ],
      { encoding: 'utf8', timeout: 20_000 },
    );
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/pki_missing/);
    expect(r.stderr).toMatch(/issuer\/nope\.crt/);
  });

  it('refuses a malformed issuer name (bad_option)', () => {
    let err: unknown;
    try {
      resolveOptions({ pki: pki.dir, issuer: '../x' }, {});
    } catch (e) {
      err = e;
    }
    expect(codeOf(err)).toBe('bad_option');
  });
});

describe('the API and agents made by an issuer', () => {
  it('serves an agent whose certificate the issuer made', async () => {
    const r = await t.req(agentVia('n1'), 'GET', '/v1/nodes/n1/metadata');
    expect(r.status).not.toBe(403);
    const h = await t.req(agentVia('n7'), 'GET', '/healthz');
    expect(h.status).toBe(200);
  });

  it('refuses an operator certificate the issuer made (bad_issuer)', async () => {
    const { makeCertificate } = await import('../../certs/pki.js');
    const made = makeCertificate({
      issuer,
      uris: [pki.spiffe('operator', 'admin')],
      eku: { clientAuth: true },
    });
    const cred = { ca: pki.ca, cert: Buffer.from(`${made.cert}${issuer.cert}`), key: Buffer.from(made.key) };
    const r = await t.req(cred, 'GET', '/v1/nodes');
    expect(r.status).toBe(403);
    expect(r.json.error.code).toBe('bad_issuer');
  });

  it('closes a live connection under a revoked issuer and refuses new ones (revoked)', async () => {
    const r = await issueIssuer({ dir: pki.dir, name: 'r1' });
    const r1 = { cert: fs.readFileSync(r.certPath, 'utf8'), key: fs.readFileSync(r.keyPath, 'utf8') };
    const cred = agentVia('rv', r1);
    const conn = keptAlive(t.port, cred);
    const get = conn.get;
    try {
      expect(await get()).toBe(200);
      const closed = new Promise<void>((resolve) => conn.socket()!.once('close', () => resolve()));
      await revoke({ dir: pki.dir, target: 'issuer/r1' });
      await waitFor('the live connection to be closed', async () => {
        await Promise.race([closed, new Promise((res) => setTimeout(res, 50))]);
        return conn.socket()!.destroyed;
      });
      const again = await t.req(cred, 'GET', '/healthz');
      expect(again.status).toBe(403);
      expect(again.json.error.code).toBe('revoked');
      // the root's own agent certificates and other issuers' are not under it
      expect((await t.req(pki.cred('agent', 'n2'), 'GET', '/healthz')).status).toBe(200);
      expect((await t.req(agentVia('n8'), 'GET', '/healthz')).status).toBe(200);
    } finally {
      conn.close();
    }
  });
});
