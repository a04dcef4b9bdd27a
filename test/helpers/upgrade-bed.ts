/**
 * A cluster of real agents for the upgrade suites (docs/api.md "Upgrades", "Rollouts"): a
 * controller and agents started through `bin/herald` (agent-cluster.ts), a master and a worker
 * group, and configs in versions: `install-v<N>` and `uninstall-v<N>` for N in 1.., and a health
 * check `check`. Every script appends its start and end (epoch ms) to one log, so each rule is
 * checked from what the nodes did; a flag file makes a script wait (`<name>-gate-<node>`) or fail
 * (`<name>-fail-<node>`). An install writes the version it installed (`installed-<node>`), and
 * the health check fails on a node whose installed version is flagged (`check-fail-<node>-v<N>`).
 */
import fs from 'node:fs';
import path from 'node:path';
import { api, waitFor } from './procs.js';
import { makeCluster, mkConfig, type Cluster } from './agent-cluster.js';

/** One script's run: `[start, end]` in epoch ms (end undefined while it runs). */
export interface Run {
  node: string;
  /** The script: `install-v2`, `uninstall-v1`, `check`. */
  name: string;
  action: string;
  start: number;
  end: number | undefined;
}

export interface UpgradeBed {
  c: Cluster;
  id: string;
  work: string;
  masters: string[];
  workers: string[];
  nodes: string[];
  /** Config ids by script name. */
  configs: Record<string, string>;
  flag(name: string): void;
  unflag(name: string): void;
  lineCount(): number;
  /** The runs in the log from its line `from` on, in the order they started. */
  runs(from?: number): Run[];
  cluster(): Promise<any>;
  send(method: string, route: string, body?: unknown): Promise<{ status: number; json: any; raw: string }>;
  /** Waits until the cluster's status is one of `statuses`; resolves with it. */
  ended(statuses?: string[], ms?: number): Promise<string>;
}

/** A script that logs its start and end; flags make it wait, fail, or (an install) write its version. */
function script(name: string, log: string, flags: string): string {
  const version = /^install-(v[0-9]+)$/.exec(name)?.[1];
  const isCheck = name === 'check';
  return [
    '#!/bin/sh',
    `L=${log}; F=${flags}; N=$deploy_server_id`,
    `echo "$(date +%s%3N) ${name} start $N $deploy_action" >> $L`,
    `while [ -f $F/${name}-gate-$N ]; do sleep 0.02; done`,
    'sleep 0.05',
    ...(version ? [`echo ${version} > $F/installed-$N`] : []),
    `echo "$(date +%s%3N) ${name} end $N $deploy_action" >> $L`,
    `if [ -f $F/${name}-fail-$N ]; then echo "${name} exploded on $N" >&2; exit 3; fi`,
    ...(isCheck
      ? [`if [ -f "$F/check-fail-$N-$(cat $F/installed-$N 2>/dev/null)" ]; then echo "unhealthy on $N" >&2; exit 4; fi`]
      : []),
    '',
  ].join('\n');
}

/**
 * Starts the controller and `masters` + `workers` agents, makes the configs of `versions`
 * versions and a cluster of a master group `masters` and a worker group `workers` at version 1,
 * and waits for CREATE_COMPLETE.
 */
export async function makeUpgradeBed(o: {
  masters: string[];
  workers: string[];
  versions: number;
  db?: string;
  controllerEnv?: NodeJS.ProcessEnv | ((pki: string) => NodeJS.ProcessEnv);
  /** `options.timeout` of the install and uninstall configs (seconds). */
  timeoutS?: number;
}): Promise<UpgradeBed> {
  const nodes = [...o.masters, ...o.workers];
  const c = await makeCluster(nodes, {
    ...(o.db ? { db: o.db } : {}),
    ...(o.controllerEnv ? { controllerEnv: o.controllerEnv } : {}),
  });
  const log = path.join(c.work, 'steps.log');
  const flags = path.join(c.work, 'flags');
  fs.mkdirSync(flags);
  fs.writeFileSync(log, '');
  for (const n of nodes) await c.startAgent(n);
  const configs: Record<string, string> = {};
  const names = ['check'];
  for (let v = 1; v <= o.versions; v++) names.push(`install-v${v}`, `uninstall-v${v}`);
  for (const name of names)
    configs[name] = await mkConfig(c, {
      name,
      group: 'script',
      config: script(name, log, flags),
      inputs: [{ name: 'version', type: 'String' }],
      ...(o.timeoutS && name !== 'check' ? { options: { timeout: o.timeoutS } } : {}),
    });
  const send = (method: string, route: string, body?: unknown) => api(c.ctl.port, c.op, method, route, body);
  const r = await send('POST', '/v1/clusters', {
    name: 'k8s',
    install_config_id: configs['install-v1'],
    uninstall_config_id: configs['uninstall-v1'],
    input_values: { version: '1' },
    nodegroups: [
      { name: 'masters', role: 'master', nodes: o.masters },
      { name: 'workers', nodes: o.workers },
    ],
  });
  if (r.status !== 201) throw new Error(`POST /v1/clusters → ${r.status} ${r.raw.slice(0, 300)}`);
  const id = r.json.id as string;
  const cluster = async () => (await send('GET', `/v1/clusters/${id}`)).json;
  const bed: UpgradeBed = {
    c,
    id,
    work: c.work,
    masters: o.masters,
    workers: o.workers,
    nodes,
    configs,
    flag: (name) => fs.writeFileSync(path.join(flags, name), ''),
    unflag: (name) => fs.rmSync(path.join(flags, name), { force: true }),
    lineCount: () => fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).length,
    runs(from = 0) {
      const lines = fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).slice(from);
      const open = new Map<string, Run>();
      const out: Run[] = [];
      for (const l of lines) {
        const [at, name, what, node, action] = l.split(' ') as [string, string, string, string, string];
        const key = `${name}/${node}`;
        if (what === 'start') {
          const run: Run = { node, name, action, start: Number(at), end: undefined };
          open.set(key, run);
          out.push(run);
        } else {
          const run = open.get(key);
          if (run) run.end = Number(at);
          open.delete(key);
        }
      }
      return out;
    },
    cluster,
    send,
    ended: (statuses = ['UPDATE_COMPLETE', 'UPDATE_FAILED', 'RESTART_COMPLETE', 'RESTART_FAILED'], ms = 60_000) =>
      waitFor(
        `the cluster to reach ${statuses.join('|')}`,
        async () => {
          const s = (await cluster())?.status as string;
          return statuses.includes(s) ? s : null;
        },
        ms,
        50,
      ),
  };
  await bed.ended(['CREATE_COMPLETE'], 30_000);
  return bed;
}

/** Each node's span: from the start of its first run to the end of its last, among `rs`. */
export function spans(rs: Run[]): Map<string, { start: number; end: number }> {
  const m = new Map<string, { start: number; end: number }>();
  for (const r of rs) {
    const s = m.get(r.node) ?? { start: Number.POSITIVE_INFINITY, end: 0 };
    m.set(r.node, { start: Math.min(s.start, r.start), end: Math.max(s.end, r.end ?? r.start) });
  }
  return m;
}

/** The most of `nodes` whose spans overlap at one instant. */
export function mostAtOnce(sp: Map<string, { start: number; end: number }>, nodes: string[]): number {
  const ev = nodes
    .filter((n) => sp.has(n))
    .flatMap((n) => [
      [sp.get(n)!.start, 1],
      [sp.get(n)!.end, -1],
    ])
    .sort((a, b) => a[0]! - b[0]! || a[1]! - b[1]!);
  let cur = 0;
  let most = 0;
  for (const [, d] of ev) {
    cur += d!;
    most = Math.max(most, cur);
  }
  return most;
}
