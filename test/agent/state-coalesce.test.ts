/**
 * The agent's state writes: the changes made in one synchronous stretch share one write, a
 * change made after a write ran gets one of its own, and each change is on disk when its
 * promise resolves. The atomic write is wrapped to count calls; the files are real.
 */
import { mkdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { tempDir } from './hooks-helpers.js';

const writes = vi.hoisted(() => ({ count: 0 }));
vi.mock('../../agent/atomic-file.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../agent/atomic-file.js')>();
  return {
    ...real,
    writeFileAtomicSync: (...args: Parameters<typeof real.writeFileAtomicSync>) => {
      writes.count++;
      return real.writeFileAtomicSync(...args);
    },
  };
});

const { AgentState, STATE_FILE } = await import('../../agent/state.js');

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-state-coalesce-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

const onDisk = async (dir: string): Promise<{ last_applied_generation: number | null; items: Record<string, any> }> =>
  JSON.parse(await readFile(join(dir, STATE_FILE), 'utf8'));

describe('agent state writes', () => {
  it('an item finish, the applied generation and a prune made together cost one write, each on disk when it resolves', async () => {
    const dir = join(base, 'a');
    const st = await AgentState.open(dir);
    await st.markStarted('old', { deployment_id: 'd0', revision: 1 });
    await st.markFinished('old', 0);
    writes.count = 0;

    await st.markStarted('i1', { deployment_id: 'd1', revision: 1 });
    expect(writes.count).toBe(1);
    expect((await onDisk(dir)).items.i1).toBeDefined();
    // as the apply loop does at a document's end: three changes before any is awaited
    const finished = st.markFinished('i1', 0);
    const applied = st.setLastAppliedGeneration(7);
    const pruned = st.prune(['i1']);
    await Promise.all([finished, applied, pruned]);
    expect(writes.count).toBe(2);
    const after = await onDisk(dir);
    expect(after.items.i1.finished_at).toBeDefined();
    expect(after.last_applied_generation).toBe(7);
    expect(after.items.old).toBeUndefined();

    // a change after a write ran is not lost: it gets a write of its own
    await st.markStarted('i2', { deployment_id: 'd2', revision: 1 });
    await st.markFinished('i2', 3);
    expect(writes.count).toBe(4);
    expect((await onDisk(dir)).items.i2.status_code).toBe(3);
    expect((await AgentState.open(dir)).get('i2')?.status_code).toBe(3);
  });

  it('a failed write rejects the changes it held and a later change is written again', async () => {
    const dir = join(base, 'b');
    const st = await AgentState.open(dir);
    // a directory where the state file goes: the rename over it fails, for root too
    await mkdir(join(dir, STATE_FILE, 'blocker'), { recursive: true });
    await expect(st.markStarted('x', { deployment_id: 'd', revision: 1 })).rejects.toThrow(/EISDIR|ENOTEMPTY|EEXIST/);
    await rm(join(dir, STATE_FILE), { recursive: true });
    await st.markStarted('y', { deployment_id: 'd', revision: 2 });
    const disk = await onDisk(dir);
    expect(disk.items.y).toBeDefined();
    expect(disk.items.x).toBeDefined(); // the later write holds the earlier change too
  });
});
