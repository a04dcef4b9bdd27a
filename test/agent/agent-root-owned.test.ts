/**
 * An agent running as root trusts nothing on disk that another user owns or could write
 * (SECURITY.md, "5. The agent's state dir"): the state dir and every directory above it, the
 * hooks dir and its hooks.
 * Real directories (chowned to another uid where this runs as root) and an injected file system
 * (so the check is proven without being root).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkRootOwned, NODE_OWNER_FS, type OwnerFs } from '../../agent/root-owned.js';
import { codeOf, type HeraldError } from '../../protocol/errors.js';

const isRoot = process.getuid?.() === 0;
const NOBODY = 65534;
let base: string;

beforeAll(() => {
  base = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-owned-'));
  fs.chmodSync(base, 0o755);
});
afterAll(() => fs.rmSync(base, { recursive: true, force: true }));

function mk(...parts: string[]): string {
  const d = path.join(base, ...parts);
  fs.mkdirSync(d, { recursive: true, mode: 0o700 });
  return d;
}

function verdict(
  o: Parameters<typeof checkRootOwned>[0],
): { code: string | undefined; field?: string | undefined } | 'ok' {
  try {
    checkRootOwned(o);
    return 'ok';
  } catch (err) {
    return { code: codeOf(err), field: (err as HeraldError).field };
  }
}

/** node:fs, except that `owned` paths look owned by `uid` and `modes` override their mode. */
function fakeFs(owned: Record<string, number>, modes: Record<string, number> = {}): OwnerFs {
  const wrap = (p: string, st: fs.Stats) => ({
    uid: owned[p] ?? st.uid,
    mode: modes[p] ?? st.mode,
    isDirectory: () => st.isDirectory(),
    isSymbolicLink: () => st.isSymbolicLink(),
  });
  return { ...NODE_OWNER_FS, stat: (p) => wrap(p, fs.statSync(p)), lstat: (p) => wrap(p, fs.lstatSync(p)) };
}

describe("as root, the state dir and hooks must be root's alone (injected file system)", () => {
  it('control: a root-owned 0700 state dir under root-owned 0755 dirs (and a sticky /tmp) passes', () => {
    const state = mk('ok', 'state');
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({}) })).toBe('ok');
  });

  it('a state dir owned by another uid is refused unsafe_state_dir', () => {
    const state = mk('other', 'state');
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({ [state]: 1000 }) })).toEqual({
      code: 'unsafe_state_dir',
      field: 'state-dir',
    });
  });

  it('a directory above the state dir owned by another uid, or group-writable, is refused', () => {
    const state = mk('above', 'a', 'state');
    const parent = path.dirname(state);
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({ [parent]: 1000 }) })).toMatchObject({
      code: 'unsafe_state_dir',
    });
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({}, { [parent]: 0o40775 }) })).toMatchObject({
      code: 'unsafe_state_dir',
    });
    // world-writable with the sticky bit (like /tmp) is fine above, never for the dir itself
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({}, { [parent]: 0o41777 }) })).toBe('ok');
    expect(verdict({ stateDir: state, uid: 0, fs: fakeFs({}, { [state]: 0o41777 }) })).toMatchObject({
      code: 'unsafe_state_dir',
    });
  });

  it('an outbox entry or running.json planted by another uid is refused', () => {
    const state = mk('planted', 'state');
    const outbox = mk('planted', 'state', 'outbox');
    fs.writeFileSync(path.join(outbox, '000001-d.json'), '{}');
    fs.writeFileSync(path.join(state, 'running.json'), '{}');
    expect(
      verdict({ stateDir: state, uid: 0, fs: fakeFs({ [path.join(outbox, '000001-d.json')]: 1000 }) }),
    ).toMatchObject({ code: 'unsafe_state_dir' });
    expect(
      verdict({ stateDir: state, uid: 0, fs: fakeFs({ [path.join(state, 'running.json')]: 1000 }) }),
    ).toMatchObject({ code: 'unsafe_state_dir' });
  });

  it('a hooks dir or a hook owned by another uid, or writable by others, is refused (field hooks-dir)', () => {
    const state = mk('hooks', 'state');
    const hooks = mk('hooks', 'hooks');
    fs.chmodSync(hooks, 0o755);
    const hook = path.join(hooks, 'ansible');
    fs.writeFileSync(hook, '#!/bin/sh\n', { mode: 0o755 });
    expect(verdict({ stateDir: state, hooksDir: hooks, uid: 0, fs: fakeFs({}) })).toBe('ok');
    expect(verdict({ stateDir: state, hooksDir: hooks, uid: 0, fs: fakeFs({ [hooks]: 1000 }) })).toEqual({
      code: 'unsafe_state_dir',
      field: 'hooks-dir',
    });
    expect(verdict({ stateDir: state, hooksDir: hooks, uid: 0, fs: fakeFs({ [hook]: 1000 }) })).toEqual({
      code: 'unsafe_state_dir',
      field: 'hooks-dir',
    });
    expect(verdict({ stateDir: state, hooksDir: hooks, uid: 0, fs: fakeFs({}, { [hook]: 0o100757 }) })).toEqual({
      code: 'unsafe_state_dir',
      field: 'hooks-dir',
    });
  });

  it('a state dir not made yet is judged by the nearest directory that exists', () => {
    const parent = mk('later');
    expect(
      verdict({ stateDir: path.join(parent, 'x', 'state'), uid: 0, fs: fakeFs({ [parent]: 1000 }) }),
    ).toMatchObject({ code: 'unsafe_state_dir' });
    expect(verdict({ stateDir: path.join(parent, 'x', 'state'), uid: 0, fs: fakeFs({}) })).toBe('ok');
  });

  it('an agent not running as root is not checked (it cannot be given what it does not own)', () => {
    const state = mk('nonroot', 'state');
    expect(verdict({ stateDir: state, uid: 1000, fs: fakeFs({ [state]: 1000, [path.dirname(state)]: 0 }) })).toBe('ok');
  });
});

describe.skipIf(!isRoot)('as root, with real ownership', () => {
  it('a state dir chowned to another uid is refused unsafe_state_dir', () => {
    const state = mk('real', 'state');
    fs.chownSync(state, NOBODY, NOBODY);
    expect(verdict({ stateDir: state, uid: 0 })).toEqual({ code: 'unsafe_state_dir', field: 'state-dir' });
    fs.chownSync(state, 0, 0);
    expect(verdict({ stateDir: state, uid: 0 })).toBe('ok');
  });

  it('a symlinked state dir is judged by where it leads', () => {
    const target = mk('real', 'elsewhere');
    fs.chownSync(target, NOBODY, NOBODY);
    const link = path.join(base, 'real', 'link');
    fs.symlinkSync(target, link);
    expect(verdict({ stateDir: link, uid: 0 })).toMatchObject({ code: 'unsafe_state_dir' });
  });

  it('a symlink on the way that sits in a directory another user owns is refused, though it leads somewhere safe', () => {
    // state -> theirs/hop -> safe: the real path is root's all the way, but uid 65534 can point
    // theirs/hop anywhere at any time
    const safe = mk('real', 'safe-state');
    const theirs = mk('real', 'theirs');
    fs.chmodSync(theirs, 0o755);
    fs.symlinkSync(safe, path.join(theirs, 'hop'));
    fs.chownSync(theirs, NOBODY, NOBODY);
    const state = path.join(base, 'real', 'state-via-theirs');
    fs.symlinkSync(path.join(theirs, 'hop'), state);
    expect(verdict({ stateDir: safe, uid: 0 })).toBe('ok');
    expect(verdict({ stateDir: state, uid: 0 })).toEqual({ code: 'unsafe_state_dir', field: 'state-dir' });
  });
});
