/**
 * The demo's process supervision: every process the demo starts goes through the testbed
 * (cli/testbed/), a child in its own process group (so Ctrl-C reaches the demo only, and the
 * demo stops the whole group), logging to a file under `<root>/logs`, and carrying a marker in its environment so that whatever it starts in
 * turn (a hook's service) can be found and stopped too. Linux's /proc makes that last sweep
 * possible; elsewhere it is a no-op.
 */
import { childEnv } from '../../protocol/child-env.js';
import fs from 'node:fs';
import path from 'node:path';
import { isLiveState, parseProcStat } from '../../protocol/proc-stat.js';
import { formatMs } from '../operator/format.js';
import { STOP_GRACE_MS, type HeraldProcess } from '../testbed/process.js';
import { Testbed } from '../testbed/testbed.js';
import { sleep, TestbedError, waitFor } from '../testbed/wait.js';

export { heraldBin, tail } from '../testbed/process.js';
export { sleep } from '../testbed/wait.js';

/** How often `waitFor` asks again. */
const POLL_MS = 100;
/** Set in the environment of every process the demo starts, so cleanup can find them all. */
const DEMO_ENV_MARKER = 'HERALD_DEMO_ROOT';

/** A step of the demo that did not hold: reported as one line, without a stack. */
export class DemoFailure extends Error {}

/** A process the demo started (through the testbed). */
export type Child = HeraldProcess;

/** True when `pid` runs and is not a zombie (kill(0) where there is no /proc). */
export function isAlive(pid: number | undefined): boolean {
  if (!pid) return false;
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
  const s = parseProcStat(text);
  return s !== undefined && isLiveState(s.state);
}

/** SIGKILLs `pid` when it still runs. */
export function killIfAlive(pid: number | undefined): void {
  if (!pid || !isAlive(pid)) return;
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone already
  }
}

/**
 * SIGKILLs every process of ours whose environment holds one of `markers` (`NAME=value`);
 * Linux only (reads /proc), elsewhere a no-op. Returns how many it signalled.
 */
function killMarked(markers: string[]): number {
  let pids: string[];
  try {
    pids = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid);
  } catch {
    return 0;
  }
  let n = 0;
  for (const p of pids) {
    let environ: string[];
    try {
      environ = fs.readFileSync(`/proc/${p}/environ`, 'utf8').split('\0');
    } catch {
      continue; // gone, or not ours
    }
    if (!markers.some((m) => environ.includes(m)) || !isAlive(Number(p))) continue;
    try {
      process.kill(Number(p), 'SIGKILL');
      n++;
    } catch {
      // gone already
    }
  }
  return n;
}

/**
 * Starts, watches and stops the demo's processes: a testbed in the demo's directory (logs in
 * `<root>/logs`), whose processes get the demo's environment. `stopAll()` is idempotent.
 */
export class DemoSupervisor {
  /** The environment every child gets: what every child of Herald inherits (protocol/child-env.ts), the marker, and no CA-host warning from the CLI. */
  readonly env: NodeJS.ProcessEnv;
  readonly bed: Testbed;
  readonly #markers: string[];
  #stopped = false;

  /** @param extraMarkers more `NAME=value` pairs whose holders `stopAll` sweeps (the hooks' input) */
  constructor(root: string, extraMarkers: string[] = []) {
    // not the caller's HERALD_* settings (a database URL, a controller id): the demo's processes are its own
    this.env = childEnv(process.env, { HERALD_NO_CA_WARNING: '1', [DEMO_ENV_MARKER]: root });
    this.#markers = [`${DEMO_ENV_MARKER}=${root}`, ...extraMarkers];
    this.bed = new Testbed({ dir: root, logDir: path.join(root, 'logs'), env: this.env, cwd: root });
  }

  /** Every process started so far, in order. */
  get children(): Child[] {
    return this.bed.processes.map((p) => p.proc);
  }

  /**
   * Polls `fn` until it returns a value, for at most `timeoutMs`.
   * @throws DemoFailure when a process of `watch` exits meanwhile (with its log's tail), or at
   *   the timeout (with the last error `fn` threw)
   */
  async waitFor<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>, watch: Child[] = []): Promise<T> {
    try {
      return await waitFor(what, fn, {
        timeoutMs,
        everyMs: POLL_MS,
        watch,
        rethrow: (err) => err instanceof DemoFailure,
      });
    } catch (err) {
      if (!(err instanceof TestbedError)) throw err;
      if (err.code !== 'timeout') throw new DemoFailure(err.message);
      const last = err.cause instanceof Error ? ` (last error: ${err.cause.message})` : '';
      throw new DemoFailure(`timed out after ${formatMs(timeoutMs)} waiting for ${what}${last}`);
    }
  }

  /**
   * Stops every child (agents first: they run the hooks; then the controllers), SIGTERM then
   * SIGKILL after STOP_GRACE_MS, then `pids` (services, containers), then anything that carries
   * a marker (a hook still running when its agent stopped may start a service after the pid
   * files were read).
   */
  async stopAll(pids: () => Array<number | undefined>): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    await this.bed.stopProcesses({ graceMs: STOP_GRACE_MS });
    for (const pid of pids()) killIfAlive(pid);
    for (let i = 0; i < 3; i++) {
      if (killMarked(this.#markers) === 0 && i > 0) break;
      await sleep(200);
    }
  }

  /** Lets the demo exit with its children still running (`--keep`). */
  release(): void {
    this.#stopped = true;
    this.bed.release();
  }
}
