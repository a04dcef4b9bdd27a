/**
 * The seam between the agent's apply loop and its hook runner.
 */
import type { MetadataItem } from '../../protocol/heat.js';
import type { HookLauncher } from './launcher.js';

export interface RunResult {
  deploy_status_code: number;
  deploy_stdout: string;
  deploy_stderr: string;
  /** Declared outputs the hook produced (values as read). */
  outputs: Record<string, unknown>;
  /** Set when Herald, not the hook, decided the result (`hook_timeout`, `unknown_group`, ...). */
  status_reason?: string;
}

export interface RunOptions {
  /** Where per-run 0700 directories are made (under the state dir). */
  runsDir: string;
  /** Folder of hooks for groups other than the built-in ones; undefined: none. */
  hooksDir?: string;
  /** Abort: kill the run's process group (agent shutdown). */
  signal?: AbortSignal;
  /** Called with the hook's pid as soon as it started (benchmarks, tests). */
  onSpawn?: (pid: number) => void;
  /**
   * Called with each piece of stdout or stderr the hook writes, unmasked, as it comes (live
   * output, docs/api.md: the sink masks before anything leaves). Must not throw or block.
   */
  onOutput?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void;
  /** Default timeout when `options.timeout` is absent, ms. */
  timeoutMs?: number;
  /** Grace between TERM and KILL of the process group, ms (default HOOK_KILL_GRACE_MS). */
  killGraceMs?: number;
  /** How long a hook's pipes may drain after it exited, ms (default HOOK_OUTPUT_DRAIN_MS). */
  drainMs?: number;
  /**
   * The agent's effective uid, deciding whether the hooks dir ownership checks apply (only 0 does).
   * Default `process.getuid?.()`; tests inject it.
   */
  uid?: number;
  /** The agent's environment, of which only PATH, HOME, LANG and LC_* pass. Default process.env. */
  env?: NodeJS.ProcessEnv;
  /**
   * Starts hooks without forking the agent (launcher.ts) when it can; absent: every hook is
   * spawned by the agent itself.
   */
  launcher?: HookLauncher;
  /** Warnings about refused items and unexpected failures (ids and codes only, never values). */
  log?: { warn(obj: object, msg: string): void };
}

export type RunItem = (item: MetadataItem, opts: RunOptions) => Promise<RunResult>;
