/**
 * Herald issuers (docs/adding-nodes.md), over real TLS 1.3 on 127.0.0.1: `herald certs issue issuer` makes an
 * intermediate CA under the cluster CA; agent certificates it signs (presented as leaf + issuer)
 * are accepted by servers using authorizePeer (the agent listener, the controller API) and by
 * dialers using tlsClientOptions (the push dialer); every other chain is refused with a code,
 * and revoking the issuer's serial refuses everything under it, resumed sessions included.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { basicConstraintsOf } from '../../certs/chain.js';
import { pkiPaths } from '../../certs/paths.js';
import { issueIssuer, issueWithIssuer, makeCertificate, newRsaKeyPem, readIssuer, type Pem } from '../../certs/pki.js';
import { authorizePeer, PkiMaterial, refusalCodeOf, tlsClientOptions, tlsServerOptions } from '../../certs/tls.js';
import { codeOf } from '../../protocol/errors.js';
import { ROLES } from '../../protocol/identity.js';
import { quietLogger } from '../helpers/pki.js';
import { materialPaths } from '../../certs/paths.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const herald = path.join(repo, 'bin', 'herald');
const h = (...args: string[]): string => execFileSync(herald, args, { encoding: 'utf8', cwd: repo });
const TD = 'herald.local';

let dir: string;
let root: Pem;
let issuer: Pem;
let key: string;
let ca: Buffer;
const closers: Array<() => unknown> = [];

interface Cred {
  cert: string | Buffer;
  key: string | Buffer;
}

beforeAll(() => {
  if (!fs.existsSync(path.join(repo, 'dist', 'certs', 'chain.js')))
    spawnSync('npx', ['tsc', '-p', 'tsconfig.build.json'], { cwd: repo, stdio: 'ignore' });
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-issuer-test-'));
  h('certs', 'init', '--dir', dir);
  h('certs', 'issue', 'issuer', 'i1', '--dir', dir);
  h('certs', 'issue', 'agent', 'n1', '--dir', dir, '--ip', '127.0.0.1');
  const p = pkiPaths(dir);
  root = { cert: fs.readFileSync(p.caCrt, 'utf8'), key: fs.readFileSync(p.caKey, 'utf8') };
  issuer = {
    cert: fs.readFileSync(p.cert('issuer', 'i1'), 'utf8'),
    key: fs.readFileSync(p.key('issuer', 'i1'), 'utf8'),
  };
  ca = Buffer.from(root.cert);
  key = newRsaKeyPem();
});

afterAll(() => {
  for (const c of closers.reverse()) c();
  fs.rmSync(dir, { recursive: true, force: true });
});

function material(role: 'controller' | 'agent', name: string): PkiMaterial {
  const m = new PkiMaterial({ ...materialPaths(dir, role, name), trustDomain: TD, logger: quietLogger, watch: false });
  closers.push(() => m.close());
  return m;
}

/** An agent certificate made by `by` (default: the issuer i1), as leaf + issuer PEM. */
function agentVia(name: string, by: Pem = issuer): Cred {
  const made = issueWithIssuer({ issuer: by, role: 'agent', name, ip: ['127.0.0.1'], keyPem: key });
  return { cert: made.chain, key: made.key };
}

/** A CA certificate under `parent` (tests' bad intermediates). */
function intermediate(parent: Pem, uris: string[], pathLen?: number): Pem {
  const made = makeCertificate({
    issuer: parent,
    uris,
    eku: {},
    ca: pathLen === undefined ? {} : { pathLen },
    keyPem: newRsaKeyPem(),
  });
  return { cert: made.cert, key: made.key };
}

/** A leaf of `role/name` signed by `by`, followed by `chain` (the certificates above it). */
function leaf(by: Pem, role: string, name: string, chain: string[]): Cred {
  const made = makeCertificate({
    issuer: by,
    uris: [`spiffe://${TD}/${role}/${name}`],
    ip: ['127.0.0.1'],
    eku: role === 'operator' ? { clientAuth: true } : { serverAuth: true, clientAuth: true },
    keyPem: key,
  });
  return { cert: [made.cert, ...chain].map((c) => c.trimEnd()).join('\n'), key: made.key };
}

describe('herald certs issue issuer', () => {
  it('writes a CA certificate under the cluster CA with pathLen 0 and an issuer SAN, its key 0600', () => {
    const p = pkiPaths(dir);
    expect(fs.statSync(p.key('issuer', 'i1')).mode & 0o777).toBe(0o600);
    expect(fs.statSync(p.cert('issuer', 'i1')).mode & 0o777).toBe(0o644);
    const x = new crypto.X509Certificate(issuer.cert);
    expect(x.ca).toBe(true);
    expect(basicConstraintsOf(x)).toEqual({ ca: true, pathLen: 0 });
    expect(x.subjectAltName).toBe('URI:spiffe://herald.local/issuer/i1');
    expect(x.verify(new crypto.X509Certificate(root.cert).publicKey)).toBe(true);
    const text = execFileSync('openssl', ['x509', '-noout', '-text', '-in', p.cert('issuer', 'i1')], {
      encoding: 'utf8',
    });
    expect(text).toMatch(/Certificate Sign, CRL Sign/);
    expect(text).toMatch(/CA:TRUE, pathlen:0/);
    expect(readIssuer(issuer).name).toBe('i1');
  });

  it('lists the issuer with certs list, and revokes it by name or serial', () => {
    h('certs', 'issue', 'issuer', 'i2', '--dir', dir, '--days', '30');
    const rows = JSON.parse(h('certs', 'list', '--dir', dir, '--json')) as Array<Record<string, unknown>>;
    const i2 = rows.find((r) => r.role === 'issuer' && r.name === 'i2');
    expect(i2).toMatchObject({ spiffeId: 'spiffe://herald.local/issuer/i2', revoked: false });
    expect(h('certs', 'list', '--dir', dir)).toMatch(/^issuer +i2 /m);
    expect(h('certs', 'revoke', 'issuer/i2', '--dir', dir)).toMatch(/revoked serial .* \(issuer\/i2\)/);
    h('certs', 'issue', 'issuer', 'i3', '--dir', dir);
    const serial = readIssuer({
      cert: fs.readFileSync(pkiPaths(dir).cert('issuer', 'i3'), 'utf8'),
      key: fs.readFileSync(pkiPaths(dir).key('issuer', 'i3'), 'utf8'),
    }).serial;
    expect(h('certs', 'revoke', serial, '--dir', dir)).toMatch(/revoked serial/);
    const after = JSON.parse(h('certs', 'list', '--dir', dir, '--json')) as Array<Record<string, unknown>>;
    expect(after.filter((r) => r.role === 'issuer' && r.revoked).map((r) => r.name)).toEqual(['i2', 'i3']);
  });

  it('bundles the issuer for a controller host, key 0600, never ca.key', () => {
    const out = path.join(dir, 'ctl-bundle');
    h('certs', 'bundle', 'controller', 'controller', '--dir', dir, '--out', out);
    h('certs', 'bundle', 'issuer', 'i1', '--dir', dir, '--out', out);
    const b = pkiPaths(out);
    expect(fs.readFileSync(b.cert('issuer', 'i1'), 'utf8')).toBe(issuer.cert);
    expect(fs.statSync(b.key('issuer', 'i1')).mode & 0o777).toBe(0o600);
    expect(fs.existsSync(b.caKey)).toBe(false);
  });

  it('refuses to make an issuer under a cluster CA made with pathLen 0 (bad_option)', async () => {
    const old = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-old-ca-'));
    try {
      h('certs', 'init', '--dir', old);
      const made = makeCertificate({ issuer: 'self', uris: [`spiffe://${TD}`], eku: {}, ca: { pathLen: 0 } });
      fs.writeFileSync(pkiPaths(old).caCrt, made.cert);
      fs.writeFileSync(pkiPaths(old).caKey, made.key, { mode: 0o600 });
      let err: unknown;
      try {
        await issueIssuer({ dir: old, name: 'i1' });
      } catch (e) {
        err = e;
      }
      expect(codeOf(err)).toBe('bad_option');
      expect(fs.existsSync(pkiPaths(old).cert('issuer', 'i1'))).toBe(false);
    } finally {
      fs.rmSync(old, { recursive: true, force: true });
    }
  });

  it('refuses DNS or IP SANs on an issuer (bad_option)', () => {
    const r = spawnSync(herald, ['certs', 'issue', 'issuer', 'ix', '--dir', dir, '--dns', 'x.example'], {
      encoding: 'utf8',
    });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/bad_option/);
  });
});

describe('issueWithIssuer', () => {
  it('signs an agent certificate whose chain is leaf then issuer', () => {
    const made = issueWithIssuer({ issuer, role: 'agent', name: 'n5', keyPem: key });
    const blocks = made.chain.match(/-----BEGIN CERTIFICATE-----/g) ?? [];
    expect(blocks.length).toBe(2);
    const x = new crypto.X509Certificate(made.cert);
    expect(x.subjectAltName).toBe('URI:spiffe://herald.local/agent/n5');
    expect(x.verify(new crypto.X509Certificate(issuer.cert).publicKey)).toBe(true);
  });

  it.each(['controller', 'operator', 'issuer'])('refuses to sign a %s certificate (bad_issuer)', (role) => {
    let err: unknown;
    try {
      issueWithIssuer({ issuer, role, name: 'x', keyPem: key });
    } catch (e) {
      err = e;
    }
    expect(codeOf(err)).toBe('bad_issuer');
  });

  it('refuses a signer that is not a Herald issuer (bad_issuer)', () => {
    let err: unknown;
    try {
      issueWithIssuer({ issuer: root, role: 'agent', name: 'x', keyPem: key });
    } catch (e) {
      err = e;
    }
    expect(codeOf(err)).toBe('bad_issuer');
  });
});

interface Answer {
  status: number;
  code: string | undefined;
  reused: boolean;
}

/** A server like the controller API's: authorizePeer for every role, the verdict as HTTP. */
async function startServer(m: PkiMaterial): Promise<number> {
  const server = https.createServer(tlsServerOptions(m), (req, res) => {
    const r = authorizePeer(req.socket as tls.TLSSocket, ROLES, m);
    res.setHeader('content-type', 'application/json');
    if (!r.ok) res.writeHead(403).end(JSON.stringify({ error: { code: r.code, message: r.message } }));
    else res.end(JSON.stringify({ spiffeId: r.identity.spiffeId }));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  closers.push(() => {
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as { port: number }).port;
}

function call(port: number, cred: Cred, session?: Buffer, onSession?: (s: Buffer) => void): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        path: '/',
        agent: false,
        ca,
        ...cred,
        checkServerIdentity: () => undefined,
        ...(session ? { session } : {}),
      } as https.RequestOptions,
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const body = JSON.parse(Buffer.concat(chunks).toString() || 'null') as { error?: { code?: string } };
          resolve({
            status: res.statusCode ?? 0,
            code: body?.error?.code,
            reused: (res.socket as tls.TLSSocket).isSessionReused(),
          });
        });
      },
    );
    if (onSession) req.on('socket', (s) => s.on('session', onSession));
    req.on('error', reject);
    req.end();
  });
}

describe('servers (authorizePeer) and an issuer', () => {
  let port: number;
  beforeAll(async () => {
    port = await startServer(material('controller', 'controller'));
  });

  it('accept an agent certificate made by the issuer, sent with the issuer', async () => {
    expect(await call(port, agentVia('n1'))).toMatchObject({ status: 200 });
  });

  it('refuse an agent certificate made by the issuer but sent without it (untrusted_certificate)', async () => {
    const made = issueWithIssuer({ issuer, role: 'agent', name: 'n1', keyPem: key });
    expect(await call(port, { cert: made.cert, key: made.key })).toMatchObject({
      status: 403,
      code: 'untrusted_certificate',
    });
  });

  const cases: Array<[string, () => Cred, string]> = [
    [
      'a chain with two intermediates (untrusted_certificate)',
      () => {
        const sub = intermediate(issuer, [`spiffe://${TD}/issuer/sub`], 0);
        return leaf(sub, 'agent', 'deep', [sub.cert, issuer.cert]);
      },
      'untrusted_certificate',
    ],
    [
      'an intermediate without an issuer SAN (bad_issuer)',
      () => {
        const bare = intermediate(root, [], 0);
        return leaf(bare, 'agent', 'n1', [bare.cert]);
      },
      'bad_issuer',
    ],
    [
      'an intermediate of another trust domain (bad_issuer)',
      () => {
        const other = intermediate(root, ['spiffe://other.example/issuer/i1'], 0);
        return leaf(other, 'agent', 'n1', [other.cert]);
      },
      'bad_issuer',
    ],
    [
      'an issuer-named intermediate without pathLen 0 (bad_issuer)',
      () => {
        const open = intermediate(root, [`spiffe://${TD}/issuer/open`]);
        return leaf(open, 'agent', 'n1', [open.cert]);
      },
      'bad_issuer',
    ],
    [
      'a controller certificate made by the issuer (bad_issuer)',
      () => leaf(issuer, 'controller', 'controller', [issuer.cert]),
      'bad_issuer',
    ],
    [
      'an operator certificate made by the issuer (bad_issuer)',
      () => leaf(issuer, 'operator', 'admin', [issuer.cert]),
      'bad_issuer',
    ],
    [
      'the issuer certificate itself as a peer (untrusted_certificate)',
      () => ({ cert: issuer.cert, key: issuer.key }),
      'untrusted_certificate',
    ],
  ];

  it.each(cases)('refuse %s', async (_title, cred, code) => {
    expect(await call(port, cred())).toMatchObject({ status: 403, code });
  });
});

describe('revoking an issuer', () => {
  it('refuses every certificate under it, on new and resumed connections', async () => {
    h('certs', 'issue', 'issuer', 'r1', '--dir', dir);
    const p = pkiPaths(dir);
    const r1 = {
      cert: fs.readFileSync(p.cert('issuer', 'r1'), 'utf8'),
      key: fs.readFileSync(p.key('issuer', 'r1'), 'utf8'),
    };
    const m = material('controller', 'controller');
    const port = await startServer(m);
    const a = agentVia('ra', r1);
    const b = agentVia('rb', r1);
    let session: Buffer | undefined;
    const gotSession = new Promise<void>((resolve) => {
      void call(port, a, undefined, (s) => {
        session = s;
        resolve();
      });
    });
    await gotSession;
    const resumed = await call(port, a, session, (s) => (session = s));
    expect(resumed).toMatchObject({ status: 200, reused: true });

    h('certs', 'revoke', 'issuer/r1', '--dir', dir);
    expect(m.reload().revoked).toBe(true);
    expect(await call(port, a, session)).toMatchObject({ status: 403, code: 'revoked', reused: true });
    expect(await call(port, a)).toMatchObject({ status: 403, code: 'revoked', reused: false });
    expect(await call(port, b)).toMatchObject({ status: 403, code: 'revoked' });
    // the root's own certificates are not under it
    expect(
      await call(port, { cert: fs.readFileSync(p.cert('agent', 'n1')), key: fs.readFileSync(p.key('agent', 'n1')) }),
    ).toMatchObject({ status: 200 });
  });
});

describe('a dialer (tlsClientOptions, the push dialer) and an issuer', () => {
  async function serve(cred: Cred): Promise<number> {
    const server = tls.createServer(
      { ...cred, ca, requestCert: true, rejectUnauthorized: false, minVersion: 'TLSv1.3' },
      (s) => {
        s.on('error', () => {});
        s.end('hello');
      },
    );
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    closers.push(() => server.close());
    return (server.address() as { port: number }).port;
  }

  function dial(m: PkiMaterial, port: number, expected: string): Promise<string> {
    return new Promise((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port, ...tlsClientOptions(m, expected) });
      s.on('secureConnect', () => {
        s.destroy();
        resolve('connected');
      });
      s.on('error', (err) => resolve(refusalCodeOf(err) ?? `uncoded: ${err.message}`));
    });
  }

  it('connects to an agent listener whose certificate the issuer made', async () => {
    const port = await serve(agentVia('n1'));
    expect(await dial(material('controller', 'controller'), port, `spiffe://${TD}/agent/n1`)).toBe('connected');
  });

  it('refuses a controller certificate made by the issuer (bad_issuer)', async () => {
    const port = await serve(leaf(issuer, 'controller', 'controller', [issuer.cert]));
    expect(await dial(material('agent', 'n1'), port, `spiffe://${TD}/controller/controller`)).toBe('bad_issuer');
  });

  it('refuses an agent under an intermediate that is not a Herald issuer (bad_issuer)', async () => {
    const bare = intermediate(root, [], 0);
    const port = await serve(leaf(bare, 'agent', 'n1', [bare.cert]));
    expect(await dial(material('controller', 'controller'), port, `spiffe://${TD}/agent/n1`)).toBe('bad_issuer');
  });

  it('refuses an agent under a revoked issuer (revoked)', async () => {
    h('certs', 'issue', 'issuer', 'r2', '--dir', dir);
    const p = pkiPaths(dir);
    const r2 = {
      cert: fs.readFileSync(p.cert('issuer', 'r2'), 'utf8'),
      key: fs.readFileSync(p.key('issuer', 'r2'), 'utf8'),
    };
    const port = await serve(agentVia('n1', r2));
    const m = material('controller', 'controller');
    expect(await dial(m, port, `spiffe://${TD}/agent/n1`)).toBe('connected');
    h('certs', 'revoke', 'issuer/r2', '--dir', dir);
    m.reload();
    expect(await dial(m, port, `spiffe://${TD}/agent/n1`)).toBe('revoked');
  });
});
