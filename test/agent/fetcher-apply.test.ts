/**
 * From fetch to signal without processes: the apply loop's rules (order, `signalled`, ids run
 * once, interrupted items), the outbox sender (durable, in order, retried, drained after a
 * restart), and a tampered fetch that must leave nothing applied.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { tlsServerOptions } from '../../certs/tls.js';
import type { MetadataDocument, MetadataItem, SignalBody } from '../../protocol/heat.js';
import { NONCE_HEADER, sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { ApplyLoop, INTERRUPTED_REASON } from '../../agent/apply.js';
import { Fetcher } from '../../agent/fetcher.js';
import type { RunItem } from '../../agent/hooks/types.js';
import { OutboxSender } from '../../agent/outbox.js';
import { OutboxStore } from '../../agent/outbox-store.js';
import { AgentState } from '../../agent/state.js';
import { makeAgentTestPki, quietLog, type AgentTestPki } from '../helpers/agent-pki.js';

const dirs: string[] = [];
const closers: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});
afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

function tmp(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-apply-'));
  dirs.push(d);
  return d;
}

function item(id: string, over: Partial<MetadataItem> = {}): MetadataItem {
  return {
    id,
    name: id,
    group: 'script',
    creation_time: '2026-01-01T00:00:00Z',
    config: '#!/bin/sh\n',
    inputs: [],
    outputs: [],
    options: {},
    deployment_id: `d-${id}`,
    revision: 1,
    signalled: false,
    ...over,
  };
}

function doc(gen: number, items: MetadataItem[]): MetadataDocument {
  return { node: 'n1', generation: gen, deployments: items };
}

interface Rig {
  state: AgentState;
  store: OutboxStore;
  outbox: OutboxSender;
  apply: ApplyLoop;
  ran: string[];
  sent: Array<{ path: string; body: SignalBody }>;
  answer: { status: number };
}

async function rig(dir = tmp(), runItem?: RunItem, answer = { status: 200 }): Promise<Rig> {
  const state = await AgentState.open(dir);
  const store = await OutboxStore.open(dir);
  const sent: Rig['sent'] = [];
  const outbox = new OutboxSender({
    store,
    log: quietLog(),
    backoffBaseMs: 5,
    backoffMaxMs: 20,
    send: async (p, body) => {
      sent.push({ path: p, body });
      return { status: answer.status };
    },
  });
  closers.push(() => outbox.stop());
  const ran: string[] = [];
  const apply = new ApplyLoop({
    node: 'n1',
    state,
    enqueue: (s) => outbox.put(s),
    log: quietLog(),
    runOptions: { runsDir: path.join(dir, 'runs') },
    loadRunItem: async () =>
      runItem ??
      (async (it) => {
        ran.push(it.id);
        return { deploy_status_code: 0, deploy_stdout: `ran ${it.id}`, deploy_stderr: '', outputs: { x: it.id } };
      }),
  });
  return { state, store, outbox, apply, ran, sent, answer };
}

describe('apply loop', () => {
  it('runs items once each, in metadata order, skipping signalled ones, and signals each result', async () => {
    const r = await rig();
    r.apply.submit(doc(3, [item('a'), item('b', { signalled: true }), item('c')]));
    await r.apply.idle();
    expect(r.ran).toEqual(['a', 'c']);
    r.apply.submit(doc(4, [item('a'), item('c'), item('d')]));
    await r.apply.idle();
    expect(r.ran).toEqual(['a', 'c', 'd']);
    await r.outbox.idle();
    expect(r.sent.map((s) => s.path)).toEqual([
      '/v1/nodes/n1/deployments/d-a/signal',
      '/v1/nodes/n1/deployments/d-c/signal',
      '/v1/nodes/n1/deployments/d-d/signal',
    ]);
    expect(r.sent[0]!.body).toEqual({
      revision: 1,
      deploy_status_code: 0,
      deploy_stdout: 'ran a',
      deploy_stderr: '',
      outputs: { x: 'a' },
    });
    expect(r.state.lastAppliedGeneration).toBe(4);
    expect(r.state.get('a')?.finished_at).toBeDefined();
  });

  it('at start, signals an item that was running when the agent died as FAILED interrupted, and never re-runs it', async () => {
    const dir = tmp();
    const before = await AgentState.open(dir);
    await before.markStarted('x', { deployment_id: 'd-x', revision: 2 });
    await before.flush();
    const r = await rig(dir);
    await r.apply.recover();
    await r.outbox.idle();
    expect(r.sent).toHaveLength(1);
    expect(r.sent[0]!.path).toBe('/v1/nodes/n1/deployments/d-x/signal');
    expect(r.sent[0]!.body).toMatchObject({ revision: 2, status_reason: INTERRUPTED_REASON });
    expect(r.sent[0]!.body.deploy_status_code).not.toBe(0);
    r.apply.submit(
      doc(5, [item('x', { deployment_id: 'd-x', revision: 2 }), item('y', { deployment_id: 'd-x', revision: 3 })]),
    );
    await r.apply.idle();
    expect(r.ran).toEqual(['y']);
  });

  it('on stop, lets a running hook finish within the grace, else aborts it and records it as interrupted', async () => {
    const dir = tmp();
    const r = await rig(dir, async (_it, opts) => {
      await new Promise<void>((resolve) => opts.signal?.addEventListener('abort', () => resolve()));
      return {
        deploy_status_code: 143,
        deploy_stdout: '',
        deploy_stderr: 'killed',
        outputs: {},
        status_reason: 'interrupted: x',
      };
    });
    r.apply.submit(doc(1, [item('slow'), item('never')]));
    await vi.waitFor(() => expect(r.state.hasRun('slow')).toBe(true));
    await r.apply.stop(50);
    await r.outbox.idle();
    expect(r.sent).toHaveLength(1);
    expect(r.sent[0]!.body).toMatchObject({ status_reason: 'interrupted', deploy_status_code: 143 });
    expect(r.state.get('slow')).toMatchObject({ interrupted: true });
    expect(r.state.hasRun('never')).toBe(false);
    expect(r.state.interruptedItems()).toEqual([]);
  });
});

describe('outbox sender', () => {
  it('keeps a signal on disk until the controller takes it, retrying in order; 404 and 409 are final', async () => {
    const dir = tmp();
    const r = await rig(dir, undefined, { status: 503 });
    await r.outbox.put({
      node: 'n1',
      deployment_id: 'd1',
      path: '/p1',
      body: { revision: 1, deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} },
    });
    await r.outbox.put({
      node: 'n1',
      deployment_id: 'd2',
      path: '/p2',
      body: { revision: 1, deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} },
    });
    await vi.waitFor(() => expect(r.sent.length).toBeGreaterThanOrEqual(3));
    expect(new Set(r.sent.map((s) => s.path))).toEqual(new Set(['/p1'])); // the head blocks the queue
    expect((await r.store.list()).map((e) => e.path)).toEqual(['/p1', '/p2']);
    await r.outbox.stop();

    // a restart drains what the last run left, in order
    const sent: string[] = [];
    const statuses = [409, 404];
    const again = new OutboxSender({
      store: await OutboxStore.open(dir),
      log: quietLog(),
      send: async (p) => {
        sent.push(p);
        return { status: statuses.shift() ?? 200 };
      },
    });
    again.kick();
    await again.idle();
    expect(sent).toEqual(['/p1', '/p2']);
    expect(await (await OutboxStore.open(dir)).list()).toEqual([]);
  });
});

describe('fetch then apply', () => {
  let pki: AgentTestPki;
  beforeAll(async () => {
    pki = await makeAgentTestPki();
  });
  afterAll(() => pki?.cleanup());

  it('a body differing by one byte from its signature is refused and nothing runs', async () => {
    const good = doc(9, [item('evil')]);
    let tamper = true;
    const s = https.createServer(tlsServerOptions(pki.material('controller', 'controller')), (req, res) => {
      const body = Buffer.from(JSON.stringify(good));
      const sig = signMetadata(pki.signer, {
        iss: pki.spiffe('controller', 'controller'),
        aud: pki.spiffe('agent', 'n1'),
        gen: 9,
        nonce: req.headers[NONCE_HEADER] as string,
        sha256: sha256b64url(body),
        nowS: Date.now() / 1000,
      });
      if (tamper) body[body.indexOf('evil')] = 'E'.charCodeAt(0);
      res.writeHead(200, { etag: '"9"', 'herald-signature': sig });
      res.end(body);
    });
    s.listen(0, '127.0.0.1');
    await once(s, 'listening');
    closers.push(
      () =>
        new Promise<void>((r) => {
          s.closeAllConnections();
          s.close(() => r());
        }),
    );
    const r = await rig();
    const f = new Fetcher({
      controllerUrl: `https://127.0.0.1:${(s.address() as { port: number }).port}`,
      node: 'n1',
      material: pki.material('agent', 'n1'),
      controllerSpiffeId: pki.spiffe('controller', 'controller'),
      lastAppliedGen: () => r.state.lastAppliedGeneration,
      log: quietLog(),
    });
    closers.push(() => f.close());
    // the same wiring as agent/main.ts: only a verified document reaches the apply loop
    const fetchAndApply = async (): Promise<string | undefined> => {
      try {
        const res = await f.fetchMetadata();
        if (res.status === 200) r.apply.submit(res.document);
        return undefined;
      } catch (err) {
        return (err as { code?: string }).code;
      }
    };
    expect(await fetchAndApply()).toBe('digest_mismatch');
    await r.apply.idle();
    expect(r.ran).toEqual([]);
    tamper = false;
    expect(await fetchAndApply()).toBeUndefined();
    await r.apply.idle();
    expect(r.ran).toEqual(['evil']);
  });
});
