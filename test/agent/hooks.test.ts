import { chmod, mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HOOK_ERROR_STATUS_CODE, runItem } from '../../agent/hooks/run-item.js';
import type { RunOptions } from '../../agent/hooks/types.js';
import { item, tempDir } from './hooks-helpers.js';

let base: string;
let runsDir: string;
let hooksDir: string;
const agentEnv = {
  PATH: process.env.PATH,
  HOME: '/root',
  LANG: 'C.UTF-8',
  LC_ALL: 'C',
  HERALD_KEY_PATH: '/pki/agent.key',
  AWS_SECRET_ACCESS_KEY: 'sekrit',
  NODE_OPTIONS: '--require /evil.js',
  LD_PRELOAD: '/evil.so',
};

beforeAll(async () => {
  base = await tempDir();
  await chmod(base, 0o755);
  runsDir = join(base, 'runs');
  hooksDir = join(base, 'hooks');
  await mkdir(hooksDir, { mode: 0o755 });
  await chmod(hooksDir, 0o755);
  // A Heat-protocol hook: reads the item on stdin, answers JSON with outputs as top-level keys.
  await writeFile(
    join(hooksDir, 'ansible'),
    `#!${process.execPath}
let s = '';
process.stdin.on('data', (b) => { s += b; });
process.stdin.on('end', () => {
  const item = JSON.parse(s);
  const foo = (item.inputs.find((i) => i.name === 'foo') || {}).value;
  process.stdout.write(JSON.stringify({
    deploy_stdout: 'ran ' + item.group + ' ' + JSON.stringify(item.config),
    deploy_stderr: 'warn',
    deploy_status_code: 0,
    result: 'foo=' + foo,
    undeclared: 'dropped',
  }));
});
`,
    { mode: 0o755 },
  );
  await chmod(join(hooksDir, 'ansible'), 0o755);
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

function opts(over: Partial<RunOptions> = {}): RunOptions {
  return { runsDir, hooksDir, env: agentEnv, uid: 1000, ...over };
}

describe('script group', () => {
  it('passes inputs as env, reads an output file, runs in a 0700 dir, removes it after', async () => {
    const it1 = item({
      config:
        '#!/bin/sh\necho hello\nstat -c "%a" . "$0"\nprintf "%s|%s|%s|%s|%s" "$foo" "$n" "$list" "$flag" "$obj" > "$heat_outputs_path.result"\n',
      inputValues: { foo: 'bar baz', n: 42, list: ['a', 'b'], flag: true, obj: { k: 1 } },
      outputNames: ['result', 'missing'],
    });
    const r = await runItem(it1, opts());
    expect(r.deploy_status_code).toBe(0);
    expect(r.deploy_stdout).toBe('hello\n700\n700\n');
    expect(r.outputs).toEqual({ result: 'bar baz|42|["a","b"]|true|{"k":1}' });
    expect(r.status_reason).toBeUndefined();
    expect(await readdir(runsDir)).toEqual([]);
  });

  it('passes a non-zero exit code through and keeps stderr', async () => {
    const r = await runItem(item({ config: '#!/bin/sh\necho oops >&2\nexit 3\n' }), opts());
    expect(r.deploy_status_code).toBe(3);
    expect(r.deploy_stderr).toBe('oops\n');
    expect(r.status_reason).toBeUndefined();
  });

  it('builds the environment from scratch', async () => {
    const r = await runItem(item({ config: '#!/bin/sh\nexec env\n', inputValues: { foo: 'x' } }), opts());
    const env = Object.fromEntries(
      r.deploy_stdout
        .trim()
        .split('\n')
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    );
    expect(env.PATH).toBe(process.env.PATH);
    expect(env.HOME).toBe('/root');
    expect(env.LANG).toBe('C.UTF-8');
    expect(env.LC_ALL).toBe('C');
    expect(env.foo).toBe('x');
    expect(env.heat_outputs_path).toMatch(/\/runs\/run-[^/]+\/outputs$/);
    const allowed = new Set(['PATH', 'HOME', 'LANG', 'LC_ALL', 'foo', 'heat_outputs_path', 'PWD', 'SHLVL', '_']);
    expect(Object.keys(env).filter((k) => !allowed.has(k))).toEqual([]);
  });

  it('refuses an output that is a symlink, failing the deployment', async () => {
    const r = await runItem(
      item({
        config: '#!/bin/sh\nln -s /etc/passwd "$heat_outputs_path.result"\nprintf ok > "$heat_outputs_path.other"\n',
        outputNames: ['result', 'other'],
      }),
      opts(),
    );
    expect(r.outputs).toEqual({ other: 'ok' });
    expect(r.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
    expect(r.status_reason).toMatch(/^output_not_regular: /);
    expect(r.deploy_stderr).toContain('output_not_regular');
  });

  it('refuses an output over 1 MiB', async () => {
    const r = await runItem(
      item({
        config: '#!/bin/sh\nhead -c 1048577 /dev/zero > "$heat_outputs_path.result"\nexit 5\n',
        outputNames: ['result'],
      }),
      opts(),
    );
    expect(r.outputs).toEqual({});
    expect(r.deploy_status_code).toBe(5);
    expect(r.status_reason).toMatch(/^output_too_large: /);
  });

  it('reads an output of exactly 1 MiB', async () => {
    const r = await runItem(
      item({ config: '#!/bin/sh\nhead -c 1048576 /dev/zero > "$heat_outputs_path.result"\n', outputNames: ['result'] }),
      opts(),
    );
    expect(r.deploy_status_code).toBe(0);
    expect((r.outputs.result as string).length).toBe(1048576);
  });

  it('refuses a config that is not a string', async () => {
    const r = await runItem(item({ config: { not: 'a script' } }), opts());
    expect(r.status_reason).toMatch(/^bad_config: /);
  });
});

describe('name and value checks (nothing spawned)', () => {
  const cases: Array<[string, Parameters<typeof item>[0], string]> = [
    ['group with a slash', { group: 'a/b' }, 'bad_name'],
    ['group ..', { group: '..' }, 'bad_name'],
    ['output ../../etc/shadow', { outputNames: ['../../etc/shadow'] }, 'bad_name'],
    ['input LD_PRELOAD', { inputValues: { LD_PRELOAD: '/evil.so' } }, 'forbidden_input'],
    ['input PATH', { inputValues: { PATH: '/evil' } }, 'forbidden_input'],
    ['input with a dash', { inputValues: { 'a-b': 'x' } }, 'bad_name'],
    ['NUL in an input', { inputValues: { foo: 'a\0b' } }, 'nul_in_input'],
    ['NUL nested in a list', { inputValues: { foo: ['ok', 'a\0b'] } }, 'nul_in_input'],
    [
      'component tool ../x',
      {
        group: 'component',
        inputValues: { deploy_action: 'CREATE' },
        config: { configs: [{ actions: ['CREATE'], tool: '../x', config: '' }] },
      },
      'bad_name',
    ],
    ['component config not an object', { group: 'component', config: 'x' }, 'bad_config'],
  ];
  for (const [name, over, code] of cases) {
    it(`${name} → ${code}`, async () => {
      let spawned = false;
      const r = await runItem(
        item(over),
        opts({
          onSpawn: () => {
            spawned = true;
          },
        }),
      );
      expect(spawned).toBe(false);
      expect(r.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
      expect(r.status_reason?.split(':')[0]).toBe(code);
      expect(r.deploy_stderr).toContain(code);
    });
  }
});

describe('component group', () => {
  const config = {
    configs: [
      { actions: ['CREATE', 'UPDATE'], tool: 'script', config: '#!/bin/sh\necho install\n' },
      { actions: ['DELETE'], tool: 'script', config: '#!/bin/sh\necho uninstall\n' },
      { actions: ['CHECK'], tool: 'ansible', config: { playbook: 'check.yml' } },
    ],
  };
  it('runs the sub-config of the action', async () => {
    const create = await runItem(
      item({ group: 'component', config, inputValues: { deploy_action: 'CREATE' } }),
      opts(),
    );
    expect(create).toMatchObject({ deploy_status_code: 0, deploy_stdout: 'install\n' });
    const del = await runItem(item({ group: 'component', config, inputValues: { deploy_action: 'DELETE' } }), opts());
    expect(del).toMatchObject({ deploy_status_code: 0, deploy_stdout: 'uninstall\n' });
  });
  it('succeeds without running anything when no sub-config matches', async () => {
    let spawned = false;
    const r = await runItem(
      item({ group: 'component', config, inputValues: { deploy_action: 'RESTART' } }),
      opts({
        onSpawn: () => {
          spawned = true;
        },
      }),
    );
    expect(spawned).toBe(false);
    expect(r).toEqual({ deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} });
  });
  it('runs a hooks-dir tool with the sub-config as the item config', async () => {
    const r = await runItem(
      item({ group: 'component', config, inputValues: { deploy_action: 'CHECK', foo: 1 }, outputNames: ['result'] }),
      opts(),
    );
    expect(r).toMatchObject({
      deploy_status_code: 0,
      deploy_stdout: 'ran ansible {"playbook":"check.yml"}',
      outputs: { result: 'foo=1' },
    });
  });
});

describe('hooks dir groups (Heat hook protocol)', () => {
  it('sends the item on stdin and moves declared outputs into outputs', async () => {
    const r = await runItem(
      item({
        group: 'ansible',
        config: { playbook: 'site.yml' },
        inputValues: { foo: 'bar' },
        outputNames: ['result'],
      }),
      opts(),
    );
    expect(r).toEqual({
      deploy_status_code: 0,
      deploy_stdout: 'ran ansible {"playbook":"site.yml"}',
      deploy_stderr: 'warn',
      outputs: { result: 'foo=bar' },
    });
  });
  it('fails an unknown group with unknown_group', async () => {
    const r = await runItem(item({ group: 'puppet' }), opts());
    expect(r.status_reason).toMatch(/^unknown_group: /);
    expect(r.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
    const none = await runItem(item({ group: 'ansible' }), opts({ hooksDir: undefined }));
    expect(none.status_reason).toMatch(/^unknown_group: /);
  });
  it('fails a hook that answers no JSON with hook_failed, keeping its exit code', async () => {
    await writeFile(join(hooksDir, 'broken'), '#!/bin/sh\necho not json\nexit 2\n', { mode: 0o755 });
    const r = await runItem(item({ group: 'broken' }), opts());
    expect(r.deploy_status_code).toBe(2);
    expect(r.deploy_stdout).toBe('not json\n');
    expect(r.status_reason).toMatch(/^hook_failed: /);
  });
  it('uses the exit code when the JSON has no deploy_status_code', async () => {
    await writeFile(join(hooksDir, 'partial'), '#!/bin/sh\ncat >/dev/null\necho \'{"deploy_stdout":"x"}\'\nexit 4\n', {
      mode: 0o755,
    });
    const r = await runItem(item({ group: 'partial' }), opts());
    expect(r).toMatchObject({ deploy_status_code: 4, deploy_stdout: 'x' });
  });
});

describe('hooks dir ownership when running as root', () => {
  it('accepts a root-owned 0755 hooks dir', async () => {
    if (process.getuid?.() !== 0) return; // the files must really be root-owned
    const r = await runItem(item({ group: 'ansible', outputNames: ['result'] }), opts({ uid: 0 }));
    expect(r.deploy_status_code).toBe(0);
  });
  it('refuses a group-writable hooks dir as root, accepts it as another user', async () => {
    const dir = join(base, 'loose');
    await mkdir(dir);
    await chmod(dir, 0o775);
    await writeFile(join(dir, 'ansible'), '#!/bin/sh\necho \'{"deploy_status_code":0}\'\n', { mode: 0o755 });
    const asRoot = await runItem(item({ group: 'ansible' }), opts({ uid: 0, hooksDir: dir }));
    expect(asRoot.status_reason).toMatch(/^unsafe_hooks_dir: /);
    expect(asRoot.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
    const asUser = await runItem(item({ group: 'ansible' }), opts({ uid: 1000, hooksDir: dir }));
    expect(asUser.deploy_status_code).toBe(0);
  });
  it('refuses an other-writable hook file as root', async () => {
    const dir = join(base, 'loosefile');
    await mkdir(dir, { mode: 0o755 });
    await chmod(dir, 0o755);
    await writeFile(join(dir, 'ansible'), "#!/bin/sh\necho '{}'\n");
    await chmod(join(dir, 'ansible'), 0o757);
    const r = await runItem(item({ group: 'ansible' }), opts({ uid: 0, hooksDir: dir }));
    expect(r.status_reason).toMatch(/^unsafe_hooks_dir: /);
  });
  it('checks the target of a symlinked hook', async () => {
    const dir = join(base, 'linked');
    const target = join(base, 'target');
    await mkdir(dir, { mode: 0o755 });
    await chmod(dir, 0o755);
    await mkdir(target);
    await chmod(target, 0o777);
    await writeFile(join(target, 'real'), "#!/bin/sh\necho '{}'\n", { mode: 0o755 });
    const { symlink } = await import('node:fs/promises');
    await symlink(join(target, 'real'), join(dir, 'ansible'));
    const r = await runItem(item({ group: 'ansible' }), opts({ uid: 0, hooksDir: dir }));
    expect(r.status_reason).toMatch(/^unsafe_hooks_dir: /);
  });
});
