/**
 * The agent's HTTPS requests to the controller API go through the HTTP CONNECT proxy of
 * `HTTPS_PROXY` (docs/dial-out.md) like its dialled push connection: a real HTTPS stand-in of the
 * API with certificates made by certs/, a tiny CONNECT proxy that records what it is asked for.
 * Through the proxy the controller is still checked end to end (a signed fetch verifies, a server
 * of another identity is refused); a host `NO_PROXY` names is reached directly; a proxy refusing
 * the CONNECT fails the request with `proxy_refused`. `herald agent enroll` (agent/enroll.ts) takes
 * the proxy for both its connections alike.
 */
import crypto from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import type http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { tlsServerOptions, type PkiMaterial } from '../../certs/tls.js';
import { parseDialProxy, proxyEnvOf } from '../../agent/dial-proxy.js';
import { enroll } from '../../agent/enroll.js';
import { Fetcher } from '../../agent/fetcher.js';
import { codeOf } from '../../protocol/errors.js';
import { NONCE_HEADER, sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { makeAgentTestPki, quietLog, type AgentTestPki } from '../helpers/agent-pki.js';

let pki: AgentTestPki;
let agentMaterial: PkiMaterial;
const closers: Array<() => unknown> = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  agentMaterial = pki.material('agent', 'n1');
});
afterAll(() => pki?.cleanup());
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

/** The API stand-in: a signed generation 5 for a fetch, 200 for a signal; what it was sent. */
async function controller(
  as: ['controller' | 'agent', string] = ['controller', 'controller'],
): Promise<{ port: number; requests: Array<{ method: string; url: string; body: string; resumed: boolean }> }> {
  const requests: Array<{ method: string; url: string; body: string; resumed: boolean }> = [];
  const s = https.createServer(tlsServerOptions(pki.material(as[0], as[1])), (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      requests.push({
        method: req.method ?? '',
        url: req.url ?? '',
        body: Buffer.concat(chunks).toString(),
        resumed: (req.socket as tls.TLSSocket).isSessionReused(),
      });
      if (req.method === 'POST') {
        res.writeHead(200, { 'content-length': 0 });
        res.end();
        return;
      }
      signed(req, res, 5);
    });
  });
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  closers.push(
    () =>
      new Promise<void>((r) => {
        s.closeAllConnections();
        s.close(() => r());
      }),
  );
  return { port: (s.address() as net.AddressInfo).port, requests };
}

function signed(req: http.IncomingMessage, res: http.ServerResponse, gen: number): void {
  const body = Buffer.from(JSON.stringify({ node: 'n1', generation: gen, deployments: [] }));
  const sig = signMetadata(pki.signer, {
    iss: pki.spiffe('controller', 'controller'),
    aud: pki.spiffe('agent', 'n1'),
    gen,
    nonce: req.headers[NONCE_HEADER] as string,
    nowS: Date.now() / 1000,
    sha256: sha256b64url(body),
  });
  res.writeHead(200, { etag: `"${gen}"`, 'content-type': 'application/json', 'herald-signature': sig });
  res.end(body);
}

/** A tiny HTTP CONNECT proxy: it tunnels to what it is asked, or answers `status` and closes. */
async function connectProxy(status = 200): Promise<{ port: number; asked: string[] }> {
  const asked: string[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => client.destroy());
    let head = '';
    const onData = (d: Buffer): void => {
      head += d.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      client.off('data', onData);
      const target = /^CONNECT (\S+) HTTP\/1\.1/.exec(head)?.[1] ?? '';
      asked.push(target);
      if (status !== 200) {
        client.end(`HTTP/1.1 ${status} Forbidden\r\nContent-Length: 0\r\n\r\n`);
        return;
      }
      const colon = target.lastIndexOf(':');
      const up = net.connect(Number(target.slice(colon + 1)), target.slice(0, colon), () => {
        client.write('HTTP/1.1 200 Connection established\r\n\r\n');
        client.pipe(up);
        up.pipe(client);
      });
      sockets.add(up);
      up.on('close', () => sockets.delete(up));
      up.on('error', () => client.destroy());
      client.on('close', () => up.destroy());
    };
    client.on('data', onData);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  closers.push(() => {
    for (const s of sockets) s.destroy();
    return new Promise((r) => server.close(r));
  });
  return { port: (server.address() as net.AddressInfo).port, asked };
}

function fetcher(port: number, env: Record<string, string>): Fetcher {
  const f = new Fetcher({
    controllerUrl: `https://127.0.0.1:${port}`,
    node: 'n1',
    material: agentMaterial,
    controllerSpiffeId: pki.spiffe('controller', 'controller'),
    lastAppliedGen: () => undefined,
    log: quietLog(),
    proxy: parseDialProxy(proxyEnvOf(env)),
  });
  closers.push(() => f.close());
  return f;
}

const SIGNAL_PATH = '/v1/nodes/n1/deployments/d1/signal';
const signalBody = { revision: 1, deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} };

async function refused(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    return codeOf(err) ?? `uncoded: ${(err as Error).message}`;
  }
  return undefined;
}

describe("the agent's API requests and HTTPS_PROXY", () => {
  it('fetch and signal go through the proxy (CONNECT host:port), the answers still verify, the session resumes', async () => {
    const ctl = await controller();
    const p = await connectProxy();
    const f = fetcher(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}`, NO_PROXY: 'ctl.example.com' });
    expect(await f.fetchMetadata()).toMatchObject({ status: 200, gen: 5, document: { node: 'n1', generation: 5 } });
    // a new connection for the signal, which resumes the first one's TLS session in a tunnel of its own
    f.closeIdleApiConnections();
    expect(await f.signal(SIGNAL_PATH, signalBody as never, 'd1')).toEqual({ status: 200 });
    expect(p.asked).toEqual([`127.0.0.1:${ctl.port}`, `127.0.0.1:${ctl.port}`]);
    expect(ctl.requests.map((r) => `${r.method} ${r.url}`)).toEqual([
      'GET /v1/nodes/n1/metadata',
      `POST ${SIGNAL_PATH}`,
    ]);
    expect(JSON.parse(ctl.requests[1]!.body)).toMatchObject({ revision: 1 });
    expect(ctl.requests.map((r) => r.resumed)).toEqual([false, true]);
  });

  it('checks the server through the tunnel as on a direct connection (wrong_peer)', async () => {
    const ctl = await controller(['agent', 'n2']);
    const p = await connectProxy();
    const f = fetcher(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}` });
    expect(await refused(f.fetchMetadata())).toBe('wrong_peer');
    expect(p.asked).toEqual([`127.0.0.1:${ctl.port}`]);
    expect(ctl.requests).toEqual([]);
  });

  it('goes directly to a host NO_PROXY names', async () => {
    const ctl = await controller();
    const p = await connectProxy();
    const f = fetcher(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}`, NO_PROXY: 'example.com,127.0.0.1' });
    expect(await f.fetchMetadata()).toMatchObject({ status: 200, gen: 5 });
    expect(await f.signal(SIGNAL_PATH, signalBody as never, 'd1')).toEqual({ status: 200 });
    expect(p.asked).toEqual([]);
    expect(ctl.requests).toHaveLength(2);
  });

  it('fails with proxy_refused when the proxy answers the CONNECT 403', async () => {
    const ctl = await controller();
    const p = await connectProxy(403);
    const f = fetcher(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}` });
    expect(await refused(f.fetchMetadata())).toBe('proxy_refused');
    expect(await refused(f.signal(SIGNAL_PATH, signalBody as never, 'd1'))).toBe('proxy_refused');
    expect(p.asked).toEqual([`127.0.0.1:${ctl.port}`, `127.0.0.1:${ctl.port}`]);
    expect(ctl.requests).toEqual([]);
  });
});

describe('herald agent enroll and HTTPS_PROXY', () => {
  /** An enrolment stand-in that refuses every token: enough to see where both connections went. */
  async function enrolment(): Promise<{ port: number; posts: string[] }> {
    const posts: string[] = [];
    const s = https.createServer(tlsServerOptions(pki.material('controller', 'controller')), (req, res) => {
      req.resume();
      req.on('end', () => {
        posts.push(`${req.method} ${req.url}`);
        res.writeHead(403, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { code: 'enrollment_refused', message: 'the token is not known' } }));
      });
    });
    s.listen(0, '127.0.0.1');
    await once(s, 'listening');
    closers.push(
      () =>
        new Promise<void>((r) => {
          s.closeAllConnections();
          s.close(() => r());
        }),
    );
    return { port: (s.address() as net.AddressInfo).port, posts };
  }

  function enrollVia(port: number, env: Record<string, string>): Promise<unknown> {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-enroll-proxy-'));
    closers.push(() => fs.rmSync(dir, { recursive: true, force: true }));
    const caSha256 = crypto.createHash('sha256').update(new crypto.X509Certificate(pki.cred('agent', 'n1').ca).raw);
    return enroll({
      controller: `https://127.0.0.1:${port}`,
      caSha256: caSha256.digest('hex'),
      token: 'hj1.x',
      node: 'n9',
      pki: dir,
      retryBudgetMs: 0,
      proxy: parseDialProxy(proxyEnvOf(env)),
    });
  }

  it('pins the CA and posts the enrolment through the proxy', async () => {
    const ctl = await enrolment();
    const p = await connectProxy();
    expect(await refused(enrollVia(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}` }))).toBe(
      'enrollment_refused',
    );
    // one tunnel for the CA's pinning, one for the request
    expect(p.asked).toEqual([`127.0.0.1:${ctl.port}`, `127.0.0.1:${ctl.port}`]);
    expect(ctl.posts).toEqual(['POST /v1/enroll']);
  });

  it('goes directly to a host NO_PROXY names, and fails with proxy_refused on a 403 from the proxy', async () => {
    const ctl = await enrolment();
    const p = await connectProxy(403);
    expect(
      await refused(enrollVia(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}`, NO_PROXY: '127.0.0.1' })),
    ).toBe('enrollment_refused');
    expect(p.asked).toEqual([]);
    expect(await refused(enrollVia(ctl.port, { HTTPS_PROXY: `http://127.0.0.1:${p.port}` }))).toBe('proxy_refused');
    expect(p.asked).toEqual([`127.0.0.1:${ctl.port}`]);
    expect(ctl.posts).toEqual(['POST /v1/enroll']);
  });
});
