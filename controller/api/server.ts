/**
 * The controller's HTTPS API (docs/api.md) on node:https, TLS 1.3 with a client certificate
 * requested on every connection. Per request, in this order: one authorization of the peer
 * certificate (`authorizePeer`: chain, dates, revocation, a Herald identity), routing, the
 * route's role check (agent routes only for the node in the path, operator routes only for
 * operators), the identity's rate limit, the body (size counted while reading, JSON only),
 * for an operator the access policy (the route's rule: its verb over what the request targets,
 * docs/access.md; the grants read on every request), then the handler. Errors become a status and `{"error":{code,message,field?}}` at one edge;
 * anything unexpected is logged with its stack and answered 500 `internal` without detail. The
 * answers to an agent's fetch and signal are the service's (controller/service/agent-answers.ts,
 * which answers the same requests arriving on a push connection); this module writes them in HTTP.
 */
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type tls from 'node:tls';
import type { Logger } from 'pino';
import {
  authorizePeer,
  revokedSerialOf,
  sessionIdContextOf,
  tlsServerOptions,
  watchServer,
  type AuthorizeResult,
  type PkiMaterial,
} from '../../certs/tls.js';
import type { CertIdentity } from '../../certs/identity.js';
import type { TicketKey } from '../../certs/ticket-key.js';
import { ERROR_CODES, HeraldError, type ErrorCode } from '../../protocol/errors.js';
import type { Verb } from '../../protocol/access.js';
import { ROLES } from '../../protocol/identity.js';
import {
  API_HEADERS_TIMEOUT_MS,
  API_AGENT_MAX_CONNECTIONS,
  API_IDENTITY_MAX_CONNECTIONS,
  API_KEEP_ALIVE_TIMEOUT_MS,
  API_LISTEN_BACKLOG_CONNECTIONS,
  API_RATE_LIMITED_BEFORE_CLOSE_REQUESTS,
  STORE_UNAVAILABLE_RETRY_AFTER_S,
  API_REQUEST_TIMEOUT_MS,
  API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS,
  API_UNAUTHENTICATED_HEADERS_DEADLINE_MS,
  API_UNAUTHENTICATED_MAX_CONNECTIONS,
  API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS,
  CONTROLLER_SHUTDOWN_GRACE_MS,
  MAX_ENROLL_BODY_BYTES,
  MAX_REQUEST_BODY_BYTES,
  MAX_SIGNAL_BODY_BYTES,
  MAX_SSE_BUFFERED_BYTES,
  AUDIT_PAGE_ENTRIES,
  SSE_HEARTBEAT_INTERVAL_MS,
  TLS_SESSION_LIFETIME_S,
  ACCESS_STREAM_REFRESH_MS,
} from '../../protocol/limits.js';
import { peerNetworks } from '../../protocol/address.js';
import { isValidNonce, NONCE_HEADER, SIGNATURE_HEADER } from '../../protocol/metadata.js';
import { abandoned } from './abandoned.js';
import { ConnectionAdmission } from '../admission.js';
import { statusOf } from '../error-status.js';
import { RefusalLog } from '../refusal-log.js';
import { SIGNAL_ROUTE, type AgentAnswers } from '../service/agent-answers.js';
import { EnrollmentRefused, RenewalTooSoon, type Enrollment } from '../service/enrollment.js';
import type { IdentityFloors } from '../service/identity-floors.js';
import type { ControllerEvent } from '../service/events.js';
import type { ControllerMetrics } from '../metrics.js';
import type { AuditRecord } from '../model/records.js';
import { apiRateLimiters, type ApiRateLimiters } from './rate-limit.js';
import {
  Router,
  type RateClass,
  type Reply,
  type RouteContext,
  type RouteRule,
  type RouteSpec,
  type RuleInput,
} from './router.js';
import { AccessRefused, type AccessControl, type RequestAccess, type TargetRef } from '../access/access.js';
import { filterMetricsText, StreamScope } from '../access/stream.js';
import type { ControllerService } from '../service/service.js';
import type { ClusterView } from '../../protocol/rest.js';
import type { AuditedRequest, AuditRequests, RequestOutcome } from '../service/audit-requests.js';

export interface ApiServerOptions {
  service: ControllerService;
  /** Who may do what (docs/access.md): every operator route asks it. */
  access: AccessControl;
  /** The answers to an agent's fetch and signal, shared with its push connection. */
  answers: AgentAnswers;
  material: PkiMaterial;
  logger: Logger;
  metrics: ControllerMetrics;
  now?: () => number;
  /**
   * The per-identity rate limits (default `apiRateLimiters()`); the `fetch` and `signal` ones are
   * the buckets `answers` takes from for the push connection.
   */
  limiters?: ApiRateLimiters;
  /** Overrides of the body limits (tests). */
  bodyLimits?: { requestBytes?: number; signalBytes?: number };
  /** Join tokens, `POST /v1/enroll` and renewal (docs/adding-nodes.md); absent: those routes answer `enrollment_disabled`. */
  enrollment?: Enrollment | undefined;
  /** Node revocation (`POST /v1/nodes/{id}/revoke`) and superseded certificates; absent: that route answers `not_found`. */
  floors?: IdentityFloors | undefined;
  /**
   * The TLS session-ticket key (certs/ticket-key.ts), so tickets survive a restart; followed
   * when it rotates. Absent: Node's random per-process key.
   */
  ticketKey?: TicketKey | undefined;
  /** Override of API_UNAUTHENTICATED_HEADERS_DEADLINE_MS (tests). */
  unauthenticatedHeadersDeadlineMs?: number;
  /** The audit row of every request that asks for a change (docs/access.md "Audit trail"); absent: none. */
  audit?: AuditRequests | undefined;
}

/** The one route served without a client certificate (docs/adding-nodes.md). */
export const ENROLL_PATH = '/v1/enroll';

interface AuthCacheEntry {
  epoch: number;
  result: AuthorizeResult;
}

class ApiError extends HeraldError {
  readonly headers: Record<string, string>;
  constructor(code: ErrorCode, message: string | undefined, headers: Record<string, string> = {}) {
    super(code, message);
    this.headers = headers;
  }
}

/** The caller is the agent of the route's `:node`. */
function isOwnAgent(params: Record<string, string>, id: CertIdentity): boolean {
  return id.role === 'agent' && params.node === id.name;
}

export class ApiServer {
  readonly server: https.Server;
  readonly #o: ApiServerOptions;
  readonly #log: Logger;
  readonly #now: () => number;
  readonly #router = new Router();
  /** Per route class; `enrollNetwork` counts enrolment attempts per source network (`enroll` per address). */
  readonly #limiters: ApiRateLimiters;
  readonly #auth = new WeakMap<tls.TLSSocket, AuthCacheEntry>();
  readonly #sockets = new Set<tls.TLSSocket>();
  /** Open connections per identity, and the connections past its role's cap. */
  readonly #connections = new Map<string, number>();
  readonly #overLimit = new WeakSet<tls.TLSSocket>();
  /** Open connections whose certificate did not authorize: admitted per pool, address and network. */
  readonly #preAuth = new ConnectionAdmission({
    total: API_UNAUTHENTICATED_MAX_CONNECTIONS,
    perHost: API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS,
    perNetwork: API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS,
  });
  /**
   * Per admitted pre-authentication connection: the deadline timer of its request's headers
   * (cleared when they are complete), and its one request once it has begun.
   */
  readonly #preAuthSockets = new WeakMap<tls.TLSSocket, { deadline: NodeJS.Timeout; first?: http.ServerResponse }>();
  /** Consecutive 429 answers per connection. */
  readonly #rateLimited = new WeakMap<tls.TLSSocket, number>();
  /** Refusals anyone can cause in bulk are logged as a summary (docs/api.md). */
  readonly #refusals: RefusalLog;
  readonly #streams = new Set<http.ServerResponse>();
  readonly #controllerId: string;
  #epoch = 0;
  #unwatch: () => void;
  #onRevoked: () => void;
  #onTls: () => void;
  #onTicketKey: (key: Buffer) => void;
  #closing: Promise<void> | undefined;

  constructor(o: ApiServerOptions) {
    this.#o = o;
    this.#log = o.logger;
    this.#now = o.now ?? Date.now;
    this.#limiters = o.limiters ?? apiRateLimiters({}, this.#now);
    this.#controllerId = o.material.current().identity.spiffeId;
    this.#refusals = new RefusalLog(this.#log, this.#now);
    // session resumption: tickets live TLS_SESSION_LIFETIME_S, no longer than their
    // key, and are bound to this controller's API by the session id context (Node's default is
    // a hash of argv, so a restart with other flags would resume nothing); every resumed
    // connection is authorized again like a full one (`authorizePeer`)
    const resumption = (): tls.SecureContextOptions => ({
      sessionTimeout: TLS_SESSION_LIFETIME_S,
      sessionIdContext: sessionIdContextOf(this.#controllerId),
      ...(o.ticketKey ? { ticketKeys: o.ticketKey.current() } : {}),
    });
    this.server = https.createServer(
      { ...tlsServerOptions(o.material), ...resumption(), handshakeTimeout: API_HEADERS_TIMEOUT_MS },
      (req, res) => {
        void this.#handle(req, res);
      },
    );
    // long keep-alive: an agent's polls and wake-up fetches reuse one connection (README "Scale")
    this.server.keepAliveTimeout = API_KEEP_ALIVE_TIMEOUT_MS;
    this.server.headersTimeout = API_HEADERS_TIMEOUT_MS;
    this.server.requestTimeout = API_REQUEST_TIMEOUT_MS;
    // before the HTTP server's own listener (added by https.createServer): a connection refused
    // here is destroyed before the HTTP parser is given its socket, so no byte of a request on it
    // is read and no handler runs whose answer could not be sent (an enrolment spending its token)
    this.server.prependListener('secureConnection', (s: tls.TLSSocket) => {
      this.#sockets.add(s);
      s.once('close', () => this.#sockets.delete(s));
      this.#countConnection(s);
    });
    this.server.on('tlsClientError', (err, s) => {
      this.#o.metrics.refusals.inc({ code: 'tls_handshake_failed' });
      this.#refusals.record('tls_handshake_failed', {
        remote: s.remoteAddress,
        err: (err as { code?: string }).code ?? err.message.slice(0, 120),
      });
    });
    this.#unwatch = watchServer(this.server, o.material, resumption);
    this.#onTicketKey = (key) => this.server.setTicketKeys(key);
    o.ticketKey?.on('rotate', this.#onTicketKey);
    this.#onTls = () => {
      this.#epoch++;
    };
    this.#onRevoked = () => {
      this.#epoch++;
      // a live connection of a revoked certificate (or of one under a revoked issuer) is closed,
      // not only refused at its next request
      for (const s of this.#sockets) {
        const serial = revokedSerialOf(s.getPeerCertificate(true), o.material);
        if (serial) {
          this.#log.warn({ code: 'revoked', serial }, 'closing a connection whose certificate was revoked');
          s.destroy();
        }
      }
    };
    o.material.on('tls-change', this.#onTls);
    o.material.on('revoked-change', this.#onRevoked);
    this.#routes();
  }

  /** Every route with its rule (docs/api.md; test/controller/access-routes.test.ts reads them). */
  routes(): readonly RouteSpec[] {
    return this.#router.routes();
  }

  /** Listens on host:port (0: any free port) and resolves with the bound address. */
  listen(port: number, host: string): Promise<AddressInfo> {
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => reject(err);
      this.server.once('error', onError);
      this.server.listen({ port, host, backlog: API_LISTEN_BACKLOG_CONNECTIONS }, () => {
        this.server.off('error', onError);
        resolve(this.server.address() as AddressInfo);
      });
    });
  }

  /**
   * Stops accepting, ends event streams, lets in-flight requests finish (at most `graceMs`),
   * then destroys what is left. Idempotent.
   */
  close(graceMs = CONTROLLER_SHUTDOWN_GRACE_MS): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closing = new Promise<void>((resolve) => {
      this.#unwatch();
      this.#o.ticketKey?.off('rotate', this.#onTicketKey);
      this.#o.material.off('tls-change', this.#onTls);
      this.#o.material.off('revoked-change', this.#onRevoked);
      this.#refusals.close();
      for (const res of this.#streams) res.end();
      const timer = setTimeout(() => this.server.closeAllConnections(), graceMs);
      timer.unref();
      this.server.close(() => {
        clearTimeout(timer);
        resolve();
      });
      this.server.closeIdleConnections();
    });
    return this.#closing;
  }

  // ---- the request pipeline ----------------------------------------------------------------

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    res.setHeader('Cache-Control', 'no-store');
    res.setHeader('X-Content-Type-Options', 'nosniff');
    const method = req.method ?? 'GET';
    let route = 'unmatched';
    let identity: CertIdentity | undefined;
    /** A request asking for a change, once routed: its audit row is written before the answer, whatever it is. */
    let audited: AuditedRequest | undefined;
    res.once('finish', () => this.#o.metrics.apiRequests.inc({ route, method, status: String(res.statusCode) }));
    const socket = req.socket as tls.TLSSocket;
    const preAuth = this.#preAuthSockets.get(socket);
    if (preAuth !== undefined) {
      if (!this.#firstPreAuthRequest(socket, preAuth, res)) return;
      res.setHeader('Connection', 'close');
    }
    // the one route without a client certificate; every other request is authorized first
    if (method === 'POST' && (req.url ?? '').split('?')[0] === ENROLL_PATH) {
      route = ENROLL_PATH;
      return this.#enroll(req, res);
    }
    try {
      const auth = this.#authorize(req.socket as tls.TLSSocket);
      if (!auth.ok) throw new ApiError(auth.code, auth.message, { Connection: 'close' });
      identity = auth.identity;
      if (this.#overLimit.has(req.socket as tls.TLSSocket)) {
        const cap = identity.role === 'agent' ? API_AGENT_MAX_CONNECTIONS : API_IDENTITY_MAX_CONNECTIONS;
        throw new ApiError('too_many_connections', `${identity.spiffeId} already holds ${cap} API connections`, {
          Connection: 'close',
          'Retry-After': '1',
        });
      }
      const url = new URL(req.url ?? '/', 'https://controller.invalid');
      const m = this.#router.match(method, url.pathname);
      if (m.kind === 'none') throw new ApiError('not_found', `no route ${method} ${url.pathname}`);
      if (m.kind === 'method')
        throw new ApiError('method_not_allowed', `${method} is not allowed here`, { Allow: m.allowed.join(', ') });
      const spec = m.route;
      route = spec.path;
      // the rate limit comes before the role check: refusals cost the caller its budget too
      if (!this.#exempt(spec.rate, m.params, identity)) {
        const decision = this.#limiters[spec.rate].take(identity.spiffeId);
        if (!decision.ok)
          throw new ApiError('rate_limited', `too many requests; retry after ${decision.retryAfterS} s`, {
            'Retry-After': String(decision.retryAfterS),
          });
      }
      // every change asked of a route people call is recorded with its outcome, refusals included
      // (a rate-limited request is not: the limit bounds what anyone can have written)
      if (this.#o.audit && spec.rule.caller !== 'agent' && method !== 'GET' && method !== 'HEAD')
        audited = {
          who: identity.spiffeId,
          method,
          route: spec.path,
          path: url.pathname,
          query: url.search.slice(1),
          body: undefined,
        };
      this.#checkRole(spec, m.params, identity);
      // a controller whose own certificate is revoked or expired changes nothing (standing.ts):
      // every request that could write is refused here, before its body is read
      if (method !== 'GET' && method !== 'HEAD') {
        const lost = this.#o.service.standingRefusal();
        if (lost !== undefined) throw lost;
      }
      const body =
        spec.bodyLimitBytes > 0 ? await this.#readJson(req, spec.bodyLimitBytes) : await this.#drainEmpty(req);
      if (audited) audited.body = body;
      this.#rateLimited.delete(req.socket as tls.TLSSocket);
      const access = await this.#access(spec.rule, identity, { params: m.params, query: url.searchParams, body });
      if (abandoned(req, route, this.#log)) return;
      const reply = await spec.handler({ req, res, params: m.params, query: url.searchParams, identity, body, access });
      if (audited)
        await this.#o.audit?.record(audited, {
          status: reply?.status ?? res.statusCode,
          location: reply?.headers?.Location,
        });
      if (reply?.raw) {
        const data = Buffer.from(reply.raw.data);
        res.writeHead(reply.status, {
          ...reply.headers,
          'Content-Type': reply.raw.contentType,
          'Content-Length': String(data.length),
        });
        res.end(data);
      } else if (reply) {
        this.#send(res, reply.status, reply.body, reply.headers);
      }
    } catch (err) {
      if (audited) await this.#o.audit?.record(audited, refusalOf(err));
      this.#fail(req, res, err, route, identity);
    }
  }

  /**
   * `POST /v1/enroll` (docs/adding-nodes.md): limited per source address and per source network before
   * anything is read (peerNetworks: an IPv6 host can pick any address of its /64); every
   * failure but the rate limit (and a controller without an issuer) is `enrollment_refused`,
   * its real reason logged once by Enrollment. The connection is closed after the answer: a
   * peer without a certificate has nothing else to ask.
   */
  async #enroll(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const remote = req.socket.remoteAddress ?? '?';
    try {
      const { host, network } = peerNetworks(remote);
      const one = this.#limiters.enroll.take(host);
      const d = one.ok ? this.#limiters.enrollNetwork.take(network) : one;
      if (!d.ok)
        throw new ApiError('rate_limited', `too many enrolment attempts; retry after ${d.retryAfterS} s`, {
          'Retry-After': String(d.retryAfterS),
          Connection: 'close',
        });
      const enrollment = this.#o.enrollment;
      if (!enrollment?.enabled) throw new HeraldError('enrollment_disabled', ERROR_CODES.enrollment_disabled);
      let body: unknown;
      try {
        body = await this.#readJson(req, MAX_ENROLL_BODY_BYTES);
      } catch (err) {
        throw new EnrollmentRefused('malformed', `unreadable body: ${codeOfErr(err)}`, { remote });
      }
      if (abandoned(req, ENROLL_PATH, this.#log)) return;
      const bundle = await enrollment.enroll(body, remote);
      this.#send(res, 200, bundle, { Connection: 'close' });
    } catch (err) {
      this.#fail(req, res, err, ENROLL_PATH, undefined);
    }
  }

  /**
   * A connection without a valid certificate runs exactly one request. Its headers are complete,
   * so its deadline ends (the request timeouts bound the rest: a handler that takes a while must
   * not be cut off with its answer unsent), and its answer closes it. Node starts a pipelined
   * request as soon as it is parsed, and only the first answer goes out on a closed connection:
   * a second request is not run (an enrolment would spend its token for an answer never sent);
   * the connection is destroyed once the first answer is out (at once if it is). False: not run.
   */
  #firstPreAuthRequest(
    socket: tls.TLSSocket,
    state: { deadline: NodeJS.Timeout; first?: http.ServerResponse },
    res: http.ServerResponse,
  ): boolean {
    clearTimeout(state.deadline);
    const first = state.first;
    if (first === undefined) {
      state.first = res;
      return true;
    }
    this.#o.metrics.refusals.inc({ code: 'pipelined_request' });
    this.#refusals.record('pipelined_request', { remote: socket.remoteAddress, unauthenticated: true });
    if (first.writableFinished || socket.destroyed) socket.destroy();
    else first.once('close', () => socket.destroy());
    return false;
  }

  /**
   * One connection policy for every identity (docs/api.md): connections are kept alive for minutes
   * (API_KEEP_ALIVE_TIMEOUT_MS), so each identity holds at most its role's cap
   * (API_AGENT_MAX_CONNECTIONS for agents, API_IDENTITY_MAX_CONNECTIONS otherwise); requests on
   * more are refused `too_many_connections` and the connection closed. Peers whose certificate
   * did not authorize get one answer (enrolment, else 403) and are closed; they are admitted at
   * the handshake (controller/admission.ts: at most API_UNAUTHENTICATED_MAX_CONNECTIONS in all,
   * API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS per host, API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS
   * per network), further ones destroyed before a byte of their request is read, and one whose
   * request's headers are not complete API_UNAUTHENTICATED_HEADERS_DEADLINE_MS after its
   * handshake is closed (`headers_timeout`).
   */
  #countConnection(s: tls.TLSSocket): void {
    const auth = this.#authorize(s);
    if (!auth.ok) {
      const remote = s.remoteAddress ?? '?';
      const admitted = this.#preAuth.admit(remote);
      if (!admitted.ok) {
        this.#o.metrics.refusals.inc({ code: 'too_many_connections' });
        this.#refusals.record('too_many_connections', { remote, unauthenticated: true, scope: admitted.scope });
        s.destroy();
        return;
      }
      // a fixed deadline from now, not an inactivity timer: a peer trickling its headers a byte
      // at a time keeps an inactivity timer from ever firing, and holds its place until Node's
      // headersTimeout (checked only every 30 s)
      const deadline = setTimeout(() => {
        this.#o.metrics.refusals.inc({ code: 'headers_timeout' });
        this.#refusals.record('headers_timeout', { remote, unauthenticated: true });
        s.destroy();
      }, this.#o.unauthenticatedHeadersDeadlineMs ?? API_UNAUTHENTICATED_HEADERS_DEADLINE_MS);
      deadline.unref();
      this.#preAuthSockets.set(s, { deadline });
      s.once('close', () => {
        clearTimeout(deadline);
        admitted.release();
      });
      return;
    }
    const id = auth.identity.spiffeId;
    const cap = auth.identity.role === 'agent' ? API_AGENT_MAX_CONNECTIONS : API_IDENTITY_MAX_CONNECTIONS;
    const n = (this.#connections.get(id) ?? 0) + 1;
    this.#connections.set(id, n);
    if (n > cap) this.#overLimit.add(s);
    s.once('close', () => {
      const left = (this.#connections.get(id) ?? 1) - 1;
      if (left <= 0) this.#connections.delete(id);
      else this.#connections.set(id, left);
    });
  }

  #authorize(socket: tls.TLSSocket): AuthorizeResult {
    const hit = this.#auth.get(socket);
    if (hit && hit.epoch === this.#epoch && (!hit.result.ok || hit.result.identity.validTo.getTime() >= this.#now()))
      return hit.result;
    // a resumed session is authorized like a full one (certs/tls.ts `authorizePeer`): any role may
    // resume, as Node's HTTPS clients do by default (a 403 for it broke ordinary operator clients)
    const result = authorizePeer(socket, ROLES, this.#o.material);
    this.#auth.set(socket, { epoch: this.#epoch, result });
    // the first use of a renewed certificate retires the one it renewed (identity-floors.ts)
    if (result.ok) this.#o.floors?.used(result.identity);
    return result;
  }

  /**
   * What the controller itself asked for is not rate-limited: a fetch answering a wake-up it sent
   * that node lately (docs/api.md), and a node's signal of work a wake-up gave it and that work's last
   * live output chunks (credits per wake-up: controller/service/wake-credits.ts, docs/departures.md). The
   * limit bounds what an agent asks for and sends by itself.
   */
  #exempt(rate: RateClass, params: Record<string, string>, id: CertIdentity): boolean {
    if (rate === 'fetch') return this.#o.service.wokeRecently(id.name);
    if (rate === 'signal' || rate === 'output')
      return isOwnAgent(params, id) && this.#o.service.takeWakeCredit(id.name, rate);
    return false;
  }

  /**
   * An operator route's access policy (docs/access.md): its verb over what the request targets,
   * decided on the grants read now, so a change made through any controller holds from this
   * request on. @throws AccessRefused `forbidden` | `out_of_scope`
   */
  async #access(rule: RouteRule, identity: CertIdentity, input: RuleInput): Promise<RequestAccess | undefined> {
    if (rule.caller !== 'operator') return undefined;
    if (rule.verb === null) return this.#o.access.anyOperator(identity);
    const targets = typeof rule.targets === 'function' ? rule.targets(input) : rule.targets;
    return this.#o.access.authorize(identity, rule.verb, targets);
  }

  #checkRole(spec: RouteSpec, params: Record<string, string>, id: CertIdentity): void {
    if (spec.rule.caller === 'any') return;
    if (spec.rule.caller === 'operator') {
      if (id.role !== 'operator')
        throw new ApiError('wrong_role', `an operator certificate is required, not a ${id.role} one`);
      return;
    }
    if (isOwnAgent(params, id)) return;
    if (id.role !== 'agent')
      throw new ApiError('wrong_role', `only the node's agent may use this route, not the ${id.role} role`);
    throw new ApiError('wrong_node', `agent ${id.name} may only use its own node's routes`);
  }

  /** Reads a JSON body of at most `limit` bytes (undefined when empty). */
  #readJson(req: http.IncomingMessage, limit: number): Promise<unknown> {
    const declared = req.headers['content-length'];
    if (declared !== undefined && Number(declared) > limit) {
      req.resume(); // discard it: the client may still be sending
      return Promise.reject(new ApiError('body_too_large', `the body is over ${limit} bytes`, { Connection: 'close' }));
    }
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let total = 0;
      let done = false;
      const onData = (c: Buffer): void => {
        if (done) return;
        total += c.length;
        if (total > limit) {
          done = true;
          chunks.length = 0;
          reject(new ApiError('body_too_large', `the body is over ${limit} bytes`, { Connection: 'close' }));
          return;
        }
        chunks.push(c);
      };
      req.on('data', onData);
      req.once('error', (err) => {
        if (!done) {
          done = true;
          reject(err);
        }
      });
      req.once('end', () => {
        if (done) return;
        done = true;
        if (total === 0) return resolve(undefined);
        const type = req.headers['content-type'] ?? '';
        if (!/^application\/([a-z0-9.+-]*\+)?json\s*(;|$)/i.test(type)) {
          return reject(new ApiError('unsupported_media_type', 'the body must be application/json'));
        }
        try {
          resolve(JSON.parse(Buffer.concat(chunks, total).toString('utf8')));
        } catch {
          reject(new ApiError('invalid_json', 'the body is not valid JSON'));
        }
      });
    });
  }

  /** Routes without a body still read (and discard) whatever came, up to the request limit. */
  #drainEmpty(req: http.IncomingMessage): Promise<unknown> {
    if (req.headers['content-length'] === undefined && req.headers['transfer-encoding'] === undefined)
      return Promise.resolve(undefined);
    return this.#readJson(req, MAX_REQUEST_BODY_BYTES).then(() => undefined);
  }

  #send(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
    if (body === undefined) {
      res.writeHead(status);
      res.end();
      return;
    }
    const data = Buffer.from(JSON.stringify(body), 'utf8');
    res.writeHead(status, { 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': String(data.length) });
    res.end(data);
  }

  /** The one error edge. */
  #fail(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    err: unknown,
    route: string,
    identity: CertIdentity | undefined,
  ): void {
    const peer = identity?.spiffeId ?? peerHint(req.socket as tls.TLSSocket);
    let code: ErrorCode = 'internal';
    let message: string = ERROR_CODES.internal;
    let field: string | undefined;
    let headers: Record<string, string> = {};
    if (err instanceof HeraldError && err.code !== 'internal') {
      code = err.code;
      message = err.message;
      field = err.field;
      if (err instanceof ApiError) headers = { ...err.headers };
      if (err instanceof RenewalTooSoon) headers['Retry-After'] = String(err.retryAfterS);
      this.#o.metrics.refusals.inc({ code });
      const status = statusOf(code);
      const socket = req.socket as tls.TLSSocket;
      // a 403 closes its connection (the policy's do not: the identity is sound, and a grant may
      // come while the connection lives); so do repeated 429s (one does not: the retry reuses it)
      if (status === 403 && !(err instanceof AccessRefused)) headers.Connection = 'close';
      if (code === 'store_unavailable') {
        // the database's own words stay in the log
        message = ERROR_CODES.store_unavailable;
        headers['Retry-After'] = String(STORE_UNAVAILABLE_RETRY_AFTER_S);
      }
      if (code === 'rate_limited') {
        const n = (this.#rateLimited.get(socket) ?? 0) + 1;
        this.#rateLimited.set(socket, n);
        if (n >= API_RATE_LIMITED_BEFORE_CLOSE_REQUESTS) headers.Connection = 'close';
      }
      this.#refusals.refused(
        code,
        message,
        { status, peer, method: req.method ?? '', route, field },
        identity?.spiffeId,
        // an enrolment's real reason, summarised per kind of reason (never per peer); the policy's
        // rule, per identity, route and rule
        err instanceof EnrollmentRefused
          ? {
              key: `${code} ${err.kind}`,
              fields: { event: 'enroll.refused', reason: err.reason, kind: err.kind, ...err.fields },
            }
          : err instanceof AccessRefused
            ? {
                key: `${code} ${identity?.spiffeId ?? ''} ${req.method ?? ''} ${route} ${err.rule}`,
                fields: { event: 'access.refused', rule: err.rule, verb: err.verb },
              }
            : undefined,
      );
    } else {
      this.#log.error({ err, peer, method: req.method, route }, 'request failed unexpectedly');
    }
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const status = code === 'internal' ? 500 : statusOf(code);
    const send = (): void =>
      this.#send(res, status, { error: { code, message, ...(field !== undefined ? { field } : {}) } }, headers);
    if (headers.Connection === 'close' && !req.complete) afterBody(req, send);
    else send();
  }

  // ---- routes ------------------------------------------------------------------------------

  #routes(): void {
    const s = this.#o.service;
    const access = this.#o.access;
    const reqLimit = this.#o.bodyLimits?.requestBytes ?? MAX_REQUEST_BODY_BYTES;
    const sigLimit = this.#o.bodyLimits?.signalBytes ?? MAX_SIGNAL_BODY_BYTES;
    const who = (c: RouteContext): string => c.identity.spiffeId;
    const ok = (body: unknown): Reply => ({ status: 200, body });
    const created = (body: Record<string, unknown>, location: string): Reply => ({
      status: 201,
      body,
      headers: { Location: location },
    });
    const items = (list: unknown[]): Reply => ok({ items: list });
    const add = (
      method: RouteSpec['method'],
      path: string,
      rule: RouteRule,
      handler: RouteSpec['handler'],
      extra: Partial<RouteSpec> = {},
    ): void => {
      const needsBody = method === 'POST' || method === 'PUT' || method === 'PATCH';
      this.#router.add({
        method,
        path,
        rule,
        rate: 'other',
        bodyLimitBytes: needsBody ? reqLimit : 0,
        handler,
        ...extra,
      });
    };
    // the rules (docs/access.md): who may call, and for an operator the verb and its targets
    const ANY: RouteRule = { caller: 'any' };
    const AGENT: RouteRule = { caller: 'agent' };
    const ANY_OPERATOR: RouteRule = { caller: 'operator', verb: null };
    const op = (verb: Verb, targets: Extract<RouteRule, { verb: Verb }>['targets']): RouteRule => ({
      caller: 'operator',
      verb,
      targets,
    });
    const param =
      (kind: 'node' | 'deployment' | 'cluster' | 'token', name = 'id') =>
      (c: RuleInput): TargetRef[] => [{ [kind]: c.params[name]! } as TargetRef];
    const nodegroup = (c: RuleInput): TargetRef[] => [{ nodegroup: { cluster: c.params.id!, name: c.params.name! } }];
    /** The request's access: set on every operator route (RouteRule). */
    const accessOf = (c: RouteContext): RequestAccess => c.access!;
    /** Hidden outputs show to a reader who may deploy to the node. */
    const reveal = (c: RouteContext) => (node: string) => accessOf(c).reveals(node);

    // the API listens before the service starts (its URL, with port 0, is known only then): a
    // probe must not count the controller in before it has its nodes and has joined the fleet
    add('GET', '/healthz', ANY, () => healthReply(s.phase));

    // agent routes
    add(
      'PUT',
      '/v1/nodes/:node/endpoint',
      AGENT,
      async (c) => {
        const node = await s.announce(c.params.node!, c.body, c.identity);
        // the certificate's dates, for the node's renewal state (GET /v1/nodes/{id})
        await this.#o.enrollment?.noteSeen(c.identity).catch((err: unknown) => {
          this.#log.error({ err, node: c.params.node }, 'could not record the agent certificate');
        });
        return ok(node);
      },
      { rate: 'announce' },
    );
    add(
      'POST',
      '/v1/nodes/:node/certificate',
      AGENT,
      async (c) => {
        const enrollment = this.#o.enrollment;
        if (!enrollment) throw new HeraldError('enrollment_disabled', ERROR_CODES.enrollment_disabled);
        // the leaf alone is enough here (authorizePeer read the chain first: NODE20-NOTES)
        const leaf = (c.req.socket as tls.TLSSocket).getPeerX509Certificate();
        const currentKey = leaf ? leaf.publicKey.export({ type: 'spki', format: 'der' }) : Buffer.alloc(0);
        return ok(await enrollment.renew(c.params.node!, c.body, c.identity, currentKey));
      },
      { bodyLimitBytes: MAX_ENROLL_BODY_BYTES },
    );
    add('GET', '/v1/nodes/:node/metadata', AGENT, (c) => this.#metadata(c), { rate: 'fetch' });
    add(
      'POST',
      SIGNAL_ROUTE,
      AGENT,
      async (c) => ok(await this.#o.answers.signal(c.params.node!, c.params.deployment!, c.body, who(c))),
      {
        bodyLimitBytes: sigLimit,
        rate: 'signal',
      },
    );
    add(
      'POST',
      '/v1/nodes/:node/deployments/:deployment/output',
      AGENT,
      async (c) => ok(await s.output.post(c.params.node!, c.params.deployment!, c.body)),
      { rate: 'output' },
    );

    // operator routes: join tokens and nodes (admin, over the nodes they name)
    add(
      'POST',
      '/v1/enrollment-tokens',
      op('admin', (c) => bodyNode(c.body, 'node')),
      async (c) => {
        const enrollment = this.#o.enrollment;
        if (!enrollment) throw new HeraldError('enrollment_disabled', ERROR_CODES.enrollment_disabled);
        const t = await enrollment.createToken(c.body, who(c));
        return created({ ...t }, `/v1/enrollment-tokens/${t.id}`);
      },
    );
    add('GET', '/v1/enrollment-tokens', op('admin', 'filtered'), async (c) => {
      const seen = await accessOf(c).visibility('admin');
      const list = (await this.#o.enrollment?.listTokens()) ?? [];
      return items(list.filter((t) => seen.node(t.node)));
    });
    add('DELETE', '/v1/enrollment-tokens/:id', op('admin', param('token')), async (c) => {
      const enrollment = this.#o.enrollment;
      if (!enrollment) throw new HeraldError('not_found', `no enrollment token ${c.params.id!}`);
      return ok(await enrollment.revokeToken(c.params.id!, who(c)));
    });
    add(
      'POST',
      '/v1/nodes',
      op('admin', (c) => bodyNode(c.body, 'id').map((t) => ({ newNode: t.node, labels: bodyLabels(c.body) }))),
      async (c) => {
        const n = await s.createNode(c.body, who(c));
        return created(n, `/v1/nodes/${encodeURIComponent(String(n.id))}`);
      },
    );
    add('GET', '/v1/nodes', op('read', 'filtered'), async (c) => {
      const seen = await accessOf(c).visibility('read');
      return items((await s.listNodes()).filter((n) => seen.node(String(n.id))));
    });
    add('GET', '/v1/controllers', op('read', 'unscoped'), async () => items(await s.listControllers()));
    add('GET', '/v1/nodes/:id', op('read', param('node')), async (c) => {
      const node = await s.getNode(c.params.id!);
      const certificate = (await this.#o.enrollment?.nodeCertificate(c.params.id!)) ?? null;
      return ok({ ...node, certificate });
    });
    add(
      'PATCH',
      '/v1/nodes/:id',
      // the node as it is and as it will be: labels cannot move a node into (or out of) a scope one does not hold
      op('admin', (c) => [{ node: c.params.id!, relabel: bodyLabels(c.body, true) }]),
      async (c) => ok(await s.updateNode(c.params.id!, c.body, who(c))),
    );
    add('POST', '/v1/nodes/:id/revoke', op('admin', param('node')), async (c) => {
      const floors = this.#o.floors;
      if (!floors) throw new HeraldError('not_found', 'this controller does not revoke node identities');
      return ok(await floors.revoke(c.params.id!, who(c)));
    });
    add('DELETE', '/v1/nodes/:id', op('admin', param('node')), async (c) => {
      await s.deleteNode(c.params.id!, who(c));
      return { status: 204 };
    });

    // configs: new code is an author's; reading them a viewer's (they name no node)
    add('POST', '/v1/configs', op('author', 'unscoped'), async (c) => {
      const cfg = await s.createConfig(c.body, who(c));
      return created(cfg, `/v1/configs/${String(cfg.id)}`);
    });
    add('GET', '/v1/configs', op('read', 'unscoped'), async () => items(await s.listConfigs()));
    add('GET', '/v1/configs/:id', op('read', 'unscoped'), async (c) => ok(await s.getConfig(c.params.id!)));

    // deployments: running existing configs is a deployer's, over the deployment's node
    add(
      'POST',
      '/v1/deployments',
      op('deploy', (c) => bodyNode(c.body, 'node')),
      async (c) => {
        const d = await s.createDeployment(c.body, who(c));
        return created(d, `/v1/deployments/${String(d.id)}`);
      },
    );
    add('GET', '/v1/deployments', op('read', 'filtered'), async (c) => {
      const seen = await accessOf(c).visibility('read');
      const deploy = await accessOf(c).visibility('deploy');
      return items(
        await s.listDeployments(
          c.query.get('node') ?? undefined,
          (node) => deploy.node(node),
          (node) => seen.node(node),
        ),
      );
    });
    add('GET', '/v1/deployments/:id', op('read', param('deployment')), async (c) =>
      ok(await s.getDeployment(c.params.id!, reveal(c))),
    );
    add('GET', '/v1/deployments/:id/revisions', op('read', param('deployment')), async (c) =>
      items(await s.listRevisions(c.params.id!, reveal(c))),
    );
    add('GET', '/v1/deployments/:id/output', op('read', param('deployment')), async (c) =>
      ok(await s.output.get(c.params.id!, c.query.get('revision'))),
    );
    add('PATCH', '/v1/deployments/:id', op('deploy', param('deployment')), async (c) =>
      ok(await s.updateDeployment(c.params.id!, c.body, who(c))),
    );
    add('DELETE', '/v1/deployments/:id', op('deploy', param('deployment')), async (c) => {
      const d = await s.deleteDeployment(c.params.id!, who(c));
      return d === null ? { status: 204 } : { status: 202, body: d };
    });

    // clusters: their operations are a deployer's, over every member (or the cluster or group named)
    add(
      'POST',
      '/v1/clusters',
      // each member as it is now: a selector naming this cluster does not reach nodes before they join it
      op('deploy', (c) => [
        ...bodyNodeList(c.body, 'nodes'),
        ...asList(field(c.body, 'nodegroups')).flatMap((g) => bodyNodeList(g, 'nodes')),
      ]),
      async (c) => {
        const minimal = prefersMinimal(c.req);
        const cl = await s.createCluster(c.body, who(c), minimal ? 'minimal' : 'full');
        const reply = created(cl, `/v1/clusters/${String(cl.id)}`);
        if (minimal) reply.headers = { ...reply.headers, 'Preference-Applied': 'return=minimal' };
        return reply;
      },
    );
    add('GET', '/v1/clusters', op('read', 'filtered'), async (c) => {
      const seen = await accessOf(c).visibility('read');
      const list = (await s.listClusters()) as unknown as ClusterView[];
      return items(list.filter((cl) => seen.cluster(cl)));
    });
    add('GET', '/v1/clusters/:id', op('read', param('cluster')), async (c) => ok(await s.getCluster(c.params.id!)));
    add('DELETE', '/v1/clusters/:id', op('deploy', param('cluster')), async (c) => {
      await s.deleteCluster(c.params.id!, who(c));
      try {
        return { status: 202, body: await s.getCluster(c.params.id!) };
      } catch {
        return { status: 204 }; // nothing to uninstall: removed at once
      }
    });
    add('PATCH', '/v1/clusters/:id/actions/restart', op('deploy', param('cluster')), async (c) => {
      const plan = await s.restartCluster(c.params.id!, c.body, who(c));
      return plan === null ? { status: 204 } : ok(plan); // a dry run answers its plan
    });
    add(
      'POST',
      '/v1/clusters/:id/nodegroups',
      // the cluster, and the group's nodes as they are now (they join it with this request)
      op('deploy', (c) => [{ cluster: c.params.id! }, ...bodyNodeList(c.body, 'nodes')]),
      async (c) => {
        const g = await s.addNodegroup(c.params.id!, c.body, who(c));
        return created(g, `/v1/clusters/${c.params.id!}/nodegroups/${String(g.name)}`);
      },
    );
    add('GET', '/v1/clusters/:id/nodegroups/:name', op('read', nodegroup), async (c) =>
      ok(await s.getNodegroup(c.params.id!, c.params.name!)),
    );
    add('DELETE', '/v1/clusters/:id/nodegroups/:name', op('deploy', nodegroup), async (c) => {
      await s.deleteNodegroup(c.params.id!, c.params.name!, who(c));
      return { status: 202, body: await s.getCluster(c.params.id!) };
    });
    add('PATCH', '/v1/clusters/:id/nodegroups/:name/actions/restart', op('deploy', nodegroup), async (c) => {
      const plan = await s.restartCluster(c.params.id!, c.body, who(c), c.params.name!);
      return plan === null ? { status: 204 } : ok(plan);
    });
    // rollouts: upgrades, undo, revisions, and the controls of a running restart or upgrade (docs/api.md)
    const rolled = (v: Record<string, unknown>) => (v.dry_run === true ? ok(v) : { status: 202, body: v });
    add('PATCH', '/v1/clusters/:id', op('deploy', param('cluster')), async (c) =>
      rolled(await s.upgradeCluster(c.params.id!, c.body, who(c))),
    );
    add('PATCH', '/v1/clusters/:id/nodegroups/:name', op('deploy', nodegroup), async (c) =>
      rolled(await s.upgradeCluster(c.params.id!, c.body, who(c), c.params.name!)),
    );
    add('PATCH', '/v1/clusters/:id/actions/undo', op('deploy', param('cluster')), async (c) =>
      rolled(await s.undoCluster(c.params.id!, c.body, who(c))),
    );
    for (const what of ['pause', 'resume', 'abort', 'promote'] as const)
      add('PATCH', `/v1/clusters/:id/actions/${what}`, op('deploy', param('cluster')), async (c) =>
        ok(await s.controlRollout(c.params.id!, what, who(c))),
      );
    add('GET', '/v1/clusters/:id/revisions', op('read', param('cluster')), async (c) =>
      items(await s.listClusterRevisions(c.params.id!)),
    );

    // the trail and the live views
    add('GET', '/v1/audit', op('admin', 'fleet'), async (c) => {
      if (c.query.get('format') === 'jsonl') return this.#auditExport(c);
      const limit = Math.min(1000, Math.max(1, Number(c.query.get('limit') ?? 100) || 100));
      const before = c.query.get('before');
      const beforeSeq = before === null ? undefined : Number(before);
      if (beforeSeq !== undefined && !(Number.isSafeInteger(beforeSeq) && beforeSeq > 0))
        throw new HeraldError('invalid_request', 'before must be a positive seq', { field: 'before' });
      return items((await s.store.listAudit(limit, beforeSeq)).map(auditView));
    });
    add('GET', '/v1/events', op('read', 'filtered'), (c) => this.#events(c));
    add('GET', '/metrics', op('read', 'filtered'), async (c) => {
      const m = await this.#o.metrics.text();
      const seen = await accessOf(c).visibility('read');
      const data = seen.all ? m.body : filterMetricsText(m.body, (node) => seen.node(node));
      return { status: 200, raw: { contentType: m.contentType, data } };
    });

    // who may do what (docs/access.md): anyone may ask about themselves; grants are the whole fleet's admin's
    add('GET', '/v1/access/whoami', ANY_OPERATOR, async (c) => ok(await access.whoami(c.identity)));
    add('GET', '/v1/access/can-i', ANY_OPERATOR, async (c) =>
      ok(await access.canI(c.identity, c.query.get('verb') ?? '', c.query.get('target') ?? '')),
    );
    add('GET', '/v1/access/grants', op('admin', 'fleet'), async () => items(await access.listGrants()));
    add('POST', '/v1/access/grants', op('admin', 'fleet'), async (c) => {
      const g = await access.createGrant(c.body, who(c));
      this.#log.info(
        { event: 'access.grant', grant: g.id, subject: g.subject, role: g.role, scope: g.scope, who: who(c) },
        'grant made',
      );
      return created(g, `/v1/access/grants/${encodeURIComponent(g.id)}`);
    });
    add('DELETE', '/v1/access/grants/:id', op('admin', 'fleet'), async (c) => {
      const g = await access.deleteGrant(c.params.id!, who(c));
      this.#log.info(
        { event: 'access.revoke', grant: g.id, subject: g.subject, role: g.role, who: who(c) },
        'grant revoked',
      );
      return ok(g);
    });
  }

  async #metadata(c: RouteContext): Promise<undefined> {
    const { req, res, identity } = c;
    const nonceHeader = req.headers[NONCE_HEADER];
    const nonce = Array.isArray(nonceHeader) ? nonceHeader[0] : nonceHeader;
    if (nonce !== undefined && !isValidNonce(nonce)) {
      throw new HeraldError('invalid_request', 'Herald-Nonce must be 16 to 128 base64url characters', {
        field: 'Herald-Nonce',
      });
    }
    const a = await this.#o.answers.metadata(
      c.params.node!,
      identity.spiffeId,
      nonce,
      req.headers['if-none-match'],
      'https',
    );
    res.setHeader('ETag', a.etag);
    res.setHeader(SIGNATURE_HEADER, a.signature);
    if (a.status === 304) {
      res.writeHead(304);
      res.end();
      return undefined;
    }
    res.writeHead(200, {
      'Content-Type': 'application/json; charset=utf-8',
      'Content-Length': String(a.body.length),
    });
    res.end(a.body);
    return undefined;
  }

  /**
   * `GET /v1/audit?format=jsonl` (docs/api.md): the whole trail as JSON lines, for `herald audit
   * verify --file` or any tool: a `head` line (the chain head when the export began), then
   * every row through it, oldest first, with its hashes. Streamed a page at a time, waiting
   * for the client to take each.
   */
  async #auditExport(c: RouteContext): Promise<undefined> {
    const { res } = c;
    const store = this.#o.service.store;
    const head = await store.auditHead();
    res.writeHead(200, { 'Content-Type': 'application/jsonl; charset=utf-8' });
    let open = true;
    res.once('close', () => {
      open = false;
    });
    const write = async (lines: string): Promise<void> => {
      if (res.write(lines)) return;
      await new Promise<void>((resolve) => {
        const done = (): void => {
          res.off('drain', done);
          res.off('close', done);
          resolve();
        };
        res.on('drain', done);
        res.on('close', done);
      });
    };
    await write(`${JSON.stringify({ kind: 'head', seq: head.seq, hash: head.hash })}\n`);
    for (let at = 0; open && at < head.seq; ) {
      const page = (await store.auditPage(at, AUDIT_PAGE_ENTRIES)).filter((r) => r.seq <= head.seq);
      if (page.length === 0) break;
      await write(page.map((r) => `${JSON.stringify({ kind: 'row', ...r })}\n`).join(''));
      at = page[page.length - 1]!.seq;
    }
    res.end();
    return undefined;
  }

  /**
   * The event stream (docs/api.md), showing an operator only what they may read (docs/access.md):
   * its scope is read before the stream opens, again every ACCESS_STREAM_REFRESH_MS and at once
   * when a grant changes here; a stream whose operator no longer holds read is ended.
   */
  async #events(c: RouteContext): Promise<undefined> {
    const { req, res } = c;
    let ended = false;
    const scope = new StreamScope({
      access: this.#o.access,
      store: this.#o.service.store,
      operator: c.identity.name,
      onLost: () => {
        this.#log.info(
          { event: 'access.stream_ended', peer: c.identity.spiffeId },
          'event stream ended: its operator no longer holds read',
        );
        res.end();
      },
    });
    await scope.refresh();
    if (res.destroyed || res.writableEnded) return undefined;
    res.writeHead(200, { 'Content-Type': 'text/event-stream; charset=utf-8', Connection: 'keep-alive' });
    res.write(': herald events\nretry: 2000\n\n');
    this.#streams.add(res);
    this.#o.metrics.eventClients.inc();
    const send = (e: ControllerEvent): void => {
      if (ended || !scope.allows(e)) return;
      if (res.writableLength > MAX_SSE_BUFFERED_BYTES) {
        this.#log.warn({ event: 'sse.dropped', peer: c.identity.spiffeId }, 'event stream client too slow; dropped');
        res.destroy();
        return;
      }
      res.write(`id: ${e.id}\nevent: ${e.type}\ndata: ${JSON.stringify({ type: e.type, at: e.at, ...e.data })}\n\n`);
    };
    const unsubscribe = this.#o.service.events.subscribe(send);
    const heartbeat = setInterval(() => res.write(': keep-alive\n\n'), SSE_HEARTBEAT_INTERVAL_MS);
    heartbeat.unref();
    const refresh = (): void => void scope.refresh();
    const refreshTimer = setInterval(refresh, ACCESS_STREAM_REFRESH_MS);
    refreshTimer.unref();
    this.#o.access.on('change', refresh);
    const done = (): void => {
      if (!this.#streams.delete(res)) return;
      ended = true;
      clearInterval(heartbeat);
      clearInterval(refreshTimer);
      this.#o.access.off('change', refresh);
      unsubscribe();
      this.#o.metrics.eventClients.dec();
    };
    res.once('close', done);
    req.once('close', done);
    return undefined;
  }
}

// ---- what a rule reads of a request body ---------------------------------------------------------
// The body is not checked yet when the policy runs: a field that is absent or of another type
// names no target, and the route's own validation refuses that body (400) before anything is done.

/** A field of an unchecked JSON object. */
function field(body: unknown, key: string): unknown {
  return typeof body === 'object' && body !== null && !Array.isArray(body)
    ? (body as Record<string, unknown>)[key]
    : undefined;
}

function asList(v: unknown): unknown[] {
  return Array.isArray(v) ? v : [];
}

/** The node a body names at `key` (a string). */
function bodyNode(body: unknown, key: string): Array<{ node: string }> {
  const v = field(body, key);
  return typeof v === 'string' ? [{ node: v }] : [];
}

/** The nodes a body lists at `key` (a list of strings). */
function bodyNodeList(body: unknown, key: string): Array<{ node: string }> {
  return asList(field(body, key))
    .filter((x): x is string => typeof x === 'string')
    .map((node) => ({ node }));
}

/** The body's `labels` (string values; with `patch`, null values too). */
function bodyLabels(body: unknown, patch: true): Record<string, string | null>;
function bodyLabels(body: unknown): Record<string, string>;
function bodyLabels(body: unknown, patch = false): Record<string, string | null> {
  const v = field(body, 'labels');
  const out: Record<string, string | null> = {};
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return out;
  for (const [k, x] of Object.entries(v)) if (typeof x === 'string' || (patch && x === null)) out[k] = x;
  return out;
}

/** How long a refused request's body is read (and discarded) before the answer goes out anyway. */
const CLOSE_LINGER_MS = 2_000;

/**
 * Sends a `Connection: close` answer once the request body is in (discarded), or after
 * CLOSE_LINGER_MS. Node destroys the socket as soon as such an answer is written; request bytes
 * still unread then make the kernel send a TCP reset, and the client gets EPIPE/ECONNRESET
 * instead of the coded answer (a 413 to a 4 MiB signal, a 403 to a revoked agent's upload).
 */
function afterBody(req: http.IncomingMessage, send: () => void): void {
  let sent = false;
  const once = (): void => {
    if (sent) return;
    sent = true;
    clearTimeout(timer);
    send();
  };
  const timer = setTimeout(once, CLOSE_LINGER_MS);
  timer.unref();
  req.once('end', once);
  req.once('close', once);
  req.resume();
}

/** An audit row as `GET /v1/audit` shows it (docs/api.md). */
function auditView(a: AuditRecord): Record<string, unknown> {
  return {
    seq: a.seq,
    at: a.at,
    who: a.who,
    action: a.action,
    target: a.target,
    detail: a.detail,
    ...(a.detailBytes !== undefined ? { detail_bytes: a.detailBytes } : {}),
    outcome: a.outcome,
    controller: a.controller,
    prev_hash: a.prevHash,
    hash: a.hash,
  };
}

/** A refused request's outcome as the error edge (`#fail`) answers it. */
function refusalOf(err: unknown): RequestOutcome {
  const code: ErrorCode = err instanceof HeraldError ? err.code : 'internal';
  return { status: code === 'internal' ? 500 : statusOf(code), code };
}

function codeOfErr(err: unknown): string {
  return err instanceof HeraldError ? err.code : err instanceof Error ? err.message.slice(0, 80) : String(err);
}

/** For logs about a refused peer: its certificate's serial and subject SAN, if it sent one. */
function peerHint(socket: tls.TLSSocket): string {
  try {
    const x = socket.getPeerX509Certificate?.();
    if (!x) return `${socket.remoteAddress ?? '?'} (no certificate)`;
    return `${socket.remoteAddress ?? '?'} serial ${x.serialNumber.toLowerCase()} san ${(x.subjectAltName ?? '').slice(0, 200)}`;
  } catch {
    return socket.remoteAddress ?? '?';
  }
}

/**
 * A plain-HTTP `GET /healthz` for probes (`--health-listen`): `check` gives the status, `ok` or
 * why not (`starting`, `stopping`, `unavailable`); never rejects.
 */
export function createHealthServer(check: () => Promise<string>): http.Server {
  return http.createServer(async (req, res) => {
    res.setHeader('Cache-Control', 'no-store');
    res.setHeader('X-Content-Type-Options', 'nosniff');
    const path = (req.url ?? '/').split('?')[0];
    if (path !== '/healthz' || (req.method !== 'GET' && req.method !== 'HEAD')) {
      res.writeHead(404, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'not_found', message: 'only GET /healthz here' } }));
      return;
    }
    const r = healthReply(await check());
    res.writeHead(r.status, { 'Content-Type': 'application/json', ...r.headers });
    res.end(JSON.stringify(r.body));
  });
}

/** `/healthz`'s answer, on the TLS port and the plain one alike: 200 for `ok`, else 503 and a second to wait. */
function healthReply(status: string): Reply {
  return status === 'ok'
    ? { status: 200, body: { status } }
    : { status: 503, body: { status }, headers: { 'Retry-After': '1' } };
}

/**
 * The request asks for a minimal answer: `Prefer: return=minimal` (RFC 7240), alone or among
 * other preferences, on one Prefer header or several. As the RFC reads: the name is
 * case-insensitive, the value a token or quoted and compared exactly, a comma inside quotes
 * separates nothing, and only the first `return` counts.
 */
export function prefersMinimal(req: http.IncomingMessage): boolean {
  const h = req.headers.prefer;
  if (h === undefined) return false;
  for (const line of Array.isArray(h) ? h : [h])
    for (const pref of line.match(/(?:[^,"]|"(?:[^"\\]|\\.)*")+/g) ?? []) {
      const [name, value] = pref.split(';')[0]!.split('=');
      if (name?.trim().toLowerCase() !== 'return') continue;
      return value?.trim().replace(/^"(.*)"$/, '$1') === 'minimal';
    }
  return false;
}
