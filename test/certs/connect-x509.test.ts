/**
 * connectCheckingX509 (certs/tls.ts): a dial whose server check reads the presented chain as
 * X509Certificate objects, over real TLS 1.3 on 127.0.0.1, and never has Node build the legacy
 * certificate objects of the handshake.
 */
import type crypto from 'node:crypto';
import { once } from 'node:events';
import https from 'node:https';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { connectCheckingX509, tlsServerOptions } from '../../certs/tls.js';
import { RefusalError } from '../../protocol/errors.js';
import { makeAgentTestPki, type AgentTestPki } from '../helpers/agent-pki.js';
import { hasFastProperties } from '../helpers/v8-shape.js';

let pki: AgentTestPki;
let server: tls.Server;
let port: number;
const open: tls.TLSSocket[] = [];

beforeAll(async () => {
  pki = await makeAgentTestPki();
  server = tls.createServer(tlsServerOptions(pki.material('agent', 'n1')), (s) => {
    s.on('error', () => undefined);
    open.push(s);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  port = (server.address() as { port: number }).port;
});
afterAll(async () => {
  await new Promise<void>((r) => {
    server.close(() => r());
    for (const s of open) s.destroy();
  });
  pki?.cleanup();
});
afterEach(() => vi.restoreAllMocks());

function dial(check: (cert: crypto.X509Certificate | undefined) => Error | undefined): tls.TLSSocket {
  const c = pki.cred('controller', 'controller');
  const s = connectCheckingX509(
    { host: '127.0.0.1', port, ca: c.ca, cert: c.cert, key: c.key, minVersion: 'TLSv1.3', servername: '' },
    check,
  );
  s.on('error', () => undefined);
  return s;
}

describe('connectCheckingX509', () => {
  it('hands the check the leaf with its chain as X509Certificate objects, and builds no legacy certificate object', async () => {
    const legacy = vi.spyOn(tls.TLSSocket.prototype, 'getPeerCertificate');
    const seen: Array<crypto.X509Certificate | undefined> = [];
    const s = dial((cert) => {
      seen.push(cert);
      return undefined;
    });
    await once(s, 'secureConnect');
    expect(legacy).not.toHaveBeenCalled();
    expect(seen).toHaveLength(1);
    expect(seen[0]?.subjectAltName).toContain(pki.spiffe('agent', 'n1'));
    expect(seen[0]?.issuerCertificate?.subject).toBeTruthy();
    expect(s.authorized).toBe(true);
    // the socket's own method answers once connected
    s.getPeerCertificate(true);
    expect(legacy).toHaveBeenCalledTimes(1);
    s.destroy();
  });

  it("leaves the socket's properties in fast mode under an HTTP request, as ws's upgrade uses it (a deleted property would cost each push connection ~3 KB)", async () => {
    let s: tls.TLSSocket | undefined;
    // the request adds its own properties to the socket (parser, _httpMessage) before the handshake ends
    const req = https.request({
      host: '127.0.0.1',
      port,
      createConnection: () => {
        s = dial(() => undefined);
        return s;
      },
    });
    req.on('error', () => undefined);
    req.end();
    await new Promise<void>((r) => setImmediate(r));
    await once(s!, 'secureConnect');
    expect(hasFastProperties(s!)).toBe(true);
    req.destroy();
  });

  it("a refusal of the check ends the dial with the check's error", async () => {
    const s = dial(() => new RefusalError('wrong_peer', 'not the node asked for'));
    const [err] = (await once(s, 'error').catch((e: unknown) => [e])) as [RefusalError];
    expect(err.code).toBe('wrong_peer');
    expect(s.destroyed).toBe(true);
  });
});
