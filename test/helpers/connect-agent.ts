/**
 * A minimal agent that dials the controller's `--connect-listen` (`wss://…/v1/connect`) with an
 * agent certificate and speaks the push frames by hand (protocol/frames.ts): the controller's
 * side of dialled-in connections is tested against real TLS and a real `ws` client, with no
 * agent code behind it, so a test can send what a real agent never would. Every wake-up it gets
 * is verified by the real `WakeVerifier` (signature, audience, issuer = the controller).
 */
import { once } from 'node:events';
import WebSocket from 'ws';
import { spiffeIdOf } from '../../protocol/identity.js';
import type { KeySet } from '../../protocol/jws.js';
import { encodeAck, encodeFetch, encodeSignal, FEATURES_HEADER, type FetchState } from '../../protocol/frames.js';
import { MAX_PUSH_METADATA_FRAME_BYTES } from '../../protocol/limits.js';
import { WakeVerifier, type WakeClaims } from '../../protocol/wake.js';

export const TD = 'herald.local';

export interface AgentCred {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/** What the controller answered instead of upgrading. */
export interface Refusal {
  status: number;
  code: string | undefined;
}

/** A queue of things that arrive, taken in order, each waited for without sleeping. */
class Arrivals<T> {
  readonly #items: T[] = [];
  readonly #waiting: Array<(t: T) => void> = [];
  push(t: T): void {
    const w = this.#waiting.shift();
    if (w) w(t);
    else this.#items.push(t);
  }
  next(timeoutMs: number, what: string): Promise<T> {
    const t = this.#items.shift();
    if (t !== undefined) return Promise.resolve(t);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const i = this.#waiting.indexOf(fn);
        if (i >= 0) this.#waiting.splice(i, 1);
        reject(new Error(`no ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      const fn = (x: T): void => {
        clearTimeout(timer);
        resolve(x);
      };
      this.#waiting.push(fn);
    });
  }
  get pending(): number {
    return this.#items.length;
  }
}

export interface DialledInAgent {
  node: string;
  ws: WebSocket;
  /** The upgrade response's Herald-Features header. */
  features: string | undefined;
  /** The next verified wake-up (its claims). */
  nextWake(timeoutMs?: number): Promise<WakeClaims>;
  /** The next frame that is not a wake-up (a metadata or signalled answer). */
  nextAnswer(timeoutMs?: number): Promise<Buffer>;
  /** Wake-ups received and not taken yet. */
  readonly pendingWakes: number;
  ack(c: WakeClaims, gen: number, fetch?: FetchState): void;
  fetch(nonce: string, ifNoneMatch?: string): void;
  signal(nonce: string, deployment: string, body: Uint8Array): void;
  /** Resolves with the close code and reason the agent saw. */
  closed: Promise<{ code: number; reason: string }>;
  close(): Promise<void>;
}

export interface DialInOptions {
  node: string;
  cred: AgentCred;
  /** The signing keys the agent trusts (the wake-ups are verified against them). */
  keys: KeySet;
  /** The controller the wake-ups must come from (`iss`). */
  controller?: string;
  path?: string;
  /** Answer every WebSocket ping (default true, as ws does): false makes a silent peer. */
  autoPong?: boolean;
}

/**
 * Dials `wss://127.0.0.1:<port>/v1/connect` as `agent/<node>`. Rejects with a `Refusal` when the
 * controller answers the upgrade with an HTTP status instead.
 */
export async function dialIn(port: number, o: DialInOptions): Promise<DialledInAgent> {
  const verifier = new WakeVerifier({
    audience: spiffeIdOf(TD, 'agent', o.node),
    keys: () => o.keys,
    startedAtS: Date.now() / 1000 - 60,
  });
  const controller = o.controller ?? spiffeIdOf(TD, 'controller', 'controller');
  const ws = new WebSocket(`wss://127.0.0.1:${port}${o.path ?? '/v1/connect'}`, {
    ...o.cred,
    perMessageDeflate: false,
    maxPayload: MAX_PUSH_METADATA_FRAME_BYTES,
    autoPong: o.autoPong ?? true,
  });
  let features: string | undefined;
  ws.on('upgrade', (res) => {
    const h = res.headers[FEATURES_HEADER];
    features = Array.isArray(h) ? h.join(',') : h;
  });
  const wakes = new Arrivals<WakeClaims>();
  const answers = new Arrivals<Buffer>();
  const closed = new Promise<{ code: number; reason: string }>((resolve) =>
    ws.once('close', (code, reason) => resolve({ code, reason: reason.toString() })),
  );
  ws.on('message', (data: Buffer, isBinary) => {
    if (!isBinary && data[0] !== 0x7b) wakes.push(verifier.verify(data.toString('utf8'), controller));
    else answers.push(data);
  });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        body += c;
      });
      res.on('end', () => {
        let code: string | undefined;
        try {
          code = (JSON.parse(body) as { error?: { code?: string } }).error?.code;
        } catch {
          code = undefined;
        }
        ws.terminate();
        reject(Object.assign(new Error(`refused ${res.statusCode} ${code}`), { status: res.statusCode, code }));
      });
    });
    ws.once('error', reject);
  });
  ws.on('error', () => {});
  return {
    node: o.node,
    ws,
    features,
    nextWake: (t = 5_000) => wakes.next(t, 'wake-up'),
    nextAnswer: (t = 5_000) => answers.next(t, 'answer frame'),
    get pendingWakes() {
      return wakes.pending;
    },
    ack: (c, gen, fetch = 'current') => ws.send(encodeAck(c.jti, gen, fetch)),
    fetch: (nonce, inm) => ws.send(encodeFetch(nonce, inm)),
    signal: (nonce, deployment, body) => ws.send(encodeSignal(nonce, deployment, body), { binary: false }),
    closed,
    close: async () => {
      if (ws.readyState === WebSocket.CLOSED) return;
      ws.terminate();
      await once(ws, 'close');
    },
  };
}

/** The HTTP answer to an upgrade the controller refuses (status and `{"error":{"code"}}`). */
export async function refusalOf(port: number, o: DialInOptions): Promise<Refusal> {
  try {
    const a = await dialIn(port, o);
    await a.close();
    throw new Error('the upgrade was accepted');
  } catch (err) {
    const e = err as { status?: number; code?: string };
    if (e.status === undefined) throw err;
    return { status: e.status, code: e.code };
  }
}
