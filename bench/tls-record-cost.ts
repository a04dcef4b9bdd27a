/**
 * What glibc's mmap threshold costs a process that holds many TLS connections, timed alone: a
 * child process holds `--conns` TLS connections (certificates made by certs/, as a push worker
 * holds its agents' connections) and answers each 200-byte message with a 3,000-byte one (a
 * fetch's answer); the parent sends `--rounds` messages on every connection. Printed for each
 * threshold: the child's CPU (user + system) per round trip, and its RSS per connection.
 *
 *   npm run build && node dist/bench/tls-record-cost.js [--conns 4000] [--rounds 5] [--thresholds 16384,65536,default]
 *
 * Node's TLS sockets let OpenSSL release a connection's ~17 KB record buffers after each record
 * (SSL_MODE_RELEASE_BUFFERS) and take them again for the next: with the threshold below their
 * size, every record read or written is an mmap, its pages faulted in, and a munmap that flushes
 * the TLB on every core the process runs on. docs/performance.md ("Measured 2026-12-05") and
 * PUSH_WORKER_MMAP_THRESHOLD_BYTES (protocol/limits.ts) have the figures.
 */
import { fork } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { pkiPaths } from '../certs/paths.js';
import { makePki } from '../cli/testbed/pki.js';
import { HERALD_NODE_FLAGS } from '../protocol/node-flags.js';
import { procSample, type ProcSample } from './util.js';

const ANSWER_BYTES = 3_000;
const ASK_BYTES = 200;
/** Connections opened at once while the fleet is set up. */
const CONNECT_BATCH = 250;

/** The answering end: a TLS server that answers each message (its CPU and RSS read from /proc). */
function child(dir: string): void {
  const p = pkiPaths(dir);
  const answer = Buffer.alloc(ANSWER_BYTES, 'x');
  const server = tls.createServer(
    {
      key: fs.readFileSync(p.key('agent', 'bench-server')),
      cert: fs.readFileSync(p.cert('agent', 'bench-server')),
    },
    (sock) => {
      sock.on('data', () => sock.write(answer));
      sock.on('error', () => {});
    },
  );
  server.listen(0, '127.0.0.1', () => process.send?.({ port: (server.address() as { port: number }).port }));
}

async function measure(dir: string, threshold: string, conns: number, rounds: number): Promise<string> {
  const env = { ...process.env };
  if (threshold === 'default') delete env.GLIBC_TUNABLES;
  else env.GLIBC_TUNABLES = `glibc.malloc.mmap_threshold=${threshold}`;
  const kid = fork(fileURLToPath(import.meta.url), ['--child', dir], { env, execArgv: [...HERALD_NODE_FLAGS] });
  try {
    const { port } = await new Promise<{ port: number }>((resolve) => kid.once('message', resolve as never));
    const sample = (): ProcSample => {
      const got = procSample(kid.pid!);
      if (got === null) throw new Error('the answering process is gone');
      return got;
    };
    const ca = fs.readFileSync(pkiPaths(dir).caCrt);
    const before = sample();
    const socks: tls.TLSSocket[] = [];
    for (let i = 0; i < conns; i += CONNECT_BATCH) {
      const batch = Array.from(
        { length: Math.min(CONNECT_BATCH, conns - i) },
        () =>
          new Promise<tls.TLSSocket>((resolve, reject) => {
            const s = tls.connect({ port, host: '127.0.0.1', ca, servername: 'localhost' }, () => resolve(s));
            s.once('error', reject);
          }),
      );
      socks.push(...(await Promise.all(batch)));
    }
    const connected = sample();
    const ask = Buffer.alloc(ASK_BYTES, 'a');
    for (let r = 0; r < rounds; r++) {
      await Promise.all(
        socks.map(
          (s) =>
            new Promise<void>((resolve) => {
              let got = 0;
              const on = (d: Buffer): void => {
                got += d.length;
                if (got < ANSWER_BYTES) return;
                s.off('data', on);
                resolve();
              };
              s.on('data', on);
              s.write(ask);
            }),
        ),
      );
    }
    const after = sample();
    for (const s of socks) s.destroy();
    const cpuS = (x: ProcSample): number => x.cpuPreciseS ?? x.cpuS;
    const perTrip = (1e6 * (cpuS(after) - cpuS(connected))) / (conns * rounds);
    const rssKb = (after.rssKb - before.rssKb) / conns;
    return `threshold ${threshold.padEnd(7)}  ${perTrip.toFixed(1).padStart(6)} µs of CPU per round trip   ${rssKb.toFixed(1).padStart(5)} KB of RSS per connection`;
  } finally {
    kid.kill();
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      conns: { type: 'string', default: '4000' },
      rounds: { type: 'string', default: '5' },
      thresholds: { type: 'string', default: '16384,65536,default' },
    },
  });
  const conns = Number(values.conns);
  const rounds = Number(values.rounds);
  if (!(Number.isInteger(conns) && conns > 0 && conns <= 9_000))
    throw new RangeError('--conns: a whole number from 1 to 9000 (both ends share one file limit)');
  if (!(Number.isInteger(rounds) && rounds > 0)) throw new RangeError('--rounds: a positive whole number');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-tls-cost-'));
  try {
    await makePki(dir, { trustDomain: 'herald.local', agents: ['bench-server'] });
    console.log(
      `${conns} TLS connections held by one process, ${rounds} round trips on each (${ASK_BYTES} B in, ${ANSWER_BYTES} B out)`,
    );
    for (const t of (values.thresholds ?? '').split(',').filter(Boolean))
      console.log(await measure(dir, t, conns, rounds));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[2] === '--child') child(process.argv[3]!);
else
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exitCode = 1;
  });
