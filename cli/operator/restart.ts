/**
 * `herald cluster restart --wait` (and `upgrade`, `rollout undo`): follows the rollout to its end (each node's phase, its time
 * against its step's deadline and its last live output line, docs/api.md), prints a summary per node
 * and turns the result into an exit status, with the failing node and reason named on stderr.
 */
import type { ApiClient } from './client.js';
import { plainView, ttyView, type ProgressView } from './progress.js';
import { watchRestart, type WatchEvent, type WatchResult } from './watch.js';
import { formatMs, table } from './format.js';
import type { ClusterState } from './watch.js';
import { jsonText, visible } from '../terminal-text.js';

/** The end of a restart, one row per node: phase, step times and the last output line seen. */
export function summaryTable(c: ClusterState, lastLines: ReadonlyMap<string, string>): string {
  const ms = (a: number | undefined, b: number | undefined): string =>
    a === undefined || b === undefined ? '-' : formatMs(b - a);
  return table(
    ['NODE', 'PHASE', 'UNINSTALL', 'INSTALL', 'REASON', 'LAST OUTPUT'],
    c.nodes.map((n) => [
      n.node,
      n.phase,
      ms(n.uninstallStartedMs, n.uninstallDoneMs),
      ms(n.installStartedMs, n.installDoneMs),
      n.reason ?? '',
      (lastLines.get(n.node) ?? '').slice(0, 80),
    ]),
  );
}

export interface FollowOptions {
  clusterId: string;
  startedAt: Date;
  timeoutMs: number;
  json: boolean;
  /** Print a node's text as it came, terminal control bytes included (`--raw`). */
  raw?: boolean;
  /** Default: a bar on a TTY, lines otherwise. */
  progress?: 'bar' | 'lines' | undefined;
  useEvents?: boolean;
  /** What is followed (default restart): an upgrade or an undo ends UPDATE_COMPLETE or UPDATE_FAILED. */
  what?: 'restart' | 'upgrade' | 'undo';
}

/** Follows the restart; returns the exit status (0 complete, 1 failed, 2 timed out). */
export async function followRestart(client: ApiClient, o: FollowOptions): Promise<number> {
  const what = o.what ?? 'restart';
  const events: WatchEvent[] = [];
  /** Each node's last live output line. */
  const lastLines = new Map<string, string>();
  let view: ProgressView | undefined;
  if (!o.json) {
    const tty = process.stderr.isTTY === true && process.stdout.isTTY === true;
    view =
      (o.progress ?? (tty ? 'bar' : 'lines')) === 'bar' ? await ttyView(process.stderr) : plainView(process.stdout);
  }
  const stopView = (): void => view?.stop();
  process.once('SIGINT', () => {
    stopView();
    process.stderr.write(`herald: stopped following; the ${what} goes on (herald cluster show ${o.clusterId})\n`);
    process.exit(130);
  });
  let result: WatchResult;
  try {
    result = await watchRestart(client, {
      clusterId: o.clusterId,
      startedAt: o.startedAt,
      timeoutMs: o.timeoutMs,
      useEvents: o.useEvents !== false,
      // JSON output escapes control characters itself (jsonText), losslessly
      raw: o.raw === true || o.json,
      onStart: (c) => view?.start(c),
      onLook: (c) => view?.look?.(c),
      onEvent: (e) => {
        if (e.kind === 'output') lastLines.set(e.node, e.line);
        else events.push(e);
        view?.event(e);
      },
    });
  } finally {
    stopView();
  }
  const took = formatMs(Date.now() - o.startedAt.getTime());
  if (!o.json && result.cluster) process.stdout.write(summaryTable(result.cluster, lastLines));
  if (o.json) {
    process.stdout.write(
      `${jsonText({ ok: result.ok, timed_out: result.timedOut, status: result.cluster?.status ?? null, failed: result.failed, events }, o.raw === true)}\n`,
    );
  }
  if (result.ok) {
    if (!o.json)
      process.stdout.write(
        what === 'restart'
          ? `cluster ${o.clusterId} restarted: RESTART_COMPLETE in ${took}\n`
          : `cluster ${o.clusterId} at revision ${result.cluster?.revision ?? '?'} on every node: ${result.cluster?.status ?? 'UPDATE_COMPLETE'} in ${took}\n`,
      );
    return 0;
  }
  if (result.timedOut) {
    process.stderr.write(
      `herald: timeout: cluster ${o.clusterId} did not finish its ${what} within ${formatMs(o.timeoutMs)} (status ${result.cluster?.status ?? 'unknown'}); it goes on: herald cluster show ${o.clusterId}\n`,
    );
    return 2;
  }
  const status = result.cluster?.status ?? 'unknown';
  const nodes = result.failed.length
    ? result.failed.map((f) => `node ${f.node}: ${f.reason}`).join('; ')
    : (result.cluster?.statusReason ?? 'no node reported a reason');
  // a revert's reason names every node it brought back, and those whose revert failed
  const why = result.cluster?.rollout?.revert ? (result.cluster.statusReason ?? nodes) : nodes;
  const line = `herald: ${what} failed: cluster ${o.clusterId} ${status}: ${why}\n`;
  process.stderr.write(o.raw === true ? line : visible(line)); // the reasons are the nodes'
  return 1;
}
