/**
 * A rollout's external gate (docs/api.md `gate`), read outside any transaction: an HTTPS URL
 * whose 2xx answer means go (any other status: stop), or a Prometheus instant query whose
 * non-empty result means stop (an empty one: go). A gate that cannot be read (no answer within
 * GATE_TIMEOUT_MS, a TLS or connection failure, an answer over MAX_GATE_ANSWER_BYTES, a
 * Prometheus answer that is not a successful query) stops the rollout unless `fail_open`.
 *
 * The gate's certificate is checked as any HTTPS client checks it: the system's CAs (and
 * NODE_EXTRA_CA_CERTS), the URL's host name. The answer's meaning is kept with the rollout by
 * the engine (ClusterEngine.recordGate), so a controller killed after it does not ask again.
 */
import https from 'node:https';
import { GATE_TIMEOUT_MS, MAX_GATE_ANSWER_BYTES } from '../../protocol/limits.js';
import type { GateVerdict, RolloutGate } from '../model/records.js';

export interface GateReadOptions {
  timeoutMs?: number;
  now?: () => number;
}

interface Answer {
  status: number;
  body: Buffer;
}

/** GETs `url`; rejects with why it could not be read. */
function get(url: URL, timeoutMs: number): Promise<Answer> {
  return new Promise<Answer>((resolve, reject) => {
    const req = https.request(url, { method: 'GET', headers: { accept: 'application/json' } });
    const fail = (why: string): void => {
      clearTimeout(timer);
      req.destroy();
      reject(new Error(why));
    };
    const timer = setTimeout(() => fail(`no answer within ${timeoutMs} ms`), timeoutMs);
    req.on('error', (err: NodeJS.ErrnoException) => fail(err.code ?? err.message));
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (d: Buffer) => {
        size += d.length;
        if (size > MAX_GATE_ANSWER_BYTES) fail(`an answer over ${MAX_GATE_ANSWER_BYTES} bytes`);
        else chunks.push(d);
      });
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) });
      });
      res.on('error', (err) => fail(err.message));
    });
    req.end();
  });
}

/** What a Prometheus instant query's answer says: the number of series, or why it is not an answer. */
function seriesOf(a: Answer): number | string {
  if (a.status < 200 || a.status > 299) return `HTTP ${a.status}`;
  let v: unknown;
  try {
    v = JSON.parse(a.body.toString('utf8'));
  } catch {
    return 'an answer that is not JSON';
  }
  const d = v as { status?: unknown; data?: { result?: unknown } } | null;
  if (d?.status !== 'success' || !Array.isArray(d.data?.result)) return 'an answer that is not a successful query';
  return d.data.result.length;
}

/**
 * Reads gate `g` once. Never rejects: an unreadable gate is a verdict too (`error`), stop unless
 * `g.failOpen`. `detail` never holds the answer's body (it may be anything).
 */
export async function readGate(g: RolloutGate, o: GateReadOptions = {}): Promise<Omit<GateVerdict, 'used'>> {
  const now = o.now ?? Date.now;
  const timeoutMs = o.timeoutMs ?? GATE_TIMEOUT_MS;
  const unreadable = (why: string): Omit<GateVerdict, 'used'> => ({
    verdict: g.failOpen ? 'go' : 'stop',
    atMs: now(),
    detail: `cannot be read: ${why}${g.failOpen ? ' (fail_open: go)' : ''}`,
    error: true,
  });
  try {
    if (g.kind === 'url') {
      const a = await get(new URL(g.url), timeoutMs);
      const go = a.status >= 200 && a.status <= 299;
      return { verdict: go ? 'go' : 'stop', atMs: now(), detail: `HTTP ${a.status}`, error: false };
    }
    const base = g.url.endsWith('/') ? g.url : `${g.url}/`;
    const url = new URL('api/v1/query', base);
    url.searchParams.set('query', g.query ?? '');
    const n = seriesOf(await get(url, timeoutMs));
    if (typeof n === 'string') return unreadable(n);
    return {
      verdict: n === 0 ? 'go' : 'stop',
      atMs: now(),
      detail: n === 0 ? 'the query has no result' : `the query has ${n} series`,
      error: false,
    };
  } catch (err) {
    return unreadable((err as Error).message);
  }
}
