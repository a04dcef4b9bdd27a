/**
 * Cluster operations (docs/api.md "Clusters") through the API, with simulated agents that fetch
 * their metadata and signal each item they have not run: create, restart in a sliding window,
 * failure and repair, step deadlines, delete. The SIGKILL-mid-restart case runs a real process.
 * Clusters of more than 10,000 nodes go through the store directly (a real SQLite file).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { request, startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';
import { controllerBuilt, startControllerProcess } from '../helpers/controller-process.js';
import { ClusterEngine } from '../../controller/clusters/engine.js';
import { recordSignal } from '../../controller/service/signal.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import type { ChangeSet, ClusterRecord, StoreTx } from '../../controller/store/store.js';

const GENEROUS = { burst: 100_000, perS: 100_000 };
const NODES = ['c1', 'c2', 'c3', 'c4', 'c5'];

interface Run {
  node: string;
  step: 'install' | 'uninstall';
  action: string;
  itemId: string;
  at: number;
}

/** Agents that run each unsignalled item once (remembering item ids, as the real agent does). */
class FakeAgents {
  readonly ran = new Set<string>();
  readonly runs: Run[] = [];
  /** Most nodes seen with unsignalled work at once. */
  maxBusy = 0;
  fail: (r: Run) => boolean = () => false;
  silent = new Set<string>();

  constructor(
    readonly call: (cred: Cred, method: string, p: string, body?: unknown) => Promise<{ status: number; json: any }>,
    readonly creds: Map<string, Cred>,
  ) {}

  async pass(): Promise<void> {
    // a snapshot of every node first (only these agents move the restart on), then the runs
    const snapshot: Array<[string, Cred, any[]]> = [];
    for (const [node, cred] of this.creds) {
      const md = await this.call(cred, 'GET', `/v1/nodes/${node}/metadata`);
      if (md.status !== 200) continue;
      const pending = (md.json.deployments as any[]).filter((i) => !i.signalled);
      expect(pending.length, `${node} has uninstall and install pending at once`).toBeLessThanOrEqual(1);
      snapshot.push([node, cred, pending]);
    }
    this.maxBusy = Math.max(this.maxBusy, snapshot.filter(([, , p]) => p.length > 0).length);
    for (const [node, cred, pending] of snapshot) {
      if (this.silent.has(node)) continue;
      for (const item of pending) {
        if (this.ran.has(item.id)) continue;
        this.ran.add(item.id);
        const action = item.inputs.find((i: { name: string }) => i.name === 'deploy_action').value as string;
        const run: Run = {
          node,
          step: item.name.endsWith('-uninstall') ? 'uninstall' : 'install',
          action,
          itemId: item.id,
          at: Date.now(),
        };
        this.runs.push(run);
        const failed = this.fail(run);
        const r = await this.call(cred, 'POST', `/v1/nodes/${node}/deployments/${item.deployment_id}/signal`, {
          revision: item.revision,
          deploy_status_code: failed ? 1 : 0,
          deploy_stdout: '',
          deploy_stderr: failed ? 'exploded' : '',
          outputs: {},
        });
        expect([200, 404, 409]).toContain(r.status);
      }
    }
  }

  /** Passes until the cluster's status is one of `want`. */
  async until(getStatus: () => Promise<string>, want: string[], ms = 20_000): Promise<string> {
    return waitFor(
      `cluster ${want.join('|')}`,
      async () => {
        await this.pass();
        const s = await getStatus();
        return want.includes(s) ? s : null;
      },
      ms,
    );
  }
}

let pki: ControllerTestPki;
let creds: Map<string, Cred>;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  creds = new Map();
  for (const n of NODES) creds.set(n, await pki.issueAgent(n));
});

afterAll(() => pki?.cleanup());

describe('clusters in-process', () => {
  let t: TestController;
  let op: Cred;
  let install: string, uninstall: string, failingInstall: string, slowInstall: string, slowUninstall: string;

  beforeAll(async () => {
    op = pki.cred('operator', 'admin');
    t = await startTestController(
      pki,
      {},
      { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS }, stepMarginS: 0, clusterTickMs: 50 },
    );
    for (const n of NODES)
      expect(
        (await t.req(creds.get(n)!, 'PUT', `/v1/nodes/${n}/endpoint`, { url: 'wss://127.0.0.1:7443/v1/wake' })).status,
      ).toBe(200);
    const mk = async (name: string, extra: Record<string, unknown> = {}) =>
      (await t.req(op, 'POST', '/v1/configs', { name, group: 'script', config: '#!/bin/sh\n', ...extra })).json
        .id as string;
    install = await mk('install', { inputs: [{ name: 'token', hidden: true }] });
    uninstall = await mk('uninstall');
    failingInstall = await mk('install-bad');
    slowInstall = await mk('install-slow', { options: { timeout: 1 } });
    slowUninstall = await mk('uninstall-slow', { options: { timeout: 1 } });
  });

  afterAll(async () => {
    await t?.close();
  });

  const status = (id: string) => async () => (await t.req(op, 'GET', `/v1/clusters/${id}`)).json.status as string;

  async function createCluster(
    name: string,
    nodes: string[],
    installId = install,
    uninstallId = uninstall,
  ): Promise<{ id: string; agents: FakeAgents }> {
    const withToken = installId === install; // only that config declares the hidden input
    const r = await t.req(op, 'POST', '/v1/clusters', {
      name,
      nodes,
      install_config_id: installId,
      uninstall_config_id: uninstallId,
      ...(withToken ? { input_values: { token: 's3cr3t-token' } } : {}),
    });
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    expect(r.headers.location).toBe(`/v1/clusters/${r.json.id}`);
    expect(r.json).toMatchObject({
      name,
      status: 'CREATE_IN_PROGRESS',
      input_values: withToken ? { token: '***' } : {},
    });
    expect(r.json.nodes.map((n: { phase: string }) => n.phase)).toEqual(nodes.map(() => 'installing'));
    // no uninstall deployment until a node's first uninstall
    expect(r.json.nodes.map((n: { uninstall_deployment_id: unknown }) => n.uninstall_deployment_id)).toEqual(
      nodes.map(() => null),
    );
    const agents = new FakeAgents((c, m, p, b) => t.req(c, m, p, b), new Map(nodes.map((n) => [n, creds.get(n)!])));
    expect(await agents.until(status(r.json.id), ['CREATE_COMPLETE', 'CREATE_FAILED'])).toBe('CREATE_COMPLETE');
    return { id: r.json.id, agents };
  }

  it('validates cluster bodies', async () => {
    const base = { name: 'v', nodes: ['c1'], install_config_id: install, uninstall_config_id: uninstall };
    expect((await t.req(op, 'POST', '/v1/clusters', { ...base, nodes: ['ghost'] })).json.error).toMatchObject({
      code: 'unknown_node',
      field: 'nodes.0',
    });
    expect((await t.req(op, 'POST', '/v1/clusters', { ...base, install_config_id: 'nope' })).json.error).toMatchObject({
      code: 'unknown_config',
      field: 'install_config_id',
    });
    expect((await t.req(op, 'POST', '/v1/clusters', { ...base, nodes: [] })).json.error).toMatchObject({
      code: 'invalid_request',
      field: 'nodes',
    });
    expect((await t.req(op, 'POST', '/v1/clusters', { ...base, nodes: ['c1', 'c1'] })).json.error).toMatchObject({
      code: 'invalid_request',
      field: 'nodes',
    });
    expect((await t.req(op, 'PATCH', '/v1/clusters/nope/actions/restart')).json.error.code).toBe('not_found');
  });

  it('refuses a node that already belongs to another cluster (cluster_busy, naming the field)', async () => {
    const { id, agents } = await createCluster('first', ['c1']);
    const second = await t.req(op, 'POST', '/v1/clusters', {
      name: 'second',
      nodes: ['c2', 'c1'],
      install_config_id: install,
      uninstall_config_id: uninstall,
    });
    expect(second.status).toBe(409);
    expect(second.json.error).toMatchObject({ code: 'cluster_busy', field: 'nodes.1' });
    expect((await t.req(op, 'DELETE', `/v1/clusters/${id}`)).status).toBe(202);
    await agents.until(
      async () => ((await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404 ? 'gone' : 'there'),
      ['gone'],
    );
  });

  it('restarts 5 nodes: 204, 409 while running, uninstall before install on each, RESTART everywhere', async () => {
    const { id, agents } = await createCluster('k8s', NODES);
    const wakes = t.push.notified.length;
    const r = await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`);
    expect(r.status).toBe(204);
    expect(r.text).toBe('');
    expect(t.push.notified.slice(wakes).every((w) => w.reason === 'restart')).toBe(true);
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`)).json.error.code).toBe(
      'restart_in_progress',
    );
    expect((await t.req(op, 'DELETE', `/v1/clusters/${id}`)).json.error.code).toBe('restart_in_progress');
    const mark = agents.runs.length;
    expect(await agents.until(status(id), ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_COMPLETE');
    const runs = agents.runs.slice(mark);
    for (const n of NODES) {
      const mine = runs.filter((x) => x.node === n);
      expect(
        mine.map((x) => `${x.step}:${x.action}`),
        n,
      ).toEqual(['uninstall:RESTART', 'install:RESTART']);
    }
    const c = (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
    for (const n of c.nodes) {
      expect(n.phase).toBe('complete');
      expect(Date.parse(n.uninstall_finished_at)).toBeLessThanOrEqual(Date.parse(n.install_started_at));
      // the uninstall deployment the restart made: its first revision the restart's, run and signalled
      const u = (await t.req(op, 'GET', `/v1/deployments/${n.uninstall_deployment_id}`)).json;
      expect(u).toMatchObject({ name: 'k8s-uninstall', revision: 1, action: 'RESTART', status: 'COMPLETE' });
    }
    // deployments of a cluster are not changed by hand
    const dep = c.nodes[0].install_deployment_id;
    expect((await t.req(op, 'PATCH', `/v1/deployments/${dep}`, {})).json.error.code).toBe('deployment_busy');
    expect((await t.req(op, 'DELETE', '/v1/nodes/c1')).json.error.code).toBe('node_in_cluster');
    expect((await t.req(op, 'GET', '/v1/clusters')).json.items.some((x: { id: string }) => x.id === id)).toBe(true);
    // a restart from a COMPLETE state again is fine; leave it finished for the next tests
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`, { max_unavailable: 5 })).status).toBe(204);
    expect(await agents.until(status(id), ['RESTART_COMPLETE'])).toBe('RESTART_COMPLETE');
    // delete: uninstall (DELETE) everywhere, then removed
    const del = await t.req(op, 'DELETE', `/v1/clusters/${id}`);
    expect(del.status).toBe(202);
    expect(del.json.status).toBe('DELETE_IN_PROGRESS');
    const mark2 = agents.runs.length;
    await waitFor('cluster removed', async () => {
      await agents.pass();
      return (await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404;
    });
    expect(
      agents.runs
        .slice(mark2)
        .map((x) => `${x.step}:${x.action}`)
        .sort(),
    ).toEqual(NODES.map(() => 'uninstall:DELETE'));
    expect((await t.req(op, 'GET', `/v1/deployments/${dep}`)).status).toBe(404);
  });

  it('max_unavailable 2 never has more than 2 nodes in a step at once', async () => {
    const { id, agents } = await createCluster('window', NODES);
    agents.maxBusy = 0;
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`, { max_unavailable: 2 })).status).toBe(204);
    const c0 = (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
    expect(c0.max_unavailable).toBe(2);
    expect(c0.nodes.filter((n: { phase: string }) => n.phase === 'uninstalling').length).toBe(2);
    expect(await agents.until(status(id), ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_COMPLETE');
    expect(agents.maxBusy).toBeLessThanOrEqual(2);
    const c = (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
    const spans = c.nodes.map(
      (n: any) => [Date.parse(n.uninstall_started_at), Date.parse(n.install_finished_at)] as const,
    );
    for (const [s] of spans) {
      const inside = spans.filter(([a, b]: readonly [number, number]) => a <= s && s < b).length;
      expect(inside).toBeLessThanOrEqual(2);
    }
    await t.req(op, 'DELETE', `/v1/clusters/${id}`);
    await waitFor('removed', async () => {
      await agents.pass();
      return (await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404;
    });
  });

  it('a failing install makes RESTART_FAILED naming the node, later nodes untouched; a restart repairs', async () => {
    const { id, agents } = await createCluster('fails', NODES);
    agents.fail = (r) => r.node === 'c3' && r.step === 'install' && r.action === 'RESTART';
    const mark = agents.runs.length;
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`, { max_unavailable: 1 })).status).toBe(204);
    expect(await agents.until(status(id), ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_FAILED');
    const c = (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
    expect(c.status_reason).toContain('c3');
    const phases = Object.fromEntries(c.nodes.map((n: { node: string; phase: string }) => [n.node, n.phase]));
    expect(phases).toEqual({ c1: 'complete', c2: 'complete', c3: 'failed', c4: 'pending', c5: 'pending' });
    expect(c.nodes.find((n: { node: string }) => n.node === 'c3').reason).toMatch(/^install: /);
    expect(agents.runs.slice(mark).filter((r) => r.node === 'c4' || r.node === 'c5')).toEqual([]);
    // the repair
    agents.fail = () => false;
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`)).status).toBe(204);
    expect(await agents.until(status(id), ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_COMPLETE');
    await t.req(op, 'DELETE', `/v1/clusters/${id}`);
    await waitFor('removed', async () => {
      await agents.pass();
      return (await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404;
    });
  });

  it('an agent that never answers fails its step at the deadline instead of hanging the restart', async () => {
    const { id, agents } = await createCluster('deadline', ['c1', 'c2'], slowInstall, slowUninstall);
    agents.silent.add('c2');
    const t0 = Date.now();
    expect((await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`)).status).toBe(204);
    expect(await agents.until(status(id), ['RESTART_COMPLETE', 'RESTART_FAILED'], 10_000)).toBe('RESTART_FAILED');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    const c = (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
    const c2 = c.nodes.find((n: { node: string }) => n.node === 'c2');
    expect(c2.phase).toBe('failed');
    expect(c2.reason).toMatch(/deadline/);
    expect(c.nodes.find((n: { node: string }) => n.node === 'c1').phase).toBe('complete');
    // the timed-out revision holds its (FAILED) result, so a late signal is a duplicate
    const dep = (await t.req(op, 'GET', `/v1/deployments/${c2.uninstall_deployment_id}`)).json;
    expect(dep).toMatchObject({ status: 'FAILED', signalled: true });
    agents.silent.clear();
    await t.req(op, 'DELETE', `/v1/clusters/${id}`);
    await waitFor('removed', async () => {
      await agents.pass();
      return (await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404;
    });
  });

  it('a failing create is CREATE_FAILED, and a restart from it repairs', async () => {
    const r = await t.req(op, 'POST', '/v1/clusters', {
      name: 'badcreate',
      nodes: ['c4', 'c5'],
      install_config_id: failingInstall,
      uninstall_config_id: uninstall,
    });
    const agents = new FakeAgents(
      (c, m, p, b) => t.req(c, m, p, b),
      new Map(['c4', 'c5'].map((n) => [n, creds.get(n)!])),
    );
    agents.fail = (x) => x.node === 'c5' && x.action === 'CREATE';
    expect(await agents.until(status(r.json.id), ['CREATE_COMPLETE', 'CREATE_FAILED'])).toBe('CREATE_FAILED');
    agents.fail = () => false;
    expect((await t.req(op, 'PATCH', `/v1/clusters/${r.json.id}/actions/restart`)).status).toBe(204);
    expect(await agents.until(status(r.json.id), ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_COMPLETE');
    expect(t.logText()).not.toContain('s3cr3t-token');
  });
});

describe('clusters across SIGKILL (real process)', () => {
  it('carries a restart on after the controller is killed mid-way, never re-running a finished step', async () => {
    if (!controllerBuilt()) throw new Error('run `npm run build` first');
    const work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ctl-cl-'));
    const db = path.join(work, 'c.db');
    const log = path.join(work, 'c.log');
    const op = pki.cred('operator', 'admin');
    try {
      let proc = await startControllerProcess(['--pki', pki.dir, '--db', db], log);
      let port = proc.port;
      const call = (c: Cred, m: string, p: string, b?: unknown) => request(port, c, m, p, b);
      for (const n of NODES)
        expect(
          (await call(creds.get(n)!, 'PUT', `/v1/nodes/${n}/endpoint`, { url: 'wss://127.0.0.1:7443/v1/wake' })).status,
        ).toBe(200);
      const mk = async (name: string) =>
        (await call(op, 'POST', '/v1/configs', { name, group: 'script', config: '#!/bin/sh\n' })).json.id as string;
      const [ins, unins] = [await mk('install'), await mk('uninstall')];
      const cl = (
        await call(op, 'POST', '/v1/clusters', {
          name: 'k',
          nodes: NODES,
          install_config_id: ins,
          uninstall_config_id: unins,
        })
      ).json;
      const agents = new FakeAgents(call, creds);
      const status = async () => (await call(op, 'GET', `/v1/clusters/${cl.id}`)).json.status as string;
      expect(await agents.until(status, ['CREATE_COMPLETE'])).toBe('CREATE_COMPLETE');
      const mark = agents.runs.length;
      expect((await call(op, 'PATCH', `/v1/clusters/${cl.id}/actions/restart`, { max_unavailable: 2 })).status).toBe(
        204,
      );
      // run until at least one node has finished and some are still to go, then kill
      await waitFor('a node done mid-restart', async () => {
        await agents.pass();
        const c = (await call(op, 'GET', `/v1/clusters/${cl.id}`)).json;
        return (
          c.nodes.some((n: { phase: string }) => n.phase === 'complete') &&
          c.nodes.some((n: { phase: string }) => n.phase !== 'complete')
        );
      });
      expect((await proc.kill('SIGKILL')).signal).toBe('SIGKILL');
      proc = await startControllerProcess(['--pki', pki.dir, '--db', db], log);
      port = proc.port;
      expect(await agents.until(status, ['RESTART_COMPLETE', 'RESTART_FAILED'])).toBe('RESTART_COMPLETE');
      const runs = agents.runs.slice(mark);
      for (const n of NODES)
        expect(
          runs.filter((r) => r.node === n).map((r) => r.step),
          n,
        ).toEqual(['uninstall', 'install']);
      const c = (await call(op, 'GET', `/v1/clusters/${cl.id}`)).json;
      for (const n of c.nodes) {
        // one RESTART (the uninstall made by the restart); CREATE + one RESTART: no finished step made again
        expect(
          (await call(op, 'GET', `/v1/deployments/${n.uninstall_deployment_id}/revisions`)).json.items.length,
        ).toBe(1);
        expect((await call(op, 'GET', `/v1/deployments/${n.install_deployment_id}/revisions`)).json.items.length).toBe(
          2,
        );
      }
      await proc.kill('SIGTERM');
    } finally {
      fs.rmSync(work, { recursive: true, force: true });
    }
  });
});

describe('large clusters in the store (real SQLite file)', () => {
  const WHO = 'spiffe://herald.local/operator/admin';
  /** More than the 10,000 plan rounds the store once allowed one cluster in one transaction. */
  const BIG = 10_001;
  const T0 = Date.parse('2030-01-01T00:00:00Z');
  const STEP_MS = 10_000; // the configs' hook timeout (10 s); no margin
  let work: string;
  let store: SqliteStore;
  let engine: ClusterEngine;

  const ok = (revision: number, code = 0) => ({
    revision,
    deployStatusCode: code,
    deployStdout: '',
    deployStderr: code === 0 ? '' : 'exploded',
    outputs: {},
  });
  const names = (n: number) => Array.from({ length: n }, (_, i) => `n${String(i).padStart(5, '0')}`);

  /** A store on a file with `n` nodes and an install and an uninstall config (timeout `timeoutS`). */
  async function open(
    n: number,
    o: { timeoutS?: number; stepMarginS?: number } = {},
  ): Promise<{ nodes: string[]; install: string; uninstall: string }> {
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-big-cluster-'));
    store = new SqliteStore(path.join(work, 'h.db'), { now: () => T0 });
    engine = new ClusterEngine({ stepMarginS: o.stepMarginS ?? 0 });
    const nodes = names(n);
    await store.transaction(async (tx) => {
      for (const node of nodes) await tx.createNode(node, null, WHO);
    });
    const mk = async (name: string) =>
      (
        await store.createConfig(
          {
            name,
            group: 'script',
            config: '#!/bin/sh\n',
            inputs: [],
            outputs: [],
            options: { timeout: o.timeoutS ?? STEP_MS / 1000 },
          },
          WHO,
        )
      ).id;
    return { nodes, install: await mk('install'), uninstall: await mk('uninstall') };
  }

  async function create(
    o: { nodes: string[]; install: string; uninstall: string },
    nowMs = T0,
  ): Promise<ClusterRecord> {
    const { result } = await store.transaction((tx) =>
      engine.create(
        tx,
        {
          name: 'big',
          nodes: o.nodes,
          installConfigId: o.install,
          uninstallConfigId: o.uninstall,
          installInputValues: {},

          inputValues: {},
        },
        WHO,
        nowMs,
      ),
    );
    return result;
  }

  /** What the service's timer does: the engine's tick in one transaction. */
  const tickClusters = async (nowMs: number): Promise<ChangeSet> =>
    (await store.transaction((tx) => engine.tick(tx, nowMs))).changes;
  const restartCluster = async (id: string, max: number | null, nowMs: number): Promise<ChangeSet> =>
    (await store.transaction((tx) => engine.restart(tx, id, max, WHO, nowMs))).changes;
  const getCluster = async (id: string): Promise<ClusterRecord> => (await store.getCluster(id))!;

  /**
   * One group commit of signals, each its own savepoint, as the service's group committer makes
   * them; resolves with each signal's outcome and changes, in order.
   */
  async function signals(
    list: ReadonlyArray<{ node: string; depId: string; revision: number; nowMs: number; code?: number }>,
  ) {
    const units = list.map(
      (x) => (tx: StoreTx) => recordSignal(tx, engine, x.node, x.depId, ok(x.revision, x.code ?? 0), WHO, x.nowMs),
    );
    return (await store.group(units)).map((o) => {
      if (!o.ok) throw o.error;
      expect(o.value.result.outcome).toBe('recorded');
      return { ...o.value.result, changes: o.value.changes };
    });
  }

  afterEach(async () => {
    await store?.close();
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it('restarts more than 10,000 nodes with the default window: all start at once, every signal moves its node on, RESTART_COMPLETE', async () => {
    const o = await open(BIG);
    const c0 = await create(o);
    expect(c0.nodes.length).toBe(BIG);
    // every install times out in one tick (faster than 10,000 signals here; signals come below)
    expect((await tickClusters(T0 + STEP_MS - 1)).generation).toBeNull();
    expect((await tickClusters(T0 + STEP_MS)).clusters).toEqual([c0.id]);
    const failed = await getCluster(c0.id);
    expect(failed.status).toBe('CREATE_FAILED');
    expect(
      failed.nodes.every(
        (n) => n.phase === 'failed' && n.reason === 'install: no result within the step deadline (10 s)',
      ),
    ).toBe(true);

    const t1 = T0 + 2 * STEP_MS;
    const changes = await restartCluster(c0.id, null, t1);
    const c1 = await getCluster(c0.id);
    expect(c1).toMatchObject({ status: 'RESTART_IN_PROGRESS', maxUnavailable: BIG });
    expect(c1.nodes.every((n) => n.phase === 'uninstalling' && n.stepDeadlineMs === t1 + STEP_MS)).toBe(true);
    expect(changes.wakes.length).toBe(BIG);
    expect(changes.wakes.every((w) => w.reason === 'restart')).toBe(true);
    // each node's uninstall deployment made by this restart, its first revision the restart's
    expect((await store.getDeployment(c1.nodes[BIG - 1]!.uninstallDeploymentId!))!.current).toMatchObject({
      revision: 1,
      action: 'RESTART',
      status: 'IN_PROGRESS',
    });

    // one shared transaction per phase keeps the test fast; each signal is still its own savepoint
    const uninstalled = await signals(
      c1.nodes.map((n) => ({ node: n.node, depId: n.uninstallDeploymentId!, revision: 1, nowMs: t1 + 1 })),
    );
    c1.nodes.forEach((n, i) => {
      // the uninstall's success starts this node's install, in the same transaction
      expect(uninstalled[i]!.changes.wakes.map((w) => `${w.node}:${w.reason}`)).toEqual([`${n.node}:restart`]);
    });
    const c2 = await getCluster(c0.id);
    expect(c2.status).toBe('RESTART_IN_PROGRESS');
    expect(
      c2.nodes.every(
        (n) => n.phase === 'installing' && n.uninstallFinishedAt !== null && n.stepDeadlineMs === t1 + 1 + STEP_MS,
      ),
    ).toBe(true);
    expect((await store.getDeployment(c2.nodes[BIG - 1]!.installDeploymentId))!.current).toMatchObject({
      revision: 2,
      action: 'RESTART',
      status: 'IN_PROGRESS',
    });

    const installed = await signals(
      c2.nodes.map((n) => ({ node: n.node, depId: n.installDeploymentId, revision: 2, nowMs: t1 + 2 })),
    );
    for (const r of installed) expect(r.changes.wakes).toEqual([]);
    // (had it finished before the last signal, the later ones would have found no step in flight)
    const c3 = await getCluster(c0.id);
    expect(c3).toMatchObject({ status: 'RESTART_COMPLETE', statusReason: `restart complete on ${BIG} node(s)` });
    expect(c3.nodes.every((n) => n.phase === 'complete')).toBe(true);
    // nothing left to do: a tick changes nothing
    expect((await tickClusters(t1 + 10 * STEP_MS)).generation).toBeNull();
  }, 120_000); // a few seconds; the margin is for a loaded machine

  it('one tick fails every step past its deadline at once, and only those; a late signal is a duplicate', async () => {
    const o = await open(2_000);
    const c0 = await create(o);
    // the first half answers (one of them failing: a failure does not stop the create)
    const answered = c0.nodes.slice(0, 1_000);
    await signals(
      answered.map((n) => ({
        node: n.node,
        depId: n.installDeploymentId,
        revision: 1,
        nowMs: T0 + 1,
        code: n.position === 7 ? 1 : 0,
      })),
    );
    expect((await getCluster(c0.id)).status).toBe('CREATE_IN_PROGRESS');
    // nothing past its deadline yet: the tick changes nothing
    const early = await tickClusters(T0 + STEP_MS - 1);
    expect(early.generation).toBeNull();
    expect(early.clusters).toEqual([]);

    const tick = await tickClusters(T0 + STEP_MS);
    expect(tick.clusters).toEqual([c0.id]);
    const c1 = await getCluster(c0.id);
    expect(c1.status).toBe('CREATE_FAILED');
    expect(
      c1.nodes
        .slice(0, 1_000)
        .filter((n) => n.phase !== 'complete')
        .map((n) => n.position),
    ).toEqual([7]);
    expect(c1.nodes[7]!).toMatchObject({ phase: 'failed', reason: expect.stringMatching(/^install: /) });
    expect(
      c1.nodes
        .slice(1_000)
        .every((n) => n.phase === 'failed' && n.reason === 'install: no result within the step deadline (10 s)'),
    ).toBe(true);
    expect(c1.statusReason.startsWith(`create failed on ${c1.nodes[7]!.node}: install: `)).toBe(true);
    expect(c1.statusReason.split('; ').length).toBe(1_001);
    // the deadline is recorded as each revision's result: a late signal is a duplicate
    const x = c1.nodes[1_999]!;
    expect((await store.getDeployment(x.installDeploymentId))!.current).toMatchObject({
      status: 'FAILED',
      signalled: true,
    });
    expect(
      (
        await store.transaction((tx) =>
          recordSignal(tx, engine, x.node, x.installDeploymentId, ok(1), WHO, T0 + STEP_MS + 1),
        )
      ).result.outcome,
    ).toBe('duplicate');

    // a restart from it with a window of 100: 100 start, the rest wait; past the deadline, those
    // 100 fail in one tick and nobody else starts
    await restartCluster(c0.id, 100, T0 + 2 * STEP_MS);
    const c2 = await getCluster(c0.id);
    expect(c2.nodes.slice(0, 100).every((n) => n.phase === 'uninstalling')).toBe(true);
    expect(c2.nodes.slice(100).every((n) => n.phase === 'pending')).toBe(true);
    expect((await tickClusters(T0 + 3 * STEP_MS - 1)).generation).toBeNull();
    await tickClusters(T0 + 3 * STEP_MS);
    const c3 = await getCluster(c0.id);
    expect(c3.status).toBe('RESTART_FAILED');
    expect(
      c3.nodes
        .slice(0, 100)
        .every((n) => n.phase === 'failed' && n.reason === 'uninstall: no result within the step deadline (10 s)'),
    ).toBe(true);
    expect(c3.nodes.slice(100).every((n) => n.phase === 'pending' && n.uninstallStartedAt === null)).toBe(true);
  });

  it('a windowed restart of 1,000 nodes fills the window in position order and never exceeds it', async () => {
    const WINDOW = 37;
    const o = await open(1_000);
    const c0 = await create(o);
    await tickClusters(T0 + STEP_MS); // every install times out: CREATE_FAILED, a restart repairs
    expect((await getCluster(c0.id)).status).toBe('CREATE_FAILED');
    await restartCluster(c0.id, WINDOW, T0 + 2 * STEP_MS);
    let at = T0 + 2 * STEP_MS;
    let started = 0;
    for (;;) {
      const c = await getCluster(c0.id);
      const busy = c.nodes.filter((n) => n.phase === 'uninstalling' || n.phase === 'installing');
      const touched = c.nodes.filter((n) => n.phase !== 'pending');
      // the nodes ever started are the first ones by position, and the window is full while any wait
      expect(touched.map((n) => n.position)).toEqual(touched.map((_, i) => i));
      expect(busy.length).toBe(Math.min(WINDOW, c.nodes.length - (touched.length - busy.length)));
      started = touched.length;
      if (busy.length === 0) break;
      at += 1;
      await signals(
        busy.map((n) => ({
          node: n.node,
          // (the install's second revision; the uninstall's first, made by this restart)
          depId: n.phase === 'installing' ? n.installDeploymentId : n.uninstallDeploymentId!,
          revision: n.phase === 'installing' ? 2 : 1,
          nowMs: at,
        })),
      );
    }
    expect(started).toBe(1_000);
    expect((await getCluster(c0.id)).status).toBe('RESTART_COMPLETE');
  });

  it('a step started with no budget left fails before any other node of the window starts', async () => {
    // a hook timeout of 1 s and a margin of -1 s: a step's deadline is the moment it starts
    const o = await open(5, { timeoutS: 1, stepMarginS: -1 });
    const c0 = await create(o);
    await tickClusters(T0);
    expect((await getCluster(c0.id)).status).toBe('CREATE_FAILED');
    await restartCluster(c0.id, 3, T0 + 1);
    const c = await getCluster(c0.id);
    expect(c.status).toBe('RESTART_FAILED');
    expect(c.nodes.map((n) => n.phase)).toEqual(['failed', 'pending', 'pending', 'pending', 'pending']);
    expect(c.statusReason).toBe('restart failed on n00000: uninstall: no result within the step deadline (0 s)');
  });
});
