/**
 * The rows of who may do what (docs/access.md; tables in access-schema.ts), over the statements
 * both stores share: grants, and each node's labels with its cluster membership, which scope
 * checks read (controller/access/). Reads run anywhere; writes only inside a transaction, with
 * their audit row (controller/store/tx.ts).
 */
import { ACCESS_FACTS_BY_KEY_ENTRIES } from '../../protocol/limits.js';
import type { AccessGrantRecord, NodeFacts } from '../model/records.js';
import type { Statements } from './statements.js';

export interface GrantRow {
  id: string;
  subject: string;
  role: string;
  scope: string;
  created_at: string;
  created_by: string;
}

interface FactsRow {
  id: string;
  labels: string | null;
  cluster_id: string | null;
  cluster_name: string | null;
  nodegroup: string | null;
}

export function grantOf(r: GrantRow): AccessGrantRecord {
  return {
    id: r.id,
    subject: r.subject,
    role: r.role,
    scope: JSON.parse(r.scope) as string[],
    createdAt: r.created_at,
    createdBy: r.created_by,
  };
}

function labelsOf(text: string | null): Record<string, string> {
  return text === null ? {} : (JSON.parse(text) as Record<string, string>);
}

/** Every grant, or `subject`'s, oldest first. */
export async function readGrants(s: Statements, subject?: string): Promise<AccessGrantRecord[]> {
  const rows = (subject === undefined ? await s.grantList.all() : await s.grantsOf.all(subject)) as GrantRow[];
  return rows.map(grantOf);
}

/** Labels of `nodes` (null: of every node); a node without labels is absent. */
export async function readNodeLabels(
  s: Statements,
  nodes: readonly string[] | null,
): Promise<Map<string, Record<string, string>>> {
  const rows = (nodes === null ? await s.labelsAll.all() : await s.labelsByNodes.all(nodes)) as Array<{
    node: string;
    labels: string;
  }>;
  return new Map(rows.map((r) => [r.node, labelsOf(r.labels)]));
}

/**
 * What a scope check knows of `nodes` (null: of every node): a few one by one, many (or all) in
 * one query; a node that does not exist is absent.
 */
export async function readNodeFacts(s: Statements, nodes: readonly string[] | null): Promise<Map<string, NodeFacts>> {
  const wanted = nodes === null ? null : new Set(nodes);
  const rows = (
    wanted === null || wanted.size > ACCESS_FACTS_BY_KEY_ENTRIES
      ? await s.factsAll.all()
      : await s.factsByNodes.all([...wanted])
  ) as FactsRow[];
  const out = new Map<string, NodeFacts>();
  for (const r of rows) {
    if (wanted !== null && !wanted.has(r.id)) continue;
    out.set(r.id, {
      id: r.id,
      labels: labelsOf(r.labels),
      cluster:
        r.cluster_id === null ? null : { id: r.cluster_id, name: r.cluster_name ?? '', nodegroup: r.nodegroup ?? '' },
    });
  }
  return out;
}
