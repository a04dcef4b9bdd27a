/**
 * Node groups and rollout options of `herald cluster create|restart` (docs/api.md): the
 * `--nodegroup name:role:n1,n2` spelling, a groups file for groups with configs or input values
 * of their own, the restart body from the command's options, and a dry run's plan as text.
 * Pure but for reading the groups file; the controller checks everything again.
 */
import fs from 'node:fs/promises';
import { HeraldError } from '../../protocol/errors.js';
import { MAX_REQUEST_BODY_BYTES } from '../../protocol/limits.js';
import type { RestartPlanView } from '../../protocol/rest.js';
import { parseDuration, splitList, table } from './format.js';

/** A group as `POST /v1/clusters` takes it. */
export interface NodegroupRequest {
  name: string;
  role?: 'master' | 'worker';
  nodes: string[];
  install_config_id?: string;
  uninstall_config_id?: string;
  input_values?: Record<string, unknown>;
}

/**
 * `name:role:n1,n2` or `name:n1,n2` (role worker) into a group.
 * @throws HeraldError `bad_option` naming `--nodegroup`
 */
export function parseNodegroupSpec(spec: string): NodegroupRequest {
  const parts = spec.split(':');
  const bad = (why: string) =>
    new HeraldError('bad_option', `--nodegroup ${JSON.stringify(spec)}: ${why} (want name:role:n1,n2 or name:n1,n2)`);
  if (parts.length < 2 || parts.length > 3) throw bad('wrong number of fields');
  const [name, roleOrNodes, maybeNodes] = parts as [string, string, string | undefined];
  const role = maybeNodes === undefined ? 'worker' : roleOrNodes;
  if (role !== 'master' && role !== 'worker') throw bad(`role must be master or worker, not ${JSON.stringify(role)}`);
  const nodes = splitList(maybeNodes ?? roleOrNodes);
  if (name.length === 0) throw bad('no group name');
  if (nodes.length === 0) throw bad('no nodes');
  return { name, role, nodes };
}

/**
 * A groups file: a JSON array of groups as the API takes them (`name`, `role`, `nodes`, and
 * optionally `install_config_id`, `uninstall_config_id`, `input_values`); "-" reads stdin.
 * @throws HeraldError `bad_option` naming `--nodegroups-file`
 */
export async function readNodegroupsFile(file: string): Promise<NodegroupRequest[]> {
  const bad = (why: string, cause?: unknown) =>
    new HeraldError('bad_option', `--nodegroups-file ${JSON.stringify(file)} ${why}`, cause ? { cause } : {});
  let text: string;
  try {
    text = file === '-' ? await readStdin() : await fs.readFile(file, 'utf8');
  } catch (err) {
    throw bad('cannot be read', err);
  }
  if (Buffer.byteLength(text) > MAX_REQUEST_BODY_BYTES) throw bad('is over the 1 MiB request limit');
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw bad('is not JSON', err);
  }
  if (!Array.isArray(v) || v.some((g) => g === null || typeof g !== 'object' || Array.isArray(g)))
    throw bad('must hold a JSON array of groups, e.g. [{"name":"masters","role":"master","nodes":["n1"]}]');
  return v as NodegroupRequest[];
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

/**
 * The members of a new cluster from `--nodes`, `--nodegroup` or `--nodegroups-file` (one of them).
 * @throws HeraldError `bad_option`
 */
export async function clusterMembers(o: {
  nodes?: string;
  nodegroup?: string[];
  nodegroupsFile?: string;
}): Promise<{ nodes: string[] } | { nodegroups: NodegroupRequest[] }> {
  const forms = [o.nodes, o.nodegroup, o.nodegroupsFile].filter((x) => x !== undefined).length;
  if (forms !== 1)
    throw new HeraldError('bad_option', 'give one of --nodes, --nodegroup (repeatable) or --nodegroups-file');
  if (o.nodes !== undefined) return { nodes: splitList(o.nodes) };
  if (o.nodegroup) return { nodegroups: o.nodegroup.map(parseNodegroupSpec) };
  return { nodegroups: await readNodegroupsFile(o.nodegroupsFile!) };
}

/** The options of `herald cluster restart|upgrade` and `rollout undo` that shape the rollout, as commander gives them. */
export interface RolloutFlags {
  maxUnavailable?: string;
  pause?: string;
  maxFailures?: string;
  healthConfig?: string;
  canary?: string;
  autoPromote?: string;
  onFailure?: string;
  nodeDeadline?: string;
  progressDeadline?: string;
  gateUrl?: string;
  gatePrometheus?: string;
  gateQuery?: string;
  gateFailOpen?: boolean;
  force?: boolean;
  dryRun?: boolean;
}

/** The options of `herald cluster restart`. */
export interface RestartFlags extends RolloutFlags {
  nodegroup?: string[];
}

/** Seconds from a duration option (`0` is 0). @throws HeraldError `bad_option` */
function seconds(v: string, option: string): number {
  return v.trim() === '0' ? 0 : Math.max(1, Math.round(parseDuration(v, option) / 1000));
}

/**
 * The restart body from the flags; undefined when none was given (the controller's defaults).
 * @throws HeraldError `bad_option` naming the option
 */
export function restartBody(f: RestartFlags): Record<string, unknown> | undefined {
  const body: Record<string, unknown> = rolloutBody(f);
  if (f.nodegroup?.length) body.nodegroups = f.nodegroup.flatMap((g) => splitList(g));
  return Object.keys(body).length === 0 ? undefined : body;
}

/**
 * A rollout's options from the flags (docs/api.md "Rollouts"), only those given.
 * @throws HeraldError `bad_option` naming the option
 */
export function rolloutBody(f: RolloutFlags): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (f.maxUnavailable !== undefined) {
    const m = /^(\d+)(%?)$/.exec(f.maxUnavailable.trim());
    const n = m ? Number(m[1]) : Number.NaN;
    if (!m || n < 1 || (m[2] === '%' && n > 100))
      throw new HeraldError(
        'bad_option',
        `--max-unavailable must be a count of at least 1 or a percentage from 1% to 100%, not ${JSON.stringify(f.maxUnavailable)}`,
      );
    body.max_unavailable = m[2] === '%' ? `${n}%` : n;
  }
  if (f.pause !== undefined) body.pause_s = f.pause.trim() === '0' ? 0 : parseDuration(f.pause, '--pause') / 1000;
  if (f.maxFailures !== undefined) {
    if (!/^\d+$/.test(f.maxFailures))
      throw new HeraldError(
        'bad_option',
        `--max-failures must be a whole number, not ${JSON.stringify(f.maxFailures)}`,
      );
    body.max_failures = Number(f.maxFailures);
  }
  if (f.healthConfig !== undefined) body.health_config_id = f.healthConfig;
  if (f.canary !== undefined) {
    const m = /^(\d+)(%?)$/.exec(f.canary.trim());
    const n = m ? Number(m[1]) : Number.NaN;
    if (!m || (m[2] === '%' && (n < 1 || n > 100)))
      throw new HeraldError(
        'bad_option',
        `--canary must be a count of nodes per group or a percentage from 1% to 100%, not ${JSON.stringify(f.canary)}`,
      );
    body.canary = m[2] === '%' ? `${n}%` : n;
  }
  if (f.autoPromote !== undefined) body.auto_promote_s = seconds(f.autoPromote, '--auto-promote');
  if (f.onFailure !== undefined) {
    if (!['pause', 'abort', 'revert'].includes(f.onFailure))
      throw new HeraldError(
        'bad_option',
        `--on-failure must be pause, abort or revert, not ${JSON.stringify(f.onFailure)}`,
      );
    body.on_failure = f.onFailure;
  }
  if (f.nodeDeadline !== undefined) body.node_deadline_s = seconds(f.nodeDeadline, '--node-deadline');
  if (f.progressDeadline !== undefined) body.progress_deadline_s = seconds(f.progressDeadline, '--progress-deadline');
  if (f.gateUrl !== undefined && f.gatePrometheus !== undefined)
    throw new HeraldError('bad_option', 'give one of --gate-url and --gate-prometheus');
  if ((f.gatePrometheus !== undefined) !== (f.gateQuery !== undefined))
    throw new HeraldError('bad_option', '--gate-prometheus and --gate-query go together');
  if (f.gateFailOpen && f.gateUrl === undefined && f.gatePrometheus === undefined)
    throw new HeraldError('bad_option', '--gate-fail-open needs --gate-url or --gate-prometheus');
  const failOpen = f.gateFailOpen ? { fail_open: true } : {};
  if (f.gateUrl !== undefined) body.gate = { url: f.gateUrl, ...failOpen };
  if (f.gatePrometheus !== undefined) body.gate = { prometheus: f.gatePrometheus, query: f.gateQuery, ...failOpen };
  if (f.force) body.force = true;
  if (f.dryRun) body.dry_run = true;
  return body;
}

/** A dry run's plan as text: the groups in the order they go, each with its window and nodes. */
export function formatPlan(p: RestartPlanView & { new_revision?: boolean }): string {
  const limits = [
    `pause ${p.pause_s} s after each node`,
    `stop after ${p.max_failures + 1} failed node(s)`,
    p.health_config_id ? `health check ${p.health_config_id} (deploy_action CHECK)` : 'no health check',
  ];
  if (p.canaries?.length)
    limits.push(
      `canaries ${p.canaries.join(',')} first, then ${p.auto_promote_s === null ? 'wait for a promote' : `promoted ${p.auto_promote_s} s after they completed`}`,
    );
  if (p.on_failure && p.on_failure !== 'abort')
    limits.push(
      `on failure ${p.on_failure}${p.on_failure === 'revert' ? ` to revision ${p.stable_revision ?? '?'}` : ''}`,
    );
  if (p.node_deadline_s) limits.push(`node deadline ${p.node_deadline_s} s`);
  if (p.progress_deadline_s) limits.push(`progress deadline ${p.progress_deadline_s} s`);
  if (p.gate)
    limits.push(
      `gate ${p.gate.url ?? `${p.gate.prometheus} ${JSON.stringify(p.gate.query)}`}${p.gate.fail_open ? ' (fail open)' : ''}`,
    );
  const quorum = p.nodegroups.some((g) => g.quorum_max_unavailable !== undefined);
  const head = ['ORDER', 'NODEGROUP', 'ROLE', 'MAX_UNAVAILABLE', ...(quorum ? ['QUORUM'] : []), 'NODES'];
  const revision =
    p.revision === undefined
      ? ''
      : `revision ${p.from_revision} -> ${p.revision}${p.new_revision === false ? ' (the same configs, rolled again)' : ''}\n`;
  return `${revision}${table(
    head,
    p.nodegroups.map((g, i) => [
      i + 1,
      g.name,
      g.role,
      g.max_unavailable,
      ...(quorum ? [g.quorum_max_unavailable ?? '-'] : []),
      g.nodes.join(','),
    ]),
  )}\n${limits.join('; ')}\ndry run: ${p.revision === undefined ? 'nothing was restarted' : 'nothing ran'}\n`;
}

/** The text of `herald cluster restart --help` that explains the rollout. */
export const RESTART_HELP = `
Rollout (docs/api.md): the node groups restart one after another, the master groups first, then the
others in the order they were created; a group starts when the one before it completed. Within a
group at most --max-unavailable nodes are between the start of their uninstall and their end
(default: 1 in a master group, every node in the others; a percentage counts the group's nodes,
rounded down, at least 1). A node ends when its install succeeded and, with --health-config,
that config succeeded on it (deploy_action CHECK); its slot stays taken --pause longer. Once more
than --max-failures nodes failed (default 0), no other node starts and the restart ends
RESTART_FAILED when the nodes in flight finish. --dry-run prints the plan and runs nothing.

  herald cluster restart 7c0d... --dry-run
  herald cluster restart 7c0d... --nodegroup workers --max-unavailable 25% --pause 10s
  herald cluster restart 7c0d... --health-config 3f1e... --max-failures 1 --wait
`;

/** The text of `herald cluster upgrade --help` that explains the rollout of new configs. */
export const UPGRADE_HELP = `
Upgrade (docs/api.md "Upgrades"): the new configs and input values are a new cluster revision,
rolled over the nodes they change as a restart rolls (groups in order, masters first, windows,
pauses, health check, failure budget); on each node the uninstall of its old configs, then the
install of the new ones (deploy_action UPDATE). A master group never has more than
max(1, (n-1)/2) nodes down at once unless --force. With --canary the canaries of each group go
first, then the rollout waits for a promotion (--auto-promote, or herald cluster rollout promote).
--on-failure revert brings every node it changed back to the last stable revision at once.
--wait shows the canary phase, the promotion and a revert as they happen.

  herald cluster upgrade 7c0d... --install-config 9a1b... --input version=1.30 --dry-run
  herald cluster upgrade 7c0d... --install-config 9a1b... --canary 1 --on-failure revert --wait
  herald cluster upgrade 7c0d... --nodegroup workers --input version=1.30 --max-unavailable 25% --wait
  herald cluster rollout promote 7c0d...
`;
