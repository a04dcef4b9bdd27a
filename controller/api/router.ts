/**
 * A small method + path router for the API: templates like `/v1/nodes/:node/metadata`, each
 * with its rule (who may call it: checked after the one certificate check, and for operators by
 * the access policy, docs/access.md), its rate class and body limit. A route is declared with its
 * rule in one place, its spec: a route without one does not compile, and the route-table test
 * (test/controller/access-routes.test.ts) fails for a route it has no row for.
 */
import type { CertIdentity } from '../../certs/identity.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Verb } from '../../protocol/access.js';
import type { RequestAccess, TargetRef, TargetSpec } from '../access/access.js';

/** What a rule may read to find a request's targets: its path parameters, query and (unchecked) body. */
export interface RuleInput {
  params: Record<string, string>;
  query: URLSearchParams;
  body: unknown;
}

/**
 * Who may call a route: `any` valid identity; the `agent` of the node in the path; any
 * `operator` (`verb: null`, no grant needed: whoami, can-i); or an operator whose grants hold
 * `verb` over the route's targets (protocol/access.ts, controller/access/access.ts TargetSpec).
 */
export type RouteRule =
  | { caller: 'any' }
  | { caller: 'agent' }
  | { caller: 'operator'; verb: null }
  | { caller: 'operator'; verb: Verb; targets: TargetSpec | ((c: RuleInput) => TargetRef[]) };

/** `enroll`: `POST /v1/enroll`, limited per source address (it has no identity). */
export type RateClass = 'announce' | 'fetch' | 'signal' | 'output' | 'enroll' | 'other';

export interface RouteContext {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  identity: CertIdentity;
  /** The parsed JSON body, or undefined when there was none. */
  body: unknown;
  /** An operator route's access (its grants, what it may see); undefined on agent and `any` routes. */
  access: RequestAccess | undefined;
}

/** A JSON reply; a handler that wrote the response itself returns `undefined`. */
export interface Reply {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
  /** A non-JSON body, sent as is with its content type (e.g. the Prometheus text). */
  raw?: { contentType: string; data: string | Buffer };
}

export interface RouteSpec {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  path: string;
  rule: RouteRule;
  rate: RateClass;
  /** Largest body accepted; 0 for routes that take none. */
  bodyLimitBytes: number;
  handler: (ctx: RouteContext) => Reply | undefined | Promise<Reply | undefined>;
}

interface CompiledRoute extends RouteSpec {
  re: RegExp;
  keys: string[];
}

export type RouteMatch =
  | { kind: 'found'; route: RouteSpec; params: Record<string, string> }
  | { kind: 'method'; allowed: string[] }
  | { kind: 'none' };

export class Router {
  readonly #routes: CompiledRoute[] = [];

  add(spec: RouteSpec): this {
    const keys: string[] = [];
    const re = new RegExp(
      '^' +
        spec.path
          .split('/')
          .map((seg) => {
            if (!seg.startsWith(':')) return seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
            keys.push(seg.slice(1));
            return '([^/]+)';
          })
          .join('/') +
        '$',
    );
    this.#routes.push({ ...spec, re, keys });
    return this;
  }

  /** Every route, in the order added. */
  routes(): readonly RouteSpec[] {
    return this.#routes;
  }

  match(method: string, path: string): RouteMatch {
    const allowed: string[] = [];
    for (const r of this.#routes) {
      const m = r.re.exec(path);
      if (!m) continue;
      if (r.method !== method) {
        allowed.push(r.method);
        continue;
      }
      const params: Record<string, string> = {};
      let ok = true;
      r.keys.forEach((k, i) => {
        try {
          params[k] = decodeURIComponent(m[i + 1]!);
        } catch {
          ok = false;
        }
      });
      if (!ok) return { kind: 'none' };
      return { kind: 'found', route: r, params };
    }
    return allowed.length > 0 ? { kind: 'method', allowed } : { kind: 'none' };
  }
}
