/**
 * One kept-alive HTTPS connection to a controller, for tests that watch the server close it
 * (a revocation): `get()` sends GET /healthz over it, `socket()` is the connection it used last,
 * `close()` ends it.
 */
import https from 'node:https';
import type tls from 'node:tls';

export interface KeptAlive {
  get(): Promise<number>;
  socket(): tls.TLSSocket | undefined;
  close(): void;
}

export function keptAlive(port: number, cred: Pick<https.AgentOptions, 'ca' | 'cert' | 'key'>): KeptAlive {
  const agent = new https.Agent({ keepAlive: true, ...cred });
  let live: tls.TLSSocket | undefined;
  return {
    socket: () => live,
    close: () => agent.destroy(),
    get: () =>
      new Promise((resolve, reject) => {
        const q = https.request(
          { host: '127.0.0.1', port, path: '/healthz', servername: 'localhost', agent },
          (res) => {
            live = res.socket as tls.TLSSocket;
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          },
        );
        q.on('error', reject);
        q.end();
      }),
  };
}
