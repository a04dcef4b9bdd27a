/**
 * Who may do what (docs/access.md), as the API edge asks it: an operator's grants (the database's,
 * read on every request, so a change made through any controller of the database holds from the
 * next request on; plus the controller's --bootstrap-admin names), what a request targets read
 * into facts (a deployment's node, a cluster's members, their labels and groups), and the
 * decision of policy.ts. Also the grants' management (`/v1/access/grants`), `whoami` and
 * `can-i`, and what a list or the event stream may show (`Visibility`).
 */
import { EventEmitter } from 'node:events';
import type { CertIdentity } from '../../certs/identity.js';
import {
  formatSelector,
  isAccessRole,
  isSubjectName,
  isVerb,
  parseScope,
  parseSelector,
  patchLabels,
  VERBS,
  type AccessRole,
  type CanIView,
  type GrantView,
  type Verb,
  type WhoamiView,
} from '../../protocol/access.js';
import { HeraldError } from '../../protocol/errors.js';
import type { AccessGrantRecord, ClusterRecord, NodeFacts } from '../model/records.js';
import { newId } from '../store/ids.js';
import type { Store } from '../store/store.js';
import {
  decide,
  unknownNode,
  VerbScope,
  type ClusterFacts,
  type Decision,
  type Grant,
  type ResolvedTarget,
} from './policy.js';

/**
 * What a request names, as a route declares it (controller/api/server.ts): a node (as it is, and
 * with `relabel` applied too), a node that does not exist yet with its labels, a deployment (its
 * node), a cluster or one of its node groups (their members), a join token (its node).
 */
export type TargetRef =
  | { node: string; relabel?: Readonly<Record<string, string | null>> | undefined }
  | { newNode: string; labels: Readonly<Record<string, string>> }
  | { deployment: string }
  | { cluster: string }
  | { nodegroup: { cluster: string; name: string } }
  | { token: string };

/**
 * How a route's targets are found: `unscoped`, the verb over any scope (what it reads or makes
 * names no node: configs, controllers); `filtered`, the same, and the handler shows only what
 * the caller may see (lists, the event stream, metrics); `fleet`, the verb over the whole fleet
 * (`*`: grants, the audit trail); or the targets a request names.
 */
export type TargetSpec = 'unscoped' | 'filtered' | 'fleet' | TargetRef[];

/** A refusal by the policy: 403 `forbidden` or `out_of_scope`, with the rule that refused. */
export class AccessRefused extends HeraldError {
  readonly rule: string;
  readonly verb: Verb;

  constructor(code: 'forbidden' | 'out_of_scope', rule: string, verb: Verb) {
    super(code, rule);
    this.name = 'AccessRefused';
    this.rule = rule;
    this.verb = verb;
  }
}

/** What a list, a stream or a masked value may show one operator, for one verb. */
export class Visibility {
  readonly scope: VerbScope;
  readonly #facts: ReadonlyMap<string, NodeFacts>;

  /** `facts`: of every node (none needed when the scope is the whole fleet). */
  constructor(scope: VerbScope, facts: ReadonlyMap<string, NodeFacts>) {
    this.scope = scope;
    this.#facts = facts;
  }

  get all(): boolean {
    return this.scope.all;
  }

  node(id: string): boolean {
    return this.scope.all || this.scope.node(this.#facts.get(id) ?? unknownNode(id));
  }

  /** A cluster as its view shows it (`name`, `nodes[].node`, `nodes[].nodegroup`). */
  cluster(c: { id: string; name: string; nodes: ReadonlyArray<{ node: string; nodegroup: string }> }): boolean {
    if (this.scope.all) return true;
    return this.scope.cluster({
      id: c.id,
      name: c.name,
      members: c.nodes.map((n) => ({
        id: n.node,
        labels: this.#facts.get(n.node)?.labels ?? {},
        cluster: { id: c.id, name: c.name, nodegroup: n.nodegroup },
      })),
    });
  }
}

/** One authorized request's access: its grants, read once, and what it may see per verb. */
export class RequestAccess {
  readonly identity: CertIdentity;
  readonly grants: readonly Grant[];
  readonly #store: Store;
  readonly #views = new Map<Verb, Promise<Visibility>>();
  /** Every node's facts, read once per request whatever the verbs that need them. */
  #facts: Promise<Map<string, NodeFacts>> | undefined;

  constructor(identity: CertIdentity, grants: readonly Grant[], store: Store) {
    this.identity = identity;
    this.grants = grants;
    this.#store = store;
  }

  scope(verb: Verb): VerbScope {
    return new VerbScope(verb, this.grants);
  }

  /** Whether the caller may deploy to `node`, so sees its deployments' hidden outputs. */
  async reveals(node: string): Promise<boolean> {
    const scope = this.scope('deploy');
    if (scope.all || !scope.held) return scope.all;
    return scope.node((await this.#store.nodeFacts([node])).get(node) ?? unknownNode(node));
  }

  /** What `verb` reaches, with every node's facts read (once per verb and request) unless it is the whole fleet. */
  visibility(verb: Verb): Promise<Visibility> {
    let v = this.#views.get(verb);
    if (v === undefined) {
      const scope = this.scope(verb);
      v =
        scope.all || !scope.held
          ? Promise.resolve(new Visibility(scope, new Map()))
          : this.#allFacts().then((facts) => new Visibility(scope, facts));
      this.#views.set(verb, v);
    }
    return v;
  }

  #allFacts(): Promise<Map<string, NodeFacts>> {
    this.#facts ??= this.#store.nodeFacts(null);
    return this.#facts;
  }
}

export interface AccessControlOptions {
  store: Store;
  /** Operator names that hold admin over the whole fleet whatever the database says (--bootstrap-admin). */
  bootstrapAdmins: readonly string[];
}

/** The policy's reads and writes; emits `change` after a grant made or revoked through this controller. */
export class AccessControl extends EventEmitter {
  readonly #store: Store;
  readonly #bootstrap: ReadonlySet<string>;

  constructor(o: AccessControlOptions) {
    super();
    // one listener per event stream (controller/api/server.ts)
    this.setMaxListeners(0);
    this.#store = o.store;
    this.#bootstrap = new Set(o.bootstrapAdmins);
  }

  /** The grants of `operator/<name>`: the bootstrap one, if named so, then the database's. */
  async grantsOf(name: string): Promise<Grant[]> {
    const out: Grant[] = this.#bootstrap.has(name) ? [bootstrapGrant(name)] : [];
    for (const r of await this.#store.listAccessGrants(name)) {
      const g = grantOfRecord(r);
      if (g) out.push(g);
    }
    return out;
  }

  /**
   * Decides a request: `verb` over what `targets` names. Resolves with the request's access;
   * targets are read only when the verb is not held over the whole fleet.
   * @throws AccessRefused `forbidden` | `out_of_scope`
   */
  async authorize(identity: CertIdentity, verb: Verb, targets: TargetSpec): Promise<RequestAccess> {
    const access = new RequestAccess(identity, await this.grantsOf(identity.name), this.#store);
    const d = await this.#decide(identity.name, access, verb, targets);
    if (!d.allowed) throw new AccessRefused(d.code, d.rule, verb);
    return access;
  }

  /** Any operator, no grant needed (whoami, can-i): the request's access, for what follows. */
  async anyOperator(identity: CertIdentity): Promise<RequestAccess> {
    return new RequestAccess(identity, await this.grantsOf(identity.name), this.#store);
  }

  async #decide(operator: string, access: RequestAccess, verb: Verb, targets: TargetSpec): Promise<Decision> {
    const scope = access.scope(verb);
    const resolved: ResolvedTarget[] =
      targets === 'fleet'
        ? [{ kind: 'fleet' }]
        : !scope.held || scope.all || !Array.isArray(targets)
          ? []
          : await this.resolve(targets);
    return decide(operator, access.grants, verb, resolved);
  }

  /**
   * Reads what `refs` name into facts. A deployment, cluster, node group or token that does not
   * exist names nothing (the route answers 404 for it); a node that does not exist is its name alone.
   */
  async resolve(refs: readonly TargetRef[]): Promise<ResolvedTarget[]> {
    const out: ResolvedTarget[] = [];
    const nodes: Array<{ id: string; relabel?: Readonly<Record<string, string | null>> | undefined }> = [];
    for (const r of refs) {
      if ('node' in r) nodes.push({ id: r.node, relabel: r.relabel });
      else if ('newNode' in r) out.push({ kind: 'node', facts: { id: r.newNode, labels: r.labels, cluster: null } });
      else if ('deployment' in r) {
        const d = await this.#store.getDeployment(r.deployment);
        if (d) nodes.push({ id: d.node });
      } else if ('token' in r) {
        const t = (await this.#store.listEnrollmentTokens()).find((x) => x.id === r.token);
        if (t) nodes.push({ id: t.node });
      } else {
        const clusterId = 'cluster' in r ? r.cluster : r.nodegroup.cluster;
        const group = 'nodegroup' in r ? r.nodegroup.name : undefined;
        const c = await this.#store.getCluster(clusterId);
        if (c) out.push({ kind: 'cluster', facts: await this.#clusterFacts(c, group) });
      }
    }
    if (nodes.length > 0) {
      const facts = await this.#store.nodeFacts(nodes.map((n) => n.id));
      for (const n of nodes) {
        const f = facts.get(n.id) ?? unknownNode(n.id);
        out.push({ kind: 'node', facts: f });
        if (n.relabel) out.push({ kind: 'node', facts: { ...f, labels: patchLabels(f.labels, n.relabel) } });
      }
    }
    return out;
  }

  async #clusterFacts(c: ClusterRecord, nodegroup: string | undefined): Promise<ClusterFacts> {
    const members = c.nodes.filter((n) => nodegroup === undefined || n.nodegroup === nodegroup);
    const labels = await this.#store.nodeLabels(members.map((m) => m.node));
    return {
      id: c.id,
      name: c.name,
      nodegroup,
      members: members.map((m) => ({
        id: m.node,
        labels: labels.get(m.node) ?? {},
        cluster: { id: c.id, name: c.name, nodegroup: m.nodegroup },
      })),
    };
  }

  // ---- whoami and can-i --------------------------------------------------------------------

  async whoami(identity: CertIdentity): Promise<WhoamiView> {
    const grants = await this.grantsOf(identity.name);
    const verbs = {} as Record<Verb, string[]>;
    for (const v of VERBS) verbs[v] = [...new Set(new VerbScope(v, grants).selectors.map(formatSelector))];
    return { identity: identity.spiffeId, operator: identity.name, grants: grants.map(grantView), verbs };
  }

  /**
   * What the API would decide for `verb` on `target` (`node:<id>`, `deployment:<id>`,
   * `cluster:<id or name>`, `nodegroup:<cluster id or name>/<group>`, `token:<id>`, `*` for the
   * whole fleet, empty for the verb alone). A target that does not exist is `not_found`.
   * @throws HeraldError `invalid_request` | `not_found`
   */
  async canI(identity: CertIdentity, verb: unknown, target: string): Promise<CanIView> {
    if (!isVerb(verb))
      throw new HeraldError('invalid_request', `verb must be one of ${VERBS.join(', ')}`, { field: 'verb' });
    const t = target.trim();
    const grants = await this.grantsOf(identity.name);
    let resolved: ResolvedTarget[];
    if (t === '' || t === '-') resolved = [];
    else if (t === '*') resolved = [{ kind: 'fleet' }];
    else resolved = await this.resolve([await this.#targetRef(t)]);
    const d = decide(identity.name, grants, verb, resolved);
    return {
      allowed: d.allowed,
      verb,
      target: t === '' ? '-' : t,
      code: d.allowed ? null : d.code,
      rule: d.rule,
    };
  }

  async #targetRef(t: string): Promise<TargetRef> {
    const colon = t.indexOf(':');
    const kind = t.slice(0, colon);
    const id = t.slice(colon + 1);
    const missing = (): never => {
      throw new HeraldError('not_found', `no ${kind} ${id}`, { field: 'target' });
    };
    switch (colon < 0 ? '' : kind) {
      case 'node':
        return { node: id };
      case 'deployment':
        if (!(await this.#store.getDeployment(id))) missing();
        return { deployment: id };
      case 'token':
        if (!(await this.#store.listEnrollmentTokens()).some((x) => x.id === id)) missing();
        return { token: id };
      case 'cluster':
        return { cluster: await this.#clusterId(id, t) };
      case 'nodegroup': {
        const slash = id.lastIndexOf('/');
        if (slash < 0) break;
        const cluster = await this.#clusterId(id.slice(0, slash), t);
        return { nodegroup: { cluster, name: id.slice(slash + 1) } };
      }
    }
    throw new HeraldError(
      'invalid_request',
      'target is node:<id>, deployment:<id>, cluster:<id or name>, nodegroup:<cluster>/<group>, token:<id>, * or nothing',
      { field: 'target' },
    );
  }

  /** A cluster by id, else by name (one cluster of that name). */
  async #clusterId(idOrName: string, asked: string): Promise<string> {
    if (await this.#store.getClusterStatus(idOrName)) return idOrName;
    const named = (await this.#store.listClusters()).filter((c) => c.name === idOrName);
    if (named.length === 1) return named[0]!.id;
    if (named.length > 1)
      throw new HeraldError('invalid_request', `${named.length} clusters are named ${idOrName}: give its id`, {
        field: 'target',
      });
    throw new HeraldError('not_found', `no cluster ${idOrName} (${asked})`, { field: 'target' });
  }

  // ---- grants (admin over the whole fleet) -------------------------------------------------

  async listGrants(): Promise<GrantView[]> {
    const boot = [...this.#bootstrap].sort().map((n) => grantView(bootstrapGrant(n)));
    const stored = (await this.#store.listAccessGrants()).map(grantOfRecord).filter((g): g is Grant => g !== undefined);
    return [...boot, ...stored.map(grantView)];
  }

  /**
   * `{"subject","role","scope"?}` (scope default `["*"]`).
   * @throws HeraldError `invalid_request` (field `subject`, `role`, `scope.<i>`)
   */
  async createGrant(body: unknown, who: string): Promise<GrantView> {
    const b = (typeof body === 'object' && body !== null && !Array.isArray(body) ? body : {}) as Record<
      string,
      unknown
    >;
    for (const k of Object.keys(b))
      if (k !== 'subject' && k !== 'role' && k !== 'scope')
        throw new HeraldError('invalid_request', `unknown field ${k}`, { field: k });
    if (!isSubjectName(b.subject))
      throw new HeraldError('invalid_request', 'subject is an operator name (the <name> of operator/<name>)', {
        field: 'subject',
      });
    if (!isAccessRole(b.role))
      throw new HeraldError('invalid_request', 'role is viewer, deployer, author or admin', { field: 'role' });
    const scope = parseScope(b.scope ?? ['*']).map(formatSelector);
    const r = await this.#store.createAccessGrant({ id: newId(), subject: b.subject, role: b.role, scope }, who);
    this.emit('change');
    return grantView(grantOfRecord(r)!);
  }

  /** @throws HeraldError `not_found`; `invalid_request` for a bootstrap grant (the controller's option) */
  async deleteGrant(id: string, who: string): Promise<GrantView> {
    if (id.startsWith(BOOTSTRAP_PREFIX))
      throw new HeraldError(
        'invalid_request',
        `${id} is named by the controller's --bootstrap-admin: change that option to revoke it`,
      );
    const r = await this.#store.deleteAccessGrant(id, who);
    this.emit('change');
    return {
      id: r.id,
      subject: r.subject,
      role: r.role as AccessRole,
      scope: r.scope,
      source: 'database',
      created_at: r.createdAt,
      created_by: r.createdBy,
    };
  }
}

const BOOTSTRAP_PREFIX = 'bootstrap:';

function bootstrapGrant(name: string): Grant {
  return {
    id: `${BOOTSTRAP_PREFIX}${name}`,
    subject: name,
    role: 'admin',
    scope: [{ kind: 'all' }],
    source: 'bootstrap',
    createdAt: null,
    createdBy: null,
  };
}

/** A stored grant, or undefined for one this controller cannot read (written by a later Herald): it grants nothing. */
function grantOfRecord(r: AccessGrantRecord): Grant | undefined {
  if (!isAccessRole(r.role)) return undefined;
  try {
    return {
      id: r.id,
      subject: r.subject,
      role: r.role as AccessRole,
      scope: r.scope.map((s) => parseSelector(s)),
      source: 'database',
      createdAt: r.createdAt,
      createdBy: r.createdBy,
    };
  } catch {
    return undefined;
  }
}

export function grantView(g: Grant): GrantView {
  return {
    id: g.id,
    subject: g.subject,
    role: g.role,
    scope: g.scope.map(formatSelector),
    source: g.source,
    created_at: g.createdAt,
    created_by: g.createdBy,
  };
}
