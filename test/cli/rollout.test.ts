/**
 * `herald cluster create --nodegroup ...` and `herald cluster restart` with rollout options
 * (docs/api.md) against a real controller and two real agents: groups created from the command
 * line, `--dry-run` printing the plan and running nothing, a one-group restart with a
 * percentage window, and bad options refused in one line before anything is sent. The pure
 * parsers run without processes.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { codeOf } from '../../protocol/errors.js';
import { formatPlan, parseNodegroupSpec, restartBody, rolloutBody } from '../../cli/operator/rollout.js';
import {
  makePki,
  runCli,
  startAgent,
  startController,
  tempDir,
  waitForNodes,
  type Controller,
  type Proc,
} from './harness.js';

const NODES = ['m1', 'w1'];
const SCRIPT = (step: string) => `#!/bin/sh
echo "${step} \${deploy_action}" >> "$root/\${deploy_server_id}.runs"
`;

let dir: string;
let ctl: Controller;
let agents: Proc[] = [];
let conn: string[];
let clusterId: string;
const runs = (n: string) => {
  const f = path.join(dir, `${n}.runs`);
  return fs.existsSync(f) ? fs.readFileSync(f, 'utf8').trim().split('\n') : [];
};

describe('rollout options, parsed', () => {
  it('reads name:role:nodes and name:nodes', () => {
    expect(parseNodegroupSpec('masters:master:m1,m2')).toEqual({
      name: 'masters',
      role: 'master',
      nodes: ['m1', 'm2'],
    });
    expect(parseNodegroupSpec('gpu:n1')).toEqual({ name: 'gpu', role: 'worker', nodes: ['n1'] });
    for (const bad of ['x', 'a:boss:n1', 'a:master:', ':n1', 'a:b:c:d']) {
      let code: string | undefined;
      try {
        parseNodegroupSpec(bad);
      } catch (err) {
        code = codeOf(err);
      }
      expect(code, bad).toBe('bad_option');
    }
  });

  it('builds the restart body: counts, percentages, durations in seconds; nothing when no option', () => {
    expect(restartBody({})).toBeUndefined();
    expect(
      restartBody({
        nodegroup: ['a', 'b,c'],
        maxUnavailable: '25%',
        pause: '1500ms',
        maxFailures: '0',
        healthConfig: 'h',
        dryRun: true,
      }),
    ).toEqual({
      nodegroups: ['a', 'b', 'c'],
      max_unavailable: '25%',
      pause_s: 1.5,
      max_failures: 0,
      health_config_id: 'h',
      dry_run: true,
    });
    expect(restartBody({ maxUnavailable: '2', pause: '0' })).toEqual({ max_unavailable: 2, pause_s: 0 });
    for (const f of [{ maxUnavailable: '0' }, { maxUnavailable: '101%' }, { maxFailures: '-1' }, { pause: 'soon' }]) {
      let code: string | undefined;
      try {
        restartBody(f);
      } catch (err) {
        code = codeOf(err);
      }
      expect(code, JSON.stringify(f)).toBe('bad_option');
    }
  });

  it('builds the rollout options: canaries, promotion, on_failure, deadlines, the gate, force; refuses what makes no sense', () => {
    expect(
      rolloutBody({
        canary: '10%',
        autoPromote: '1m',
        onFailure: 'revert',
        nodeDeadline: '10m',
        progressDeadline: '1h',
        gatePrometheus: 'https://prom:9090',
        gateQuery: 'ALERTS',
        gateFailOpen: true,
        force: true,
      }),
    ).toEqual({
      canary: '10%',
      auto_promote_s: 60,
      on_failure: 'revert',
      node_deadline_s: 600,
      progress_deadline_s: 3600,
      gate: { prometheus: 'https://prom:9090', query: 'ALERTS', fail_open: true },
      force: true,
    });
    expect(rolloutBody({ canary: '1', gateUrl: 'https://gate/ok' })).toEqual({
      canary: 1,
      gate: { url: 'https://gate/ok' },
    });
    for (const f of [
      { canary: 'one' },
      { canary: '0%' },
      { onFailure: 'retry' },
      { gateUrl: 'https://a', gatePrometheus: 'https://b', gateQuery: 'q' },
      { gatePrometheus: 'https://b' },
      { gateFailOpen: true },
      { nodeDeadline: 'soon' },
    ]) {
      let code: string | undefined;
      try {
        rolloutBody(f);
      } catch (err) {
        code = codeOf(err);
      }
      expect(code, JSON.stringify(f)).toBe('bad_option');
    }
  });

  it('prints a plan in order with its limits', () => {
    const text = formatPlan({
      cluster: 'c',
      dry_run: true,
      nodegroups: [{ name: 'masters', role: 'master', nodes: ['m1', 'm2'], max_unavailable: 1, canary: 0 }],
      pause_s: 10,
      max_failures: 1,
      health_config_id: 'h1',
      canaries: [],
      auto_promote_s: null,
      on_failure: 'abort',
      node_deadline_s: null,
      progress_deadline_s: null,
      gate: null,
      force: false,
    });
    expect(text).toMatch(/ORDER\s+NODEGROUP\s+ROLE\s+MAX_UNAVAILABLE\s+NODES/);
    expect(text).toMatch(/1\s+masters\s+master\s+1\s+m1,m2/);
    expect(text).toContain('pause 10 s after each node; stop after 2 failed node(s); health check h1');
  });
});

describe('herald cluster with node groups', { timeout: 120_000 }, () => {
  beforeAll(async () => {
    dir = tempDir('herald-rollout-cli-');
    const pki = await makePki(dir, [...NODES, 'x1']);
    ctl = await startController(dir, pki);
    agents = await Promise.all([...NODES, 'x1'].map((n) => startAgent(dir, pki, n, ctl.url)));
    await waitForNodes(ctl.client, [...NODES, 'x1']);
    conn = ['--controller', ctl.url, '--pki', pki];
    const input = [{ name: 'root', type: 'String', default: dir }];
    const mk = async (name: string) =>
      (
        await ctl.client.post<{ id: string }>('/v1/configs', {
          name,
          group: 'script',
          config: SCRIPT(name),
          inputs: input,
        })
      ).id;
    const install = await mk('install');
    const uninstall = await mk('uninstall');
    const created = await runCli([
      'cluster',
      'create',
      '--name',
      'k',
      '--nodegroup',
      'workers:w1',
      '--nodegroup',
      'masters:master:m1',
      '--install',
      install,
      '--uninstall',
      uninstall,
      '--wait',
      '--json',
      ...conn,
    ]);
    expect(created.code, created.stderr).toBe(0);
    const body = JSON.parse(created.stdout);
    clusterId = body.id;
    expect(body.status).toBe('CREATE_COMPLETE');
    expect(body.nodegroups.map((g: { name: string; role: string }) => `${g.name}:${g.role}`)).toEqual([
      'workers:worker',
      'masters:master',
    ]);
  }, 120_000);

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.stop()));
    await ctl?.stop();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  it('--dry-run prints the plan, masters first, and runs nothing', async () => {
    const before = NODES.map(runs);
    const r = await runCli(['cluster', 'restart', clusterId, '--dry-run', '--pause', '2s', ...conn]);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    // a master group's window is held to its quorum (QUORUM), max(1, (n-1)/2)
    expect(lines[0]).toMatch(/^ORDER\s+NODEGROUP\s+ROLE\s+MAX_UNAVAILABLE\s+QUORUM\s+NODES$/);
    expect(lines[1]).toMatch(/^1\s+masters\s+master\s+1\s+1\s+m1$/);
    expect(lines[2]).toMatch(/^2\s+workers\s+worker\s+1\s+-\s+w1$/);
    expect(r.stdout).toContain('pause 2 s after each node');
    expect(r.stdout).toContain('dry run: nothing was restarted');
    await new Promise((res) => setTimeout(res, 1000));
    expect(NODES.map(runs)).toEqual(before);
    const show = await runCli(['cluster', 'show', clusterId, '--json', ...conn]);
    expect(JSON.parse(show.stdout).status).toBe('CREATE_COMPLETE');
  });

  it('restarts one group with a percentage window and leaves the other alone', async () => {
    const masters = runs('m1');
    const r = await runCli([
      'cluster',
      'restart',
      clusterId,
      '--nodegroup',
      'workers',
      '--max-unavailable',
      '50%',
      '--wait',
      '--progress',
      'lines',
      ...conn,
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(runs('w1').slice(-2)).toEqual(['uninstall RESTART', 'install RESTART']);
    expect(runs('m1')).toEqual(masters);
    const show = await runCli(['cluster', 'show', clusterId, ...conn]);
    expect(show.stdout).toMatch(/NODE\s+PHASE\s+NODEGROUP/);
    expect(show.stdout).toMatch(/w1\s+complete\s+workers/);
  });

  it('refuses bad options in one line: a percentage over 100 before sending, an unknown group from the controller', async () => {
    const pct = await runCli(['cluster', 'restart', clusterId, '--max-unavailable', '150%', ...conn]);
    expect(pct.code).toBe(1);
    expect(pct.stderr.trim()).toMatch(/^herald: bad_option: --max-unavailable/);
    const ghost = await runCli(['cluster', 'restart', clusterId, '--nodegroup', 'ghost', ...conn]);
    expect(ghost.code).toBe(1);
    expect(ghost.stderr.trim()).toMatch(/^herald: unknown_nodegroup: .*\(field nodegroups\.0\)$/);
    const both = await runCli(['cluster', 'create', '--name', 'x', '--install', 'a', '--uninstall', 'b', ...conn]);
    expect(both.stderr.trim()).toMatch(/^herald: bad_option: give one of --nodes/);
  });

  it('adds a node group (its node installs) and removes it (its node uninstalls)', async () => {
    const add = await runCli(['cluster', 'nodegroup-add', clusterId, 'extra:x1', '--wait', ...conn]);
    expect(add.code, add.stderr).toBe(0);
    expect(add.stdout).toContain(`node group extra added to cluster ${clusterId}: UPDATE_COMPLETE`);
    expect(runs('x1')).toEqual(['install CREATE']);
    const rm = await runCli(['cluster', 'nodegroup-rm', clusterId, 'extra', ...conn]);
    expect(rm.code, rm.stderr).toBe(0);
    const gone = async () => {
      const show = JSON.parse((await runCli(['cluster', 'show', clusterId, '--json', ...conn])).stdout);
      return show.status === 'UPDATE_COMPLETE' && !show.nodegroups.some((g: { name: string }) => g.name === 'extra');
    };
    const t0 = Date.now();
    while (!(await gone())) {
      expect(Date.now() - t0).toBeLessThan(20_000);
      await new Promise((res) => setTimeout(res, 200));
    }
    expect(runs('x1')).toEqual(['install CREATE', 'uninstall DELETE']);
    const last = await runCli(['cluster', 'nodegroup-rm', clusterId, 'nope', ...conn]);
    expect(last.stderr.trim()).toMatch(/^herald: not_found: /);
  });
});
