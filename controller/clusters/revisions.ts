/**
 * Cluster revisions (docs/api.md "Revisions"), pure: what configs and input values a revision
 * gives a node of a group, whether two revisions give a group the same, and the next revision a
 * change makes. The engine (engine.ts) decides from these which nodes an upgrade changes; the
 * store keeps the revisions (clusters/tx.ts).
 */
import type { ClusterRevisionRecord, NewClusterRevision, RevisionGroup } from '../model/records.js';
import type { DeploymentSource } from './tx.js';

/** A node's configs and input values under a revision: its group's own over the cluster's (input values key by key). */
export interface NodeConfigs {
  install: DeploymentSource;
  uninstall: DeploymentSource;
}

/** What revision `r` gives the nodes of group `group`. */
export function configsOf(r: NewClusterRevision, group: string): NodeConfigs {
  const g = r.nodegroups.find((x) => x.name === group);
  const inputValues = { ...r.inputValues, ...(g?.inputValues ?? {}) };
  return {
    install: { configId: g?.installConfigId ?? r.installConfigId, inputValues },
    uninstall: { configId: g?.uninstallConfigId ?? r.uninstallConfigId, inputValues },
  };
}

/** JSON with object keys sorted: the same values give the same text whatever their keys' order. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object')
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  return JSON.stringify(v) ?? 'null';
}

/** Do the two give a deployment the same config and input values? */
export function sameSource(a: DeploymentSource, b: DeploymentSource): boolean {
  return a.configId === b.configId && canonical(a.inputValues) === canonical(b.inputValues);
}

/** Do the two give the nodes of `group` the same install and uninstall? */
export function sameConfigs(a: NewClusterRevision, b: NewClusterRevision, group: string): boolean {
  const x = configsOf(a, group);
  const y = configsOf(b, group);
  return sameSource(x.install, y.install) && sameSource(x.uninstall, y.uninstall);
}

/** Does `b` change anything of `a` for the groups named (configs or input values)? */
export function changesAny(a: NewClusterRevision, b: NewClusterRevision, groups: readonly string[]): boolean {
  return (
    a.installConfigId !== b.installConfigId ||
    a.uninstallConfigId !== b.uninstallConfigId ||
    canonical(a.inputValues) !== canonical(b.inputValues) ||
    groups.some((g) => canonical(groupOf(a, g)) !== canonical(groupOf(b, g)))
  );
}

function groupOf(r: NewClusterRevision, name: string): Omit<RevisionGroup, 'name'> {
  const g = r.nodegroups.find((x) => x.name === name);
  return {
    installConfigId: g?.installConfigId ?? null,
    uninstallConfigId: g?.uninstallConfigId ?? null,
    inputValues: g?.inputValues ?? null,
  };
}

/** Input values merged as a PATCH merges them (docs/api.md): given values replace, `null` removes one, the others stay. */
export function mergeValues(
  base: Record<string, unknown>,
  patch: Record<string, unknown> | undefined,
): Record<string, unknown> {
  const out = { ...base };
  for (const [k, v] of Object.entries(patch ?? {})) {
    if (v === null) delete out[k];
    else out[k] = v;
  }
  return out;
}

/** A change of a cluster's configs or input values (PATCH /v1/clusters/{id}, or one of its groups). */
export interface ConfigChange {
  /** The group whose own configs and values change; absent: the cluster's. */
  nodegroup?: string;
  installConfigId?: string;
  uninstallConfigId?: string;
  /** Merged into the current ones (mergeValues). */
  inputValues?: Record<string, unknown>;
}

/**
 * The revision after `cur` that `c` makes, for a cluster whose groups are `groups` (a group
 * missing from `cur` has no configs of its own there).
 */
export function nextRevision(cur: NewClusterRevision, c: ConfigChange, groups: readonly string[]): NewClusterRevision {
  const nodegroups = groups.map((name) => ({ name, ...groupOf(cur, name) }));
  if (c.nodegroup === undefined)
    return {
      installConfigId: c.installConfigId ?? cur.installConfigId,
      uninstallConfigId: c.uninstallConfigId ?? cur.uninstallConfigId,
      inputValues: mergeValues(cur.inputValues, c.inputValues),
      nodegroups,
      sourceRevision: null,
    };
  const g = nodegroups.find((x) => x.name === c.nodegroup)!;
  g.installConfigId = c.installConfigId ?? g.installConfigId;
  g.uninstallConfigId = c.uninstallConfigId ?? g.uninstallConfigId;
  if (c.inputValues !== undefined) g.inputValues = mergeValues(g.inputValues ?? {}, c.inputValues);
  return { ...cur, nodegroups, sourceRevision: null };
}

/**
 * An undo's revision: revision `src`'s configs and values, for the groups the cluster has now (a
 * group newer than `src` keeps its own from `cur`).
 */
export function undoRevision(
  cur: NewClusterRevision,
  src: ClusterRevisionRecord,
  groups: readonly string[],
): NewClusterRevision {
  return {
    installConfigId: src.installConfigId,
    uninstallConfigId: src.uninstallConfigId,
    inputValues: { ...src.inputValues },
    nodegroups: groups.map((name) => {
      const g = src.nodegroups.find((x) => x.name === name) ?? cur.nodegroups.find((x) => x.name === name);
      return { name, ...groupOf({ ...cur, nodegroups: g ? [g] : [] }, name) };
    }),
    sourceRevision: src.revision,
  };
}

/** The last stable revision before `revision`, else null. */
export function lastStableBefore(revisions: readonly ClusterRevisionRecord[], revision: number): number | null {
  let best: number | null = null;
  for (const r of revisions)
    if (r.stableAt !== null && r.revision < revision && (best === null || r.revision > best)) best = r.revision;
  return best;
}
