/**
 * The controller API's TLS session-ticket key file (certs/ticket-key.ts): made 0600 when missing,
 * the same key read back at the next start, refused when others can read it or it is not 48
 * bytes, and replaced once older than the rotation period (at start and on its timer).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { pkiPaths } from '../../certs/paths.js';
import { readTicketKey, TicketKey } from '../../certs/ticket-key.js';
import { codeOf } from '../../protocol/errors.js';
import { TLS_SESSION_LIFETIME_S, TLS_TICKET_KEY_BYTES, TLS_TICKET_KEY_ROTATE_MS } from '../../protocol/limits.js';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ticket-'));
const open: TicketKey[] = [];
let n = 0;

function freshFile(): string {
  const dir = path.join(root, `pki-${n++}`);
  fs.mkdirSync(path.join(dir, 'controller'), { recursive: true });
  return pkiPaths(dir).ticketKey('controller');
}
function keyAt(file: string, o: Partial<ConstructorParameters<typeof TicketKey>[0]> = {}): TicketKey {
  const k = new TicketKey({ file, ...o });
  open.push(k);
  return k;
}
function thrownCode(f: () => unknown): string | undefined {
  try {
    f();
  } catch (err) {
    return codeOf(err);
  }
  return undefined;
}

afterEach(() => {
  for (const k of open.splice(0)) k.close();
  vi.useRealTimers();
});
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

describe('the TLS ticket key file', () => {
  it('lives beside the controller certificate as <pki>/controller/<name>.tls-ticket-key', () => {
    expect(pkiPaths('/p').ticketKey('c2')).toBe(path.join('/p', 'controller', 'c2.tls-ticket-key'));
  });

  it('is created 0600 with 48 random bytes when missing, whatever the umask, and read back at the next start', () => {
    const file = freshFile();
    const old = process.umask(0o000);
    let k: TicketKey;
    try {
      k = keyAt(file);
    } finally {
      process.umask(old);
    }
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(k.current().length).toBe(TLS_TICKET_KEY_BYTES);
    expect(fs.readFileSync(file).equals(k.current())).toBe(true);
    // a second start (a restart) takes the same key, so tickets issued before still resume
    const again = keyAt(file);
    expect(again.current().equals(k.current())).toBe(true);
  });

  it('refuses a key file readable by group or others (0644) with unsafe_file_mode, naming the file', () => {
    const file = freshFile();
    fs.writeFileSync(file, Buffer.alloc(TLS_TICKET_KEY_BYTES, 7), { mode: 0o644 });
    fs.chmodSync(file, 0o644);
    let err: unknown;
    try {
      keyAt(file);
    } catch (e) {
      err = e;
    }
    expect(codeOf(err)).toBe('unsafe_file_mode');
    expect((err as Error).message).toContain(file);
    fs.chmodSync(file, 0o640);
    expect(thrownCode(() => keyAt(file))).toBe('unsafe_file_mode');
    // nothing was replaced: the operator's file is left for them to fix
    expect(fs.readFileSync(file).equals(Buffer.alloc(TLS_TICKET_KEY_BYTES, 7))).toBe(true);
  });

  it.each([
    ['empty', 0],
    ['too short', 32],
    ['too long', 80],
  ])('refuses a key file that is %s with bad_ticket_key, naming the file', (_what, bytes) => {
    const file = freshFile();
    fs.writeFileSync(file, Buffer.alloc(bytes, 1), { mode: 0o600 });
    let err: unknown;
    try {
      keyAt(file);
    } catch (e) {
      err = e;
    }
    expect(codeOf(err)).toBe('bad_ticket_key');
    expect((err as Error).message).toContain(file);
  });

  it('refuses a directory in its place with bad_ticket_key', () => {
    const file = freshFile();
    fs.mkdirSync(file, { mode: 0o700 });
    expect(thrownCode(() => readTicketKey(file))).toBe('bad_ticket_key');
  });

  it('replaces at start a key older than TLS_TICKET_KEY_ROTATE_MS, and keeps a younger one', () => {
    const file = freshFile();
    const first = keyAt(file).current();
    const young = (Date.now() - TLS_TICKET_KEY_ROTATE_MS / 2) / 1000;
    fs.utimesSync(file, young, young);
    expect(keyAt(file).current().equals(first)).toBe(true);
    const old = (Date.now() - TLS_TICKET_KEY_ROTATE_MS - 60_000) / 1000;
    fs.utimesSync(file, old, old);
    const replaced = keyAt(file).current();
    expect(replaced.equals(first)).toBe(false);
    expect(fs.readFileSync(file).equals(replaced)).toBe(true);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(Date.now() - fs.statSync(file).mtimeMs).toBeLessThan(TLS_TICKET_KEY_ROTATE_MS / 2);
  });

  it('rotates the key in use on its timer once it reaches the rotation period, file first, then rotate', () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    const file = freshFile();
    const k = keyAt(file);
    const first = k.current();
    const rotated: Buffer[] = [];
    k.on('rotate', (key: Buffer) => {
      expect(fs.readFileSync(file).equals(key)).toBe(true);
      rotated.push(key);
    });
    vi.advanceTimersByTime(TLS_TICKET_KEY_ROTATE_MS - 1000);
    expect(rotated).toEqual([]);
    vi.advanceTimersByTime(2000);
    expect(rotated.length).toBe(1);
    expect(rotated[0]!.equals(first)).toBe(false);
    expect(k.current().equals(rotated[0]!)).toBe(true);
    vi.advanceTimersByTime(TLS_TICKET_KEY_ROTATE_MS);
    expect(rotated.length).toBe(2);
  });

  it('check() replaces a key that has reached the period by the injected clock, and only then', () => {
    let now = Date.now();
    const k = keyAt(freshFile(), { now: () => now });
    const first = k.current();
    expect(k.check()).toBe(false);
    now += TLS_TICKET_KEY_ROTATE_MS;
    expect(k.check()).toBe(true);
    expect(k.current().equals(first)).toBe(false);
    expect(k.check()).toBe(false);
  });

  it('keeps the key in memory when the file cannot be written (a read-only PKI directory)', () => {
    const file = path.join(root, 'no-such-dir', 'controller.tls-ticket-key');
    const warned: string[] = [];
    const k = keyAt(file, {
      logger: { info: () => {}, warn: (_o, m) => warned.push(m ?? ''), error: () => {} },
    });
    expect(k.current().length).toBe(TLS_TICKET_KEY_BYTES);
    expect(fs.existsSync(file)).toBe(false);
    expect(warned.join('\n')).toMatch(/in memory only/);
  });

  it('gives tickets a lifetime no longer than the rotation period', () => {
    expect(TLS_SESSION_LIFETIME_S * 1000).toBeLessThanOrEqual(TLS_TICKET_KEY_ROTATE_MS);
  });
});
