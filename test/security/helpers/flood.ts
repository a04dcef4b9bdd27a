/**
 * A pre-authentication flood against an agent listener, run in its own process (so the test
 * process stays free to measure): `idle` plain TCP sockets opened at once and held, plus TLS
 * handshakes without a client certificate at `ratePerS`, each asking for the WebSocket upgrade,
 * for `durationMs`. Bounded in count and time, loopback only. Prints its counters as one JSON
 * line when done.
 */
import { spawn, type ChildProcess } from 'node:child_process';

export interface FloodOptions {
  port: number;
  idle: number;
  ratePerS: number;
  durationMs: number;
  /** The cluster CA (the flood does trust the agent; it only has no certificate). */
  ca: Buffer;
}

export interface FloodStats {
  /**
   * Idle sockets connected; of those, closed by the server: in all, and held until the 5 s
   * handshake bound (closed 4.5 s or more after they connected) rather than cut at once.
   */
  idleConnected: number;
  idleClosed: number;
  idleHeldToBound: number;
  /** The longest any idle socket was held, ms. */
  idleMaxHeldMs: number;
  /** Handshakes started, answered 403 no_client_certificate, cut before an answer. */
  handshakes: number;
  refused403: number;
  cut: number;
  elapsedMs: number;
}

const SCRIPT = String.raw`
const net = require('node:net');
const tls = require('node:tls');
const crypto = require('node:crypto');
const o = JSON.parse(process.env.HERALD_FLOOD);
const ca = Buffer.from(o.ca, 'base64');
const st = { idleConnected: 0, idleHeldToBound: 0, idleMaxHeldMs: 0, idleClosed: 0, handshakes: 0, refused403: 0, cut: 0, elapsedMs: 0 };
const t0 = Date.now();
const idle = [];
let finished = false;
for (let i = 0; i < o.idle; i++) {
  const s = net.connect(o.port, '127.0.0.1');
  let connectedAt = 0;
  s.on('connect', () => { st.idleConnected++; connectedAt = Date.now(); });
  s.on('error', () => {});
  s.on('close', () => {
    if (connectedAt === 0 || finished) return; // closed by us at the end, not by the server
    const held = Date.now() - connectedAt;
    st.idleClosed++;
    st.idleMaxHeldMs = Math.max(st.idleMaxHeldMs, held);
    if (held >= 4500) st.idleHeldToBound++;
  });
  idle.push(s);
}
const live = new Set();
function handshake() {
  st.handshakes++;
  const s = tls.connect({ host: '127.0.0.1', port: o.port, ca, servername: 'localhost', minVersion: 'TLSv1.3', checkServerIdentity: () => undefined });
  live.add(s);
  let got = '';
  const end = () => { live.delete(s); s.destroy(); };
  s.setTimeout(3000, () => { st.cut++; end(); });
  s.on('secureConnect', () => s.write('GET /v1/wake HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ' + crypto.randomBytes(16).toString('base64') + '\r\nSec-WebSocket-Version: 13\r\n\r\n'));
  s.on('data', (d) => { got += d.toString('latin1'); if (got.includes('no_client_certificate')) { st.refused403++; end(); } });
  s.on('error', () => {});
  s.on('close', () => { if (live.has(s)) { st.cut++; live.delete(s); } });
}
let owed = 0;
const timer = setInterval(() => {
  // keep the rate even when a tick comes late
  const due = Math.floor(((Date.now() - t0) / 1000) * o.ratePerS);
  owed = due - st.handshakes;
  for (let k = 0; k < owed; k++) handshake();
  if (Date.now() - t0 >= o.durationMs) {
    clearInterval(timer);
    setTimeout(() => {
      st.elapsedMs = Date.now() - t0;
      finished = true;
      for (const s of idle) s.destroy();
      for (const s of live) s.destroy();
      process.stdout.write(JSON.stringify(st) + '\n', () => process.exit(0));
    }, 1000);
  }
}, 50);
`;

export interface RunningFlood {
  child: ChildProcess;
  done: Promise<FloodStats>;
}

/** Starts the flood; `done` resolves with its counters. */
export function startFlood(o: FloodOptions): RunningFlood {
  const child = spawn(process.execPath, ['-e', SCRIPT], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, HERALD_FLOOD: JSON.stringify({ ...o, ca: o.ca.toString('base64') }) },
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  const done = new Promise<FloodStats>((resolve, reject) => {
    const guard = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error('the flood did not finish in time'));
    }, o.durationMs + 15_000);
    child.once('exit', () => {
      clearTimeout(guard);
      try {
        resolve(JSON.parse(out.trim().split('\n').pop() ?? '') as FloodStats);
      } catch {
        reject(new Error(`the flood printed no counters: ${out.slice(0, 200)}`));
      }
    });
  });
  return { child, done };
}
