/**
 * A fake controller API for attacks on the agent's fetcher: an HTTPS server on 127.0.0.1 that
 * presents whatever certificate it is given (a real controller certificate, an agent's, a
 * foreign one), accepts endpoint announcements, answers metadata requests as `answer` says,
 * and records signals. It stands for a tampering middlebox as well: with mutual TLS and the
 * URI SAN check, a middlebox can only tamper if it holds a controller certificate, and then it
 * is this server.
 */
import { once } from 'node:events';
import https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import type { Cred } from './battery.js';

export interface FakeRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

export interface MetadataAnswer {
  status: number;
  headers?: Record<string, string>;
  body?: Buffer | string;
}

/** Decides the answer to one metadata request: `nonce` and `ifNoneMatch` are the request's. */
export type MetadataHandler = (r: {
  nonce: string;
  ifNoneMatch: string | undefined;
  req: FakeRequest;
}) => MetadataAnswer;

export class FakeController {
  readonly requests: FakeRequest[] = [];
  readonly signals: Array<{ path: string; body: unknown }> = [];
  /** TLS handshakes completed (a client that then refuses the certificate still counts). */
  tlsConnections = 0;
  answer: MetadataHandler = () => ({ status: 503 });
  signalStatus = 200;
  port = 0;
  #server: https.Server | null = null;
  readonly #sockets = new Set<net.Socket>();
  #cred: Cred;

  constructor(cred: Cred) {
    this.#cred = cred;
  }

  get url(): string {
    return `https://127.0.0.1:${this.port}`;
  }

  get metadataRequests(): number {
    return this.requests.filter((r) => r.path.endsWith('/metadata')).length;
  }

  /** Listens (again, on the same port after close(), possibly with another certificate). */
  async listen(cred: Cred = this.#cred): Promise<this> {
    this.#cred = cred;
    const server = https.createServer({
      ca: cred.ca,
      cert: cred.cert,
      key: cred.key,
      requestCert: true,
      rejectUnauthorized: false,
      minVersion: 'TLSv1.3',
      maxVersion: 'TLSv1.3',
    });
    server.on('connection', (s: net.Socket) => {
      this.#sockets.add(s);
      s.on('close', () => this.#sockets.delete(s));
    });
    server.on('secureConnection', () => this.tlsConnections++);
    server.on('tlsClientError', () => undefined);
    server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
      const chunks: Buffer[] = [];
      req.on('data', (d: Buffer) => chunks.push(d));
      req.on('end', () =>
        this.#handle(
          { method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks) },
          res,
        ),
      );
    });
    server.listen(this.port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as net.AddressInfo).port;
    this.#server = server;
    return this;
  }

  #handle(r: FakeRequest, res: http.ServerResponse): void {
    this.requests.push(r);
    if (r.method === 'PUT' && r.path.endsWith('/endpoint')) {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    } else if (r.method === 'GET' && r.path.endsWith('/metadata')) {
      const inm = r.headers['if-none-match'];
      const a = this.answer({
        nonce: String(r.headers['herald-nonce'] ?? ''),
        ifNoneMatch: Array.isArray(inm) ? inm.join(',') : inm,
        req: r,
      });
      res.writeHead(a.status, { 'content-type': 'application/json', ...a.headers });
      res.end(a.body);
    } else if (r.method === 'POST' && r.path.endsWith('/signal')) {
      let body: unknown;
      try {
        body = JSON.parse(r.body.toString('utf8'));
      } catch {
        body = r.body.toString('utf8');
      }
      this.signals.push({ path: r.path, body });
      res
        .writeHead(this.signalStatus, { 'content-type': 'application/json' })
        .end(this.signalStatus < 300 ? '{}' : '{"error":{"code":"internal","message":"down"}}');
    } else {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"code":"not_found","message":"no"}}');
    }
  }

  /** Stops listening and drops every connection. Idempotent. */
  async close(): Promise<void> {
    const s = this.#server;
    this.#server = null;
    for (const sock of this.#sockets) sock.destroy();
    if (s) await new Promise<void>((resolve) => s.close(() => resolve()));
  }
}
