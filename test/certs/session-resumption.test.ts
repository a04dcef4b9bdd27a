/**
 * The agent's TLS session store (certs/session-store.ts, through HttpsAgentHolder with
 * `resumeSessions`) against a real TLS 1.3 server on 127.0.0.1 with a fixed ticket key: a
 * session is stored only from a server that passed the identity check in a full handshake, a
 * resumed socket still knows (and checks) whom it talks to, a revoked or expired server is
 * never resumed with, and the store is dropped on 'revoked-change' and 'tls-change'. A dialer
 * without the store never resumes.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import type http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { normalizeSerial } from '../../certs/identity.js';
import { TlsSessionStore } from '../../certs/session-store.js';
import {
  checkServerCertificate,
  checkServerSocket,
  connectResumingX509,
  HttpsAgentHolder,
  refusalCodeOf,
  serverIdentityOf,
  sessionIdContextOf,
  sessionPeerOf,
  tlsClientOptions,
  tlsServerOptions,
  type PkiMaterial,
} from '../../certs/tls.js';
import type { SessionPeer } from '../../certs/session-store.js';
import { Fetcher } from '../../agent/fetcher.js';
import { quietLog } from '../helpers/agent-pki.js';
import { makeTestPki, quietLogger, type TestPki } from '../helpers/pki.js';

const CONTROLLER = 'spiffe://herald.local/controller/controller';
let pki: TestPki;
let agentMaterial: PkiMaterial;
const closers: Array<() => unknown> = [];

beforeAll(async () => {
  pki = await makeTestPki({ agents: ['n1'] });
}, 60_000);
afterAll(() => pki?.cleanup());
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
  writeRevoked([]);
});

function writeRevoked(serials: string[]): void {
  fs.writeFileSync(pki.paths.revoked, JSON.stringify({ serials, kids: [] }));
}
function serialOf(cert: Buffer): string {
  return normalizeSerial(new crypto.X509Certificate(cert).serialNumber);
}

/** An agent material that changes only when the test calls reload(). */
function agentSide(): PkiMaterial {
  const m = pki.material('agent', 'n1', { watch: false, logger: quietLogger });
  closers.push(() => m.close());
  return m;
}

/** A server like the API: a fixed ticket key and session id context; answers whether it resumed. */
async function server(
  ticketKeys = crypto.randomBytes(48),
  handler: http.RequestListener = (req, res) => {
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ reused: (req.socket as tls.TLSSocket).isSessionReused() }));
  },
  port = 0,
): Promise<{ port: number; srv: https.Server }> {
  const material = pki.material('controller', 'controller', { watch: false, logger: quietLogger });
  const srv = https.createServer(
    {
      ...tlsServerOptions(material),
      ticketKeys,
      sessionIdContext: sessionIdContextOf(CONTROLLER),
      sessionTimeout: 600,
    },
    handler,
  );
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', () => r()));
  closers.push(
    () =>
      new Promise<void>((r) => {
        if (!srv.listening) return r();
        srv.closeAllConnections();
        srv.close(() => r());
        material.close();
      }),
  );
  return { port: (srv.address() as { port: number }).port, srv };
}

interface Answer {
  status: number;
  /** What the server saw. */
  serverReused: boolean;
  /** What the client socket says. */
  clientReused: boolean;
  peer: string | undefined;
  socket: tls.TLSSocket;
}

/** One request on a new connection (closed after the answer), or the refusal code. */
function get(port: number, agent: https.Agent): Promise<Answer | string> {
  return new Promise((resolve) => {
    https
      .get(
        { host: '127.0.0.1', port, path: '/', agent, headers: { connection: 'close' } },
        (res: http.IncomingMessage) => {
          const socket = res.socket as tls.TLSSocket;
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              serverReused: (JSON.parse(Buffer.concat(chunks).toString()) as { reused: boolean }).reused,
              clientReused: socket.isSessionReused(),
              peer: serverIdentityOf(socket, agentMaterial),
              socket,
            }),
          );
        },
      )
      .on('error', (err) => resolve(refusalCodeOf(err) ?? err.message));
  });
}
function answer(a: Answer | string): Answer {
  if (typeof a === 'string') throw new Error(`refused: ${a}`);
  return a;
}

/** A first request whose session is stored (tickets may trail the answer by a moment). */
async function primed(port: number, holder: HttpsAgentHolder): Promise<Answer> {
  const first = answer(await get(port, holder.agent));
  for (let i = 0; i < 100 && holder.sessions!.size === 0; i++) await new Promise((r) => setTimeout(r, 10));
  expect(holder.sessions!.size).toBe(1);
  return first;
}

describe('TLS session resumption through the agent session store', () => {
  it('resumes a second connection, and the resumed socket answers with the identity its full handshake checked', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());

    const first = await primed(port, holder);
    expect(first.serverReused).toBe(false);
    expect(first.clientReused).toBe(false);
    expect(first.peer).toBe(CONTROLLER);

    const second = answer(await get(port, holder.agent));
    expect(second.serverReused).toBe(true);
    expect(second.clientReused).toBe(true);
    // Node shows no certificate on a resumed client socket: the identity comes from the session
    expect(second.socket.getPeerCertificate().raw).toBeUndefined();
    expect(second.peer).toBe(CONTROLLER);
    const peer = sessionPeerOf(second.socket)!;
    expect(peer.spiffeId).toBe(CONTROLLER);
    expect(peer.serials).toEqual([serialOf(pki.cred('controller', 'controller').cert)]);
    expect(peer.notAfterMs).toBe(
      Date.parse(new crypto.X509Certificate(pki.cred('controller', 'controller').cert).validTo),
    );

    // a session inherited from a resumed one resumes too
    const third = answer(await get(port, holder.agent));
    expect(third.clientReused).toBe(true);
    expect(third.peer).toBe(CONTROLLER);
  });

  it('a holder without resumeSessions never resumes (the session cache of Node stays off)', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER);
    closers.push(() => holder.close());
    expect(holder.sessions).toBeUndefined();
    for (let i = 0; i < 3; i++) {
      const a = answer(await get(port, holder.agent));
      expect(a.serverReused).toBe(false);
      expect(a.peer).toBe(CONTROLLER);
    }
  });

  it('stores no session from a server that failed the identity check (wrong_peer)', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, 'spiffe://herald.local/controller/other', {
      resumeSessions: true,
    });
    closers.push(() => holder.close());
    expect(await get(port, holder.agent)).toBe('wrong_peer');
    await new Promise((r) => setTimeout(r, 50));
    expect(holder.sessions!.size).toBe(0);
    expect(await get(port, holder.agent)).toBe('wrong_peer');
  });

  it('after the server certificate is revoked, the agent does not resume and the full handshake is refused (revoked)', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    await primed(port, holder);
    writeRevoked([serialOf(pki.cred('controller', 'controller').cert)]);
    expect(agentMaterial.reload().revoked).toBe(true);
    expect(holder.sessions!.size).toBe(0);
    expect(await get(port, holder.agent)).toBe('revoked');
  });

  it('drops every session on revoked-change (any serial) and on tls-change', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    await primed(port, holder);
    writeRevoked(['00aa']);
    agentMaterial.reload();
    expect(holder.sessions!.size).toBe(0);
    expect(answer(await get(port, holder.agent)).serverReused).toBe(false);

    for (let i = 0; i < 100 && holder.sessions!.size === 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(holder.sessions!.size).toBe(1);
    agentMaterial.emit('tls-change', agentMaterial.current());
    expect(holder.sessions!.size).toBe(0);
    expect(answer(await get(port, holder.agent)).serverReused).toBe(false);
  });

  it('checkServerSocket answers for a resumed socket from its session: fine, then revoked once its serial is', async () => {
    agentMaterial = agentSide();
    const { port, srv } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    await primed(port, holder);
    // a kept-alive resumed connection, checked later (as after 'revoked-change')
    const socket = await new Promise<tls.TLSSocket>((resolve, reject) => {
      https
        .get({ host: '127.0.0.1', port, path: '/', agent: holder.agent }, (res) => {
          const s = res.socket as tls.TLSSocket;
          res.resume();
          res.on('end', () => resolve(s));
        })
        .on('error', reject);
    });
    expect(socket.isSessionReused()).toBe(true);
    expect(checkServerSocket(socket, agentMaterial, CONTROLLER)).toBeUndefined();
    expect(checkServerSocket(socket, agentMaterial, 'spiffe://herald.local/controller/other')?.code).toBe('wrong_peer');
    writeRevoked([serialOf(pki.cred('controller', 'controller').cert)]);
    agentMaterial.reload();
    expect(checkServerSocket(socket, agentMaterial, CONTROLLER)?.code).toBe('revoked');
    srv.closeAllConnections();
  });

  it('checks a full handshake from the chain as X509Certificate objects: no legacy certificate object is built', async () => {
    agentMaterial = agentSide();
    const { port } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    const legacy = vi.spyOn(tls.TLSSocket.prototype, 'getPeerCertificate');
    try {
      const first = await primed(port, holder);
      expect(first.clientReused).toBe(false);
      expect(first.peer).toBe(CONTROLLER);
      expect(legacy).not.toHaveBeenCalled();
      // the peer its check read is what the socket answers with later
      expect(sessionPeerOf(first.socket)?.serials).toEqual([serialOf(pki.cred('controller', 'controller').cert)]);
      expect(checkServerSocket(first.socket, agentMaterial, CONTROLLER)).toBeUndefined();
      expect(checkServerSocket(first.socket, agentMaterial, 'spiffe://herald.local/controller/other')?.code).toBe(
        'wrong_peer',
      );
    } finally {
      legacy.mockRestore();
    }
  });

  it('keeps its session through a server restart (connections refused meanwhile) and resumes after it', async () => {
    agentMaterial = agentSide();
    const keys = crypto.randomBytes(48);
    const { port, srv } = await server(keys);
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    await primed(port, holder);
    srv.closeAllConnections();
    await new Promise<void>((r) => srv.close(() => r()));
    for (let i = 0; i < 3; i++) expect(await get(port, holder.agent)).toMatch(/ECONNREFUSED/);
    expect(holder.sessions!.size).toBe(1);
    // the restarted server has the same ticket key (the controller keeps it in a file)
    await server(keys, undefined, port);
    const after = answer(await get(port, holder.agent));
    expect(after.serverReused).toBe(true);
    expect(after.peer).toBe(CONTROLLER);
  });

  it('drops the session offered when the handshake itself fails (the server reached, then gone)', async () => {
    agentMaterial = agentSide();
    const { port, srv } = await server();
    const holder = new HttpsAgentHolder(agentMaterial, CONTROLLER, { resumeSessions: true });
    closers.push(() => holder.close());
    await primed(port, holder);
    srv.closeAllConnections();
    await new Promise<void>((r) => srv.close(() => r()));
    // something on the port that accepts TCP and ends every connection before a TLS answer
    const rude = net.createServer((s) => s.destroy());
    await new Promise<void>((r) => rude.listen(port, '127.0.0.1', () => r()));
    closers.push(() => new Promise<void>((r) => rude.close(() => r())));
    let error: Error | undefined;
    await new Promise<void>((resolve) => {
      const req = https.get({ host: '127.0.0.1', port, path: '/', agent: holder.agent });
      req.on('error', (err) => {
        error = err;
      });
      req.on('socket', (s) => s.once('close', () => resolve()));
    });
    expect(error?.message).toMatch(/before secure TLS connection/);
    expect(holder.sessions!.size).toBe(0);
  });
});

describe('TlsSessionStore offers a session only while what its handshake checked still holds', () => {
  const peer = (o: Partial<{ serials: string[]; notAfterMs: number }> = {}) => ({
    spiffeId: CONTROLLER,
    role: 'controller' as const,
    name: 'controller',
    serials: o.serials ?? ['abc1', 'def2'],
    notAfterMs: o.notAfterMs ?? Date.now() + 3_600_000,
  });
  const ticket = Buffer.from('ticket');

  it('offers a stored session to the expected server', () => {
    const store = new TlsSessionStore(agentSide());
    store.save('h:1', peer(), ticket, store.epoch);
    expect(store.offer('h:1', CONTROLLER)?.session).toEqual(ticket);
    expect(store.offer('h:2', CONTROLLER)).toBeUndefined();
    expect(store.offer('h:1', 'spiffe://herald.local/controller/other')).toBeUndefined();
  });

  it('checks revocation of the leaf or the issuer at the moment of offering, without any event', () => {
    const m = agentSide();
    m.removeAllListeners('revoked-change');
    for (const revoked of ['abc1', 'def2']) {
      const store = new TlsSessionStore(m);
      store.save('h:1', peer(), ticket, store.epoch);
      writeRevoked([revoked]);
      m.reload();
      expect(store.offer('h:1', CONTROLLER)).toBeUndefined();
      expect(store.size).toBe(0);
      writeRevoked([]);
      m.reload();
    }
  });

  it("does not offer a session whose certificate is under its identity's floor (a revoked node), nor one kept without its notBefore", () => {
    const floors = new Map<string, number>();
    const store = new TlsSessionStore({
      current: () => ({ revokedSerials: new Set<string>(), identityFloors: floors }),
    });
    const issued = Date.now() - 60_000;
    store.save('h:1', { ...peer(), notBeforeMs: issued }, ticket, store.epoch);
    store.save('h:2', peer(), ticket, store.epoch);
    // no floor: both offered, the one kept without its notBefore too
    expect(store.offer('h:1', CONTROLLER)?.session).toEqual(ticket);
    expect(store.offer('h:2', CONTROLLER)?.session).toEqual(ticket);
    // a floor at the certificate's notBefore: it was issued at the floor, and stays
    floors.set('controller/controller', issued);
    expect(store.offer('h:1', CONTROLLER)?.session).toEqual(ticket);
    // the one without a notBefore counts as older than any floor
    expect(store.offer('h:2', CONTROLLER)).toBeUndefined();
    // a floor above it (the identity revoked since): dropped, at the moment of offering
    floors.set('controller/controller', issued + 1_000);
    expect(store.offer('h:1', CONTROLLER)).toBeUndefined();
    expect(store.size).toBe(0);
  });

  it('does not offer past the certificate notAfter or the ticket lifetime', () => {
    let now = Date.now();
    const store = new TlsSessionStore(agentSide(), { now: () => now, maxAgeMs: 10_000 });
    store.save('h:1', peer({ notAfterMs: now + 5_000 }), ticket, store.epoch);
    now += 5_000;
    expect(store.offer('h:1', CONTROLLER)).toBeUndefined();
    store.save('h:1', peer({ notAfterMs: now + 60_000 }), ticket, store.epoch);
    now += 10_000;
    expect(store.offer('h:1', CONTROLLER)).toBeUndefined();
  });

  it('ignores a ticket that arrives after clear() on a connection opened before it', () => {
    const store = new TlsSessionStore(agentSide());
    const epoch = store.epoch;
    store.clear();
    store.save('h:1', peer(), ticket, epoch);
    expect(store.size).toBe(0);
  });
});

describe('a refusal on a resumed session', () => {
  it('is asked again once on a full handshake by the agent fetcher, and that session is forgotten', async () => {
    // a server that refuses what a resumed session shows it (as a restarted controller refuses an
    // agent under a Herald issuer it no longer remembers: the session carries the leaf alone)
    const seen: boolean[] = [];
    const { port, srv } = await server(undefined, (req, res) => {
      const reused = (req.socket as tls.TLSSocket).isSessionReused();
      seen.push(reused);
      res.setHeader('content-type', 'application/json');
      if (reused) {
        res.statusCode = 403;
        res.end(JSON.stringify({ error: { code: 'untrusted_certificate', message: 'issuer not known' } }));
      } else res.end('{}');
    });
    const f = new Fetcher({
      controllerUrl: `https://127.0.0.1:${port}`,
      node: 'n1',
      material: agentSide(),
      controllerSpiffeId: CONTROLLER,
      lastAppliedGen: () => undefined,
      log: quietLog(),
    });
    closers.push(() => f.close());
    const renew = { csr: 'x' } as unknown as Parameters<Fetcher['renewCertificate']>[0];
    expect((await f.renewCertificate(renew)).status).toBe(200);
    srv.closeIdleConnections();
    await new Promise((r) => setTimeout(r, 50)); // the client sees the close in a later turn
    // the next connection resumes, is refused, and the same request goes again on a full handshake
    expect((await f.renewCertificate(renew)).status).toBe(200);
    expect(seen).toEqual([false, true, false]);
    // the refused session is not offered again: the session of that full handshake is
    srv.closeIdleConnections();
    await new Promise((r) => setTimeout(r, 50));
    expect((await f.renewCertificate(renew)).status).toBe(200);
    expect(seen).toEqual([false, true, false, true, false]);
  });
});

describe("connectResumingX509 (the push dialer's connections)", () => {
  it("a resumed connection inherits the offered session's peer without its bytes (the session file keeps those)", async () => {
    const { port } = await server();
    const material = pki.material('controller', 'controller', { watch: false, logger: quietLogger });
    closers.push(() => material.close());
    const store = new TlsSessionStore(material);
    const dial = (): Promise<{ peer: SessionPeer; reused: boolean; socket: tls.TLSSocket }> =>
      new Promise((resolve, reject) => {
        let peer: SessionPeer | undefined;
        const { checkServerIdentity: _legacy, ...base } = tlsClientOptions(material, CONTROLLER);
        const socket = connectResumingX509(
          { ...base, host: '127.0.0.1', port, servername: '' },
          store,
          'h:1',
          CONTROLLER,
          material,
          (cert) =>
            cert === undefined ? new Error('no certificate') : checkServerCertificate(material, CONTROLLER, cert),
          (p) => {
            peer = p;
          },
        );
        closers.push(() => socket.destroy());
        socket.once('error', reject);
        socket.once('secureConnect', () => resolve({ peer: peer!, reused: socket.isSessionReused(), socket }));
      });
    const first = await dial();
    expect(first.reused).toBe(false);
    // a TLS 1.3 ticket comes after the handshake: the first connection stays open until it is kept
    await new Promise<void>((r) => {
      if (store.size > 0) r();
      else first.socket.on('session', () => setImmediate(r));
    });
    first.socket.end();
    const second = await dial();
    expect(second.reused).toBe(true);
    expect(second.peer.spiffeId).toBe(CONTROLLER);
    expect(second.peer.serials).toEqual(first.peer.serials);
    // what the socket's listeners keep for the connection's life holds no session bytes
    expect('session' in second.peer).toBe(false);
  });
});
