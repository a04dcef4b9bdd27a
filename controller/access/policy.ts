/**
 * The decision, pure (docs/access.md): an operator's grants, a verb, and what a request targets
 * (nodes, clusters, node groups, or the whole fleet) give allowed or refused, with the rule that
 * decided, in words the log line and `herald can-i` both show. No I/O: the facts of the nodes
 * (labels, cluster, group) are read by the caller (controller/access/access.ts).
 *
 * A verb's scope is the union of the scopes of every grant whose role holds it: a node is in it
 * when any selector matches the node; a cluster (or one node group) when a `cluster:` (or
 * `nodegroup:`) selector names it, or when every one of its members is in it. A new cluster's
 * members are checked as they are before it exists, so naming a cluster in a selector never
 * reaches nodes that are not in that cluster yet.
 */
import {
  ACCESS_ROLES,
  formatSelector,
  nameMatches,
  roleHolds,
  VERB_ROLE,
  type AccessRole,
  type Selector,
  type Verb,
} from '../../protocol/access.js';
import type { NodeFacts } from '../model/records.js';

export type { NodeFacts };

/** A grant as the decision reads it: from the database, or named by --bootstrap-admin. */
export interface Grant {
  id: string;
  subject: string;
  role: AccessRole;
  scope: Selector[];
  source: 'database' | 'bootstrap';
  createdAt: string | null;
  createdBy: string | null;
}

/** A cluster, or one node group of it (`nodegroup`), with what is known of its members. */
export interface ClusterFacts {
  id: string;
  name: string;
  nodegroup?: string | undefined;
  members: NodeFacts[];
}

/** The facts of a node that does not exist (yet): only its name can put it in a scope. */
export function unknownNode(id: string): NodeFacts {
  return { id, labels: {}, cluster: null };
}

export function selectorMatchesNode(s: Selector, n: NodeFacts): boolean {
  switch (s.kind) {
    case 'all':
      return true;
    case 'node':
      return nameMatches(s.pattern, n.id);
    case 'label':
      for (const [k, v] of Object.entries(s.labels)) if (n.labels[k] !== v) return false;
      return true;
    case 'cluster':
      return n.cluster !== null && nameMatches(s.pattern, n.cluster.name);
    case 'nodegroup':
      return n.cluster !== null && nameMatches(s.cluster, n.cluster.name) && nameMatches(s.group, n.cluster.nodegroup);
  }
}

/** The selector names the cluster (or the group) itself. */
function selectorNamesCluster(s: Selector, c: ClusterFacts): boolean {
  if (s.kind === 'all') return true;
  if (s.kind === 'cluster') return nameMatches(s.pattern, c.name);
  if (s.kind === 'nodegroup')
    return c.nodegroup !== undefined && nameMatches(s.cluster, c.name) && nameMatches(s.group, c.nodegroup);
  return false;
}

/** What one verb reaches for one operator: the union of the scopes of their grants that hold it. */
export class VerbScope {
  readonly verb: Verb;
  /** The operator's grants whose role holds the verb. */
  readonly grants: readonly Grant[];
  readonly selectors: readonly Selector[];
  /** Held over the whole fleet (a `*` selector). */
  readonly all: boolean;

  constructor(verb: Verb, grants: readonly Grant[]) {
    this.verb = verb;
    this.grants = grants.filter((g) => roleHolds(g.role, verb));
    this.selectors = this.grants.flatMap((g) => g.scope);
    this.all = this.selectors.some((s) => s.kind === 'all');
  }

  /** The verb is held at all, over some scope. */
  get held(): boolean {
    return this.grants.length > 0;
  }

  node(n: NodeFacts): boolean {
    return this.all || this.selectors.some((s) => selectorMatchesNode(s, n));
  }

  /** A cluster (or a group): named by a selector, or every one of its members (at least one) in scope. */
  cluster(c: ClusterFacts): boolean {
    if (this.all || this.selectors.some((s) => selectorNamesCluster(s, c))) return true;
    return c.members.length > 0 && c.members.every((m) => this.node(m));
  }

  /** The scope in words: `node:web-*, label:team=web`. */
  describe(): string {
    return [...new Set(this.selectors.map(formatSelector))].join(', ') || 'nothing';
  }
}

/** What a request targets, with its facts read (controller/access/access.ts resolves them). */
export type ResolvedTarget =
  | { kind: 'node'; facts: NodeFacts }
  | { kind: 'cluster'; facts: ClusterFacts }
  | { kind: 'fleet' };

export type Decision =
  | { allowed: true; rule: string }
  | { allowed: false; code: 'forbidden' | 'out_of_scope'; rule: string };

/** `node web-1`, `cluster shop (0191...)`, `node group shop/masters`, `the whole fleet`. */
export function describeTarget(t: ResolvedTarget): string {
  if (t.kind === 'fleet') return 'the whole fleet';
  if (t.kind === 'node') return `node ${t.facts.id}`;
  const c = t.facts;
  return c.nodegroup === undefined ? `cluster ${c.name} (${c.id})` : `node group ${c.name}/${c.nodegroup} (${c.id})`;
}

/** The roles, least first, that hold `verb`: `deployer, author or admin`. */
function rolesHolding(verb: Verb): string {
  const roles = ACCESS_ROLES.slice(ACCESS_ROLES.indexOf(VERB_ROLE[verb]));
  return roles.length === 1 ? roles[0]! : `${roles.slice(0, -1).join(', ')} or ${roles[roles.length - 1]!}`;
}

function heldRoles(operator: string, grants: readonly Grant[]): string {
  if (grants.length === 0) return `operator/${operator} holds no grant`;
  return `operator/${operator} holds ${grants.map((g) => `${g.role} on ${g.scope.map(formatSelector).join(', ')}`).join('; ')}`;
}

/**
 * Whether `operator` (the `<name>` of `operator/<name>`), holding `grants`, may `verb` on every
 * one of `targets` (none: the verb over any scope is enough).
 */
export function decide(
  operator: string,
  grants: readonly Grant[],
  verb: Verb,
  targets: readonly ResolvedTarget[],
): Decision {
  const scope = new VerbScope(verb, grants);
  if (!scope.held)
    return {
      allowed: false,
      code: 'forbidden',
      rule: `${verb} needs the role ${rolesHolding(verb)}; ${heldRoles(operator, grants)}`,
    };
  for (const t of targets) {
    const inScope = t.kind === 'fleet' ? scope.all : t.kind === 'node' ? scope.node(t.facts) : scope.cluster(t.facts);
    if (!inScope)
      return {
        allowed: false,
        code: 'out_of_scope',
        rule: `${verb} on ${describeTarget(t)}: outside operator/${operator}'s ${verb} scope (${scope.describe()})`,
      };
  }
  const on =
    targets.length === 0
      ? ''
      : targets.length > 3
        ? ` on ${targets.length} targets`
        : ` on ${targets.map(describeTarget).join(', ')}`;
  return { allowed: true, rule: `${verb}${on}: within operator/${operator}'s ${verb} scope (${scope.describe()})` };
}
