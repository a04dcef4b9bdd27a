/**
 * Runs one hook process the way docs/architecture.md asks: in its own process group, with a timeout that
 * kills the whole group (TERM, then KILL after a grace), keeping only the tail of stdout and
 * stderr, and ending when the hook's OWN process exits, even if a daemon it started still holds
 * the pipes.
 *
 * A grandchild that calls `setsid` leaves the group and escapes the kill; nothing short of a
 * cgroup catches it (documented in the README).
 */
import { isLiveState, parseProcStat } from '../../protocol/proc-stat.js';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { constants as osc } from 'node:os';
import { HOOK_SPAWN_BUSY_MAX_WAIT_MS, HOOK_SPAWN_BUSY_RETRY_MS } from '../../protocol/limits.js';
import type { HookLauncher, LaunchedProcess } from './launcher.js';
import { TailBuffer } from './tail-buffer.js';

export interface ProcessSpec {
  file: string;
  args?: string[];
  cwd: string;
  env: Record<string, string>;
  /** Written to stdin, which is then closed; absent: stdin is /dev/null. */
  stdin?: string;
  timeoutMs: number;
  killGraceMs: number;
  /** After the process exited, how long its pipes may still drain. */
  drainMs: number;
  maxOutputBytes: number;
  signal?: AbortSignal;
  onSpawn?: (pid: number) => void;
  /** Called with each piece the hook writes, as it comes (live output); must not throw or block. */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  /** Starts the process when it can (launcher.ts); otherwise, or when absent, it is spawned here. */
  launcher?: HookLauncher;
}

export interface ProcessResult {
  /**
   * Exit code, or 128 + signal number when a signal ended it. null when it never started, or
   * when its status was lost (its launcher died while it ran).
   */
  exitCode: number | null;
  exitSignal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  aborted: boolean;
  /** Set when the process could not be started (ENOENT, EACCES, ...). */
  spawnError?: Error;
}

/** How often the group is probed for survivors after a kill, ms. */
const GROUP_PROBE_MS = 50;

/**
 * Runs the process; a start refused with ETXTBSY is tried again (doubling delays from
 * HOOK_SPAWN_BUSY_RETRY_MS, within HOOK_SPAWN_BUSY_MAX_WAIT_MS). ETXTBSY: the script file is
 * still open for writing somewhere, typically in a process forked by another spawn while the
 * runner had the file open (between that fork and its exec). It clears by itself at once.
 */
export async function runProcess(spec: ProcessSpec): Promise<ProcessResult> {
  let waited = 0;
  for (let delay = HOOK_SPAWN_BUSY_RETRY_MS; ; delay *= 2) {
    await spec.launcher?.prepare();
    const r = await runProcessOnce(spec);
    const busy = (r.spawnError as NodeJS.ErrnoException | undefined)?.code === 'ETXTBSY';
    if (!busy || waited + delay > HOOK_SPAWN_BUSY_MAX_WAIT_MS || spec.signal?.aborted === true) return r;
    await new Promise((res) => setTimeout(res, delay));
    waited += delay;
  }
}

function runProcessOnce(spec: ProcessSpec): Promise<ProcessResult> {
  return new Promise((resolve) => {
    const out = new TailBuffer(spec.maxOutputBytes);
    const err = new TailBuffer(spec.maxOutputBytes);
    let timedOut = false;
    let aborted = false;
    let killTimer: NodeJS.Timeout | undefined;
    let killSent = false;
    let settled = false;

    const result = (exitCode: number | null, exitSignal: NodeJS.Signals | null, spawnError?: Error): ProcessResult => {
      const r: ProcessResult = { exitCode, exitSignal, stdout: out.text(), stderr: err.text(), timedOut, aborted };
      if (spawnError !== undefined) r.spawnError = spawnError;
      return r;
    };

    let child: ReturnType<typeof spawn> | LaunchedProcess;
    try {
      child =
        spec.launcher?.launch({
          file: spec.file,
          args: spec.args ?? [],
          cwd: spec.cwd,
          env: spec.env,
          stdin: spec.stdin !== undefined,
        }) ??
        spawn(spec.file, spec.args ?? [], {
          cwd: spec.cwd,
          env: spec.env,
          detached: true, // own process group: the timeout kills the hook and its children
          stdio: [spec.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
          windowsHide: true,
        });
    } catch (e) {
      resolve(result(null, null, e as Error));
      return;
    }

    // read when needed: a launched process has its pid only once it started
    const killGroup = (sig: NodeJS.Signals): void => {
      const pid = child.pid;
      if (pid === undefined) return;
      try {
        process.kill(-pid, sig);
      } catch {
        // ESRCH: the group is gone already
      }
    };
    const groupAlive = (): boolean => child.pid !== undefined && groupHasLiveMember(child.pid);
    const startKill = (): void => {
      if (killTimer !== undefined || killSent) return;
      killGroup('SIGTERM');
      killTimer = setTimeout(() => {
        killSent = true;
        killGroup('SIGKILL');
      }, spec.killGraceMs);
    };

    const timeout = setTimeout(() => {
      timedOut = true;
      startKill();
    }, spec.timeoutMs);
    const onAbort = (): void => {
      if (timedOut) return;
      aborted = true;
      startKill();
    };
    if (spec.signal?.aborted === true) onAbort();
    else spec.signal?.addEventListener('abort', onAbort, { once: true });

    const live = spec.onOutput;
    child.stdout?.on('data', (b: Buffer) => {
      out.push(b);
      live?.('stdout', b);
    });
    child.stderr?.on('data', (b: Buffer) => {
      err.push(b);
      live?.('stderr', b);
    });
    child.stdin?.on('error', () => undefined); // EPIPE: the hook did not read its stdin
    if (spec.stdin !== undefined) child.stdin?.end(spec.stdin);

    child.once('spawn', () => {
      if (child.pid === undefined) return;
      // a timeout or an abort before a launched hook's pid was known: its group is killed now
      if (killTimer !== undefined || killSent) killGroup(killSent ? 'SIGKILL' : 'SIGTERM');
      spec.onSpawn?.(child.pid);
    });

    const cleanup = (): void => {
      clearTimeout(timeout);
      spec.signal?.removeEventListener('abort', onAbort);
    };

    child.once('error', (e: Error) => {
      // Only a failure to start ends the run here; after a start, 'exit' does.
      if (settled || child.pid !== undefined) return;
      settled = true;
      cleanup();
      resolve(result(null, null, e));
    });

    child.once('exit', (code: number | null, sig: NodeJS.Signals | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timeout);
      void (async () => {
        await drain(child, spec.drainMs);
        child.stdout?.destroy();
        child.stderr?.destroy();
        child.stdin?.destroy(); // a daemon may hold the hook's stdin unread: no write waits for it
        // After a timeout or abort, the run ends only when the group is gone or got its KILL,
        // so "killed with its children" holds when the result is seen.
        if (killTimer !== undefined) {
          while (!killSent && groupAlive()) await new Promise((r) => setTimeout(r, GROUP_PROBE_MS));
          clearTimeout(killTimer);
        }
        cleanup();
        const exitCode = code ?? (sig !== null ? 128 + (osc.signals[sig] ?? 0) : null);
        resolve(result(exitCode, sig));
      })();
    });
  });
}

/**
 * True while a process of group `pgid` is alive. kill(-pgid, 0) also counts zombies, and killed
 * orphans stay zombies until PID 1 reaps them (slowly, in some containers): on Linux, /proc is
 * read to skip them.
 */
function groupHasLiveMember(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
  } catch {
    return false;
  }
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return true; // no /proc: trust kill(0)
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${e}/stat`, 'latin1');
    } catch {
      continue; // exited meanwhile
    }
    const s = parseProcStat(stat);
    if (s?.pgrp === pgid && isLiveState(s.state)) return true;
  }
  return false;
}

/** Waits for stdout and stderr to close, at most `ms` (a daemon may keep them open forever). */
function drain(
  child: { stdout: NodeJS.ReadableStream | null; stderr: NodeJS.ReadableStream | null },
  ms: number,
): Promise<void> {
  const closed = (s: NodeJS.ReadableStream | null): Promise<void> =>
    s === null || (s as unknown as { closed?: boolean }).closed === true
      ? Promise.resolve()
      : new Promise((r) => {
          s.once('close', () => r());
          s.once('end', () => r());
        });
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    Promise.all([closed(child.stdout), closed(child.stderr)]).then(() => undefined),
    new Promise<void>((r) => {
      timer = setTimeout(r, ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
