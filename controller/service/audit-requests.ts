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
import { withinJsonDepth } from '../../protocol/json-depth.js';
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
      // a body too deep to walk was refused for it (protocol/json-depth.ts): its shape is not kept
      const body =
        r.body === undefined
          ? null
          : withinJsonDepth(r.body)
            ? mask(r.body, await this.#hidden(r))
            : { omitted: `nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels` };
      const request: Record<string, unknown> = { method: r.method, path: r.path, body };
      if (r.query !== '') request.query = r.query;
      const entry = {
        at: new Date(this.#now()).toISOString(),
        who: r.who,
        action: `${r.method} ${r.route}`,
        target: outcome.location ?? r.path,
        detail: { request, status: outcome.status },
        outcome: outcome.code ?? AUDIT_OK,
      };
      await this.#o.store.transaction((tx) => tx.auditChain.append([entry]).then(() => undefined));
    } catch (err) {
      this.#o.logger.error(
        { event: 'audit.unwritten', code: (err as { code?: string }).code ?? 'internal', who: r.who, route: r.route },
        `the audit row of ${r.method} ${r.path} could not be written`,
      );
    }
  }

  /** The input names hidden for this request, or 'all' when that cannot be known. */
  async #hidden(r: AuditedRequest): Promise<ReadonlySet<string> | 'all'> {
    try {
      const configIds = new Set<string>();
      collectConfigIds(r.body, configIds, 0);
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

/** Config ids the body names (`config_id`, `install_config_id`, ...), at any depth. */
function collectConfigIds(v: unknown, out: Set<string>, depth: number): void {
  if (v === null || typeof v !== 'object' || depth > 16) return;
  if (Array.isArray(v)) {
    for (const x of v) collectConfigIds(x, out, depth + 1);
    return;
  }
  for (const [k, x] of Object.entries(v)) {
    if (typeof x === 'string' && (k === 'config_id' || k.endsWith('_config_id'))) out.add(x);
    else collectConfigIds(x, out, depth + 1);
  }
}

/** A copy of `v` with hidden values and secret fields replaced by `***` (views.ts HIDDEN_VALUE). */
export function mask(v: unknown, hidden: ReadonlySet<string> | 'all'): unknown {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map((x) => mask(x, hidden));
  const out: Record<string, unknown> = {};
  for (const [k, x] of Object.entries(v)) {
    if (SECRET_FIELDS.has(k.toLowerCase())) out[k] = HIDDEN_VALUE;
    else if (k === 'input_values' && x !== null && typeof x === 'object' && !Array.isArray(x)) {
      const values: Record<string, unknown> = {};
      for (const [name, value] of Object.entries(x))
        values[name] = hidden === 'all' || hidden.has(name) ? HIDDEN_VALUE : mask(value, hidden);
      out[k] = values;
    } else if (k === 'inputs' && Array.isArray(x)) {
      out[k] = x.map((input) => {
        const i = mask(input, hidden) as Record<string, unknown> | unknown;
        if (i === null || typeof i !== 'object' || Array.isArray(i) || !('default' in i)) return i;
        const d = i as Record<string, unknown>;
        return hidden === 'all' || d.hidden === true ? { ...d, default: HIDDEN_VALUE } : d;
      });
    } else out[k] = mask(x, hidden);
  }
  return out;
}
