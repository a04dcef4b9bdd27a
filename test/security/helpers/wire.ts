/**
 * Attackers' clients for the agent listener: a raw TLS client that asks for the WebSocket
 * upgrade by hand (so it can resume a TLS session and see exactly what came back), a `ws`
 * client for connections that must open, and frame helpers. No client checks the agent's
 * certificate name: that is not what the attacks are about (they do trust the cluster CA).
 */
import crypto from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import WebSocket from 'ws';
import { decodeAnswer, type AnswerFrame } from '../../../protocol/frames.js';
import { WAKE_TYP, type Signer } from '../../../protocol/jws.js';
import { newJti, signWake, type WakeReason } from '../../../protocol/wake.js';
import type { Cred } from './battery.js';

export type RawOutcome =
  /** An HTTP answer: its status and `error.code`. */
  | { kind: 'http'; status: number; code: string | undefined; reused: boolean; session: Buffer | undefined }
  /** The TLS handshake failed (an alert, or the socket was reset). */
  | { kind: 'tls'; error: string }
  /** The server closed the socket without answering a byte of HTTP. */
  | { kind: 'closed'; bytes: number; ms: number };

export interface RawOptions {
  path?: string;
  /** Send this instead of the upgrade request (e.g. a plain GET). */
  request?: string;
  /** A TLS session to resume. */
  session?: Buffer;
  minVersion?: tls.SecureVersion;
  maxVersion?: tls.SecureVersion;
  /** Give up after this (default 8 s). */
  timeoutMs?: number;
  /** Wait this long for a session ticket after the answer (to resume later). */
  waitSessionMs?: number;
}

/** The upgrade request a WebSocket client sends. */
export function upgradeRequest(p = '/v1/wake'): string {
  return (
    `GET ${p} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
    `Sec-WebSocket-Key: ${crypto.randomBytes(16).toString('base64')}\r\nSec-WebSocket-Version: 13\r\n\r\n`
  );
}

/** TLS (1.3 unless told) to `port`, then a WebSocket upgrade request; reports what came back. */
export function rawUpgrade(port: number, c: Partial<Cred> | undefined, o: RawOptions = {}): Promise<RawOutcome> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const sock = tls.connect({
      host: '127.0.0.1',
      port,
      servername: 'localhost',
      ca: c?.ca,
      cert: c?.cert,
      key: c?.key,
      session: o.session,
      minVersion: o.minVersion ?? 'TLSv1.3',
      maxVersion: o.maxVersion ?? 'TLSv1.3',
      checkServerIdentity: () => undefined,
    });
    let session: Buffer | undefined;
    let answered: RawOutcome | undefined;
    let buf = Buffer.alloc(0);
    let settled = false;
    const finish = (r: RawOutcome): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      resolve(r);
    };
    const timer = setTimeout(
      () => finish(answered ?? { kind: 'closed', bytes: buf.length, ms: Date.now() - t0 }),
      o.timeoutMs ?? 8_000,
    );
    sock.on('session', (s: Buffer) => {
      session = s;
      if (answered && answered.kind === 'http') finish({ ...answered, session });
    });
    sock.on('secureConnect', () => sock.write(o.request ?? upgradeRequest(o.path)));
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const r = parseHttp(buf);
      if (r === undefined || answered) return;
      answered = { kind: 'http', status: r.status, code: r.code, reused: sock.isSessionReused(), session };
      if (session !== undefined || !o.waitSessionMs) finish(answered);
      else setTimeout(() => finish({ ...(answered as RawOutcome & { kind: 'http' }), session }), o.waitSessionMs);
    });
    sock.on('error', (err: NodeJS.ErrnoException) => {
      if (answered) return finish(answered);
      finish({ kind: 'tls', error: err.code ?? err.message });
    });
    sock.on('close', () => finish(answered ?? { kind: 'closed', bytes: buf.length, ms: Date.now() - t0 }));
  });
}

/** Parses an HTTP response once its head and `Content-Length` body are in. */
function parseHttp(buf: Buffer): { status: number; code: string | undefined } | undefined {
  const s = buf.toString('latin1');
  const end = s.indexOf('\r\n\r\n');
  if (end < 0) return undefined;
  const m = /^HTTP\/1\.1 (\d{3})/.exec(s);
  if (!m) return { status: 0, code: undefined };
  const status = Number(m[1]);
  if (status === 101) return { status, code: undefined };
  const len = Number(/\r\ncontent-length:\s*(\d+)/i.exec(s.slice(0, end))?.[1] ?? 0);
  const body = buf.subarray(end + 4);
  if (body.length < len) return undefined;
  let code: string | undefined;
  try {
    code = (JSON.parse(body.subarray(0, len).toString('utf8')) as { error?: { code?: string } }).error?.code;
  } catch {
    code = undefined;
  }
  return { status, code };
}

/**
 * Plain TCP: writes `bytes` (or nothing) and reports how the server ended it: the bytes it sent
 * back (a TLS alert at most, never HTTP) and how long it held the socket.
 */
export function rawTcp(
  port: number,
  bytes: string | Buffer | undefined,
  timeoutMs = 8_000,
): Promise<{ reply: Buffer; closedAfterMs: number | null }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = (closed: boolean): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ reply: Buffer.concat(chunks), closedAfterMs: closed ? Date.now() - t0 : null });
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    s.on('connect', () => {
      if (bytes !== undefined) s.write(bytes);
    });
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('error', () => finish(true));
    s.on('close', () => finish(true));
  });
}

// ---- WebSocket connections that open --------------------------------------------------------

export interface OpenWs {
  ws: WebSocket;
  /** Every answer frame received, in order. */
  answers: AnswerFrame[];
  /** Resolves with the close code and reason. */
  closed: Promise<{ code: number; reason: string }>;
}

const opened = new Set<WebSocket>();

/** Opens a WebSocket to the listener with `c`; rejects when refused. */
export async function openWs(port: number, c: Cred): Promise<OpenWs> {
  const ws = new WebSocket(`wss://127.0.0.1:${port}/v1/wake`, {
    perMessageDeflate: false,
    ca: c.ca,
    cert: c.cert,
    key: c.key,
    minVersion: 'TLSv1.3',
    maxVersion: 'TLSv1.3',
    checkServerIdentity: () => undefined,
    maxPayload: 1 << 20,
  } as unknown as WebSocket.ClientOptions);
  opened.add(ws);
  ws.on('error', () => undefined);
  const answers: AnswerFrame[] = [];
  ws.on('message', (d: Buffer) => {
    try {
      answers.push(decodeAnswer(d.toString('utf8')));
    } catch {
      // not an answer frame: the test looks at `answers` only
    }
  });
  const closed = new Promise<{ code: number; reason: string }>((resolve) => {
    ws.on('close', (code: number, reason: Buffer) => {
      opened.delete(ws);
      resolve({ code, reason: reason.toString() });
    });
  });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('unexpected-response', (_req, res) => reject(new Error(`refused with ${res.statusCode}`)));
    ws.once('error', reject);
  });
  return { ws, answers, closed };
}

/** Terminates every WebSocket opened here that is still open. */
export function closeAllWs(): void {
  for (const ws of opened) ws.terminate();
  opened.clear();
}

/** Sends one frame and resolves with the answer to it (the next answer frame). */
export function ask(c: OpenWs, frame: string | Buffer, binary = false): Promise<AnswerFrame> {
  const n = c.answers.length;
  return new Promise((resolve, reject) => {
    const check = (): void => {
      if (c.answers.length > n) {
        done();
        resolve(c.answers[n]!);
      }
    };
    const onClose = (): void => {
      done();
      reject(new Error('closed without an answer'));
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error('no answer within 5 s'));
    }, 5_000);
    const done = (): void => {
      clearTimeout(timer);
      c.ws.off('message', check);
      c.ws.off('close', onClose);
    };
    // registered after the collector in openWs, so `answers` is up to date when this runs
    c.ws.on('message', check);
    c.ws.on('close', onClose);
    c.ws.send(frame, { binary });
  });
}

// ---- wake-up tokens -------------------------------------------------------------------------

const nowS = (): number => Math.floor(Date.now() / 1000);

/** A valid wake-up from `iss` to `aud`. */
export function validWake(
  signer: Signer,
  iss: string,
  aud: string,
  gen: number,
  reason: WakeReason = 'deployment',
): string {
  return signWake(signer, { iss, aud, gen, reason, nowS: nowS() });
}

/** A wake-up with any claims (signed properly with `signer`). */
export function wakeWith(
  signer: Signer,
  base: { iss: string; aud: string; gen: number },
  over: Record<string, unknown> = {},
): string {
  const iat = nowS();
  return signer.sign(WAKE_TYP, {
    iss: base.iss,
    aud: base.aud,
    iat,
    exp: iat + 60,
    jti: newJti(),
    gen: base.gen,
    reason: 'deployment',
    ...over,
  });
}

export const b64 = (x: unknown): string => Buffer.from(JSON.stringify(x)).toString('base64url');

/** A compact JWS with any header, signed with the Ed25519 private JWK `jwk`. */
export function craft(
  jwk: { x: string; d: string },
  header: Record<string, unknown>,
  payload: Record<string, unknown>,
): string {
  const key = crypto.createPrivateKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x, d: jwk.d }, format: 'jwk' });
  const input = `${b64(header)}.${b64(payload)}`;
  return `${input}.${crypto.sign(null, Buffer.from(input), key).toString('base64url')}`;
}
