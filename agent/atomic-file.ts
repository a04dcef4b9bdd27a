/**
 * Durable small files for the agent's state dir: a write either fully happens or not at all,
 * and survives a crash or power loss once the call returns.
 */
import { chmodSync, closeSync, constants, fdatasyncSync, lstatSync, mkdirSync, openSync, writeFileSync } from 'node:fs';
import { writeFileAtomic } from '../certs/files.js';

/** The little a pino logger offers that these modules use. */
export interface WarnLogger {
  warn(obj: object, msg: string): void;
}

/** Mode of every file Herald writes under its state dir. */
export const PRIVATE_FILE_MODE = 0o600;
/** Mode of the state dir and every directory under it. */
export const PRIVATE_DIR_MODE = 0o700;

/** Prefix of temporary files; readers of a directory skip names that start with it. */
export const TEMP_PREFIX = '.tmp-';

/**
 * Replaces `path` atomically and durably (certs/files.ts `writeFileAtomic`: temporary file,
 * fchmod, fsync, rename, directory fsync), its temporary name starting with TEMP_PREFIX.
 *
 * Synchronous on purpose: made asynchronously, each of its nine calls cost a thread-pool round
 * trip (~0.1-0.3 ms on a busy event loop, more than the call itself), so an item's start waited
 * ~2 ms more for its state write (BENCHMARKS.md). The event loop is held for the fsyncs, which an
 * agent (one node's work) can afford.
 *
 * @param mode file mode, default 0600
 * @throws the file system's error (ENOENT when the directory is missing, ...); the temporary file
 *   is removed first
 */
export function writeFileAtomicSync(path: string, data: string | Uint8Array, mode = PRIVATE_FILE_MODE): void {
  writeFileAtomic(path, data, mode, { tempPrefix: TEMP_PREFIX, checkMode: false });
}

/**
 * Appends `data` to the existing file `path` and makes it durable (fdatasync: the data and the
 * new size) before returning: one file's flush, where a replace costs the file's and its
 * directory's. A crash during the call may leave a prefix of `data` at the end of the file,
 * which readers must expect (agent/state.ts reads such a torn tail as never written).
 *
 * @throws the file system's error; ENOENT when the file does not exist (it is never created here),
 *   ELOOP when it is a symlink
 */
export function appendFileDurableSync(path: string, data: string): void {
  // O_NOFOLLOW: a symlink planted in its place is never written through (ELOOP)
  const fd = openSync(path, constants.O_WRONLY | constants.O_APPEND | constants.O_NOFOLLOW);
  try {
    writeFileSync(fd, data);
    fdatasyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * Makes `path` (and missing parents, 0700 too) a directory of mode 0700. An existing directory
 * with looser permissions is tightened, with a warning: the agent fixes rather than refuses, so a
 * hand-made state dir does not stop it, and the log says so.
 *
 * @throws Error when `path` exists and is not a directory (a symlink included: a state dir that
 *   points elsewhere is refused)
 */
export async function ensurePrivateDir(path: string, log?: WarnLogger): Promise<void> {
  ensurePrivateDirSync(path, log);
}

/**
 * `ensurePrivateDir` without the thread-pool round trips: on the way to a hook's start each
 * asynchronous call cost ~0.3 ms, several times the call itself on a local disk.
 */
export function ensurePrivateDirSync(path: string, log?: WarnLogger): void {
  mkdirSync(path, { recursive: true, mode: PRIVATE_DIR_MODE });
  const st = lstatSync(path);
  if (!st.isDirectory()) throw new Error(`${path} is not a directory`);
  if ((st.mode & 0o777) !== PRIVATE_DIR_MODE) {
    chmodSync(path, PRIVATE_DIR_MODE);
    log?.warn({ path, mode: (st.mode & 0o777).toString(8) }, 'private directory had loose permissions; set to 0700');
  }
}
