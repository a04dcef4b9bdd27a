/**
 * Shows a restart's progress to a person: a progress bar with each node's phase on a TTY, plain
 * timestamped lines otherwise (logs, CI, tests). Both consume `WatchEvent`s, and the cluster
 * states the watcher reads (`look`) for each node's time against its step's deadline; both show
 * a member's last live output line (docs/api.md), so a stuck node is seen while it is stuck.
 */
import type { Writable } from 'node:stream';
import { clockTime, formatMs } from './format.js';
import type { ClusterState, NodeState, WatchEvent } from './watch.js';

/** Above this many nodes the TTY view shows one overall bar and counts instead of a bar per node. */
export const MAX_BARS_PER_NODE = 20;

export interface ProgressView {
  start(c: ClusterState): void;
  event(e: WatchEvent): void;
  /** A fresh look at the cluster (step times, deadlines). */
  look?(c: ClusterState): void;
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

/** How long a node's step has run against its deadline: `installing 12 s of 660 s`; undefined when none runs. */
export function stepClock(n: NodeState | undefined, now: number): string | undefined {
  if (n === undefined) return undefined;
  const started =
    n.phase === 'uninstalling'
      ? n.uninstallStartedMs
      : n.phase === 'installing'
        ? (n.installStartedMs ?? n.uninstallDoneMs)
        : n.phase === 'checking'
          ? (n.checkStartedMs ?? n.installDoneMs)
          : undefined;
  if (started === undefined) return undefined;
  const limit = n.stepDeadlineMs === undefined ? '' : ` of ${formatMs(n.stepDeadlineMs - started)}`;
  const late = n.stepDeadlineMs !== undefined && now > n.stepDeadlineMs ? ' (past its deadline)' : '';
  return `${n.phase} ${formatMs(now - started)}${limit}${late}`;
}

/** At most this many characters of an output line are shown. */
const MAX_SHOWN_LINE_CHARS = 120;

function shortLine(line: string): string {
  return line.length > MAX_SHOWN_LINE_CHARS ? `${line.slice(0, MAX_SHOWN_LINE_CHARS - 1)}…` : line;
}

/** One line per event: `12:00:01.234 n1 uninstalling`, `12:00:02.345 n1 | pulling image`. */
export function lineOf(e: WatchEvent): string {
  const t = clockTime(e.at);
  switch (e.kind) {
    case 'phase':
      if (e.phase === 'failed') return `${t} ${e.node} failed: ${e.reason ?? 'no reason given'}${durationsText(e)}`;
      if (e.phase === 'complete') return `${t} ${e.node} complete${durationsText(e)}`;
      return `${t} ${e.node} ${e.phase}`;
    case 'woken':
      return `${t} ${e.node} woken${e.detail ? ` (${e.detail})` : ''}`;
    case 'output':
      return `${t} ${e.node} | ${shortLine(e.line)}`;
    case 'status':
      return `${t} cluster ${e.status}${e.reason ? `: ${e.reason}` : ''}`;
    case 'rollout':
      return `${t} rollout: ${e.detail}`;
  }
}

export function plainView(out: Writable): ProgressView {
  const nodes = new Map<string, NodeState>();
  const look = (c: ClusterState): void => {
    for (const n of c.nodes) nodes.set(n.node, n);
  };
  return {
    start: look,
    look,
    event: (e) => {
      // an output line says where its node's step stands: `[installing 3.20 s of 11m00s]`
      const clock = e.kind === 'output' ? stepClock(nodes.get(e.node), e.at.getTime()) : undefined;
      out.write(`${lineOf(e)}${clock ? `  [${clock}]` : ''}\n`);
    },
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
  const states = new Map<string, NodeState>();
  const lastLines = new Map<string, string>();
  /** What a node's bar says while its step runs: phase, time against the deadline, last output line. */
  const live = (node: string): string | undefined => {
    const clock = stepClock(states.get(node), Date.now());
    if (clock === undefined) return undefined;
    const line = lastLines.get(node);
    return line === undefined ? clock : `${clock}  | ${shortLine(line)}`;
  };
  const refresh = (): void => {
    if (stopped) return;
    for (const [node, bar] of bars) {
      const text = live(node);
      if (text !== undefined) bar.update({ phase: text });
    }
  };
  // the time against the deadline moves even when nothing else does
  const ticker = setInterval(refresh, 1_000);
  ticker.unref();
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
    look(c) {
      for (const n of c.nodes) states.set(n.node, n);
      refresh();
    },
    event(e) {
      if (stopped) return;
      if (e.kind === 'output') {
        lastLines.set(e.node, e.line);
        refresh();
      } else if (e.kind === 'phase') {
        phases.set(e.node, e.phase);
        const detail = e.phase === 'failed' ? `failed: ${e.reason ?? ''}` : e.phase + durationsText(e);
        bars.get(e.node)?.update(STEP_OF[e.phase] ?? 0, { phase: detail });
        overall?.update(progressOf(), { phase: summary() });
        if (e.phase === 'failed') multi.log(`${lineOf(e)}\n`);
      } else if (e.kind === 'status') {
        overall?.update(progressOf(), { phase: `${summary()}  ${e.status}` });
      } else if (e.kind === 'rollout') {
        multi.log(`${lineOf(e)}\n`);
      }
    },
    stop() {
      if (stopped) return;
      stopped = true;
      clearInterval(ticker);
      multi.stop();
    },
  };
}
