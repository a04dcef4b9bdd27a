/**
 * Real TLS 1.3 on 127.0.0.1: servers built from tlsServerOptions + authorizePeer answer a
 * refusal as HTTP 403 {"error":{"code"}}, and the tests assert the code the client saw. The PKI
 * is made by the CLI (bin/herald, built from dist/), the bad certificates by test/helpers/pki.ts.
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
import { API_KEEP_ALIVE_TIMEOUT_MS } from '../../protocol/limits.js';
import {
  authorizePeer,
  HttpsAgentHolder,
  PkiMaterial,
  refusalCodeOf,
  tlsClientOptions,
  tlsServerOptions,
  watchServer,
} from '../../certs/tls.js';
import { makeTestPki, quietLogger, type CertFiles, type TestPki } from '../helpers/pki.js';
import type { Role } from '../../protocol/identity.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const herald = path.join(repo, 'bin', 'herald');
const EVENT_BOUND_MS = 5_000;
const bounded = (): AbortSignal => AbortSignal.timeout(EVENT_BOUND_MS);
/** Settles with `p`, or rejects after EVENT_BOUND_MS naming what never came. */
function within<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`timed out after ${EVENT_BOUND_MS} ms waiting for ${what}`)),
      EVENT_BOUND_MS,
    );
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
const h = (...args: string[]): string => execFileSync(herald, args, { encoding: 'utf8', cwd: repo });

let dir: string;
let pki: TestPki;
const closers: Array<() => unknown> = [];

beforeAll(async () => {
  if (
    !fs.existsSync(path.join(repo, 'dist', 'cli', 'main.js')) ||
    !fs.existsSync(path.join(repo, 'dist', 'certs', 'cli.js'))
  ) {
    spawnSync('npx', ['tsc', '-p', 'tsconfig.build.json'], { cwd: repo, stdio: 'ignore' });
  }
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-tls-test-'));
  h('certs', 'init', '--dir', dir);
  for (const n of ['n1', 'n2'])
    h('certs', 'issue', 'agent', n, '--dir', dir, '--ip', '127.0.0.1', '--dns', 'localhost');
  pki = await makeTestPki({ dir, existing: true });
});

afterAll(() => {
  for (const c of closers.reverse()) c();
  pki?.cleanup();
  fs.rmSync(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  json: any;
  reused: boolean;
  serverSerial: string | undefined;
}

/** An HTTPS server that authorizes every request with authorizePeer and answers the verdict. */
async function startServer(material: PkiMaterial, want: Role | Role[]): Promise<number> {
  const server = https.createServer(tlsServerOptions(material), (req, res) => {
    const r = authorizePeer(req.socket as tls.TLSSocket, want, material);
    res.setHeader('content-type', 'application/json');
    if (!r.ok) {
      res.writeHead(403).end(JSON.stringify({ error: { code: r.code, message: r.message } }));
      return;
    }
    res.end(JSON.stringify({ spiffeId: r.identity.spiffeId, serial: r.identity.serial }));
  });
  const unwatch = watchServer(server, material);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  closers.push(() => {
    unwatch();
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as { port: number }).port;
}

/** One request on a new connection; `onSession` receives the TLS session ticket. */
function call(
  port: number,
  creds: { cert?: Buffer; key?: Buffer },
  extra: https.RequestOptions & tls.ConnectionOptions = {},
  onSession?: (s: Buffer) => void,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        path: '/',
        agent: false,
        ca: pki.cred('controller', 'controller').ca,
        ...creds,
        checkServerIdentity: () => undefined,
        ...extra,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (d: Buffer) => chunks.push(d));
        res.on('end', () => {
          const sock = res.socket as tls.TLSSocket;
          resolve({
            status: res.statusCode ?? 0,
            json: JSON.parse(Buffer.concat(chunks).toString() || 'null'),
            reused: sock.isSessionReused(),
            serverSerial: sock.getPeerX509Certificate()?.serialNumber.toLowerCase(),
          });
        });
      },
    );
    if (onSession) req.on('socket', (s) => s.on('session', onSession));
    req.on('error', reject);
    req.end();
  });
}

const files = (f: CertFiles): { cert: Buffer; key: Buffer } => ({ cert: f.cert, key: f.key });

describe('a server that wants a controller', () => {
  let material: PkiMaterial;
  let port: number;
  const bad: Record<string, CertFiles> = {};
  beforeAll(async () => {
    bad.expired = await pki.bad('expired', 'controller', 'old');
    bad.notYet = await pki.bad('not-yet-valid', 'controller', 'future');
    bad.foreign = await pki.bad('foreign', 'controller', 'controller');
    bad.forged = await pki.bad('forged', 'operator', 'admin');
    bad.revoked = await pki.bad('revoked', 'controller', 'gone');
    bad.wrongEku = await pki.bad('wrong-eku', 'controller', 'half');
    material = pki.material('controller', 'controller');
    port = await startServer(material, 'controller');
  });

  it('accepts a controller certificate', async () => {
    const a = await call(port, pki.cred('controller', 'controller'));
    expect(a.status).toBe(200);
    expect(a.json.spiffeId).toBe('spiffe://herald.local/controller/controller');
  });

  it.each([
    ['an agent certificate', () => pki.cred('agent', 'n1'), 'wrong_role'],
    ['an operator certificate', () => pki.cred('operator', 'admin'), 'wrong_role'],
    ['a certificate of a second CA', () => files(bad.foreign!), 'untrusted_certificate'],
    ['an expired certificate', () => files(bad.expired!), 'certificate_expired'],
    ['a not yet valid certificate', () => files(bad.notYet!), 'certificate_expired'],
    ['a revoked certificate', () => files(bad.revoked!), 'revoked'],
    ['a self-signed certificate forging operator/admin', () => files(bad.forged!), 'untrusted_certificate'],
    ['a controller certificate without serverAuth', () => files(bad.wrongEku!), 'wrong_eku'],
    ['no certificate at all', () => ({}), 'no_client_certificate'],
  ])('refuses %s with a code', async (_what, creds, code) => {
    const a = await call(port, creds());
    expect(a.status).toBe(403);
    expect(a.json.error.code).toBe(code);
  });

  it('refuses a certificate revoked after its session was made, on the resumed session', async () => {
    h('certs', 'issue', 'controller', 'resumer', '--dir', dir);
    const creds = pki.cred('controller', 'resumer');
    let session: Buffer | undefined;
    const gotSession = new Promise<void>((resolve) => {
      void call(port, creds, {}, (s) => {
        session = s;
        resolve();
      }).then((a) => expect(a.status).toBe(200));
    });
    await within(gotSession, 'a TLS session ticket');
    expect(session).toBeDefined();

    const resumedOk = await call(port, creds, { session: session! }, (s) => (session = s));
    expect(resumedOk.reused).toBe(true);
    expect(resumedOk.status).toBe(200);

    const changed = once(material, 'revoked-change', { signal: bounded() });
    h('certs', 'revoke', 'controller/resumer', '--dir', dir);
    const [serials] = (await changed) as [ReadonlySet<string>];
    const serial = new crypto.X509Certificate(creds.cert).serialNumber.toLowerCase();
    expect(serials.has(serial)).toBe(true);

    const a = await call(port, creds, { session: session! });
    expect(a.reused).toBe(true);
    expect(a.status).toBe(403);
    expect(a.json.error.code).toBe('revoked');
  });

  it('refuses a TLS 1.2 client at the handshake', async () => {
    const err = await new Promise<NodeJS.ErrnoException>((resolve, reject) => {
      const s = tls.connect({
        host: '127.0.0.1',
        port,
        maxVersion: 'TLSv1.2',
        ...pki.cred('controller', 'controller'),
        checkServerIdentity: () => undefined,
      });
      s.on('secureConnect', () => reject(new Error('TLS 1.2 handshake succeeded')));
      s.on('error', resolve);
    });
    expect(err.code).toMatch(/PROTOCOL_VERSION|UNSUPPORTED_PROTOCOL/);
    expect(refusalCodeOf(err)).toBe('tls_version');
  });
});

describe('a dialer (tlsClientOptions)', () => {
  let dialer: PkiMaterial;
  const ports: Record<string, number> = {};
  let bytesAtWrongPeer = 0;
  beforeAll(async () => {
    await pki.bad('revoked', 'agent', 'n9');
    // made after the revocation: this test is about the dialer's check, not the file watcher's timing
    dialer = pki.material('controller', 'controller');
    for (const [label, role, name] of [
      ['n1', 'agent', 'n1'],
      ['n2', 'agent', 'n2'],
      ['controller', 'controller', 'controller'],
      ['n9', 'agent', 'n9'],
    ] as const) {
      const m = pki.material(role, name);
      const server = tls.createServer(tlsServerOptions(m), (s) => {
        s.on('data', (d: Buffer) => (bytesAtWrongPeer += label === 'n1' ? 0 : d.length));
        s.on('error', () => {});
        s.end('hello');
      });
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      closers.push(() => server.close());
      ports[label] = (server.address() as { port: number }).port;
    }
  });

  function dial(port: number, expected: string): Promise<string> {
    return new Promise((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port, ...tlsClientOptions(dialer, expected) });
      s.write('secret wake-up');
      s.on('secureConnect', () => {
        s.destroy();
        resolve('connected');
      });
      s.on('error', (err) => resolve(refusalCodeOf(err) ?? `uncoded: ${err.message}`));
    });
  }

  it('connects to the agent it expects, whatever the hostname', async () => {
    expect(await dial(ports.n1!, 'spiffe://herald.local/agent/n1')).toBe('connected');
  });

  it('refuses another agent or the controller with wrong_peer, before sending anything', async () => {
    expect(await dial(ports.n2!, 'spiffe://herald.local/agent/n1')).toBe('wrong_peer');
    expect(await dial(ports.controller!, 'spiffe://herald.local/agent/n1')).toBe('wrong_peer');
    expect(bytesAtWrongPeer).toBe(0);
  });

  it('refuses a revoked server', async () => {
    expect(await dial(ports.n9!, 'spiffe://herald.local/agent/n9')).toBe('revoked');
  });

  it('HttpsAgentHolder dials only the expected id', async () => {
    const ok = new HttpsAgentHolder(dialer, 'spiffe://herald.local/controller/controller');
    const wrong = new HttpsAgentHolder(dialer, 'spiffe://herald.local/controller/other');
    closers.push(
      () => ok.close(),
      () => wrong.close(),
    );
    const apiPort = await startServer(pki.material('controller', 'controller'), 'controller');
    const get = (agent: https.Agent): Promise<string> =>
      new Promise((resolve) => {
        https
          .get({ host: '127.0.0.1', port: apiPort, path: '/', agent }, (res) => {
            res.resume();
            resolve(String(res.statusCode));
          })
          .on('error', (err) => resolve(refusalCodeOf(err) ?? err.message));
      });
    expect(await get(ok.agent)).toBe('200');
    ok.rebuild();
    expect(await get(ok.agent)).toBe('200');
    expect(await get(wrong.agent)).toBe('wrong_peer');
  });

  it('keeps its connections without TCP keep-alive probes before the API closes them (http.Agent probes every second by default)', () => {
    const h = new HttpsAgentHolder(dialer, 'spiffe://herald.local/controller/controller');
    closers.push(() => h.close());
    const msecs = (h.agent as unknown as { keepAliveMsecs: number }).keepAliveMsecs;
    expect(msecs).toBeGreaterThanOrEqual(API_KEEP_ALIVE_TIMEOUT_MS);
  });
});

describe('PkiMaterial', () => {
  it('fires revoked-change when revoked.json changes, and keeps the last good list when it breaks', async () => {
    const m = pki.material('agent', 'n1');
    const serialN2 = new crypto.X509Certificate(pki.cred('agent', 'n2').cert).serialNumber.toLowerCase();
    const changed = once(m, 'revoked-change', { signal: bounded() });
    h('certs', 'revoke', 'agent/n2', '--dir', dir);
    const [serials] = (await changed) as [ReadonlySet<string>];
    expect(serials.has(serialN2)).toBe(true);

    const before = m.current().revokedSerials;
    const failed = once(m, 'load-error', { signal: bounded() });
    const tmp = `${pki.paths.revoked}.corrupt`;
    fs.writeFileSync(tmp, '{"serials": [');
    fs.renameSync(tmp, pki.paths.revoked);
    const [info] = (await failed) as [{ file: string }];
    expect(info.file).toBe(pki.paths.revoked);
    expect(m.current().revokedSerials).toBe(before);
    expect(m.current().revokedSerials.has(serialN2)).toBe(true);

    fs.writeFileSync(tmp, JSON.stringify({ serials: [...before], kids: ['k1'] }));
    const fixed = once(m, 'revoked-change', { signal: bounded() });
    fs.renameSync(tmp, pki.paths.revoked);
    const [, kids] = (await fixed) as [ReadonlySet<string>, ReadonlySet<string>];
    expect(kids.has('k1')).toBe(true);
  });

  it('takes a renewed certificate into the server (setSecureContext)', async () => {
    const m = pki.material('agent', 'n1');
    const port = await startServer(m, 'controller');
    const first = await call(port, pki.cred('controller', 'controller'));
    expect(first.status).toBe(200);
    expect(first.serverSerial).toBe(m.current().identity.serial);

    const changed = once(m, 'tls-change', { signal: bounded() });
    const out = h('certs', 'issue', 'agent', 'n1', '--dir', dir, '--ip', '127.0.0.1');
    const newSerial = /serial\s+([0-9a-f]+)/.exec(out)![1];
    await changed;
    expect(m.current().identity.serial).toBe(newSerial);
    const second = await call(port, pki.cred('controller', 'controller'));
    expect(second.serverSerial).toBe(newSerial);
    expect(second.serverSerial).not.toBe(first.serverSerial);
  });

  it('refuses to start on missing or mismatched files, naming them', () => {
    const p = pki.paths;
    const base = {
      caPath: p.caCrt,
      revokedPath: p.revoked,
      trustDomain: 'herald.local',
      logger: quietLogger,
      watch: false,
    };
    const codeOf = (f: () => unknown): string | undefined => {
      try {
        (f() as PkiMaterial).close();
      } catch (err) {
        return (err as { code?: string }).code;
      }
      return 'started';
    };
    expect(
      codeOf(
        () => new PkiMaterial({ ...base, certPath: p.cert('agent', 'nobody'), keyPath: p.key('agent', 'nobody') }),
      ),
    ).toBe('pki_missing');
    expect(
      codeOf(() => new PkiMaterial({ ...base, certPath: p.cert('agent', 'n1'), keyPath: p.key('agent', 'n2') })),
    ).toBe('bad_option');
    expect(
      codeOf(
        () =>
          new PkiMaterial({
            ...base,
            certPath: p.cert('agent', 'n1'),
            keyPath: p.key('agent', 'n1'),
            trustDomain: 'other.example',
          }),
      ),
    ).toBe('bad_option');
    const m = new PkiMaterial({
      ...base,
      certPath: p.cert('agent', 'n1'),
      keyPath: p.key('agent', 'n1'),
      jwksPath: p.jwks,
    });
    expect(m.current().identity.spiffeId).toBe('spiffe://herald.local/agent/n1');
    expect(m.current().jwks?.keys[0]?.crv).toBe('Ed25519');
    m.close();
    m.close();
  });
});
