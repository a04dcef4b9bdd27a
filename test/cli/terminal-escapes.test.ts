/**
 * A node's terminal control bytes never reach the operator's terminal raw: `deploy logs`,
 * `deploy show` (and its `--json`) and `cluster restart --wait` print them as visible escapes
 * (cli/terminal-text.ts), and `--raw` passes them as they came. Against a real controller and a
 * real agent whose hook prints ESC, CSI, OSC, a bare CR and a C1 control (U+009B).
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { visible } from '../../cli/terminal-text.js';
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

/** What the hook prints: a window title (OSC), a colour and a screen clear (CSI), a CR, C1 CSI. */
const NASTY = 'title \x1b]0;pwned\x07 red \x1b[31mRED\x1b[0m cr\rover c1 \u009b2J end';
/** Every control character a terminal acts on, but \n and \t. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to find control characters
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/;
const SCRIPT = `#!/bin/sh\nprintf 'title \\033]0;pwned\\007 red \\033[31mRED\\033[0m cr\\rover c1 \\302\\2332J end\\n'\nprintf 'err \\033[2J\\n' >&2\n`;

let dir: string;
let ctl: Controller;
let agent: Proc | undefined;
let conn: string[];
let deploymentId: string;
let clusterId: string;

beforeAll(async () => {
  dir = tempDir('herald-escapes-');
  const pki = await makePki(dir, ['n1']);
  ctl = await startController(dir, pki);
  agent = await startAgent(dir, pki, 'n1', ctl.url);
  await waitForNodes(ctl.client, ['n1']);
  conn = ['--controller', ctl.url, '--pki', pki];
  const cfg = await ctl.client.post<{ id: string }>('/v1/configs', { name: 'nasty', group: 'script', config: SCRIPT });
  const made = await runCli(['deploy', 'create', '--node', 'n1', '--config', cfg.id, '--wait', '--json', ...conn]);
  expect(made.code).toBe(0);
  deploymentId = (JSON.parse(made.stdout) as { id: string }).id;
  const plain = await ctl.client.post<{ id: string }>('/v1/configs', {
    name: 'u',
    group: 'script',
    config: '#!/bin/sh\necho stopping\n',
  });
  await waitForNodes(ctl.client, ['n1']);
  const cluster = await runCli([
    'cluster',
    'create',
    '--name',
    'escapes',
    '--nodes',
    'n1',
    '--install',
    cfg.id,
    '--uninstall',
    plain.id,
    '--wait',
    '--json',
    ...conn,
  ]);
  expect(cluster.code).toBe(0);
  clusterId = (JSON.parse(cluster.stdout) as { id: string }).id;
}, 90_000);

afterAll(async () => {
  await agent?.stop();
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('a node printing terminal control sequences', { timeout: 60_000 }, () => {
  it('deploy logs shows them as visible escapes on stdout and stderr, and --raw prints them as they came', async () => {
    const r = await runCli(['deploy', 'logs', deploymentId, ...conn]);
    expect(r.code).toBe(0);
    expect(r.stdout).not.toMatch(CONTROL);
    expect(r.stderr).not.toMatch(CONTROL);
    expect(r.stdout).toBe(`${visible(NASTY)}\n`);
    expect(r.stdout).toContain('\\u001b]0;pwned\\u0007');
    expect(r.stdout).toContain('\\u009b2J');
    expect(r.stderr).toBe('err \\u001b[2J\n');
    const raw = await runCli(['deploy', 'logs', deploymentId, '--raw', ...conn]);
    expect(raw.stdout).toBe(`${NASTY}\n`);
    expect(raw.stderr).toBe('err \x1b[2J\n');
  });

  it('deploy show shows them as visible escapes, --json escapes C1 too (the same JSON value), and --raw prints them as they came', async () => {
    const r = await runCli(['deploy', 'show', deploymentId, ...conn]);
    expect(r.code).toBe(0);
    expect(r.stdout).not.toMatch(CONTROL);
    expect(r.stdout).toContain(visible(NASTY));
    const json = await runCli(['deploy', 'show', deploymentId, '--json', ...conn]);
    expect(json.stdout).not.toMatch(CONTROL);
    expect(JSON.parse(json.stdout).output_values.deploy_stdout).toBe(`${NASTY}\n`);
    const raw = await runCli(['deploy', 'show', deploymentId, '--raw', ...conn]);
    expect(raw.stdout).toContain(NASTY);
  });

  it('cluster restart --wait shows the last output line with visible escapes, and --raw as it came', async () => {
    const r = await runCli([
      'cluster',
      'restart',
      clusterId,
      '--wait',
      '--progress',
      'lines',
      '--timeout',
      '40s',
      ...conn,
    ]);
    expect(r.code).toBe(0);
    expect(r.stdout).not.toMatch(CONTROL);
    expect(r.stderr).not.toMatch(CONTROL);
    // the summary's LAST OUTPUT column
    expect(r.stdout).toContain('\\u001b]0;pwned');
    const raw = await runCli([
      'cluster',
      'restart',
      clusterId,
      '--wait',
      '--progress',
      'lines',
      '--timeout',
      '40s',
      '--raw',
      ...conn,
    ]);
    expect(raw.code).toBe(0);
    expect(raw.stdout).toContain('\x1b]0;pwned\x07');
  });
});
