/**
 * The agent's state writes: changes made while a write is in flight share one next write, and
 * each change is on disk when its promise resolves. The atomic write is wrapped to count calls;
 * the files are real.
 */
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { tempDir } from './hooks-helpers.js';

const writes = vi.hoisted(() => ({ count: 0 }));
vi.mock('../../agent/atomic-file.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../agent/atomic-file.js')>();
  return {
    ...real,
    writeFileAtomic: async (...args: Parameters<typeof real.writeFileAtomic>) => {
      writes.count++;
      return real.writeFileAtomic(...args);
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
  it('an item finish, the applied generation and a prune made during a write cost one more write, each on disk when it resolves', async () => {
    const dir = join(base, 'a');
    const st = await AgentState.open(dir);
    await st.markStarted('old', { deployment_id: 'd0', revision: 1 });
    await st.markFinished('old', 0);
    writes.count = 0;

    const started = st.markStarted('i1', { deployment_id: 'd1', revision: 1 });
    await vi.waitFor(() => expect(writes.count).toBe(1)); // write 1 is in flight
    const finished = st.markFinished('i1', 0); // these three join write 2
    const applied = st.setLastAppliedGeneration(7);
    const pruned = st.prune(['i1']);
    await started;
    expect((await onDisk(dir)).items.i1).toBeDefined();
    await finished;
    const after = await onDisk(dir);
    expect(after.items.i1.finished_at).toBeDefined();
    expect(after.last_applied_generation).toBe(7);
    expect(after.items.old).toBeUndefined();
    await Promise.all([applied, pruned]);
    expect(writes.count).toBe(2);

    // a change after a write began is not lost: it gets a write of its own
    const a = st.markStarted('i2', { deployment_id: 'd2', revision: 1 });
    await vi.waitFor(() => expect(writes.count).toBe(3));
    const b = st.markFinished('i2', 3);
    await Promise.all([a, b]);
    expect(writes.count).toBe(4);
    expect((await onDisk(dir)).items.i2.status_code).toBe(3);
    expect((await AgentState.open(dir)).get('i2')?.status_code).toBe(3);
  });
});
