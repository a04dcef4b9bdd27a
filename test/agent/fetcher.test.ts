/**
 * The fetcher against a tiny HTTPS server that signs like the controller (protocol/metadata.ts):
 * tampered bodies, replayed responses, forged 304s, rollbacks, oversized bodies and a server
 * with the wrong identity are all refused before anything could be applied.
 */
import { once } from 'node:events';
import https from 'node:https';
import type http from 'node:http';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { tlsServerOptions, type PkiMaterial } from '../../certs/tls.js';
import { codeOf, RefusalError } from '../../protocol/errors.js';
import type { MetadataDocument } from '../../protocol/heat.js';
import { NONCE_HEADER, sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { Fetcher, FetchStatusError, isTransientFetchError, RateLimitedError } from '../../agent/fetcher.js';
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

type Handler = (req: http.IncomingMessage, res: http.ServerResponse, body: Buffer) => void;

async function server(
  handler: Handler,
  as: ['controller' | 'agent', string] = ['controller', 'controller'],
): Promise<{ url: string; requests: http.IncomingMessage[] }> {
  const material = pki.material(as[0], as[1]);
  const requests: http.IncomingMessage[] = [];
  const s = https.createServer(tlsServerOptions(material), (req, res) => {
    requests.push(req);
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => handler(req, res, Buffer.concat(chunks)));
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
  const port = (s.address() as { port: number }).port;
  return { url: `https://127.0.0.1:${port}`, requests };
}

function doc(gen: number): MetadataDocument {
  return { node: 'n1', generation: gen, deployments: [] };
}

/** Answers like the controller: a 200 with a signed digest, or a signed 304 for If-None-Match. */
function signedAnswer(
  req: http.IncomingMessage,
  res: http.ServerResponse,
  gen: number,
  over: { body?: Buffer; nonce?: string; aud?: string } = {},
): { body: Buffer; sig: string } {
  const nonce = over.nonce ?? (req.headers[NONCE_HEADER] as string);
  const common = {
    iss: pki.spiffe('controller', 'controller'),
    aud: over.aud ?? pki.spiffe('agent', 'n1'),
    gen,
    nonce,
    nowS: Date.now() / 1000,
  };
  if (req.headers['if-none-match'] === `"${gen}"`) {
    const sig = signMetadata(pki.signer, common);
    res.writeHead(304, { etag: `"${gen}"`, 'herald-signature': sig });
    res.end();
    return { body: Buffer.alloc(0), sig };
  }
  const body = Buffer.from(JSON.stringify(doc(gen)));
  const sig = signMetadata(pki.signer, { ...common, sha256: sha256b64url(body) });
  const sent = over.body ?? body;
  res.writeHead(200, { etag: `"${gen}"`, 'content-type': 'application/json', 'herald-signature': sig });
  res.end(sent);
  return { body: sent, sig };
}

function fetcher(url: string, over: { lastApplied?: number; maxMetadataBytes?: number } = {}): Fetcher {
  const f = new Fetcher({
    controllerUrl: url,
    node: 'n1',
    material: agentMaterial,
    controllerSpiffeId: pki.spiffe('controller', 'controller'),
    lastAppliedGen: () => over.lastApplied,
    log: quietLog(),
    ...(over.maxMetadataBytes ? { maxMetadataBytes: over.maxMetadataBytes } : {}),
  });
  closers.push(() => f.close());
  return f;
}

async function refused(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    return codeOf(err) ?? `uncoded: ${(err as Error).message}`;
  }
  return undefined;
}

describe('metadata fetch', () => {
  it('verifies a 200, then sends If-None-Match and verifies the signed 304, on one kept-alive connection', async () => {
    const srv = await server((req, res) => signedAnswer(req, res, 7));
    const f = fetcher(srv.url);
    const a = await f.fetchMetadata();
    expect(a).toMatchObject({ status: 200, gen: 7, document: { node: 'n1', generation: 7 } });
    const b = await f.fetchMetadata();
    expect(b).toEqual({ status: 304, gen: 7 });
    expect(srv.requests[1]!.headers['if-none-match']).toBe('"7"');
    expect(srv.requests[0]!.headers[NONCE_HEADER]).not.toBe(srv.requests[1]!.headers[NONCE_HEADER]);
    expect(srv.requests[0]!.socket).toBe(srv.requests[1]!.socket);
  });

  it('refuses a body that differs by one byte from its signature', async () => {
    const srv = await server((req, res) => {
      const body = Buffer.from(JSON.stringify(doc(8)));
      body[body.length - 2] = 'x'.charCodeAt(0) === body[body.length - 2] ? 'y'.charCodeAt(0) : 'x'.charCodeAt(0);
      signedAnswer(req, res, 8, { body });
    });
    expect(await refused(fetcher(srv.url).fetchMetadata())).toBe('digest_mismatch');
  });

  it('refuses a replayed older signed response (another nonce) and a fresh one below the applied generation', async () => {
    let recorded: { body: Buffer; sig: string } | undefined;
    let mode: 'record' | 'replay' | 'old' = 'record';
    const srv = await server((req, res) => {
      if (mode === 'record') recorded = signedAnswer(req, res, 3);
      else if (mode === 'replay') {
        res.writeHead(200, { etag: '"3"', 'herald-signature': recorded!.sig });
        res.end(recorded!.body);
      } else signedAnswer(req, res, 3);
    });
    const f = fetcher(srv.url);
    await f.fetchMetadata();
    f.forgetEtag();
    mode = 'replay';
    expect(await refused(f.fetchMetadata())).toBe('nonce_mismatch');
    mode = 'old';
    expect(await refused(fetcher(srv.url, { lastApplied: 5 }).fetchMetadata())).toBe('rollback');
  });

  it('refuses a 304 signed for another nonce, a missing signature and another audience', async () => {
    let mode = 'ok';
    const srv = await server((req, res) => {
      if (mode === 'ok') signedAnswer(req, res, 4);
      else if (mode === 'forged304') signedAnswer(req, res, 4, { nonce: 'AAAAAAAAAAAAAAAAAAAAAA' });
      else if (mode === 'nosig') {
        res.writeHead(200, { etag: '"4"' });
        res.end(JSON.stringify(doc(4)));
      } else signedAnswer(req, res, 4, { aud: pki.spiffe('agent', 'n2') });
    });
    const f = fetcher(srv.url);
    await f.fetchMetadata();
    mode = 'forged304';
    expect(await refused(f.fetchMetadata())).toBe('nonce_mismatch');
    f.forgetEtag();
    mode = 'nosig';
    expect(await refused(f.fetchMetadata())).toBe('missing_signature');
    mode = 'aud';
    expect(await refused(f.fetchMetadata())).toBe('wrong_audience');
  });

  it('refuses a body over the limit while reading it', async () => {
    const srv = await server((_req, res) => {
      res.writeHead(200, { 'herald-signature': 'x.y.z' });
      // no content-length: chunked, counted as it arrives
      for (let i = 0; i < 64; i++) res.write(Buffer.alloc(1024, 0x20));
      res.end();
    });
    expect(await refused(fetcher(srv.url, { maxMetadataBytes: 16 * 1024 }).fetchMetadata())).toBe('response_too_large');
  });

  it('refuses a server that presents an agent certificate (wrong_peer) before sending anything', async () => {
    const srv = await server((req, res) => signedAnswer(req, res, 1), ['agent', 'n2']);
    expect(await refused(fetcher(srv.url).fetchMetadata())).toBe('wrong_peer');
    expect(srv.requests).toHaveLength(0);
  });

  it('treats an unexpected status as bad_response', async () => {
    const srv = await server((_req, res) => {
      res.writeHead(403, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'wrong_node' } }));
    });
    expect(await refused(fetcher(srv.url).fetchMetadata())).toBe('bad_response');
  });
});

describe('metadata fetch refused with 429', () => {
  it('is rate_limited and carries the Retry-After, so the agent retries not before it', async () => {
    const srv = await server((_req, res) => {
      res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '3' });
      res.end('{"error":{"code":"rate_limited"}}');
    });
    const err = await fetcher(srv.url)
      .fetchMetadata()
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(RateLimitedError);
    expect((err as RateLimitedError).code).toBe('rate_limited');
    expect((err as RateLimitedError).retryAfterMs).toBe(3_000);
  });
});

describe('which failed fetches are retried early', () => {
  it('network errors, 429 and 5xx are; refused answers and other statuses are not', () => {
    expect(isTransientFetchError(Object.assign(new Error('reset'), { code: 'ECONNRESET' }))).toBe(true);
    expect(isTransientFetchError(new RateLimitedError('429', 1_000))).toBe(true);
    expect(isTransientFetchError(new FetchStatusError(503, 'unavailable'))).toBe(true);
    expect(isTransientFetchError(new FetchStatusError(403, 'wrong_node'))).toBe(false);
    expect(isTransientFetchError(new RefusalError('nonce_mismatch'))).toBe(false);
    expect(isTransientFetchError(new RefusalError('bad_signature'))).toBe(false);
  });
});

describe('announce and signal', () => {
  it('retries an announcement refused with 429, honouring Retry-After', async () => {
    let n = 0;
    const srv = await server((_req, res, body) => {
      n++;
      if (n === 1) {
        res.writeHead(429, { 'retry-after': '0' });
        res.end('{"error":{"code":"rate_limited"}}');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    });
    const ok = await fetcher(srv.url).announce('wss://127.0.0.1:7443/v1/wake');
    expect(ok).toBe(true);
    expect(n).toBe(2);
    expect(srv.requests[1]!.method).toBe('PUT');
    expect(srv.requests[1]!.url).toBe('/v1/nodes/n1/endpoint');
  });

  it('stops retrying when aborted', async () => {
    const srv = await server((_req, res) => {
      res.writeHead(500);
      res.end();
    });
    const ac = new AbortController();
    const p = fetcher(srv.url).announce('wss://127.0.0.1:7443/v1/wake', ac.signal);
    await new Promise((r) => setTimeout(r, 50));
    ac.abort();
    expect(await p).toBe(false);
  });

  it('posts a signal and returns the status', async () => {
    let got: unknown;
    const srv = await server((_req, res, body) => {
      got = JSON.parse(body.toString());
      res.writeHead(409);
      res.end();
    });
    const status = await fetcher(srv.url).signal(
      '/v1/nodes/n1/deployments/d1/signal',
      {
        revision: 1,
        deploy_status_code: 0,
        deploy_stdout: '',
        deploy_stderr: '',
        outputs: {},
      },
      'd1',
    );
    expect(status).toEqual({ status: 409 });
    expect(got).toMatchObject({ revision: 1 });
  });
});
