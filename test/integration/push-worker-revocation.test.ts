/**
 * A node revoked in the database (`POST /v1/nodes/{id}/revoke`) loses its push connection when the
 * push dialer runs in a worker process (`--push-workers 1`): the worker loads revoked.json itself
 * but not the database, so the main process sends it the database's identity floors over IPC
 * (controller/push/ipc.ts, `identity-floors`); the worker closes the live connection and refuses
 * the redials (`revoked`). Real processes: a controller with one push worker and an enrolled
 * agent whose listener the worker dials (docs/certificates-over-time.md, "Revoking a node").
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IDENTITY_FLOOR_REFRESH_MS } from '../../protocol/limits.js';
import {
  api,
  credOf,
  freePort,
  hasExited,
  heraldSync,
  isBuilt,
  killAll,
  startHerald,
  waitFor,
  type Cred,
  type Proc,
} from '../helpers/procs.js';

const built = isBuilt();
let work: string;
let pki: string;
let op: Cred;
let port: number;
let ctl: Proc;

interface PushView {
  state: string;
  connected: boolean;
  last_error: string | null;
  last_error_at: string | null;
}

async function pushOf(node: string): Promise<PushView> {
  const r = await api(port, op, 'GET', `/v1/nodes/${node}`);
  expect(r.status, r.raw).toBe(200);
  return r.json.push as PushView;
}

/** Enrols `node` (a join token for 127.0.0.1) and starts its agent, listening for push. */
async function startAgent(node: string): Promise<Proc> {
  expect((await api(port, op, 'POST', '/v1/nodes', { id: node })).status).toBe(201);
  const t = heraldSync([
    'enroll',
    'token',
    '--node',
    node,
    '--ip',
    '127.0.0.1',
    '--controller',
    `https://127.0.0.1:${port}`,
    '--pki',
    pki,
  ]);
  expect(t.code, t.err).toBe(0);
  const der = new crypto.X509Certificate(fs.readFileSync(path.join(pki, 'ca.crt'))).raw;
  const fingerprint = crypto.createHash('sha256').update(der).digest('hex');
  const dir = path.join(work, `node-${node}`);
  const e = heraldSync([
    'agent',
    'enroll',
    '--controller',
    `https://127.0.0.1:${port}`,
    '--ca-sha256',
    fingerprint,
    '--token',
    t.out.trim(),
    '--node',
    node,
    '--pki',
    dir,
  ]);
  expect(e.code, e.err).toBe(0);
  return startHerald(
    `agent-${node}`,
    [
      'agent',
      '--node',
      node,
      '--controller',
      `https://127.0.0.1:${port}`,
      '--listen',
      `127.0.0.1:${await freePort()}`,
      '--pki',
      dir,
      '--state-dir',
      path.join(work, `state-${node}`),
    ],
    work,
  );
}

describe.skipIf(!built)('node revocation reaches the push worker processes', { timeout: 90_000 }, () => {
  beforeAll(async () => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pw-revoke-'));
    pki = path.join(work, 'pki');
    expect(heraldSync(['certs', 'init', '--dir', pki]).code).toBe(0);
    expect(heraldSync(['certs', 'issue', 'issuer', 'i1', '--dir', pki]).code).toBe(0);
    op = credOf(pki, 'operator', 'admin');
    port = await freePort();
    ctl = startHerald(
      'controller',
      [
        'controller',
        '--listen',
        `127.0.0.1:${port}`,
        '--pki',
        pki,
        '--db',
        path.join(work, 'herald.db'),
        '--push-workers',
        '1',
        '--issuer',
        'i1',
      ],
      work,
    );
    await waitFor(
      'controller /healthz',
      async () => {
        if (hasExited(ctl)) throw new Error(`controller exited: ${ctl.log()}`);
        return (await api(port, op, 'GET', '/healthz').catch(() => ({ status: 0 }))).status === 200;
      },
      20_000,
      50,
    );
  });

  afterAll(async () => {
    await killAll();
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it('closes the live push connection of a node revoked by POST /v1/nodes/{id}/revoke, and refuses its redials (revoked)', async () => {
    const agents = [await startAgent('pw1'), await startAgent('pw2')];
    for (const node of ['pw1', 'pw2'])
      await waitFor(
        `the push connection to ${node}`,
        async () => {
          for (const a of agents) if (hasExited(a)) throw new Error(`agent exited: ${a.log()}`);
          return (await pushOf(node)).connected;
        },
        30_000,
        100,
      );
    // the dialer runs in a worker process, not in the controller's
    expect(ctl.log()).toMatch(/"workers":1[,}].*push workers started/);

    const revoke = await api(port, op, 'POST', '/v1/nodes/pw1/revoke', {});
    expect(revoke.status, revoke.raw).toBe(200);
    const revokedAt = Date.now();
    const closed = await waitFor(
      'the push connection to pw1 to be closed',
      async () => {
        const p = await pushOf('pw1');
        return p.connected ? undefined : p;
      },
      IDENTITY_FLOOR_REFRESH_MS + 2_000,
      50,
    );
    expect(Date.now() - revokedAt).toBeLessThan(IDENTITY_FLOOR_REFRESH_MS + 2_000);
    expect(closed).toMatchObject({ connected: false, last_error: 'revoked' });
    expect(closed.state).not.toBe('connected');

    // the worker dials again (backoff) and is refused each time: never connected again
    const firstAt = closed.last_error_at!;
    const redialed = await waitFor(
      'a redial to pw1 to be refused',
      async () => {
        const p = await pushOf('pw1');
        if (p.connected) throw new Error('pw1 is connected again');
        return p.last_error_at !== firstAt ? p : undefined;
      },
      15_000,
      50,
    );
    expect(redialed).toMatchObject({ connected: false, last_error: 'revoked' });
    expect(redialed.state).not.toBe('connected');
    // the other node keeps its connection
    expect(await pushOf('pw2')).toMatchObject({ connected: true });
  });
});
