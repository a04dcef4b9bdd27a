/**
 * When the agent runs as root, what it trusts on disk must be root's alone (docs/installing.md,
 * SECURITY.md sections 4-6): the state dir, the hooks dir and every hook, and every PKI file it
 * reads (the CA, its own certificate and key, the JWKS, revoked.json, pki.json), with every
 * directory on the way to each. Each must be owned by root and not writable by group or others,
 * or the agent refuses: at start (`unsafe_state_dir` for the state and hooks dirs,
 * `unsafe_pki` for the PKI) and, for PKI files, at every reload after a change (the last good
 * content is kept). Whoever else could write there could plant an outbox entry the agent sends
 * under its own identity (a forged result), a `running.json` that makes it SIGKILL any process
 * group as root, a hook it runs as root, or a CA and signing key whose wake-ups and metadata it
 * then obeys. Fixing the mode (as the agent does for a loose mode it owns) would not help: the
 * owner can change it back.
 *
 * One walk decides for all of them: a path is resolved a name at a time, as the kernel does, and
 * every directory a name is looked up in is checked, symlinks followed (a link on the way must be
 * root's, and so must the directory it sits in), so no directory another user could write can
 * change what the path leads to. A directory above may be world-writable only with the sticky
 * bit (as /tmp): others can then neither rename nor remove root's entries in it; the state, hooks
 * or PKI dir itself may not (others could add entries). The file system is reached
 * through a small injected interface, so a test can play root, or another owner, without being
 * either.
 */
import fs from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { ConfigError, type ErrorCode } from '../protocol/errors.js';
import { MAX_SYMLINK_LEVELS } from '../protocol/limits.js';

/** What the check needs of a file's status. */
export interface OwnerStat {
  uid: number;
  mode: number;
  isDirectory(): boolean;
  isSymbolicLink(): boolean;
}

/** The file system calls the check makes; synchronous (at start, and at a PKI reload). */
export interface OwnerFs {
  stat(path: string): OwnerStat;
  lstat(path: string): OwnerStat;
  realpath(path: string): string;
  readdir(path: string): string[];
  readlink(path: string): string;
}

export const NODE_OWNER_FS: OwnerFs = {
  stat: (p) => fs.statSync(p),
  lstat: (p) => fs.lstatSync(p),
  realpath: (p) => fs.realpathSync(p),
  readdir: (p) => fs.readdirSync(p),
  readlink: (p) => fs.readlinkSync(p),
};

export interface RootOwnedOptions {
  stateDir: string;
  hooksDir?: string | undefined;
  /** The agent's effective uid; only 0 triggers the checks. */
  uid: number | undefined;
  fs?: OwnerFs;
}

/** Sub-directories of the state dir whose entries the agent reads back and acts on. */
const STATE_SUBDIRS = ['outbox', 'runs'];
const GROUP_OTHER_WRITE = 0o022;
const STICKY = 0o1000;

/**
 * @throws ConfigError `unsafe_state_dir` (field `state-dir` or `hooks-dir`) naming the path
 */
export function checkRootOwned(o: RootOwnedOptions): void {
  if (o.uid !== 0) return;
  const f = o.fs ?? NODE_OWNER_FS;
  const stateDir = resolve(o.stateDir);
  checkTree(f, stateDir, 'state-dir');
  if (exists(f, stateDir)) {
    // what a previous owner may have planted: state.json, state.journal, running.json, outbox entries
    for (const entry of [stateDir, ...STATE_SUBDIRS.map((s) => join(stateDir, s)).filter((d) => exists(f, d))]) {
      for (const name of f.readdir(entry)) {
        const p = join(entry, name);
        const st = f.lstat(p);
        if (st.uid !== 0 || (!st.isSymbolicLink() && (st.mode & GROUP_OTHER_WRITE) !== 0)) refuse(p, 'state-dir', st);
      }
    }
  }
  if (o.hooksDir !== undefined) {
    const hooksDir = resolve(o.hooksDir);
    checkTree(f, hooksDir, 'hooks-dir');
    if (exists(f, hooksDir)) {
      for (const name of f.readdir(hooksDir)) {
        let found: Resolved;
        try {
          found = resolveChecked(f, join(hooksDir, name), 'hooks-dir');
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // a dangling link runs nothing (unknown_group at run time)
          throw err;
        }
        if (found.st.isDirectory()) continue;
        if (found.st.uid !== 0 || (found.st.mode & GROUP_OTHER_WRITE) !== 0) refuse(found.real, 'hooks-dir', found.st);
      }
    }
  }
}

export interface RootOwnedFileOptions {
  /** The agent's effective uid; only 0 triggers the check. */
  uid: number | undefined;
  fs?: OwnerFs;
}

/**
 * A PKI file (or the PKI dir itself) the agent trusts: it and every directory on the way must be
 * root's and not writable by group or others (world-writable with the sticky bit is allowed on
 * the way, never for the PKI dir itself). A missing file is the caller's to judge (the error is
 * the file system's, ENOENT).
 * @throws ConfigError `unsafe_pki` (field `pki`) naming the path
 */
export function checkRootOwnedPki(file: string, o: RootOwnedFileOptions): void {
  if (o.uid !== 0) return;
  const f = o.fs ?? NODE_OWNER_FS;
  const { real, st } = resolveChecked(f, file, 'pki');
  if (st.isDirectory()) checkDir(real, st, 'pki', true);
  else if (st.uid !== 0 || (st.mode & GROUP_OTHER_WRITE) !== 0) refuse(real, 'pki', st);
}

/** `dir` (or, while it does not exist, the nearest ancestor that does) and everything above. */
function checkTree(f: OwnerFs, dir: string, field: string): void {
  let d = dir;
  while (!exists(f, d)) {
    const up = dirname(d);
    if (up === d) return;
    d = up;
  }
  // a directory the agent will create (mkdir as root) is root's; the first existing one is
  // where someone else could have put it, so it is held strictly only when it is the dir itself
  const { real, st } = resolveChecked(f, d, field);
  checkDir(real, st, field, d === dir);
}

interface Resolved {
  /** The path with every symlink resolved. */
  real: string;
  st: OwnerStat;
}

/**
 * Resolves `p` one name at a time, checking every directory a name is looked up in (and every
 * symlink followed) before trusting what it leads to. Returns the real path and its status; the
 * caller judges that last one.
 */
function resolveChecked(f: OwnerFs, p: string, field: string): Resolved {
  const todo = names(resolve(p));
  let dir = '/';
  let followed = 0;
  for (;;) {
    const name = todo.shift();
    if (name === undefined) return { real: dir, st: f.stat(dir) };
    if (name === '.') continue;
    if (name === '..') {
      dir = dirname(dir); // `dir` is real, so its parent is what the kernel would take
      continue;
    }
    checkDir(dir, f.stat(dir), field, false);
    const next = join(dir, name);
    const st = f.lstat(next);
    if (st.isSymbolicLink()) {
      // a link another user made (in a sticky directory, say) can be made to lead anywhere
      if (st.uid !== 0 || ++followed > MAX_SYMLINK_LEVELS) refuse(next, field, st);
      const target = f.readlink(next);
      todo.unshift(...names(target));
      if (isAbsolute(target)) dir = '/';
      continue;
    }
    if (todo.length === 0) return { real: next, st };
    dir = next;
  }
}

function names(p: string): string[] {
  return p.split('/').filter((n) => n !== '');
}

function checkDir(d: string, st: OwnerStat, field: string, strict: boolean): void {
  const writable = (st.mode & GROUP_OTHER_WRITE) !== 0;
  const stickyOk = !strict && (st.mode & STICKY) !== 0;
  if (st.uid !== 0 || (writable && !stickyOk)) refuse(d, field, st);
}

function exists(f: OwnerFs, p: string): boolean {
  try {
    f.lstat(p);
    return true;
  } catch {
    return false;
  }
}

function refuse(path: string, field: string, st: OwnerStat): never {
  throw new UnsafePathError(path, field, st);
}

/** The refusal, with the path and what was found, for the log line. */
export class UnsafePathError extends ConfigError {
  readonly path: string;
  readonly ownerUid: number;
  readonly mode: string;

  constructor(path: string, field: string, st: OwnerStat) {
    const code: ErrorCode = field === 'pki' ? 'unsafe_pki' : 'unsafe_state_dir';
    super(
      `--${field}: ${path} is owned by uid ${st.uid} with mode ${(st.mode & 0o7777).toString(8)}; an agent running as root needs it (and every directory on the way to it) owned by root and not writable by group or others`,
      { field, code },
    );
    this.name = 'ConfigError';
    this.path = path;
    this.ownerUid = st.uid;
    this.mode = (st.mode & 0o7777).toString(8);
  }
}
