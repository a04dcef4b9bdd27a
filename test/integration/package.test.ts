/**
 * The self-contained agent of SPEC §10 (`npm run package`): the one file, copied into a directory
 * that holds nothing else and run with plain `node` (no node_modules anywhere above it), joins a
 * real `bin/herald controller` and completes a deployment; the systemd unit passes
 * `systemd-analyze verify` where that command exists.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeCluster, mkConfig, mkDeployment, waitDeployment, type Cluster } from '../helpers/agent-cluster.js';
import { api, freePort, hasExited, heraldSync, isBuilt, REPO, stopProc, waitFor, type Proc } from '../helpers/procs.js';

const built = isBuilt();
const PACKAGE = path.join(REPO, 'dist', 'package');
let c: Cluster;
let nodeDir: string;
const agents: Proc[] = [];

describe.skipIf(!built)('the agent package (npm run package)', { timeout: 90_000 }, () => {
  beforeAll(async () => {
    execFileSync(process.execPath, [path.join(REPO, 'scripts', 'package.mjs'), '--sea'], { cwd: REPO, stdio: 'pipe' });
    c = await makeCluster([]);
    for (const n of ['pkg1', 'pkg2']) {
      const issue = heraldSync(['certs', 'issue', 'agent', n, '--dir', c.pki, '--ip', '127.0.0.1']);
      expect(issue.code, issue.err).toBe(0);
    }
    // the node: the package file alone in its directory, the bundle where /etc/herald/pki would be
    nodeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-node-'));
    fs.mkdirSync(path.join(nodeDir, 'opt'));
    fs.copyFileSync(path.join(PACKAGE, 'herald-agent.mjs'), path.join(nodeDir, 'opt', 'herald-agent.mjs'));
    fs.mkdirSync(path.join(nodeDir, 'bin'));
    fs.copyFileSync(path.join(PACKAGE, 'herald-agent'), path.join(nodeDir, 'bin', 'herald-agent'));
    fs.chmodSync(path.join(nodeDir, 'bin', 'herald-agent'), 0o755);
    for (const n of ['pkg1', 'pkg2']) {
      const bundle = heraldSync([
        'certs',
        'bundle',
        'agent',
        n,
        '--dir',
        c.pki,
        '--out',
        path.join(nodeDir, `pki-${n}`),
      ]);
      expect(bundle.code, bundle.err).toBe(0);
    }
  });

  afterAll(async () => {
    for (const a of agents) await stopProc(a);
    if (c) await stopProc(c.ctl.proc);
    c?.cleanup();
    if (nodeDir) fs.rmSync(nodeDir, { recursive: true, force: true });
  });

  it('is one JavaScript file with no native module and nothing of the controller, plus the single executable, the unit, its options and the cloud-init example', () => {
    expect(fs.readdirSync(PACKAGE).sort()).toEqual([
      'cloud-init.yaml',
      'herald-agent',
      'herald-agent.env',
      'herald-agent.mjs',
      'herald-agent.service',
    ]);
    const text = fs.readFileSync(path.join(PACKAGE, 'herald-agent.mjs'), 'utf8');
    expect(text.startsWith('#!/usr/bin/env node')).toBe(true);
    expect(text).not.toMatch(/better[-_]sqlite3|\.node['"]\)|node-forge/);
    expect(fs.readdirSync(path.join(nodeDir, 'opt'))).toEqual(['herald-agent.mjs']);
  });

  /** Starts a packaged agent (`command` then its arguments) for `node`, cwd its own directory. */
  async function runPackaged(command: string[], node: string): Promise<void> {
    const port = await freePort();
    const logFile = path.join(nodeDir, `agent-${node}.log`);
    const fd = fs.openSync(logFile, 'a');
    const env = { ...process.env };
    delete env.NODE_PATH;
    const args = [
      ...command.slice(1),
      'agent',
      '--node',
      node,
      '--controller',
      `https://127.0.0.1:${c.ctl.port}`,
      '--listen',
      `127.0.0.1:${port}`,
      '--pki',
      path.join(nodeDir, `pki-${node}`),
      '--state-dir',
      path.join(nodeDir, `state-${node}`),
    ];
    const child = spawn(command[0]!, args, {
      cwd: path.dirname(command.at(-1)!),
      detached: true,
      stdio: ['ignore', fd, fd],
      env,
    });
    fs.closeSync(fd);
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    const proc: Proc = { name: `package-${node}`, child, logFile, exited, log: () => fs.readFileSync(logFile, 'utf8') };
    agents.push(proc);
    await waitFor(
      `the packaged agent ${node} to announce its endpoint`,
      async () => {
        if (hasExited(proc)) throw new Error(`the packaged agent exited: ${proc.log()}`);
        const r = await api(c.ctl.port, c.op, 'GET', `/v1/nodes/${node}`);
        return r.status === 200 && JSON.stringify(r.json ?? {}).includes(`:${port}/`);
      },
      20_000,
      50,
    );
    const cfg = await mkConfig(c, {
      name: `pkg-${node}`,
      group: 'script',
      config: '#!/bin/sh\necho "packaged $who"\n',
      inputs: [{ name: 'who' }],
    });
    const id = await mkDeployment(c, { node, config_id: cfg, input_values: { who: node } });
    const d = await waitDeployment(c, id);
    expect(d.status, d.status_reason).toBe('COMPLETE');
    expect(d.output_values.deploy_stdout).toContain(`packaged ${node}`);
    // the wake-up path, not only polling: the node's push connection is up
    expect((await api(c.ctl.port, c.op, 'GET', `/v1/nodes/${node}`)).json.push.connected).toBe(true);
  }

  it('run with plain node from a directory holding nothing else, it announces itself and completes a deployment', async () => {
    await runPackaged([process.execPath, path.join(nodeDir, 'opt', 'herald-agent.mjs')], 'pkg1');
  });

  it('the single executable (node and the agent in one file) does the same with no node installed beside it', async () => {
    await runPackaged([path.join(nodeDir, 'bin', 'herald-agent')], 'pkg2');
  });

  const analyze = spawnSync('systemd-analyze', ['--version'], { stdio: 'ignore' }).status === 0;
  it.skipIf(!analyze)('the systemd unit passes systemd-analyze verify', () => {
    const r = spawnSync('systemd-analyze', ['verify', path.join(PACKAGE, 'herald-agent.service')], {
      encoding: 'utf8',
    });
    expect({ status: r.status, stderr: r.stderr.trim() }).toEqual({ status: 0, stderr: '' });
  });
});
