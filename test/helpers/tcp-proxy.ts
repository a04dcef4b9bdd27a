/**
 * A small TCP proxy on 127.0.0.1 in front of a real server, that a test can stop (its listener
 * closed and every connection through it destroyed) and start again on the same port. TLS passes
 * through untouched, so the client still checks the real server's identity end to end: the proxy
 * only stands for "this URL's controller went away".
 */
import { once } from 'node:events';
import net from 'node:net';

export class TcpProxy {
  readonly targetPort: number;
  port = 0;
  /** Connections accepted since the last start. */
  connections = 0;
  #server: net.Server | undefined;
  readonly #sockets = new Set<net.Socket>();

  constructor(targetPort: number) {
    this.targetPort = targetPort;
  }

  /** Listens on `port` (default: the last one, else a free one). */
  async start(port = this.port): Promise<this> {
    this.connections = 0;
    const server = net.createServer((client) => {
      this.connections++;
      const upstream = net.connect(this.targetPort, '127.0.0.1');
      for (const s of [client, upstream]) {
        this.#sockets.add(s);
        s.on('close', () => this.#sockets.delete(s));
        s.on('error', () => {
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
    server.listen(port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as net.AddressInfo).port;
    this.#server = server;
    return this;
  }

  get url(): string {
    return `https://127.0.0.1:${this.port}`;
  }

  /** Stops listening and cuts every connection through it. Idempotent. */
  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    for (const s of this.#sockets) s.destroy();
    this.#sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

/** A port nothing listens on (bound, then closed): connections to it are refused. */
export async function deadPort(): Promise<number> {
  const s = net.createServer();
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}
