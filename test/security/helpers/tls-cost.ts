/**
 * Measures the server CPU of a full mutual TLS 1.3 handshake (no session resumption) with
 * RSA-2048 certificates made by `certs/` (node-forge) against P-256 and RSA-2048 certificates
 * made by `openssl` (node-forge cannot make EC certificates; this is a measurement only). The
 * server runs in its own process with Herald's server options (TLS 1.3 only, a client
 * certificate requested, checked afterwards) and reports `process.cpuUsage()` per handshake.
 *
 *   HERALD_MEASURE_TLS=1 npx vitest run test/security/tls-cost.test.ts
 */
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { initPki, issueCert } from '../../../certs/pki.js';
import { pkiPaths } from '../../../certs/paths.js';

export interface Pair {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

export interface Cost {
  kind: string;
  handshakes: number;
  /** Server CPU (user + system) per handshake, ms. */
  serverCpuMs: number;
  /** Wall time per handshake at the client (concurrency 4), ms. */
  wallMs: number;
}

/** RSA-2048 certificates from certs/ (node-forge issues, Node makes the keys). */
export async function forgeRsa(dir: string): Promise<Pair> {
  const pki = path.join(dir, 'pki');
  await initPki({ dir: pki });
  await issueCert({ dir: pki, role: 'agent', name: 'n1', ip: ['127.0.0.1'] });
  const p = pkiPaths(pki);
  const r = (f: string): string => fs.readFileSync(f, 'utf8');
  return {
    ca: r(p.caCrt),
    serverCert: r(p.cert('agent', 'n1')),
    serverKey: r(p.key('agent', 'n1')),
    clientCert: r(p.cert('controller', 'controller')),
    clientKey: r(p.key('controller', 'controller')),
  };
}

/** A CA and two leaves made by `openssl`, keys `-newkey <spec>` (e.g. `ec` with P-256, or `rsa:2048`). */
export function opensslPair(dir: string, keyArgs: string[]): Pair {
  fs.mkdirSync(dir, { recursive: true });
  const f = (n: string): string => path.join(dir, n);
  const run = (args: string[]): void => {
    execFileSync('openssl', args, { stdio: 'ignore' });
  };
  run([
    'req',
    '-x509',
    ...keyArgs,
    '-nodes',
    '-keyout',
    f('ca.key'),
    '-out',
    f('ca.crt'),
    '-days',
    '2',
    '-subj',
    '/CN=measure CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign',
  ]);
  for (const [name, uri] of [
    ['server', 'spiffe://herald.local/agent/n1'],
    ['client', 'spiffe://herald.local/controller/controller'],
  ] as const) {
    run(['req', ...keyArgs, '-nodes', '-keyout', f(`${name}.key`), '-out', f(`${name}.csr`), '-subj', `/CN=${name}`]);
    fs.writeFileSync(
      f(`${name}.ext`),
      `subjectAltName=URI:${uri},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\n`,
    );
    run([
      'x509',
      '-req',
      '-in',
      f(`${name}.csr`),
      '-CA',
      f('ca.crt'),
      '-CAkey',
      f('ca.key'),
      '-CAcreateserial',
      '-out',
      f(`${name}.crt`),
      '-days',
      '2',
      '-sha256',
      '-extfile',
      f(`${name}.ext`),
    ]);
  }
  const r = (n: string): string => fs.readFileSync(f(n), 'utf8');
  return {
    ca: r('ca.crt'),
    serverCert: r('server.crt'),
    serverKey: r('server.key'),
    clientCert: r('client.crt'),
    clientKey: r('client.key'),
  };
}

const SERVER = `
const tls = require('node:tls');
const o = JSON.parse(process.env.HERALD_TLS_PAIR);
let n = 0;
const server = tls.createServer({ key: o.serverKey, cert: o.serverCert, ca: o.ca, requestCert: true, rejectUnauthorized: false, minVersion: 'TLSv1.3', maxVersion: 'TLSv1.3' }, (s) => {
  if (s.authorized && s.getPeerX509Certificate()) n++;
  s.end();
});
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }));
let base;
process.on('message', (m) => {
  if (m === 'start') { base = process.cpuUsage(); n = 0; process.send({ started: true }); }
  if (m === 'stop') { const u = process.cpuUsage(base); process.send({ cpuUs: u.user + u.system, n }); server.close(); process.exit(0); }
});
`;

/** Full handshakes against a server process holding `pair`'s server certificate. */
export async function measure(kind: string, pair: Pair, handshakes = 600, concurrency = 4): Promise<Cost> {
  const child = spawn(process.execPath, ['-e', SERVER], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, HERALD_TLS_PAIR: JSON.stringify(pair) },
  });
  const next = <T>(): Promise<T> => new Promise((resolve) => child.once('message', (m) => resolve(m as T)));
  try {
    const { port } = await next<{ port: number }>();
    const one = (): Promise<void> =>
      new Promise((resolve, reject) => {
        const s = tls.connect({
          host: '127.0.0.1',
          port,
          ca: pair.ca,
          cert: pair.clientCert,
          key: pair.clientKey,
          minVersion: 'TLSv1.3',
          checkServerIdentity: () => undefined,
        });
        s.on('secureConnect', () => s.end());
        s.on('close', () => resolve());
        s.on('error', reject);
      });
    for (let i = 0; i < 20; i++) await one(); // warm up
    child.send('start');
    await next();
    const t0 = performance.now();
    let left = handshakes;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (left-- > 0) await one();
      }),
    );
    const wall = performance.now() - t0;
    child.send('stop');
    const { cpuUs, n } = await next<{ cpuUs: number; n: number }>();
    return { kind, handshakes: n, serverCpuMs: cpuUs / 1000 / n, wallMs: (wall / handshakes) * concurrency };
  } finally {
    child.kill();
  }
}

/** All three, in a temp dir that is removed afterwards. */
export async function measureAll(handshakes = 600): Promise<Cost[]> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-tls-cost-'));
  try {
    const pairs: Array<[string, Pair]> = [
      ['RSA-2048 (certs/, node-forge)', await forgeRsa(dir)],
      ['RSA-2048 (openssl)', opensslPair(path.join(dir, 'rsa'), ['-newkey', 'rsa:2048'])],
      ['P-256 (openssl)', opensslPair(path.join(dir, 'ec'), ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256'])],
    ];
    const out: Cost[] = [];
    for (const [kind, pair] of pairs) out.push(await measure(kind, pair, handshakes));
    return out;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
