/**
 * What `herald demo --controllers` prints after its kill: the timeline in seconds from the kill,
 * and the checks (the restart completed, the takeover within TAKEOVER_LIMIT_MS, every step once
 * by the scripts' count). Pure but for reading each node's `runs.log`.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { DemoNode } from './fixtures.js';
import { redact } from './fleet-plan.js';
import { heraldCommand } from './report.js';
import type { Takeover } from './fleet.js';
import { formatMs } from '../operator/format.js';
import type { WatchEvent, WatchResult } from '../operator/watch.js';

/** docs/several-controllers.md: a dead controller's nodes are taken over and pinged within this long of its death. */
export const TAKEOVER_LIMIT_MS = 10_000;

export interface FleetCheck {
  ok: boolean;
  text: string;
}

/** The story from the kill: seconds relative to it, one line per step. */
export function timeline(
  t: Takeover,
  events: WatchEvent[],
  o: { startedAt: number; pid: number; doneAtKill: number; total: number; endedAt: number | undefined },
): string[] {
  const at = (ms: number): string => {
    const s = (ms - t.killedAt) / 1000;
    return `${s < 0 ? '-' : '+'}${Math.abs(s).toFixed(2)} s`.padStart(10);
  };
  const lines: Array<[number, string]> = [
    [o.startedAt, 'restart accepted'],
    [
      t.killedAt,
      `kill -9 ${t.victim} (pid ${o.pid}), owner of ${t.orphans.length} of ${o.total} nodes (${t.orphans.join(', ')}); ${o.doneAtKill} node(s) restarted so far`,
    ],
  ];
  if (t.takenOverAt !== undefined) {
    const gained = [...(t.gained ?? [])].filter(([, n]) => n > 0).map(([c, n]) => `${c} +${n}`);
    lines.push([t.takenOverAt, `${t.victim} not live, its nodes taken over: ${gained.join(', ') || '-'}`]);
  }
  for (const [node, p] of t.pinged) lines.push([p.at, `${node} pinged by its new owner ${p.by}`]);
  for (const e of events)
    if (e.kind === 'phase' && e.at.getTime() >= t.killedAt && t.orphans.includes(e.node) && e.phase !== 'pending')
      lines.push([e.at.getTime(), `${e.node} ${e.phase}`]);
  if (o.endedAt !== undefined) {
    const end = events.find((e) => e.kind === 'status' && e.at.getTime() === o.endedAt);
    lines.push([o.endedAt, end?.kind === 'status' ? end.status : 'restart ended']);
  }
  return lines.sort((a, b) => a[0] - b[0]).map(([ms, text]) => `${at(ms)}  ${text}`);
}

/** The restart completed; the takeover was within TAKEOVER_LIMIT_MS; each node ran each step once. */
export function fleetChecks(
  t: Takeover,
  r: WatchResult,
  o: { nodes: DemoNode[]; startedAt: number; endedAt: number | undefined; timeoutMs: number; watchMs: number },
): FleetCheck[] {
  const status = r.cluster?.status ?? '?';
  const restart = r.ok
    ? {
        ok: true,
        text: `the restart completed: ${status} ${formatMs((o.endedAt ?? Date.now()) - o.startedAt)} after the PATCH, through the kill`,
      }
    : {
        ok: false,
        text: r.timedOut
          ? `the restart did not finish within ${formatMs(o.timeoutMs)}`
          : `the restart ended ${status}: ${r.failed.map((f) => `${f.node}: ${f.reason}`).join('; ') || 'no reason'}`,
      };
  const missing = t.orphans.filter((n) => !t.pinged.has(n));
  const lastPing = Math.max(t.takenOverAt ?? Number.POSITIVE_INFINITY, ...[...t.pinged.values()].map((p) => p.at));
  const within = missing.length === 0 && t.takenOverAt !== undefined && lastPing - t.killedAt <= TAKEOVER_LIMIT_MS;
  const takeover = {
    ok: within,
    text:
      missing.length > 0
        ? `not every orphaned node was pinged by a new owner within ${formatMs(o.watchMs)}: ${missing.join(', ')}`
        : t.takenOverAt === undefined
          ? `${t.victim} was never seen dead with its nodes taken over`
          : `takeover: every node of ${t.victim} (${t.orphans.join(', ')}) owned and pinged by a survivor ${formatMs(lastPing - t.killedAt)} after the kill (limit ${formatMs(TAKEOVER_LIMIT_MS)})`,
  };
  const counts = o.nodes.map((n) => ({ id: n.id, steps: restartSteps(n) }));
  const wrong = counts.filter((c) => c.steps.join(',') !== 'uninstall RESTART,install RESTART');
  const once = {
    ok: wrong.length === 0,
    text:
      wrong.length === 0
        ? `every step ran exactly once: on each of the ${counts.length} nodes the scripts counted one uninstall, then one install`
        : `steps did not run exactly once: ${wrong.map((c) => `${c.id}: ${c.steps.join(', ') || 'none'}`).join('; ')}`,
  };
  return [restart, takeover, once];
}

/** The restart's steps as the node's scripts logged them (`<node>/runs.log`), in order. */
function restartSteps(n: DemoNode): string[] {
  try {
    return fs
      .readFileSync(path.join(n.dir, 'runs.log'), 'utf8')
      .split('\n')
      .filter((l) => l.endsWith(' RESTART'));
  } catch {
    return [];
  }
}

/** `s` indented by two spaces, without a closing newline. */
export function indent(s: string): string {
  return s
    .trimEnd()
    .split('\n')
    .map((l) => `  ${l}`)
    .join('\n');
}

/** Tells how to use the fleet `--keep` left running (the killed controller included), and how to stop it. */
export function keepFleetRunning(
  say: (s: string) => void,
  k: {
    root: string;
    pkiDir: string;
    db: string;
    clusterId: string;
    live: Array<{ name: string; url: string }>;
    killed: { name: string; url: string } | undefined;
    nodes: number;
    throwawayPg: boolean;
    stopScript: string;
    ownDir: boolean;
  },
): void {
  const herald = heraldCommand();
  const at = k.live[0];
  say('');
  say(
    `Left running (--keep): controllers ${k.live.map((c) => c.name).join(', ')}, ${k.nodes} agents, their containers and services${k.throwawayPg ? ', and PostgreSQL' : ''}. Logs: ${path.join(k.root, 'logs')}`,
  );
  if (at) {
    const conn = `--controller ${at.url} --controller-id ${at.name} --pki ${k.pkiDir}`;
    say('');
    say('With the CLI (every controller answers for all; --controller-id names the one --controller points at):');
    say(`  ${herald} controllers ${conn}`);
    say(`  ${herald} cluster show ${k.clusterId} ${conn}`);
    say(`  ${herald} cluster restart ${k.clusterId} --wait ${conn}`);
  }
  if (k.killed) {
    const port = new URL(k.killed.url).port;
    say(`Start ${k.killed.name} again, and watch it take its share back with herald controllers:`);
    say(
      `  ${herald} controller --name ${k.killed.name} --listen 127.0.0.1:${port} --pki ${k.pkiDir} --db ${redact(k.db)}`,
    );
  }
  if (k.throwawayPg) say(`The database: psql ${redact(k.db)}`);
  say('');
  say(`Stop everything${k.ownDir ? ' and remove the directory' : ''}: sh ${k.stopScript}`);
}
