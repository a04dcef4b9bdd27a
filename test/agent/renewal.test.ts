/**
 * The agent's renewal schedule (agent/renewal.ts) with a fake clock and timers: the first
 * attempt at two thirds of the lifetime, a new key each time, the files installed and the
 * material reloaded at once, failures retried with backoff inside the time left, and
 * `renewal_overdue` warnings from 90 % on only. The controller side is the real issuing code
 * (certs/), behind the one-function interface the renewer posts through.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { readCsr } from '../../certs/csr-verify.js';
import { materialPaths } from '../../certs/paths.js';
import { initPki, issueIssuer, issueWithIssuer, type Pem } from '../../certs/pki.js';
import { PkiMaterial } from '../../certs/tls.js';
import { CertificateRenewer, type RenewerTimers } from '../../agent/renewal.js';
import type { RenewRequest } from '../../protocol/enroll.js';

const T0 = Date.parse('2026-12-01T00:00:00Z');
let dir: string;
let issuer: Pem;
let material: PkiMaterial;
let now: number;
let pending: Array<{ fn: () => void; at: number }>;
let logs: Array<{ level: string; obj: Record<string, unknown>; msg: string | undefined }>;
let sent: RenewRequest[];
let failWith: { status: number; code: string } | undefined;

const timers: RenewerTimers = {
  setTimeout: (fn, ms) => {
    const t = { fn, at: now + ms };
    pending.push(t);
    return t;
  },
  clearTimeout: (h) => {
    pending = pending.filter((t) => t !== h);
  },
};
const log = {
  info: (obj: object, msg?: string) => logs.push({ level: 'info', obj: obj as Record<string, unknown>, msg }),
  warn: (obj: object, msg?: string) => logs.push({ level: 'warn', obj: obj as Record<string, unknown>, msg }),
  error: (obj: object, msg?: string) => logs.push({ level: 'error', obj: obj as Record<string, unknown>, msg }),
};

/** Runs the next timer at its time. */
async function tick(r: CertificateRenewer): Promise<number> {
  pending.sort((a, b) => a.at - b.at);
  const t = pending.shift()!;
  now = Math.max(now, t.at);
  t.fn();
  await r.attempt(); // the attempt the timer started (one at a time)
  return t.at;
}

function renewer(): CertificateRenewer {
  const p = materialPaths(dir, 'agent', 'n1');
  return new CertificateRenewer({
    material,
    certPath: p.certPath,
    keyPath: p.keyPath,
    log,
    now: () => now,
    random: () => 0.5,
    timers,
    send: async (body) => {
      sent.push(body);
      if (failWith)
        return { status: failWith.status, body: Buffer.from(JSON.stringify({ error: { code: failWith.code } })) };
      const csr = readCsr(body.csr);
      const made = issueWithIssuer({
        issuer,
        role: 'agent',
        name: 'n1',
        ip: ['127.0.0.1'],
        notBefore: new Date(now),
        notAfter: new Date(now + 90_000),
        publicKeyPem: csr.publicKeyPem,
      });
      return { status: 200, body: Buffer.from(JSON.stringify({ node: 'n1', certificate: made.chain })) };
    },
  });
}

beforeEach(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-renew-'));
  await initPki({ dir });
  const r = await issueIssuer({ dir, name: 'i1' });
  issuer = { cert: fs.readFileSync(r.certPath, 'utf8'), key: fs.readFileSync(r.keyPath, 'utf8') };
  const first = issueWithIssuer({
    issuer,
    role: 'agent',
    name: 'n1',
    ip: ['127.0.0.1'],
    notBefore: new Date(T0),
    notAfter: new Date(T0 + 90_000),
  });
  const p = materialPaths(dir, 'agent', 'n1');
  fs.mkdirSync(path.dirname(p.certPath), { recursive: true });
  fs.writeFileSync(p.keyPath, first.key, { mode: 0o600 });
  fs.writeFileSync(p.certPath, first.chain);
  material = new PkiMaterial({ ...p, trustDomain: 'herald.local', watch: false, logger: log });
  now = T0 + 1_000;
  pending = [];
  logs = [];
  sent = [];
  failWith = undefined;
});

afterEach(() => {
  material.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('CertificateRenewer', () => {
  it('renews at two thirds of the lifetime with a new key, installs it and reloads the material at once', async () => {
    const r = renewer();
    const before = material.current().identity.serial;
    const keyBefore = fs.readFileSync(materialPaths(dir, 'agent', 'n1').keyPath, 'utf8');
    let changed = 0;
    material.on('tls-change', () => changed++);
    r.start();
    expect(pending.map((t) => t.at)).toEqual([T0 + 60_000]);
    expect(await tick(r)).toBe(T0 + 60_000);
    expect(changed).toBe(1);
    const id = material.current().identity;
    expect(id.serial).not.toBe(before);
    expect(id.spiffeId).toBe('spiffe://herald.local/agent/n1');
    expect(id.ips).toEqual(['127.0.0.1']);
    const keyAfter = fs.readFileSync(materialPaths(dir, 'agent', 'n1').keyPath, 'utf8');
    expect(keyAfter).not.toBe(keyBefore);
    expect(fs.statSync(materialPaths(dir, 'agent', 'n1').keyPath).mode & 0o777).toBe(0o600);
    expect(new crypto.X509Certificate(material.current().cert).checkPrivateKey(crypto.createPrivateKey(keyAfter))).toBe(
      true,
    );
    expect(r.status).toMatchObject({ failures: 0, renewed: 1 });
    // and again, from the new certificate's dates
    expect(pending.map((t) => t.at)).toEqual([T0 + 60_000 + 60_000]);
    await tick(r);
    expect(r.status.renewed).toBe(2);
    expect(sent.map((s) => s.failed_attempts)).toEqual([0, 0]);
    await r.stop();
    expect(pending).toEqual([]);
  });

  it('retries a failing renewal with backoff inside the time left, reports its failures, and warns renewal_overdue from 90 % on', async () => {
    failWith = { status: 403, code: 'enrollment_disabled' };
    const r = renewer();
    r.start();
    const attempts: number[] = [];
    while (now < T0 + 90_000 && attempts.length < 40) attempts.push(await tick(r));
    expect(attempts[0]).toBe(T0 + 60_000);
    for (let i = 1; i < attempts.length; i++) {
      const gap = attempts[i]! - attempts[i - 1]!;
      expect(gap).toBeGreaterThanOrEqual(250);
      // never longer than a quarter of what was left at the previous attempt
      expect(gap).toBeLessThanOrEqual(Math.max(250, (T0 + 90_000 - attempts[i - 1]!) / 4) + 1);
    }
    expect(r.status.failures).toBe(attempts.length);
    expect(r.status.lastError).toBe('enrollment_disabled');
    // each attempt told the controller how many failed before it
    expect(sent.map((s) => s.failed_attempts)).toEqual(attempts.map((_, i) => i));
    expect(sent.slice(1).every((s) => s.last_error === 'enrollment_disabled')).toBe(true);
    const warns = logs.filter((l) => l.level === 'warn');
    const overdue = warns.filter((l) => l.obj.code === 'renewal_overdue');
    expect(overdue.length).toBeGreaterThan(0);
    attempts.forEach((at, i) => {
      const w = warns[i]!;
      expect(w.obj.code).toBe(at >= T0 + 81_000 ? 'renewal_overdue' : 'enrollment_disabled');
    });
    // one attempt falls on the 90 % point itself, so the overdue warning comes while the certificate still works
    expect(attempts).toContain(T0 + 81_000);
    // one key for the whole renewal: its retries do not each wait for a new RSA key
    expect(new Set(sent.map((b) => readCsr(b.csr).publicKeyPem)).size).toBe(1);
    await r.stop();
  });
});
