/**
 * The operator's side of the controller API, for the benchmark: JSON over one keep-alive
 * mutual-TLS agent, and `/metrics` parsed into numbers.
 */
import https from 'node:https';

export interface ApiReply<T = unknown> {
  status: number;
  json: T;
  raw: string;
}

export class OperatorClient {
  readonly #agent: https.Agent;
  readonly #port: number;
  readonly #host: string;

  constructor(cred: { ca: Buffer; cert: Buffer; key: Buffer }, host: string, port: number, maxSockets = 16) {
    this.#host = host;
    this.#port = port;
    this.#agent = new https.Agent({
      ...cred,
      keepAlive: true,
      maxSockets,
      minVersion: 'TLSv1.3',
      // the controller is identified by its SPIFFE id in production; here it is ours, on loopback
      checkServerIdentity: () => undefined,
    });
  }

  request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    timeoutMs = 60_000,
    headers: Record<string, string> = {},
  ): Promise<ApiReply<T>> {
    return new Promise((resolve, reject) => {
      const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = https.request(
        {
          host: this.#host,
          port: this.#port,
          method,
          path,
          agent: this.#agent,
          headers: {
            ...(data ? { 'content-type': 'application/json', 'content-length': data.length } : {}),
            ...headers,
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (d: Buffer) => chunks.push(d));
          res.on('end', () => {
            const raw = Buffer.concat(chunks).toString('utf8');
            let json: unknown;
            try {
              json = raw ? JSON.parse(raw) : undefined;
            } catch {
              json = undefined;
            }
            resolve({ status: res.statusCode ?? 0, json: json as T, raw });
          });
          res.on('error', reject);
        },
      );
      req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${path} timed out`)));
      req.on('error', reject);
      req.end(data);
    });
  }

  /** Like request(), but throws unless the status is `want`. */
  async must<T = Record<string, unknown>>(
    want: number,
    method: string,
    path: string,
    body?: unknown,
    timeoutMs?: number,
    headers?: Record<string, string>,
  ): Promise<T> {
    const r = await this.request<T>(method, path, body, timeoutMs, headers);
    if (r.status !== want) throw new Error(`${method} ${path} → ${r.status} (wanted ${want}): ${r.raw.slice(0, 300)}`);
    return r.json;
  }

  /** `/metrics` as `name{labels}` → value. */
  async metrics(): Promise<Map<string, number>> {
    const r = await this.request('GET', '/metrics');
    if (r.status !== 200) throw new Error(`/metrics → ${r.status}`);
    return parseProm(r.raw);
  }

  close(): void {
    this.#agent.destroy();
  }
}

/** Parses Prometheus text exposition into `name{labels}` → value (labels as written). */
export function parseProm(text: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    if (i < 0) continue;
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return m;
}

/** Sum of every series of metric `name` (any labels), optionally filtered by a label substring. */
export function metricSum(m: Map<string, number>, name: string, labelHas?: string): number {
  let s = 0;
  for (const [k, v] of m) {
    if (k !== name && !k.startsWith(`${name}{`)) continue;
    if (labelHas !== undefined && !k.includes(labelHas)) continue;
    s += v;
  }
  return s;
}

/** A histogram's counts (Prometheus: cumulative, by upper bound), from one scrape. */
export interface HistogramShares {
  count: number;
  /** Sum of the observations, seconds (or the histogram's unit). */
  sum: number;
  /** Observations at or below each bound, ascending; `+Inf` left out (it is `count`). */
  atMost: Array<{ le: number; count: number }>;
}

/** Histogram `name` of a parsed scrape (its `_bucket`, `_count` and `_sum` series, summed over other labels). */
export function histogramShares(m: Map<string, number>, name: string): HistogramShares {
  const byLe = new Map<number, number>();
  for (const [k, v] of m) {
    if (!k.startsWith(`${name}_bucket{`)) continue;
    const le = /le="([^"]+)"/.exec(k)?.[1];
    if (le === undefined || le === '+Inf') continue;
    const bound = Number(le);
    byLe.set(bound, (byLe.get(bound) ?? 0) + v);
  }
  return {
    count: metricSum(m, `${name}_count`),
    sum: metricSum(m, `${name}_sum`),
    atMost: [...byLe.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => ({ le, count })),
  };
}

/** Of a histogram's observations, how many exceeded `bound` (the nearest bucket bound at or below it counts). */
export function countAbove(h: HistogramShares, bound: number): number {
  let at = 0;
  for (const b of h.atMost) if (b.le <= bound) at = b.count;
  return h.count - at;
}
