/**
 * A node revoked in the database (`POST /v1/nodes/{id}/revoke`) loses its push connection when the
 * push dialer runs in a worker process (`--push-workers 1`): the worker loads revoked.json itself
 * but not the database, so the main process sends it the database's identity floors over IPC
 * (controller/push/ipc.ts, `identity-floors`); the worker closes the live connection and refuses
 * the redials (`revoked`). Real processes: a controller with one push worker and an enrolled
 * agent whose listener the worker dials (docs/certificates-over-time.md, "Revoking a node").
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IDENTITY_FLOOR_REFRESH_MS } from '../../protocol/limits.js';
import { makeEnrolBed, type EnrolBed } from '../helpers/enrollment.js';
import { api, hasExited, isBuilt, waitFor, type Cred, type Proc } from '../helpers/procs.js';

const built = isBuilt();
let e: EnrolBed;
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
  const dir = path.join(e.work, `node-${node}`);
  const r = e.enroll(node, e.token(node, ['--ip', '127.0.0.1']), dir);
  expect(r.code, r.err).toBe(0);
  return e.startAgent(node, dir);
}

describe.skipIf(!built)('node revocation reaches the push worker processes', { timeout: 90_000 }, () => {
  beforeAll(async () => {
    e = await makeEnrolBed({ prefix: 'herald-pw-revoke-', controllerArgs: ['--push-workers', '1', '--issuer', 'i1'] });
    ({ op, port, ctl } = e);
  });

  afterAll(async () => {
    await e?.close();
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
