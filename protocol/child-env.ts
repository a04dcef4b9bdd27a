/**
 * The environment of every process Herald starts (push workers, hooks, the demo's controllers
 * and agents, a throwaway PostgreSQL), built in this one place from an allow-list: where
 * programs are (PATH), the home directory and the locale (LANG, LC_*). Nothing else of the
 * parent's passes: not HERALD_DB or HERALD_CONTROLLER_DB with the database password, not
 * another HERALD_* setting that would steer the child, not NODE_OPTIONS (a `--require` would
 * run in the child), not LD_*. A child that needs a variable is given it by name, by its caller.
 * SECURITY.md "Actors" and docs/several-controllers.md say why.
 */

/** Used when the parent itself has no PATH. */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The part of `parent` every child inherits: PATH (DEFAULT_PATH when unset), HOME, LANG and LC_*. */
export function inheritedEnv(parent: NodeJS.ProcessEnv): Record<string, string> {
  const env: Record<string, string> = { PATH: parent.PATH ?? DEFAULT_PATH };
  if (parent.HOME !== undefined) env.HOME = parent.HOME;
  if (parent.LANG !== undefined) env.LANG = parent.LANG;
  for (const [k, v] of Object.entries(parent)) {
    if (k.startsWith('LC_') && /^LC_[A-Z]+$/.test(k) && v !== undefined) env[k] = v;
  }
  return env;
}

/** A child's environment: what it inherits of `parent` (inheritedEnv), and `given` by name. */
export function childEnv(parent: NodeJS.ProcessEnv, given: Record<string, string> = {}): Record<string, string> {
  return { ...inheritedEnv(parent), ...given };
}
