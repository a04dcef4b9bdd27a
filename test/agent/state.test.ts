import { chmod, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensurePrivateDir, TEMP_PREFIX, writeFileAtomicSync } from '../../agent/atomic-file.js';
import { AgentState, INTERRUPTED_STATUS_CODE, STATE_FILE } from '../../agent/state.js';
import { ConfigError } from '../../protocol/errors.js';
import { tempDir } from './hooks-helpers.js';

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-state-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

const mode = async (p: string): Promise<number> => (await stat(p)).mode & 0o777;

describe('atomic files', () => {
  it('writes 0600 files in a 0700 dir, replacing content and leaving no temp file', async () => {
    const dir = join(base, 'atomic', 'nested');
    await ensurePrivateDir(dir);
    expect(await mode(dir)).toBe(0o700);
    expect(await mode(join(base, 'atomic'))).toBe(0o700);
    const f = join(dir, 'x.json');
    writeFileAtomicSync(f, 'one');
    writeFileAtomicSync(f, 'two');
    expect(await readFile(f, 'utf8')).toBe('two');
    expect(await mode(f)).toBe(0o600);
    expect(await readdir(dir)).toEqual(['x.json']);
  });
  it('a write that fails leaves the old content and no temporary file, and throws the file system error', async () => {
    const dir = join(base, 'atomic-fail');
    await ensurePrivateDir(dir);
    await mkdir(join(dir, 'target'));
    await writeFile(join(dir, 'target', 'inside'), 'kept');
    expect(() => writeFileAtomicSync(join(dir, 'target'), 'new')).toThrow(/EISDIR|ENOTEMPTY|EEXIST/);
    expect((await readdir(dir)).filter((n) => n.startsWith(TEMP_PREFIX) || n.endsWith('.tmp'))).toEqual([]);
    expect(await readFile(join(dir, 'target', 'inside'), 'utf8')).toBe('kept');
  });
  it('keeps 0600 even when the old file was looser', async () => {
    const f = join(base, 'loose.txt');
    await writeFile(f, 'old', { mode: 0o644 });
    writeFileAtomicSync(f, 'new');
    expect(await mode(f)).toBe(0o600);
  });
  it('tightens an existing loose dir and says so', async () => {
    const dir = join(base, 'loosedir');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const warnings: string[] = [];
    await ensurePrivateDir(dir, { warn: (_o, msg) => warnings.push(msg) });
    expect(await mode(dir)).toBe(0o700);
    expect(warnings).toHaveLength(1);
  });
});

describe('AgentState', () => {
  it('persists generations and item records across a re-open; 0700 dir, 0600 file', async () => {
    const dir = join(base, 's1');
    const s = await AgentState.open(dir);
    expect(s.lastFetchedGeneration).toBeUndefined();
    await s.setLastFetchedGeneration(7);
    await s.setLastAppliedGeneration(6);
    await s.markStarted('a', { deployment_id: 'd1', revision: 1 });
    await s.markFinished('a', 0);
    const again = await AgentState.open(dir);
    expect(again.lastFetchedGeneration).toBe(7);
    expect(again.lastAppliedGeneration).toBe(6);
    expect(again.hasRun('a')).toBe(true);
    expect(again.get('a')).toMatchObject({ deployment_id: 'd1', revision: 1, status_code: 0 });
    expect(again.interruptedItems()).toEqual([]);
    expect(await mode(dir)).toBe(0o700);
    expect(await mode(join(dir, STATE_FILE))).toBe(0o600);
  });

  it('shows an item started but not finished as interrupted after a re-open, once', async () => {
    const dir = join(base, 's2');
    const s = await AgentState.open(dir);
    await s.markStarted('done', { deployment_id: 'd1', revision: 1 });
    await s.markFinished('done', 0);
    await s.markStarted('running', { deployment_id: 'd2', revision: 3 });
    // the agent "dies" here
    const after = await AgentState.open(dir);
    expect(after.interruptedItems()).toEqual([
      expect.objectContaining({ id: 'running', deployment_id: 'd2', revision: 3 }),
    ]);
    expect(after.hasRun('running')).toBe(true);
    await after.markInterrupted('running');
    const third = await AgentState.open(dir);
    expect(third.interruptedItems()).toEqual([]);
    expect(third.get('running')).toMatchObject({ interrupted: true, status_code: INTERRUPTED_STATUS_CODE });
    expect(third.hasRun('running')).toBe(true);
  });

  it('prunes finished items absent from the latest metadata, keeps unfinished ones', async () => {
    const s = await AgentState.open(join(base, 's3'));
    for (const id of ['a', 'b', 'c']) await s.markStarted(id, { deployment_id: id, revision: 1 });
    await s.markFinished('a');
    await s.markFinished('b');
    expect(await s.prune(['b'])).toBe(1);
    expect(s.hasRun('a')).toBe(false);
    expect(s.hasRun('b')).toBe(true);
    expect(s.hasRun('c')).toBe(true);
    const again = await AgentState.open(join(base, 's3'));
    expect(again.size).toBe(2);
  });

  it('keeps the latest state when changes are not awaited one by one', async () => {
    const dir = join(base, 's4');
    const s = await AgentState.open(dir);
    const writes = [];
    for (let i = 0; i < 20; i++) writes.push(s.markStarted(`i${i}`, { deployment_id: 'd', revision: i }));
    await Promise.all(writes);
    expect((await AgentState.open(dir)).size).toBe(20);
  });

  it('stores no input values', async () => {
    const dir = join(base, 's5');
    const s = await AgentState.open(dir);
    await s.markStarted('x', {
      deployment_id: 'd',
      revision: 1,
      ...{ inputs: [{ name: 'pw', value: 'hunter2' }] },
    } as never);
    expect(await readFile(join(dir, STATE_FILE), 'utf8')).not.toContain('hunter2');
  });

  it('refuses a state file that is not valid state', async () => {
    const dir = join(base, 's6');
    await ensurePrivateDir(dir);
    await writeFile(join(dir, STATE_FILE), '{"version":1,"items":[]}');
    await expect(AgentState.open(dir)).rejects.toBeInstanceOf(ConfigError);
    await writeFile(join(dir, STATE_FILE), 'garbage');
    await expect(AgentState.open(dir)).rejects.toBeInstanceOf(ConfigError);
  });

  it('keeps an id such as __proto__ as an ordinary key', async () => {
    const dir = join(base, 's7');
    const s = await AgentState.open(dir);
    expect(s.hasRun('__proto__')).toBe(false);
    await s.markStarted('__proto__', { deployment_id: 'd', revision: 1 });
    expect((await AgentState.open(dir)).interruptedItems().map((x) => x.id)).toEqual(['__proto__']);
  });
});
