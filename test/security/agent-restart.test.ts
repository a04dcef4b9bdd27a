/**
 * What a real `bin/herald agent` does at start with what it finds on disk (docs/architecture.md):
 * - run directories left by an agent killed with SIGKILL while a hook ran (config and outputs,
 *   secrets included) are removed when it starts again;
 * - as root, a state dir (or a directory above it, or the hooks dir) that someone else owns is
 *   refused: the agent does not start, exits non-zero, and logs `unsafe_state_dir` (item 3).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { MetadataItem } from '../../protocol/heat.js';
import { sha256b64url, signMetadata } from '../../protocol/metadata.js';
import { pkiPaths } from '../../certs/paths.js';
import { hasExited, startHerald, stopProc, type Proc } from '../helpers/procs.js';
import { Battery, isBuilt, jsonLines, QUIET_POLL, waitFor, type AgentProc } from './helpers/battery.js';
import { FakeController, type MetadataAnswer } from './helpers/fake-controller.js';
import { waitDead } from '../agent/hooks-helpers.js';

const built = isBuilt();
const isRoot = process.getuid?.() === 0;
let b: Battery;
let fake: FakeController;
/** Agents started outside the battery (the refused ones), killed at the end whatever happened. */
const extra: Proc[] = [];

beforeAll(async () => {
  if (!built) return;
  b = await Battery.create();
  fake = await new FakeController(b.cred('controller', 'controller')).listen();
}, 60_000);

afterAll(async () => {
  await Promise.all(extra.map((p) => stopProc(p, 'SIGKILL')));
  await fake?.close();
  await b?.close();
});

/** A 200 signed as the controller signs it, for `node`. */
function signed200(node: string, nonce: string, gen: number, items: MetadataItem[]): MetadataAnswer {
  const body = Buffer.from(JSON.stringify({ node, generation: gen, deployments: items }));
  const sig = signMetadata(b.signer, {
    iss: b.spiffe('controller', 'controller'),
    aud: b.spiffe('agent', node),
    gen,
    nonce,
    sha256: sha256b64url(body),
    nowS: Date.now() / 1000,
  });
  return { status: 200, headers: { etag: `"${gen}"`, 'herald-signature': sig }, body };
}

describe.skipIf(!built)('agent restart: run directories a killed agent left', () => {
  let a: AgentProc;
  const secret = `s3cr3t-${crypto.randomBytes(6).toString('hex')}`;

  it('a run dir (config, outputs, a secret) left by SIGKILL during a hook is removed at the next start', async () => {
    const started = path.join(b.work, 'hook-started');
    const item: MetadataItem = {
      id: 'slow-1',
      name: 'slow',
      group: 'script',
      creation_time: new Date().toISOString(),
      config: `#!/bin/sh\nprintf '%s' "$db_password" > "$heat_outputs_path.result"\necho $$ > ${started}\nexec sleep 600\n`,
      inputs: [{ name: 'db_password', type: 'String', value: secret, hidden: true }],
      outputs: [{ name: 'result', type: 'String', error_output: false }],
      options: {},
      deployment_id: 'd-slow',
      revision: 1,
      signalled: false,
    };
    fake.answer = ({ nonce }) => signed200('k1', nonce, 1, [item]);
    a = await b.startAgent('k1', { controllerUrl: fake.url });
    const hookPid = Number(
      await waitFor(
        'the hook to start',
        () => (fs.existsSync(started) ? fs.readFileSync(started, 'utf8').trim() || null : null),
        20_000,
        20,
      ),
    );
    const runs = path.join(a.state, 'runs');
    const left = fs.readdirSync(runs);
    expect(left).toHaveLength(1);
    expect(fs.readFileSync(path.join(runs, left[0]!, 'outputs.result'), 'utf8')).toBe(secret);

    // the agent alone is killed; its hook (own process group) keeps running
    process.kill(a.proc.child.pid!, 'SIGKILL');
    await a.proc.exited;
    expect(fs.readdirSync(runs)).toEqual(left);

    fake.answer = ({ nonce }) => signed200('k1', nonce, 2, [{ ...item, signalled: true }]);
    const signals = fake.signals.length;
    a = await b.startAgent('k1', { controllerUrl: fake.url });
    // at start: the hook's group killed, the run dir gone, the item signalled interrupted
    expect(await waitDead(hookPid, 5_000)).toBe(true);
    // the group is killed first, then the directories go: wait for the second, not only the first
    await waitFor('the run dir removed', () => fs.readdirSync(runs).length === 0, 10_000, 20);
    expect(fs.readdirSync(runs)).toEqual([]);
    const s = await waitFor(
      'the interrupted signal',
      () => fake.signals.slice(signals).find((x) => x.path.includes('d-slow')),
      10_000,
      20,
    );
    expect((s.body as { status_reason?: string }).status_reason).toBe('interrupted');
    expect(
      a
        .lines()
        .some((l) => l.msg === 'removed run directories left by a previous run that was killed' && l.removed === 1),
    ).toBe(true);
    expect(JSON.stringify(fake.signals)).not.toContain(secret);
  }, 60_000);
});

/**
 * Starts `herald agent` for `node` (issued in the battery's PKI when `pkiDir` is not given) with
 * `stateDir`; resolves with its exit code and log lines.
 */
async function startRefused(
  node: string,
  stateDir: string,
  hooksDir: string,
  pkiDir?: string,
): Promise<{ code: number | null; lines: Array<Record<string, unknown>>; stderr: string }> {
  if (pkiDir === undefined) await b.issue('agent', node);
  const proc = startHerald(
    `refused-${node}`,
    [
      'agent',
      '--node',
      node,
      '--controller',
      fake.url,
      '--listen',
      '127.0.0.1:0',
      '--pki',
      pkiDir ?? b.pkiDir,
      '--state-dir',
      stateDir,
      '--hooks-dir',
      hooksDir,
      ...QUIET_POLL,
    ],
    b.work,
  );
  extra.push(proc);
  await Promise.race([proc.exited, new Promise((r) => setTimeout(r, 20_000))]);
  expect(hasExited(proc)).toBe(true);
  return { code: proc.child.exitCode, lines: jsonLines(proc.log()), stderr: proc.log() };
}

describe.skipIf(!built || !isRoot)('agent restart: as root, a state dir someone else owns', () => {
  // each: [title, node, make it unsafe (returns the state dir and hooks dir), the path refused]
  const cases: Array<[string, string, () => { state: string; hooks: string; bad: string }]> = [
    [
      'a state dir owned by uid 65534',
      'u1',
      () => {
        const state = path.join(b.work, 'state-u1');
        fs.mkdirSync(state, { mode: 0o700 });
        fs.chownSync(state, 65534, 65534);
        return { state, hooks: mkHooks('u1'), bad: state };
      },
    ],
    [
      'a directory above the state dir owned by uid 65534',
      'u2',
      () => {
        const above = path.join(b.work, 'theirs-u2');
        fs.mkdirSync(above, { mode: 0o755 });
        fs.chownSync(above, 65534, 65534);
        const state = path.join(above, 'state');
        fs.mkdirSync(state, { mode: 0o700 });
        return { state, hooks: mkHooks('u2'), bad: above };
      },
    ],
    [
      'a group-writable directory above the state dir',
      'u3',
      () => {
        const above = path.join(b.work, 'groupw-u3');
        fs.mkdirSync(above);
        fs.chmodSync(above, 0o775);
        return { state: path.join(above, 'state'), hooks: mkHooks('u3'), bad: above };
      },
    ],
    [
      'an outbox entry planted by uid 65534',
      'u4',
      () => {
        const state = path.join(b.work, 'state-u4');
        fs.mkdirSync(path.join(state, 'outbox'), { recursive: true, mode: 0o700 });
        const planted = path.join(state, 'outbox', '00000000000000000001-d-forged.json');
        fs.writeFileSync(planted, '{}', { mode: 0o600 });
        fs.chownSync(planted, 65534, 65534);
        return { state, hooks: mkHooks('u4'), bad: planted };
      },
    ],
    [
      'a hooks dir owned by uid 65534',
      'u5',
      () => {
        const hooks = mkHooks('u5');
        fs.chownSync(hooks, 65534, 65534);
        return { state: path.join(b.work, 'state-u5'), hooks, bad: hooks };
      },
    ],
  ];

  function mkHooks(node: string): string {
    const d = path.join(b.work, `hooks-${node}`);
    fs.mkdirSync(d, { recursive: true, mode: 0o755 });
    return d;
  }

  it.each(cases)(
    '%s: the agent refuses to start with unsafe_state_dir',
    async (_title, node, unsafe) => {
      const { state, hooks, bad } = unsafe();
      const before = fs.existsSync(state) ? fs.statSync(state).mode : undefined;
      const r = await startRefused(node, state, hooks);
      expect(r.code).not.toBe(0);
      expect(r.code).not.toBeNull();
      const line = r.lines.find((l) => l.code === 'unsafe_state_dir');
      expect(line, r.stderr.slice(-2000)).toMatchObject({ code: 'unsafe_state_dir', path: fs.realpathSync(bad) });
      expect(r.stderr).toContain('herald: unsafe_state_dir:');
      expect(r.lines.some((l) => l.msg === 'agent started')).toBe(false);
      // nothing was fixed up (chmod) or sent
      if (before !== undefined) expect(fs.statSync(state).mode).toBe(before);
      expect(fake.requests.filter((q) => q.path.includes(`/nodes/${node}/`))).toEqual([]);
    },
    30_000,
  );

  it('control: the same agent with a root-owned state dir starts', async () => {
    const state = path.join(b.work, 'state-u6');
    const a = await b.startAgent('u6', { controllerUrl: fake.url, hooksDir: mkHooks('u6') });
    expect(a.lines().some((l) => l.msg === 'agent started')).toBe(true);
    expect(fs.statSync(state).uid).toBe(0);
  }, 30_000);
});

describe.skipIf(!built || !isRoot)('agent restart: as root, a PKI file someone else could write', () => {
  /** The agent's part of the battery's PKI (never the CA key) for `node`, in a root-owned 0700 `dir`. */
  async function agentPki(node: string, dir: string): Promise<ReturnType<typeof pkiPaths>> {
    await b.issue('agent', node);
    const from = pkiPaths(b.pkiDir);
    const to = pkiPaths(dir);
    fs.mkdirSync(to.roleDir('agent'), { recursive: true, mode: 0o700 });
    for (const f of ['caCrt', 'jwks', 'revoked', 'meta'] as const) fs.copyFileSync(from[f], to[f]);
    fs.copyFileSync(from.cert('agent', node), to.cert('agent', node));
    fs.copyFileSync(from.key('agent', node), to.key('agent', node));
    return to;
  }

  // each: [title, node, make its PKI unsafe (returns the PKI dir and the path refused)]
  const cases: Array<[string, string, (node: string) => Promise<{ pki: string; bad: string }>]> = [
    [
      'a CA certificate owned by uid 65534 (who could add a CA of their own)',
      'p1',
      async (node) => {
        const p = await agentPki(node, path.join(b.work, `pki-${node}`));
        fs.chownSync(p.caCrt, 65534, 65534);
        return { pki: p.dir, bad: p.caCrt };
      },
    ],
    [
      'a JWKS writable by its group (who could add a signing key)',
      'p2',
      async (node) => {
        const p = await agentPki(node, path.join(b.work, `pki-${node}`));
        fs.chmodSync(p.jwks, 0o664);
        return { pki: p.dir, bad: p.jwks };
      },
    ],
    [
      'a PKI dir under a directory writable by others, without the sticky bit',
      'p3',
      async (node) => {
        const open = path.join(b.work, `open-${node}`);
        fs.mkdirSync(open);
        fs.chmodSync(open, 0o777);
        const p = await agentPki(node, path.join(open, 'pki'));
        return { pki: p.dir, bad: open };
      },
    ],
  ];

  it.each(cases)(
    '%s: the agent refuses to start with unsafe_pki',
    async (_title, node, unsafe) => {
      const { pki, bad } = await unsafe(node);
      const state = path.join(b.work, `state-${node}`);
      const hooks = path.join(b.work, `hooks-${node}`);
      fs.mkdirSync(hooks, { mode: 0o755 });
      const r = await startRefused(node, state, hooks, pki);
      expect(r.code).not.toBe(0);
      expect(r.code).not.toBeNull();
      const line = r.lines.find((l) => l.code === 'unsafe_pki');
      expect(line, r.stderr.slice(-2000)).toMatchObject({ code: 'unsafe_pki', path: fs.realpathSync(bad) });
      expect(r.stderr).toContain('herald: unsafe_pki:');
      expect(r.lines.some((l) => l.msg === 'agent started')).toBe(false);
      expect(fs.existsSync(state)).toBe(false);
      expect(fake.requests.filter((q) => q.path.includes(`/nodes/${node}/`))).toEqual([]);
    },
    30_000,
  );

  it('control: the same agent with a root-owned PKI copy starts', async () => {
    const p = await agentPki('p4', path.join(b.work, 'pki-p4'));
    const a = await b.startAgent('p4', { controllerUrl: fake.url, extra: ['--pki', p.dir] });
    expect(a.lines().some((l) => l.msg === 'agent started')).toBe(true);
  }, 30_000);
});

describe.skipIf(!built)('agent restart: teardown', () => {
  it('leaves no process, socket or temp file behind', async () => {
    await Promise.all(extra.map((p) => stopProc(p, 'SIGKILL')));
    await fake.close();
    await b.close();
    expect(await b.leftovers()).toEqual([]);
  });
});
