/**
 * A controller's own standing (controller/fleet/standing.ts) on a real PKI made by certs/, with a fake
 * clock: revoked in revoked.json while it runs, expired, not yet valid, and back in standing
 * with a renewed certificate.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { materialPaths } from '../../certs/paths.js';
import { initPki, issueCert, revoke } from '../../certs/pki.js';
import { PkiMaterial } from '../../certs/tls.js';
import { Standing } from '../../controller/fleet/standing.js';

const quiet = pino({ level: 'silent' }, new Writable({ write: (_c, _e, cb) => cb() }));
const DAY_MS = 86_400_000;
let dir: string;
let material: PkiMaterial;
let now: number;
let standing: Standing;
let changes: number;

beforeEach(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-standing-'));
  await initPki({ dir });
  await issueCert({ dir, role: 'controller', name: 'c2', days: 10 });
  material = new PkiMaterial({
    ...materialPaths(dir, 'controller', 'c2'),
    trustDomain: 'herald.local',
    logger: quiet,
    watch: false,
  });
  now = Date.now();
  changes = 0;
  standing = new Standing({ material, logger: quiet, now: () => now, checkMs: 60_000 });
  standing.onChange(() => changes++);
  standing.start();
});

afterEach(() => {
  standing.close();
  material.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("a controller's own standing", () => {
  it('is lost when revoked.json comes to list its serial while it runs, and told once', async () => {
    expect(standing.refusal()).toBeUndefined();
    await revoke({ dir, target: 'controller/c2' });
    material.reload(); // what the directory watch does
    expect(standing.refusal()?.code).toBe('controller_revoked');
    expect(changes).toBe(1);
    standing.check();
    expect(changes).toBe(1);
    expect(standing.revokedSerials().has(standing.certificate().serial)).toBe(true);
  });

  it('is lost when its certificate expires (a fake clock), and regained with a renewed one', async () => {
    const { notAfter } = standing.certificate();
    now = notAfter.getTime() - 1;
    standing.check();
    expect(standing.refusal()).toBeUndefined();
    now = notAfter.getTime();
    expect(standing.refusal()?.code).toBe('controller_expired');
    standing.check();
    expect(changes).toBe(1);
    // renewed: a new certificate for the same name, valid from before `now`
    await issueCert({ dir, role: 'controller', name: 'c2', notBefore: new Date(now - DAY_MS), days: 10 });
    material.reload();
    expect(standing.refusal()).toBeUndefined();
    expect(standing.certificate().notAfter.getTime()).toBeGreaterThan(now);
    expect(changes).toBe(2);
  });

  it('is lost before its certificate is valid', () => {
    now = material.current().identity.validFrom.getTime() - 1;
    expect(standing.refusal()?.code).toBe('controller_expired');
  });
});
