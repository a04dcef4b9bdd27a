/**
 * An agent running as root trusts no PKI file another user owns or could write (SECURITY.md,
 * "6. PKI files"): the CA, its own certificate and key, the JWKS, revoked.json, pki.json, the PKI
 * dir and every directory on the way. Refused with `unsafe_pki` at start, and at a reload after
 * a change (the last good content is kept). Real files, chowned to another uid (this runs as
 * root) or made group- or world-writable; real file watching.
 */
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { assembleAgent, type AgentConfig, type AgentLogger } from '../../agent/assemble.js';
import { checkRootOwnedPki } from '../../agent/root-owned.js';
import { newSigningJwk, publicJwkOf } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import { codeOf, type HeraldError } from '../../protocol/errors.js';
import { makeTestPki, type TestPki } from '../helpers/pki.js';

const isRoot = process.getuid?.() === 0;
const NOBODY = 65534;
const EVENT_BOUND_MS = 5_000;
let pki: TestPki;
let base: string;
let n = 0;

beforeAll(async () => {
  if (!isRoot) return;
  pki = await makeTestPki({ agents: ['n1'] });
  base = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pki-owned-'));
  fs.chmodSync(base, 0o755);
}, 60_000);
afterAll(() => {
  pki?.cleanup();
  if (base) fs.rmSync(base, { recursive: true, force: true });
});

/** A copy of the agent's part of the PKI (no CA key) in a new root-owned 0700 dir under `parent`. */
function agentPki(parent = base): string {
  const dir = path.join(parent, `pki-${++n}`);
  fs.mkdirSync(path.join(dir, 'agent'), { recursive: true, mode: 0o700 });
  const src = pkiPaths(pki.dir);
  const dst = pkiPaths(dir);
  for (const [from, to] of [
    [src.caCrt, dst.caCrt],
    [src.jwks, dst.jwks],
    [src.revoked, dst.revoked],
    [src.meta, dst.meta],
    [src.cert('agent', 'n1'), dst.cert('agent', 'n1')],
    [src.key('agent', 'n1'), dst.key('agent', 'n1')],
  ] as const)
    fs.copyFileSync(from, to);
  return dir;
}

function verdict(file: string): { code: string | undefined; field?: string | undefined } | 'ok' {
  try {
    checkRootOwnedPki(file, { uid: 0 });
    return 'ok';
  } catch (err) {
    return { code: codeOf(err), field: (err as HeraldError).field };
  }
}

const UNSAFE = { code: 'unsafe_pki', field: 'pki' };

describe.skipIf(!isRoot)("as root, a PKI file and every directory on the way must be root's alone", () => {
  it('control: root-owned files in a root-owned 0700 PKI dir pass', () => {
    const dir = agentPki();
    const p = pkiPaths(dir);
    for (const f of [dir, p.caCrt, p.jwks, p.revoked, p.meta, p.cert('agent', 'n1'), p.key('agent', 'n1')])
      expect(verdict(f)).toBe('ok');
  });

  it.each([
    [
      'a CA certificate owned by uid 65534',
      (p: ReturnType<typeof pkiPaths>) => fs.chownSync(p.caCrt, NOBODY, NOBODY),
      'caCrt',
    ],
    ['a JWKS writable by its group', (p: ReturnType<typeof pkiPaths>) => fs.chmodSync(p.jwks, 0o664), 'jwks'],
    [
      'a revoked.json writable by others',
      (p: ReturnType<typeof pkiPaths>) => fs.chmodSync(p.revoked, 0o646),
      'revoked',
    ],
  ] as const)('%s is refused unsafe_pki', (_title, spoil, which) => {
    const p = pkiPaths(agentPki());
    spoil(p);
    expect(verdict(p[which])).toEqual(UNSAFE);
  });

  it("the agent's own key in a directory owned by uid 65534 is refused", () => {
    const p = pkiPaths(agentPki());
    fs.chownSync(p.roleDir('agent'), NOBODY, NOBODY);
    expect(verdict(p.key('agent', 'n1'))).toEqual(UNSAFE);
  });

  it('a PKI dir under a directory writable by others is refused without the sticky bit, passes with it', () => {
    const above = path.join(base, `open-${++n}`);
    fs.mkdirSync(above);
    fs.chmodSync(above, 0o777);
    const p = pkiPaths(agentPki(above));
    expect(verdict(p.caCrt)).toEqual(UNSAFE);
    fs.chmodSync(above, 0o1777);
    expect(verdict(p.caCrt)).toBe('ok');
    // the PKI dir itself: others could add a file to it, sticky bit or not
    fs.chmodSync(p.dir, 0o1777);
    expect(verdict(p.dir)).toEqual(UNSAFE);
  });

  it('a PKI dir reached through a symlink that sits in a directory another user owns is refused, safe as its target is', () => {
    const dir = agentPki();
    const theirs = path.join(base, `theirs-${++n}`);
    fs.mkdirSync(theirs, { mode: 0o755 });
    fs.symlinkSync(dir, path.join(theirs, 'pki'));
    fs.chownSync(theirs, NOBODY, NOBODY);
    const viaTheirs = path.join(base, `via-${n}`);
    fs.symlinkSync(path.join(theirs, 'pki'), viaTheirs);
    expect(verdict(path.join(dir, 'ca.crt'))).toBe('ok');
    expect(verdict(path.join(viaTheirs, 'ca.crt'))).toEqual(UNSAFE);
  });

  it('a symlink owned by another user is refused (it may sit in a sticky directory)', () => {
    const p = pkiPaths(agentPki());
    const link = path.join(base, `link-${++n}`);
    fs.symlinkSync(p.dir, link);
    fs.lchownSync(link, NOBODY, NOBODY);
    expect(verdict(path.join(link, 'ca.crt'))).toEqual(UNSAFE);
  });

  it('an agent not running as root is not checked', () => {
    const p = pkiPaths(agentPki());
    fs.chownSync(p.caCrt, NOBODY, NOBODY);
    expect(() => checkRootOwnedPki(p.caCrt, { uid: 1000 })).not.toThrow();
  });
});

/** Log lines, as pino would have them. */
function recorder(): { log: AgentLogger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const at = (level: string) => (obj: object, msg?: string) => lines.push({ level, ...obj, msg });
  return { log: { info: at('info'), warn: at('warn'), error: at('error'), debug: at('debug') }, lines };
}

function config(dir: string): AgentConfig {
  const state = path.join(base, `state-${++n}`);
  return {
    node: 'n1',
    controller: 'https://127.0.0.1:1',
    listen: { host: '127.0.0.1', port: 0 },
    pki: dir,
    stateDir: state,
    controllerId: 'controller',
    pollIntervalMs: 600_000,
    pollIntervalHealthyMs: 600_000,
  };
}

describe.skipIf(!isRoot)('as root, the assembled agent and its PKI', () => {
  it('refuses to start with unsafe_pki (one log line naming the file) when its JWKS is owned by uid 65534', async () => {
    const dir = agentPki();
    const p = pkiPaths(dir);
    fs.chownSync(p.jwks, NOBODY, NOBODY);
    const { log, lines } = recorder();
    const cfg = config(dir);
    const err = await assembleAgent(cfg, { log, watchPki: false }).catch((e: unknown) => e);
    expect(codeOf(err)).toBe('unsafe_pki');
    expect(lines.filter((l) => l.code === 'unsafe_pki')).toEqual([
      expect.objectContaining({ level: 'error', path: p.jwks, owner: NOBODY }),
    ]);
    // nothing was opened: the state dir is not made
    expect(fs.existsSync(cfg.stateDir)).toBe(false);
  });

  it('a running agent refuses a JWKS replaced by one another user owns, keeps the keys it had, and takes a root-owned one', async () => {
    const dir = agentPki();
    const p = pkiPaths(dir);
    const { log, lines } = recorder();
    const agent = await assembleAgent(config(dir), { log });
    try {
      const m = agent.parts.material;
      const before = m.current().jwks;
      const intruder = publicJwkOf(newSigningJwk(), 'controller');

      const tmp = path.join(dir, '.jwks.tmp');
      fs.writeFileSync(tmp, JSON.stringify({ keys: [intruder] }), { mode: 0o644 });
      fs.chownSync(tmp, NOBODY, NOBODY);
      const failed = once(m, 'load-error', { signal: AbortSignal.timeout(EVENT_BOUND_MS) });
      fs.renameSync(tmp, p.jwks);
      const [info] = (await failed) as [{ file: string; error: unknown }];
      expect(codeOf(info.error)).toBe('unsafe_pki');
      expect(info.file).toBe(p.jwks);
      expect(m.current().jwks).toBe(before);
      expect(lines.some((l) => l.code === 'unsafe_pki' && l.level === 'error' && l.file === p.jwks)).toBe(true);

      // control: the same content, root's, is taken
      const changed = once(m, 'jwks-change', { signal: AbortSignal.timeout(EVENT_BOUND_MS) });
      fs.writeFileSync(tmp, JSON.stringify({ keys: [intruder] }), { mode: 0o644 });
      fs.renameSync(tmp, p.jwks);
      await changed;
      expect(m.current().jwks?.keys.map((k) => k.kid)).toEqual([intruder.kid]);
    } finally {
      await agent.stop();
    }
  });
});
