/**
 * The operator's client of the controller API (docs/api.md): HTTPS with the operator's mutual-TLS
 * identity, the server checked by its SPIFFE URI SAN (never by hostname), JSON in and out, and
 * the `/v1/events` Server-Sent Events stream. Every failure becomes one coded HeraldError, so
 * the CLI prints one line and never a stack.
 */
import fs from 'node:fs';
import https from 'node:https';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { HeraldError, isErrorCode, type ErrorCode } from '../../protocol/errors.js';
import { API_REQUEST_TIMEOUT_MS, DEFAULT_CONTROLLER_PORT } from '../../protocol/limits.js';
import { isValidName, spiffeIdOf } from '../../protocol/identity.js';
import { trustDomainOf } from '../../certs/identity.js';
import { httpsAgentFor, PkiMaterial } from '../../certs/tls.js';
import { tlsCodeOf } from '../../certs/tls-codes.js';
import { pkiPaths } from '../../certs/paths.js';

/** Default controller URL when neither `--controller` nor `HERALD_CONTROLLER` is given. */
export const DEFAULT_CONTROLLER_URL = `https://127.0.0.1:${DEFAULT_CONTROLLER_PORT}`;
/** Default PKI directory when neither `--pki` nor `HERALD_PKI` is given. */
export const DEFAULT_PKI_DIR = 'pki';
/** Largest API response the CLI reads. */
export const MAX_API_RESPONSE_BYTES = 64 * 1024 * 1024;

/** The connection options every operator command takes (the CLI's "global" options). */
export interface ClientOptions {
  controller?: string;
  pki?: string;
  as?: string;
  ca?: string;
  cert?: string;
  key?: string;
  controllerId?: string;
}

/** What an API error carried, besides the HeraldError's code and message. */
export class ApiError extends HeraldError {
  /** HTTP status; 0 when no answer came (connection refused, TLS failure, timeout). */
  readonly status: number;
  /** The code as the controller sent it (may be one this CLI does not know). */
  readonly apiCode: string;

  constructor(status: number, apiCode: string, message: string, field?: string, cause?: unknown) {
    const code: ErrorCode = isErrorCode(apiCode) ? apiCode : 'api_error';
    const text = `${code === apiCode ? '' : `${apiCode}: `}${message}${field ? ` (field ${field})` : ''}`;
    super(code, text, { field, cause });
    this.name = 'ApiError';
    this.status = status;
    this.apiCode = apiCode;
  }
}

export interface ApiResponse<T = unknown> {
  status: number;
  headers: IncomingHttpHeaders;
  body: T;
}

/** One Server-Sent Event. `data` is parsed JSON when it parses, else the raw text. */
export interface SseEvent {
  event: string;
  id: string | undefined;
  data: unknown;
}

export interface EventStream {
  /** Stops the stream (and its reconnects). Idempotent. */
  close(): void;
}

/**
 * Resolves the connection options (flags, then environment, then defaults) and loads the
 * operator's PKI material (not watched: a CLI run is short).
 * @throws HeraldError `bad_option` naming the option, `pki_missing` for a missing file
 */
export function clientFromOptions(o: ClientOptions, env: NodeJS.ProcessEnv = process.env): ApiClient {
  const controller = o.controller ?? env.HERALD_CONTROLLER ?? DEFAULT_CONTROLLER_URL;
  let url: URL;
  try {
    url = new URL(controller);
  } catch {
    throw new HeraldError(
      'bad_option',
      `--controller ${JSON.stringify(controller)} is not a URL (e.g. ${DEFAULT_CONTROLLER_URL})`,
    );
  }
  if (url.protocol !== 'https:')
    throw new HeraldError('bad_option', `--controller must be an https:// URL, not ${JSON.stringify(controller)}`);
  const as = o.as ?? env.HERALD_AS ?? 'admin';
  if (!isValidName(as))
    throw new HeraldError('bad_option', `--as ${JSON.stringify(as)} is not a valid name (^[a-z0-9][a-z0-9._-]{0,62}$)`);
  const controllerId = o.controllerId ?? env.HERALD_CONTROLLER_ID ?? 'controller';
  if (!isValidName(controllerId))
    throw new HeraldError('bad_option', `--controller-id ${JSON.stringify(controllerId)} is not a valid name`);
  const pkiDir = o.pki ?? env.HERALD_PKI ?? DEFAULT_PKI_DIR;
  const p = pkiPaths(pkiDir);
  const caPath = o.ca ?? p.caCrt;
  const certPath = o.cert ?? p.cert('operator', as);
  const keyPath = o.key ?? p.key('operator', as);
  for (const [file, option] of [
    [caPath, '--ca'],
    [certPath, '--cert'],
    [keyPath, '--key'],
  ] as const) {
    if (!fs.existsSync(file)) {
      throw new HeraldError('pki_missing', `${file} not found (${option}; set --pki or HERALD_PKI, or ${option})`);
    }
  }
  let trustDomain: string;
  try {
    trustDomain = trustDomainOf(fs.readFileSync(certPath));
  } catch (err) {
    throw new HeraldError('bad_option', `--cert ${certPath}: ${(err as Error).message}`, { cause: err });
  }
  warnIfCaHost(p.caKey, p.signingJwk, env);
  const material = new PkiMaterial({ caPath, certPath, keyPath, revokedPath: p.revoked, trustDomain, watch: false });
  return new ApiClient(url, material, spiffeIdOf(trustDomain, 'controller', controllerId));
}

/**
 * docs/configuration.md: an operator that can read the CA key or the signing key says so, once per run
 * (`HERALD_NO_CA_WARNING=1` silences it, e.g. in the demo and tests, which are their own CA).
 */
function warnIfCaHost(caKey: string, signingJwk: string, env: NodeJS.ProcessEnv): void {
  if (env.HERALD_NO_CA_WARNING === '1') return;
  for (const f of [caKey, signingJwk]) {
    try {
      fs.accessSync(f, fs.constants.R_OK);
      process.stderr.write(
        `herald: warning: this operator can read ${f}; keep it on the CA host only (copy out with \`herald certs bundle operator <name>\`)\n`,
      );
      return;
    } catch {
      // not readable: as it should be
    }
  }
}

/** Turns a socket/TLS failure into one readable, coded line. */
function connectionError(url: URL, err: unknown): HeraldError {
  if (err instanceof HeraldError) return err;
  const e = err as NodeJS.ErrnoException & { reason?: string };
  const where = url.origin;
  switch (e.code) {
    case 'ECONNREFUSED':
      return new ApiError(
        0,
        'api_error',
        `cannot connect to ${where}: connection refused (is the controller running? see --controller / HERALD_CONTROLLER)`,
        undefined,
        err,
      );
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return new ApiError(0, 'api_error', `cannot resolve ${url.hostname}`, undefined, err);
    case 'ETIMEDOUT':
      return new ApiError(0, 'api_error', `${where} did not answer in time`, undefined, err);
    case 'ECONNRESET':
    case 'EPIPE':
      return new ApiError(
        0,
        'api_error',
        `${where} closed the connection (was this operator certificate refused, e.g. revoked or of another CA?)`,
        undefined,
        err,
      );
  }
  switch (e.code === undefined ? undefined : tlsCodeOf(e.code)) {
    case 'untrusted_certificate':
      return new ApiError(
        0,
        'untrusted_certificate',
        `the controller's certificate does not chain to --ca (${e.code})`,
        undefined,
        err,
      );
    case 'certificate_expired':
      return new ApiError(
        0,
        'certificate_expired',
        `the controller's certificate is not valid now (${e.code})`,
        undefined,
        err,
      );
    case 'tls_version':
      return new ApiError(0, 'tls_version', `${where} did not negotiate TLS 1.3`, undefined, err);
    default:
      return new ApiError(
        0,
        'api_error',
        `cannot talk to ${where}: ${e.code ? `${e.code} ` : ''}${(e.message ?? String(err)).split('\n')[0]}`,
        undefined,
        err,
      );
  }
}

/** Reads an error body `{"error":{code,message,field}}` into an ApiError; tolerant of anything else. */
function errorFromBody(status: number, text: string, headers: IncomingHttpHeaders): ApiError {
  try {
    const j = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; field?: unknown } };
    const e = j.error;
    if (e && typeof e.code === 'string') {
      let message = typeof e.message === 'string' ? e.message : `HTTP ${status}`;
      if (status === 429 && headers['retry-after']) message += ` (retry after ${String(headers['retry-after'])} s)`;
      return new ApiError(status, e.code, message, typeof e.field === 'string' ? e.field : undefined);
    }
  } catch {
    // not JSON: fall through to a generic line
  }
  const snippet = text.trim().split('\n')[0]?.slice(0, 200) ?? '';
  return new ApiError(status, 'api_error', `HTTP ${status}${snippet ? `: ${snippet}` : ''}`);
}

/** A small client of the controller API. One keep-alive agent per client, so TLS is set up once. */
export class ApiClient {
  readonly baseUrl: URL;
  readonly expectedServerId: string;
  private readonly material: PkiMaterial;
  private readonly agent: https.Agent;
  private readonly streams = new Set<EventStream>();

  constructor(baseUrl: URL, material: PkiMaterial, expectedServerId: string) {
    this.baseUrl = baseUrl;
    this.material = material;
    this.expectedServerId = expectedServerId;
    this.agent = httpsAgentFor(material, expectedServerId, { keepAlive: true, maxSockets: 4 });
  }

  private requestOptions(method: string, path: string, headers: Record<string, string>): https.RequestOptions {
    const u = new URL(path, this.baseUrl);
    return {
      method,
      protocol: 'https:',
      hostname: u.hostname.replace(/^\[|\]$/g, ''),
      port: u.port || DEFAULT_CONTROLLER_PORT,
      path: u.pathname + u.search,
      agent: this.agent,
      headers: { accept: 'application/json', ...headers },
    };
  }

  /**
   * Sends one request; resolves with a 2xx/3xx answer, throws an ApiError otherwise.
   * @throws ApiError with the API's code (or `api_error`) and field
   */
  async request<T = unknown>(method: string, path: string, body?: unknown): Promise<ApiResponse<T>> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string> = {};
    if (payload) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = String(payload.length);
    }
    const res = await new Promise<{ status: number; headers: IncomingHttpHeaders; text: string }>((resolve, reject) => {
      const req = https.request(this.requestOptions(method, path, headers), (r) => {
        const chunks: Buffer[] = [];
        let size = 0;
        r.on('data', (c: Buffer) => {
          size += c.length;
          if (size > MAX_API_RESPONSE_BYTES) {
            req.destroy(new ApiError(r.statusCode ?? 0, 'api_error', `response over ${MAX_API_RESPONSE_BYTES} bytes`));
            return;
          }
          chunks.push(c);
        });
        r.on('end', () =>
          resolve({ status: r.statusCode ?? 0, headers: r.headers, text: Buffer.concat(chunks).toString('utf8') }),
        );
        r.on('error', reject);
      });
      req.setTimeout(API_REQUEST_TIMEOUT_MS, () =>
        req.destroy(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' })),
      );
      req.on('error', (err) => reject(connectionError(this.baseUrl, err)));
      req.end(payload);
    });
    if (res.status >= 400) throw errorFromBody(res.status, res.text, res.headers);
    let parsed: unknown;
    if (res.text.length > 0) {
      try {
        parsed = JSON.parse(res.text);
      } catch {
        throw new ApiError(
          res.status,
          'api_error',
          `the controller answered ${method} ${path} with a body that is not JSON`,
        );
      }
    }
    return { status: res.status, headers: res.headers, body: parsed as T };
  }

  /**
   * GETs `path` and writes its body to `sink` as it comes, without a size limit (an export of
   * the audit trail); an error answer throws as `request` does.
   * @throws ApiError with the API's code (or `api_error`)
   */
  async download(path: string, sink: NodeJS.WritableStream): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const req = https.request(this.requestOptions('GET', path, {}), (r) => {
        if ((r.statusCode ?? 0) >= 400) {
          const chunks: Buffer[] = [];
          r.on('data', (c: Buffer) => chunks.push(c));
          r.on('end', () =>
            reject(errorFromBody(r.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'), r.headers)),
          );
          return;
        }
        r.on('error', reject);
        r.on('end', resolve);
        r.pipe(sink, { end: false });
      });
      req.setTimeout(API_REQUEST_TIMEOUT_MS, () =>
        req.destroy(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' })),
      );
      req.on('error', (err) => reject(connectionError(this.baseUrl, err)));
      req.end();
    });
  }

  async get<T = unknown>(path: string): Promise<T> {
    return (await this.request<T>('GET', path)).body;
  }

  async post<T = unknown>(path: string, body: unknown): Promise<T> {
    return (await this.request<T>('POST', path, body)).body;
  }

  async patch<T = unknown>(path: string, body?: unknown): Promise<T> {
    return (await this.request<T>('PATCH', path, body)).body;
  }

  async delete<T = unknown>(path: string): Promise<T> {
    return (await this.request<T>('DELETE', path)).body;
  }

  /**
   * Follows `GET /v1/events` and calls `onEvent` for each event. Reconnects after a drop (with
   * `Last-Event-ID` when the server sent ids) until closed; events are best-effort, so callers
   * should not rely on seeing every one. `onState` hears `open`/`error` for diagnostics.
   */
  events(onEvent: (e: SseEvent) => void, onState?: (state: 'open' | 'error', err?: HeraldError) => void): EventStream {
    let closed = false;
    let lastId: string | undefined;
    let req: ReturnType<typeof https.request> | undefined;
    let timer: NodeJS.Timeout | undefined;
    let delayMs = 250;
    const streamAgent = httpsAgentFor(this.material, this.expectedServerId, { keepAlive: false, maxSockets: 1 });

    const connect = (): void => {
      if (closed) return;
      const headers: Record<string, string> = { accept: 'text/event-stream' };
      if (lastId !== undefined) headers['last-event-id'] = lastId;
      // its own agent: the stream holds its socket for as long as it runs
      const opts = { ...this.requestOptions('GET', '/v1/events', headers), agent: streamAgent };
      req = https.request(opts, (res: IncomingMessage) => {
        if ((res.statusCode ?? 0) >= 400) {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            onState?.('error', errorFromBody(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'), res.headers));
            retry();
          });
          return;
        }
        delayMs = 250;
        onState?.('open');
        const parser = new SseParser((e) => {
          if (e.id !== undefined) lastId = e.id;
          onEvent(e);
        });
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => parser.push(chunk));
        res.on('end', retry);
        res.on('error', retry);
      });
      req.on('error', (err) => {
        if (closed) return;
        onState?.('error', connectionError(this.baseUrl, err));
        retry();
      });
      req.end();
    };
    const retry = (): void => {
      if (closed || timer) return;
      timer = setTimeout(() => {
        timer = undefined;
        connect();
      }, delayMs);
      delayMs = Math.min(delayMs * 2, 5_000);
    };
    const stream: EventStream = {
      close: () => {
        if (closed) return;
        closed = true;
        this.streams.delete(stream);
        if (timer) clearTimeout(timer);
        req?.destroy();
        streamAgent.destroy();
      },
    };
    this.streams.add(stream);
    connect();
    return stream;
  }

  /** Closes event streams and kept-alive sockets so the process can exit. Idempotent. */
  close(): void {
    for (const s of [...this.streams]) s.close();
    this.agent.destroy();
    this.material.close();
  }
}

/**
 * An incremental `text/event-stream` parser (the WHATWG rules that matter here): `event:`,
 * `data:` (joined with newlines), `id:`, comments and `retry:` ignored, dispatch on a blank line.
 */
export class SseParser {
  private buf = '';
  private event = '';
  private data: string[] = [];
  private id: string | undefined;

  constructor(private readonly onEvent: (e: SseEvent) => void) {}

  push(chunk: string): void {
    this.buf += chunk;
    for (;;) {
      const nl = this.buf.search(/\r\n|\r|\n/);
      if (nl < 0) break;
      const line = this.buf.slice(0, nl);
      const sepLen = this.buf.startsWith('\r\n', nl) ? 2 : 1;
      this.buf = this.buf.slice(nl + sepLen);
      this.line(line);
    }
  }

  private line(line: string): void {
    if (line === '') {
      if (this.data.length > 0 || this.event) {
        const raw = this.data.join('\n');
        let data: unknown = raw;
        try {
          data = JSON.parse(raw);
        } catch {
          // keep the raw text
        }
        const e: SseEvent = { event: this.event || 'message', id: this.id, data };
        this.event = '';
        this.data = [];
        this.onEvent(e);
      }
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') this.data.push(value);
    else if (field === 'id' && !value.includes('\0')) this.id = value;
  }
}
