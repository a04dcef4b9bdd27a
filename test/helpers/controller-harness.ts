/**
 * Runs a controller in-process for API tests (real TLS on 127.0.0.1:0, a temp SQLite file, a
 * memory logger, a push stub that records what it was told), and an HTTPS client that presents
 * a given certificate.
 */
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import { startController, type RunningController, type StartDeps } from '../../controller/main.js';
import type { ControllerOptions } from '../../controller/options.js';
import {
  IDLE_PUSH_STATE,
  type PushEvents,
  type PushRequestHandler,
  type PushService,
  type PushState,
  type PushTarget,
} from '../../controller/push/types.js';
import type { WakeReason } from '../../protocol/wake.js';
import type { ControllerTestPki, Cred } from './controller-pki.js';

export interface Res {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  raw: Buffer;
  text: string;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

export interface RequestOptions {
  headers?: Record<string, string>;
  /** Sent as is (no JSON encoding). */
  rawBody?: Buffer | string;
  /** The source address (any of 127.0.0.0/8 on Linux), to act as many peers. */
  localAddress?: string;
}

/** One HTTPS request on a fresh connection. */
export function request(
  port: number,
  cred: Cred,
  method: string,
  p: string,
  body?: unknown,
  o: RequestOptions = {},
): Promise<Res> {
  return new Promise((resolve, reject) => {
    const data =
      o.rawBody !== undefined
        ? Buffer.from(o.rawBody)
        : body === undefined
          ? undefined
          : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string> = {
      ...(data && o.rawBody === undefined ? { 'content-type': 'application/json' } : {}),
      ...(data ? { 'content-length': String(data.length) } : {}),
      ...o.headers,
    };
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: p,
        ...cred,
        servername: 'localhost',
        agent: false,
        headers,
        ...(o.localAddress !== undefined ? { localAddress: o.localAddress } : {}),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const raw = Buffer.concat(chunks);
          const text = raw.toString('utf8');
          let json: unknown;
          try {
            json = text ? JSON.parse(text) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, raw, text, json });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.setTimeout(10_000, () => req.destroy(new Error('request timeout')));
    if (data) req.write(data);
    req.end();
  });
}

/** Records every call the controller makes on its push service. */
export class PushStub implements PushService {
  readonly notified: Array<{ node: string; generation: number; reason: WakeReason }> = [];
  readonly endpoints: Array<{ node: string; url: string | null; generation: number }> = [];
  readonly removed: string[] = [];
  started: PushTarget[] | null = null;
  /** When set, start() waits for it: the controller's start-up is held there. */
  startGate: Promise<void> | null = null;
  closed = false;
  readonly #handlers: { [E in keyof PushEvents]: Array<PushEvents[E]> } = {
    ack: [],
    nack: [],
    state: [],
    attach: [],
    detach: [],
  };

  async start(targets: PushTarget[]): Promise<void> {
    await this.startGate;
    this.started = targets;
  }
  notify(node: string, generation: number, reason: WakeReason): void {
    this.notified.push({ node, generation, reason });
  }
  setEndpoint(node: string, url: string | null, generation: number): void {
    this.endpoints.push({ node, url, generation });
  }
  remove(node: string): void {
    this.removed.push(node);
  }
  readonly signingKids: string[] = [];
  setSigningKey(jwk: { kid: string }): void {
    this.signingKids.push(jwk.kid);
  }
  /** Who answers fetches over push connections (the API): a test calls it as the dialer would. */
  requestHandler: PushRequestHandler | null = null;
  serveRequests(handler: PushRequestHandler): void {
    this.requestHandler = handler;
  }
  state(): PushState {
    return { ...IDLE_PUSH_STATE };
  }
  on<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void {
    (this.#handlers[event] as Array<PushEvents[E]>).push(fn);
  }
  emit<E extends keyof PushEvents>(event: E, ...args: Parameters<PushEvents[E]>): void {
    for (const h of this.#handlers[event]) (h as (...a: unknown[]) => void)(...args);
  }
  async close(): Promise<void> {
    this.closed = true;
  }
}

export interface TestController {
  ctl: RunningController;
  port: number;
  /** What the controller told its push service (nothing when started with `realPush`). */
  push: PushStub;
  /** Every log line, as written (JSON text). */
  logText(): string;
  logLines(): Array<Record<string, unknown>>;
  dbPath: string;
  req(cred: Cred, method: string, p: string, body?: unknown, o?: RequestOptions): Promise<Res>;
  close(): Promise<void>;
}

export function memoryLogger(): { logger: Logger; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      chunks.push(chunk.toString());
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, stream), text: () => chunks.join('') };
}

export async function startTestController(
  pki: ControllerTestPki,
  over: Partial<ControllerOptions> = {},
  deps: Omit<StartDeps, 'logger' | 'push'> & {
    /** The controller's own push dialer (in-process) instead of the stub: it dials agents for real. */
    realPush?: boolean;
    /** The stub to use (default a new one). */
    pushStub?: PushStub;
  } = {},
): Promise<TestController> {
  // a temp dir only when the test gives no database of its own (removed at close)
  const dbDir = over.db === undefined ? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ctl-db-')) : null;
  const dbPath = over.db ?? path.join(dbDir!, 'herald.db');
  const { logger, text } = memoryLogger();
  const push = deps.pushStub ?? new PushStub();
  const options: ControllerOptions = {
    listen: { host: '127.0.0.1', port: 0 },
    pki: pki.dir,
    db: dbPath,
    name: 'controller',
    trustDomain: undefined,
    healthListen: null,
    autoRegister: true,
    publicUrl: null,
    pushWorkers: 0,
    logLevel: 'debug',
    ca: undefined,
    cert: undefined,
    key: undefined,
    signingKey: undefined,
    ...over,
  };
  const { realPush, pushStub: _, ...startDeps } = deps;
  let ctl: RunningController;
  try {
    ctl = await startController(options, { ...startDeps, logger, ...(realPush ? {} : { push: () => push }) });
  } catch (err) {
    if (dbDir !== null) fs.rmSync(dbDir, { recursive: true, force: true }); // (a start a test expects to fail)
    throw err;
  }
  const port = ctl.address.port;
  return {
    ctl,
    port,
    push,
    dbPath,
    logText: text,
    logLines: () =>
      text()
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    req: (cred, method, p, body, o) => request(port, cred, method, p, body, o),
    close: async () => {
      await ctl.close();
      if (dbDir !== null) fs.rmSync(dbDir, { recursive: true, force: true });
    },
  };
}

/** Polls `fn` every 10 ms until it returns a truthy value, failing after `ms`. */
export async function waitFor<T>(what: string, fn: () => T | Promise<T>, ms = 10_000): Promise<NonNullable<T>> {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v as NonNullable<T>;
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
