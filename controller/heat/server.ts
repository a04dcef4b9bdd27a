/**
 * Heat's object store: the Swift subset unmodified OpenStack Heat and stock os-collect-config
 * nodes speak (docs/heat.md, docs/heat-object-store.md), on a listener of its own. Its clients
 * present no certificate (python-swiftclient and python-requests carry none), so it requests none:
 * a request is authorised by a TempURL signed with the account's temp-url key (exactly its
 * method and object) or by a token the token validator accepts for the account (Keystone, or a
 * static token file for standalone Heat). Everything else is refused with a code before the body
 * is read. The operations are controller/service/heat.ts; this module is HTTP only.
 *
 *   /v1/AUTH_<project>                        HEAD GET POST        (token)
 *   /v1/AUTH_<project>/<container>            PUT HEAD GET DELETE  (token)
 *   /v1/AUTH_<project>/<container>/<object>   PUT GET HEAD DELETE  (token); PUT GET HEAD (TempURL)
 */
import crypto from 'node:crypto';
import type http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import type tls from 'node:tls';
import type { Logger } from 'pino';
import type { Counter } from 'prom-client';
import type { PkiMaterial } from '../../certs/tls.js';
import { ERROR_CODES, type ErrorCode, HeraldError } from '../../protocol/errors.js';
import {
  OBJECT_STORE_ACCOUNT_CONTAINERS_MAX_ENTRIES,
  OBJECT_STORE_CONTAINER_OBJECTS_MAX_ENTRIES,
  OBJECT_STORE_HEADERS_TIMEOUT_MS,
  OBJECT_STORE_KEEP_ALIVE_TIMEOUT_MS,
  OBJECT_STORE_LISTING_MAX_ENTRIES,
  OBJECT_STORE_MAX_CONNECTIONS,
  OBJECT_STORE_MAX_HOST_CONNECTIONS,
  OBJECT_STORE_MAX_NETWORK_CONNECTIONS,
  OBJECT_STORE_OBJECT_MAX_BYTES,
  OBJECT_STORE_REFUSED_BODY_LINGER_MS,
  OBJECT_STORE_REQUEST_TIMEOUT_MS,
} from '../../protocol/limits.js';
import { ConnectionAdmission } from '../admission.js';
import { statusOf } from '../error-status.js';
import { RefusalLog } from '../refusal-log.js';
import type { HeatObjects } from '../service/heat.js';
import type { ObjectHead, ObjectKey } from '../store/objects.js';
import { checkTempUrl } from './tempurl.js';
import type { TokenValidator } from './tokens.js';

export interface ObjectStoreOptions {
  heat: HeatObjects;
  tokens: TokenValidator;
  /** The controller's server certificate and key serve here too (followed when they change). */
  material: PkiMaterial;
  logger: Logger;
  now?: () => number;
  /** Refused before the handler: the controller cannot change anything now (its certificate is revoked, say). */
  refusal?: () => HeraldError | undefined;
  /** Counts every answer, by method and status (`herald_object_store_requests_total`, docs/api.md). */
  requests?: Counter<'method' | 'code'>;
}

const METHODS = {
  account: ['HEAD', 'GET', 'POST'],
  container: ['PUT', 'HEAD', 'GET', 'DELETE'],
  object: ['PUT', 'GET', 'HEAD', 'DELETE'],
} as const;
const TEMPURL_METHODS = ['GET', 'HEAD', 'PUT'];
/** The account's key as Heat sets and reads it. */
const KEY_HEADER = 'x-account-meta-temp-url-key';
/** A Swift account or container name, as Herald keeps them: no control characters, at most 256 bytes. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to refuse control characters
const NAME_RE = /^[^\u0000-\u001f\u007f/]{1,256}$/;
// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to refuse control characters
const CONTROL_RE = /[\u0000-\u001f\u007f]/;

/** Swift's Last-Modified: the time rounded UP to the second (Heat compares it with a sub-second time). */
export const lastModified = (ms: number): string => new Date(Math.ceil(ms / 1000) * 1000).toUTCString();

interface Target {
  project: string;
  container?: string;
  object?: string;
  level: keyof typeof METHODS;
}

function targetOf(path: string): Target | undefined {
  const m = /^\/v1\/AUTH_([^/]+)(?:\/([^/]+)(?:\/(.+))?)?\/?$/.exec(path);
  if (!m) return undefined;
  const [, project, container, object] = m;
  if (!NAME_RE.test(project!) || (container !== undefined && !NAME_RE.test(container))) return undefined;
  if (object !== undefined && (Buffer.byteLength(object) > 1024 || CONTROL_RE.test(object))) return undefined;
  const level = object !== undefined ? 'object' : container !== undefined ? 'container' : 'account';
  return {
    project: project!,
    level,
    ...(container !== undefined ? { container } : {}),
    ...(object !== undefined ? { object } : {}),
  };
}

class Refused extends HeraldError {}

export class ObjectStoreServer {
  readonly server: https.Server;
  readonly #o: ObjectStoreOptions;
  readonly #now: () => number;
  readonly #log: Logger;
  readonly #refusals: RefusalLog;
  readonly #admission = new ConnectionAdmission({
    total: OBJECT_STORE_MAX_CONNECTIONS,
    perHost: OBJECT_STORE_MAX_HOST_CONNECTIONS,
    perNetwork: OBJECT_STORE_MAX_NETWORK_CONNECTIONS,
  });
  readonly #onTls: () => void;
  #trans = 0;

  constructor(o: ObjectStoreOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
    this.#log = o.logger.child({ component: 'object-store' });
    this.#refusals = new RefusalLog(this.#log, this.#now);
    this.server = https.createServer(
      { ...this.#tlsOptions(), handshakeTimeout: OBJECT_STORE_HEADERS_TIMEOUT_MS },
      (req, res) => {
        void this.#handle(req, res);
      },
    );
    this.server.headersTimeout = OBJECT_STORE_HEADERS_TIMEOUT_MS;
    this.server.requestTimeout = OBJECT_STORE_REQUEST_TIMEOUT_MS;
    this.server.keepAliveTimeout = OBJECT_STORE_KEEP_ALIVE_TIMEOUT_MS;
    this.server.on('secureConnection', (s: tls.TLSSocket) => this.#admit(s));
    this.server.on('tlsClientError', (_e, s) => s.destroy());
    this.#onTls = () => this.server.setSecureContext(this.#tlsOptions());
    o.material.on('tls-change', this.#onTls);
  }

  /** The controller's certificate; no client certificate asked for; TLS 1.2 or 1.3 (stock node images). */
  #tlsOptions(): tls.SecureContextOptions {
    const m = this.#o.material.current();
    return { key: m.key, cert: m.cert, minVersion: 'TLSv1.2' };
  }

  #admit(s: tls.TLSSocket): void {
    const a = this.#admission.admit(s.remoteAddress ?? '');
    if (!a.ok) {
      this.#refusals.record('too_many_connections', { peer: s.remoteAddress, scope: a.scope });
      s.destroy();
      return;
    }
    s.once('close', a.release);
  }

  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, host, () => {
        this.server.off('error', reject);
        resolve((this.server.address() as net.AddressInfo).port);
      });
    });
  }

  async close(): Promise<void> {
    this.#o.material.off('tls-change', this.#onTls);
    this.#refusals.close();
    await new Promise<void>((r) => {
      this.server.close(() => r());
      this.server.closeAllConnections();
    });
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const method = req.method ?? 'GET';
    // on close, not finish: an answer cut short is counted too; `none` when the client left before one
    res.once('close', () => this.#o.requests?.inc({ method, code: res.headersSent ? String(res.statusCode) : 'none' }));
    const trans = `tx${(++this.#trans).toString(16)}-${crypto.randomBytes(4).toString('hex')}`;
    let target: Target | undefined;
    let who: string | undefined;
    try {
      const u = URL.canParse(req.url ?? '/', 'https://object-store')
        ? new URL(req.url ?? '/', 'https://object-store')
        : undefined;
      // an absolute-form target (`GET http://[x/...`) that is no URL is a client's mistake, not a 500
      if (!u) throw new Refused('not_found', 'the request target is not a URL');
      let path: string;
      try {
        path = decodeURIComponent(u.pathname);
      } catch {
        throw new Refused('not_found', 'the path is not valid percent-encoding');
      }
      target = targetOf(path);
      if (!target) throw new Refused('not_found', 'not an object store path (/v1/AUTH_<project>/...)');
      const allowed: readonly string[] = METHODS[target.level];
      if (!allowed.includes(method))
        throw new Refused('method_not_allowed', `${method} is not served on an ${target.level}`);
      const refusal = this.#o.refusal?.();
      if (refusal) throw refusal;
      who = await this.#authorize(req, u, path, method, target);
      const body = method === 'PUT' || method === 'POST' ? await readBody(req) : Buffer.alloc(0);
      await this.#route(req, res, u, method, target, body, who, trans);
    } catch (e) {
      this.#fail(req, res, e, method, target, who, trans);
    }
  }

  /** Who asks: a TempURL for its method and object, or a token the validator accepts for the account. */
  async #authorize(req: http.IncomingMessage, u: URL, path: string, method: string, t: Target): Promise<string> {
    const sig = u.searchParams.get('temp_url_sig');
    if (sig !== null) {
      if (t.level !== 'object' || !TEMPURL_METHODS.includes(method))
        throw new Refused('tempurl_invalid', `a TempURL grants ${TEMPURL_METHODS.join(', ')} of an object only`);
      const key = await this.#o.heat.read((o) => o.tempUrlKey(t.project));
      const code = checkTempUrl(
        {
          method,
          path,
          sig,
          expires: u.searchParams.get('temp_url_expires') ?? '',
          prefix: u.searchParams.has('temp_url_prefix'),
        },
        key,
        Math.floor(this.#now() / 1000),
      );
      if (code) throw new Refused(code, ERROR_CODES[code]);
      return `tempurl:${t.project}`;
    }
    const token = req.headers['x-auth-token'];
    if (typeof token !== 'string' || token === '')
      throw new Refused('token_missing', 'no X-Auth-Token and no TempURL signature');
    const v = await this.#o.tokens.check(token, t.project);
    if (!v.ok) throw new Refused(v.code, v.reason);
    return `heat:${v.user}`;
  }

  async #route(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    u: URL,
    method: string,
    t: Target,
    body: Buffer,
    who: string,
    trans: string,
  ): Promise<void> {
    const heat = this.#o.heat;
    const base = { 'X-Trans-Id': trans, 'X-Openstack-Request-Id': trans };
    if (t.level === 'account') {
      if (method === 'POST') {
        const key = req.headers[KEY_HEADER];
        if (typeof key === 'string' && key !== '') {
          const { kept } = await heat.setTempUrlKey(t.project, key);
          if (kept)
            this.#log.info(
              { event: 'temp_url_key_kept', code: 'temp_url_key_kept', project: t.project, who },
              ERROR_CODES.temp_url_key_kept,
            );
        }
        return send(res, 204, base);
      }
      const [key, count] = await heat.read(
        async (o) => [await o.tempUrlKey(t.project), await o.containerCount(t.project)] as const,
      );
      const headers: Record<string, string> = {
        ...base,
        'X-Account-Container-Count': String(count),
        'X-Timestamp': (this.#now() / 1000).toFixed(5),
        ...(key !== null ? { 'X-Account-Meta-Temp-Url-Key': key } : {}),
      };
      if (method === 'HEAD') return send(res, 204, headers);
      const names = await heat.read((o) => o.containers(t.project, marker(u), limit(u)));
      return sendListing(
        res,
        u,
        headers,
        names.map((name) => ({ name, count: 0, bytes: 0 })),
        (e) => e.name,
      );
    }
    const container = t.container!;
    if (t.level === 'container') {
      if (method === 'PUT') {
        const n = await heat.read((o) => o.containerCount(t.project));
        if (
          n >= OBJECT_STORE_ACCOUNT_CONTAINERS_MAX_ENTRIES &&
          !(await heat.read((o) => o.container(t.project, container)))
        )
          throw new Refused(
            'object_store_full',
            `an account holds at most ${OBJECT_STORE_ACCOUNT_CONTAINERS_MAX_ENTRIES} containers`,
          );
        return send(res, (await heat.putContainer(t.project, container)) ? 201 : 202, base);
      }
      if (method === 'DELETE') {
        const r = await heat.deleteContainer(t.project, container);
        if (r === 'not_empty') throw new Refused('container_not_empty', `container ${container} holds objects`);
        if (r === 'missing') throw new Refused('not_found', `no container ${container}`);
        return send(res, 204, base);
      }
      const info = await heat.read((o) => o.container(t.project, container));
      if (!info) throw new Refused('not_found', `no container ${container}`);
      const headers = {
        ...base,
        'X-Container-Object-Count': String(info.objects),
        'X-Container-Bytes-Used': String(info.bytes),
        'X-Timestamp': (Date.parse(info.createdAt) / 1000).toFixed(5),
      };
      if (method === 'HEAD') return send(res, 204, headers);
      const list = await heat.read((o) => o.list(t.project, container, marker(u), limit(u)));
      return sendListing(res, u, headers, list, (h) => h.name, objectEntry);
    }
    const key: ObjectKey = { project: t.project, container, name: t.object! };
    if (method === 'PUT') {
      const exists = await heat.read((o) => o.head(key));
      if (
        !exists &&
        (await heat.read((o) => o.objectCount(t.project, container))) >= OBJECT_STORE_CONTAINER_OBJECTS_MAX_ENTRIES
      )
        throw new Refused(
          'object_store_full',
          `a container holds at most ${OBJECT_STORE_CONTAINER_OBJECTS_MAX_ENTRIES} objects`,
        );
      const type = req.headers['content-type'] || 'application/octet-stream';
      const r = await heat.put(key, body, type, who);
      if (r.deployments !== null)
        this.#log.info(
          { event: 'heat.metadata', node: container, deployments: r.deployments, changed: r.changed, who },
          "a node's metadata from Heat",
        );
      return send(res, 201, { ...base, ETag: r.etag, 'Last-Modified': lastModified(this.#now()) });
    }
    if (method === 'DELETE') {
      if (!(await heat.delete(key))) throw new Refused('not_found', `no object ${t.object}`);
      return send(res, 204, base);
    }
    if (method === 'HEAD') {
      const h = await heat.head(key);
      if (!h) throw new Refused('not_found', `no object ${t.object}`);
      return send(res, 200, { ...base, ...objectHeaders(h) }, undefined, h.bytes);
    }
    const o = await heat.get(key);
    if (!o) throw new Refused('not_found', `no object ${t.object}`);
    return send(res, 200, { ...base, ...objectHeaders(o) }, o.body);
  }

  #fail(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    e: unknown,
    method: string,
    t: Target | undefined,
    who: string | undefined,
    trans: string,
  ): void {
    let code: ErrorCode = 'internal';
    let message: string = ERROR_CODES.internal;
    let field: string | undefined;
    if (e instanceof HeraldError && e.code !== 'internal') {
      code = e.code;
      message = e.message;
      field = e.field;
    } else this.#log.error({ err: e, method, path: req.url?.split('?')[0] }, 'object store request failed');
    const status = statusOf(code);
    const fields = {
      status,
      peer: req.socket.remoteAddress,
      method,
      project: t?.project,
      container: t?.container,
      object: t?.object,
      field,
      who,
    };
    // anyone can repeat a refusal made before the request was authorised (a 401, a 404 or 405 of
    // routing, a 503 of a revoked controller), and a 413, 429 or 503 in bulk: summarised per code,
    // so no peer can fill the disk; an authorised caller's other refusals are one line each
    if (who === undefined || status === 413 || status === 429 || status === 503) this.#refusals.record(code, fields);
    else if (status !== 500) this.#log.info({ event: 'refused', code, ...fields }, message);
    const headers: Record<string, string> = { 'X-Trans-Id': trans };
    if (status === 503) headers['Retry-After'] = '5';
    const errBody =
      method === 'HEAD'
        ? undefined
        : Buffer.from(JSON.stringify({ error: { code, message, ...(field ? { field } : {}) } }));
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const answer = (): void =>
      send(
        res,
        status,
        { ...headers, ...(errBody ? { 'Content-Type': 'application/json; charset=utf-8' } : {}) },
        errBody,
      );
    if (req.complete) {
      answer();
      return;
    }
    headers.Connection = 'close';
    afterBody(req, answer);
  }
}

function objectHeaders(h: ObjectHead): Record<string, string> {
  return {
    'Content-Type': h.contentType,
    ETag: h.etag,
    'Last-Modified': lastModified(h.modifiedMs),
    'X-Timestamp': (h.modifiedMs / 1000).toFixed(5),
  };
}

function objectEntry(h: ObjectHead): Record<string, unknown> {
  return {
    name: h.name,
    bytes: h.bytes,
    hash: h.etag,
    content_type: h.contentType,
    last_modified: new Date(h.modifiedMs).toISOString().replace('Z', ''),
  };
}

function marker(u: URL): string {
  return u.searchParams.get('marker') ?? '';
}

function limit(u: URL): number {
  const n = Number(u.searchParams.get('limit') ?? OBJECT_STORE_LISTING_MAX_ENTRIES);
  return Number.isInteger(n) && n > 0
    ? Math.min(n, OBJECT_STORE_LISTING_MAX_ENTRIES)
    : OBJECT_STORE_LISTING_MAX_ENTRIES;
}

function sendListing<T>(
  res: http.ServerResponse,
  u: URL,
  headers: Record<string, string>,
  entries: T[],
  name: (e: T) => string,
  json: (e: T) => unknown = (e) => e,
): void {
  const format = u.searchParams.get('format');
  if (entries.length === 0) send(res, 204, headers);
  else if (format === 'json')
    send(
      res,
      200,
      { ...headers, 'Content-Type': 'application/json; charset=utf-8' },
      Buffer.from(JSON.stringify(entries.map(json))),
    );
  else
    send(
      res,
      200,
      { ...headers, 'Content-Type': 'text/plain; charset=utf-8' },
      Buffer.from(`${entries.map(name).join('\n')}\n`),
    );
}

function send(
  res: http.ServerResponse,
  status: number,
  headers: Record<string, string>,
  body?: Buffer,
  headLength?: number,
): void {
  res.writeHead(status, { ...headers, 'Content-Length': String(headLength ?? body?.length ?? 0) });
  res.end(res.req.method === 'HEAD' ? undefined : body);
}

/**
 * The request's body, refused past the object limit (from Content-Length first, then as it
 * arrives). What comes after a refusal is left to flow and be discarded: the refusal's answer
 * waits for it (afterBody), so the client reads a coded 413, not a reset.
 */
function readBody(req: http.IncomingMessage): Promise<Buffer> {
  const declared = Number(req.headers['content-length'] ?? 0);
  if (declared > OBJECT_STORE_OBJECT_MAX_BYTES)
    return Promise.reject(
      new Refused('object_too_large', `an object is at most ${OBJECT_STORE_OBJECT_MAX_BYTES} bytes`),
    );
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    let over = false;
    req.on('data', (c: Buffer) => {
      if (over) return;
      n += c.length;
      if (n > OBJECT_STORE_OBJECT_MAX_BYTES) {
        over = true;
        chunks.length = 0;
        reject(new Refused('object_too_large', `an object is at most ${OBJECT_STORE_OBJECT_MAX_BYTES} bytes`));
        return;
      }
      chunks.push(c);
    });
    req.once('end', () => {
      if (!over) resolve(Buffer.concat(chunks));
    });
    req.once('error', reject);
  });
}

/**
 * Sends a refusal's `Connection: close` answer once the request's body is in (read and
 * discarded), or after OBJECT_STORE_REFUSED_BODY_LINGER_MS. Node closes such a connection as
 * soon as the answer is written; request bytes still unread then make the kernel send a TCP
 * reset, and the client (python-requests sending Heat's metadata, a node's result) sees a
 * broken connection instead of the code. The API does the same (controller/api/server.ts).
 */
function afterBody(req: http.IncomingMessage, answer: () => void): void {
  let sent = false;
  const once = (): void => {
    if (sent) return;
    sent = true;
    clearTimeout(timer);
    answer();
  };
  const timer = setTimeout(once, OBJECT_STORE_REFUSED_BODY_LINGER_MS);
  timer.unref();
  req.once('end', once);
  req.once('close', once);
  req.resume();
}
