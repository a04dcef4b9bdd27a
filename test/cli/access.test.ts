/**
 * `herald access`, `herald whoami`, `herald can-i` and node labels (docs/access.md) against a real
 * controller, driven as child processes: a grant made and listed, what `whoami` says, `can-i`'s
 * answer and exit status agreeing with what the route then does, and one-line refusals.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openPki } from '../../cli/testbed/pki.js';
import { makePki, runCli, startController, tempDir, type Controller } from './harness.js';

let dir: string;
let pki: string;
let ctl: Controller;
let conn: string[];

beforeAll(async () => {
  dir = tempDir('herald-cli-access-');
  pki = await makePki(dir);
  await openPki(pki).issue('operator', 'oncall');
  ctl = await startController(dir, pki);
  conn = ['--controller', ctl.url, '--pki', pki];
}, 60_000);

afterAll(async () => {
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('herald access, whoami and can-i', { timeout: 60_000 }, () => {
  it('grants a scoped viewer; can-i answers as the routes then decide, with the rule', async () => {
    for (const [id, team] of [
      ['web-1', 'web'],
      ['db-1', 'db'],
    ] as const)
      expect((await runCli(['node', 'add', id, '--label', `team=${team}`, ...conn])).code).toBe(0);
    const grant = await runCli(['access', 'grant', 'oncall', 'viewer', '--scope', 'label:team=web', ...conn]);
    expect(grant).toMatchObject({ code: 0, stderr: '' });
    expect(grant.stdout).toMatch(/^grant \S+: operator\/oncall is viewer on label:team=web\n$/);
    const ls = await runCli(['access', 'ls', ...conn]);
    expect(ls.stdout).toMatch(/^bootstrap:admin\s+admin\s+admin\s+\*\s+bootstrap/m);
    expect(ls.stdout).toMatch(/\soncall\s+viewer\s+label:team=web\s+database\s/);

    const as = [...conn, '--as', 'oncall'];
    const me = await runCli(['whoami', ...as]);
    expect(me.code).toBe(0);
    expect(me.stdout).toMatch(/^operator\/oncall \(spiffe:\/\/herald\.local\/operator\/oncall\)$/m);
    expect(me.stdout).toMatch(/^read:\s+label:team=web$/m);
    expect(me.stdout).toMatch(/^deploy:\s+-$/m);

    const yes = await runCli(['can-i', 'read', 'node:web-1', ...as]);
    expect(yes).toMatchObject({ code: 0, stderr: '' });
    expect(yes.stdout.split('\n')[0]).toBe('yes');
    expect((await runCli(['node', 'show', 'web-1', ...as])).code).toBe(0);

    const outside = await runCli(['can-i', 'read', 'node:db-1', ...as]);
    expect(outside.code).toBe(1);
    expect(outside.stdout).toBe(
      "no (out_of_scope)\nread on node db-1: outside operator/oncall's read scope (label:team=web)\n",
    );
    const shown = await runCli(['node', 'show', 'db-1', ...as]);
    expect(shown.code).toBe(1);
    expect(shown.stderr).toBe(
      "herald: out_of_scope: read on node db-1: outside operator/oncall's read scope (label:team=web)\n",
    );

    const write = await runCli(['can-i', 'admin', 'node:web-1', ...as, '--json']);
    expect(write.code).toBe(1);
    expect(JSON.parse(write.stdout)).toMatchObject({ allowed: false, code: 'forbidden', verb: 'admin' });
    const rm = await runCli(['node', 'rm', 'web-1', ...as]);
    expect(rm.code).toBe(1);
    expect(rm.stderr).toMatch(/^herald: forbidden: admin needs the role admin; operator\/oncall holds viewer/);

    // the list shows only the nodes in scope; relabelled out, web-1 leaves it
    const mine = await runCli(['node', 'ls', ...as, '--json']);
    expect((JSON.parse(mine.stdout).items as Array<{ id: string }>).map((n) => n.id)).toEqual(['web-1']);
    const relabel = await runCli(['node', 'label', 'web-1', 'team-', 'tier=front', ...conn]);
    expect(relabel).toMatchObject({ code: 0, stdout: 'node web-1 labels: tier=front\n' });
    expect(JSON.parse((await runCli(['node', 'ls', ...as, '--json'])).stdout).items).toEqual([]);

    const id = /^grant (\S+):/.exec(grant.stdout)![1]!;
    expect((await runCli(['access', 'revoke', id, ...conn])).code).toBe(0);
    expect((await runCli(['whoami', ...as])).stdout).toMatch(/no grant/);
  });

  it('refuses a bad role, a bad selector and a bad label with one line each', async () => {
    const role = await runCli(['access', 'grant', 'oncall', 'root', ...conn]);
    expect(role.stderr).toBe('herald: invalid_request: role is viewer, deployer, author or admin (field role)\n');
    const sel = await runCli(['access', 'grant', 'oncall', 'viewer', '--scope', 'zone:eu', ...conn]);
    expect(sel.stderr).toMatch(
      /^herald: invalid_request: "zone:eu" is not a selector: unknown kind .*\(field scope\.0\)\n$/,
    );
    const label = await runCli(['node', 'label', 'web-1', 'oops', ...conn]);
    expect(label.stderr).toBe('herald: bad_option: "oops": a label is key=value, or key- to remove it\n');
  });
});
