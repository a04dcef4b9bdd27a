/**
 * The operator CLI against a real controller (bin/herald controller, real certificates from
 * certs/), driven as a child process: tables, --json, one-line errors.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makePki, runCli, startController, tempDir, type Controller } from './harness.js';

let dir: string;
let pki: string;
let ctl: Controller;
let conn: string[];

beforeAll(async () => {
  dir = tempDir('herald-cli-');
  pki = await makePki(dir);
  ctl = await startController(dir, pki);
  conn = ['--controller', ctl.url, '--pki', pki];
});

afterAll(async () => {
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** One line on stderr, `herald: <code>: ...`, no stack. */
function expectOneLineError(stderr: string, code: string): void {
  const lines = stderr.trim().split('\n');
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(new RegExp(`^herald: ${code}: `));
  expect(stderr).not.toMatch(/\n\s+at /);
}

describe('herald node', { timeout: 60_000 }, () => {
  it('adds, lists (table and JSON), shows and removes a node', async () => {
    const add = await runCli(['node', 'add', 'web1', ...conn]);
    expect(add).toMatchObject({ code: 0, stderr: '' });
    expect(add.stdout).toMatch(/web1/);

    const ls = await runCli(['node', 'list', ...conn]);
    expect(ls.code).toBe(0);
    const [header, ...rows] = ls.stdout.trimEnd().split('\n');
    expect(header).toMatch(/^ID\s+ENDPOINT\s+PUSH/);
    expect(rows.some((r) => r.startsWith('web1 '))).toBe(true);

    // connection options may also stand before the subcommand
    const json = await runCli(['node', ...conn, 'ls', '--json']);
    expect(json.code).toBe(0);
    const body = JSON.parse(json.stdout) as { items: { id: string }[] };
    expect(body.items.map((n) => n.id)).toContain('web1');

    const show = await runCli(['node', 'show', 'web1', ...conn, '--json']);
    expect(show.code).toBe(0);
    expect(JSON.parse(show.stdout)).toMatchObject({ id: 'web1' });

    const rm = await runCli(['node', 'rm', 'web1', ...conn]);
    expect(rm.code).toBe(0);
    const gone = await runCli(['node', 'show', 'web1', ...conn]);
    expect(gone.code).not.toBe(0);
    expectOneLineError(gone.stderr, '(not_found|node_deleted)');
  });

  it('a duplicate node is one line with the code', async () => {
    expect((await runCli(['node', 'add', 'dup1', ...conn])).code).toBe(0);
    const again = await runCli(['node', 'add', 'dup1', ...conn]);
    expect(again.code).not.toBe(0);
    expectOneLineError(again.stderr, 'node_exists');
  });
});

describe('herald config and deploy', { timeout: 60_000 }, () => {
  it('creates a config from a file with inputs and outputs, lists and shows it', async () => {
    const script = path.join(dir, 'hello.sh');
    fs.writeFileSync(script, '#!/bin/sh\necho "hello $who"\n');
    const created = await runCli([
      'config',
      'create',
      '--name',
      'hello',
      '--file',
      script,
      '--input',
      'who=world',
      '--hidden-input',
      'secret=s3cr3t',
      '--output',
      'greeting',
      '--json',
      ...conn,
    ]);
    expect(created.code).toBe(0);
    const cfg = JSON.parse(created.stdout) as {
      id: string;
      group: string;
      inputs: { name: string; default?: unknown }[];
    };
    expect(cfg.group).toBe('script');
    expect(cfg.inputs.find((i) => i.name === 'who')?.default).toBe('world');
    expect(created.stdout).not.toContain('s3cr3t');

    const ls = await runCli(['config', 'ls', ...conn]);
    expect(ls.stdout).toMatch(new RegExp(`^${cfg.id}\\s+hello\\s+script`, 'm'));
    const show = await runCli(['config', 'show', cfg.id, ...conn]);
    expect(show.code).toBe(0);
    expect(show.stdout).toContain('echo "hello $who"');
    expect(show.stdout).not.toContain('s3cr3t');
  });

  it('creates, updates, shows and removes a deployment', async () => {
    expect((await runCli(['node', 'add', 'd1', ...conn])).code).toBe(0);
    const script = path.join(dir, 'noop.sh');
    fs.writeFileSync(script, '#!/bin/sh\ntrue\n');
    const cfg = JSON.parse(
      (
        await runCli([
          'config',
          'create',
          '--name',
          'noop',
          '--file',
          script,
          '--input',
          'port:Number=80',
          '--json',
          ...conn,
        ])
      ).stdout,
    ) as { id: string };

    const created = await runCli([
      'deploy',
      'create',
      '--node',
      'd1',
      '--config',
      cfg.id,
      '--input',
      'port=8080',
      '--json',
      ...conn,
    ]);
    expect(created.code).toBe(0);
    const d = JSON.parse(created.stdout) as { deployment_id: string; revision: number; status: string; node: string };
    expect(d).toMatchObject({ node: 'd1', revision: 1, status: 'IN_PROGRESS' });

    const upd = await runCli(['deploy', 'update', d.deployment_id, '--input', 'port=9090', ...conn]);
    expect(upd.code).toBe(0);
    expect(upd.stdout).toMatch(/revision 2/);

    const show = await runCli(['deploy', 'show', d.deployment_id, '--json', ...conn]);
    expect(JSON.parse(show.stdout)).toMatchObject({ deployment_id: d.deployment_id, revision: 2 });

    const human = await runCli(['deploy', 'show', d.deployment_id, ...conn]);
    expect(human.stdout).toMatch(/^revision:\s+2$/m);

    expect((await runCli(['deploy', 'rm', d.deployment_id, ...conn])).code).toBe(0);
  });

  it('a deployment to an unknown node is one line: unknown_node', async () => {
    const script = path.join(dir, 'noop2.sh');
    fs.writeFileSync(script, 'true\n');
    const cfg = JSON.parse(
      (await runCli(['config', 'create', '--name', 'noop2', '--file', script, '--json', ...conn])).stdout,
    ) as { id: string };
    const r = await runCli(['deploy', 'create', '--node', 'nosuch', '--config', cfg.id, ...conn]);
    expect(r.code).not.toBe(0);
    expectOneLineError(r.stderr, 'unknown_node');
  });
});

describe('errors', { timeout: 60_000 }, () => {
  it('a bad group name is one line with the code and the field', async () => {
    const script = path.join(dir, 'x.sh');
    fs.writeFileSync(script, 'true\n');
    const r = await runCli(['config', 'create', '--name', 'x', '--group', 'Bad Group!', '--file', script, ...conn]);
    expect(r.code).toBe(1);
    expectOneLineError(r.stderr, '(invalid_request|bad_name)');
    expect(r.stderr).toMatch(/\(field group\)/);
    expect(r.stdout).toBe('');
  });

  it('connection refused is one line', async () => {
    const r = await runCli(['node', 'ls', '--controller', 'https://127.0.0.1:1', '--pki', pki]);
    expect(r.code).toBe(1);
    expectOneLineError(r.stderr, 'api_error');
    expect(r.stderr).toMatch(/connection refused/);
  });

  it('a server with another identity than --controller-id is refused before anything is sent', async () => {
    const r = await runCli(['node', 'ls', '--controller-id', 'other', ...conn]);
    expect(r.code).toBe(1);
    expectOneLineError(r.stderr, 'wrong_peer');
  });

  it('a missing PKI is one line naming the file', async () => {
    const r = await runCli(['cluster', 'ls', '--controller', ctl.url, '--pki', path.join(dir, 'nope')]);
    expect(r.code).toBe(1);
    expectOneLineError(r.stderr, 'pki_missing');
  });

  it('--help of every command shows examples', async () => {
    for (const cmd of [
      ['node', 'ls'],
      ['config', 'create'],
      ['deploy', 'create'],
      ['cluster', 'restart'],
    ]) {
      const r = await runCli([...cmd, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/Examples:/);
      expect(r.stdout).toMatch(/--controller <url>/);
    }
  });
});
