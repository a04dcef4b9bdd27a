/**
 * The push dialer through worker processes (the PushPool facade): needs the compiled worker
 * (`npm run build`, which `npm test` runs first).
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Registry } from 'prom-client';
import {
  defaultWorkerScript,
  PushPool,
  pushWorkerEnv,
  shardOf,
  type PushPoolOptions,
} from '../../controller/push/pool.js';
import { PUSH_WORKER_MMAP_THRESHOLD_BYTES } from '../../protocol/limits.js';
import type { AckEvent, PushState } from '../../controller/push/types.js';
import { materialPaths, pkiPaths } from '../../certs/paths.js';
import { KeySet } from '../../protocol/jws.js';
import { dialIn } from '../helpers/connect-agent.js';
import {
  CONTROLLER_ID,
  makePushPki,
  TD,
  TestWakeListener,
  waitForEvent,
  type PushPki,
} from '../helpers/wake-listener.js';
import { waitFor } from '../helpers/procs.js';

let pki: PushPki;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki(['n1', 'n2', 'n3']);
}, 60_000);

afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});

afterAll(() => pki?.cleanup());

/** Agent `node`'s TLS files from the test PKI. */
function agentCred(node: string): { ca: Buffer; cert: Buffer; key: Buffer } {
  return {
    ca: fs.readFileSync(pkiPaths(pki.dir).caCrt),
    cert: fs.readFileSync(pkiPaths(pki.dir).cert('agent', node)),
    key: fs.readFileSync(pkiPaths(pki.dir).key('agent', node)),
  };
}

/** The pool's events re-emitted on an EventEmitter, so tests can wait for them with a bound. */
function pool(over: Partial<PushPoolOptions> = {}): { p: PushPool; ev: EventEmitter } {
  const p = new PushPool({
    workers: 2,
    signingJwk: pki.signingJwk,
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: materialPaths(pki.dir, 'controller', 'controller'),
    logger: pki.logger,
    tuning: { backoffBaseMs: 50, backoffMaxMs: 200 },
    ...over,
  });
  open.push(p);
  const ev = new EventEmitter();
  p.on('ack', (e) => ev.emit('ack', e));
  p.on('state', (node, s) => ev.emit('state', { node, s }));
  return { p, ev };
}

describe('pushWorkerEnv', () => {
  const threshold = `glibc.malloc.mmap_threshold=${PUSH_WORKER_MMAP_THRESHOLD_BYTES}`;
  it("adds glibc's mmap threshold to what every child inherits, keeping other tunables; never the database URL", () => {
    expect(
      pushWorkerEnv({ PATH: '/bin', HERALD_DB: 'postgres://h:secret@db/h', NODE_OPTIONS: '--require /x' }),
    ).toEqual({
      PATH: '/bin',
      GLIBC_TUNABLES: threshold,
    });
    expect(pushWorkerEnv({ GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' }).GLIBC_TUNABLES).toBe(
      `glibc.malloc.arena_max=2:${threshold}`,
    );
  });
  it("leaves an operator's own threshold as it is, and the caller's object unchanged", () => {
    const env = { GLIBC_TUNABLES: 'glibc.malloc.mmap_threshold=131072' };
    expect(pushWorkerEnv(env).GLIBC_TUNABLES).toBe('glibc.malloc.mmap_threshold=131072');
    const mine = { PATH: '/bin' };
    pushWorkerEnv(mine);
    expect(mine).toEqual({ PATH: '/bin' });
  });
});

describe.skipIf(!fs.existsSync(defaultWorkerScript()))('push pool (worker processes)', () => {
  it('shards nodes stably over the workers', () => {
    expect(shardOf('n1', 2)).toBe(shardOf('n1', 2));
    const spread = new Set(Array.from({ length: 50 }, (_, i) => shardOf(`node-${i}`, 4)));
    expect(spread.size).toBe(4);
  });

  it('connects, wakes and reports through workers; close() sends 1001', async () => {
    const ls = await Promise.all(['n1', 'n2', 'n3'].map((node) => TestWakeListener.start({ pkiDir: pki.dir, node })));
    open.push(...ls);
    const registry = new Registry();
    const { p, ev } = pool({ metrics: registry });
    const acked = new Set<string>();
    const all = waitForEvent<AckEvent>(ev, 'ack', (e) => acked.add(e.node).size === 3, 10_000);
    await p.start(ls.map((l, i) => ({ node: l.node, url: l.url, generation: 10 + i, ackedGeneration: null })));
    await all;
    expect(p.workerPids).toHaveLength(2);
    expect(ls.map((l) => l.wakes[0]?.claims.gen)).toEqual([10, 11, 12]);
    expect(p.state('n2')).toMatchObject({ state: 'connected', generation_acked: 11 });

    const one = waitForEvent<AckEvent>(ev, 'ack', (e) => e.node === 'n2' && e.gen === 20);
    p.notify('n2', 20, 'deployment');
    await one;
    expect(ls[1]!.wakes.map((w) => w.claims.gen)).toEqual([11, 20]);
    expect(ls[0]!.wakes).toHaveLength(1);

    const text = await registry.metrics();
    expect(text).toMatch(/herald_wakeups_acked_total 4/);
    expect(text).toMatch(/herald_push_connected_agents 3/);
    expect(text).toMatch(/herald_wakeups_sent_total 4/);

    const codes = Promise.all(ls.map((l) => l.waitFor<number>('close')));
    await p.close();
    expect(await codes).toEqual([1001, 1001, 1001]);
  });

  it.skipIf(!fs.existsSync('/proc/self/environ'))(
    "starts each worker with glibc's mmap threshold for its TLS buffers",
    async () => {
      const { p } = pool();
      await p.start([]);
      expect(p.workerPids).toHaveLength(2);
      for (const pid of p.workerPids) {
        const env = fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
        expect(env).toContain(`GLIBC_TUNABLES=${pushWorkerEnv(process.env).GLIBC_TUNABLES}`);
        expect(env.join('\n')).toContain(`mmap_threshold=`);
      }
    },
  );

  it('restarts a worker that died and reconnects its nodes with a ping wake-up', async () => {
    const l = await TestWakeListener.start({ pkiDir: pki.dir, node: 'n1' });
    open.push(l);
    const { p, ev } = pool();
    const first = waitForEvent<AckEvent>(ev, 'ack', (e) => e.node === 'n1', 10_000);
    await p.start([{ node: 'n1', url: l.url, generation: 3, ackedGeneration: 2 }]);
    await first;
    const lost = waitForEvent<{ node: string; s: PushState }>(
      ev,
      'state',
      (x) => x.node === 'n1' && x.s.state === 'disconnected',
      10_000,
    );
    p.notify('n1', 4, 'deployment');
    await waitForEvent<AckEvent>(ev, 'ack', (e) => e.gen === 4);
    const victim = p.workerPids[shardOf('n1', 2)]!;
    const again = waitForEvent<AckEvent>(ev, 'ack', (e) => e.node === 'n1', 15_000);
    process.kill(victim, 'SIGKILL');
    await lost;
    const e = await again;
    expect(e.gen).toBe(4);
    expect(l.wakes.at(-1)!.claims).toMatchObject({ gen: 4, reason: 'ping' });
    expect(p.workerPids).not.toContain(victim);
  });

  it('a node whose dial was in flight when its worker died shows the loss at once (connection_reset)', async () => {
    // a silent listener: accepts TCP, never speaks TLS, so the dial stays in flight
    const held = new Set<net.Socket>();
    const sink = net.createServer((c) => {
      held.add(c.on('error', () => undefined));
    });
    await new Promise<void>((r) => sink.listen(0, '127.0.0.1', () => r()));
    open.push({
      close: () => {
        for (const c of held) c.destroy();
        return new Promise<void>((r) => sink.close(() => r()));
      },
    });
    const accepted = new Promise<void>((r) => sink.once('connection', () => r()));
    const { p, ev } = pool();
    const dialling = waitForEvent<{ node: string; s: PushState }>(
      ev,
      'state',
      (x) => x.node === 'n1' && x.s.state === 'connecting',
      5_000,
    );
    await p.start([
      {
        node: 'n1',
        url: `wss://127.0.0.1:${(sink.address() as net.AddressInfo).port}/v1/wake`,
        generation: 1,
        ackedGeneration: null,
      },
    ]);
    await Promise.all([accepted, dialling]);
    expect(p.state('n1')).toMatchObject({ state: 'connecting', last_error: null });
    const lost = waitForEvent<{ node: string; s: PushState }>(
      ev,
      'state',
      (x) => x.node === 'n1' && x.s.state === 'disconnected',
      5_000,
    );
    process.kill(p.workerPids[shardOf('n1', 2)]!, 'SIGKILL');
    expect((await lost).s).toMatchObject({ connected: false, last_error: 'connection_reset' });
  });

  it('replaces a worker that sends a batch it cannot read, and stays up itself (the events before the bad word count)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-bad-worker-'));
    const starts = path.join(dir, 'starts');
    const script = path.join(dir, 'worker.mjs');
    // a worker with a bug: a good push state, then a word out of place, each time it is started
    fs.writeFileSync(
      script,
      `import fs from 'node:fs';
process.on('message', (m) => {
  if (m.t === 'init') {
    fs.appendFileSync(${JSON.stringify(starts)}, 'started\\n');
    process.send({ t: 'ready' });
  } else if (m.t === 'batch' && m.words.some((w) => w?.t === 'start')) {
    process.send({ t: 'batch', events: [0, 'n1', 'connected', 'dialled', 1, null, null, null, null, 'stray'], metrics: null });
  } else if (m.t === 'close') {
    process.send({ t: 'closed' });
    process.disconnect();
  }
});
process.on('disconnect', () => process.exit(0));
`,
    );
    try {
      const { p } = pool({ workers: 1, workerScript: script });
      const states: string[] = [];
      p.on('state', (node, s) => states.push(`${node} ${s.state}`));
      await p.start([{ node: 'n1', url: null, generation: 1, ackedGeneration: 0 }]);
      const startCount = () => fs.readFileSync(starts, 'utf8').split('\n').filter(Boolean).length;
      await waitFor('the worker to be replaced', () => startCount() >= 2);
      expect(states[0]).toBe('n1 connected');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe.skipIf(!fs.existsSync(defaultWorkerScript()))('push pool: dialled-in connections', () => {
  it('hands a worker one socket at a time: a wake-up to a dialled-in agent does not wait behind the sockets still to be handed over', async () => {
    const { p } = pool({ workers: 1 });
    p.on('attach', (node) => p.notify(node, 7, 'ping'));
    await p.start([]);
    const port = (await p.serveConnect({ host: '127.0.0.1', port: 0 })).port;
    const keys = new KeySet(JSON.parse(fs.readFileSync(pkiPaths(pki.dir).jwks, 'utf8')));
    const a = await dialIn(port, { node: 'n1', cred: agentCred('n1'), keys, controller: CONTROLLER_ID });
    open.push(a);
    a.ack(await a.nextWake(), 7);
    await waitFor('n1 connected', () => p.state('n1').connected);
    const worker = p.workerPids[0]!;
    process.kill(worker, 'SIGSTOP');
    const K = 40;
    let secured = 0;
    // TLS clients that go no further: each one's handshake completes once the worker has its socket
    const clients = Array.from({ length: K }, () => {
      const c = tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false });
      c.on('error', () => undefined);
      c.once('secureConnect', () => secured++);
      return c;
    });
    try {
      // one on its way to the stopped worker, the others waiting here
      await waitFor('the sockets to wait', () => p.connectHandoffsWaiting === K - 1);
      p.notify('n1', 8, 'deployment');
      process.kill(worker, 'SIGCONT');
      expect(await a.nextWake()).toMatchObject({ reason: 'deployment', gen: 8 });
      expect(secured).toBeLessThan(K / 2);
      // and every waiting socket reaches the worker after it
      await waitFor('every handshake', () => secured === K);
      expect(p.connectHandoffsWaiting).toBe(0);
    } finally {
      process.kill(worker, 'SIGCONT');
      for (const c of clients) c.destroy();
    }
  });

  it('cuts the sockets past the cap waiting for a worker (too_many_connections) and hands the rest over as it takes them', async () => {
    const metrics = new Registry();
    const { p } = pool({ workers: 1, connectMaxWaiting: 3, metrics });
    await p.start([]);
    const port = (await p.serveConnect({ host: '127.0.0.1', port: 0 })).port;
    const worker = p.workerPids[0]!;
    process.kill(worker, 'SIGSTOP');
    let closed = 0;
    const sockets = Array.from({ length: 6 }, () => {
      const c = net.connect(port, '127.0.0.1');
      c.on('error', () => undefined);
      c.once('close', () => closed++);
      return c;
    });
    try {
      // one on its way, three waiting, two cut
      await waitFor('the cap to cut two', () => closed === 2);
      expect(p.connectHandoffsWaiting).toBe(3);
      expect(await metrics.metrics()).toMatch(/^herald_push_connect_refusals_total\{code="too_many_connections"\} 2$/m);
      process.kill(worker, 'SIGCONT');
      await waitFor('the worker to take the rest', () => p.connectHandoffsWaiting === 0);
      expect(closed).toBe(2);
    } finally {
      process.kill(worker, 'SIGCONT');
      for (const c of sockets) c.destroy();
    }
  });

  it('a worker that dies with dialled-in connections: its nodes read disconnected, and the agent dialling in again is pushed to where it lands', async () => {
    const { p, ev } = pool();
    // the service's part: a node's agent dialled in, its ping follows
    p.on('attach', (node) => p.notify(node, 7, 'ping'));
    await p.start([]);
    const port = (await p.serveConnect({ host: '127.0.0.1', port: 0 })).port;
    const keys = new KeySet(JSON.parse(fs.readFileSync(pkiPaths(pki.dir).jwks, 'utf8')));
    const cred = {
      ca: fs.readFileSync(pkiPaths(pki.dir).caCrt),
      cert: fs.readFileSync(pkiPaths(pki.dir).cert('agent', 'n1')),
      key: fs.readFileSync(pkiPaths(pki.dir).key('agent', 'n1')),
    };
    const first = await dialIn(port, { node: 'n1', cred, keys, controller: CONTROLLER_ID });
    open.push(first);
    const ping = await first.nextWake();
    expect(ping).toMatchObject({ reason: 'ping', gen: 7 });
    first.ack(ping, 7);
    await waitFor('n1 connected', () => p.state('n1').connected);
    // the first socket went to worker 0
    const lost = waitForEvent<{ node: string; s: PushState }>(
      ev,
      'state',
      (e) => e.node === 'n1' && e.s.state === 'disconnected',
      10_000,
    );
    process.kill(p.workerPids[0]!, 'SIGKILL');
    expect((await first.closed).code).toBe(1006);
    expect((await lost).s).toMatchObject({ connected: false, via: null, last_error: 'connection_reset' });
    const second = await dialIn(port, { node: 'n1', cred, keys, controller: CONTROLLER_ID });
    open.push(second);
    second.ack(await second.nextWake(), 7);
    p.notify('n1', 8, 'deployment');
    const wake = await second.nextWake();
    expect(wake).toMatchObject({ reason: 'deployment', gen: 8 });
    second.ack(wake, 8);
    await waitFor('n1 held again', () => p.state('n1').via === 'dialled-in' && p.state('n1').generation_acked === 8);
  });
});
