/**
 * certs/session-file.ts: a TlsSessionStore kept in a file (the push dialer's sessions).
 * Real files in a temp dir; the store's material is a stand-in that holds revoked serials.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SessionFile } from '../../certs/session-file.js';
import { type SessionPeer, TlsSessionStore } from '../../certs/session-store.js';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-session-file-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const revoked = new Set<string>();
const material = { current: () => ({ revokedSerials: revoked }) };
const peer = (node: string, serial = `${node}01`): SessionPeer => ({
  spiffeId: `spiffe://herald.local/agent/${node}`,
  role: 'agent',
  name: node,
  serials: [serial],
  notAfterMs: Date.now() + 3_600_000,
});
let bound = 'ca-and-cert-1';
const binding = (): string => bound;
/** The session lines (after the first, which names what they were made under). */
const lines = (file: string): string[] => fs.readFileSync(file, 'utf8').split('\n').slice(1).filter(Boolean);

describe('push TLS session file', () => {
  it('a new store on the file gets back every live session, the newest of each node, none forgotten', () => {
    const file = path.join(dir, 'a');
    const s1 = new TlsSessionStore(material);
    const f1 = new SessionFile(file, s1, { binding });
    s1.save('n1', peer('n1'), Buffer.from('old'), s1.epoch);
    s1.save('n1', peer('n1'), Buffer.from('new'), s1.epoch);
    s1.save('n2', peer('n2'), Buffer.from('two'), s1.epoch);
    s1.save('n3', peer('n3'), Buffer.from('three'), s1.epoch);
    s1.delete('n3');
    f1.close(); // (a crash closes nothing: the lines are written as they come)
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);

    const s2 = new TlsSessionStore(material);
    const f2 = new SessionFile(file, s2, { binding });
    expect(s2.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('new');
    expect(s2.offer('n2', peer('n2').spiffeId)?.session.toString()).toBe('two');
    expect(s2.offer('n3', peer('n3').spiffeId)).toBeUndefined();
    // the bytes stay in the file: nothing decoded or written at open
    expect([...s2.entries()].map(([, e]) => e.session)).toEqual([null, null]);
    f2.close();
    expect(lines(file)).toHaveLength(5);
  });

  it('is compacted at open when it holds the slack more lines than live sessions, or its last line is torn', () => {
    const file = path.join(dir, 'a2');
    const s1 = new TlsSessionStore(material);
    const f1 = new SessionFile(file, s1, { binding, slackEntries: 3 });
    for (const t of ['a', 'b', 'c']) s1.save('n1', peer('n1'), Buffer.from(t), s1.epoch);
    s1.save('n2', peer('n2'), Buffer.from('two'), s1.epoch);
    f1.close();
    expect(lines(file)).toHaveLength(4);
    const s2 = new TlsSessionStore(material);
    new SessionFile(file, s2, { binding, slackEntries: 1 }).close(); // 4 lines > 2 live + 1
    expect(lines(file)).toHaveLength(2);

    fs.appendFileSync(file, '{"k":"n3","s":"eA'); // a crash in the middle of an append
    const s3 = new TlsSessionStore(material);
    const f3 = new SessionFile(file, s3, { binding });
    expect(lines(file)).toHaveLength(2); // the torn line gone, so the next append starts a line of its own
    s3.save('n3', peer('n3'), Buffer.from('three'), s3.epoch);
    f3.close();
    const s4 = new TlsSessionStore(material);
    const f4 = new SessionFile(file, s4, { binding });
    expect(s4.size).toBe(3);
    expect(s4.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('c');
    expect(s4.offer('n3', peer('n3').spiffeId)?.session.toString()).toBe('three');
    f4.close();
  });

  it('skips lines that are not sessions, and offers nothing revoked or for another node', () => {
    const file = path.join(dir, 'b');
    const s1 = new TlsSessionStore(material);
    const f1 = new SessionFile(file, s1, { binding });
    s1.save('n1', peer('n1', 'aa'), Buffer.from('one'), s1.epoch);
    s1.save('n2', peer('n2', 'bb'), Buffer.from('two'), s1.epoch);
    f1.close();
    fs.appendFileSync(file, 'not json\n{"k":"n9","s":"eA==","t":1}\n{"k":5}\n');
    revoked.add('bb');
    try {
      const s2 = new TlsSessionStore(material);
      new SessionFile(file, s2, { binding }).close();
      expect(s2.size).toBe(2);
      expect(s2.offer('n1', peer('n2').spiffeId)).toBeUndefined(); // n1's session, asked for n2
      expect(s2.offer('n2', peer('n2').spiffeId)).toBeUndefined(); // revoked since
      expect(s2.size).toBe(0);
    } finally {
      revoked.delete('bb');
    }
  });

  it('stays bounded: rewritten once it holds the slack more lines than live sessions', () => {
    const file = path.join(dir, 'c');
    const s = new TlsSessionStore(material);
    const f = new SessionFile(file, s, { binding, slackEntries: 10 });
    for (let i = 0; i < 200; i++) s.save('n1', peer('n1'), Buffer.from(`t${i}`), s.epoch);
    expect(lines(file).length).toBeLessThanOrEqual(1 + 10);
    f.close();
    const again = new TlsSessionStore(material);
    const f2 = new SessionFile(file, again, { binding });
    expect(again.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('t199');
    f2.close();
  });

  it('a file made under another CA or controller certificate is not read; a directory in its place stops nothing', () => {
    const file = path.join(dir, 'e');
    const s1 = new TlsSessionStore(material);
    const f1 = new SessionFile(file, s1, { binding });
    s1.save('n1', peer('n1'), Buffer.from('one'), s1.epoch);
    f1.close();
    bound = 'ca-and-cert-2';
    try {
      const s2 = new TlsSessionStore(material);
      new SessionFile(file, s2, { binding }).close();
      expect(s2.size).toBe(0);
      expect(lines(file)).toEqual([]); // rewritten under the new binding
    } finally {
      bound = 'ca-and-cert-1';
    }
    const blocked = path.join(dir, 'f');
    fs.mkdirSync(path.join(blocked, 'inside'), { recursive: true });
    const s3 = new TlsSessionStore(material);
    const f3 = new SessionFile(blocked, s3, { binding });
    s3.save('n1', peer('n1'), Buffer.from('one'), s3.epoch);
    expect(s3.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('one'); // in memory only
    f3.close();
  });

  it('clear() empties the file; a session past its age is not taken back', () => {
    const file = path.join(dir, 'd');
    let now = Date.now();
    const s = new TlsSessionStore(material, { now: () => now, maxAgeMs: 1_000 });
    const f = new SessionFile(file, s, { binding });
    s.save('n1', peer('n1'), Buffer.from('one'), s.epoch);
    s.clear();
    expect(lines(file)).toEqual([]);
    s.save('n2', peer('n2'), Buffer.from('two'), s.epoch);
    f.close();
    now += 2_000;
    const later = new TlsSessionStore(material, { now: () => now, maxAgeMs: 1_000 });
    new SessionFile(file, later, { binding }).close();
    expect(later.size).toBe(0);
  });

  it('keeps the session bytes in the file alone and reads them back when offering; one it cannot read back is dropped', () => {
    const file = path.join(dir, 'g');
    const s = new TlsSessionStore(material);
    const f = new SessionFile(file, s, { binding, slackEntries: 5 });
    s.save('n1', peer('n1'), Buffer.from('one'), s.epoch);
    s.save('n2', peer('n2'), Buffer.from('two'), s.epoch);
    // the store holds whom each session is with, not its bytes
    expect([...s.entries()].map(([, e]) => e.session)).toEqual([null, null]);
    expect(s.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('one');
    // through rewrites (20 saves, slack 5) the lines move: each is still found
    for (let i = 0; i < 20; i++) s.save('n3', peer('n3'), Buffer.from(`t${i}`), s.epoch);
    expect(lines(file).length).toBeLessThanOrEqual(3 + 5);
    expect(s.offer('n2', peer('n2').spiffeId)?.session.toString()).toBe('two');
    expect(s.offer('n3', peer('n3').spiffeId)?.session.toString()).toBe('t19');
    // a line changed under it (its key no longer matches): no session, and the entry is gone
    const text = fs.readFileSync(file, 'utf8');
    const at = text.indexOf('"k":"n2"');
    const fd = fs.openSync(file, 'r+');
    fs.writeSync(fd, '"k":"n9"', at);
    fs.closeSync(fd);
    expect(s.offer('n2', peer('n2').spiffeId)).toBeUndefined();
    expect(s.size).toBe(2);
    f.close();
    // after close() nothing can be read back: offered, a session is dropped, never wrong
    expect(s.offer('n1', peer('n1').spiffeId)).toBeUndefined();
  });

  it('when the file cannot be written, the store keeps the bytes itself', () => {
    const blocked = path.join(dir, 'h');
    fs.mkdirSync(path.join(blocked, 'inside'), { recursive: true });
    const s = new TlsSessionStore(material);
    const f = new SessionFile(blocked, s, { binding });
    s.save('n1', peer('n1'), Buffer.from('one'), s.epoch);
    expect([...s.entries()][0]![1].session?.toString()).toBe('one');
    expect(s.offer('n1', peer('n1').spiffeId)?.session.toString()).toBe('one');
    f.close();
  });
});
