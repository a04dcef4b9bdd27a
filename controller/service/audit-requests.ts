/**
 * The audit row of each change asked of the API (docs/access.md, "Audit trail"): who, the route
 * (`POST /v1/deployments`), its target (the resource it made, else its path), the whole request
 * with hidden values masked, and the outcome: `ok` with the status, or the code it was refused
 * with. One row per request, for every route that changes something, written by the API's one
 * request pipeline (controller/api/server.ts) after the handler, before the answer; the change's
 * own rows (`deployment.create`, a cluster's steps, ...) are written inside its transaction.
 *
 * What is masked, from the request alone, whatever the route: every `input_values` entry an input
 * marked hidden names, in any config the request names (`*config_id`) or that feeds the resource
 * in its path (a deployment's configs, a cluster's: Service.hiddenInputsOf's rule); a hidden
 * input's `default` in a config's `inputs`; and any field named like a secret (`token`,
 * `password`, ...). When the configs cannot be read, every input value is masked.
 */
import type { Logger } from 'pino';
import { AUDIT_OK } from '../../protocol/audit-chain.js';
import { MAX_JSON_DEPTH_LEVELS } from '../../protocol/limits.js';
import type { DeploymentRecord, Store } from '../store/store.js';
import { hiddenNames, HIDDEN_VALUE } from './views.js';

/** A request to the API that asks for a change, as the edge read it. */
export interface AuditedRequest {
  /** The caller's SPIFFE id. */
  who: string;
  method: string;
  /** The route's template, `/v1/deployments/:id`. */
  route: string;
  /** The path asked for, `/v1/deployments/0193…`. */
  path: string;
  /** The query string without `?` (empty: none). */
  query: string;
  /** The parsed JSON body; undefined when there was none or it was not read (refused before). */
  body: unknown;
}

/** How it ended: a status, and the error code when it was refused. */
export interface RequestOutcome {
  status: number;
  code?: string | undefined;
  /** The `Location` of what it created, its target then. */
  location?: string | undefined;
}

/** Field names whose values are never recorded, wherever they are. */
const SECRET_FIELDS = new Set(['token', 'secret', 'password', 'passphrase', 'private_key', 'client_secret']);

export interface AuditRequestsOptions {
  store: Store;
  /** The inputs hidden for a deployment (ControllerService.hiddenInputsOf). */
  hiddenOf: (d: DeploymentRecord) => Promise<Set<string>>;
  logger: Logger;
  now?: () => number;
}

export class AuditRequests {
  readonly #o: AuditRequestsOptions;
  readonly #now: () => number;

  constructor(o: AuditRequestsOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
  }

  /**
   * Appends the request's row to the chain, in a transaction of its own. Never rejects: a row
   * that cannot be written (the database away, this controller's standing lost) is logged.
   */
  async record(r: AuditedRequest, outcome: RequestOutcome): Promise<void> {
    try {
      const body = await this.#bodyJson(r);
      const query = r.query === '' ? '' : `,"query":${JSON.stringify(r.query)}`;
      // the request's JSON text made here: a body of a megabyte is not copied to be masked
      const detail = `{"request":{"method":${JSON.stringify(r.method)},"path":${JSON.stringify(r.path)}${query},"body":${body}},"status":${outcome.status}}`;
      const entry = {
        at: new Date(this.#now()).toISOString(),
        who: r.who,
        action: `${r.method} ${r.route}`,
        target: outcome.location ?? r.path,
        detail,
        outcome: outcome.code ?? AUDIT_OK,
      };
      await this.#o.store.transaction((tx) => tx.auditChain.append([entry]).then(() => undefined));
    } catch (err) {
      const code = (err as { code?: string }).code ?? 'internal';
      // a controller that lost its standing writes nothing: its refusal of the request is the record
      const level = code === 'controller_revoked' || code === 'controller_expired' ? 'debug' : 'error';
      this.#o.logger[level](
        { event: 'audit.unwritten', code, who: r.who, route: r.route },
        `the audit row of ${r.method} ${r.path} could not be written`,
      );
    }
  }

  /**
   * The body as the row keeps it: as it came when nothing in it can be hidden or secret (a
   * megabyte of script is written, not walked again), else masked; a body too deep to walk was
   * refused for it (protocol/json-depth.ts), and its shape is not kept.
   */
  async #bodyJson(r: AuditedRequest): Promise<string> {
    if (r.body === undefined) return 'null';
    const s = survey(r.body);
    if (s.tooDeep) return JSON.stringify({ omitted: `nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels` });
    if (!s.masks) return JSON.stringify(r.body);
    return maskedJson(r.body, await this.#hidden(r, s.configIds));
  }

  /** The input names hidden for this request, or 'all' when that cannot be known. */
  async #hidden(r: AuditedRequest, configIds: Set<string>): Promise<ReadonlySet<string> | 'all'> {
    try {
      const names = new Set<string>();
      const [, v1, kind, id] = r.path.split('/');
      if (v1 === 'v1' && id !== undefined) {
        const target = decodeURIComponent(id);
        if (kind === 'deployments') {
          const d = await this.#o.store.getDeployment(target);
          if (d) for (const n of await this.#o.hiddenOf(d)) names.add(n);
        } else if (kind === 'clusters') {
          for (const c of (await this.#o.store.clusterConfigIds(target)) ?? []) configIds.add(c);
        }
      }
      const configs = [];
      for (const c of configIds) configs.push(await this.#o.store.getConfig(c));
      for (const n of hiddenNames(...configs)) names.add(n);
      return names;
    } catch {
      return 'all';
    }
  }
}

/**
 * One walk of a body, iterative: whether it is nested deeper than MAX_JSON_DEPTH_LEVELS, whether
 * anything in it may need masking (`input_values`, `inputs`, a secret's name), and the config ids
 * it names (`config_id`, `install_config_id`, ...).
 */
function survey(body: unknown): { tooDeep: boolean; masks: boolean; configIds: Set<string> } {
  const configIds = new Set<string>();
  let masks = false;
  // two stacks, not a pair per value: a body may hold tens of thousands of objects
  const values: unknown[] = [body];
  const depths: number[] = [0];
  while (values.length > 0) {
    const v = values.pop();
    const depth = depths.pop()!;
    if (v === null || typeof v !== 'object') continue;
    if (depth >= MAX_JSON_DEPTH_LEVELS) return { tooDeep: true, masks, configIds };
    if (Array.isArray(v)) {
      for (const x of v)
        if (x !== null && typeof x === 'object') {
          values.push(x);
          depths.push(depth + 1);
        }
      continue;
    }
    const o = v as Record<string, unknown>;
    for (const k in o) {
      const x = o[k];
      if (!masks && (k === 'input_values' || k === 'inputs' || SECRET_FIELDS.has(k.toLowerCase()))) masks = true;
      if (typeof x === 'string') {
        if (k === 'config_id' || k.endsWith('_config_id')) configIds.add(x);
      } else if (x !== null && typeof x === 'object') {
        values.push(x);
        depths.push(depth + 1);
      }
    }
  }
  return { tooDeep: false, masks, configIds };
}

/**
 * `v` as JSON text, with hidden values and secret fields written `***` (views.ts HIDDEN_VALUE):
 * masked while JSON.stringify writes it, so nothing is copied but what is masked.
 */
export function maskedJson(v: unknown, hidden: ReadonlySet<string> | 'all'): string {
  return JSON.stringify(v, (key: string, value: unknown) => {
    if (key === '') return value;
    if (SECRET_FIELDS.has(key.toLowerCase())) return HIDDEN_VALUE;
    if (key === 'input_values' && value !== null && typeof value === 'object' && !Array.isArray(value)) {
      const out: Record<string, unknown> = {};
      for (const [name, x] of Object.entries(value))
        out[name] = hidden === 'all' || hidden.has(name) ? HIDDEN_VALUE : x;
      return out;
    }
    if (key === 'inputs' && Array.isArray(value))
      return value.map((i: unknown) => {
        if (i === null || typeof i !== 'object' || Array.isArray(i) || !('default' in i)) return i;
        const d = i as Record<string, unknown>;
        return hidden === 'all' || d.hidden === true ? { ...d, default: HIDDEN_VALUE } : d;
      });
    return value;
  });
}
