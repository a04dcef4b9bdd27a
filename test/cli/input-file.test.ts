/**
 * `--input-file` and the hidden-input warning, with the real CLI process
 * against a real controller: values come from a JSON file or standard input instead of the
 * command line (/proc/<pid>/cmdline is readable by every local user), `--input` wins for a key
 * given both ways, a bad file is one line `bad_option` naming `--input-file` and sends nothing,
 * and a hidden input's value given with `--input` draws a `hidden_input_in_argv` warning.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makePki, runCli, startController, tempDir, type Controller } from './harness.js';

type Obj = Record<string, unknown>;

let dir: string;
let ctl: Controller;
let conn: string[];
let install: string;
let uninstall: string;

const SECRET = 'pa55-w0rd-never-printed';

beforeAll(async () => {
  dir = tempDir('herald-cli-inputs-');
  const pki = await makePki(dir);
  ctl = await startController(dir, pki);
  conn = ['--controller', ctl.url, '--pki', pki];
  for (const id of ['in1', 'in2', 'in3', 'in4', 'in5']) await ctl.client.post('/v1/nodes', { id });
  const inputs = [
    { name: 'user', type: 'String' },
    { name: 'extra', type: 'String' },
    { name: 'port', type: 'Number' },
    { name: 'password', type: 'String', hidden: true },
    { name: 'token', type: 'String' },
  ];
  install = String(
    (await ctl.client.post<Obj>('/v1/configs', { name: 'inst', group: 'script', config: '#!/bin/sh\n', inputs })).id,
  );
  // the uninstall config hides `token`, which the install config shows
  uninstall = String(
    (
      await ctl.client.post<Obj>('/v1/configs', {
        name: 'uninst',
        group: 'script',
        config: '#!/bin/sh\n',
        inputs: inputs.map((i) => (i.name === 'token' ? { ...i, hidden: true } : i)),
      })
    ).id,
  );
}, 60_000);

afterAll(async () => {
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

function file(name: string, text: string): string {
  const f = path.join(dir, name);
  fs.writeFileSync(f, text, { mode: 0o600 });
  return f;
}

async function deploymentCount(): Promise<number> {
  return ((await ctl.client.get<{ items: unknown[] }>('/v1/deployments')).items ?? []).length;
}

const WARNING = /^herald: warning: hidden_input_in_argv: /;

function warnings(stderr: string): string[] {
  return stderr.split('\n').filter((l) => WARNING.test(l));
}

describe('--input-file', { timeout: 60_000 }, () => {
  it('deploy create takes the values from a JSON file, --input winning for a key given both ways, with no warning', async () => {
    const f = file(
      'values.json',
      JSON.stringify({ user: 'from-file', extra: 'only-in-file', port: 8080, password: SECRET }),
    );
    const r = await runCli([
      'deploy',
      'create',
      '--node',
      'in1',
      '--config',
      install,
      '--input-file',
      f,
      '--input',
      'user=from-argv',
      '--json',
      ...conn,
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const d = JSON.parse(r.stdout) as { input_values: Obj };
    expect(d.input_values).toMatchObject({ user: 'from-argv', extra: 'only-in-file', port: 8080, password: '***' });
  });

  it('deploy update reads the values from standard input with --input-file -', async () => {
    const created = await ctl.client.post<Obj>('/v1/deployments', {
      node: 'in2',
      config_id: install,
      input_values: { user: 'a' },
    });
    const r = await runCli(['deploy', 'update', String(created.id), '--input-file', '-', '--json', ...conn], {
      input: JSON.stringify({ user: 'from-stdin', password: SECRET }),
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    expect((JSON.parse(r.stdout) as { input_values: Obj }).input_values).toMatchObject({
      user: 'from-stdin',
      password: '***',
    });
  });

  const bad: Array<[string, () => string[], string | undefined]> = [
    ['a missing file', () => ['--input-file', path.join(dir, 'nope.json')], undefined],
    ['a directory', () => ['--input-file', dir], undefined],
    [
      'a file that is not JSON (its content is never printed)',
      () => ['--input-file', file('bad.json', `{"password": ${SECRET}}`)],
      undefined,
    ],
    ['a JSON array', () => ['--input-file', file('array.json', '[1,2]')], undefined],
    ['JSON null', () => ['--input-file', file('null.json', 'null')], undefined],
    ['a JSON string', () => ['--input-file', file('string.json', `"${SECRET}"`)], undefined],
    ['standard input that is not JSON', () => ['--input-file', '-'], `password=${SECRET}`],
    [
      'a file over 1 MiB',
      () => ['--input-file', file('big.json', JSON.stringify({ extra: 'x'.repeat(1024 * 1024) }))],
      undefined,
    ],
  ];
  it.each(bad)('%s is one line bad_option naming --input-file, and nothing is sent', async (_what, args, input) => {
    const before = await deploymentCount();
    const r = await runCli(
      ['deploy', 'create', '--node', 'in1', '--config', install, ...args(), ...conn],
      input === undefined ? {} : { input },
    );
    expect(r.code).toBe(1);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toMatch(/^herald: bad_option: --input-file /);
    expect(r.stderr).not.toContain(SECRET);
    expect(r.stderr).not.toMatch(/\n\s+at /);
    expect(await deploymentCount()).toBe(before);
  });

  it('every command that takes --input documents --input-file, and which one wins, in --help', async () => {
    for (const cmd of [
      ['deploy', 'create'],
      ['deploy', 'update'],
      ['cluster', 'create'],
    ]) {
      const r = await runCli([...cmd, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain('--input-file <file>');
      expect(r.stdout.replace(/\s+/g, ' ')).toContain('--input wins for a key given both ways');
    }
  });
});

describe('a hidden input on the command line', { timeout: 60_000 }, () => {
  it('deploy create warns hidden_input_in_argv naming the hidden input (and only it), and still deploys', async () => {
    const r = await runCli([
      'deploy',
      'create',
      '--node',
      'in3',
      '--config',
      install,
      '--input',
      `password=${SECRET}`,
      '--input',
      'user=bob',
      ...conn,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const w = warnings(r.stderr);
    expect(w).toHaveLength(1);
    expect(w[0]).toContain('"password"');
    expect(w[0]).toContain('--input-file');
    expect(r.stderr).not.toContain(SECRET);
  });

  it("deploy update warns for a hidden input of the deployment's config", async () => {
    const created = await ctl.client.post<Obj>('/v1/deployments', { node: 'in3', config_id: install, name: 'upd' });
    const r = await runCli(['deploy', 'update', String(created.id), '--input', `password=${SECRET}`, ...conn]);
    expect(r.code, r.stderr).toBe(0);
    expect(warnings(r.stderr)).toHaveLength(1);
  });

  it('cluster create warns for an input hidden by the uninstall config only, and not for the same input given in a file', async () => {
    const argv = await runCli([
      'cluster',
      'create',
      '--name',
      'c-argv',
      '--nodes',
      'in4',
      '--install',
      install,
      '--uninstall',
      uninstall,
      '--input',
      `token=${SECRET}`,
      '--input',
      'user=u',
      ...conn,
    ]);
    expect(argv.code, argv.stderr).toBe(0);
    const w = warnings(argv.stderr);
    expect(w).toHaveLength(1);
    expect(w[0]).toContain('"token"');
    const f = file('cluster.json', JSON.stringify({ token: SECRET }));
    const fromFile = await runCli([
      'cluster',
      'create',
      '--name',
      'c-file',
      '--nodes',
      'in5',
      '--install',
      install,
      '--uninstall',
      uninstall,
      '--input-file',
      f,
      ...conn,
    ]);
    expect(fromFile.code, fromFile.stderr).toBe(0);
    expect(warnings(fromFile.stderr)).toEqual([]);
  });

  it("config create warns when a hidden input's default is on the command line", async () => {
    const script = file('s.sh', '#!/bin/sh\n');
    const r = await runCli([
      'config',
      'create',
      '--name',
      'hid',
      '--file',
      script,
      '--hidden-input',
      `password=${SECRET}`,
      ...conn,
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(warnings(r.stderr)).toHaveLength(1);
  });
});
