/**
 * A TLS client session kept without the server's certificate (certs/session-der.ts), from a real
 * TLS 1.3 handshake with certificates made by certs/: the certificate is gone, the session still
 * resumes (both ends say so) and the client still counts the server authorized; bytes that are
 * not a session come back as they were; the session store keeps and offers sessions so.
 */
import crypto from 'node:crypto';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { withoutPeerCertificate } from '../../certs/session-der.js';
import { TlsSessionStore, type SessionPeer, type SessionPersistence } from '../../certs/session-store.js';
import { makeTestPki, type TestPki } from '../helpers/pki.js';

let pki: TestPki;
let server: tls.Server;
let port: number;
let serverDer: Buffer;

beforeAll(async () => {
  pki = await makeTestPki({ agents: ['n1'] });
  const cred = pki.cred('agent', 'n1');
  serverDer = new crypto.X509Certificate(cred.cert).raw;
  server = tls.createServer(
    { ...cred, minVersion: 'TLSv1.3', ticketKeys: crypto.randomBytes(48), sessionTimeout: 600 },
    (s) => s.end(s.isSessionReused() ? 'resumed' : 'full'),
  );
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  port = (server.address() as { port: number }).port;
}, 60_000);
afterAll(async () => {
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
  pki?.cleanup();
});

/** One connection offering `session`: what the server answered, what the client saw, and the session it got. */
function connect(session?: Buffer): Promise<{ said: string; reused: boolean; authorized: boolean; session: Buffer }> {
  const cred = pki.cred('controller', 'controller');
  return new Promise((resolve, reject) => {
    let got: Buffer | undefined;
    let said = '';
    const s = tls.connect({
      host: '127.0.0.1',
      port,
      ...cred,
      servername: '',
      checkServerIdentity: () => undefined,
      minVersion: 'TLSv1.3',
      ...(session ? { session } : {}),
    });
    s.on('session', (t: Buffer) => {
      got ??= t;
    });
    s.on('data', (d: Buffer) => {
      said += d.toString();
    });
    s.on('error', reject);
    s.on('end', () =>
      resolve({ said, reused: s.isSessionReused(), authorized: s.authorized, session: got ?? Buffer.alloc(0) }),
    );
  });
}

describe('withoutPeerCertificate', () => {
  it("removes the server's certificate from a real session, which still resumes, authorized", async () => {
    const first = await connect();
    expect(first.said).toBe('full');
    expect(first.session.includes(serverDer)).toBe(true);

    const bare = withoutPeerCertificate(first.session);
    expect(bare.includes(serverDer)).toBe(false);
    // exactly the [3] element is gone: every other element is there, byte for byte, in order
    const before = topLevel(first.session);
    expect(before.filter((e) => e[0] === 0xa3)).toHaveLength(1);
    expect(topLevel(bare)).toEqual(before.filter((e) => e[0] !== 0xa3));
    expect(bare.length).toBeLessThan(first.session.length - serverDer.length);
    // idempotent: nothing more to take
    expect(withoutPeerCertificate(bare).equals(bare)).toBe(true);

    const again = await connect(bare);
    expect(again.said).toBe('resumed');
    expect(again.reused).toBe(true);
    expect(again.authorized).toBe(true);
  });

  it('gives back bytes that are not one well-formed session as they were', () => {
    const cases = [
      Buffer.alloc(0),
      Buffer.from('not a session'),
      // a SEQUENCE whose length runs past the end
      Buffer.from([0x30, 0x05, 0x02, 0x01, 0x01]),
      // an element whose length runs past the end of the SEQUENCE
      Buffer.from([0x30, 0x04, 0xa3, 0x05, 0x02, 0x01]),
      // indefinite length (BER, not DER)
      Buffer.from([0x30, 0x80, 0xa3, 0x00, 0x00, 0x00]),
      // a high tag number
      Buffer.from([0x30, 0x04, 0xbf, 0x03, 0x01, 0x00]),
      // bytes after the SEQUENCE
      Buffer.from([0x30, 0x02, 0xa3, 0x00, 0xff]),
    ];
    for (const b of cases) expect(withoutPeerCertificate(b)).toBe(b);
    // a well-formed SEQUENCE with no [3] element is the same object too
    const none = Buffer.from([0x30, 0x06, 0x02, 0x01, 0x01, 0x04, 0x01, 0x00]);
    expect(withoutPeerCertificate(none)).toBe(none);
    // and a TLS 1.3 one with it, long-form lengths around it, loses exactly that element
    const cert = Buffer.concat([Buffer.from([0xa3, 0x81, 0x80]), Buffer.alloc(128, 7)]);
    const session = (version: number[]): Buffer => {
      const body = Buffer.concat([
        Buffer.from([0x02, 0x01, 0x01, 0x02, 0x02, ...version]),
        cert,
        Buffer.from([0x04, 0x01, 0x09]),
      ]);
      return Buffer.concat([Buffer.from([0x30, 0x81, body.length]), body]);
    };
    expect([...withoutPeerCertificate(session([0x03, 0x04]))]).toEqual([
      0x30, 0x0a, 0x02, 0x01, 0x01, 0x02, 0x02, 0x03, 0x04, 0x04, 0x01, 0x09,
    ]);
    // a TLS 1.2 session keeps it: Node would count it unauthorized when resumed without it
    const tls12 = session([0x03, 0x03]);
    expect(withoutPeerCertificate(tls12)).toBe(tls12);
  });
});

describe('TlsSessionStore', () => {
  const peer = (): SessionPeer => ({
    spiffeId: `spiffe://${pki.trustDomain}/agent/n1`,
    role: 'agent',
    name: 'n1',
    serials: ['01'],
    notAfterMs: Date.now() + 3_600_000,
  });
  const noRevocations = { current: () => ({ revokedSerials: new Set<string>() }) };

  it("keeps and offers a session without the server's certificate", async () => {
    const { session } = await connect();
    const store = new TlsSessionStore(noRevocations);
    store.save('n1', peer(), session, store.epoch);
    const offered = store.offer('n1', peer().spiffeId);
    expect(offered).toBeDefined();
    expect(offered!.session.includes(serverDer)).toBe(false);
    expect((await connect(offered!.session)).reused).toBe(true);
  });

  it('hands its persistence the session without the certificate, and strips one read back from an older file', async () => {
    const { session } = await connect();
    expect(session.includes(serverDer)).toBe(true);
    const handed: Buffer[] = [];
    // a persistence that keeps the bytes, and gives back what an older file held: the whole session
    const persistence: SessionPersistence = {
      saved: (_key, e) => {
        handed.push(e.session);
        return true;
      },
      deleted: () => undefined,
      cleared: () => undefined,
      load: () => session,
    };
    const store = new TlsSessionStore(noRevocations);
    store.persistTo(persistence);
    store.save('n1', peer(), session, store.epoch);
    expect(handed).toHaveLength(1);
    expect(handed[0]!.includes(serverDer)).toBe(false);
    const offered = store.offer('n1', peer().spiffeId);
    expect(offered!.session.includes(serverDer)).toBe(false);
    expect((await connect(offered!.session)).reused).toBe(true);
  });
});

/** The top-level elements of a DER SEQUENCE, each as its bytes (tag, length and contents). */
function topLevel(der: Buffer): number[][] {
  const len = (at: number): [number, number] => {
    const first = der[at]!;
    if (first < 0x80) return [first, at + 1];
    let n = 0;
    for (let i = 1; i <= (first & 0x7f); i++) n = n * 256 + der[at + i]!;
    return [n, at + 1 + (first & 0x7f)];
  };
  const out: number[][] = [];
  const [, start] = len(1);
  for (let at = start; at < der.length; ) {
    const [n, body] = len(at + 1);
    out.push([...der.subarray(at, body + n)]);
    at = body + n;
  }
  return out;
}
