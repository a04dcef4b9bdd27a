/**
 * What an outside review of the controller found, each reproduced against a real
 * controller over real TLS and seen refused or made safe, with its code:
 * hidden inputs across a cluster (1), database file modes (2), deep JSON (5), one connection and
 * refusal policy for every identity (6), pre-authentication refusals summarised (docs/api.md), and
 * signals limited and cheap when they cannot change anything (8).
 */
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  MAX_JSON_DEPTH_LEVELS,
  API_IDENTITY_MAX_CONNECTIONS,
  API_UNAUTHENTICATED_MAX_CONNECTIONS,
  EXEMPT_OUTPUT_CAPACITY,
  EXEMPT_OUTPUT_PER_WAKE_REQUESTS,
  EXEMPT_SIGNALS_CAPACITY,
  SIGNAL_RATE_BURST,
} from '../../protocol/limits.js';
import { newNonce } from '../../protocol/metadata.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';

let pki: ControllerTestPki;
let op: Cred;
const GENEROUS = { burst: 10_000, perS: 10_000 };

beforeAll(async () => {
  pki = await makeControllerTestPki();
  op = pki.cred('operator', 'admin');
});

afterAll(() => pki?.cleanup());

/** Nested arrays `depth` levels deep around a scalar. */
function nested(depth: number): unknown {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = [v];
  return v;
}

/** A kept-open TLS connection on which raw HTTP/1.1 requests are sent one after another. */
class Conn {
  readonly socket: tls.TLSSocket;
  closed = false;
  #buf = Buffer.alloc(0);
  #waiters: Array<() => void> = [];

  private constructor(socket: tls.TLSSocket) {
    this.socket = socket;
    socket.on('data', (c: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, c]);
      this.#wake();
    });
    socket.on('close', () => {
      this.closed = true;
      this.#wake();
    });
    socket.on('error', () => {});
  }

  static open(port: number, cred: Cred): Promise<Conn> {
    return new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ...cred, minVersion: 'TLSv1.3' }, () =>
        resolve(new Conn(s)),
      );
      s.once('error', reject);
    });
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  /** Sends one request and reads its answer; status 0 when the connection closed first. */
  async request(method: string, p: string, body?: unknown): Promise<{ status: number; headers: string; json: any }> {
    const data = body === undefined ? '' : JSON.stringify(body);
    this.socket.write(
      `${method} ${p} HTTP/1.1\r\nHost: localhost\r\n${data ? `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(data)}\r\n` : ''}\r\n${data}`,
    );
    for (;;) {
      const end = this.#buf.indexOf('\r\n\r\n');
      if (end >= 0) {
        const head = this.#buf.subarray(0, end).toString();
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (this.#buf.length >= end + 4 + len) {
          const text = this.#buf.subarray(end + 4, end + 4 + len).toString();
          this.#buf = this.#buf.subarray(end + 4 + len);
          return {
            status: Number(head.split(' ')[1]),
            headers: head.toLowerCase(),
            json: text ? JSON.parse(text) : undefined,
          };
        }
      }
      if (this.closed) return { status: 0, headers: '', json: undefined };
      await new Promise<void>((r) => this.#waiters.push(r));
    }
  }

  /** Resolves once the server has closed the connection. */
  async closedByPeer(): Promise<true> {
    while (!this.closed) await new Promise<void>((r) => this.#waiters.push(r));
    return true;
  }

  close(): void {
    this.socket.destroy();
  }
}

/** Collects a `/v1/events` stream's text until stopped. */
function events(port: number, cred: Cred): { text: () => string; stop: () => void; ready: Promise<void> } {
  let text = '';
  let req: ReturnType<typeof https.get> | undefined;
  const ready = new Promise<void>((resolve, reject) => {
    req = https.get(
      { host: '127.0.0.1', port, path: '/v1/events', ...cred, servername: 'localhost', agent: false },
      (res) => {
        res.on('data', (c: Buffer) => {
          text += c.toString();
          resolve();
        });
      },
    );
    req.on('error', reject);
  });
  return { text: () => text, stop: () => req?.destroy(), ready };
}

function refusedLines(t: TestController, code: string): Array<Record<string, unknown>> {
  return t.logLines().filter((l) => l.event === 'refused' && l.code === code);
}

describe('hidden inputs across a cluster (review item 1)', () => {
  let t: TestController;
  beforeAll(async () => {
    t = await startTestController(
      pki,
      {},
      { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS, signal: GENEROUS } },
    );
  });
  afterAll(async () => t?.close());

  it('a value hidden by either config of a cluster is masked in every deployment, revision and event, and flagged hidden in the metadata', async () => {
    const stream = events(t.port, op);
    await stream.ready;
    for (const n of ['n1', 'n2']) expect((await t.req(op, 'POST', '/v1/nodes', { id: n })).status).toBe(201);
    const install = await t.req(op, 'POST', '/v1/configs', {
      name: 'install',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [{ name: 'install_pw', hidden: true }, { name: 'plain' }],
    });
    const uninstall = await t.req(op, 'POST', '/v1/configs', {
      name: 'uninstall',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [{ name: 'uninstall_pw', hidden: true }],
    });
    const cl = await t.req(op, 'POST', '/v1/clusters', {
      name: 'c',
      nodes: ['n1', 'n2'],
      install_config_id: install.json.id,
      uninstall_config_id: uninstall.json.id,
      input_values: { install_pw: 'SECRET-ONE', uninstall_pw: 'SECRET-TWO', plain: 'visible' },
    });
    expect(cl.status, JSON.stringify(cl.json)).toBe(201);
    expect(cl.json.input_values).toEqual({ install_pw: '***', uninstall_pw: '***', plain: 'visible' });

    // each install succeeds, then a restart makes each node's uninstall deployment (its first
    // uninstall): masked as the installs are
    for (const n of cl.json.nodes as Array<{ node: string; install_deployment_id: string }>) {
      const path = `/v1/nodes/${n.node}/deployments/${n.install_deployment_id}/signal`;
      const body = { revision: 1, deploy_status_code: 0 };
      expect((await t.req(pki.cred('agent', n.node), 'POST', path, body)).status).toBe(200);
    }
    expect((await t.req(op, 'PATCH', `/v1/clusters/${cl.json.id}/actions/restart`)).status).toBe(204);
    const list = await t.req(op, 'GET', '/v1/deployments');
    expect(list.json.items.map((d: { name: string }) => d.name).sort()).toEqual([
      'c-install',
      'c-install',
      'c-uninstall',
      'c-uninstall',
    ]);
    for (const d of list.json.items) {
      expect(d.input_values.install_pw).toBe('***');
      expect(d.input_values.uninstall_pw).toBe('***');
      expect(d.input_values.plain).toBe('visible');
      const revs = await t.req(op, 'GET', `/v1/deployments/${d.id}/revisions`);
      expect(JSON.stringify(revs.json)).not.toMatch(/SECRET-/);
      expect(JSON.stringify((await t.req(op, 'GET', `/v1/deployments/${d.id}`)).json)).not.toMatch(/SECRET-/);
    }
    // the agent still gets the values, each marked hidden so it can mask them in hook output
    const md = await t.req(pki.cred('agent', 'n1'), 'GET', '/v1/nodes/n1/metadata', undefined, {
      headers: { 'herald-nonce': newNonce() },
    });
    const inputs = md.json.deployments[0].inputs as Array<{ name: string; value: unknown; hidden?: boolean }>;
    expect(inputs.find((i) => i.name === 'install_pw')).toMatchObject({ value: 'SECRET-ONE', hidden: true });
    expect(inputs.find((i) => i.name === 'uninstall_pw')).toMatchObject({ value: 'SECRET-TWO', hidden: true });
    expect(inputs.find((i) => i.name === 'plain')?.hidden).toBeUndefined();
    // and the uninstall's item, made by the restart
    const items = md.json.deployments as Array<{ name: string; inputs: typeof inputs }>;
    const un = items.find((d) => d.name === 'c-uninstall')!.inputs;
    expect(un.find((i) => i.name === 'uninstall_pw')).toMatchObject({ value: 'SECRET-TWO', hidden: true });
    expect(un.find((i) => i.name === 'install_pw')).toMatchObject({ value: 'SECRET-ONE', hidden: true });

    await waitFor('deployment events', () => stream.text().includes('event: deployment'));
    stream.stop();
    expect(stream.text()).toContain('visible');
    expect(stream.text()).not.toMatch(/SECRET-/);
    expect(t.logText()).not.toMatch(/SECRET-/);
    expect(JSON.stringify((await t.req(op, 'GET', '/v1/audit')).json)).not.toMatch(/SECRET-/);
  });
});

describe('database file modes (review item 2)', () => {
  it('creates the database and its -wal 0600 in a 0700 directory, whatever the umask (no -shm: the one controller holds the file exclusively)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-dbmode-'));
    const old = process.umask(0o022);
    let t: TestController | undefined;
    try {
      const db = path.join(dir, 'new', 'herald.db');
      t = await startTestController(pki, { db });
      expect((await t.req(op, 'POST', '/v1/nodes', { id: 'm1' })).status).toBe(201); // a write: the WAL exists
      expect(fs.statSync(path.dirname(db)).mode & 0o777).toBe(0o700);
      for (const f of [db, `${db}-wal`]) expect({ f, mode: fs.statSync(f).mode & 0o777 }).toEqual({ f, mode: 0o600 });
      expect(fs.existsSync(`${db}-shm`)).toBe(false);
      expect(t.logLines().filter((l) => l.code === 'unsafe_file_mode')).toEqual([]);
    } finally {
      process.umask(old);
      await t?.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('reports a database readable by others at start (unsafe_file_mode)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-dbmode-'));
    const db = path.join(dir, 'herald.db');
    fs.writeFileSync(db, '');
    fs.chmodSync(db, 0o644);
    const t = await startTestController(pki, { db });
    try {
      const line = t.logLines().find((l) => l.code === 'unsafe_file_mode');
      expect(line).toMatchObject({ file: db, mode: '0644' });
    } finally {
      await t.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('deep JSON (review item 5)', () => {
  let t: TestController;
  let configId: string;
  let depId: string;
  const n1 = (): Cred => pki.cred('agent', 'n1');
  beforeAll(async () => {
    t = await startTestController(
      pki,
      {},
      { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS, signal: GENEROUS } },
    );
    await t.req(op, 'POST', '/v1/nodes', { id: 'n1' });
    const c = await t.req(op, 'POST', '/v1/configs', {
      name: 'j',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [{ name: 'doc', type: 'Json' }],
      outputs: [{ name: 'out' }],
    });
    configId = c.json.id;
    depId = (await t.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: configId })).json.id;
  });
  afterAll(async () => t?.close());

  type DeepCase = [string, string, () => string, (v: unknown) => unknown, string, () => Cred];
  const deepCases: DeepCase[] = [
    [
      'a signal output',
      'POST',
      () => `/v1/nodes/n1/deployments/${depId}/signal`,
      (v: unknown) => ({ revision: 1, deploy_status_code: 0, outputs: { out: v } }),
      'outputs.out',
      n1,
    ],
    [
      'a config',
      'POST',
      () => '/v1/configs',
      (v: unknown) => ({ name: 'deep', group: 'x', config: v }),
      'config',
      () => op,
    ],
    [
      'an option',
      'POST',
      () => '/v1/configs',
      (v: unknown) => ({ name: 'deep', group: 'x', config: 'c', options: { o: v } }),
      'options.o',
      () => op,
    ],
    [
      'an input default',
      'POST',
      () => '/v1/configs',
      (v: unknown) => ({ name: 'deep', group: 'x', config: 'c', inputs: [{ name: 'i', type: 'Json', default: v }] }),
      'inputs.0.default',
      () => op,
    ],
    [
      'a Json input value',
      'POST',
      () => '/v1/deployments',
      (v: unknown) => ({ node: 'n1', config_id: configId, input_values: { doc: v } }),
      'input_values.doc',
      () => op,
    ],
    [
      'a Json input value in a patch',
      'PATCH',
      () => `/v1/deployments/${depId}`,
      (v: unknown) => ({ input_values: { doc: v } }),
      'input_values.doc',
      () => op,
    ],
  ];
  it.each(deepCases)(
    '%s nested past the limit is 400 invalid_request naming the field; the API stays whole',
    async (_what, method, p, body, field, cred) => {
      for (const depth of [MAX_JSON_DEPTH_LEVELS + 1, 4_200, 200_000]) {
        // written as text: the test's own JSON.stringify would overflow the stack first
        const rawBody = JSON.stringify(body('__DEEP__')).replace(
          '"__DEEP__"',
          `${'['.repeat(depth)}1${']'.repeat(depth)}`,
        );
        const r = await t.req(cred(), method, p(), undefined, {
          rawBody,
          headers: { 'content-type': 'application/json' },
        });
        expect({ depth, status: r.status, code: r.json?.error?.code }).toEqual({
          depth,
          status: 400,
          code: 'invalid_request',
        });
        expect(r.json.error.field).toBe(field);
      }
      expect((await t.req(op, 'GET', '/v1/deployments')).status).toBe(200);
      expect((await t.req(op, 'GET', `/v1/deployments/${depId}`)).status).toBe(200);
      expect((await t.req(op, 'GET', `/v1/deployments/${depId}/revisions`)).status).toBe(200);
    },
  );

  it('accepts a value exactly at the limit', async () => {
    const r = await t.req(op, 'POST', '/v1/configs', {
      name: 'at-limit',
      group: 'x',
      config: nested(MAX_JSON_DEPTH_LEVELS),
    });
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    expect((await t.req(op, 'GET', `/v1/configs/${r.json.id}`)).status).toBe(200);
  });
});

describe('one connection and refusal policy for every identity (review item 6, docs/api.md)', () => {
  let t: TestController;
  beforeAll(async () => {
    t = await startTestController(
      pki,
      {},
      {
        rates: {
          announce: GENEROUS,
          fetch: { burst: 2, perS: 0.01 },
          other: { burst: 5, perS: 0.01 },
          signal: GENEROUS,
        },
      },
    );
  });
  afterAll(async () => t?.close());

  it('an operator holds at most API_IDENTITY_MAX_CONNECTIONS (32) kept-alive connections; the next is 429 too_many_connections and closed', async () => {
    const cred = pki.cred('operator', 'admin');
    const conns: Conn[] = [];
    try {
      for (let i = 0; i < API_IDENTITY_MAX_CONNECTIONS; i++) conns.push(await Conn.open(t.port, cred));
      const extra = await Conn.open(t.port, cred);
      conns.push(extra);
      const r = await extra.request('GET', '/healthz');
      expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status: 429, code: 'too_many_connections' });
      expect(await extra.closedByPeer()).toBe(true);
      // the others still work, and stay open
      expect((await conns[0]!.request('GET', '/healthz')).status).toBe(200);
      expect(conns[0]!.closed).toBe(false);
    } finally {
      for (const c of conns) c.close();
    }
  });

  it('a 403 (wrong_role) closes its connection', async () => {
    const c = await Conn.open(t.port, pki.cred('controller', 'controller'));
    const r = await c.request('GET', '/v1/configs');
    expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status: 403, code: 'wrong_role' });
    expect(r.headers).toContain('connection: close');
    expect(await c.closedByPeer()).toBe(true);
  });

  it('the rate limit comes before the role check: wrong_node requests end in 429, and repeated 429s close the connection', async () => {
    const seen: string[] = [];
    for (let i = 0; i < 8; i++) {
      const r = await t.req(pki.cred('agent', 'n2'), 'GET', '/v1/nodes/n1/metadata', undefined, {
        headers: { 'herald-nonce': newNonce() },
      });
      seen.push(r.json?.error?.code);
    }
    expect(seen.slice(0, 2)).toEqual(['wrong_node', 'wrong_node']);
    expect(seen.slice(2)).toEqual(Array(6).fill('rate_limited'));

    const c = await Conn.open(t.port, pki.cred('agent', 'n3'));
    const statuses: number[] = [];
    for (let i = 0; i < 6 && !c.closed; i++) statuses.push((await c.request('GET', '/v1/nodes/n3/metadata')).status);
    // 2 answered (404: no such node yet), then 429s until the third closes the connection
    expect(statuses.slice(0, 2)).toEqual([404, 404]);
    expect(statuses.slice(2, 5)).toEqual([429, 429, 429]);
    expect(await c.closedByPeer()).toBe(true);
  });

  it('a flood of 403s writes a summary, not a line each, and the counts add up', async () => {
    const own = await startTestController(pki, {}, { rates: { other: { burst: 5, perS: 0.01 } } });
    const N = 200;
    const cred = pki.cred('controller', 'controller');
    for (let i = 0; i < N; i++) await own.req(cred, 'GET', '/v1/nodes');
    // the controller identity's budget (burst 5) runs out first: then its refusals are 429s
    expect(refusedLines(own, 'wrong_role').length).toBeLessThanOrEqual(2);
    expect(refusedLines(own, 'rate_limited').length).toBeLessThanOrEqual(2);
    await own.close(); // flushes the summary
    const counted = [...refusedLines(own, 'wrong_role'), ...refusedLines(own, 'rate_limited')].reduce(
      (n, l) => n + Number(l.count),
      0,
    );
    expect(counted).toBe(N);
  });
});

describe('refusals before authentication (docs/api.md)', () => {
  let t: TestController;
  beforeAll(async () => {
    t = await startTestController(pki);
  });
  afterAll(async () => t?.close());

  it('TLS garbage is counted in metrics and logged as a summary', async () => {
    const N = 100;
    await Promise.all(
      Array.from(
        { length: N },
        () =>
          new Promise<void>((resolve) => {
            const s = net.connect(t.port, '127.0.0.1', () => s.write('GET / HTTP/1.1\r\n\r\n'));
            s.on('close', () => resolve());
            s.on('error', () => {});
          }),
      ),
    );
    await waitFor('all handshakes refused', async () => {
      const m = (await t.req(op, 'GET', '/metrics')).text;
      return Number(/herald_api_refusals_total\{code="tls_handshake_failed"\} (\d+)/.exec(m)?.[1] ?? 0) >= N;
    });
    expect(refusedLines(t, 'tls_handshake_failed').length).toBeLessThanOrEqual(2);
    expect(t.logLines().filter((l) => /handshake/i.test(String(l.msg)) && l.event !== 'refused').length).toBe(0);
  });

  it('at most API_UNAUTHENTICATED_MAX_CONNECTIONS (64) connections without a valid certificate are held; further ones are destroyed', async () => {
    const held: Conn[] = [];
    try {
      for (let i = 0; i < API_UNAUTHENTICATED_MAX_CONNECTIONS; i++) held.push(await Conn.open(t.port, pki.noCert));
      const extra = await Conn.open(t.port, pki.noCert).catch(() => undefined);
      if (extra) {
        held.push(extra);
        expect(await extra.closedByPeer()).toBe(true);
      }
      expect(held[0]!.closed).toBe(false);
      const r = await held[0]!.request('GET', '/v1/nodes');
      expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status: 403, code: 'no_client_certificate' });
      expect(await held[0]!.closedByPeer()).toBe(true);
      // an operator is not held back by them
      expect((await t.req(op, 'GET', '/v1/nodes')).status).toBe(200);
    } finally {
      for (const c of held) c.close();
    }
  });
});

describe('signals (review item 8)', () => {
  let t: TestController;
  let depId: string;
  const n1 = (): Cred => pki.cred('agent', 'n1');
  beforeAll(async () => {
    t = await startTestController(pki, {}, { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS } });
    await t.req(op, 'POST', '/v1/nodes', { id: 'n1' });
    const c = await t.req(op, 'POST', '/v1/configs', { name: 's', group: 'script', config: '#!/bin/sh\n' });
    depId = (await t.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: c.json.id })).json.id;
  });
  afterAll(async () => t?.close());

  it('a duplicate signal is answered with a summary and writes nothing', async () => {
    const big = 'x'.repeat(3 * 1024 * 1024);
    const url = `/v1/nodes/n1/deployments/${depId}/signal`;
    const first = await t.req(n1(), 'POST', url, { revision: 1, deploy_status_code: 0, deploy_stdout: big });
    expect(first.status).toBe(200);
    expect(first.raw.length).toBeLessThan(1024);
    const audit = (await t.req(op, 'GET', '/v1/audit?limit=1000')).json.items.length;
    const dup = await t.req(n1(), 'POST', url, { revision: 1, deploy_status_code: 1, deploy_stdout: big });
    expect(dup.status).toBe(200);
    expect(dup.raw.length).toBeLessThan(1024);
    expect(dup.json).toMatchObject({ revision: 1, status: 'COMPLETE' });
    expect((await t.req(op, 'GET', '/v1/audit?limit=1000')).json.items.length).toBe(audit);
  });

  it('signals are limited per node: burst SIGNAL_RATE_BURST (20), then 429 rate_limited with Retry-After', async () => {
    // the default burst, with (next to) no refill, so the count does not depend on how fast this runs
    const own = await startTestController(pki, {}, { rates: { signal: { burst: SIGNAL_RATE_BURST, perS: 0.001 } } });
    try {
      await own.req(op, 'POST', '/v1/nodes', { id: 'n1' });
      const c = await own.req(op, 'POST', '/v1/configs', { name: 's', group: 'script', config: '#!/bin/sh\n' });
      const dep = (await own.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: c.json.id })).json.id;
      const url = `/v1/nodes/n1/deployments/${dep}/signal`;
      // the first signal answers the work the deployment's wake-up gave: not counted (below)
      expect((await own.req(n1(), 'POST', url, { revision: 1, deploy_status_code: 0 })).status).toBe(200);
      const codes: number[] = [];
      for (let i = 0; i < SIGNAL_RATE_BURST; i++)
        codes.push((await own.req(n1(), 'POST', url, { revision: 1, deploy_status_code: 0 })).status);
      expect(codes).toEqual(Array(SIGNAL_RATE_BURST).fill(200));
      const limited = await own.req(n1(), 'POST', url, { revision: 1, deploy_status_code: 0 });
      expect({ status: limited.status, code: limited.json?.error?.code }).toEqual({
        status: 429,
        code: 'rate_limited',
      });
      expect(Number(limited.headers['retry-after'])).toBeGreaterThan(0);
    } finally {
      await own.close();
    }
  });
});

describe('a signal of work a wake-up gave is never rate-limited', () => {
  const n1 = (): Cred => pki.cred('agent', 'n1');
  let t: TestController;
  let cfg: string;
  beforeAll(async () => {
    t = await startTestController(
      pki,
      {},
      { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS, signal: { burst: 2, perS: 0.001 } } },
    );
    await t.req(op, 'POST', '/v1/nodes', { id: 'n1' });
    cfg = (
      await t.req(op, 'POST', '/v1/configs', {
        name: 'w',
        group: 'script',
        config: '#!/bin/sh\n',
        inputs: [{ name: 'i' }],
      })
    ).json.id;
  });
  afterAll(async () => t?.close());

  const signal = async (dep: string, revision: number) =>
    (await t.req(n1(), 'POST', `/v1/nodes/n1/deployments/${dep}/signal`, { revision, deploy_status_code: 0 })).status;

  it('back-to-back changes to one node are all signalled; what the agent sends by itself meets the limit', async () => {
    const d = await t.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: cfg });
    expect(await signal(d.json.id, 1)).toBe(200);
    const codes: number[] = [];
    for (let i = 0; i < 12; i++) {
      const r = await t.req(op, 'PATCH', `/v1/deployments/${d.json.id}`, { input_values: { i: String(i) } });
      codes.push(await signal(d.json.id, r.json.revision));
    }
    expect(codes).toEqual(Array(12).fill(200));
    // no work given since: the same result again is the agent's own, from its budget of 2
    expect([await signal(d.json.id, 13), await signal(d.json.id, 13), await signal(d.json.id, 13)]).toEqual([
      200, 200, 429,
    ]);
  });

  it('a node holds at most EXEMPT_SIGNALS_CAPACITY of them', () =>
    withDeployment('signal', async (own, dep, url) => {
      let revision = 1;
      for (let i = 0; i < EXEMPT_SIGNALS_CAPACITY + 5; i++)
        revision = (await own.req(op, 'PATCH', `/v1/deployments/${dep}`, { input_values: { i } })).json.revision;
      const codes: number[] = [];
      for (let i = 0; i < EXEMPT_SIGNALS_CAPACITY + 3; i++)
        codes.push((await own.req(n1(), 'POST', url, { revision, deploy_status_code: 0 })).status);
      // the ones held, then the budget of 1, then the limit
      expect(codes).toEqual([...Array(EXEMPT_SIGNALS_CAPACITY + 1).fill(200), 429, 429]);
    }));

  it("another agent's or an operator's signal to the node's route spends none of them", () =>
    withDeployment('signal', async (own, _dep, url) => {
      const result = { revision: 1, deploy_status_code: 0 };
      const refused = [
        await own.req(pki.cred('agent', 'n2'), 'POST', url, result),
        await own.req(op, 'POST', url, result),
      ].map((r) => r.json?.error?.code);
      expect(refused).toEqual(['wrong_node', 'wrong_role']);
      // n1's own: the one the deployment's wake-up gave, then its budget of 1, then the limit
      const codes: number[] = [];
      for (let i = 0; i < 3; i++) codes.push((await own.req(n1(), 'POST', url, result)).status);
      expect(codes).toEqual([200, 200, 429]);
    }));
});

/**
 * A controller of its own (the route of `kind`: a budget of 1, next to no refill) with one
 * deployment on n1; `url` is n1's route of that kind for it.
 */
async function withDeployment(
  kind: 'signal' | 'output',
  fn: (own: TestController, depId: string, url: string) => Promise<void>,
): Promise<void> {
  const own = await startTestController(pki, {}, { rates: { [kind]: { burst: 1, perS: 0.001 } } });
  try {
    await own.req(op, 'POST', '/v1/nodes', { id: 'n1' });
    const c = await own.req(op, 'POST', '/v1/configs', {
      name: 'w',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [{ name: 'i' }],
    });
    const d = (await own.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: c.json.id })).json.id;
    await fn(own, d, `/v1/nodes/n1/deployments/${d}/${kind}`);
  } finally {
    await own.close();
  }
}

describe("a run's last output chunks, which its signal waits for, are never rate-limited", () => {
  const n1 = (): Cred => pki.cred('agent', 'n1');
  let seq = 0;
  const chunk = (revision: number) => ({ revision, stream: 'stdout', seq: ++seq, text: `line ${seq}\n` });

  it('each change that gave the node work lets it post EXEMPT_OUTPUT_PER_WAKE_REQUESTS chunks past its limit', () =>
    withDeployment('output', async (own, dep, url) => {
      const codes: number[][] = [];
      for (let i = 0; i < 3; i++) {
        const { revision } = (await own.req(op, 'PATCH', `/v1/deployments/${dep}`, { input_values: { i } })).json;
        const run: number[] = [];
        for (let k = 0; k < EXEMPT_OUTPUT_PER_WAKE_REQUESTS; k++)
          run.push((await own.req(n1(), 'POST', url, chunk(revision))).status);
        codes.push(run);
      }
      expect(codes).toEqual(Array(3).fill(Array(EXEMPT_OUTPUT_PER_WAKE_REQUESTS).fill(200)));
      // the creation's wake-up left its credits too: those, the budget of 1, then the limit
      const revision = (await own.req(op, 'GET', `/v1/deployments/${dep}`)).json.revision;
      const rest: number[] = [];
      for (let k = 0; k < EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 2; k++)
        rest.push((await own.req(n1(), 'POST', url, chunk(revision))).status);
      expect(rest).toEqual([...Array(EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 1).fill(200), 429]);
    }));

  it('a node holds at most EXEMPT_OUTPUT_CAPACITY of them', () =>
    withDeployment('output', async (own, dep, url) => {
      let revision = 1;
      for (let i = 0; i < EXEMPT_OUTPUT_CAPACITY; i++)
        revision = (await own.req(op, 'PATCH', `/v1/deployments/${dep}`, { input_values: { i } })).json.revision;
      const codes: number[] = [];
      for (let i = 0; i < EXEMPT_OUTPUT_CAPACITY + 3; i++)
        codes.push((await own.req(n1(), 'POST', url, chunk(revision))).status);
      expect(codes).toEqual([...Array(EXEMPT_OUTPUT_CAPACITY + 1).fill(200), 429, 429]);
    }));

  it('output chunks spend no signal credits', async () => {
    const own = await startTestController(
      pki,
      {},
      { rates: { output: { burst: 1, perS: 0.001 }, signal: { burst: 1, perS: 0.001 } } },
    );
    try {
      await own.req(op, 'POST', '/v1/nodes', { id: 'n1' });
      const c = await own.req(op, 'POST', '/v1/configs', { name: 'w', group: 'script', config: '#!/bin/sh\n' });
      const dep = (await own.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: c.json.id })).json.id;
      // one change that gave n1 work: one signal and EXEMPT_OUTPUT_PER_WAKE_REQUESTS chunks past the limits
      const chunks: number[] = [];
      for (let i = 0; i < EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 2; i++)
        chunks.push((await own.req(n1(), 'POST', `/v1/nodes/n1/deployments/${dep}/output`, chunk(1))).status);
      expect(chunks).toEqual([...Array(EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 1).fill(200), 429]);
      const signals: number[] = [];
      for (let i = 0; i < 3; i++)
        signals.push(
          (
            await own.req(n1(), 'POST', `/v1/nodes/n1/deployments/${dep}/signal`, {
              revision: 1,
              deploy_status_code: 0,
            })
          ).status,
        );
      // the signal credit, then the budget of 1, then the limit
      expect(signals).toEqual([200, 200, 429]);
    } finally {
      await own.close();
    }
  });

  it("another agent's or an operator's chunk to the node's route spends none of them", () =>
    withDeployment('output', async (own, _dep, url) => {
      const refused = [
        await own.req(pki.cred('agent', 'n2'), 'POST', url, chunk(1)),
        await own.req(op, 'POST', url, chunk(1)),
      ].map((r) => r.json?.error?.code);
      expect(refused).toEqual(['wrong_node', 'wrong_role']);
      const codes: number[] = [];
      for (let i = 0; i < EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 2; i++)
        codes.push((await own.req(n1(), 'POST', url, chunk(1))).status);
      expect(codes).toEqual([...Array(EXEMPT_OUTPUT_PER_WAKE_REQUESTS + 1).fill(200), 429]);
    }));
});

describe('a fetch answering a wake-up is never rate-limited (docs/api.md)', () => {
  let t: TestController;
  beforeAll(async () => {
    t = await startTestController(
      pki,
      {},
      { rates: { announce: GENEROUS, fetch: { burst: 2, perS: 0.01 }, other: GENEROUS, signal: GENEROUS } },
    );
  });
  afterAll(async () => t?.close());

  it('after a change that woke the node, its back-to-back fetches are all answered', async () => {
    await t.req(op, 'POST', '/v1/nodes', { id: 'n1' });
    const fetch = async () =>
      (
        await t.req(pki.cred('agent', 'n1'), 'GET', '/v1/nodes/n1/metadata', undefined, {
          headers: { 'herald-nonce': newNonce() },
        })
      ).status;
    const c = await t.req(op, 'POST', '/v1/configs', {
      name: 'w',
      group: 'script',
      config: '#!/bin/sh\n',
      inputs: [{ name: 'i' }],
    });
    // no wake-up yet: the agent's own fetches are limited
    expect([await fetch(), await fetch(), await fetch()]).toEqual([200, 200, 429]);
    const d = await t.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: c.json.id });
    expect(t.push.notified.some((w) => w.node === 'n1')).toBe(true);
    const after: number[] = [];
    for (let i = 0; i < 12; i++) {
      await t.req(op, 'PATCH', `/v1/deployments/${d.json.id}`, { input_values: { i: String(i) } });
      after.push(await fetch());
    }
    expect(after).toEqual(Array(12).fill(200));
  });
});
