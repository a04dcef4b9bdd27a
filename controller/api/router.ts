/**
 * A small method + path router for the API: templates like `/v1/nodes/:node/metadata`, each
 * with who may call it (checked after the one certificate check), its rate class and body limit.
 */
import type { CertIdentity } from '../../certs/identity.js';
import type { IncomingMessage, ServerResponse } from 'node:http';

export type RouteAuth = 'any' | 'agent' | 'operator';
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
  auth: RouteAuth;
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
