/**
 * Shows a restart's progress to a person: a progress bar with each node's phase on a TTY, plain
 * timestamped lines otherwise (logs, CI, tests). Both consume `WatchEvent`s only.
 */
import type { Writable } from 'node:stream';
import { clockTime, formatMs } from './operator-format.js';
import type { ClusterState, WatchEvent } from './operator-watch.js';

/** Above this many nodes the TTY view shows one overall bar and counts instead of a bar per node. */
export const MAX_BARS_PER_NODE = 20;

export interface ProgressView {
  start(c: ClusterState): void;
  event(e: WatchEvent): void;
  /** Stops any live drawing; idempotent. */
  stop(): void;
}

/** A finished node's line suffix: `(uninstall 40 ms, install 35 ms)`. */
export function durationsText(e: { uninstallMs?: number; installMs?: number }): string {
  const parts: string[] = [];
  if (e.uninstallMs !== undefined) parts.push(`uninstall ${formatMs(e.uninstallMs)}`);
  if (e.installMs !== undefined) parts.push(`install ${formatMs(e.installMs)}`);
  return parts.length ? ` (${parts.join(', ')})` : '';
}

/** One line per event: `12:00:01.234 n1 uninstalling`. */
export function lineOf(e: WatchEvent): string {
  const t = clockTime(e.at);
  switch (e.kind) {
    case 'phase':
      if (e.phase === 'failed') return `${t} ${e.node} failed: ${e.reason ?? 'no reason given'}${durationsText(e)}`;
      if (e.phase === 'complete') return `${t} ${e.node} complete${durationsText(e)}`;
      return `${t} ${e.node} ${e.phase}`;
    case 'woken':
      return `${t} ${e.node} woken${e.detail ? ` (${e.detail})` : ''}`;
    case 'status':
      return `${t} cluster ${e.status}${e.reason ? `: ${e.reason}` : ''}`;
  }
}

export function plainView(out: Writable): ProgressView {
  return {
    start: () => undefined,
    event: (e) => void out.write(`${lineOf(e)}\n`),
    stop: () => undefined,
  };
}

const STEP_OF: Record<string, number> = { pending: 0, uninstalling: 0, installing: 1, complete: 2, failed: 2 };

/** The TTY view: cli-progress bars, lines for failures and wake-ups logged above them. */
export async function ttyView(out: NodeJS.WriteStream): Promise<ProgressView> {
  const { MultiBar, Presets } = await import('cli-progress');
  const multi = new MultiBar(
    {
      stream: out,
      format: ' {label} [{bar}] {phase}',
      barsize: 24,
      hideCursor: true,
      clearOnComplete: false,
      stopOnComplete: false,
      autopadding: true,
      fps: 10,
    },
    Presets.shades_classic,
  );
  const bars = new Map<string, ReturnType<typeof multi.create>>();
  const phases = new Map<string, string>();
  let overall: ReturnType<typeof multi.create> | undefined;
  let labelWidth = 7;
  let stopped = false;

  const summary = (): string => {
    const counts = new Map<string, number>();
    for (const p of phases.values()) counts.set(p, (counts.get(p) ?? 0) + 1);
    return [...counts].map(([p, n]) => `${n} ${p}`).join(', ');
  };
  const progressOf = (): number => [...phases.values()].reduce((a, p) => a + (STEP_OF[p] ?? 0), 0);

  return {
    start(c) {
      labelWidth = Math.max(labelWidth, ...c.nodes.map((n) => n.node.length));
      for (const n of c.nodes) phases.set(n.node, 'pending');
      overall = multi.create(c.nodes.length * 2, 0, { label: 'restart'.padEnd(labelWidth), phase: summary() });
      if (c.nodes.length <= MAX_BARS_PER_NODE) {
        for (const n of c.nodes)
          bars.set(n.node, multi.create(2, 0, { label: n.node.padEnd(labelWidth), phase: 'pending' }));
      }
    },
    event(e) {
      if (stopped) return;
      if (e.kind === 'phase') {
        phases.set(e.node, e.phase);
        const detail = e.phase === 'failed' ? `failed: ${e.reason ?? ''}` : e.phase + durationsText(e);
        bars.get(e.node)?.update(STEP_OF[e.phase] ?? 0, { phase: detail });
        overall?.update(progressOf(), { phase: summary() });
        if (e.phase === 'failed') multi.log(`${lineOf(e)}\n`);
      } else if (e.kind === 'status') {
        overall?.update(progressOf(), { phase: `${summary()}  ${e.status}` });
      }
    },
    stop() {
      if (stopped) return;
      stopped = true;
      multi.stop();
    },
  };
}
