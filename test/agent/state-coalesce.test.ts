/**
 * The agent's state writes: the changes made in one synchronous stretch share one write, a
 * change made after a write ran gets one of its own, and each change is on disk when its
 * promise resolves. The journal's append and the snapshot's atomic replace are wrapped to count
 * calls; the files are real.
 */
import { lstat, mkdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AGENT_STATE_JOURNAL_MAX_BYTES } from '../../protocol/limits.js';
import { tempDir } from './hooks-helpers.js';

const writes = vi.hoisted(() => ({ count: 0, appends: 0, replaces: 0 }));
vi.mock('../../agent/atomic-file.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../agent/atomic-file.js')>();
  return {
    ...real,
    writeFileAtomicSync: (...args: Parameters<typeof real.writeFileAtomicSync>) => {
      writes.replaces++;
      return real.writeFileAtomicSync(...args);
    },
    appendFileDurableSync: (...args: Parameters<typeof real.appendFileDurableSync>) => {
      writes.count++;
      writes.appends++;
      return real.appendFileDurableSync(...args);
    },
  };
});

const { AgentState, STATE_FILE, STATE_JOURNAL_FILE } = await import('../../agent/state.js');

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-state-coalesce-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

/** What a fresh reader of the state dir finds (the snapshot and its journal). */
const onDisk = (dir: string) => AgentState.read(dir);

describe('agent state writes', () => {
  it('an item finish, the applied generation and a prune made together cost one write, each on disk when it resolves', async () => {
    const dir = join(base, 'a');
    const st = await AgentState.open(dir);
    await st.markStarted('old', { deployment_id: 'd0', revision: 1 });
    await st.markFinished('old', 0);
    writes.count = 0;
    writes.replaces = 0;

    await st.markStarted('i1', { deployment_id: 'd1', revision: 1 });
    expect(writes.count).toBe(1);
    expect(onDisk(dir).items.i1).toBeDefined();
    // as the apply loop does at a document's end: three changes before any is awaited
    const finished = st.markFinished('i1', 0);
    const applied = st.setLastAppliedGeneration(7);
    const pruned = st.prune(['i1']);
    await Promise.all([finished, applied, pruned]);
    expect(writes.count).toBe(2);
    const after = onDisk(dir);
    expect(after.items.i1?.finished_at).toBeDefined();
    expect(after.lastAppliedGeneration).toBe(7);
    expect(after.items.old).toBeUndefined();

    // a change after a write ran is not lost: it gets a write of its own
    await st.markStarted('i2', { deployment_id: 'd2', revision: 1 });
    await st.markFinished('i2', 3);
    expect(writes.count).toBe(4);
    expect(onDisk(dir).items.i2?.status_code).toBe(3);
    expect((await AgentState.open(dir)).get('i2')?.status_code).toBe(3);
    // each of them one append to the journal: state.json was not replaced
    expect(writes.replaces).toBe(0);
  });

  it('a failed write rejects the changes it held and a later change is written again', async () => {
    const dir = join(base, 'b');
    const st = await AgentState.open(dir);
    // a directory where the state file goes: the rename over it fails, for root too
    await mkdir(join(dir, STATE_FILE, 'blocker'), { recursive: true });
    await expect(st.markStarted('x', { deployment_id: 'd', revision: 1 })).rejects.toThrow(/EISDIR|ENOTEMPTY|EEXIST/);
    await rm(join(dir, STATE_FILE), { recursive: true });
    await st.markStarted('y', { deployment_id: 'd', revision: 2 });
    const disk = onDisk(dir);
    expect(disk.items.y).toBeDefined();
    expect(disk.items.x).toBeDefined(); // the later write holds the earlier change too
  });

  it('a failed append rejects its changes; the next write folds them into a new snapshot with the later ones', async () => {
    const dir = join(base, 'c');
    const st = await AgentState.open(dir);
    await st.markStarted('a', { deployment_id: 'd', revision: 1 }); // the first write folds: both files exist
    await rm(join(dir, STATE_JOURNAL_FILE));
    await mkdir(join(dir, STATE_JOURNAL_FILE)); // an append to a directory fails (EISDIR), for root too
    await expect(st.markFinished('a', 0)).rejects.toThrow(/EISDIR/);
    await rm(join(dir, STATE_JOURNAL_FILE), { recursive: true });
    writes.replaces = 0;
    await st.markStarted('b', { deployment_id: 'd', revision: 2 });
    expect(writes.replaces).toBe(2); // the snapshot, then a new journal
    const disk = onDisk(dir);
    expect(disk.items.a?.status_code).toBe(0); // the change whose append failed is held by the fold
    expect(disk.items.b).toBeDefined();
  });

  it("never appends through a symlink planted in the journal's place: the change is refused, the next write replaces the link", async () => {
    const dir = join(base, 'e');
    const st = await AgentState.open(dir);
    await st.markStarted('a', { deployment_id: 'd', revision: 1 }); // folds: both files exist
    const elsewhere = join(base, 'elsewhere.txt');
    await writeFile(elsewhere, 'untouched\n');
    await rm(join(dir, STATE_JOURNAL_FILE));
    await symlink(elsewhere, join(dir, STATE_JOURNAL_FILE));
    await expect(st.markFinished('a', 0)).rejects.toThrow(/ELOOP/);
    await st.markStarted('b', { deployment_id: 'd', revision: 2 }); // a fold: the link is replaced
    expect(await readFile(elsewhere, 'utf8')).toBe('untouched\n');
    expect((await lstat(join(dir, STATE_JOURNAL_FILE))).isSymbolicLink()).toBe(false);
    expect(onDisk(dir).items.a?.status_code).toBe(0);
  });

  it('the journal is folded into the snapshot once it holds AGENT_STATE_JOURNAL_MAX_BYTES, and nothing is lost', async () => {
    const dir = join(base, 'd');
    const st = await AgentState.open(dir);
    writes.replaces = 0;
    writes.appends = 0;
    const n = 1_000; // two lines of ~150 bytes each: ~300 kB of changes in all
    for (let i = 0; i < n; i++) {
      await st.markStarted(`item-${i}`, { deployment_id: `dep-${i}`, revision: i });
      await st.markFinished(`item-${i}`, i % 7);
    }
    const folds = writes.replaces / 2;
    expect(folds).toBeGreaterThanOrEqual(4);
    expect(writes.appends + folds).toBe(2 * n); // every change is one write: an append, or a fold
    expect((await stat(join(dir, STATE_JOURNAL_FILE))).size).toBeLessThanOrEqual(AGENT_STATE_JOURNAL_MAX_BYTES + 1_024);
    const disk = onDisk(dir);
    expect(Object.keys(disk.items)).toHaveLength(n);
    expect(disk.items['item-999']?.status_code).toBe(999 % 7);
  });
});
