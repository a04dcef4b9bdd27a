/**
 * What the API (and the event stream) shows of stored records. Hidden inputs (`hidden: true`)
 * are replaced by "***" here, the only way out of the controller for them besides the agent's
 * own metadata; so are hidden outputs, for every reader but an operator who may deploy to the
 * node (docs/access.md).
 */
import type {
  ClusterNodeView,
  ClusterRevisionView,
  ClusterSummaryView,
  ClusterView,
  ConfigView,
  CountersView,
  DeploymentView,
  GateView,
  NodegroupView,
  NodeView,
  RestartPlanView,
  RevisionView,
  RolloutPhase,
  RolloutStateView,
  RolloutView,
  UpgradePlanView,
} from '../../protocol/rest.js';
import type { PushState } from '../push/types.js';
import { rolloutCounters } from '../clusters/engine.js';
import type { ClusterNodeRecord, ClusterRevisionRecord, Rollout, RolloutGate } from '../model/records.js';
import type { ClusterRecord, ConfigRecord, DeploymentRecord, NodeRecord, RevisionRecord } from '../store/store.js';

export const HIDDEN_VALUE = '***';

export interface FetchState {
  generation_fetched: number | null;
  last_fetch_at: string | null;
}

/** `labels`: for operators and events (docs/access.md); left out of the answer to an agent's announcement. */
export function nodeView(
  n: NodeRecord,
  push: PushState,
  fetch: FetchState,
  labels?: Readonly<Record<string, string>>,
): NodeView {
  return {
    id: n.id,
    endpoint: n.endpoint,
    generation: n.generation,
    created_at: n.createdAt,
    updated_at: n.updatedAt,
    ...(labels !== undefined ? { labels: { ...labels } } : {}),
    push: {
      ...push,
      generation_acked: maxOf(push.generation_acked, n.ackedGeneration),
      generation_fetched: fetch.generation_fetched,
      last_fetch_at: fetch.last_fetch_at,
    },
  };
}

function maxOf(a: number | null, b: number | null): number | null {
  if (a === null) return b;
  if (b === null) return a;
  return Math.max(a, b);
}

export function hiddenNames(...configs: Array<ConfigRecord | undefined>): Set<string> {
  const s = new Set<string>();
  for (const c of configs) for (const i of c?.inputs ?? []) if (i.hidden) s.add(i.name);
  return s;
}

/** The names of the outputs `config` declares hidden (docs/access.md). */
export function hiddenOutputNames(config: ConfigRecord | undefined): Set<string> {
  const s = new Set<string>();
  for (const o of config?.outputs ?? []) if (o.hidden) s.add(o.name);
  return s;
}

/** Output values with the hidden ones masked; `hidden` null: shown as they are. */
function outputValues(
  values: Record<string, unknown> | null,
  hidden: ReadonlySet<string> | null,
): Record<string, unknown> | null {
  return values === null || hidden === null || hidden.size === 0 ? values : maskValues(values, hidden);
}

export function maskValues(values: Record<string, unknown>, hidden: ReadonlySet<string>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(values)) out[k] = hidden.has(k) ? HIDDEN_VALUE : v;
  return out;
}

export function configView(c: ConfigRecord): ConfigView {
  return {
    id: c.id,
    name: c.name,
    group: c.group,
    config: c.config,
    inputs: c.inputs.map((i) => (i.hidden && i.default !== undefined ? { ...i, default: HIDDEN_VALUE } : i)),
    outputs: c.outputs,
    options: c.options,
    creation_time: c.createdAt,
  };
}

/**
 * @param hidden names hidden by any config that feeds the deployment (Service.hiddenInputsOf):
 *   for a cluster's deployment that is every config of the cluster, not only its own
 * @param hiddenOutputs output names to mask (hiddenOutputNames); null: the reader may see them
 */
export function deploymentView(
  d: DeploymentRecord,
  config: ConfigRecord | undefined,
  hidden: ReadonlySet<string>,
  hiddenOutputs: ReadonlySet<string> | null = hiddenOutputNames(config),
): DeploymentView {
  const r = d.current;
  return {
    id: d.id,
    deployment_id: d.id,
    node: d.node,
    server_id: d.node,
    config_id: d.configId,
    name: d.name ?? config?.name ?? null,
    actions: d.actions,
    action: r.action,
    revision: r.revision,
    item_id: r.itemId,
    status: r.status,
    status_reason: r.statusReason,
    signalled: r.signalled,
    input_values: maskValues(r.inputValues, hidden),
    output_values: outputValues(r.outputValues, hiddenOutputs),
    cluster_id: d.clusterId,
    creation_time: d.createdAt,
    updated_time: r.updatedAt,
    signalled_time: r.signalledAt,
  };
}

export function revisionView(
  r: RevisionRecord,
  hidden: ReadonlySet<string>,
  hiddenOutputs: ReadonlySet<string> | null,
): RevisionView {
  return {
    revision: r.revision,
    item_id: r.itemId,
    action: r.action,
    status: r.status,
    status_reason: r.statusReason,
    signalled: r.signalled,
    input_values: maskValues(r.inputValues, hidden),
    output_values: outputValues(r.outputValues, hiddenOutputs),
    creation_time: r.createdAt,
    updated_time: r.updatedAt,
    signalled_time: r.signalledAt,
  };
}

function clusterNodeView(n: ClusterNodeRecord): ClusterNodeView {
  return {
    node: n.node,
    phase: n.phase,
    reason: n.reason,
    install_deployment_id: n.installDeploymentId,
    uninstall_deployment_id: n.uninstallDeploymentId,
    uninstall_started_at: n.uninstallStartedAt,
    uninstall_finished_at: n.uninstallFinishedAt,
    install_started_at: n.installStartedAt,
    install_finished_at: n.installFinishedAt,
    step_deadline_at: n.stepDeadlineMs === null ? null : new Date(n.stepDeadlineMs).toISOString(),
    nodegroup: n.nodegroup,
    health_deployment_id: n.healthDeploymentId,
    check_started_at: n.checkStartedAt,
    ended_at: n.endedAtMs === null ? null : new Date(n.endedAtMs).toISOString(),
    revision: n.revision,
  };
}

const isoOf = (ms: number): string => new Date(ms).toISOString();

function gateView(g: RolloutGate): GateView {
  return g.kind === 'url'
    ? { url: g.url, fail_open: g.failOpen }
    : { prometheus: g.url, query: g.query ?? '', fail_open: g.failOpen };
}

/** A rollout's limits with each group's nodes (`nodes`: group name → node ids in order). */
export function rolloutView(r: Rollout, nodes: ReadonlyMap<string, string[]>): RolloutView {
  const v: RolloutView = {
    nodegroups: r.groups.map((g) => {
      return {
        name: g.name,
        role: g.role,
        nodes: nodes.get(g.name) ?? [],
        max_unavailable: g.window,
        ...(g.quorum !== undefined ? { quorum_max_unavailable: g.quorum } : {}),
        canary: g.canary ?? 0,
      };
    }),
    pause_s: r.pauseS,
    max_failures: r.maxFailures,
    health_config_id: r.healthConfigId,
    canaries: r.canaries ?? [],
    auto_promote_s: r.autoPromoteS ?? null,
    on_failure: r.onFailure ?? 'abort',
    node_deadline_s: r.nodeDeadlineS ?? null,
    progress_deadline_s: r.progressDeadlineS ?? null,
    gate: r.gate ? gateView(r.gate) : null,
    force: r.force === true,
  };
  if (r.upgrade) {
    v.revision = r.upgrade.revision;
    v.from_revision = r.upgrade.from;
    v.stable_revision = r.upgrade.stable;
    if (r.upgrade.undoOf !== undefined) v.undo_of = r.upgrade.undoOf;
  }
  return v;
}

/** The answer of a dry-run restart: what would run, in order. */
export function restartPlanView(clusterId: string, r: Rollout, nodes: ReadonlyMap<string, string[]>): RestartPlanView {
  return { cluster: clusterId, dry_run: true, ...rolloutView(r, nodes) };
}

/** The answer of a dry-run upgrade (or undo): the revision it would make, and the plan. */
export function upgradePlanView(
  clusterId: string,
  r: Rollout,
  nodes: ReadonlyMap<string, string[]>,
  newRevision: boolean,
): UpgradePlanView {
  return { ...restartPlanView(clusterId, r, nodes), new_revision: newRevision };
}

/** Where a rollout is (docs/api.md "Rollouts"). */
export function rolloutPhase(c: ClusterRecord, r: Rollout): RolloutPhase {
  if (!c.status.endsWith('_IN_PROGRESS')) return 'done';
  const st = r.state;
  if (!st) return 'rolling';
  if (st.revert) return 'reverting';
  if (st.aborted || st.expired) return 'aborting';
  if (st.paused) return 'paused';
  if (st.gateWantedAtMs !== null) return 'waiting_for_gate';
  const canaries = new Set(r.canaries ?? []);
  // (a canary failed beyond what a resume forgave stops the rollout: it is not awaiting promotion then)
  if (canaries.size > 0 && !st.promoted)
    return c.nodes.filter((n) => canaries.has(n.node)).every((n) => n.phase === 'complete' || n.phase === 'failed')
      ? 'awaiting_promotion'
      : 'canary';
  return 'rolling';
}

function rolloutStateView(c: ClusterRecord, r: Rollout): RolloutStateView | null {
  const st = r.state;
  if (!st) return null;
  return {
    phase: rolloutPhase(c, r),
    progress_at: st.progressAtMs ? isoOf(st.progressAtMs) : null,
    paused: st.paused && { by: st.paused.by, at: isoOf(st.paused.atMs), reason: st.paused.reason },
    aborted: st.aborted && { by: st.aborted.by, at: isoOf(st.aborted.atMs) },
    expired: st.expired && { at: isoOf(st.expired.atMs), reason: st.expired.reason },
    promoted: st.promoted && { by: st.promoted.by, at: isoOf(st.promoted.atMs) },
    gate: st.gate && {
      verdict: st.gate.verdict,
      at: isoOf(st.gate.atMs),
      detail: st.gate.detail,
      error: st.gate.error,
    },
    waiting_for_gate_since: st.gateWantedAtMs === null ? null : isoOf(st.gateWantedAtMs),
    revert: st.revert && {
      revision: st.revert.revision,
      at: isoOf(st.revert.atMs),
      nodes: st.revert.nodes,
      reason: st.revert.why,
    },
  };
}

/** How the nodes of the cluster's current (or last) operation fared (docs/api.md `counters`). */
export function countersView(c: ClusterRecord): CountersView {
  const k = rolloutCounters(c.rollout, c.nodes);
  return {
    targeted: k.targeted,
    completed: k.completed,
    failed: k.failed,
    timed_out: k.timedOut,
    in_flight: k.inFlight,
    reverted: k.reverted,
  };
}

/** A cluster revision as `GET /v1/clusters/{id}/revisions` shows it, hidden values masked. */
export function clusterRevisionView(
  r: ClusterRevisionRecord,
  current: number,
  hidden: ReadonlySet<string>,
): ClusterRevisionView {
  return {
    revision: r.revision,
    install_config_id: r.installConfigId,
    uninstall_config_id: r.uninstallConfigId,
    input_values: maskValues(r.inputValues, hidden),
    nodegroups: r.nodegroups.map((g) => ({
      name: g.name,
      install_config_id: g.installConfigId,
      uninstall_config_id: g.uninstallConfigId,
      input_values: g.inputValues === null ? null : maskValues(g.inputValues, hidden),
    })),
    created_at: r.createdAt,
    created_by: r.createdBy === '' ? null : r.createdBy,
    stable: r.stableAt !== null,
    stable_at: r.stableAt,
    source_revision: r.sourceRevision,
    current: r.revision === current,
  };
}

/**
 * A cluster with its groups. `install`/`uninstall` are the cluster's configs; `groupConfigs`
 * the groups' own ones (their hidden inputs are masked in every group's values too).
 */
export function clusterView(
  c: ClusterRecord,
  install: ConfigRecord | undefined,
  uninstall: ConfigRecord | undefined,
  groupConfigs: Array<ConfigRecord | undefined> = [],
): ClusterView {
  const hidden = hiddenNames(install, uninstall, ...groupConfigs);
  return {
    ...clusterHead(c, hidden),
    nodes: c.nodes.map(clusterNodeView),
    nodegroups: c.nodegroups.map((g) => ({
      ...nodegroupHead(c, g, hidden),
      nodes: c.nodes.filter((n) => n.nodegroup === g.name).map(clusterNodeView),
    })),
    rollout: clusterRolloutView(c),
    revision: c.revision,
    counters: countersView(c),
  };
}

/** The cluster as `clusterView` shows it, without its members: their number instead. */
export function clusterSummaryView(
  c: ClusterRecord,
  install: ConfigRecord | undefined,
  uninstall: ConfigRecord | undefined,
  groupConfigs: Array<ConfigRecord | undefined> = [],
): ClusterSummaryView {
  const hidden = hiddenNames(install, uninstall, ...groupConfigs);
  const counts = new Map<string, number>();
  for (const n of c.nodes) counts.set(n.nodegroup, (counts.get(n.nodegroup) ?? 0) + 1);
  return {
    ...clusterHead(c, hidden),
    node_count: c.nodes.length,
    nodegroups: c.nodegroups.map((g) => ({ ...nodegroupHead(c, g, hidden), node_count: counts.get(g.name) ?? 0 })),
    rollout: clusterRolloutView(c),
    revision: c.revision,
    counters: countersView(c),
  };
}

function clusterHead(
  c: ClusterRecord,
  hidden: Set<string>,
): Omit<ClusterView, 'nodes' | 'nodegroups' | 'rollout' | 'revision' | 'counters'> {
  return {
    id: c.id,
    name: c.name,
    status: c.status,
    status_reason: c.statusReason,
    install_config_id: c.installConfigId,
    uninstall_config_id: c.uninstallConfigId,
    input_values: maskValues(c.inputValues, hidden),
    operation: c.operation,
    max_unavailable: c.maxUnavailable,
    operation_started_at: c.operationStartedAt,
    operation_finished_at: c.operationFinishedAt,
    creation_time: c.createdAt,
    updated_time: c.updatedAt,
  };
}

function nodegroupHead(
  c: ClusterRecord,
  g: ClusterRecord['nodegroups'][number],
  hidden: Set<string>,
): Omit<NodegroupView, 'nodes'> {
  return {
    name: g.name,
    role: g.role,
    install_config_id: g.installConfigId ?? c.installConfigId,
    uninstall_config_id: g.uninstallConfigId ?? c.uninstallConfigId,
    input_values: maskValues(g.inputValues ?? {}, hidden),
    creation_time: g.createdAt,
  };
}

function clusterRolloutView(c: ClusterRecord): ClusterView['rollout'] {
  if (c.rollout === null || c.rollout.change !== undefined) return null;
  const members = new Map<string, string[]>();
  for (const n of c.nodes) {
    // an upgrade's group lists the nodes it changes: not those it left alone (complete, nothing run)
    if (n.phase === 'complete' && n.endedAtMs === null && n.uninstallStartedAt === null && c.rollout.upgrade) continue;
    const m = members.get(n.nodegroup);
    if (m) m.push(n.node);
    else members.set(n.nodegroup, [n.node]);
  }
  return {
    ...rolloutView(c.rollout, new Map(c.rollout.groups.map((g) => [g.name, members.get(g.name) ?? []]))),
    state: rolloutStateView(c, c.rollout),
  };
}
