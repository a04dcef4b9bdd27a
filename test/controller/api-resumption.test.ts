/**
 * TLS session resumption between the agent's fetcher and the real controller API,
 * started as `herald controller` starts it (controller/main.ts, real TLS on 127.0.0.1, its own
 * SQLite file, the PKI's `controller/<name>.tls-ticket-key`):
 * - a second connection resumes, and the signed answer is accepted from the right identity;
 * - a controller restarted with the same ticket key file resumes the agent's next connection;
 *   with a new key it falls back to a full handshake and still works, and so it does when the
 *   running controller rotates its key;
 * - a controller certificate revoked after the session was stored: no resumption, and the
 *   full handshake is refused `revoked`;
 * - an agent certificate revoked after its session was made: the resumed session is 403
 *   `revoked` at the API;
 * - an operator resumes too, authorized like a full handshake (Node's HTTPS clients resume by default).
 * Whether a connection resumed is read on the server's side (`isSessionReused()` of the API's
 * sockets), so nothing here depends on timing.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import type tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Fetcher } from '../../agent/fetcher.js';
import { normalizeSerial } from '../../certs/identity.js';
import { materialPaths, pkiPaths } from '../../certs/paths.js';
import { issueCert } from '../../certs/pki.js';
import { HttpsAgentHolder, PkiMaterial, refusalCodeOf } from '../../certs/tls.js';
import { TLS_TICKET_KEY_BYTES } from '../../protocol/limits.js';
import { quietLog } from '../helpers/agent-pki.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, TD, type ControllerTestPki } from '../helpers/controller-pki.js';

let pki: ControllerTestPki;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-resume-'));
const closers: Array<() => unknown> = [];
const quiet = { info: () => {}, warn: () => {}, error: () => {} };

beforeAll(async () => {
  pki = await makeControllerTestPki();
  for (const name of ['c5', 'c6', 'c7'])
    await issueCert({ dir: pki.dir, role: 'controller', name, ip: ['127.0.0.1'], dns: ['localhost'] });
  for (const node of ['r1', 'r2', 'r3', 'r4']) await pki.issueAgent(node);
}, 120_000);
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});
afterAll(() => {
  pki?.cleanup();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const op = (): ReturnType<ControllerTestPki['cred']> => pki.cred('operator', 'admin');

interface Running {
  t: TestController;
  /** `isSessionReused()` of each connection the API accepted, in order. */
  reused: boolean[];
}

async function controller(name: string, db: string, port = 0): Promise<Running> {
  const t = await startTestController(pki, { name, db, listen: { host: '127.0.0.1', port } });
  const reused: boolean[] = [];
  t.ctl.api.server.on('secureConnection', (s: tls.TLSSocket) => reused.push(s.isSessionReused()));
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    await t.close();
  };
  closers.push(close);
  return { t: { ...t, close }, reused };
}

/** The agent's material, changed only by reload() (its revoked.json is the PKI's). */
function agentMaterial(node: string): PkiMaterial {
  const m = new PkiMaterial({ ...materialPaths(pki.dir, 'agent', node), trustDomain: TD, watch: false, logger: quiet });
  closers.push(() => m.close());
  return m;
}

function fetcher(node: string, material: PkiMaterial, controllerName: string, port: number): Fetcher {
  const f = new Fetcher({
    controllerUrl: `https://127.0.0.1:${port}`,
    node,
    material,
    controllerSpiffeId: pki.spiffe('controller', controllerName),
    lastAppliedGen: () => undefined,
    log: quietLog(),
  });
  closers.push(() => f.close());
  return f;
}

/**
 * Ends the API's idle connections, so the agent's next request opens a new one; with `agent`,
 * also waits until that https.Agent has seen its kept-alive sockets close.
 */
async function dropConnections(r: Running, agent?: https.Agent): Promise<void> {
  r.t.ctl.api.server.closeIdleConnections();
  await waitFor(
    'the API connections to close',
    () => new Promise<boolean>((resolve) => r.t.ctl.api.server.getConnections((_e, n) => resolve(n === 0))),
  );
  if (agent) await waitFor('the agent to see them close', () => Object.keys(agent.freeSockets).length === 0);
  // the client side sees the close in its next turn of the event loop
  await new Promise((r) => setTimeout(r, 20));
}

async function addNode(r: Running, node: string): Promise<void> {
  const res = await r.t.req(op(), 'POST', '/v1/nodes', { id: node });
  expect(res.status, res.text).toBe(201);
  // the operator's connection is not the agent's
  r.reused.length = 0;
}

function revoke(cert: Buffer): void {
  const file = pkiPaths(pki.dir).revoked;
  const list = JSON.parse(fs.readFileSync(file, 'utf8')) as { serials: string[]; kids: string[] };
  list.serials.push(normalizeSerial(new crypto.X509Certificate(cert).serialNumber));
  const next = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(next, JSON.stringify(list));
  fs.renameSync(next, file);
}

interface Answer {
  status: number;
  code: string | undefined;
}

/** One GET through `agent`: the status and the error code of the body, if any. */
function getVia(agent: https.Agent, port: number, p: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    https
      .get({ host: '127.0.0.1', port, path: p, agent }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          let code: string | undefined;
          try {
            code = (JSON.parse(Buffer.concat(chunks).toString()) as { error?: { code?: string } }).error?.code;
          } catch {
            code = undefined;
          }
          resolve({ status: res.statusCode ?? 0, code });
        });
      })
      .on('error', reject);
  });
}

describe('the agent resumes its TLS session with the controller API', () => {
  it('resumes a second connection to the same controller, and accepts the answer from the right identity', async () => {
    const db = path.join(tmp, 'one.db');
    const r = await controller('controller', db);
    await addNode(r, 'r1');
    const f = fetcher('r1', agentMaterial('r1'), 'controller', r.t.port);

    expect((await f.fetchMetadata()).status).toBe(200);
    expect(r.reused).toEqual([false]);
    await dropConnections(r);
    f.forgetEtag();
    // verified against the identity of the server that answered (iss): on a resumed socket
    // that identity is the session's; without it this fetch would be refused wrong_issuer
    const again = await f.fetchMetadata();
    expect(again.status).toBe(200);
    expect(r.reused).toEqual([false, true]);
  });

  it('resumes after a restart with the same ticket key file; with a new key it makes a full handshake and works', async () => {
    const db = path.join(tmp, 'restart.db');
    const first = await controller('c5', db);
    const port = first.t.port;
    await addNode(first, 'r2');
    const f = fetcher('r2', agentMaterial('r2'), 'c5', port);
    expect((await f.fetchMetadata()).status).toBe(200);
    expect(first.reused).toEqual([false]);
    const keyFile = pkiPaths(pki.dir).ticketKey('c5');
    expect(fs.statSync(keyFile).mode & 0o777).toBe(0o600);
    const key = fs.readFileSync(keyFile);
    await first.t.close();

    const second = await controller('c5', db, port);
    expect(fs.readFileSync(keyFile).equals(key)).toBe(true);
    f.forgetEtag();
    expect((await f.fetchMetadata()).status).toBe(200);
    expect(second.reused).toEqual([true]);
    await second.t.close();

    // a rotated key (as after TLS_TICKET_KEY_ROTATE_MS): the agent's ticket no longer decrypts
    fs.writeFileSync(keyFile, crypto.randomBytes(TLS_TICKET_KEY_BYTES), { mode: 0o600 });
    const third = await controller('c5', db, port);
    f.forgetEtag();
    expect((await f.fetchMetadata()).status).toBe(200);
    expect(third.reused).toEqual([false]);
    // and the session of that full handshake resumes in turn
    await dropConnections(third);
    f.forgetEtag();
    expect((await f.fetchMetadata()).status).toBe(200);
    expect(third.reused).toEqual([false, true]);
  });

  it('a rotated ticket key is taken by the running API: one full handshake, then resumption again', async () => {
    const db = path.join(tmp, 'rotate.db');
    const r = await controller('controller', db);
    await addNode(r, 'r1');
    const f = fetcher('r1', agentMaterial('r1'), 'controller', r.t.port);
    const fetchAgain = async (): Promise<void> => {
      await dropConnections(r);
      f.forgetEtag();
      expect((await f.fetchMetadata()).status).toBe(200);
    };
    expect((await f.fetchMetadata()).status).toBe(200);
    await fetchAgain();
    expect(r.reused).toEqual([false, true]);

    const before = r.t.ctl.api.server.getTicketKeys();
    r.t.ctl.ticketKey.rotate();
    const after = r.t.ctl.api.server.getTicketKeys();
    expect(after.equals(before)).toBe(false);
    expect(after.equals(fs.readFileSync(pkiPaths(pki.dir).ticketKey('controller')))).toBe(true);
    await fetchAgain();
    await fetchAgain();
    expect(r.reused).toEqual([false, true, false, true]);
  });

  it('a controller certificate revoked after the session was stored: no resumption, and the full handshake is refused (revoked)', async () => {
    const db = path.join(tmp, 'revoked-controller.db');
    const r = await controller('c6', db);
    await addNode(r, 'r3');
    const m = agentMaterial('r3');
    const f = fetcher('r3', m, 'c6', r.t.port);
    expect((await f.fetchMetadata()).status).toBe(200);
    await dropConnections(r);

    revoke(pki.cred('controller', 'c6').cert!);
    expect(m.reload().revoked).toBe(true);
    const err = await f.fetchMetadata().then(
      () => undefined,
      (e: unknown) => e,
    );
    // from a full handshake (a resumed one skips the server check and would have been served;
    // the refused handshake never completes on the server's side, so it is not counted)
    expect(refusalCodeOf(err)).toBe('revoked');
    expect(r.reused).toEqual([false]);
  });

  it('an agent certificate revoked after its session was made is refused on the resumed session (403 revoked)', async () => {
    const db = path.join(tmp, 'revoked-agent.db');
    const r = await controller('c7', db);
    await addNode(r, 'r4');
    const m = agentMaterial('r4');
    // the fetcher's own https agent, so the refusal's body can be read
    const holder = new HttpsAgentHolder(m, pki.spiffe('controller', 'c7'), { resumeSessions: true });
    closers.push(() => holder.close());
    const get = (): Promise<Answer> => getVia(holder.agent, r.t.port, '/v1/nodes/r4/metadata');
    expect((await get()).status).toBe(200);
    await waitFor('the session ticket', () => holder.sessions!.size === 1);
    await dropConnections(r, holder.agent);

    // the controller sees the revocation (it watches revoked.json); the agent does not reload
    revoke(pki.cred('agent', 'r4').cert!);
    await waitFor('the controller to refuse r4', async () => {
      const direct = await r.t.req(pki.cred('agent', 'r4'), 'GET', '/v1/nodes/r4/metadata');
      return direct.status === 403 && direct.json?.error?.code === 'revoked';
    });
    const before = r.reused.length;
    const refused = await get();
    expect(refused).toEqual({ status: 403, code: 'revoked' });
    expect(r.reused.slice(before)).toEqual([true]);
  });

  it('an operator certificate may resume too, and its resumed session is authorized like a full one', async () => {
    const db = path.join(tmp, 'operator.db');
    const r = await controller('controller', db);
    const m = new PkiMaterial({
      ...materialPaths(pki.dir, 'operator', 'admin'),
      trustDomain: TD,
      watch: false,
      logger: quiet,
    });
    closers.push(() => m.close());
    const resuming = new HttpsAgentHolder(m, pki.spiffe('controller', 'controller'), { resumeSessions: true });
    closers.push(() => resuming.close());
    expect((await getVia(resuming.agent, r.t.port, '/v1/nodes')).status).toBe(200);
    await waitFor('the session ticket', () => resuming.sessions!.size === 1);
    await dropConnections(r, resuming.agent);
    r.reused.length = 0;
    expect((await getVia(resuming.agent, r.t.port, '/v1/nodes')).status).toBe(200);
    expect(r.reused).toEqual([true]);
    // the operator's CLI does not resume (httpsAgentFor without a session store)
    const plain = new HttpsAgentHolder(m, pki.spiffe('controller', 'controller'));
    closers.push(() => plain.close());
    await dropConnections(r, resuming.agent);
    expect((await getVia(plain.agent, r.t.port, '/v1/nodes')).status).toBe(200);
    expect((await getVia(plain.agent, r.t.port, '/v1/nodes')).status).toBe(200);
    expect(r.reused.slice(1).every((x) => !x)).toBe(true);
  });
});
