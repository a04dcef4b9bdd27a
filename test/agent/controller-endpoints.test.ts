/**
 * The agent's controller URLs (agent/controller-endpoints.ts) through the real Fetcher, against
 * tiny HTTPS servers on 127.0.0.1 with certificates made by certs/ that sign like controllers:
 * which failures move to the next URL (refused connections, the wrong TLS identity, 5xx) and
 * which do not (a refused answer), `--controller-id` lists and `*` at the fetcher, the binding of
 * the metadata's kid to the answering controller, and the log summary of switches.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import type http from 'node:http';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ControllerEndpoints, parseControllerUrls } from '../../agent/controller-endpoints.js';
import { Fetcher } from '../../agent/fetcher.js';
import { pkiPaths } from '../../certs/paths.js';
import { tlsServerOptions, type ExpectedServer, type PkiMaterial } from '../../certs/tls.js';
import { codeOf } from '../../protocol/errors.js';
import { parseControllerIds } from '../../protocol/identity.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';
import { NONCE_HEADER, sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { makeAgentTestPki, memoryLog, type AgentTestPki } from '../helpers/agent-pki.js';
import { deadPort } from '../helpers/tcp-proxy.js';

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

function signerOf(name: string): Signer {
  const p = pkiPaths(pki.dir);
  const file = name === 'controller' ? p.signingJwk : p.controllerJwk(name);
  return new Signer(JSON.parse(fs.readFileSync(file, 'utf8')) as Ed25519PrivateJwk);
}

interface Srv {
  url: string;
  hits: number;
}

/**
 * A server presenting `controller/<as>`; answers `status` (a 5xx: no body), or a metadata 200
 * claiming `iss` controller/<iss> signed with `key`'s signing key.
 */
async function server(as: string, o: { status?: number; iss?: string; key?: string } = {}): Promise<Srv> {
  const srv: Srv = { url: '', hits: 0 };
  const signer = signerOf(o.key ?? as);
  const s = https.createServer(tlsServerOptions(pki.material('controller', as)), (req, res) => {
    srv.hits++;
    req.resume();
    req.on('end', () => answer(req, res));
  });
  const answer = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    if (o.status !== undefined) {
      res.writeHead(o.status, { 'content-type': 'application/json' });
      res.end('{"error":{"code":"shutting_down"}}');
      return;
    }
    const body = Buffer.from(JSON.stringify({ node: 'n1', generation: 4, deployments: [] }));
    const sig = signMetadata(signer, {
      iss: pki.spiffe('controller', o.iss ?? as),
      aud: pki.spiffe('agent', 'n1'),
      gen: 4,
      nonce: req.headers[NONCE_HEADER] as string,
      sha256: sha256b64url(body),
      nowS: Date.now() / 1000,
    });
    res.writeHead(200, { etag: '"4"', 'content-type': 'application/json', 'herald-signature': sig });
    res.end(body);
  };
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  closers.push(
    () =>
      new Promise<void>((r) => {
        s.closeAllConnections();
        s.close(() => r());
      }),
  );
  srv.url = `https://127.0.0.1:${(s.address() as { port: number }).port}`;
  return srv;
}

function fetcher(urls: string[], ids = 'controller,c2'): { f: Fetcher; lines: Array<Record<string, unknown>> } {
  const { log, lines } = memoryLog();
  const expected: ExpectedServer = { controllers: parseControllerIds(ids) };
  const f = new Fetcher({
    controllerUrl: urls.join(','),
    node: 'n1',
    material: agentMaterial,
    controllerSpiffeId: expected,
    lastAppliedGen: () => undefined,
    log,
  });
  closers.push(() => f.close());
  return { f, lines };
}

async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    return codeOf(err) ?? (err as { code?: string }).code ?? String(err);
  }
}

describe('which failures move the agent to the next controller URL', () => {
  it('a refused connection: the fetch is answered by the next URL, which stays current', async () => {
    const live = await server('c2');
    const dead = `https://127.0.0.1:${await deadPort()}`;
    const { f, lines } = fetcher([dead, live.url]);
    expect(await outcome(f.fetchMetadata())).toBe('ok');
    expect(await outcome(f.fetchMetadata())).toBe('ok');
    expect(live.hits).toBe(2);
    expect(f.endpoints.switches).toBe(1);
    expect(lines.filter((l) => l.switches !== undefined)).toMatchObject([{ reason: 'ECONNREFUSED', switches: 1 }]);
  });

  it('a 503 from the first controller', async () => {
    const down = await server('controller', { status: 503 });
    const live = await server('c2');
    const { f } = fetcher([down.url, live.url]);
    expect(await outcome(f.fetchMetadata())).toBe('ok');
    expect([down.hits, live.hits]).toEqual([1, 1]);
    expect(f.endpoints.current.origin).toBe(new URL(live.url).origin);
  });

  it('a server with an identity outside --controller-id (a TLS failure: wrong_peer), and signals too', async () => {
    const other = await server('c3');
    const live = await server('c2');
    const { f } = fetcher([other.url, live.url]);
    expect(await f.signal('/v1/nodes/n1/deployments/d/signal', { revision: 1 } as never, 'd')).toEqual({ status: 200 });
    expect(other.hits).toBe(0); // refused before a byte was sent
    expect(live.hits).toBe(1);
  });

  it('every URL failing: the last failure is the caller’s, as with one URL (the outbox retries it)', async () => {
    const a = `https://127.0.0.1:${await deadPort()}`;
    const b = `https://127.0.0.1:${await deadPort()}`;
    const { f } = fetcher([a, b]);
    expect(await outcome(f.fetchMetadata())).toBe('ECONNREFUSED');
    expect(f.endpoints.switches).toBe(1); // each URL tried once
  });

  it('one URL: a 503 is answered as before, no retry', async () => {
    const down = await server('controller', { status: 503 });
    const { f } = fetcher([down.url]);
    expect(await outcome(f.fetchMetadata())).toBe('bad_response');
    expect(down.hits).toBe(1);
  });

  it('a refused answer (a metadata signature) does not switch: that controller answered', async () => {
    const forged = await server('c2', { key: 'controller' }); // c2 signing with the first controller's key
    const live = await server('controller');
    const { f } = fetcher([forged.url, live.url]);
    expect(await outcome(f.fetchMetadata())).toBe('wrong_issuer');
    expect(live.hits).toBe(0);
    expect(f.endpoints.switches).toBe(0);
  });
});

describe('--controller-id at the fetcher, and whose key signs', () => {
  it("a list: c2's metadata signed with c2's key is accepted; c2 claiming to be controller is wrong_issuer", async () => {
    expect(await outcome(fetcher([(await server('c2')).url]).f.fetchMetadata())).toBe('ok');
    expect(
      await outcome(fetcher([(await server('c2', { iss: 'controller', key: 'controller' })).url]).f.fetchMetadata()),
    ).toBe('wrong_issuer');
  });

  it('a controller outside the list is wrong_peer; * accepts every controller of the trust domain', async () => {
    const c3 = await server('c3');
    expect(await outcome(fetcher([c3.url], 'controller,c2').f.fetchMetadata())).toBe('wrong_peer');
    expect(await outcome(fetcher([c3.url], '*').f.fetchMetadata())).toBe('ok');
    expect(await outcome(fetcher([(await server('controller')).url], '*').f.fetchMetadata())).toBe('ok');
  });
});

describe('ControllerEndpoints', () => {
  it('summarises a flood of switches: one line per interval, with the count', async () => {
    const { log, lines } = memoryLog();
    let now = 0;
    const e = new ControllerEndpoints({
      urls: parseControllerUrls('https://a:1,https://b:2'),
      log,
      now: () => now,
      logIntervalMs: 10_000,
    });
    const fail = (): Promise<never> => Promise.reject(Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }));
    for (let i = 0; i < 50; i++) await outcome(e.request(fail));
    expect(e.switches).toBe(50);
    expect(lines.filter((l) => l.switches !== undefined)).toHaveLength(1);
    now = 10_001;
    await outcome(e.request(fail));
    const logged = lines.filter((l) => l.switches !== undefined);
    expect(logged).toHaveLength(2);
    expect(logged[1]).toMatchObject({ switches: 50 }); // the 49 held back and this one
  });

  it.each(['http://a:1', 'https://a:1/path', 'https://u@a:1', 'https://a:1,', 'https://a:1,,https://b:2', 'a:1'])(
    'refuses --controller %j with bad_option naming it',
    (v) => {
      let err: unknown;
      try {
        parseControllerUrls(v);
      } catch (e) {
        err = e;
      }
      expect(codeOf(err)).toBe('bad_option');
      expect((err as Error).message).toContain('--controller');
    },
  );

  it('takes one URL or several', () => {
    expect(parseControllerUrls('https://a:1').map((u) => u.origin)).toEqual(['https://a:1']);
    expect(parseControllerUrls('https://a:1/, https://[::1]:2').map((u) => u.origin)).toEqual([
      'https://a:1',
      'https://[::1]:2',
    ]);
  });
});
