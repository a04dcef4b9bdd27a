/**
 * Who may do what at the controller's API (docs/access.md): the operator roles, the verbs each
 * holds, the scope selectors a grant names, node labels, and the JSON of the access routes.
 * Pure: the controller decides with it (controller/access/), the CLI reads and checks with it.
 *
 * Roles are cumulative: `viewer` reads; `deployer` also runs existing configs (deployments,
 * cluster operations); `author` also creates configs (new code that runs as root); `admin` also
 * manages nodes, join tokens and certificates, and, holding it over the whole fleet (`*`), who
 * may do what.
 */
import { RefusalError } from './errors.js';
import { NAME_RE } from './identity.js';
import { MAX_GRANT_SELECTOR_ENTRIES, MAX_NODE_LABEL_ENTRIES } from './limits.js';

export const ACCESS_ROLES = ['viewer', 'deployer', 'author', 'admin'] as const;
export type AccessRole = (typeof ACCESS_ROLES)[number];

/** What a route asks of its caller: read, run existing configs, create configs, administer. */
export const VERBS = ['read', 'deploy', 'author', 'admin'] as const;
export type Verb = (typeof VERBS)[number];

/** The least role that holds each verb. */
export const VERB_ROLE: Readonly<Record<Verb, AccessRole>> = {
  read: 'viewer',
  deploy: 'deployer',
  author: 'author',
  admin: 'admin',
};

export function isAccessRole(x: unknown): x is AccessRole {
  return typeof x === 'string' && (ACCESS_ROLES as readonly string[]).includes(x);
}

export function isVerb(x: unknown): x is Verb {
  return typeof x === 'string' && (VERBS as readonly string[]).includes(x);
}

/** Whether `role` holds `verb` (roles are cumulative). */
export function roleHolds(role: AccessRole, verb: Verb): boolean {
  return ACCESS_ROLES.indexOf(role) >= ACCESS_ROLES.indexOf(VERB_ROLE[verb]);
}

/** A label key: `team`, `app.example/tier`. */
export const LABEL_KEY_RE = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/;
/** A label value. */
export const LABEL_VALUE_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** A node or node group name pattern: a name in which `*` stands for any run of characters and `?` for one. */
export const NAME_PATTERN_RE = /^[a-z0-9._*?-]{1,63}$/;
/** A cluster name pattern: cluster names are display names (no control characters, at most 255). */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to reject control characters
export const CLUSTER_PATTERN_RE = /^[^\u0000-\u001f\u007f]{1,255}$/;

/**
 * What a grant applies to; a node is in a grant's scope when any of its selectors matches it:
 * - `*`: everything, the whole fleet;
 * - `node:<pattern>`: nodes whose id matches (`web-*`);
 * - `label:<k>=<v>[,<k>=<v>...]`: nodes carrying every one of these labels;
 * - `cluster:<pattern>`: the members of clusters whose name matches;
 * - `nodegroup:<cluster pattern>/<group pattern>`: the members of those node groups.
 */
export type Selector =
  | { kind: 'all' }
  | { kind: 'node'; pattern: string }
  | { kind: 'label'; labels: Readonly<Record<string, string>> }
  | { kind: 'cluster'; pattern: string }
  | { kind: 'nodegroup'; cluster: string; group: string };

/**
 * Reads one selector. `field` names it in the error.
 * @throws RefusalError `invalid_request` naming `field`
 */
export function parseSelector(text: unknown, field = 'scope'): Selector {
  if (typeof text !== 'string') throw new RefusalError('invalid_request', 'a selector is a string', { field });
  const s = text.trim();
  if (s === '*') return { kind: 'all' };
  const colon = s.indexOf(':');
  const kind = colon < 0 ? '' : s.slice(0, colon);
  const rest = colon < 0 ? '' : s.slice(colon + 1);
  const bad = (why: string): never => {
    throw new RefusalError(
      'invalid_request',
      `${JSON.stringify(s.slice(0, 120))} is not a selector: ${why} (*, node:<pattern>, label:<k>=<v>, cluster:<pattern>, nodegroup:<cluster>/<group>)`,
      { field },
    );
  };
  switch (kind) {
    case 'node':
      if (!NAME_PATTERN_RE.test(rest)) bad(`the pattern must match ${NAME_PATTERN_RE.source}`);
      return { kind, pattern: rest };
    case 'cluster':
      if (!CLUSTER_PATTERN_RE.test(rest)) bad('the pattern must be 1 to 255 characters, none a control character');
      return { kind, pattern: rest };
    case 'nodegroup': {
      // a group name has no '/'; a cluster name may
      const slash = rest.lastIndexOf('/');
      const cluster = slash < 0 ? '' : rest.slice(0, slash);
      const group = rest.slice(slash + 1);
      if (!CLUSTER_PATTERN_RE.test(cluster) || !NAME_PATTERN_RE.test(group))
        bad(`it names <cluster pattern>/<group pattern>, the group's matching ${NAME_PATTERN_RE.source}`);
      return { kind, cluster, group };
    }
    case 'label': {
      const labels: Record<string, string> = {};
      for (const pair of rest.split(',')) {
        const eq = pair.indexOf('=');
        const k = pair.slice(0, eq);
        const v = pair.slice(eq + 1);
        if (eq < 0 || !LABEL_KEY_RE.test(k) || !LABEL_VALUE_RE.test(v))
          bad(`each label is <key>=<value>, keys matching ${LABEL_KEY_RE.source}, values ${LABEL_VALUE_RE.source}`);
        if (Object.hasOwn(labels, k)) bad(`label ${k} is named twice`);
        labels[k] = v;
      }
      return { kind, labels };
    }
    default:
      return bad('unknown kind');
  }
}

/** A selector as `parseSelector` reads it (labels in key order). */
export function formatSelector(s: Selector): string {
  switch (s.kind) {
    case 'all':
      return '*';
    case 'node':
    case 'cluster':
      return `${s.kind}:${s.pattern}`;
    case 'nodegroup':
      return `nodegroup:${s.cluster}/${s.group}`;
    case 'label':
      return `label:${Object.keys(s.labels)
        .sort()
        .map((k) => `${k}=${s.labels[k]!}`)
        .join(',')}`;
  }
}

/**
 * A grant's scope: one to MAX_GRANT_SELECTOR_ENTRIES selectors, none twice; `*` alone.
 * @throws RefusalError `invalid_request` (field `scope` or `scope.<i>`)
 */
export function parseScope(list: unknown): Selector[] {
  if (!Array.isArray(list) || list.length === 0 || list.length > MAX_GRANT_SELECTOR_ENTRIES)
    throw new RefusalError(
      'invalid_request',
      `scope is a list of 1 to ${MAX_GRANT_SELECTOR_ENTRIES} selectors (["*"] for the whole fleet)`,
      { field: 'scope' },
    );
  const out: Selector[] = [];
  const seen = new Set<string>();
  for (const [i, text] of list.entries()) {
    const sel = parseSelector(text, `scope.${i}`);
    const key = formatSelector(sel);
    if (seen.has(key)) throw new RefusalError('invalid_request', `${key} is listed twice`, { field: `scope.${i}` });
    seen.add(key);
    out.push(sel);
  }
  if (out.length > 1 && seen.has('*'))
    throw new RefusalError('invalid_request', '* is the whole fleet: give it alone', { field: 'scope' });
  return out;
}

/** Whether `name` matches `pattern` (`*`: any run of characters, `?`: one; nothing else is special). */
export function nameMatches(pattern: string, name: string): boolean {
  // iterative glob with one backtracking point: linear in practice, never exponential
  let p = 0;
  let n = 0;
  let star = -1;
  let mark = 0;
  while (n < name.length) {
    if (p < pattern.length && (pattern[p] === '?' || pattern[p] === name[n])) {
      p++;
      n++;
    } else if (p < pattern.length && pattern[p] === '*') {
      star = p++;
      mark = n;
    } else if (star >= 0) {
      p = star + 1;
      n = ++mark;
    } else return false;
  }
  while (p < pattern.length && pattern[p] === '*') p++;
  return p === pattern.length;
}

/**
 * A node's labels as given (`{"team":"web"}`); with `patch`, `null` removes a key.
 * @throws RefusalError `invalid_request` naming `field.<key>`
 */
export function checkLabels(v: unknown, field = 'labels', patch = false): Record<string, string | null> {
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw new RefusalError('invalid_request', 'labels are an object of key: value', { field });
  const entries = Object.entries(v);
  if (entries.length > MAX_NODE_LABEL_ENTRIES)
    throw new RefusalError('invalid_request', `at most ${MAX_NODE_LABEL_ENTRIES} labels`, { field });
  const out: Record<string, string | null> = {};
  for (const [k, val] of entries) {
    if (!LABEL_KEY_RE.test(k))
      throw new RefusalError('invalid_request', `a label key must match ${LABEL_KEY_RE.source}`, { field });
    if (val === null && patch) out[k] = null;
    else if (typeof val === 'string' && LABEL_VALUE_RE.test(val)) out[k] = val;
    else
      throw new RefusalError(
        'invalid_request',
        `a label value must match ${LABEL_VALUE_RE.source}${patch ? ' (null removes the label)' : ''}`,
        { field: `${field}.${k}` },
      );
  }
  return out;
}

/** `labels` with `patch` applied (`null` removes a key), keys sorted. */
export function patchLabels(
  labels: Readonly<Record<string, string>>,
  patch: Readonly<Record<string, string | null>>,
): Record<string, string> {
  const merged: Record<string, string> = { ...labels };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete merged[k];
    else merged[k] = v;
  }
  const out: Record<string, string> = {};
  for (const k of Object.keys(merged).sort()) out[k] = merged[k]!;
  return out;
}

/** Whether `name` is an operator name a grant can be for (the `<name>` of `operator/<name>`). */
export function isSubjectName(name: unknown): name is string {
  return typeof name === 'string' && NAME_RE.test(name);
}

// ---- the JSON of the access routes (docs/api.md) ------------------------------------------------

/** A grant: `subject` (an operator's name) holds `role` over `scope`. */
export type GrantView = {
  id: string;
  subject: string;
  role: AccessRole;
  scope: string[];
  /** `database`: made through the API; `bootstrap`: named by the controller's --bootstrap-admin, not revocable there. */
  source: 'database' | 'bootstrap';
  created_at: string | null;
  created_by: string | null;
};

/** `GET /v1/access/whoami`. */
export type WhoamiView = {
  identity: string;
  operator: string;
  grants: GrantView[];
  /** Per verb, the selectors the caller holds it over (every grant's whose role holds it); empty: not held. */
  verbs: Record<Verb, string[]>;
};

/** `GET /v1/access/can-i?verb=..&target=..`: what the API would decide, without doing it. */
export type CanIView = {
  allowed: boolean;
  verb: Verb;
  /** As asked (`node:web-1`), or `-` for the verb alone. */
  target: string;
  /** The refusal's code, else null. */
  code: 'forbidden' | 'out_of_scope' | null;
  /** The rule that decided, as the controller logs it. */
  rule: string;
};
