/**
 * A policy change holds from the next request on, without a restart and without waiting for a
 * connection to close (docs/access.md): an operator's kept-alive HTTPS connection, opened before a
 * grant is made or revoked, sees the change on its very next request, on that same connection.
 * On SQLite, one controller; on PostgreSQL, two controller processes, the grant changed through
 * one and seen through the other, whose event stream of that operator ends once the grant is
 * gone (its refresh, ACCESS_STREAM_REFRESH_MS).
 */
import https from 'node:https';
import type tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openPki } from '../../cli/testbed/pki.js';
import { ACCESS_STREAM_REFRESH_MS } from '../../protocol/limits.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { request, startTestController, type TestController } from '../helpers/controller-harness.js';
import { readEvents } from '../helpers/event-stream.js';
import { makeFleet, type TestFleet } from '../helpers/fleet.js';
import { isBuilt } from '../helpers/procs.js';

interface Answer {
  status: number;
  code: string | undefined;
  socket: tls.TLSSocket;
}

/** One operator's kept-alive connection (one socket at most): each request goes over it while it lives. */
function kept(
  port: number,
  cred: Cred,
): { send(method: string, path: string, body?: unknown): Promise<Answer>; close(): void } {
  const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ...cred });
  return {
    close: () => agent.destroy(),
    send: (method, path, body) =>
      new Promise((resolve, reject) => {
        const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
        const req = https.request(
          {
            host: '127.0.0.1',
            port,
            method,
            path,
            servername: 'localhost',
            agent,
            headers: data ? { 'content-type': 'application/json', 'content-length': String(data.length) } : {},
          },
          (res) => {
            // (taken now: once the answer is read the agent detaches the socket from it)
            const socket = res.socket as tls.TLSSocket;
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => chunks.push(c));
            res.on('end', () => {
              let code: string | undefined;
              try {
                code = JSON.parse(Buffer.concat(chunks).toString('utf8'))?.error?.code;
              } catch {
                code = undefined;
              }
              resolve({ status: res.statusCode ?? 0, code, socket });
            });
          },
        );
        req.on('error', reject);
        if (data) req.write(data);
        req.end();
      }),
  };
}

describe('a policy change on a live kept-alive connection, on SQLite', () => {
  let pki: ControllerTestPki;
  let t: TestController;
  let alice: Cred;

  beforeAll(async () => {
    pki = await makeControllerTestPki();
    alice = await pki.issueOperator('alice');
    t = await startTestController(pki);
  }, 60_000);

  afterAll(async () => {
    await t?.close();
    pki?.cleanup();
  });

  it('is seen on the next request of a connection opened before it: granted, widened, revoked', async () => {
    const admin = pki.cred('operator', 'admin');
    const c = kept(t.port, alice);
    try {
      const before = await c.send('GET', '/v1/nodes');
      expect([before.status, before.code]).toEqual([403, 'forbidden']);
      const socket = before.socket;
      expect(socket.remotePort).toBe(t.port);
      const grant = await request(t.port, admin, 'POST', '/v1/access/grants', { subject: 'alice', role: 'viewer' });
      expect(grant.status).toBe(201);
      const read = await c.send('GET', '/v1/nodes');
      expect(read.status).toBe(200);
      expect(read.socket).toBe(socket); // the same connection: nothing was closed or opened again
      const denied = await c.send('POST', '/v1/configs', { name: 'x', group: 'script', config: 'true' });
      expect([denied.status, denied.code]).toEqual([403, 'forbidden']);
      const author = await request(t.port, admin, 'POST', '/v1/access/grants', { subject: 'alice', role: 'author' });
      expect(author.status).toBe(201);
      const made = await c.send('POST', '/v1/configs', { name: 'x', group: 'script', config: 'true' });
      expect(made.status).toBe(201);
      expect(made.socket).toBe(socket);
      for (const id of [grant.json.id, author.json.id])
        expect((await request(t.port, admin, 'DELETE', `/v1/access/grants/${id}`)).status).toBe(200);
      const after = await c.send('GET', '/v1/nodes');
      expect([after.status, after.code]).toEqual([403, 'forbidden']);
      expect(after.socket).toBe(socket);
      expect(socket.destroyed).toBe(false);
    } finally {
      c.close();
    }
  });
});

describe('a policy change on a live kept-alive connection, on PostgreSQL with two controllers', () => {
  let f: TestFleet;
  let alice: Cred;

  beforeAll(async () => {
    if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
    f = await makeFleet(['c1', 'c2'], []);
    await openPki(f.pki).issue('operator', 'alice');
    alice = openPki(f.pki).cred('operator', 'alice');
    await f.startController('c1');
    await f.startController('c2');
  }, 120_000);

  afterAll(async () => {
    await f?.cleanup();
  });

  it("a grant made and revoked through one controller is seen on the other's live connection at its next request", async () => {
    const [c1, c2] = ['c1', 'c2'].map((n) => f.controllers.get(n)!.port) as [number, number];
    const c = kept(c2, alice);
    try {
      const before = await c.send('GET', '/v1/clusters');
      expect([before.status, before.code]).toEqual([403, 'forbidden']);
      expect(before.socket.remotePort).toBe(c2);
      const grant = await request(c1, f.op, 'POST', '/v1/access/grants', {
        subject: 'alice',
        role: 'deployer',
        scope: ['node:web-*'],
      });
      expect(grant.status).toBe(201);
      const now = await c.send('GET', '/v1/clusters');
      expect(now.status).toBe(200);
      expect(now.socket).toBe(before.socket);
      const outside = await c.send('POST', '/v1/deployments', { node: 'db-1', config_id: 'x' });
      expect([outside.status, outside.code]).toEqual([403, 'out_of_scope']);
      // the event stream on c2 ends once the grant is revoked through c1 (at its next refresh)
      const stream = readEvents(c2, alice as never);
      await stream.opened;
      expect((await request(c1, f.op, 'DELETE', `/v1/access/grants/${grant.json.id}`)).status).toBe(200);
      const after = await c.send('GET', '/v1/clusters');
      expect([after.status, after.code]).toEqual([403, 'forbidden']);
      expect(after.socket).toBe(before.socket);
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        stream.ended.then(() => true),
        new Promise<boolean>((r) => {
          timer = setTimeout(() => r(false), 3 * ACCESS_STREAM_REFRESH_MS);
        }),
      ]);
      clearTimeout(timer);
      stream.close();
      expect(ended).toBe(true);
    } finally {
      c.close();
    }
  }, 60_000);
});
