/**
 * What the demo prints about its restart: the timeline of events, the per-node wake-up table,
 * and, with `--keep`, how to go on with the CLI and curl (and a script that stops it all).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { DemoNode } from './fixtures.js';
import { heraldBin, type Child } from './supervisor.js';
import { formatMs, table } from '../operator/format.js';
import type { WatchEvent } from '../operator/watch.js';

/** What a timeline line says of an event. */
function labelOf(e: WatchEvent): string {
  if (e.kind === 'woken') return 'woken';
  if (e.kind === 'output') return `| ${e.line}`;
  if (e.kind === 'status') return `cluster ${e.status}`;
  if (e.kind === 'rollout') return `rollout: ${e.detail}`;
  if (e.phase === 'installing') return 'uninstall done, installing';
  if (e.phase === 'complete') return 'install done';
  if (e.phase === 'failed') return `FAILED: ${e.reason ?? '?'}`;
  return e.phase;
}

/**
 * The restart's events in time order, one line per step, nodes that did the same thing within
 * a few milliseconds on one line: `+2 ms  n1, n2, n3 uninstalling`.
 */
export function timelineLines(events: WatchEvent[], startedAt: Date, mergeWithinMs = 5, what = 'restart'): string[] {
  // the timeline shows steps; live output lines are the progress view's
  const sorted = events
    .filter((e) => e.kind !== 'output' && (e.kind !== 'status' || !e.status.endsWith('_IN_PROGRESS')))
    .sort((a, b) => a.at.getTime() - b.at.getTime());
  const lines: string[] = [`${'+0 ms'.padStart(19)}  ${what} accepted`];
  for (let i = 0; i < sorted.length; ) {
    const first = sorted[i]!;
    const label = labelOf(first);
    const nodes: string[] = [];
    let j = i;
    while (
      j < sorted.length &&
      labelOf(sorted[j]!) === label &&
      sorted[j]!.at.getTime() - first.at.getTime() <= mergeWithinMs
    ) {
      const e = sorted[j]!;
      if (e.kind !== 'status' && e.kind !== 'rollout') nodes.push(e.node);
      j++;
    }
    const t = `+${formatMs(first.at.getTime() - startedAt.getTime())}`;
    lines.push(`${t.padStart(19)}  ${nodes.length ? `${nodes.join(', ')} ` : ''}${label}`);
    i = j;
  }
  return lines;
}

/** One row per node: when it was woken, finished its uninstall, was woken again, finished its install. */
export function wakeTable(events: WatchEvent[], ids: string[], startedAt: Date): string {
  const nth = (node: string, pred: (e: WatchEvent) => boolean, n = 0): string => {
    const e = events
      .filter((x) => x.kind !== 'status' && x.kind !== 'rollout' && x.node === node && pred(x))
      .sort((a, b) => a.at.getTime() - b.at.getTime())[n];
    return e ? `+${formatMs(e.at.getTime() - startedAt.getTime())}` : '-';
  };
  return table(
    ['NODE', 'WOKEN', 'UNINSTALL DONE', 'WOKEN AGAIN', 'INSTALL DONE'],
    ids.map((id) => [
      id,
      nth(id, (e) => e.kind === 'woken'),
      nth(id, (e) => e.kind === 'phase' && e.phase === 'installing'),
      nth(id, (e) => e.kind === 'woken', 1),
      nth(id, (e) => e.kind === 'phase' && e.phase === 'complete'),
    ]),
  ).trimEnd();
}

/**
 * Writes `<root>/stop.sh`, which stops what `--keep` left running; returns its path. `extra`:
 * more process groups to stop (after the children: a database server) and directories to remove.
 */
export function writeStopScript(
  root: string,
  children: Child[],
  nodes: DemoNode[],
  removeDir: boolean,
  extra: { groups?: number[]; dirs?: string[] } = {},
): string {
  const file = path.join(root, 'stop.sh');
  const groups = [...children.map((c) => c.child.pid).filter((p): p is number => !!p), ...(extra.groups ?? [])];
  const lines = [
    '#!/bin/sh',
    '# stops what `herald demo --keep` left running',
    ...groups.map((pid) => `kill -TERM -${pid} 2>/dev/null`),
    'sleep 1',
    ...groups.map((pid) => `kill -KILL -${pid} 2>/dev/null`),
    ...nodes.map((n) => `[ -s '${n.dir}/service.pid' ] && kill "$(cat '${n.dir}/service.pid')" 2>/dev/null`),
    ...nodes.map((n) => `kill ${n.containerPid} 2>/dev/null`),
    ...(extra.dirs ?? []).map((d) => `rm -rf '${d}'`),
    removeDir ? `rm -rf '${root}'` : `echo 'kept ${root}'`,
    'true',
  ];
  fs.writeFileSync(file, `${lines.join('\n')}\n`, { mode: 0o700 });
  return file;
}

/** How to run this `bin/herald` from here: relative when below the working directory. */
export function heraldCommand(): string {
  const bin = path.relative(process.cwd(), heraldBin());
  return bin.startsWith('..') ? heraldBin() : bin;
}

/** Tells how to use what `--keep` left running, and how to stop it. */
export function keepRunning(
  say: (s: string) => void,
  k: {
    root: string;
    pkiDir: string;
    controllerUrl: string;
    clusterId: string;
    children: Child[];
    nodes: DemoNode[];
    ownDir: boolean;
  },
): void {
  const stop = writeStopScript(k.root, k.children, k.nodes, k.ownDir);
  const herald = heraldCommand();
  const conn = `--controller ${k.controllerUrl} --pki ${k.pkiDir}`;
  const p = (f: string): string => path.join(k.pkiDir, f);
  say('');
  say(
    `Left running (--keep): the controller, ${k.nodes.length} agents, their containers and services. Logs: ${path.join(k.root, 'logs')}`,
  );
  say('');
  say('With the CLI:');
  say(`  ${herald} cluster show ${k.clusterId} ${conn}`);
  say(`  ${herald} cluster restart ${k.clusterId} --wait ${conn}`);
  say(`  ${herald} node ls ${conn}`);
  say(`  or: export HERALD_CONTROLLER=${k.controllerUrl} HERALD_PKI=${k.pkiDir}; ${herald} cluster ls`);
  say('  (this PKI directory also holds the CA key, so the CLI warns about it; HERALD_NO_CA_WARNING=1 silences that)');
  say('');
  say('With curl:');
  say(
    `  curl --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/clusters`,
  );
  say(
    `  curl -X PATCH --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/clusters/${k.clusterId}/actions/restart`,
  );
  say(
    `  curl -N --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/events`,
  );
  say('');
  say(`Stop everything${k.ownDir ? ' and remove the directory' : ''}: sh ${stop}`);
}
