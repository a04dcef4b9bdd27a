/**
 * A real PKI in a temporary directory for tests, made by the testbed (cli/testbed/pki.ts, which
 * calls certs/), plus the bad
 * certificates Herald must refuse: expired, not yet valid, from a foreign CA, self-signed with a
 * forged SPIFFE id, revoked, and of a role whose EKUs do not fit.
 *
 *   const pki = await makeTestPki({ agents: ['n1'] });
 *   const expired = await pki.bad('expired', 'agent', 'n1');
 *   https.request({ ...pki.cred('operator', 'admin'), ... });
 *   afterAll(() => pki.cleanup());
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { makeCa, makeCertificate, newRsaKeyPem, revoke, type Pem } from '../../certs/pki.js';
import { materialPaths, type PkiPaths } from '../../certs/paths.js';
import { makePki, openPki } from '../../cli/testbed/pki.js';
import { PkiMaterial, type Logger, type PkiMaterialOptions } from '../../certs/tls.js';
import { spiffeIdOf, type Role } from '../../protocol/identity.js';

export type BadKind = 'expired' | 'not-yet-valid' | 'foreign' | 'forged' | 'revoked' | 'wrong-eku';

export interface CertFiles {
  certPath: string;
  keyPath: string;
  /** The test PKI's CA (what a client or server would trust). */
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  serial: string;
}

export interface TestPki {
  dir: string;
  trustDomain: string;
  paths: PkiPaths;
  /** The CA's certificate and key, for makeCertificate. */
  ca: Pem;
  /** ca/cert/key Buffers of a certificate in the layout, ready for tls/https options. */
  cred(role: Role, name: string): { ca: Buffer; cert: Buffer; key: Buffer };
  issue(
    role: Role,
    name: string,
    opts?: { dns?: string[]; ip?: string[]; notBefore?: Date; notAfter?: Date },
  ): Promise<CertFiles>;
  /**
   * A certificate for `role/name` that must be refused, in `<dir>/bad/`:
   * expired / not-yet-valid (signed by the CA), foreign (another CA, same trust domain),
   * forged (self-signed), wrong-eku (operator EKU on any role, or serverAuth only for an
   * operator), revoked (issued into the layout at `role/name`, then revoked).
   */
  bad(kind: BadKind, role: Role, name: string): Promise<CertFiles>;
  /** A PkiMaterial for `role/name` of this PKI (close it, or call cleanup()). */
  material(role: Role, name: string, opts?: Partial<PkiMaterialOptions>): PkiMaterial;
  cleanup(): void;
}

/** Silent logger for tests that provoke load errors on purpose. */
export const quietLogger: Logger = { info: () => {}, warn: () => {}, error: () => {} };

/**
 * Makes a PKI in a new temporary directory (removed by cleanup()), or in `dir`; with
 * `existing: true`, wraps the PKI already in `dir` (e.g. made by `bin/herald certs init`).
 */
export async function makeTestPki(
  opts: { agents?: string[]; trustDomain?: string; dir?: string; existing?: boolean } = {},
): Promise<TestPki> {
  const dir = opts.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pki-'));
  const layout = opts.existing ? openPki(dir) : await makePki(dir, { trustDomain: opts.trustDomain ?? 'herald.local' });
  const trustDomain = layout.trustDomain;
  const paths = layout.paths;
  for (const n of opts.agents ?? []) await layout.issue('agent', n);
  const ca: Pem = { cert: fs.readFileSync(paths.caCrt, 'utf8'), key: fs.readFileSync(paths.caKey, 'utf8') };
  const caBuf = Buffer.from(ca.cert);
  const materials: PkiMaterial[] = [];
  let spareKey: string | undefined;
  let foreignCa: Pem | undefined;
  const key = (): string => (spareKey ??= newRsaKeyPem());
  const badDir = path.join(dir, 'bad');

  const files = (certPath: string, keyPath: string, serial: string): CertFiles => ({
    certPath,
    keyPath,
    ca: caBuf,
    cert: fs.readFileSync(certPath),
    key: fs.readFileSync(keyPath),
    serial,
  });

  const pki: TestPki = {
    dir,
    trustDomain,
    paths,
    ca,
    cred: (role, name) => layout.cred(role, name),
    async issue(role, name, o = {}) {
      const r = await layout.issue(role, name, o);
      return files(r.certPath, r.keyPath, r.serial);
    },
    async bad(kind, role, name) {
      if (kind === 'revoked') {
        const r = await layout.issue(role, name);
        await revoke({ dir, target: `${role}/${name}` });
        return files(r.certPath, r.keyPath, r.serial);
      }
      const uri = spiffeIdOf(trustDomain, role, name);
      const roleEku = role === 'operator' ? { clientAuth: true } : { serverAuth: true, clientAuth: true };
      const day = 86_400_000;
      const now = Date.now();
      const base = { uris: [uri], dns: ['localhost'], ip: ['127.0.0.1'], keyPem: key(), eku: roleEku };
      const foreign = (): Pem => {
        foreignCa ??= makeCa({ trustDomain, keyPem: key() });
        return foreignCa;
      };
      const made =
        kind === 'expired'
          ? makeCertificate({ ...base, issuer: ca, notBefore: new Date(now - 30 * day), notAfter: new Date(now - day) })
          : kind === 'not-yet-valid'
            ? makeCertificate({
                ...base,
                issuer: ca,
                notBefore: new Date(now + day),
                notAfter: new Date(now + 30 * day),
              })
            : kind === 'foreign'
              ? makeCertificate({ ...base, issuer: foreign() })
              : kind === 'forged'
                ? makeCertificate({ ...base, issuer: 'self' })
                : makeCertificate({
                    ...base,
                    issuer: ca,
                    eku: role === 'operator' ? { serverAuth: true } : { clientAuth: true },
                  });
      fs.mkdirSync(badDir, { recursive: true, mode: 0o700 });
      const certPath = path.join(badDir, `${kind}-${role}-${name}.crt`);
      const keyPath = path.join(badDir, `${kind}-${role}-${name}.key`);
      fs.writeFileSync(keyPath, made.key, { mode: 0o600 });
      fs.writeFileSync(certPath, made.cert);
      return files(certPath, keyPath, made.serial);
    },
    material(role, name, o = {}) {
      const m = new PkiMaterial({ ...materialPaths(dir, role, name), trustDomain, logger: quietLogger, ...o });
      materials.push(m);
      return m;
    },
    cleanup() {
      for (const m of materials) m.close();
      if (!opts.dir) fs.rmSync(dir, { recursive: true, force: true });
    },
  };
  return pki;
}
