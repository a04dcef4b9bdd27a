/**
 * One real `bin/herald` process of the testbed (docs/development.md, "The testbed"): started with
 * Herald's node flags, its output appended to a log file, by default the leader of a process
 * group of its own (so a signal reaches whatever it started, push workers and hooks included,
 * and a terminal's Ctrl-C reaches only its parent), and stopped with a signal, then SIGKILL
 * after a grace. The demo, the benchmark and the integration tests start every Herald process
 * through here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { HERALD_NODE_FLAGS } from '../../protocol/node-flags.js';

/** How long `stop()` waits after its signal before it sends SIGKILL, unless told. */
export const STOP_GRACE_MS = 3_000;

/** How a process ended: its exit code, or the signal that ended it. */
export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface SpawnOptions {
  /** The name the process is known by (in logs and failures). */
  name: string;
  /** `bin/herald`'s arguments: `['controller', ...]`, `['agent', ...]`. */
  args: string[];
  /** Its standard output and error are appended here (the directory is made). */
  logFile: string;
  /** Its whole environment. Default: this process's. */
  env?: NodeJS.ProcessEnv | undefined;
  /** Default: this process's working directory. */
  cwd?: string | undefined;
  /** Node flags after Herald's own (a later V8 flag wins), e.g. `--cpu-prof`. */
  nodeArgs?: readonly string[] | undefined;
  /** A command the process runs under (`['heaptrack', '-o', '/tmp/ht']`): it gets node's whole command line. */
  wrap?: readonly string[] | undefined;
  /**
   * A process group of its own, signalled as a whole (default true). Without one, a signal
   * reaches the process alone and a terminal's Ctrl-C reaches it too.
   */
  group?: boolean | undefined;
}

/** A running (or ended) `bin/herald` process. */
export interface HeraldProcess {
  readonly name: string;
  readonly child: ChildProcess;
  readonly logFile: string;
  /** Resolves once the process has exited (never rejects). */
  readonly exited: Promise<Exit>;
  hasExited(): boolean;
  /** What it logged since it started (the log file may hold an earlier process's lines before). */
  log(): string;
  /** Sends `sig` to its process group (or to it alone, without one); nothing once it has exited. */
  signal(sig: NodeJS.Signals): void;
  /** `sig` (default SIGTERM), then SIGKILL after `graceMs` (default STOP_GRACE_MS); resolves once it has exited. */
  stop(sig?: NodeJS.Signals, graceMs?: number): Promise<Exit>;
  /** SIGKILL, what `kill -9` is; resolves once it has exited. */
  kill9(): Promise<Exit>;
}

let binPath: string | undefined;

/**
 * The project's `bin/herald`: found above this file, which runs from the sources (the tests,
 * through vitest) or from dist/ (the demo, the benchmark).
 * @throws Error when no directory above holds bin/herald
 */
export function heraldBin(): string {
  if (binPath !== undefined) return binPath;
  for (let dir = path.dirname(fileURLToPath(import.meta.url)); ; ) {
    const candidate = path.join(dir, 'bin', 'herald');
    if (fs.existsSync(candidate)) {
      binPath = candidate;
      return candidate;
    }
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`no bin/herald above ${fileURLToPath(import.meta.url)}`);
    dir = up;
  }
}

/** Starts `bin/herald <args>` (see SpawnOptions). */
export function spawnHerald(o: SpawnOptions): HeraldProcess {
  const group = o.group ?? true;
  fs.mkdirSync(path.dirname(o.logFile), { recursive: true });
  const fd = fs.openSync(o.logFile, 'a');
  const start = fs.fstatSync(fd).size;
  const argv = [process.execPath, ...HERALD_NODE_FLAGS, ...(o.nodeArgs ?? []), heraldBin(), ...o.args];
  const wrap = o.wrap ?? [];
  const [cmd, ...rest] = wrap.length > 0 ? [...wrap, ...argv] : argv;
  let child: ChildProcess;
  try {
    child = spawn(cmd!, rest, {
      detached: group,
      stdio: ['ignore', fd, fd],
      env: o.env ?? process.env,
      ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
    });
  } finally {
    fs.closeSync(fd);
  }
  return handleOf(o.name, child, o.logFile, start, group);
}

/**
 * The HeraldProcess view of a child started elsewhere (a packaged agent, say), logging to
 * `logFile` from byte `logStart` on.
 */
export function handleOf(
  name: string,
  child: ChildProcess,
  logFile: string,
  logStart = 0,
  group = true,
): HeraldProcess {
  let ended: Exit | undefined;
  const exited = new Promise<Exit>((resolve) => {
    const done = (code: number | null, signal: NodeJS.Signals | null): void => {
      ended ??= { code, signal };
      resolve(ended);
    };
    if (child.exitCode !== null || child.signalCode !== null) done(child.exitCode, child.signalCode);
    else {
      child.once('exit', done);
      // a spawn that failed (no such command) emits 'error' and may never emit 'exit'
      child.once('error', () => done(child.exitCode ?? -1, child.signalCode));
    }
  });
  const hasExited = (): boolean => ended !== undefined || child.exitCode !== null || child.signalCode !== null;
  const signal = (sig: NodeJS.Signals): void => {
    if (hasExited() || child.pid === undefined) return;
    try {
      if (group) process.kill(-child.pid, sig);
      else child.kill(sig);
    } catch {
      // gone already
    }
  };
  const p: HeraldProcess = {
    name,
    child,
    logFile,
    exited,
    hasExited,
    log: () => {
      try {
        return fs.readFileSync(logFile, 'utf8').slice(logStart);
      } catch {
        return '';
      }
    },
    signal,
    async stop(sig = 'SIGTERM', graceMs = STOP_GRACE_MS) {
      signal(sig);
      if (sig === 'SIGKILL') return exited;
      const timer = setTimeout(() => signal('SIGKILL'), graceMs);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
      }
    },
    kill9: () => {
      signal('SIGKILL');
      return exited;
    },
  };
  return p;
}

/** The last `lines` lines of `file`, each indented, for a failure message. */
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
 * The port in the `field` field (`host:port`, default `listen`) of the last pino JSON line of
 * `text` whose message is `msg`, if there is one: where a Herald process started on port 0 says
 * it listens.
 */
export function loggedPort(text: string, msg: string, field = 'listen'): number | undefined {
  let port: number | undefined;
  for (const line of text.split('\n')) {
    if (!line.includes(`"${msg}"`)) continue;
    try {
      const o = JSON.parse(line) as Record<string, unknown>;
      const at = o[field];
      if (o.msg !== msg || typeof at !== 'string') continue;
      const p = Number(at.slice(at.lastIndexOf(':') + 1));
      if (Number.isInteger(p) && p > 0) port = p; // the last such line: a log written to before holds older ones
    } catch {
      // a line cut off mid-write: read again at the next poll
    }
  }
  return port;
}
