/**
 * `herald cluster restart <id> --wait` against a real controller and three real agents, its
 * (non-TTY) output read line by line: every node goes uninstalling → installing → complete and
 * the command exits 0; a failing install exits non-zero naming the node; the next restart
 * repairs the cluster.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
const INSTALL = `#!/bin/sh
set -eu
echo "install \${deploy_action}" >> "$root/\${deploy_server_id}.runs"
if [ -e "$root/fail-\${deploy_server_id}" ]; then echo "install broke on \${deploy_server_id}" >&2; exit 3; fi
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

beforeAll(async () => {
  dir = tempDir('herald-restart-');
  const pki = await makePki(dir, NODES);
  ctl = await startController(dir, pki);
  agents = await Promise.all(NODES.map((n) => startAgent(dir, pki, n, ctl.url)));
  await waitForNodes(ctl.client, NODES);
  conn = ['--controller', ctl.url, '--pki', pki];
  const input = [{ name: 'root', type: 'String', default: dir }];
  const install = await ctl.client.post<{ id: string }>('/v1/configs', {
    name: 'install',
    group: 'script',
    config: INSTALL,
    inputs: input,
  });
  const uninstall = await ctl.client.post<{ id: string }>('/v1/configs', {
    name: 'uninstall',
    group: 'script',
    config: UNINSTALL,
    inputs: input,
  });
  const created = await runCli([
    'cluster',
    'create',
    '--name',
    'c1',
    '--nodes',
    NODES.join(','),
    '--install',
    install.id,
    '--uninstall',
    uninstall.id,
    '--wait',
    '--timeout',
    '30s',
    '--json',
    ...conn,
  ]);
  expect(created.stderr).toBe('');
  const c = JSON.parse(created.stdout) as { id: string; status: string };
  expect(c.status).toBe('CREATE_COMPLETE');
  clusterId = c.id;
}, 90_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

function runs(node: string): string[] {
  return fs
    .readFileSync(path.join(dir, `${node}.runs`), 'utf8')
    .trim()
    .split('\n');
}

describe('herald cluster restart --wait', () => {
  it('shows every node uninstalling, installing and complete, and exits 0', async () => {
    const r = await runCli(['cluster', 'restart', clusterId, '--wait', '--timeout', '40s', ...conn], {
      timeoutMs: 50_000,
    });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split('\n');
    for (const n of NODES) {
      const mine = lines
        .filter((l) => new RegExp(`^\\d\\d:\\d\\d:\\d\\d\\.\\d{3} ${n} `).test(l))
        .map((l) => l.split(' ').slice(2).join(' '));
      const phases = mine.filter((l) => !l.startsWith('woken'));
      expect(phases.map((p) => p.split(' ')[0])).toEqual(['uninstalling', 'installing', 'complete']);
      expect(phases[2]).toMatch(/^complete \(uninstall [\d.]+ m?s, install [\d.]+ m?s\)$/);
      expect(runs(n).slice(-2)).toEqual(['uninstall RESTART', 'install RESTART']);
    }
    expect(lines.at(-1)).toMatch(new RegExp(`^cluster ${clusterId} restarted: RESTART_COMPLETE in `));
    const show = await runCli(['cluster', 'show', clusterId, ...conn]);
    expect(show.stdout).toMatch(/^status:\s+RESTART_COMPLETE$/m);
    for (const n of NODES) expect(show.stdout).toMatch(new RegExp(`^${n}\\s+complete\\s`, 'm'));
  }, 60_000);

  it('a failing install exits non-zero naming the node and its reason; the next restart repairs', async () => {
    fs.writeFileSync(path.join(dir, 'fail-n2'), '');
    const r = await runCli(['cluster', 'restart', clusterId, '--wait', '--timeout', '40s', ...conn], {
      timeoutMs: 50_000,
    });
    expect(r.code).toBe(1);
    expect(r.stdout).toMatch(/ n2 failed: /);
    const err = r.stderr.trim().split('\n');
    expect(err).toHaveLength(1);
    expect(err[0]).toMatch(new RegExp(`^herald: restart failed: cluster ${clusterId} RESTART_FAILED: .*node n2: `));

    fs.rmSync(path.join(dir, 'fail-n2'));
    const repair = await runCli(['cluster', 'restart', clusterId, '--wait', '--timeout', '40s', ...conn], {
      timeoutMs: 50_000,
    });
    expect(repair.stderr).toBe('');
    expect(repair.code).toBe(0);
  }, 120_000);

  it('--timeout gives up with exit 2 and says the restart goes on', async () => {
    const r = await runCli(['cluster', 'restart', clusterId, '--wait', '--timeout', '1ms', ...conn], {
      timeoutMs: 30_000,
    });
    if (r.code === 0) return; // finished faster than a poll: nothing to time out
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^herald: timeout: /);
    // let it finish before the next suite stops the processes
    await runCli(['cluster', 'show', clusterId, ...conn]);
  }, 40_000);
});
