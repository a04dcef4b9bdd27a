/**
 * `herald cluster upgrade`, `herald cluster rollout ...` and `herald cluster revisions` against
 * a real controller and three real agents (docs/cli.md): a dry run prints the plan, `--wait`
 * shows the canary phase, the promotion and a revert as they happen and turns the end into an
 * exit status; the controls answer for a running rollout and refuse without one.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/procs.js';
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

const NODES = ['n1', 'n2', 'n3'];
/** An install of version `v`: it fails on a node with a file `fail-<node>-v<v>`, and waits while `hold-<node>-v<v>` exists. */
const install = (v: number) => `#!/bin/sh
set -eu
echo "install-v${v} \${deploy_action}" >> "$root/\${deploy_server_id}.runs"
while [ -e "$root/hold-\${deploy_server_id}-v${v}" ]; do sleep 0.02; done
if [ -e "$root/fail-\${deploy_server_id}-v${v}" ]; then echo "v${v} broke on \${deploy_server_id}" >&2; exit 3; fi
`;
const UNINSTALL = `#!/bin/sh
set -eu
echo "uninstall \${deploy_action}" >> "$root/\${deploy_server_id}.runs"
`;

let dir: string;
let ctl: Controller;
let agents: Proc[] = [];
let conn: string[];
let clusterId: string;
const configs: Record<string, string> = {};

beforeAll(async () => {
  dir = tempDir('herald-upgrade-');
  const pki = await makePki(dir, NODES);
  ctl = await startController(dir, pki);
  agents = await Promise.all(NODES.map((n) => startAgent(dir, pki, n, ctl.url)));
  await waitForNodes(ctl.client, NODES);
  conn = ['--controller', ctl.url, '--pki', pki];
  const inputs = [{ name: 'root', type: 'String', default: dir }];
  for (const [name, config] of [
    ['install-v1', install(1)],
    ['install-v2', install(2)],
    ['install-v3', install(3)],
    ['uninstall', UNINSTALL],
  ] as const)
    configs[name] = (
      await ctl.client.post<{ id: string }>('/v1/configs', { name, group: 'script', config, inputs })
    ).id;
  const c = await ctl.client.post<{ id: string }>('/v1/clusters', {
    name: 'c1',
    nodes: NODES,
    install_config_id: configs['install-v1'],
    uninstall_config_id: configs.uninstall,
  });
  clusterId = c.id;
  await waitFor('CREATE_COMPLETE', async () => (await status()) === 'CREATE_COMPLETE', 30_000, 50);
}, 120_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const status = async () => (await ctl.client.get<{ status: string }>(`/v1/clusters/${clusterId}`)).status;
const runs = (node: string) =>
  fs
    .readFileSync(path.join(dir, `${node}.runs`), 'utf8')
    .trim()
    .split('\n');

describe('herald cluster upgrade', () => {
  it('--dry-run prints the plan and runs nothing', async () => {
    const r = await runCli(
      [
        'cluster',
        'upgrade',
        clusterId,
        '--install-config',
        configs['install-v2']!,
        '--canary',
        '1',
        '--dry-run',
        ...conn,
      ],
      { timeoutMs: 20_000 },
    );
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^revision 1 -> 2$/m);
    expect(r.stdout).toMatch(/1\s+default-worker\s+worker\s+3\s+n1,n2,n3/);
    expect(r.stdout).toContain('canaries n1 first, then wait for a promote');
    expect(r.stdout).toContain('dry run: nothing ran');
    for (const n of NODES) expect(runs(n)).toEqual(['install-v1 CREATE']);
  });

  it('--wait shows the canary phase and its automatic promotion, then exits 0', async () => {
    const r = await runCli(
      [
        'cluster',
        'upgrade',
        clusterId,
        '--install-config',
        configs['install-v2']!,
        '--canary',
        '1',
        '--auto-promote',
        '1s',
        '--wait',
        '--timeout',
        '40s',
        '--progress',
        'lines',
        ...conn,
      ],
      { timeoutMs: 50_000 },
    );
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split('\n');
    const at = (re: RegExp) => lines.findIndex((l) => re.test(l));
    expect(lines[0]).toBe(`upgrade of cluster ${clusterId} to revision 2: 3 node(s) to change`);
    const canary = at(/ rollout: canary phase: n1 first$/);
    const promoted = at(/ rollout: canaries promoted automatically \(auto_promote_s 1\)$/);
    const n2 = at(/ n2 uninstalling$/);
    expect(canary).toBeGreaterThan(0);
    expect(promoted).toBeGreaterThan(at(/ n1 complete/));
    expect(n2).toBeGreaterThan(promoted);
    expect(lines.at(-1)).toMatch(new RegExp(`^cluster ${clusterId} at revision 2 on every node: UPDATE_COMPLETE in `));
    for (const n of NODES) expect(runs(n).slice(-2)).toEqual(['uninstall UPDATE', 'install-v2 UPDATE']);
  }, 60_000);

  it('--on-failure revert: --wait shows the revert and exits 1 naming the nodes brought back', async () => {
    fs.writeFileSync(path.join(dir, 'fail-n2-v3'), '');
    try {
      const r = await runCli(
        [
          'cluster',
          'upgrade',
          clusterId,
          '--install-config',
          configs['install-v3']!,
          '--max-unavailable',
          '1',
          '--on-failure',
          'revert',
          '--wait',
          '--timeout',
          '40s',
          '--progress',
          'lines',
          ...conn,
        ],
        { timeoutMs: 50_000 },
      );
      expect(r.code).toBe(1);
      expect(r.stdout).toMatch(/ rollout: reverting n1, n2 to revision 2: update failed on n2: install: /);
      const err = r.stderr.trim().split('\n');
      expect(err).toHaveLength(1);
      expect(err[0]).toMatch(
        new RegExp(`^herald: upgrade failed: cluster ${clusterId} UPDATE_FAILED: .*reverted to revision 2: n1, n2`),
      );
    } finally {
      fs.rmSync(path.join(dir, 'fail-n2-v3'));
    }
    expect(runs('n1').slice(-4)).toEqual([
      'uninstall UPDATE',
      'install-v3 UPDATE',
      'uninstall UPDATE',
      'install-v2 UPDATE',
    ]);
    expect(runs('n3').at(-1)).toBe('install-v2 UPDATE');
  }, 60_000);

  it('rollout pause, resume and promote control a running upgrade; without one they refuse', async () => {
    fs.writeFileSync(path.join(dir, 'hold-n1-v3'), '');
    const start = await runCli(
      ['cluster', 'upgrade', clusterId, '--install-config', configs['install-v3']!, '--canary', '1', ...conn],
      { timeoutMs: 20_000 },
    );
    expect(start.code).toBe(0);
    expect(start.stdout).toContain(`upgrade of cluster ${clusterId} to revision 3 accepted (3 node(s))`);
    const paused = await runCli(['cluster', 'rollout', 'pause', clusterId, ...conn]);
    expect(paused.code).toBe(0);
    expect(paused.stdout).toBe(
      `cluster ${clusterId} UPDATE_IN_PROGRESS, rollout paused (pause recorded in the audit)\n`,
    );
    fs.rmSync(path.join(dir, 'hold-n1-v3'));
    expect((await runCli(['cluster', 'rollout', 'resume', clusterId, ...conn])).code).toBe(0);
    const promoted = await runCli(['cluster', 'rollout', 'promote', clusterId, '--json', ...conn]);
    expect(promoted.code).toBe(0);
    expect(JSON.parse(promoted.stdout).rollout.state.promoted.by).toBe('spiffe://herald.local/operator/admin');
    await waitFor('the upgrade to end', async () => (await status()) !== 'UPDATE_IN_PROGRESS', 30_000, 50);
    expect(await status()).toBe('UPDATE_COMPLETE');
    const none = await runCli(['cluster', 'rollout', 'abort', clusterId, ...conn]);
    expect(none.code).not.toBe(0);
    expect(none.stderr).toMatch(/no_operation/);
  }, 90_000);

  it('revisions lists each change, the current one and which are stable; undo rolls the last stable one back', async () => {
    const r = await runCli(['cluster', 'revisions', clusterId, ...conn]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^1\s+-\s+yes\s/m);
    expect(r.stdout).toMatch(/^2\s+-\s+yes\s/m);
    expect(r.stdout).toMatch(/^3\s+\*\s+yes\s/m);
    const undo = await runCli(
      ['cluster', 'rollout', 'undo', clusterId, '--wait', '--timeout', '40s', '--progress', 'lines', ...conn],
      {
        timeoutMs: 50_000,
      },
    );
    expect(undo.stderr).toBe('');
    expect(undo.code).toBe(0);
    expect(undo.stdout).toMatch(
      new RegExp(`^undo of cluster ${clusterId} to revision 4: 3 node\\(s\\) to change$`, 'm'),
    );
    for (const n of NODES) expect(runs(n).at(-1)).toBe('install-v2 UPDATE');
  }, 60_000);
});
