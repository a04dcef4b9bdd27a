/**
 * At start the controller removes the push session files of workers it no longer starts (their
 * sessions would stay on disk, as sensitive as its key, with no worker to offer or expire them).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { removeSessionFilesFrom } from '../../certs/session-file.js';
import { MAX_PUSH_WORKER_PROCESSES } from '../../protocol/limits.js';
import { startTestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki } from '../helpers/controller-pki.js';

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-stale-sessions-'));
});
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

const fileOf = (worker: number): string => path.join(dir, `h.db.push-sessions-${worker}`);
const touch = (workers: number[]): void => {
  for (const w of workers) fs.writeFileSync(fileOf(w), 'x', { mode: 0o600 });
};
const left = (): string[] =>
  fs
    .readdirSync(dir)
    .filter((f) => f.includes('.push-sessions-'))
    .sort();

describe('removeSessionFilesFrom', () => {
  it('removes the files of workers from `first` up to the most a controller starts, and no other', () => {
    touch([0, 1, 2, 3, MAX_PUSH_WORKER_PROCESSES - 1]);
    fs.writeFileSync(path.join(dir, 'h.db'), 'db');
    const r = removeSessionFilesFrom(fileOf, 2);
    expect(r.removed).toEqual([fileOf(2), fileOf(3), fileOf(MAX_PUSH_WORKER_PROCESSES - 1)]);
    expect(r.failed).toEqual([]);
    expect(left()).toEqual(['h.db.push-sessions-0', 'h.db.push-sessions-1']);
    expect(fs.existsSync(path.join(dir, 'h.db'))).toBe(true);
  });

  it('reports a file it cannot remove and goes on', () => {
    fs.mkdirSync(fileOf(1)); // a directory: unlink fails with EISDIR (or EPERM)
    touch([2]);
    const r = removeSessionFilesFrom(fileOf, 1);
    expect(r.removed).toEqual([fileOf(2)]);
    expect(r.failed.map((f) => f.file)).toEqual([fileOf(1)]);
    expect(r.failed[0]!.error).toMatch(/^E[A-Z]+$/);
  });
});

describe('a controller starting', () => {
  it('with fewer push workers than the last start removes the files of the others, logged', async () => {
    const pki = await makeControllerTestPki();
    touch([0, 1, 2, 7]);
    const t = await startTestController(pki, { db: path.join(dir, 'h.db'), pushWorkers: 2 });
    try {
      expect(left()).toEqual(['h.db.push-sessions-0', 'h.db.push-sessions-1']);
      expect(t.logText()).toContain('removed the session files of push workers no longer started');
    } finally {
      await t.close();
    }
  });

  it('dialling from its main process (no workers) keeps worker 0’s file, which that dialer uses', async () => {
    const pki = await makeControllerTestPki();
    touch([0, 1]);
    const t = await startTestController(pki, { db: path.join(dir, 'h.db'), pushWorkers: 0 });
    try {
      expect(left()).toEqual(['h.db.push-sessions-0']);
    } finally {
      await t.close();
    }
  });
});
