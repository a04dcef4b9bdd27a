/**
 * Who may call the object store with a token (docs/heat.md). PLACEHOLDER: replaced by the Keystone
 * and static-file validators.
 */
export interface TokenVerdict {
  ok: true;
  project: string;
  user: string;
  roles: string[];
  expiresAtMs: number;
}
export interface TokenRefusal {
  ok: false;
  code: 'token_invalid' | 'token_wrong_project' | 'token_role_missing' | 'token_unverifiable';
  reason: string;
}
export interface TokenValidator {
  check(token: string, project: string): Promise<TokenVerdict | TokenRefusal>;
  close(): void;
}
import crypto from 'node:crypto';
import fs from 'node:fs';
import type { Logger } from 'pino';
export interface KeystoneOptions {
  credentialsFile: string;
  caFile?: string;
  roles?: readonly string[];
  logger: Logger;
}
export function keystoneValidator(_o: KeystoneOptions): TokenValidator {
  throw new Error('not yet');
}
export interface StaticTokenOptions {
  file: string;
  logger: Logger;
}
export function staticTokenValidator(o: StaticTokenOptions): TokenValidator {
  return {
    async check(token, project) {
      const d = crypto.createHash('sha256').update(token).digest('hex');
      for (const line of fs.readFileSync(o.file, 'utf8').split('\n')) {
        const [digest, p = '*', name = 'static'] = line.trim().split(/\s+/);
        if (digest === d && (p === '*' || p === project))
          return { ok: true, project, user: name, roles: [], expiresAtMs: Number.POSITIVE_INFINITY };
      }
      return { ok: false, code: 'token_invalid', reason: 'unknown token' };
    },
    close() {},
  };
}
