/**
 * What `herald demo --heat` prints about its restart, from what it gathered (cli/demo/heat.ts):
 * the timeline from the `openstack stack update` command to Heat's UPDATE_COMPLETE, each node's
 * gap from Heat's metadata write to its hook's start, the checks, and what os-collect-config's
 * polling would have added (computed from its interval, not measured). Pure: no I/O.
 */
import type { StackStateLine } from '../testbed/heat-log.js';
import { formatMs, table } from '../operator/format.js';

export type HeatHook = 'uninstall' | 'install';

/** What one restart through Heat left behind. */
export interface HeatRestartFacts {
  nodes: readonly string[];
  /** The `openstack stack update` command started (epoch ms). */
  cmdAt: number;
  /** Heat's API received the PATCH (Heat's log). */
  patchAt: number | undefined;
  /** Heat's metadata writes that changed a node's deployments (the controller's `heat.metadata` events). */
  puts: ReadonlyArray<{ node: string; at: number }>;
  /** Hooks started (each script's first line writes the time). */
  hooks: ReadonlyArray<{ node: string; hook: HeatHook; at: number }>;
  /** The stack's update ended (Heat's log). */
  ended: StackStateLine | undefined;
  /** os-collect-config's polling interval the comparison is computed for, seconds. */
  pollIntervalS: number;
}

/** The controller's `heat.metadata` events (pino JSON lines) at or after `afterMs` that changed something. */
export function heatMetadataPuts(log: string, afterMs: number): Array<{ node: string; at: number }> {
  const out: Array<{ node: string; at: number }> = [];
  for (const line of log.split('\n')) {
    if (!line.includes('"heat.metadata"')) continue;
    try {
      const o = JSON.parse(line) as { event?: unknown; node?: unknown; time?: unknown; changed?: unknown };
      if (o.event !== 'heat.metadata' || typeof o.node !== 'string' || typeof o.time !== 'number') continue;
      if (o.time >= afterMs && (typeof o.changed !== 'number' || o.changed > 0)) out.push({ node: o.node, at: o.time });
    } catch {
      // a line cut off mid-write
    }
  }
  return out;
}

/** The first `hook` start on `node`, undefined when there is none. */
function hookAt(f: HeatRestartFacts, node: string, hook: HeatHook): number | undefined {
  return f.hooks.filter((h) => h.node === node && h.hook === hook).sort((a, b) => a.at - b.at)[0]?.at;
}

/** The last metadata write to `node` at or before `at`: the one its hook ran for. */
function putBefore(f: HeatRestartFacts, node: string, at: number | undefined): number | undefined {
  if (at === undefined) return undefined;
  const before = f.puts.filter((p) => p.node === node && p.at <= at).map((p) => p.at);
  return before.length > 0 ? Math.max(...before) : undefined;
}

/**
 * The restart in time order from the command's start, one line per step, nodes that did the same
 * within `mergeWithinMs` of the first on one line: `+2.31 s  n1, n2, n3  uninstall hook started`.
 */
export function heatTimelineLines(f: HeatRestartFacts, mergeWithinMs = 25): string[] {
  const events: Array<{ at: number; node?: string; what: string }> = [
    { at: f.cmdAt, what: 'openstack stack update --existing --parameter restart_trigger=… started' },
    ...(f.patchAt !== undefined ? [{ at: f.patchAt, what: "Heat's API received the PATCH" }] : []),
    ...f.puts.map((p) => ({ at: p.at, node: p.node, what: "Heat's metadata PUT reached Herald" })),
    ...f.hooks.map((h) => ({ at: h.at, node: h.node, what: `${h.hook} hook started` })),
    ...(f.ended ? [{ at: f.ended.at, what: `Heat: stack ${f.ended.action}_${f.ended.status}` }] : []),
  ].sort((a, b) => a.at - b.at);
  const lines: string[] = [];
  for (let i = 0; i < events.length; ) {
    const first = events[i]!;
    const nodes: string[] = [];
    let j = i;
    while (j < events.length && events[j]!.what === first.what && events[j]!.at - first.at <= mergeWithinMs) {
      if (events[j]!.node !== undefined) nodes.push(events[j]!.node!);
      j++;
    }
    const t = `+${formatMs(first.at - f.cmdAt)}`;
    lines.push(`${t.padStart(10)}  ${nodes.length > 0 ? `${nodes.join(', ').padEnd(10)}  ` : ''}${first.what}`);
    i = j;
  }
  return lines;
}

/** Per node: Heat's metadata write → the uninstall hook started, and → the install hook started. */
export function pushGapTable(f: HeatRestartFacts): string {
  const gap = (node: string, hook: HeatHook): string => {
    const at = hookAt(f, node, hook);
    const put = putBefore(f, node, at);
    return at === undefined || put === undefined ? '-' : formatMs(at - put);
  };
  return table(
    ['NODE', 'METADATA PUT → UNINSTALL STARTED', 'METADATA PUT → INSTALL STARTED'],
    f.nodes.map((n) => [n, gap(n, 'uninstall'), gap(n, 'install')]),
  ).trimEnd();
}

/** Every check that did not hold, one line each; empty when the restart went as the blueprint says. */
export function heatChecks(f: HeatRestartFacts): string[] {
  const failures: string[] = [];
  for (const n of f.nodes) {
    const u = hookAt(f, n, 'uninstall');
    const i = hookAt(f, n, 'install');
    if (u === undefined) failures.push(`${n}: the uninstall hook did not start`);
    if (i === undefined) failures.push(`${n}: the install hook did not start`);
    if (u !== undefined && i !== undefined && i < u) failures.push(`${n}: the install started before the uninstall`);
  }
  if (!f.ended) failures.push('Heat did not end the stack update');
  else if (f.ended.status !== 'COMPLETE')
    failures.push(`Heat ended the stack update ${f.ended.action}_${f.ended.status}: ${f.ended.reason}`);
  return failures;
}

/** `9-13 ms`, or `0.90-1.20 s` when the larger is a second or more. */
function span(min: number, max: number): string {
  if (Math.round(max) < 1000) return `${Math.round(min)}-${formatMs(max)}`;
  return `${(min / 1000).toFixed(2)}-${formatMs(max)}`;
}

/** Whole seconds, or with one decimal under ten. */
const secs = (ms: number): string => `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;

/**
 * What polling at os-collect-config's interval would have added, computed: a write waits for the
 * next poll (half an interval on average, a whole one at most); the install's write comes right
 * after the uninstall's result, while the node sleeps a whole interval after the pass that ran it
 * (os-collect-config sleeps the interval after every pass), so it waits that interval less Heat's
 * reaction, measured here.
 */
export function pollingLines(f: HeatRestartFacts): string[] {
  const intervalMs = f.pollIntervalS * 1000;
  const herald: number[] = [];
  const reaction: number[] = [];
  for (const n of f.nodes) {
    for (const h of ['uninstall', 'install'] as const) {
      const at = hookAt(f, n, h);
      const put = putBefore(f, n, at);
      if (at !== undefined && put !== undefined) herald.push(at - put);
    }
    const u = hookAt(f, n, 'uninstall');
    const put = putBefore(f, n, hookAt(f, n, 'install'));
    if (u !== undefined && put !== undefined && put > u) reaction.push(put - u);
  }
  if (herald.length === 0) return [];
  const react = reaction.length > 0 ? reaction.reduce((a, b) => a + b, 0) / reaction.length : 0;
  const average = intervalMs / 2 + Math.max(0, intervalMs - react);
  return [
    `Herald (measured): each hook started ${span(Math.min(...herald), Math.max(...herald))} after Heat's metadata PUT reached the controller: pushed, not polled.`,
    `os-collect-config at its default ${f.pollIntervalS} s interval (computed, not measured): a write waits for the next poll, ${secs(intervalMs / 2)} on average, up to ${secs(intervalMs)}.`,
    `  This restart writes each node's metadata twice in a row; the install's write came ${secs(react)} after the uninstall started (Heat's reaction),`,
    `  while a polling node sleeps a whole interval after the pass that ran the uninstall: about ${secs(average)} more than Herald on average, up to ${secs(2 * intervalMs)}.`,
  ];
}
