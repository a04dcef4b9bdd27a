/**
 * PATCHes of one deployment at once lose nothing: each merges its input values into the
 * revision current under the deployment's lock, in the transaction that writes the next one
 * (controller/service/service.ts). On SQLite, one real controller process taking many pairs of
 * PATCHes, the two of a pair at once; on PostgreSQL, two controller processes, one of each pair each. Needs `npm run build`.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { makeFleet, type TestFleet } from '../helpers/fleet.js';
import { keepFleetLogs } from '../helpers/fleet-logs.js';
import { api, credOf, heraldSync, isBuilt, type ApiResponse, type Cred } from '../helpers/procs.js';
import { startControllerProcess, type ControllerProc } from '../helpers/controller-process.js';

/**
 * Two connections to `port` opened and kept: the two PATCHes of a pair then reach the
 * controller together, not a TLS handshake apart.
 */
async function keptPair(
  port: number,
  c: Cred,
): Promise<{ send(path: string, body: unknown): Promise<ApiResponse>; close(): void }> {
  const agent = new https.Agent({ keepAlive: true, maxSockets: 2, ca: c.ca, cert: c.cert, key: c.key });
  const send = (method: string, p: string, body?: unknown) =>
    new Promise<ApiResponse>((resolve, reject) => {
      const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = https.request(
        {
          host: '127.0.0.1',
          port,
          method,
          path: p,
          servername: 'localhost',
          agent,
          headers: data ? { 'content-type': 'application/json', 'content-length': String(data.length) } : {},
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (d: Buffer) => chunks.push(d));
          res.on('end', () => {
            const raw = Buffer.concat(chunks).toString('utf8');
            resolve({
              status: res.statusCode ?? 0,
              headers: res.headers,
              raw,
              json: raw ? JSON.parse(raw) : undefined,
            });
          });
        },
      );
      req.on('error', reject);
      req.end(data);
    });
  await Promise.all([send('GET', '/healthz'), send('GET', '/healthz')]);
  return { send: (p, body) => send('PATCH', p, body), close: () => agent.destroy() };
}

/** Pairs of PATCHes, each pair sent at once, each PATCH setting a key of its own. */
const PAIRS = 20;
const PATCHES = 2 * PAIRS;

/**
 * Creates a deployment with `{ base }`, then sends PAIRS pairs of PATCHes, the two of a pair at
 * once (the first to `ports[0]`, the second to the last port), PATCH i setting `k<i>`; returns
 * the answers (200, or the status and code), their revisions and the deployment as it ends.
 */
async function patchInPairs(
  ports: number[],
  op: Cred,
): Promise<{ statuses: Array<number | string>; revisions: number[]; last: any }> {
  const port = ports[0]!;
  expect((await api(port, op, 'POST', '/v1/nodes', { id: 'n1' })).status).toBe(201);
  const cfg = await api(port, op, 'POST', '/v1/configs', { name: 'merge', group: 'script', config: 'true' });
  expect(cfg.status).toBe(201);
  const d = await api(port, op, 'POST', '/v1/deployments', {
    node: 'n1',
    config_id: cfg.json.id,
    actions: ['CREATE', 'UPDATE'],
    input_values: { base: 'b' },
  });
  expect(d.status).toBe(201);
  const id = d.json.id as string;
  const first = await keptPair(ports[0]!, op);
  const second = await keptPair(ports[ports.length - 1]!, op);
  const patch = (i: number) =>
    (i % 2 === 0 ? first : second).send(`/v1/deployments/${id}`, { input_values: { [`k${i}`]: `v${i}` } });
  const answers = [];
  for (let p = 0; p < PAIRS; p++) answers.push(...(await Promise.all([patch(2 * p), patch(2 * p + 1)])));
  first.close();
  second.close();
  const last = (await api(port, op, 'GET', `/v1/deployments/${id}`)).json;
  return {
    statuses: answers.map((a) => (a.status === 200 ? 200 : `${a.status} ${a.json?.error?.code}`)),
    revisions: answers.map((a) => a.json?.revision),
    last,
  };
}

const every = { base: 'b', ...Object.fromEntries(Array.from({ length: PATCHES }, (_, i) => [`k${i}`, `v${i}`])) };

describe('PATCHes of one deployment at once', { timeout: 120_000 }, () => {
  describe('on SQLite, one controller', () => {
    let work: string;
    let c: ControllerProc | undefined;
    let op: Cred;

    beforeAll(async () => {
      if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
      work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-patch-'));
      const pki = path.join(work, 'pki');
      for (const args of [
        ['certs', 'init', '--dir', pki],
        ['certs', 'issue', 'controller', 'controller', '--dir', pki, '--ip', '127.0.0.1', '--dns', 'localhost'],
      ]) {
        const r = heraldSync(args);
        if (r.code !== 0) throw new Error(`herald ${args.join(' ')}: ${r.err}`);
      }
      op = credOf(pki, 'operator', 'admin');
      c = await startControllerProcess(['--pki', pki, '--db', path.join(work, 'c.db')], path.join(work, 'c.log'));
    }, 60_000);

    afterAll(async () => {
      await c?.kill('SIGKILL');
      if (work) fs.rmSync(work, { recursive: true, force: true });
    });

    it('every key of every PATCH is in the last revision, and each PATCH made its own revision', async () => {
      const { statuses, revisions, last } = await patchInPairs([c!.port], op);
      expect(statuses).toEqual(statuses.map(() => 200));
      expect([...revisions].sort((x, y) => x - y)).toEqual(Array.from({ length: PATCHES }, (_, i) => i + 2));
      expect(last.revision).toBe(PATCHES + 1);
      expect(last.input_values).toEqual(every);
    });
  });

  describe('on PostgreSQL, two controllers', () => {
    let f: TestFleet;

    beforeAll(async () => {
      if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
      f = await makeFleet(['c1', 'c2'], []);
      await f.startController('c1');
      await f.startController('c2');
    }, 120_000);

    beforeEach(({ onTestFailed, task }) => {
      onTestFailed(async () => {
        await keepFleetLogs(f, task.name);
      }, 60_000);
    });

    afterAll(async () => {
      await f?.cleanup();
    });

    it('every key of every PATCH is in the last revision, whichever controller took it', async () => {
      const ports = ['c1', 'c2'].map((n) => f.controllers.get(n)!.port);
      const { statuses, revisions, last } = await patchInPairs(ports, f.op);
      expect(statuses).toEqual(statuses.map(() => 200));
      expect([...revisions].sort((x, y) => x - y)).toEqual(Array.from({ length: PATCHES }, (_, i) => i + 2));
      expect(last.revision).toBe(PATCHES + 1);
      expect(last.input_values).toEqual(every);
    });
  });
});
