/**
 * When the agent runs as root, what it trusts on disk must be root's alone (SPEC §4): the state
 * dir and every directory above it, the hooks dir (and above) and every hook must be owned by
 * root and not writable by group or others, or the agent refuses to start (`unsafe_state_dir`).
 * Whoever else could write there could plant an outbox entry the agent sends under its own
 * identity (a forged result), a `running.json` that makes it SIGKILL any process group as root,
 * or a hook it runs as root. Fixing the mode (as the agent does for a loose mode it owns) would
 * not help: the owner can change it back.
 *
 * An ancestor may be world-writable only with the sticky bit (as /tmp): others can then neither
 * rename nor remove root's entries in it. Paths are checked as they resolve (realpath), so a
 * symlink on the way is judged by where it leads. The file system is reached through a small
 * injected interface, so a test can play root, or another owner, without being either.
 */
import fs from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { ConfigError } from '../protocol/errors.js';

/** What the check needs of a file's status. */
export interface OwnerStat {
  uid: number;
  mode: number;
  isDirectory(): boolean;
  isSymbolicLink(): boolean;
}

/** The file system calls the check makes; synchronous, at start only. */
export interface OwnerFs {
  stat(path: string): OwnerStat;
  lstat(path: string): OwnerStat;
  realpath(path: string): string;
  readdir(path: string): string[];
}

export const NODE_OWNER_FS: OwnerFs = {
  stat: (p) => fs.statSync(p),
  lstat: (p) => fs.lstatSync(p),
  realpath: (p) => fs.realpathSync(p),
  readdir: (p) => fs.readdirSync(p),
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
        const link = join(hooksDir, name);
        let real: string;
        try {
          real = f.realpath(link);
        } catch {
          continue; // a dangling link runs nothing (unknown_group at run time)
        }
        const st = f.stat(real);
        if (st.isDirectory()) continue;
        if (st.uid !== 0 || (st.mode & GROUP_OTHER_WRITE) !== 0) refuse(real, 'hooks-dir', st);
        checkChain(f, dirname(real), 'hooks-dir', false);
      }
    }
  }
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
  checkChain(f, f.realpath(d), field, d === dir);
}

function checkChain(f: OwnerFs, dir: string, field: string, strictFirst: boolean): void {
  let d = dir;
  let first = true;
  for (;;) {
    const st = f.stat(d);
    const writable = (st.mode & GROUP_OTHER_WRITE) !== 0;
    const stickyOk = !(first && strictFirst) && (st.mode & STICKY) !== 0;
    if (st.uid !== 0 || (writable && !stickyOk)) refuse(d, field, st);
    const up = dirname(d);
    if (up === d) return;
    d = up;
    first = false;
  }
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
  throw new UnsafeStateDirError(path, field, st);
}

/** The refusal, with the path and what was found, for the start-up log line. */
export class UnsafeStateDirError extends ConfigError {
  readonly path: string;
  readonly ownerUid: number;
  readonly mode: string;

  constructor(path: string, field: string, st: OwnerStat) {
    super(
      `--${field}: ${path} is owned by uid ${st.uid} with mode ${(st.mode & 0o7777).toString(8)}; an agent running as root needs it (and every directory above it) owned by root and not writable by group or others`,
      { field, code: 'unsafe_state_dir' },
    );
    this.name = 'ConfigError';
    this.path = path;
    this.ownerUid = st.uid;
    this.mode = (st.mode & 0o7777).toString(8);
  }
}
