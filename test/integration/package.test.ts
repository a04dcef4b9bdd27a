/**
 * The self-contained agent of docs/installing.md (`npm run package`): the one file, copied into a directory
 * that holds nothing else and run with plain `node` (no node_modules anywhere above it), joins a
 * real `bin/herald controller` and completes a deployment; the systemd unit passes
 * `systemd-analyze verify` where that command exists.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { builtinModules } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { handleOf } from '../../cli/testbed/process.js';
import { makeEnrolBed, type EnrolBed } from '../helpers/enrollment.js';
import { makeCluster, mkConfig, mkDeployment, waitDeployment, type Cluster } from '../helpers/agent-cluster.js';
import { api, freePort, hasExited, heraldSync, isBuilt, REPO, stopProc, waitFor, type Proc } from '../helpers/procs.js';

const built = isBuilt();
/** Modules an old bundle looked up outside itself (ws's optional native accelerators). */
const TRAPPED = ['bufferutil', 'utf-8-validate'];
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
    // a node_modules above the file, as a root agent could find one: each module would leave a mark
    for (const m of TRAPPED) {
      const d = path.join(nodeDir, 'node_modules', m);
      fs.mkdirSync(d, { recursive: true });
      fs.writeFileSync(path.join(d, 'package.json'), JSON.stringify({ name: m, version: '99.0.0', main: 'index.js' }));
      fs.writeFileSync(
        path.join(d, 'index.js'),
        `require('node:fs').writeFileSync(${JSON.stringify(path.join(nodeDir, `loaded-${m}`))}, 'x');\nmodule.exports = {};\n`,
      );
    }
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
    const proc: Proc = handleOf(`package-${node}`, child, logFile);
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

  it("requires and imports nothing but Node's built-ins", () => {
    const text = fs.readFileSync(path.join(PACKAGE, 'herald-agent.mjs'), 'utf8');
    const specs = new Set<string>();
    for (const re of [
      /\b(?:__require|require)\(\s*["'`]([^"'`]+)["'`]\s*\)/g,
      /\bimport\(\s*["'`]([^"'`]+)["'`]\s*\)/g,
      /^\s*(?:import|export)\b[^;'"]*?\bfrom\s*["']([^"']+)["']/gm,
      /^\s*import\s*["']([^"']+)["']/gm,
    ])
      for (const m of text.matchAll(re)) specs.add(m[1]!);
    expect(specs.size).toBeGreaterThan(10); // the scan sees the bundle's requires at all
    const builtin = new Set(builtinModules);
    expect([...specs].filter((s) => !s.startsWith('node:') && !builtin.has(s))).toEqual([]);
  });

  it('loaded nothing from the node_modules above it while it ran (a planted bufferutil and utf-8-validate)', () => {
    // after the runs above, which opened WebSockets (ws looks for both when it loads)
    expect(agents.length).toBeGreaterThan(0);
    expect(TRAPPED.filter((m) => fs.existsSync(path.join(nodeDir, `loaded-${m}`)))).toEqual([]);
  });

  const analyze = spawnSync('systemd-analyze', ['--version'], { stdio: 'ignore' }).status === 0;
  it.skipIf(!analyze)('the systemd unit passes systemd-analyze verify', () => {
    const r = spawnSync('systemd-analyze', ['verify', path.join(PACKAGE, 'herald-agent.service')], {
      encoding: 'utf8',
    });
    expect({ status: r.status, stderr: r.stderr.trim() }).toEqual({ status: 0, stderr: '' });
  });
});

/**
 * docs/adding-nodes.md with the package: a node holding only the package file, a join token and the CA's
 * fingerprint enrols (`node herald-agent.mjs agent enroll`), announces itself and completes a
 * deployment; a wrong fingerprint is refused before anything is sent.
 */
describe.skipIf(!built)('enrolling a node that has only the package file', { timeout: 90_000 }, () => {
  let e: EnrolBed;
  let work: string;
  let pki: string;
  let node: string;
  let port: number;
  let ctl: Proc;
  let agent: Proc | undefined;
  let fingerprint: string;
  const op = (): { ca: Buffer; cert: Buffer; key: Buffer } => ({
    ca: fs.readFileSync(path.join(pki, 'ca.crt')),
    cert: fs.readFileSync(path.join(pki, 'operator', 'admin.crt')),
    key: fs.readFileSync(path.join(pki, 'operator', 'admin.key')),
  });

  beforeAll(async () => {
    e = await makeEnrolBed({ prefix: 'herald-pkg-enroll-', controllerArgs: ['--issuer', 'i1'] });
    ({ work, pki, port, ctl } = e);
    const fp = spawnSync('openssl', ['x509', '-in', path.join(pki, 'ca.crt'), '-noout', '-fingerprint', '-sha256'], {
      encoding: 'utf8',
    });
    fingerprint = fp.stdout.trim().split('=')[1]!;
    node = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-bare-node-'));
    fs.copyFileSync(path.join(PACKAGE, 'herald-agent.mjs'), path.join(node, 'herald-agent.mjs'));
  });

  afterAll(async () => {
    if (agent) await stopProc(agent);
    if (ctl) await stopProc(ctl);
    await e?.close();
    if (node) fs.rmSync(node, { recursive: true, force: true });
  });

  /** `node herald-agent.mjs <args>` in the node's directory, with no NODE_PATH. */
  function packaged(args: string[]): { code: number | null; out: string; err: string } {
    const env = { ...process.env };
    delete env.NODE_PATH;
    const r = spawnSync(process.execPath, [path.join(node, 'herald-agent.mjs'), ...args], {
      cwd: node,
      env,
      encoding: 'utf8',
      timeout: 30_000,
    });
    return { code: r.status, out: r.stdout, err: r.stderr };
  }

  it('enrols with a token and the fingerprint, announces itself and completes a deployment', async () => {
    const token = e.token('pe1', ['--ip', '127.0.0.1']);
    const enrol = (fp: string): { code: number | null; out: string; err: string } =>
      packaged([
        'agent',
        'enroll',
        '--controller',
        `https://127.0.0.1:${port}`,
        '--ca-sha256',
        fp,
        '--token',
        token,
        '--node',
        'pe1',
        '--pki',
        path.join(node, 'pki'),
      ]);
    // a controller presenting another CA than the fingerprint: refused before the token is sent
    const wrong = enrol('00'.repeat(32));
    expect(wrong.code).not.toBe(0);
    expect(wrong.err).toMatch(/^herald: ca_fingerprint_mismatch: /);
    const ok = enrol(fingerprint);
    expect(ok.code, ok.err).toBe(0);
    expect(ok.out).toMatch(/^enrolled spiffe:\/\/herald\.local\/agent\/pe1: /);
    const key = path.join(node, 'pki', 'agent', 'pe1.key');
    expect(fs.statSync(key).mode & 0o777).toBe(0o600);
    expect(fs.readFileSync(path.join(node, 'pki', 'ca.crt'), 'utf8')).toBe(
      fs.readFileSync(path.join(pki, 'ca.crt'), 'utf8'),
    );
    for (const f of ['wake-signing.jwks', 'revoked.json']) expect(fs.existsSync(path.join(node, 'pki', f))).toBe(true);
    // the node holds the package, its PKI layout and nothing else
    expect(fs.readdirSync(node).sort()).toEqual(['herald-agent.mjs', 'pki']);

    const aport = await freePort();
    const logFile = path.join(work, 'agent-pe1.log');
    const fd = fs.openSync(logFile, 'a');
    const env = { ...process.env };
    delete env.NODE_PATH;
    const child = spawn(
      process.execPath,
      [
        path.join(node, 'herald-agent.mjs'),
        'agent',
        '--node',
        'pe1',
        '--controller',
        `https://127.0.0.1:${port}`,
        '--listen',
        `127.0.0.1:${aport}`,
        '--pki',
        path.join(node, 'pki'),
        '--state-dir',
        path.join(node, 'state'),
      ],
      { cwd: node, detached: true, stdio: ['ignore', fd, fd], env },
    );
    fs.closeSync(fd);
    agent = handleOf('package-pe1', child, logFile);
    const a = agent;
    await waitFor(
      'the enrolled agent to announce itself',
      async () => {
        if (hasExited(a)) throw new Error(`the packaged agent exited: ${a.log()}`);
        const r = await api(port, op(), 'GET', '/v1/nodes/pe1');
        return r.status === 200 && r.json.push.connected === true;
      },
      20_000,
      50,
    );
    const cfg = await api(port, op(), 'POST', '/v1/configs', {
      name: 'pe',
      group: 'script',
      config: '#!/bin/sh\necho enrolled-and-running\n',
    });
    const d = await api(port, op(), 'POST', '/v1/deployments', { node: 'pe1', config_id: cfg.json.id });
    expect(d.status).toBe(201);
    const done = await waitFor(
      'the deployment',
      async () => {
        const r = await api(port, op(), 'GET', `/v1/deployments/${d.json.id}`);
        return r.json.status !== 'IN_PROGRESS' ? r.json : undefined;
      },
      30_000,
      100,
    );
    expect(done.status, done.status_reason).toBe('COMPLETE');
    expect(done.output_values.deploy_stdout).toContain('enrolled-and-running');
    const n = await api(port, op(), 'GET', '/v1/nodes/pe1');
    expect(n.json.certificate).toMatchObject({ renewal: 'ok', renewal_failures: 0 });
    expect(n.json.certificate.issued_at).not.toBeNull();
  });
});
