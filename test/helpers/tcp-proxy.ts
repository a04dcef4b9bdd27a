/**
 * A small TCP proxy on 127.0.0.1 in front of a real server, that a test can stop (its listener
 * closed and every connection through it destroyed) and start again on the same port. TLS passes
 * through untouched, so the client still checks the real server's identity end to end: the proxy
 * only stands for "this URL's controller went away". It can also lose one answer on the way
 * (`loseNextAnswer`): the request reaches the server, its answer never reaches the client; or
 * stop passing anything on while keeping its connections open (`blackhole`).
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
  #loss: { minRecordBytes: number; taken: boolean; onRequest: (cut: () => void) => void } | undefined;

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
      const loss = this.#loss;
      if (loss === undefined || loss.taken) {
        client.pipe(upstream);
        upstream.pipe(client);
        return;
      }
      // watch the client's TLS records: the first application-data record longer than any a
      // client without a certificate sends in its handshake is its request; from then on
      // nothing of the server's reaches this client
      let held = false;
      let unread = Buffer.alloc(0);
      client.on('data', (c: Buffer) => {
        upstream.write(c);
        if (loss.taken) return;
        unread = Buffer.concat([unread, c]);
        while (unread.length >= 5) {
          const type = unread[0];
          const length = unread.readUInt16BE(3);
          if (type === TLS_APPLICATION_DATA && length > loss.minRecordBytes) {
            loss.taken = true;
            held = true;
            loss.onRequest(() => {
              client.destroy();
              upstream.destroy();
            });
            return;
          }
          if (unread.length < 5 + length) break;
          unread = unread.subarray(5 + length);
        }
      });
      upstream.on('data', (c: Buffer) => {
        if (!held) client.write(c);
      });
      client.on('end', () => upstream.end());
      upstream.on('end', () => {
        if (!held) client.end();
      });
    });
    server.listen(port, '127.0.0.1');
    await once(server, 'listening');
    this.port = (server.address() as net.AddressInfo).port;
    this.#server = server;
    return this;
  }

  /**
   * Loses the answer to the next request made through the proxy: its connection gets nothing
   * more from the server once the client's request has gone through. Resolves with `cut`, which
   * destroys that connection (call it when the server has acted on the request). A request is a
   * TLS application-data record over `minRecordBytes`: a client without a certificate sends
   * none that long in its handshake.
   */
  loseNextAnswer(minRecordBytes = 256): Promise<() => void> {
    return new Promise((resolve) => {
      this.#loss = { minRecordBytes, taken: false, onRequest: resolve };
    });
  }

  get url(): string {
    return `https://127.0.0.1:${this.port}`;
  }

  /**
   * From now on nothing passes either way on the connections open now, and none is closed: what a
   * silently dropped NAT mapping looks like to both ends (for connections piped through, not one
   * whose answer `loseNextAnswer` holds).
   */
  blackhole(): void {
    for (const s of this.#sockets) {
      s.unpipe();
      s.removeAllListeners('data');
      s.removeAllListeners('end');
      s.on('data', () => undefined);
    }
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

/** TLS record content type of application data (RFC 8446 §5.1): TLS 1.3 encrypts all under it. */
const TLS_APPLICATION_DATA = 23;

/** A port nothing listens on (bound, then closed): connections to it are refused. */
export async function deadPort(): Promise<number> {
  const s = net.createServer();
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}
