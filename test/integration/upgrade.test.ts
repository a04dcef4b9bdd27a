/**
 * Upgrades with real processes (docs/api.md "Upgrades", "Revisions", "Rollouts"): a controller
 * and six agents started through `bin/herald`, a master group of three and a worker group of
 * three, configs in versions. Each rule is checked from what the nodes' scripts logged: new
 * configs rolled in group order within the window (the masters' quorum held though
 * max_unavailable is larger, restarts too), canaries promoted automatically and by hand, a
 * failing health check reverting every changed node to the stable revision, pause and abort
 * stopping new nodes, a progress deadline ending a rollout whose node never answers, and an
 * external gate (an HTTPS URL and a Prometheus query, over real TLS) stopping a rollout and
 * failing closed when it cannot be read.
 */
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, isBuilt, killAll, waitFor } from '../helpers/procs.js';
import { makeUpgradeBed, mostAtOnce, spans, type Run, type UpgradeBed } from '../helpers/upgrade-bed.js';

const MASTERS = ['m1', 'm2', 'm3'];
const WORKERS = ['w1', 'w2', 'w3'];
const OP = 'spiffe://herald.local/operator/admin';

let b: UpgradeBed;
/** The gate: its answer now, and when each request came (epoch ms). */
let gateServer: https.Server;
let gatePort: number;
const gate = { status: 503, series: 1, asked: [] as number[] };

const names = (rs: Run[], node: string) => rs.filter((r) => r.node === node).map((r) => `${r.name}:${r.action}`);
const patch = (body: unknown, group?: string) =>
  b.send('PATCH', group ? `/v1/clusters/${b.id}/nodegroups/${group}` : `/v1/clusters/${b.id}`, body);
const control = (what: string, body?: unknown) => b.send('PATCH', `/v1/clusters/${b.id}/actions/${what}`, body);
const cfg = (name: string) => b.configs[name]!;
/** The install and uninstall configs of version `v`. */
const version = (v: number) => ({
  install_config_id: cfg(`install-v${v}`),
  uninstall_config_id: cfg(`uninstall-v${v}`),
});
const started = (from: number, name: string, node: string) =>
  waitFor(
    `${name} to start on ${node}`,
    () => b.runs(from).some((r) => r.name === name && r.node === node),
    20_000,
    20,
  );
const phase = async (): Promise<any> => (await b.cluster()).rollout?.state;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  b = await makeUpgradeBed({
    masters: MASTERS,
    workers: WORKERS,
    versions: 10,
    controllerEnv: (pki) => ({ ...process.env, NODE_EXTRA_CA_CERTS: path.join(pki, 'ca.crt') }),
  });
  // the gate: real TLS, with a certificate of the cluster CA for 127.0.0.1 (the controller's)
  const pki = path.join(b.work, 'pki');
  gateServer = https.createServer(
    {
      cert: fs.readFileSync(path.join(pki, 'controller', 'controller.crt')),
      key: fs.readFileSync(path.join(pki, 'controller', 'controller.key')),
    },
    (req, res) => {
      gate.asked.push(Date.now());
      if (req.url?.startsWith('/api/v1/query')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        const result = Array.from({ length: gate.series }, () => ({
          metric: { alertname: 'Burning' },
          value: [0, '1'],
        }));
        res.end(JSON.stringify({ status: 'success', data: { resultType: 'vector', result } }));
      } else {
        res.writeHead(gate.status);
        res.end();
      }
    },
  );
  await new Promise<void>((resolve) => gateServer.listen(0, '127.0.0.1', resolve));
  gatePort = (gateServer.address() as AddressInfo).port;
}, 240_000);

afterAll(async () => {
  gateServer?.close();
  await killAll();
  b?.c.cleanup();
});

describe('upgrades with real agents (docs/api.md)', () => {
  it('a dry run shows the plan (the masters at their quorum whatever max_unavailable says) and runs nothing', async () => {
    const before = b.lineCount();
    const r = await patch({ ...version(2), input_values: { version: '2' }, max_unavailable: 3, dry_run: true });
    expect(r.status, r.raw).toBe(200);
    expect(r.json).toMatchObject({ dry_run: true, new_revision: true, revision: 2, from_revision: 1 });
    expect(r.json.nodegroups.map((g: any) => [g.name, g.nodes, g.max_unavailable, g.quorum_max_unavailable])).toEqual([
      ['masters', MASTERS, 1, 1],
      ['workers', WORKERS, 3, undefined],
    ]);
    const forced = await patch({ ...version(2), max_unavailable: 3, force: true, dry_run: true });
    expect(forced.json.nodegroups[0].max_unavailable).toBe(3);
    expect(b.lineCount()).toBe(before);
    const cl = await b.cluster();
    expect(cl).toMatchObject({ status: 'CREATE_COMPLETE', revision: 1 });
  });

  it('rolls new configs in group order within the window: old uninstall, new install, health check; the revision is stable', async () => {
    const from = b.lineCount();
    const r = await patch({
      ...version(2),
      input_values: { version: '2' },
      max_unavailable: 2,
      health_config_id: cfg('check'),
    });
    expect(r.status, r.raw).toBe(202);
    expect(r.json).toMatchObject({ status: 'UPDATE_IN_PROGRESS', revision: 2, operation: 'update' });
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    const rs = b.runs(from);
    for (const n of b.nodes)
      expect(names(rs, n), n).toEqual(['uninstall-v1:UPDATE', 'install-v2:UPDATE', 'check:CHECK']);
    const sp = spans(rs);
    expect(mostAtOnce(sp, MASTERS)).toBe(1); // the quorum of three masters, though max_unavailable is 2
    expect(mostAtOnce(sp, WORKERS)).toBe(2);
    expect(Math.min(...WORKERS.map((n) => sp.get(n)!.start))).toBeGreaterThan(
      Math.max(...MASTERS.map((n) => sp.get(n)!.end)),
    );
    const cl = await b.cluster();
    expect(cl.counters).toEqual({ targeted: 6, completed: 6, failed: 0, timed_out: 0, in_flight: 0, reverted: 0 });
    expect(cl.nodes.every((n: any) => n.revision === 2)).toBe(true);
    const d = (await b.send('GET', `/v1/deployments/${cl.nodes[0].install_deployment_id}`)).json;
    expect(d).toMatchObject({ config_id: cfg('install-v2'), input_values: { version: '2' } });
    const revs = (await b.send('GET', `/v1/clusters/${b.id}/revisions`)).json.items;
    expect(revs.map((x: any) => [x.revision, x.stable, x.current])).toEqual([
      [1, true, false],
      [2, true, true],
    ]);
    expect(revs[1]).toMatchObject({
      install_config_id: cfg('install-v2'),
      created_by: OP,
      input_values: { version: '2' },
    });
  });

  it('a restart keeps the masters quorum too, whatever max_unavailable says', async () => {
    const from = b.lineCount();
    const r = await b.send('PATCH', `/v1/clusters/${b.id}/actions/restart`, {
      max_unavailable: 3,
      nodegroups: ['masters'],
    });
    expect(r.status, r.raw).toBe(204);
    expect(await b.ended()).toBe('RESTART_COMPLETE');
    const rs = b.runs(from);
    expect(new Set(rs.map((x) => x.node))).toEqual(new Set(MASTERS));
    expect(mostAtOnce(spans(rs), MASTERS)).toBe(1);
  });

  it('canaries go first (one per group), then auto_promote_s after they completed the others go', async () => {
    const from = b.lineCount();
    const r = await patch({ ...version(3), canary: 1, auto_promote_s: 1, max_unavailable: 3 });
    expect(r.status, r.raw).toBe(202);
    expect(r.json.rollout.canaries).toEqual(['m1', 'w1']);
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    const sp = spans(b.runs(from));
    const canaryEnd = Math.max(sp.get('m1')!.end, sp.get('w1')!.end);
    const others = ['m2', 'm3', 'w2', 'w3'].map((n) => sp.get(n)!.start);
    expect(Math.min(...others) - canaryEnd).toBeGreaterThanOrEqual(1000);
    expect(sp.get('w1')!.start).toBeGreaterThan(sp.get('m1')!.end); // groups in order, canaries too
    expect((await b.cluster()).rollout.state.promoted.by).toBe('auto');
  });

  it("a group's canary waits for an operator's promotion; the promotion is audited with who", async () => {
    const from = b.lineCount();
    const r = await patch({ ...version(4), canary: 1 }, 'workers');
    expect(r.status, r.raw).toBe(202);
    await waitFor(
      'the canary to wait for promotion',
      async () => (await phase())?.phase === 'awaiting_promotion',
      20_000,
      50,
    );
    // the ticks go on: still nothing but the canary
    await new Promise((res) => setTimeout(res, 1500));
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(['w1']));
    expect((await b.cluster()).status).toBe('UPDATE_IN_PROGRESS');
    const p = await control('promote');
    expect(p.status, p.raw).toBe(200);
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    const rs = b.runs(from);
    expect(new Set(rs.map((x) => x.node))).toEqual(new Set(WORKERS));
    for (const n of WORKERS) expect(names(rs, n)).toEqual(['uninstall-v3:UPDATE', 'install-v4:UPDATE']);
    const audit = (await b.send('GET', '/v1/audit?limit=20')).json.items;
    expect(audit.find((a: any) => a.action === 'cluster.promote')).toMatchObject({ who: OP, target: b.id });
    expect((await control('promote')).json.error.code).toBe('no_operation');
  });

  it('a failing health check with on_failure revert brings every changed node back to the stable revision; UPDATE_FAILED names them', async () => {
    const from = b.lineCount();
    b.flag('check-fail-w2-v5');
    try {
      const r = await patch(
        { ...version(5), on_failure: 'revert', health_config_id: cfg('check'), max_unavailable: 1 },
        'workers',
      );
      expect(r.status, r.raw).toBe(202);
      expect(r.json.rollout.stable_revision).toBe(4);
      expect(await b.ended()).toBe('UPDATE_FAILED');
    } finally {
      b.unflag('check-fail-w2-v5');
    }
    const rs = b.runs(from);
    const back = [
      'uninstall-v4:UPDATE',
      'install-v5:UPDATE',
      'check:CHECK',
      'uninstall-v5:UPDATE',
      'install-v4:UPDATE',
      'check:CHECK',
    ];
    expect(names(rs, 'w1')).toEqual(back);
    expect(names(rs, 'w2')).toEqual(back);
    expect(names(rs, 'w3')).toEqual([]);
    const cl = await b.cluster();
    expect(cl.status_reason).toMatch(/^update failed on w2: check: /);
    expect(cl.status_reason).toMatch(/reverted to revision 4: w1, w2/);
    expect(cl.counters).toMatchObject({ targeted: 3, failed: 1, reverted: 2, in_flight: 0 });
    expect(cl.rollout.state.revert).toMatchObject({ revision: 4, nodes: ['w1', 'w2'] });
    for (const n of cl.nodegroups.find((g: any) => g.name === 'workers').nodes) {
      expect(n.revision).toBe(4);
      const d = (await b.send('GET', `/v1/deployments/${n.install_deployment_id}`)).json;
      expect(d.config_id, n.node).toBe(cfg('install-v4'));
    }
    const revs = (await b.send('GET', `/v1/clusters/${b.id}/revisions`)).json.items;
    expect(revs.at(-1)).toMatchObject({ revision: 5, stable: false, current: true });
  });

  it('pause stops new nodes from starting (the one in flight finishes); resume goes on', async () => {
    const from = b.lineCount();
    b.flag('install-v5-gate-w1');
    const r = await patch({ ...version(5), max_unavailable: 1 }, 'workers'); // the same revision, rolled again
    expect(r.status, r.raw).toBe(202);
    expect(r.json.revision).toBe(5);
    await started(from, 'install-v5', 'w1');
    const p = await control('pause');
    expect(p.status, p.raw).toBe(200);
    expect(p.json.rollout.state.paused).toMatchObject({ by: OP });
    b.unflag('install-v5-gate-w1');
    await waitFor('w1 to finish', async () => (await b.cluster()).counters.in_flight === 0, 20_000, 50);
    await new Promise((res) => setTimeout(res, 1500));
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(['w1']));
    expect((await phase()).phase).toBe('paused');
    expect((await control('resume')).status).toBe(200);
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(WORKERS));
  });

  it('abort stops new nodes from starting; the rollout ends UPDATE_FAILED once the node in flight finished', async () => {
    const from = b.lineCount();
    b.flag('install-v6-gate-w1');
    const r = await patch({ ...version(6), max_unavailable: 1 }, 'workers');
    expect(r.status, r.raw).toBe(202);
    await started(from, 'install-v6', 'w1');
    const a = await control('abort');
    expect(a.status, a.raw).toBe(200);
    expect((await b.cluster()).status).toBe('UPDATE_IN_PROGRESS');
    b.unflag('install-v6-gate-w1');
    expect(await b.ended()).toBe('UPDATE_FAILED');
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(['w1']));
    const cl = await b.cluster();
    expect(cl.status_reason).toBe(`update aborted by ${OP} (2 node(s) not started)`);
    const audit = (await b.send('GET', '/v1/audit?limit=30')).json.items.map((x: any) => [x.action, x.who]);
    for (const what of ['cluster.pause', 'cluster.resume', 'cluster.abort']) expect(audit).toContainEqual([what, OP]);
  });

  it('a progress deadline ends a rollout whose node never answers', async () => {
    const from = b.lineCount();
    b.flag('install-v7-gate-w1');
    try {
      const r = await patch({ ...version(7), max_unavailable: 1, progress_deadline_s: 2 }, 'workers');
      expect(r.status, r.raw).toBe(202);
      expect(await b.ended(undefined, 30_000)).toBe('UPDATE_FAILED');
    } finally {
      b.unflag('install-v7-gate-w1');
    }
    const cl = await b.cluster();
    expect(cl.status_reason).toMatch(/no progress within the progress deadline \(2 s\)/);
    expect(cl.nodes.find((n: any) => n.node === 'w1')).toMatchObject({ phase: 'failed' });
    expect(cl.counters).toMatchObject({ failed: 1, timed_out: 1, in_flight: 0 });
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(['w1']));
  });

  it('an HTTPS gate that says stop holds the rollout; once it says go each new node waits for a new answer', async () => {
    const from = b.lineCount();
    gate.status = 503;
    gate.asked.length = 0;
    const r = await patch(
      { ...version(8), max_unavailable: 1, gate: { url: `https://127.0.0.1:${gatePort}/ready` } },
      'workers',
    );
    expect(r.status, r.raw).toBe(202);
    await waitFor('the gate to say stop', async () => (await phase())?.gate?.verdict === 'stop', 20_000, 50);
    expect((await phase()).gate).toMatchObject({ verdict: 'stop', detail: 'HTTP 503', error: false });
    expect(b.runs(from)).toEqual([]);
    gate.status = 200;
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    // before each node's start the gate was asked again
    const starts = WORKERS.map((n) => spans(b.runs(from)).get(n)!.start).sort((x, y) => x - y);
    let prev = 0;
    for (const s of starts) {
      expect(gate.asked.some((t) => t > prev && t <= s)).toBe(true);
      prev = s;
    }
  });

  it('a Prometheus query with a result stops the rollout; an empty one lets it go', async () => {
    const from = b.lineCount();
    gate.series = 2;
    const r = await patch(
      {
        ...version(9),
        gate: { prometheus: `https://127.0.0.1:${gatePort}`, query: 'ALERTS{alertstate="firing"}' },
      },
      'workers',
    );
    expect(r.status, r.raw).toBe(202);
    await waitFor('the query to say stop', async () => (await phase())?.gate?.verdict === 'stop', 20_000, 50);
    expect((await phase()).gate.detail).toBe('the query has 2 series');
    expect(b.runs(from)).toEqual([]);
    gate.series = 0;
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
  });

  it('a gate that cannot be read stops the rollout (fail closed) unless fail_open', async () => {
    const from = b.lineCount();
    const closed = await freePort(); // nothing listens there
    const r = await patch({ ...version(10), gate: { url: `https://127.0.0.1:${closed}/ready` } }, 'workers');
    expect(r.status, r.raw).toBe(202);
    await waitFor('the gate to be unreadable', async () => (await phase())?.gate?.error === true, 20_000, 50);
    expect((await phase()).gate).toMatchObject({ verdict: 'stop', error: true });
    expect((await phase()).gate.detail).toMatch(/^cannot be read: ECONNREFUSED/);
    expect(b.runs(from)).toEqual([]);
    expect((await control('abort')).status).toBe(200);
    expect(await b.ended()).toBe('UPDATE_FAILED');
    const open = await patch(
      { ...version(10), gate: { url: `https://127.0.0.1:${closed}/ready`, fail_open: true } },
      'workers',
    );
    expect(open.status, open.raw).toBe(202);
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    expect(new Set(b.runs(from).map((x) => x.node))).toEqual(new Set(WORKERS));
  });
});
