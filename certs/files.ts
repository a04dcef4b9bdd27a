/**
 * Small file primitives for the PKI directory: atomic replace (temp + fsync + rename + fsync of
 * the directory) and mode checks. Watchers in `tls.ts` rely on the atomic replace: a reader
 * never sees a half-written certificate, key or revoked.json.
 */
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { HeraldError } from '../protocol/errors.js';

/** Mode of every private key, the signing JWK and anything else secret. */
export const PRIVATE_FILE_MODE = 0o600;
/** Mode of certificates, the JWKS and revoked.json. */
export const PUBLIC_FILE_MODE = 0o644;
/** Mode of directories this module creates. */
export const PRIVATE_DIR_MODE = 0o700;

/**
 * Writes `data` to `file` atomically with `mode` (set with fchmod, so the umask cannot widen
 * it), then checks the mode on disk: a temporary file beside it, fsynced, renamed over it, and
 * the directory fsynced, so a reader sees the old or the new content and the new one is on disk
 * when this returns. Synchronous on purpose (small files on a local disk: each asynchronous call
 * would cost a thread-pool round trip, more than the call itself).
 * @param o.tempPrefix how the temporary file's name starts (default `.`), for directories whose
 *   readers skip such names
 * @param o.checkMode check the mode on disk afterwards (default true; the agent's state dir does
 *   not, so a filesystem that ignores modes does not stop its hooks)
 * @throws HeraldError `internal` when the mode on disk is not `mode` (e.g. a filesystem that
 *   ignores modes)
 */
export function writeFileAtomic(
  file: string,
  data: string | Uint8Array,
  mode: number,
  o: { tempPrefix?: string; checkMode?: boolean } = {},
): void {
  const dir = path.dirname(file);
  const tmp = path.join(
    dir,
    `${o.tempPrefix ?? '.'}${path.basename(file)}.${crypto.randomBytes(6).toString('hex')}.tmp`,
  );
  const fd = fs.openSync(tmp, 'wx', mode);
  try {
    fs.fchmodSync(fd, mode);
    fs.writeFileSync(fd, data);
    fs.fsyncSync(fd);
  } catch (err) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  fs.closeSync(fd);
  try {
    fs.renameSync(tmp, file);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
  fsyncDir(dir);
  if (o.checkMode !== false) assertMode(file, mode);
}

/**
 * fsync of a directory makes a rename in it durable; filesystems without directory fsync refuse
 * it (EINVAL, EISDIR, ENOTSUP), harmlessly: the rename is still atomic. Any other error (EIO,
 * ENOSPC) is thrown: the write may not be durable.
 */
export function fsyncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, 'r');
    fs.fsyncSync(fd);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EINVAL' && code !== 'EISDIR' && code !== 'ENOTSUP' && code !== 'EPERM') throw err;
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/** @throws HeraldError `internal` when `file`'s permission bits are not exactly `mode`. */
export function assertMode(file: string, mode: number): void {
  const got = fs.statSync(file).mode & 0o777;
  if (got !== mode) {
    throw new HeraldError('internal', `${file} has mode ${got.toString(8)}, expected ${mode.toString(8)}`);
  }
}

/**
 * Creates `dir` (and parents) if missing; the directories it creates get `mode` exactly.
 * An existing directory is left as it is: it may be the user's own.
 */
export function ensureDir(dir: string, mode = PRIVATE_DIR_MODE): void {
  const abs = path.resolve(dir);
  const missing: string[] = [];
  for (let d = abs; !fs.existsSync(d); d = path.dirname(d)) {
    missing.unshift(d);
    if (path.dirname(d) === d) break;
  }
  for (const d of missing) {
    try {
      fs.mkdirSync(d, { mode });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      continue;
    }
    fs.chmodSync(d, mode);
  }
  if (!fs.statSync(abs).isDirectory()) throw new HeraldError('bad_option', `${dir} is not a directory`);
}

/** Reads a file, or undefined when it does not exist. */
export function readIfExists(file: string): Buffer | undefined {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}
