/**
 * A Heat-shaped metadata server for the side-by-side run against os-collect-config
 * (`npm run bench -- --peer`, bench/peer.ts).
 *
 * It plays Swift serving a server's deployment metadata behind a temp URL: Heat's
 * `POLL_TEMP_URL` software-config transport (TripleO's default, and the only one whose server
 * side is one HTTP document). Heat writes the server's metadata, `deployments` and the
 * `os-collect-config` section, into a Swift object and gives the node its temp URL; the node's
 * os-collect-config polls it with its `request` collector (`[request] metadata_url`): a HEAD,
 * then a GET. The other Heat transports need a Keystone and a Heat API (`heat`, `cfn`) or a
 * Zaqar queue (`zaqar`), and `ec2` is the Nova metadata service, which caches its first answer
 * and never sees a deployment change.
 *
 * What a Swift object GET answers with is kept (ETag = MD5 of the body, Last-Modified, the
 * X-Timestamp / X-Trans-Id headers), because their bytes are on the wire at every poll. A URL
 * without the temp URL's signature is answered 401, as Swift does; any other path 404.
 */
import { createHash, randomUUID } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { nowMs } from './util.js';

/** The deployment's script (os-collect-config only carries it: its `--command` runs, not this). */
export const PEER_SCRIPT = '#!/bin/sh\necho "deployed $mark"\n';

export interface HeatMetadataIds {
  serverId: string;
  stackId: string;
  configId: string;
  deploymentId: string;
  /** The temp URL itself (Heat puts it in the metadata's `os-collect-config` section). */
  metadataUrl: string;
  /** Where the deployment's signal would be PUT (another temp URL, never called here). */
  signalUrl: string;
}

/**
 * The metadata Heat writes for a server with one `script` deployment, at `revision` (each
 * change sets a new `mark` input and `updated_time`, as a changed deployment does). The
 * smallest realistic document: a real stack's has more deployments and longer scripts, so the
 * bytes per poll measured with it are a floor.
 */
export function heatMetadata(ids: HeatMetadataIds, revision: number, changedAt: Date): Record<string, unknown> {
  const input = (name: string, description: string, value: string): Record<string, unknown> => ({
    type: 'String',
    name,
    value,
    description,
  });
  return {
    'os-collect-config': {
      request: { metadata_url: ids.metadataUrl },
      collectors: ['ec2', 'request', 'local'],
      polling_interval: 30,
    },
    deployments: [
      {
        inputs: [
          input('mark', 'Changed by every revision', `r${revision}`),
          input('deploy_server_id', 'ID of the server being deployed to', ids.serverId),
          input('deploy_action', 'Name of the current action being deployed', revision === 0 ? 'CREATE' : 'UPDATE'),
          input('deploy_stack_id', 'ID of the stack this deployment belongs to', `bench/${ids.stackId}`),
          input('deploy_resource_name', 'Name of this deployment resource in the stack', 'deployment'),
          input(
            'deploy_signal_transport',
            'How the server should signal to heat with the deployment output values.',
            'TEMP_URL_SIGNAL',
          ),
          input('deploy_signal_id', 'ID of signal to use for signaling output values', ids.signalUrl),
          input('deploy_signal_verb', 'HTTP verb to use for signaling outputvalues', 'PUT'),
        ],
        group: 'script',
        name: 'bench-deployment',
        outputs: [],
        creation_time: '2026-01-01T00:00:00Z',
        updated_time: changedAt.toISOString().replace(/\.\d+Z$/, 'Z'),
        options: {},
        config: PEER_SCRIPT,
        id: ids.configId,
      },
    ],
  };
}

/** One request the server answered. */
export interface PeerRequest {
  method: string;
  /** Arrival, epoch ms (bench/util.ts nowMs: comparable with the inotify times). */
  atMs: number;
  status: number;
  /** The document revision the answer carried (the current one, also for a HEAD). */
  revision: number;
}

export interface PeerCounters {
  connections: number;
  requests: number;
  heads: number;
  gets: number;
  /** TCP payload bytes read from and written to the server's sockets (no IP/TCP headers). */
  bytesIn: number;
  bytesOut: number;
}

export interface PeerServerOptions {
  host?: string;
  port?: number;
  /** Clock for request times and Last-Modified, epoch ms. */
  now?: () => number;
}

export class PeerMetadataServer {
  readonly url: string;
  readonly ids: HeatMetadataIds;
  /** Every request answered, in order. */
  readonly requests: PeerRequest[] = [];
  readonly #server: http.Server;
  readonly #now: () => number;
  readonly #path: string;
  readonly #sig: string;
  readonly #sockets = new Set<Socket>();
  #closedIn = 0;
  #closedOut = 0;
  #connections = 0;
  #revision = 0;
  #body = Buffer.alloc(0);
  #etag = '';
  #lastModified = '';
  #changedAtMs = 0;

  private constructor(server: http.Server, port: number, host: string, now: () => number) {
    this.#server = server;
    this.#now = now;
    const tenant = randomUUID().replaceAll('-', '');
    const obj = randomUUID();
    this.#path = `/v1/AUTH_${tenant}/bench-server-metadata/${obj}`;
    this.#sig = createHash('sha1').update(obj).digest('hex');
    const expires = 2_000_000_000;
    const base = `http://${host}:${port}`;
    this.url = `${base}${this.#path}?temp_url_sig=${this.#sig}&temp_url_expires=${expires}`;
    this.ids = {
      serverId: randomUUID(),
      stackId: randomUUID(),
      configId: randomUUID(),
      deploymentId: randomUUID(),
      metadataUrl: this.url,
      signalUrl: `${base}/v1/AUTH_${tenant}/bench-signals/${randomUUID()}?temp_url_sig=${this.#sig}&temp_url_expires=${expires}`,
    };
    this.#render(new Date(now()));
  }

  /** Listens on `host:port` (default 127.0.0.1, any free port). */
  static async start(o: PeerServerOptions = {}): Promise<PeerMetadataServer> {
    const host = o.host ?? '127.0.0.1';
    let self: PeerMetadataServer | null = null;
    const server = http.createServer((req, res) => self?.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(o.port ?? 0, host, () => resolve());
    });
    self = new PeerMetadataServer(server, (server.address() as AddressInfo).port, host, o.now ?? nowMs);
    const s = self;
    server.on('connection', (sock: Socket) => s.#track(sock));
    return self;
  }

  get revision(): number {
    return this.#revision;
  }

  /** The document as served now (its bytes are the GET's body). */
  get body(): Buffer {
    return this.#body;
  }

  /** When the current revision was published, epoch ms. */
  get changedAtMs(): number {
    return this.#changedAtMs;
  }

  /** Publishes the next revision; returns the moment it became visible, epoch ms. */
  change(): number {
    this.#revision++;
    this.#render(new Date(this.#now()));
    return this.#changedAtMs;
  }

  counters(): PeerCounters {
    let bytesIn = this.#closedIn;
    let bytesOut = this.#closedOut;
    for (const s of this.#sockets) {
      bytesIn += s.bytesRead;
      bytesOut += s.bytesWritten;
    }
    let heads = 0;
    let gets = 0;
    for (const r of this.requests) {
      if (r.method === 'HEAD') heads++;
      else if (r.method === 'GET') gets++;
    }
    return { connections: this.#connections, requests: this.requests.length, heads, gets, bytesIn, bytesOut };
  }

  /** Idempotent. */
  async close(): Promise<void> {
    if (!this.#server.listening) return;
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const atMs = this.#now();
    const u = new URL(req.url ?? '/', 'http://x');
    let status = 200;
    if (u.pathname !== this.#path) status = 404;
    else if (u.searchParams.get('temp_url_sig') !== this.#sig) status = 401;
    else if (req.method !== 'GET' && req.method !== 'HEAD') status = 405;
    this.requests.push({ method: req.method ?? '?', atMs, status, revision: this.#revision });
    // drain any request body, so keep-alive works for the next request
    req.resume();
    if (status !== 200) {
      const msg = Buffer.from(http.STATUS_CODES[status] ?? 'error');
      res.writeHead(status, { 'Content-Type': 'text/plain', 'Content-Length': msg.length });
      res.end(req.method === 'HEAD' ? undefined : msg);
      return;
    }
    res.writeHead(200, {
      'Content-Type': 'application/json',
      'Content-Length': this.#body.length,
      ETag: this.#etag,
      'Last-Modified': this.#lastModified,
      'X-Timestamp': (this.#changedAtMs / 1000).toFixed(5),
      'Accept-Ranges': 'bytes',
      'X-Trans-Id': `tx${randomUUID().replaceAll('-', '').slice(0, 21)}-00${Math.floor(atMs / 1000).toString(16)}`,
    });
    res.end(req.method === 'HEAD' ? undefined : this.#body);
  }

  #render(at: Date): void {
    this.#changedAtMs = at.getTime();
    this.#body = Buffer.from(JSON.stringify(heatMetadata(this.ids, this.#revision, at)));
    this.#etag = createHash('md5').update(this.#body).digest('hex');
    this.#lastModified = at.toUTCString();
  }

  #track(sock: Socket): void {
    this.#connections++;
    this.#sockets.add(sock);
    sock.once('close', () => {
      this.#sockets.delete(sock);
      this.#closedIn += sock.bytesRead;
      this.#closedOut += sock.bytesWritten;
    });
  }
}
