/**
 * Rollouts of a cluster with node groups (docs/api.md) with real processes: a controller and five
 * agents started through `bin/herald`, a master group and a worker group. Every script appends
 * its start and end (epoch ms) to one log, so each rule is checked from what the nodes did:
 * masters first and one at a time, the window, pause_s, the failure budget, the health check,
 * a dry run that runs nothing, a group restart that touches no other group, and a controller
 * SIGKILLed in the middle of a rollout carrying it on.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';
import { makeCluster, mkConfig, type Cluster } from '../helpers/agent-cluster.js';

const MASTERS = ['m1', 'm2'];
const WORKERS = ['w1', 'w2', 'w3'];
const NODES = [...MASTERS, ...WORKERS];

let c: Cluster;
let id: string;
let health: string;
let log: string;
let flags: string;

/** One step a script ran: `[start, end]` in epoch ms. */
interface Run {
  node: string;
  step: 'uninstall' | 'install' | 'check';
  action: string;
  start: number;
  end: number;
}

/** A script that logs its start and end; a flag file `<step>-<what>-<node>` makes it wait (gate), slow or fail. */
function script(step: string): string {
  return [
    '#!/bin/sh',
    `L=${log}; F=${flags}; N=$deploy_server_id`,
    `echo "$(date +%s%3N) ${step} start $N $deploy_action" >> $L`,
    `while [ -f $F/${step}-gate-$N ]; do sleep 0.02; done`,
    `if [ -f $F/${step}-slow-$N ]; then sleep 1.5; fi`,
    'sleep 0.1',
    `echo "$(date +%s%3N) ${step} end $N $deploy_action" >> $L`,
    `if [ -f $F/${step}-fail-$N ]; then echo "${step} exploded on $N" >&2; exit 3; fi`,
    '',
  ].join('\n');
}

const flag = (name: string) => fs.writeFileSync(path.join(flags, name), '');
const unflag = (name: string) => fs.rmSync(path.join(flags, name), { force: true });

/** The runs in the log, from its line `from` on, of actions RESTART and CHECK. */
function runs(from = 0): Run[] {
  const lines = fs.readFileSync(log, 'utf8').trim().split('\n').filter(Boolean).slice(from);
  const open = new Map<string, number>();
  const out: Run[] = [];
  for (const l of lines) {
    const [at, step, what, node, action] = l.split(' ');
    if (action !== 'RESTART' && action !== 'CHECK') continue;
    const key = `${step}/${node}`;
    if (what === 'start') open.set(key, Number(at));
    else out.push({ node: node!, step: step as Run['step'], action: action!, start: open.get(key)!, end: Number(at) });
  }
  return out;
}
const lineCount = () => fs.readFileSync(log, 'utf8').trim().split('\n').filter(Boolean).length;

/** Each node's time between the start of its uninstall and its end (install, or check when there is one). */
function spans(rs: Run[]): Map<string, { start: number; end: number }> {
  const m = new Map<string, { start: number; end: number }>();
  for (const r of rs) {
    const s = m.get(r.node) ?? { start: Number.POSITIVE_INFINITY, end: 0 };
    m.set(r.node, { start: Math.min(s.start, r.start), end: Math.max(s.end, r.end) });
  }
  return m;
}

/** The most of `nodes` whose spans overlap at one instant. */
function mostAtOnce(sp: Map<string, { start: number; end: number }>, nodes: string[]): number {
  const ev = nodes
    .filter((n) => sp.has(n))
    .flatMap((n) => [
      [sp.get(n)!.start, 1],
      [sp.get(n)!.end, -1],
    ])
    .sort((a, b) => a[0]! - b[0]! || a[1]! - b[1]!);
  let cur = 0;
  let most = 0;
  for (const [, d] of ev) {
    cur += d!;
    most = Math.max(most, cur);
  }
  return most;
}

const cluster = async () => (await api(c.ctl.port, c.op, 'GET', `/v1/clusters/${id}`)).json;
const restart = (body: unknown, group?: string) =>
  api(
    c.ctl.port,
    c.op,
    'PATCH',
    group ? `/v1/clusters/${id}/nodegroups/${group}/actions/restart` : `/v1/clusters/${id}/actions/restart`,
    body,
  );
const ended = () =>
  waitFor(
    'the restart to end',
    async () => {
      const s = (await cluster())?.status as string;
      return s === 'RESTART_COMPLETE' || s === 'RESTART_FAILED' ? s : null;
    },
    60_000,
    50,
  );

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  c = await makeCluster([...NODES, 'x1']);
  log = path.join(c.work, 'steps.log');
  flags = path.join(c.work, 'flags');
  fs.mkdirSync(flags);
  fs.writeFileSync(log, '');
  for (const n of [...NODES, 'x1']) await c.startAgent(n);
  const install = await mkConfig(c, { name: 'install', group: 'script', config: script('install') });
  const uninstall = await mkConfig(c, { name: 'uninstall', group: 'script', config: script('uninstall') });
  health = await mkConfig(c, { name: 'health', group: 'script', config: script('check') });
  const r = await api(c.ctl.port, c.op, 'POST', '/v1/clusters', {
    name: 'k8s',
    install_config_id: install,
    uninstall_config_id: uninstall,
    nodegroups: [
      { name: 'workers', nodes: WORKERS },
      { name: 'masters', role: 'master', nodes: MASTERS },
    ],
  });
  expect(r.status, r.raw).toBe(201);
  id = r.json.id;
  await waitFor('CREATE_COMPLETE', async () => (await cluster())?.status === 'CREATE_COMPLETE', 30_000, 50);
}, 180_000);

afterAll(async () => {
  await killAll();
  c?.cleanup();
});

describe('rollouts with real agents (docs/api.md)', () => {
  it('a dry run answers the plan and runs nothing: no script, no new revision, no new generation on any agent', async () => {
    const before = lineCount();
    const gens = async () =>
      Promise.all(NODES.map(async (n) => (await api(c.ctl.port, c.op, 'GET', `/v1/nodes/${n}`)).json));
    const g0 = await gens();
    // each node's install revision, and its uninstall deployment (none before the first uninstall)
    const revisions = async () => {
      const cl = await cluster();
      return Promise.all(
        cl.nodes.map(async (n: any) => [
          (await api(c.ctl.port, c.op, 'GET', `/v1/deployments/${n.install_deployment_id}`)).json.revision,
          n.uninstall_deployment_id,
        ]),
      );
    };
    const r0 = await revisions();
    expect(r0).toEqual(NODES.map(() => [1, null]));
    const r = await restart({ dry_run: true, health_config_id: health, pause_s: 1 });
    expect(r.status).toBe(200);
    expect(r.json.nodegroups.map((g: any) => [g.name, g.nodes, g.max_unavailable])).toEqual([
      ['masters', MASTERS, 1],
      ['workers', WORKERS, 3],
    ]);
    // give a wake-up, had one been sent, the time to run a script
    await new Promise((res) => setTimeout(res, 1500));
    expect(lineCount()).toBe(before);
    expect(await revisions()).toEqual(r0);
    const g1 = await gens();
    for (const [i, n] of g1.entries()) {
      // no revision made (the node's generation), no wake-up sent, nothing fetched by the agent
      expect(n.generation, NODES[i]).toBe(g0[i].generation);
      expect(n.push.generation_pushed, NODES[i]).toBe(g0[i].push.generation_pushed);
      expect(n.push.generation_fetched, NODES[i]).toBe(g0[i].push.generation_fetched);
      expect(typeof n.push.generation_fetched, NODES[i]).toBe('number');
    }
    expect((await cluster()).status).toBe('CREATE_COMPLETE');
  });

  it('restarts masters first, never two at once, each after its health check and pause; then the workers together', async () => {
    const from = lineCount();
    const r = await restart({ health_config_id: health, pause_s: 1 });
    expect(r.status).toBe(204);
    expect(await ended()).toBe('RESTART_COMPLETE');
    const rs = runs(from);
    // every node: uninstall, install, check, once each, in that order
    for (const n of NODES)
      expect(
        rs.filter((x) => x.node === n).map((x) => `${x.step}:${x.action}`),
        n,
      ).toEqual(['uninstall:RESTART', 'install:RESTART', 'check:CHECK']);
    const sp = spans(rs);
    expect(mostAtOnce(sp, MASTERS)).toBe(1);
    const lastMasterEnd = Math.max(...MASTERS.map((n) => sp.get(n)!.end));
    const firstWorkerStart = Math.min(...WORKERS.map((n) => sp.get(n)!.start));
    expect(firstWorkerStart).toBeGreaterThan(lastMasterEnd);
    // pause_s: the second master started at least 1 s after the first ended (its check's end)
    const [a, b] = [...MASTERS].sort((x, y) => sp.get(x)!.start - sp.get(y)!.start);
    expect(sp.get(b!)!.start - sp.get(a!)!.end).toBeGreaterThanOrEqual(1000);
    // the worker group's default window: all three were down together at some instant
    expect(mostAtOnce(sp, WORKERS)).toBe(3);
    const cl = await cluster();
    expect(cl.rollout).toMatchObject({ pause_s: 1, health_config_id: health });
    expect(cl.nodes.every((n: any) => n.phase === 'complete' && n.health_deployment_id)).toBe(true);
  });

  it("a group restart touches no other group, and holds its window (from the scripts' times)", async () => {
    const from = lineCount();
    const r = await restart({ max_unavailable: 2 }, 'workers');
    expect(r.status).toBe(204);
    expect(await ended()).toBe('RESTART_COMPLETE');
    const rs = runs(from);
    expect(rs.filter((x) => MASTERS.includes(x.node))).toEqual([]);
    expect(new Set(rs.map((x) => x.node))).toEqual(new Set(WORKERS));
    expect(mostAtOnce(spans(rs), WORKERS)).toBeLessThanOrEqual(2);
    const cl = await cluster();
    expect(cl.nodegroups.find((g: any) => g.name === 'masters').nodes.every((n: any) => n.phase === 'complete')).toBe(
      true,
    );
  });

  it('after a failure over max_failures no other node starts; RESTART_FAILED once the node in flight finished', async () => {
    const from = lineCount();
    flag('install-fail-w1');
    flag('install-slow-w2');
    try {
      const r = await restart({ max_unavailable: 2, max_failures: 0 }, 'workers');
      expect(r.status).toBe(204);
      expect(await ended()).toBe('RESTART_FAILED');
    } finally {
      unflag('install-fail-w1');
      unflag('install-slow-w2');
    }
    const rs = runs(from);
    const w1 = rs.find((x) => x.node === 'w1' && x.step === 'install')!;
    const w2 = rs.find((x) => x.node === 'w2' && x.step === 'install')!;
    // w2 was in flight when w1 failed, and finished; w3 never started
    expect(w2.end).toBeGreaterThan(w1.end);
    expect(rs.filter((x) => x.node === 'w3')).toEqual([]);
    const cl = await cluster();
    const phase = Object.fromEntries(cl.nodes.map((n: any) => [n.node, n.phase]));
    expect(phase).toMatchObject({ w1: 'failed', w2: 'complete', w3: 'pending', m1: 'complete', m2: 'complete' });
    expect(cl.status_reason).toMatch(/w1: install:/);
    expect(Date.parse(cl.operation_finished_at)).toBeGreaterThanOrEqual(w2.end);
  });

  it('a failing health check fails its node', async () => {
    const from = lineCount();
    flag('check-fail-w3');
    try {
      const r = await restart({ max_unavailable: 1, health_config_id: health, max_failures: 5 }, 'workers');
      expect(r.status).toBe(204);
      expect(await ended()).toBe('RESTART_FAILED');
    } finally {
      unflag('check-fail-w3');
    }
    const cl = await cluster();
    const w3 = cl.nodes.find((n: any) => n.node === 'w3');
    expect(w3.phase).toBe('failed');
    expect(w3.reason).toMatch(/^check: /);
    expect(cl.nodes.filter((n: any) => WORKERS.includes(n.node) && n.node !== 'w3').map((n: any) => n.phase)).toEqual([
      'complete',
      'complete',
    ]);
    expect(runs(from).filter((x) => x.step === 'check').length).toBe(3);
  });

  it('a controller SIGKILLed mid-rollout carries it on: each step ran once, masters one at a time, before the workers', async () => {
    const from = lineCount();
    flag('install-gate-m1');
    const r = await restart({ health_config_id: health });
    expect(r.status).toBe(204);
    // the install hook itself has started on m1 (held at its gate): the controller's phase alone
    // would race the agent's fetch of the install revision
    await waitFor(
      'm1 installing, its install hook started',
      () =>
        fs
          .readFileSync(log, 'utf8')
          .trim()
          .split('\n')
          .slice(from)
          .some((l) => / install start m1 RESTART$/.test(l)),
      20_000,
      20,
    );
    await stopProc(c.ctl.proc, 'SIGKILL');
    unflag('install-gate-m1');
    await waitFor('m1 to finish its install while the controller is down', () =>
      runs(from).some((x) => x.node === 'm1' && x.step === 'install'),
    );
    await c.startController();
    expect(await ended()).toBe('RESTART_COMPLETE');
    const rs = runs(from);
    for (const n of NODES)
      expect(
        rs.filter((x) => x.node === n).map((x) => x.step),
        n,
      ).toEqual(['uninstall', 'install', 'check']);
    const sp = spans(rs);
    expect(mostAtOnce(sp, MASTERS)).toBe(1);
    expect(Math.min(...WORKERS.map((n) => sp.get(n)!.start))).toBeGreaterThan(
      Math.max(...MASTERS.map((n) => sp.get(n)!.end)),
    );
  });

  it('adds a group whose node installs, and removes it: its node uninstalls (DELETE), the others untouched', async () => {
    const from = lineCount();
    const add = await api(c.ctl.port, c.op, 'POST', `/v1/clusters/${id}/nodegroups`, { name: 'extra', nodes: ['x1'] });
    expect(add.status, add.raw).toBe(201);
    await waitFor('UPDATE_COMPLETE', async () => (await cluster())?.status === 'UPDATE_COMPLETE', 30_000, 50);
    const del = await api(c.ctl.port, c.op, 'DELETE', `/v1/clusters/${id}/nodegroups/extra`);
    expect(del.status).toBe(202);
    await waitFor(
      'the group gone',
      async () => {
        const cl = await cluster();
        return cl?.status === 'UPDATE_COMPLETE' && !cl.nodegroups.some((g: any) => g.name === 'extra');
      },
      30_000,
      50,
    );
    const lines = fs
      .readFileSync(log, 'utf8')
      .trim()
      .split('\n')
      .slice(from)
      .filter((l) => l.includes(' end '))
      .map((l) => l.split(' ').slice(1).join(' '));
    expect(lines).toEqual(['install end x1 CREATE', 'uninstall end x1 DELETE']);
    expect((await cluster()).nodes.map((n: any) => n.node).sort()).toEqual([...NODES].sort());
  });
});
