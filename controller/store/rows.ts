/**
 * The store's rows as both SQL stores return them (controller/store/statements.ts), and their mapping to
 * records: JSON columns are TEXT, times ISO 8601 TEXT, flags 0/1, so SQLite and PostgreSQL
 * give the same values.
 */
import type { DeployAction } from '../../protocol/heat.js';
import type {
  ClusterNodePhase,
  ClusterNodeRecord,
  ClusterOperation,
  ClusterRecord,
  ClusterRevisionRecord,
  ClusterRole,
  ClusterStatus,
  ConfigRecord,
  DeploymentRecord,
  DeploymentStatus,
  MetadataDeployment,
  NodegroupRecord,
  NodegroupRole,
  RevisionGroup,
  NodeRecord,
  RevisionRecord,
  Rollout,
} from '../model/records.js';
import { METADATA_DEPLOYMENT_AT, NODE_AT } from './statements.js';

export interface NodeRow {
  id: string;
  endpoint: string | null;
  generation: number;
  acked_generation: number | null;
  created_at: string;
  updated_at: string;
}
export interface ConfigRow {
  id: string;
  name: string;
  grp: string;
  config: string;
  inputs: string;
  outputs: string;
  options: string;
  created_at: string;
}
export interface DeploymentRow {
  id: string;
  node: string;
  config_id: string;
  name: string | null;
  actions: string;
  cluster_id: string | null;
  cluster_role: string | null;
  d_created_at: string;
  d_updated_at: string;
  revision: number;
  item_id: string;
  action: string;
  input_values: string;
  status: string;
  status_reason: string;
  output_values: string | null;
  signalled: number;
  r_created_at: string;
  r_updated_at: string;
  signalled_at: string | null;
}
export type RevisionRow = Omit<
  DeploymentRow,
  'id' | 'node' | 'config_id' | 'name' | 'actions' | 'cluster_id' | 'cluster_role' | 'd_created_at' | 'd_updated_at'
>;
export interface ClusterRow {
  id: string;
  name: string;
  status: string;
  status_reason: string;
  install_config_id: string;
  uninstall_config_id: string;
  input_values: string;
  operation: string;
  max_unavailable: number;
  op_started_at: string | null;
  op_finished_at: string | null;
  created_at: string;
  updated_at: string;
  rollout: string | null;
  /** Null in a row read before migration 9 ran (never after: its default is 1). */
  revision?: number | null;
}
export interface ClusterRevisionRow {
  cluster_id: string;
  revision: number;
  install_config_id: string;
  uninstall_config_id: string;
  input_values: string;
  nodegroups: string;
  created_at: string;
  created_by: string;
  stable_at: string | null;
  source_revision: number | null;
}
export interface NodegroupRow {
  cluster_id: string;
  name: string;
  position: number;
  role: string;
  install_config_id: string | null;
  uninstall_config_id: string | null;
  input_values: string | null;
  created_at: string;
}
export interface ClusterNodeRow {
  cluster_id: string;
  node: string;
  position: number;
  phase: string;
  install_deployment_id: string;
  uninstall_deployment_id: string | null;
  step_deadline_ms: number | null;
  uninstall_started_at: string | null;
  uninstall_finished_at: string | null;
  install_started_at: string | null;
  install_finished_at: string | null;
  reason: string | null;
  nodegroup: string;
  health_deployment_id: string | null;
  check_started_at: string | null;
  ended_at_ms: number | null;
  revision?: number | null;
}

// ---- row mapping ----------------------------------------------------------------------------

export function nodeOf(r: NodeRow): NodeRecord {
  return {
    id: r.id,
    endpoint: r.endpoint,
    generation: r.generation,
    ackedGeneration: r.acked_generation,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

export function configOf(r: ConfigRow): ConfigRecord {
  return {
    id: r.id,
    name: r.name,
    group: r.grp,
    config: JSON.parse(r.config) as unknown,
    inputs: JSON.parse(r.inputs) as ConfigRecord['inputs'],
    outputs: JSON.parse(r.outputs) as ConfigRecord['outputs'],
    options: JSON.parse(r.options) as Record<string, unknown>,
    createdAt: r.created_at,
  };
}

export function revisionOf(r: RevisionRow): RevisionRecord {
  return {
    revision: r.revision,
    itemId: r.item_id,
    action: r.action as DeployAction,
    inputValues: JSON.parse(r.input_values) as Record<string, unknown>,
    status: r.status as DeploymentStatus,
    statusReason: r.status_reason,
    outputValues: r.output_values === null ? null : (JSON.parse(r.output_values) as Record<string, unknown>),
    signalled: r.signalled === 1,
    createdAt: r.r_created_at,
    updatedAt: r.r_updated_at,
    signalledAt: r.signalled_at,
  };
}

/**
 * A row of VALUES_SQL.depForMetadata (its columns' values, at METADATA_DEPLOYMENT_AT): what a
 * document takes of a deployment.
 */
export function metadataDeploymentOf(v: readonly unknown[]): MetadataDeployment {
  const at = METADATA_DEPLOYMENT_AT;
  return {
    id: v[at.id] as string,
    node: v[at.node] as string,
    configId: v[at.config_id] as string,
    name: v[at.name] as string | null,
    clusterId: v[at.cluster_id] as string | null,
    createdAt: v[at.d_created_at] as string,
    current: {
      revision: v[at.revision] as number,
      itemId: v[at.item_id] as string,
      action: v[at.action] as DeployAction,
      inputValues: JSON.parse(v[at.input_values] as string) as Record<string, unknown>,
      signalled: v[at.signalled] === 1,
    },
  };
}

/** A row of VALUES_SQL.nodeValues (its columns' values, at NODE_AT), as nodeOf maps SQL.nodeGet's. */
export function nodeOfValues(v: readonly unknown[]): NodeRecord {
  return {
    id: v[NODE_AT.id] as string,
    endpoint: v[NODE_AT.endpoint] as string | null,
    generation: v[NODE_AT.generation] as number,
    ackedGeneration: v[NODE_AT.acked_generation] as number | null,
    createdAt: v[NODE_AT.created_at] as string,
    updatedAt: v[NODE_AT.updated_at] as string,
  };
}

export function deploymentOf(r: DeploymentRow): DeploymentRecord {
  return {
    id: r.id,
    node: r.node,
    configId: r.config_id,
    name: r.name,
    actions: JSON.parse(r.actions) as DeployAction[],
    clusterId: r.cluster_id,
    clusterRole: r.cluster_role as ClusterRole | null,
    createdAt: r.d_created_at,
    updatedAt: r.d_updated_at,
    current: revisionOf(r),
  };
}

export function clusterNodeOf(n: ClusterNodeRow): ClusterNodeRecord {
  return {
    node: n.node,
    position: n.position,
    phase: n.phase as ClusterNodePhase,
    installDeploymentId: n.install_deployment_id,
    uninstallDeploymentId: n.uninstall_deployment_id,
    stepDeadlineMs: n.step_deadline_ms,
    uninstallStartedAt: n.uninstall_started_at,
    uninstallFinishedAt: n.uninstall_finished_at,
    installStartedAt: n.install_started_at,
    installFinishedAt: n.install_finished_at,
    reason: n.reason,
    nodegroup: n.nodegroup,
    healthDeploymentId: n.health_deployment_id,
    checkStartedAt: n.check_started_at,
    endedAtMs: n.ended_at_ms,
    revision: Number(n.revision ?? 1),
  };
}

export function nodegroupOf(g: NodegroupRow): NodegroupRecord {
  return {
    name: g.name,
    role: g.role as NodegroupRole,
    position: g.position,
    installConfigId: g.install_config_id,
    uninstallConfigId: g.uninstall_config_id,
    inputValues: g.input_values === null ? null : (JSON.parse(g.input_values) as Record<string, unknown>),
    createdAt: g.created_at,
  };
}

export function clusterOf(r: ClusterRow, nodes: ClusterNodeRow[], groups: NodegroupRow[]): ClusterRecord {
  return {
    id: r.id,
    name: r.name,
    status: r.status as ClusterStatus,
    statusReason: r.status_reason,
    installConfigId: r.install_config_id,
    uninstallConfigId: r.uninstall_config_id,
    inputValues: JSON.parse(r.input_values) as Record<string, unknown>,
    operation: r.operation as ClusterOperation,
    maxUnavailable: r.max_unavailable,
    operationStartedAt: r.op_started_at,
    operationFinishedAt: r.op_finished_at,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    nodes: nodes.map(clusterNodeOf),
    nodegroups: groups.map(nodegroupOf),
    rollout: r.rollout === null ? null : (JSON.parse(r.rollout) as Rollout),
    revision: Number(r.revision ?? 1),
  };
}

export function clusterRevisionOf(r: ClusterRevisionRow): ClusterRevisionRecord {
  return {
    revision: Number(r.revision),
    installConfigId: r.install_config_id,
    uninstallConfigId: r.uninstall_config_id,
    inputValues: JSON.parse(r.input_values) as Record<string, unknown>,
    nodegroups: JSON.parse(r.nodegroups) as RevisionGroup[],
    createdAt: r.created_at,
    createdBy: r.created_by,
    stableAt: r.stable_at,
    sourceRevision: r.source_revision === null ? null : Number(r.source_revision),
  };
}
