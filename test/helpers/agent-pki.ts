/**
 * A real PKI in a temp dir for the agent's listener and fetcher tests (made by
 * cli/testbed/pki.ts): the CA, the signing key,
 * `controller/controller`, `operator/admin`, agents `n1` and `n2`, two more controllers, and a
 * certificate from a foreign CA. Made once per test file (RSA keys take a while); one key pair
 * is reused for the extra certificates.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino, type Logger } from 'pino';
import { makeCa, makeCertificate, newRsaKeyPem, type Pem } from '../../certs/pki.js';
import { materialPaths } from '../../certs/paths.js';
import { makePki } from '../../cli/testbed/pki.js';
import { PkiMaterial } from '../../certs/tls.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { Signer, type Ed25519PrivateJwk } from '../../protocol/jws.js';

export const TD = 'herald.local';

export interface Cred {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
}

export interface AgentTestPki {
  dir: string;
  signer: Signer;
  /** Credentials of `role/name` from the PKI dir. */
  cred(role: 'controller' | 'agent' | 'operator', name: string): Cred;
  /** A controller-shaped certificate from another CA. */
  foreign: Cred;
  /** A controller certificate that expired yesterday. */
  expired: Cred;
  material(role: 'controller' | 'agent', name: string): PkiMaterial;
  spiffe(role: 'controller' | 'agent' | 'operator', name: string): string;
  cleanup(): void;
}

export async function makeAgentTestPki(): Promise<AgentTestPki> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-agent-pki-'));
  const keyPem = newRsaKeyPem();
  const p = (await makePki(dir, { agents: ['n1', 'n2'], controllers: ['c2', 'c3'], keyPem })).paths;
  const ca = fs.readFileSync(p.caCrt);
  const caPem: Pem = { cert: ca.toString(), key: fs.readFileSync(p.caKey, 'utf8') };
  const foreignCa = makeCa({ keyPem });
  const f = makeCertificate({
    issuer: foreignCa,
    uris: [spiffeIdOf(TD, 'controller', 'controller')],
    ip: ['127.0.0.1'],
    eku: { serverAuth: true, clientAuth: true },
    keyPem,
  });
  const e = makeCertificate({
    issuer: caPem,
    uris: [spiffeIdOf(TD, 'controller', 'controller')],
    eku: { serverAuth: true, clientAuth: true },
    keyPem,
    notBefore: new Date(Date.now() - 10 * 86_400_000),
    notAfter: new Date(Date.now() - 86_400_000),
  });
  const jwk = JSON.parse(fs.readFileSync(p.signingJwk, 'utf8')) as Ed25519PrivateJwk;
  const materials: PkiMaterial[] = [];
  return {
    dir,
    signer: new Signer(jwk),
    cred: (role, name) => ({ ca, cert: fs.readFileSync(p.cert(role, name)), key: fs.readFileSync(p.key(role, name)) }),
    foreign: { ca, cert: Buffer.from(f.cert), key: Buffer.from(f.key) },
    expired: { ca, cert: Buffer.from(e.cert), key: Buffer.from(e.key) },
    material: (role, name) => {
      const m = new PkiMaterial({
        ...materialPaths(dir, role, name),
        trustDomain: TD,
        watch: false,
        logger: quietLog(),
      });
      materials.push(m);
      return m;
    },
    spiffe: (role, name) => spiffeIdOf(TD, role, name),
    cleanup: () => {
      for (const m of materials) m.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A pino logger that records lines in memory (for asserting refusal log lines). */
export function memoryLog(): { log: Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) });
  return { log, lines };
}

export function quietLog(): Logger {
  return pino({ level: 'silent' });
}
