/**
 * The demo's process supervision: every process the demo starts is a child in its own process
 * group (so Ctrl-C reaches the demo only, and the demo stops the whole group), logging to a file
 * under `<root>/logs`, and carrying a marker in its environment so that whatever it starts in
 * turn (a hook's service) can be found and stopped too. Linux's /proc makes that last sweep
 * possible; elsewhere it is a no-op.
 */
import { childEnv } from '../../protocol/child-env.js';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { isLiveState, parseProcStat } from '../../protocol/proc-stat.js';
import { formatMs } from '../operator/format.js';
import { HERALD_NODE_FLAGS } from '../../protocol/node-flags.js';

/** How long a stopped child may take before it is killed. */
const STOP_GRACE_MS = 3_000;
/** How often `waitFor` asks again. */
const POLL_MS = 100;
/** Set in the environment of every process the demo starts, so cleanup can find them all. */
const DEMO_ENV_MARKER = 'HERALD_DEMO_ROOT';

/** A step of the demo that did not hold: reported as one line, without a stack. */
export class DemoFailure extends Error {}

export interface Child {
  name: string;
  proc: ChildProcess;
  log: string;
  exited: boolean;
}

/** The project's `bin/herald`, from this compiled file (dist/cli/demo/). */
export function heraldBin(): string {
  return fileURLToPath(new URL('../../../bin/herald', import.meta.url));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * A port free right now on 127.0.0.1: racy by nature (another process may bind it before the
 * child does, which shows as the child's exit), so only for what cannot bind port 0 and say
 * where it listens (PostgreSQL, whose port must also survive its restarts). Herald's own
 * processes listen on port 0: `boundPort`, and agents announce what they bound.
 */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => (a && typeof a === 'object' ? resolve(a.port) : reject(new Error('no port'))));
    });
  });
}

/** The port in a controller's last "controller listening" log line (pino JSON), if it has logged one. */
export function listenedPort(log: string): number | undefined {
  let text: string;
  try {
    text = fs.readFileSync(log, 'utf8');
  } catch {
    return undefined;
  }
  let port: number | undefined;
  for (const line of text.split('\n')) {
    if (!line.includes('"controller listening"')) continue;
    try {
      const { msg, listen } = JSON.parse(line) as { msg?: unknown; listen?: unknown };
      if (msg !== 'controller listening' || typeof listen !== 'string') continue;
      const p = Number(listen.slice(listen.lastIndexOf(':') + 1));
      if (Number.isInteger(p) && p > 0) port = p; // the last such line: a log written to before holds older ones
    } catch {
      // a line cut off mid-write: read again at the next poll
    }
  }
  return port;
}

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

/** The last lines of a log file, indented, for a failure message. */
export function tail(file: string, lines = 15): string {
  try {
    return fs
      .readFileSync(file, 'utf8')
      .trimEnd()
      .split('\n')
      .slice(-lines)
      .map((l) => `    ${l}`)
      .join('\n');
  } catch {
    return '    (no log)';
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

/** Starts, watches and stops the demo's processes. `stopAll()` is idempotent. */
export class DemoSupervisor {
  readonly children: Child[] = [];
  /** The environment every child gets: what every child of Herald inherits (protocol/child-env.ts), the marker, and no CA-host warning from the CLI. */
  readonly env: NodeJS.ProcessEnv;
  readonly #root: string;
  readonly #markers: string[];
  #stopped = false;

  /** @param extraMarkers more `NAME=value` pairs whose holders `stopAll` sweeps (the hooks' input) */
  constructor(root: string, extraMarkers: string[] = []) {
    this.#root = root;
    // not the caller's HERALD_* settings (a database URL, a controller id): the demo's processes are its own
    this.env = childEnv(process.env, { HERALD_NO_CA_WARNING: '1', [DEMO_ENV_MARKER]: root });
    this.#markers = [`${DEMO_ENV_MARKER}=${root}`, ...extraMarkers];
  }

  /** Starts `bin/herald <args>` detached, its output appended to `<root>/logs/<name>.log`. */
  startHerald(name: string, args: string[]): Child {
    const log = path.join(this.#root, 'logs', `${name}.log`);
    fs.mkdirSync(path.dirname(log), { recursive: true });
    const fd = fs.openSync(log, 'a');
    const proc = spawn(process.execPath, [...HERALD_NODE_FLAGS, heraldBin(), ...args], {
      detached: true,
      stdio: ['ignore', fd, fd],
      env: this.env,
      cwd: this.#root,
    });
    fs.closeSync(fd);
    const c: Child = { name, proc, log, exited: false };
    proc.on('exit', () => (c.exited = true));
    proc.on('error', () => (c.exited = true));
    this.children.push(c);
    return c;
  }

  /**
   * Polls `fn` until it returns a value, for at most `timeoutMs`.
   * @throws DemoFailure when a process of `watch` exits meanwhile (with its log's tail), or at
   *   the timeout (with the last error `fn` threw)
   */
  async waitFor<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>, watch: Child[] = []): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    let lastErr: unknown;
    for (;;) {
      const dead = watch.find((c) => c.exited);
      if (dead)
        throw new DemoFailure(
          `${dead.name} exited while waiting for ${what}; its log (${dead.log}):\n${tail(dead.log)}`,
        );
      try {
        const v = await fn();
        if (v !== undefined) return v;
      } catch (err) {
        if (err instanceof DemoFailure) throw err;
        lastErr = err;
      }
      if (Date.now() > deadline) {
        throw new DemoFailure(
          `timed out after ${formatMs(timeoutMs)} waiting for ${what}${lastErr ? ` (last error: ${(lastErr as Error).message})` : ''}`,
        );
      }
      await sleep(POLL_MS);
    }
  }

  /**
   * The port `child`, a `herald controller` started with `--listen <host>:0`, was given by the
   * kernel, from its "controller listening" log line.
   * @throws DemoFailure when it exits first (with its log's tail), or at the timeout
   */
  boundPort(child: Child, timeoutMs: number): Promise<number> {
    return this.waitFor(`${child.name} to listen`, timeoutMs, async () => listenedPort(child.log), [child]);
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
    const isController = (c: Child): boolean => c.name === 'controller' || c.name.startsWith('controller-');
    const order = [...this.children.filter((c) => !isController(c)), ...this.children.filter(isController)];
    for (const c of order) signalGroup(c, 'SIGTERM');
    const deadline = Date.now() + STOP_GRACE_MS;
    while (order.some((c) => !c.exited) && Date.now() < deadline) await sleep(50);
    for (const c of order) if (!c.exited) signalGroup(c, 'SIGKILL');
    for (const pid of pids()) killIfAlive(pid);
    for (let i = 0; i < 3; i++) {
      if (killMarked(this.#markers) === 0 && i > 0) break;
      await sleep(200);
    }
  }

  /** Lets the demo exit with its children still running (`--keep`). */
  release(): void {
    this.#stopped = true;
    for (const c of this.children) c.proc.unref();
  }
}

function signalGroup(c: Child, sig: NodeJS.Signals): void {
  if (c.proc.pid === undefined) return;
  try {
    process.kill(-c.proc.pid, sig);
  } catch {
    // gone already
  }
}
