/**
 * The seam between the agent's apply loop and its hook runner.
 */
import type { MetadataItem } from '../../protocol/heat.js';

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
  /** Default timeout when `options.timeout` is absent, ms. */
  timeoutMs?: number;
  killGraceMs?: number;
}

export type RunItem = (item: MetadataItem, opts: RunOptions) => Promise<RunResult>;
