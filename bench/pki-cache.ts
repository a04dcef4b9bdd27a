/**
 * The benchmark's PKI, made once and cached between runs in a gitignored directory: a real
 * `certs/` PKI (CA, signing key, controller and operator certificates) plus one certificate per
 * simulated agent. Every agent certificate reuses ONE key pair (RSA key generation costs
 * 70-400 ms each) and carries the IP SAN of the loopback address its agent listens on, so the
 * controller accepts the announced endpoint. Missing certificates are issued by worker threads
 * (node-forge builds the certificate, Node signs it: ~2-6 ms each), in parallel on every core.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { makeCertificate, newRsaKeyPem, type Pem } from '../certs/pki.js';
import { makePki } from '../cli/testbed/pki.js';
import { pkiPaths } from '../certs/paths.js';
import { say } from './util.js';

/** Bump to invalidate every cached agent certificate (naming or address scheme changed). */
const SCHEME = 2;
const TRUST_DOMAIN = 'herald.local';
/** Every simulated agent listens on this port, each on its own 127.x address. */
export const AGENT_PORT = 17443;

export interface AgentSlot {
  /** Node id, also the certificate name. */
  node: string;
  /** The loopback address it listens on (its certificate's IP SAN). */
  ip: string;
  port: number;
}

/**
 * Agent `i` of a group: `b00042` at 127.20.0.43, `r00001` at 127.21.0.2, ... (`a`: the crash
 * run's probe agents, named to sort before the fleet's: a restarted controller dials in that order).
 */
export function slot(group: 'a' | 'b' | 'r' | 'l', i: number): AgentSlot {
  const second = group === 'b' ? 20 : group === 'r' ? 21 : group === 'l' ? 22 : 23;
  return {
    node: `${group}${String(i).padStart(5, '0')}`,
    ip: `127.${second}.${Math.floor(i / 250)}.${(i % 250) + 1}`,
    port: AGENT_PORT,
  };
}

export interface BenchPki {
  dir: string;
  trustDomain: string;
  /** The one agent key every simulated agent uses (PKCS#8 PEM file). */
  sharedKeyPath: string;
  caPath: string;
  certPath(node: string): string;
  /** A real `bin/herald agent` needs `<pki>/agent/<node>.key`: a copy of the shared key. */
  ensureLayoutKey(node: string): void;
  operator: { ca: Buffer; cert: Buffer; key: Buffer };
}

interface Manifest {
  scheme: number;
  caFingerprint: string;
  issued: Record<string, string>;
}

/**
 * Opens (or makes) the cached PKI in `dir` and makes sure every slot has a certificate.
 * Reports how many were issued and how long it took.
 */
export async function benchPki(
  dir: string,
  slots: AgentSlot[],
): Promise<{ pki: BenchPki; issued: number; issueMs: number }> {
  const p = pkiPaths(dir);
  if (!fs.existsSync(p.caKey)) {
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    await makePki(dir, { trustDomain: TRUST_DOMAIN });
  }
  const sharedKeyPath = path.join(dir, 'agent-shared.key');
  if (!fs.existsSync(sharedKeyPath)) fs.writeFileSync(sharedKeyPath, newRsaKeyPem(), { mode: 0o600 });
  const caPem = fs.readFileSync(p.caCrt, 'utf8');
  const caFingerprint = new (await import('node:crypto')).X509Certificate(caPem).fingerprint256;
  const manifestPath = path.join(dir, 'bench-manifest.json');
  let manifest: Manifest = { scheme: SCHEME, caFingerprint, issued: {} };
  try {
    const m = JSON.parse(fs.readFileSync(manifestPath, 'utf8')) as Manifest;
    if (m.scheme === SCHEME && m.caFingerprint === caFingerprint) manifest = m;
  } catch {
    // no manifest yet
  }
  fs.mkdirSync(p.roleDir('agent'), { recursive: true, mode: 0o700 });
  const unique = [...new Map(slots.map((s) => [s.node, s])).values()];
  const missing = unique.filter((s) => manifest.issued[s.node] !== s.ip || !fs.existsSync(p.cert('agent', s.node)));
  const t0 = Date.now();
  if (missing.length > 0) {
    say(`issuing ${missing.length} agent certificates (cached in ${dir} for later runs)`);
    const threads = Math.max(1, Math.min(os.cpus().length, Math.ceil(missing.length / 200)));
    const ca: Pem = { cert: caPem, key: fs.readFileSync(p.caKey, 'utf8') };
    const keyPem = fs.readFileSync(sharedKeyPath, 'utf8');
    const chunks: AgentSlot[][] = Array.from({ length: threads }, () => []);
    missing.forEach((s, i) => {
      chunks[i % threads]!.push(s);
    });
    await Promise.all(chunks.map((chunk) => runIssuer({ ca, keyPem, dir, slots: chunk })));
    for (const s of missing) manifest.issued[s.node] = s.ip;
    fs.writeFileSync(manifestPath, JSON.stringify(manifest));
  }
  const pki: BenchPki = {
    dir,
    trustDomain: TRUST_DOMAIN,
    sharedKeyPath,
    caPath: p.caCrt,
    certPath: (node) => p.cert('agent', node),
    ensureLayoutKey: (node) => {
      const k = p.key('agent', node);
      if (!fs.existsSync(k)) fs.copyFileSync(sharedKeyPath, k);
      fs.chmodSync(k, 0o600);
    },
    operator: {
      ca: fs.readFileSync(p.caCrt),
      cert: fs.readFileSync(p.cert('operator', 'admin')),
      key: fs.readFileSync(p.key('operator', 'admin')),
    },
  };
  return { pki, issued: missing.length, issueMs: Date.now() - t0 };
}

interface IssueJob {
  ca: Pem;
  keyPem: string;
  dir: string;
  slots: AgentSlot[];
}

function runIssuer(job: IssueJob): Promise<void> {
  return new Promise((resolve, reject) => {
    const w = new Worker(new URL(import.meta.url), { workerData: job });
    w.once('error', reject);
    w.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`certificate worker exited ${code}`))));
  });
}

function issueAll(job: IssueJob): void {
  const p = pkiPaths(job.dir);
  for (const s of job.slots) {
    const made = makeCertificate({
      issuer: job.ca,
      uris: [`spiffe://${TRUST_DOMAIN}/agent/${s.node}`],
      ip: [s.ip],
      eku: { serverAuth: true, clientAuth: true },
      keyPem: job.keyPem,
      commonName: s.node,
    });
    // plain writes: a half-written file from a killed run fails to parse and is issued again
    fs.writeFileSync(p.cert('agent', s.node), made.cert, { mode: 0o644 });
  }
}

if (!isMainThread && parentPort) {
  issueAll(workerData as IssueJob);
}
