/**
 * Finds the hook for a group in `--hooks-dir` and, when the agent runs as root, checks that
 * nobody but root could have put or changed it (docs/architecture.md): the hook file, its directory and every
 * directory above must be root-owned and not writable by group or others. Symlinks are followed
 * with `realpath` and the target's chain is checked too. An ancestor may be world-writable only
 * with the sticky bit (like /tmp): others then cannot rename or remove root's entries in it.
 */
import { lstat, realpath, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { RefusalError } from '../../protocol/errors.js';
import { GROUP_RE } from '../../protocol/heat.js';

const STICKY = 0o1000;

/**
 * @param uid the agent's effective uid (process.getuid()); only 0 triggers the ownership checks
 * @returns the hook's real path
 * @throws RefusalError unknown_group (no hooks dir, no such file, not an executable regular file)
 *   | unsafe_hooks_dir | bad_name
 */
export async function resolveHook(
  hooksDir: string | undefined,
  group: string,
  uid: number | undefined,
): Promise<string> {
  if (!GROUP_RE.test(group))
    throw new RefusalError('bad_name', `group ${JSON.stringify(group)} must match ${GROUP_RE.source}`);
  if (hooksDir === undefined)
    throw new RefusalError('unknown_group', `no hook for group ${group}: the agent has no --hooks-dir`);
  const linkPath = join(hooksDir, group);
  try {
    await lstat(linkPath);
  } catch {
    throw new RefusalError('unknown_group', `no hook for group ${group} in ${hooksDir}`);
  }
  let real: string;
  try {
    real = await realpath(linkPath);
  } catch {
    throw new RefusalError('unknown_group', `hook ${linkPath} is a dangling link`);
  }
  const st = await stat(real);
  if (!st.isFile()) throw new RefusalError('unknown_group', `hook ${linkPath} is not a regular file`);
  if ((st.mode & 0o111) === 0) throw new RefusalError('unknown_group', `hook ${linkPath} is not executable`);
  if (uid === 0) {
    if (st.uid !== 0 || (st.mode & 0o022) !== 0) {
      throw new RefusalError(
        'unsafe_hooks_dir',
        `hook ${real} must be owned by root and not writable by group or others`,
      );
    }
    await checkChain(await realpath(hooksDir));
    await checkChain(dirname(real));
  }
  return real;
}

/** `dir` strictly (no group/other write at all), its ancestors up to / with the sticky exception. */
async function checkChain(dir: string): Promise<void> {
  let d = dir;
  let first = true;
  for (;;) {
    const st = await stat(d);
    const writable = (st.mode & 0o022) !== 0;
    const stickyOk = !first && (st.mode & STICKY) !== 0;
    if (st.uid !== 0 || (writable && !stickyOk)) {
      throw new RefusalError('unsafe_hooks_dir', `${d} must be owned by root and not writable by group or others`);
    }
    const up = dirname(d);
    if (up === d) return;
    d = up;
    first = false;
  }
}
