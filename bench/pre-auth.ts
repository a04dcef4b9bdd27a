/**
 * `npm run bench -- --pre-auth`: what requests from peers nobody has authenticated cost everyone
 * else (SECURITY.md, "Enrolment"). A real controller with an issuer; an operator's `GET /healthz`
 * over one kept-alive connection, timed first idle, then while EXTREME_CSRS enrolment requests
 * carrying the review's key (an RSA modulus and exponent of 1,024 bytes each, which node-forge
 * once verified for 4.3 s each) arrive at once from as many loopback addresses. Its section of
 * BENCHMARKS.md is replaced by each run (a kept section, like the soak's).
 */
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { makeCsr } from '../certs/csr.js';
import { issueIssuer } from '../certs/pki.js';
import { ENROLL_NETWORK_RATE_BURST } from '../protocol/limits.js';
import { hugeExponentCsr } from './hostile-csr.js';
import type { BenchPki } from './pki-cache.js';
import { startController, stopController } from './procs.js';
import { dist, loadAvg, nowMs, roundDist, type Dist } from './util.js';

/** Hostile requests sent at once: the per-network burst, so none is turned away unread. */
const EXTREME_CSRS = ENROLL_NETWORK_RATE_BURST;
const IDLE_SAMPLES = 200;
const ISSUER = 'bench-pre-auth';

export interface PreAuthResult {
  date: string;
  machine: string;
  extremeCsrs: number;
  /** `GET /healthz` (ms) with nothing else arriving. */
  idle: Dist;
  /** `GET /healthz` (ms) while the hostile requests arrive and are answered. */
  during: Dist;
  /** From sending the hostile requests to the last answer (ms). */
  allAnsweredMs: number;
  /** Their answers, by status and code. */
  answers: Record<string, number>;
  /** The same with as many ordinary requests (an RSA-2048 key, an unknown token): the control. */
  ordinary: { during: Dist; allAnsweredMs: number; answers: Record<string, number> };
}

function enrollOnce(port: number, ca: Buffer, from: string, csr: string): Promise<string> {
  return new Promise((resolve) => {
    const body = JSON.stringify({ token: 'hj1.bench-unknown', node: 'bench1', csr });
    const q = https.request(
      {
        host: '127.0.0.1',
        port,
        method: 'POST',
        path: '/v1/enroll',
        ca,
        localAddress: from,
        checkServerIdentity: () => undefined,
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(body.length) },
      },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => {
          let code = '?';
          try {
            code = (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? 'ok';
          } catch {
            code = 'unreadable';
          }
          resolve(`${res.statusCode} ${code}`);
        });
      },
    );
    q.on('error', (err) => resolve(`error ${(err as NodeJS.ErrnoException).code ?? err.message}`));
    q.end(body);
  });
}

export async function preAuthPhase(o: { pki: BenchPki; runDir: string; port: number }): Promise<PreAuthResult> {
  if (!fs.existsSync(path.join(o.pki.dir, 'issuer', `${ISSUER}.crt`)))
    await issueIssuer({ dir: o.pki.dir, name: ISSUER });
  const dir = path.join(o.runDir, 'pre-auth');
  fs.mkdirSync(dir, { recursive: true });
  const ctl = await startController({ pki: o.pki, dir, port: o.port, extra: ['--issuer', ISSUER] });
  try {
    const health = async (): Promise<number> => {
      const t0 = nowMs();
      const r = await ctl.op.request('GET', '/healthz');
      if (r.status !== 200) throw new Error(`/healthz answered ${r.status}`);
      return nowMs() - t0;
    };
    for (let i = 0; i < 20; i++) await health();
    const idle: number[] = [];
    for (let i = 0; i < IDLE_SAMPLES; i++) idle.push(await health());
    // each wave from its own /24, so the per-network limit turns none away unread
    const beside = async (csrs: string[], net: number) => {
      const t0 = nowMs();
      let pending = csrs.length;
      const answers: Record<string, number> = {};
      const sent = csrs.map((csr, i) =>
        enrollOnce(o.port, o.pki.operator.ca, `127.0.${net}.${i + 2}`, csr).then((a) => {
          answers[a] = (answers[a] ?? 0) + 1;
          pending--;
        }),
      );
      const during: number[] = [];
      // at least IDLE_SAMPLES / 4 figures, and until every request is answered
      while (pending > 0 || during.length < IDLE_SAMPLES / 4) during.push(await health());
      await Promise.all(sent);
      return { during: roundDist(dist(during), 2), allAnsweredMs: Math.round(nowMs() - t0), answers };
    };
    const keyPem = fs.readFileSync(o.pki.sharedKeyPath, 'utf8');
    const ordinary = await beside(
      Array.from({ length: EXTREME_CSRS }, (_, i) => makeCsr({ keyPem, commonName: `bench${i}` })),
      2,
    );
    const extreme = await beside(
      Array.from({ length: EXTREME_CSRS }, (_, i) => hugeExponentCsr(i + 1)),
      1,
    );
    const cpu = os.cpus();
    return {
      date: new Date().toISOString(),
      machine: `${cpu.length} cores (${cpu[0]?.model.trim()}), Node ${process.version}, load average ${loadAvg().join(' ')}`,
      extremeCsrs: EXTREME_CSRS,
      idle: roundDist(dist(idle), 2),
      ...extreme,
      ordinary,
    };
  } finally {
    await stopController(ctl);
  }
}

/** The kept section of BENCHMARKS.md. */
export function preAuthMarkdown(r: PreAuthResult): string {
  const row = (what: string, d: Dist): string => `| ${what} | ${d.n} | ${d.p50} | ${d.p99} | ${d.max} |`;
  return [
    '<!-- kept: pre-auth (npm run bench -- --pre-auth replaces this section) -->',
    '## Requests before authentication beside an operator',
    '',
    `An operator's \`GET /healthz\` (one kept-alive connection, ms) idle, then while ${r.extremeCsrs} \`POST /v1/enroll\``,
    'requests arrive at once from as many addresses, each with a CSR whose RSA modulus and exponent are 1,024 bytes',
    '(the key node-forge once took 4.3 s to verify; now refused `bad_key` before any signature work, certs/key-policy.ts).',
    `Measured ${r.date.slice(0, 16).replace('T', ' ')} UTC on ${r.machine}.`,
    '',
    '| /healthz | requests | p50 | p99 | max |',
    '|---|---|---|---|---|',
    row('idle', r.idle),
    row(`while ${r.extremeCsrs} ordinary CSRs arrive (RSA-2048, an unknown token)`, r.ordinary.during),
    row(`while ${r.extremeCsrs} extreme CSRs arrive`, r.during),
    '',
    `The ordinary ones were answered within ${r.ordinary.allAnsweredMs} ms (${Object.entries(r.ordinary.answers)
      .map(([k, n]) => `${n} × ${k}`)
      .join(', ')}).`,
    'The rows are compared with each other: each of the 50 requests is also a full TLS handshake (a few ms of the',
    "controller's CPU), and on a machine whose load average is above its core count the controller runs a fraction",
    'of the time, so the absolute figures measure the machine as much as Herald.',
    '',
    `All ${r.extremeCsrs} extreme ones were answered within ${r.allAnsweredMs} ms of being sent (${Object.entries(
      r.answers,
    )
      .map(([k, n]) => `${n} × ${k}`)
      .join(', ')}).`,
    '',
  ].join('\n');
}
