/**
 * Dial-out beside listener mode (`npm run bench -- --dial-out`): the computations behind the goals
 * table of its section of BENCHMARKS.md. Each goal compares the two modes measured in the same run,
 * or holds dial-out to a bound of its own (docs/dial-out.md); what the figures mean is written by
 * hand in the section's kept reading.
 */
import { AGENT_DIAL_PING_INTERVAL_MS, FRAME_ANSWER_TIMEOUT_MS, PING_INTERVAL_MS } from '../protocol/limits.js';
import { countAbove } from './api-client.js';
import { netCpuPerAgentMs } from './cpu-figures.js';
import type { CrashRun, FanoutResult } from './fanout.js';
import { pushHealthyBytesPerHour, type IdlePart } from './idle.js';
import { median } from './util.js';

/** PATCH → hook started, one node back to back: dial-out's p50 at most this many times listener mode's. */
export const LATENCY_RATIO_GOAL = 1.2;
/** All agents with the change after a controller restart, from the restarted controller answering (ms). */
export const RESTART_ALL_GOAL_MS = 30_000;
/** Idle traffic per agent-hour, push healthy (bytes). */
export const IDLE_BYTES_PER_HOUR_GOAL = 37_000;

/**
 * `b` over `a` for runs that took turns: the median of the run-by-run ratios when both have the
 * same number of runs (a pair shared the machine's minute), else the ratio of the medians.
 * NaN when either side has none.
 */
export function pairedRatio(a: readonly number[], b: readonly number[]): number {
  if (a.length === 0 || b.length === 0) return Number.NaN;
  if (a.length === b.length) return median(a.map((x, i) => b[i]! / x));
  return median(b) / median(a);
}

/** The controller's CPU per agent of each measured run (ms), net of its background (cpu-figures.ts). */
export function cpuPerAgentRuns(f: Pick<FanoutResult, 'n' | 'runs'>): number[] {
  return f.runs.map((r) => netCpuPerAgentMs(r, r.controllerIdleCpuPerS, f.n));
}

/** The controller's memory per connected agent of each measured run (KB, the median of its window). */
export function rssPerAgentRuns(f: Pick<FanoutResult, 'runs'>): number[] {
  return f.runs.map((r) => r.controllerRssKb.perAgent);
}

/** What a crash run's window says about acks while the fleet reconnected. */
export interface AckStorm {
  probesSent: number;
  probesAcked: number;
  /** Of the probes, PATCH → ack: the median and the slowest (ms; NaN without one). */
  p50Ms: number;
  slowestMs: number;
  /** Every ack the restarted controller counted in the window, and those slower than FRAME_ANSWER_TIMEOUT_MS. */
  acks: number;
  acksOverLimit: number;
  /** Push connections the restarted controller dropped in the window because a frame went unanswered or nothing came. */
  halfOpen: number;
  /**
   * No ack starved: at least one probe was made, every probe was acked, the slowest within
   * FRAME_ANSWER_TIMEOUT_MS (the controller drops a connection whose wake-up is not answered
   * within it), none of the controller's acks beyond it, and no connection dropped half-open.
   */
  met: boolean;
}

export function ackStorm(c: Pick<CrashRun, 'ackProbe' | 'ackLatency' | 'dialFailures'>): AckStorm {
  const p = c.ackProbe;
  const probesSent = p?.sent ?? 0;
  const probesAcked = p?.acked ?? 0;
  const slowestMs = probesAcked > 0 ? p!.ackMs.max : Number.NaN;
  const limitS = FRAME_ANSWER_TIMEOUT_MS / 1000;
  const acksOverLimit = c.ackLatency ? countAbove(c.ackLatency, limitS) : 0;
  const halfOpen = c.dialFailures?.half_open ?? 0;
  return {
    probesSent,
    probesAcked,
    p50Ms: probesAcked > 0 ? p!.ackMs.p50 : Number.NaN,
    slowestMs,
    acks: c.ackLatency?.count ?? 0,
    acksOverLimit,
    halfOpen,
    met:
      probesSent > 0 &&
      probesAcked === probesSent &&
      slowestMs <= FRAME_ANSWER_TIMEOUT_MS &&
      acksOverLimit === 0 &&
      halfOpen === 0,
  };
}

/** Bytes an idle agent's push connection carries an hour in each mode (its own ping interval), or NaN. */
export function idleBytesPerHour(part: IdlePart | null, mode: 'listener' | 'dialOut'): number {
  if (!part?.ping?.pushPoll) return Number.NaN;
  return pushHealthyBytesPerHour(
    part.ping,
    Number.NaN,
    mode === 'listener' ? PING_INTERVAL_MS : AGENT_DIAL_PING_INTERVAL_MS,
  );
}
