/**
 * The self-contained agent of SPEC §10 (`npm run package`): the one file, copied into a directory
 * that holds nothing else and run with plain `node` (no node_modules anywhere above it), joins a
 * real `bin/herald controller` and completes a deployment; the systemd unit passes
 * `systemd-analyze verify` where that command exists.
 */
import { execFileSync, spawnSync } from 'node:child_process';
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
let agent: Proc | undefined;

describe.skipIf(!built)('the agent package (npm run package)', { timeout: 90_000 }, () => {
  beforeAll(async () => {
    execFileSync(process.execPath, [path.join(REPO, 'scripts', 'package.mjs')], { cwd: REPO, stdio: 'pipe' });
    c = await makeCluster([]);
    const issue = heraldSync(['certs', 'issue', 'agent', 'pkg1', '--dir', c.pki, '--ip', '127.0.0.1']);
    expect(issue.code, issue.err).toBe(0);
    // the node: the package file alone in its directory, the bundle where /etc/herald/pki would be
    nodeDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-node-'));
    fs.mkdirSync(path.join(nodeDir, 'opt'));
    fs.copyFileSync(path.join(PACKAGE, 'herald-agent.mjs'), path.join(nodeDir, 'opt', 'herald-agent.mjs'));
    const bundle = heraldSync(['certs', 'bundle', 'agent', 'pkg1', '--dir', c.pki, '--out', path.join(nodeDir, 'pki')]);
    expect(bundle.code, bundle.err).toBe(0);
  });

  afterAll(async () => {
    if (agent) await stopProc(agent);
    if (c) await stopProc(c.ctl.proc);
    c?.cleanup();
    if (nodeDir) fs.rmSync(nodeDir, { recursive: true, force: true });
  });

  it('is one JavaScript file with no native module and nothing of the controller, plus the unit, its options and the cloud-init example', () => {
    expect(fs.readdirSync(PACKAGE).sort()).toEqual([
      'cloud-init.yaml',
      'herald-agent.env',
      'herald-agent.mjs',
      'herald-agent.service',
    ]);
    const text = fs.readFileSync(path.join(PACKAGE, 'herald-agent.mjs'), 'utf8');
    expect(text.startsWith('#!/usr/bin/env node')).toBe(true);
    expect(text).not.toMatch(/better[-_]sqlite3|\.node['"]\)|node-forge/);
    expect(fs.readdirSync(path.join(nodeDir, 'opt'))).toEqual(['herald-agent.mjs']);
  });

  it('run with plain node from a directory holding nothing else, it enrols its endpoint and completes a deployment', async () => {
    const port = await freePort();
    const logFile = path.join(nodeDir, 'agent.log');
    const fd = fs.openSync(logFile, 'a');
    const { spawn } = await import('node:child_process');
    const env = { ...process.env };
    delete env.NODE_PATH;
    const child = spawn(
      process.execPath,
      [
        path.join(nodeDir, 'opt', 'herald-agent.mjs'),
        'agent',
        '--node',
        'pkg1',
        '--controller',
        `https://127.0.0.1:${c.ctl.port}`,
        '--listen',
        `127.0.0.1:${port}`,
        '--pki',
        path.join(nodeDir, 'pki'),
        '--state-dir',
        path.join(nodeDir, 'state'),
      ],
      { cwd: path.join(nodeDir, 'opt'), detached: true, stdio: ['ignore', fd, fd], env },
    );
    fs.closeSync(fd);
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    agent = { name: 'package-agent', child, logFile, exited, log: () => fs.readFileSync(logFile, 'utf8') };
    await waitFor(
      'the packaged agent to announce its endpoint',
      async () => {
        if (hasExited(agent!)) throw new Error(`the packaged agent exited: ${agent!.log()}`);
        const r = await api(c.ctl.port, c.op, 'GET', '/v1/nodes/pkg1');
        return r.status === 200 && JSON.stringify(r.json ?? {}).includes(`:${port}/`);
      },
      20_000,
      50,
    );
    const cfg = await mkConfig(c, {
      name: 'pkg',
      group: 'script',
      config: '#!/bin/sh\necho "packaged $who"\n',
      inputs: [{ name: 'who' }],
    });
    const id = await mkDeployment(c, { node: 'pkg1', config_id: cfg, input_values: { who: 'agent' } });
    const d = await waitDeployment(c, id);
    expect(d.status, d.status_reason).toBe('COMPLETE');
    expect(d.output_values.deploy_stdout).toContain('packaged agent');
    // the wake-up path, not only polling: the node's push connection is up
    const node = await api(c.ctl.port, c.op, 'GET', '/v1/nodes/pkg1');
    expect(node.json.push.connected).toBe(true);
  });

  const analyze = spawnSync('systemd-analyze', ['--version'], { stdio: 'ignore' }).status === 0;
  it.skipIf(!analyze)('the systemd unit passes systemd-analyze verify', () => {
    const r = spawnSync('systemd-analyze', ['verify', path.join(PACKAGE, 'herald-agent.service')], {
      encoding: 'utf8',
    });
    expect({ status: r.status, stderr: r.stderr.trim() }).toEqual({ status: 0, stderr: '' });
  });
});
