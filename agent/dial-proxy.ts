/**
 * The HTTP CONNECT proxy an agent dialling out goes through (docs/dial-out.md). `HTTPS_PROXY` (or
 * `https_proxy`) names it, `http://[user:password@]host[:port]`; `NO_PROXY` (or `no_proxy`) lists
 * the hosts reached directly: host names and their suffixes (`example.com` and `.example.com` both
 * cover `ctl.example.com`), or `*` for every host; a port in an entry is ignored. The agent asks
 * the proxy for a tunnel to the controller's host and port (`CONNECT host:port`, with basic auth
 * from the URL's user info) and then speaks TLS with the controller through it, checking the
 * controller end to end as on a direct dial: the proxy sees the host and port, never a byte of the
 * connection. An answer other than 2xx is `proxy_refused`, with its status.
 *
 * The environment is read by the command line (agent/cli.ts) and handed in; nothing here reads it.
 */
import net from 'node:net';
import { ConfigError, RefusalError } from '../protocol/errors.js';
import { MAX_PROXY_ANSWER_HEAD_BYTES } from '../protocol/limits.js';

/** The proxy settings of the environment, as given (unparsed). */
export interface ProxyEnv {
  /** `HTTPS_PROXY`, else `https_proxy`. */
  httpsProxy?: string | undefined;
  /** `NO_PROXY`, else `no_proxy`. */
  noProxy?: string | undefined;
}

/** A parsed proxy: where it is, and the hosts it is not used for. */
export interface DialProxy {
  url: URL;
  /** Lowercase host suffixes, without ports or a leading `*`; `*` alone: no host uses the proxy. */
  noProxy: readonly string[];
}

/** The proxy variables of `env` (upper case first; an empty value counts as unset). */
export function proxyEnvOf(env: Readonly<Record<string, string | undefined>>): ProxyEnv {
  const first = (...names: string[]): string | undefined => {
    for (const n of names) {
      const v = env[n]?.trim();
      if (v) return v;
    }
    return undefined;
  };
  return { httpsProxy: first('HTTPS_PROXY', 'https_proxy'), noProxy: first('NO_PROXY', 'no_proxy') };
}

/**
 * Parses the proxy settings; undefined when no proxy is set.
 * @throws ConfigError naming `HTTPS_PROXY` when it is not `http://[user:password@]host[:port][/]`
 */
export function parseDialProxy(env: ProxyEnv): DialProxy | undefined {
  if (env.httpsProxy === undefined) return undefined;
  let url: URL | undefined;
  try {
    url = new URL(env.httpsProxy);
  } catch {
    url = undefined;
  }
  if (
    url === undefined ||
    url.protocol !== 'http:' ||
    url.hostname === '' ||
    (url.pathname !== '/' && url.pathname !== '') ||
    url.search ||
    url.hash
  ) {
    throw new ConfigError(
      `HTTPS_PROXY ${JSON.stringify(redact(env.httpsProxy).slice(0, 200))} is not http://[user:password@]host[:port]: the agent speaks HTTP CONNECT to its proxy (the connection to the controller inside the tunnel is TLS)`,
      { field: 'HTTPS_PROXY' },
    );
  }
  const noProxy = (env.noProxy ?? '')
    .split(/[,\s]+/)
    .map((e) => e.trim().toLowerCase())
    .filter((e) => e !== '')
    .map((e) => (e === '*' ? e : hostOfEntry(e)))
    .filter((e) => e !== '');
  return { url, noProxy };
}

/** The proxy to dial `target` through, or undefined when it is dialled directly. */
export function proxyFor(target: URL, proxy: DialProxy | undefined): URL | undefined {
  if (proxy === undefined) return undefined;
  const host = bare(target.hostname.toLowerCase());
  for (const e of proxy.noProxy) {
    if (e === '*' || host === e || host.endsWith(`.${e}`)) return undefined;
  }
  return proxy.url;
}

/** A tunnel being opened: its socket (destroy it to give up) and the moment it is ready. */
export interface Tunnel {
  socket: net.Socket;
  /**
   * Resolves with the socket once the proxy answered 2xx: from then on it carries the connection
   * to `host:port`. Rejects with RefusalError `proxy_refused` (an answer other than 2xx, one
   * without a readable status line or over MAX_PROXY_ANSWER_HEAD_BYTES, or bytes before the
   * client spoke), `connection_reset` when the proxy closed without an answer, or the socket's
   * error (a refused or unreachable proxy).
   */
  ready: Promise<net.Socket>;
}

/** Asks the proxy at `proxy` for a tunnel to `host:port` (HTTP CONNECT). */
export function openTunnel(proxy: URL, host: string, port: number): Tunnel {
  const socket = net.connect({ host: bare(proxy.hostname), port: Number(proxy.port || 80) });
  const authority = `${net.isIPv6(bare(host)) ? `[${bare(host)}]` : host}:${port}`;
  const auth =
    proxy.username !== ''
      ? `Proxy-Authorization: Basic ${Buffer.from(`${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`).toString('base64')}\r\n`
      : '';
  const ready = new Promise<net.Socket>((resolve, reject) => {
    let head = Buffer.alloc(0);
    const done = (err?: Error): void => {
      socket.off('data', onData);
      socket.off('error', onError);
      socket.off('close', onClose);
      if (err === undefined) {
        resolve(socket);
        return;
      }
      socket.destroy();
      reject(err);
    };
    const onError = (err: Error): void => done(err);
    const onClose = (): void =>
      done(new RefusalError('connection_reset', 'the proxy closed the connection before it answered the CONNECT'));
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_PROXY_ANSWER_HEAD_BYTES)
          done(
            new RefusalError('proxy_refused', `the proxy's answer head is over ${MAX_PROXY_ANSWER_HEAD_BYTES} bytes`),
          );
        return;
      }
      const status = /^HTTP\/1\.[01] (\d{3})/.exec(head.subarray(0, Math.min(end, 64)).toString('latin1'))?.[1];
      if (status === undefined) {
        done(new RefusalError('proxy_refused', 'the proxy answered the CONNECT with no HTTP status line'));
      } else if (!status.startsWith('2')) {
        done(proxyRefused(Number(status)));
      } else if (head.length > end + 4) {
        // the controller speaks only after the agent's TLS hello: these bytes are the proxy's
        done(new RefusalError('proxy_refused', 'the proxy sent bytes after its answer before the tunnel was used'));
      } else {
        socket.pause();
        done();
      }
    };
    socket.on('data', onData);
    socket.on('error', onError);
    socket.on('close', onClose);
    socket.once('connect', () => {
      socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}\r\n`);
    });
  });
  return { socket, ready };
}

/**
 * Opens a connection's tunnel through `proxy` when it covers the host (`proxyFor`), giving up after
 * `timeoutMs` (an `ETIMEDOUT` error: a request's own timeout starts only once it has its socket).
 * The connect function of certs/tls.ts's `httpsAgentFor` (`via`) and of enrolment.
 */
export function tunnelVia(
  proxy: DialProxy,
  timeoutMs: number,
): (host: string, port: number) => Promise<net.Socket> | undefined {
  return (host, port) => {
    const target = new URL(`https://${net.isIPv6(host) ? `[${host}]` : host}:${port}`);
    const via = proxyFor(target, proxy);
    if (via === undefined) return undefined;
    const tunnel = openTunnel(via, host, port);
    const timer = setTimeout(
      () =>
        tunnel.socket.destroy(
          Object.assign(new Error(`the proxy's tunnel to ${host}:${port} was not open after ${timeoutMs} ms`), {
            code: 'ETIMEDOUT',
          }),
        ),
      timeoutMs,
    );
    return tunnel.ready.finally(() => clearTimeout(timer));
  };
}

/** The refusal of a proxy that answered `status`; the status is in its message and `status`. */
function proxyRefused(status: number): RefusalError & { status: number } {
  const why = status === 407 ? ' (proxy authentication required: give user:password in HTTPS_PROXY)' : '';
  return Object.assign(new RefusalError('proxy_refused', `the proxy answered the CONNECT with ${status}${why}`), {
    status,
  });
}

/** An entry's host: its port and a leading `*` dropped, and a leading dot (`.example.com` covers the name and below). */
function hostOfEntry(e: string): string {
  let h = e.startsWith('*') ? e.slice(1) : e;
  const v6 = /^\[([^\]]+)\](?::\d+)?$/.exec(h);
  if (v6) return v6[1]!;
  if (!net.isIPv6(h)) h = h.replace(/:\d+$/, '');
  return h.replace(/^\.+/, '');
}

/** A URL's host without IPv6 brackets. */
function bare(host: string): string {
  return host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
}

/** The proxy URL without its password, for a message. */
function redact(u: string): string {
  return u.replace(/\/\/([^@/:]*):[^@/]*@/, '//$1:***@');
}
