/**
 * A real PKI in a temp dir for the controller's tests (made by cli/testbed/pki.ts): the CA, signing key, `controller/controller`,
 * `operator/admin`, agents n1 and n2 (SANs 127.0.0.1 and localhost), n3 (DNS n3.example only),
 * plus an operator certificate from a foreign CA and a self-signed one that forges the operator
 * URI. One RSA key is reused for the extra certificates (key generation is the slow part).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeCa, makeCertificate, newRsaKeyPem } from '../../certs/pki.js';
import { makePki } from '../../cli/testbed/pki.js';
import { spiffeIdOf } from '../../protocol/identity.js';
import { KeySet, type Ed25519PrivateJwk } from '../../protocol/jws.js';

export const TD = 'herald.local';

export interface Cred {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

export interface ControllerTestPki {
  dir: string;
  ca: Buffer;
  keys: KeySet;
  signingJwk: Ed25519PrivateJwk;
  cred(role: 'controller' | 'agent' | 'operator', name: string): Cred;
  /** Only the CA: a client presenting no certificate. */
  noCert: Cred;
  /** operator/admin's URI, signed by another CA. */
  foreignOperator: Cred;
  /** A self-signed certificate claiming operator/admin. */
  forgedOperator: Cred;
  spiffe(role: 'controller' | 'agent' | 'operator', name: string): string;
  /** Issues another agent certificate (SANs 127.0.0.1, localhost unless given). */
  issueAgent(name: string, sans?: { dns?: string[]; ip?: string[] }): Promise<Cred>;
  /** Issues another operator certificate, `operator/<name>`. */
  issueOperator(name: string): Promise<Cred>;
  cleanup(): void;
}

export async function makeControllerTestPki(): Promise<ControllerTestPki> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ctl-pki-'));
  const keyPem = newRsaKeyPem();
  const made = await makePki(dir, { agents: ['n1', 'n2'], keyPem });
  await made.issue('agent', 'n3', { dns: ['n3.example'], ip: [] });
  const p = made.paths;
  const ca = fs.readFileSync(p.caCrt);
  const foreignCa = makeCa({ keyPem });
  const foreign = makeCertificate({
    issuer: foreignCa,
    uris: [spiffeIdOf(TD, 'operator', 'admin')],
    eku: { clientAuth: true },
    keyPem,
  });
  const forged = makeCertificate({
    issuer: 'self',
    uris: [spiffeIdOf(TD, 'operator', 'admin')],
    eku: { clientAuth: true },
    keyPem,
  });
  const signingJwk = JSON.parse(fs.readFileSync(p.signingJwk, 'utf8')) as Ed25519PrivateJwk;
  const cred = (role: 'controller' | 'agent' | 'operator', name: string): Cred => ({
    ca,
    cert: fs.readFileSync(p.cert(role, name)),
    key: fs.readFileSync(p.key(role, name)),
  });
  return {
    dir,
    ca,
    keys: new KeySet(JSON.parse(fs.readFileSync(p.jwks, 'utf8'))),
    signingJwk,
    cred,
    noCert: { ca },
    foreignOperator: { ca, cert: Buffer.from(foreign.cert), key: Buffer.from(foreign.key) },
    forgedOperator: { ca, cert: Buffer.from(forged.cert), key: Buffer.from(forged.key) },
    spiffe: (role, name) => spiffeIdOf(TD, role, name),
    issueAgent: async (name, sans) => {
      await made.issue('agent', name, {
        ...(sans?.ip ? { ip: sans.ip } : {}),
        ...(sans?.dns ? { dns: sans.dns } : {}),
      });
      return cred('agent', name);
    },
    issueOperator: async (name) => {
      await made.issue('operator', name);
      return cred('operator', name);
    },
    cleanup: () => fs.rmSync(dir, { recursive: true, force: true }),
  };
}
