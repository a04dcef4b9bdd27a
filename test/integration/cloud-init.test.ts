/**
 * `packaging/cloud-init.yaml`, the node side of enrolment (docs/adding-nodes.md): parsed as
 * cloud-init parses it (PyYAML, cloud-init's own parser), its properties checked, and its script
 * run in a temporary directory with stand-ins for the tools that reach outside (curl, node,
 * systemctl, sleep), so that each path is seen: enrolled after failures that may pass (exit 75),
 * never enrolled, a definite refusal (exit 1) not tried again, a download
 * that does not match its SHA-256, a Node too old. In each the token file is gone at the end.
 */
import { spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO } from '../helpers/procs.js';

const YAML_FILE = path.join(REPO, 'packaging', 'cloud-init.yaml');
const pyYaml = spawnSync('python3', ['-c', 'import yaml'], { stdio: 'ignore' }).status === 0;

interface WriteFile {
  path: string;
  permissions?: string;
  content?: string;
}
interface CloudConfig {
  packages?: string[];
  write_files?: WriteFile[];
  runcmd?: Array<string | string[]>;
}

function parse(): CloudConfig {
  const r = spawnSync(
    'python3',
    ['-c', 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))', YAML_FILE],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout) as CloudConfig;
}

const SCRIPT_PATH = '/usr/local/lib/herald/join.sh';
const TOKEN_PATH = '/etc/herald/join-token';

describe.skipIf(!pyYaml)('packaging/cloud-init.yaml', () => {
  let cfg: CloudConfig;
  let script: string;
  let work: string;
  let n = 0;

  beforeAll(() => {
    expect(fs.readFileSync(YAML_FILE, 'utf8').startsWith('#cloud-config\n')).toBe(true);
    cfg = parse();
    script = cfg.write_files?.find((f) => f.path === SCRIPT_PATH)?.content ?? '';
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-cloud-init-'));
  });
  afterAll(() => {
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it('installs nodejs, writes the token 0600 and a script 0700, and runs that script', () => {
    expect(cfg.packages).toContain('nodejs');
    const token = cfg.write_files?.find((f) => f.path === TOKEN_PATH);
    expect(token?.permissions).toBe('0600');
    expect(cfg.write_files?.find((f) => f.path === SCRIPT_PATH)?.permissions).toBe('0700');
    expect(cfg.runcmd).toEqual([['sh', SCRIPT_PATH]]);
  });

  it('its script passes sh -n, gives the token as a file (never on the command line) and checks SHA-256', () => {
    const r = spawnSync('sh', ['-n'], { input: script, encoding: 'utf8' });
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    expect(script).toContain(`--token-file "$TOKEN"`);
    expect(script).not.toMatch(/--token[ =]/);
    expect(script).toMatch(/trap 'rm -f "\$TOKEN"' EXIT/);
    expect(script).toContain('sha256sum');
  });

  /** What the stand-ins saw, and how the script ended. */
  interface Run {
    status: number | null;
    stderr: string;
    calls: string[];
    root: string;
  }

  /**
   * Runs the script under a new root with the files it downloads, `enrollFailures` failed
   * enrolments before one succeeds, and a node of `nodeMajor`.
   */
  function run(o: { enrollFailures: number; nodeMajor?: number; tamper?: boolean; failExit?: number }): Run {
    const dir = path.join(work, `run-${++n}`);
    const root = path.join(dir, 'root');
    const bin = path.join(dir, 'bin');
    const served = path.join(dir, 'served');
    for (const d of [path.join(root, 'etc', 'herald'), bin, served]) fs.mkdirSync(d, { recursive: true });
    const tokenFile = path.join(root, TOKEN_PATH);
    fs.writeFileSync(tokenFile, 'hj1.secret\n', { mode: 0o600 });
    const agent = '// herald-agent\n';
    const unit = '[Unit]\n';
    fs.writeFileSync(path.join(served, 'herald-agent.mjs'), o.tamper ? '// someone else\n' : agent);
    fs.writeFileSync(path.join(served, 'herald-agent.service'), unit);
    const sha = (s: string): string => crypto.createHash('sha256').update(s).digest('hex');
    const filled = script
      .replace('(sha256 of herald-agent.mjs)', sha(agent))
      .replace('(sha256 of herald-agent.service)', sha(unit));
    const log = path.join(dir, 'calls');
    const stub = (name: string, body: string): void =>
      fs.writeFileSync(path.join(bin, name), `#!/bin/sh\necho "${name} $*" >> '${log}'\n${body}\n`, { mode: 0o755 });
    // curl ... -o FILE URL: serves the URL's last name from `served`
    stub(
      'curl',
      `out=; while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done; cp "${served}/$(basename "$1")" "$out"`,
    );
    // node -p (the version check), or node herald-agent.mjs agent enroll ... --token-file FILE ...
    stub(
      'node',
      `if [ "$1" = -p ]; then echo ${o.nodeMajor ?? 20}; exit 0; fi
while [ $# -gt 0 ]; do [ "$1" = --token-file ] && tok=$2; shift; done
[ -f "$tok" ] && echo "token-present $(cat "$tok")" >> '${log}'
count=$(grep -c '^node .* enroll' '${log}')
[ "$count" -gt ${o.enrollFailures} ] || exit ${o.failExit ?? 75}`,
    );
    stub('systemctl', 'exit 0');
    stub('sleep', 'exit 0');
    const r = spawnSync('sh', ['-s', root], {
      input: filled,
      encoding: 'utf8',
      env: { PATH: `${bin}:/usr/bin:/bin`, HOME: dir },
    });
    const calls = fs.existsSync(log) ? fs.readFileSync(log, 'utf8').trim().split('\n') : [];
    expect(fs.existsSync(tokenFile), 'the token file is removed').toBe(false);
    return { status: r.status, stderr: r.stderr, calls, root };
  }

  it('enrols after two failures that may pass (exit 75), waiting 5 s then 10 s, gives the token as a file, removes it and starts the service', () => {
    const r = run({ enrollFailures: 2 });
    expect(r.status, r.stderr).toBe(0);
    const enrolls = r.calls.filter((c) => /^node .* agent enroll /.test(c));
    expect(enrolls).toHaveLength(3);
    expect(enrolls[0]).toContain(`--token-file ${path.join(r.root, TOKEN_PATH)}`);
    expect(r.calls.filter((c) => c.startsWith('token-present '))).toEqual(Array(3).fill('token-present hj1.secret'));
    expect(r.calls.filter((c) => c.startsWith('sleep '))).toEqual(['sleep 5', 'sleep 10']);
    expect(r.calls.filter((c) => c.startsWith('systemctl '))).toEqual([
      'systemctl daemon-reload',
      'systemctl enable --now herald-agent',
    ]);
    expect(fs.readFileSync(path.join(r.root, SCRIPT_PATH.replace('join.sh', 'herald-agent.mjs')), 'utf8')).toBe(
      '// herald-agent\n',
    );
  });

  it('stops at once on a definite refusal (exit 1: a spent token, a wrong CA fingerprint): one run, no wait, the token removed, nothing started', () => {
    const r = run({ enrollFailures: 1_000, failExit: 1 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('enrolment refused (exit 1');
    expect(r.calls.filter((c) => /^node .* agent enroll /.test(c))).toHaveLength(1);
    expect(r.calls.filter((c) => c.startsWith('sleep '))).toEqual([]);
    expect(r.calls.filter((c) => c.startsWith('systemctl '))).toEqual([]);
  });

  it('never passes --force, which would replace the key an earlier run kept for its lost answer', () => {
    expect(script).not.toContain('--force');
  });

  it('gives up after a bounded number of failures that may pass, removes the token, and starts nothing', () => {
    const r = run({ enrollFailures: 1_000 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('enrolment failed 6 times');
    expect(r.calls.filter((c) => /^node .* agent enroll /.test(c))).toHaveLength(6);
    expect(r.calls.filter((c) => c.startsWith('sleep '))).toEqual([
      'sleep 5',
      'sleep 10',
      'sleep 20',
      'sleep 40',
      'sleep 80',
    ]);
    expect(r.calls.filter((c) => c.startsWith('systemctl '))).toEqual([]);
  });

  it('refuses a download that does not match its SHA-256: nothing kept, no enrolment, the token removed', () => {
    const r = run({ enrollFailures: 0, tamper: true });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('does not match its SHA-256');
    expect(fs.readdirSync(path.join(r.root, 'usr', 'local', 'lib', 'herald'))).toEqual([]);
    expect(r.calls.filter((c) => /enroll|systemctl/.test(c))).toEqual([]);
  });

  it('stops before anything is downloaded when node is older than 20, and removes the token', () => {
    const r = run({ enrollFailures: 0, nodeMajor: 18 });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('needs Node 20 or newer');
    expect(r.calls.filter((c) => /^(curl|systemctl) |enroll/.test(c))).toEqual([]);
  });
});
