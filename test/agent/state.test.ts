import { spawn } from 'node:child_process';
import { appendFile, chmod, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ensurePrivateDir, TEMP_PREFIX, writeFileAtomicSync } from '../../agent/atomic-file.js';
import { AgentState, INTERRUPTED_STATUS_CODE, STATE_FILE, STATE_JOURNAL_FILE } from '../../agent/state.js';
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
    const meta = { deployment_id: 'd', revision: 1, ...{ inputs: [{ name: 'pw', value: 'hunter2' }] } } as never;
    await s.markStarted('x', meta); // the first write: a snapshot
    await s.markStarted('y', meta); // then the journal
    expect(await readFile(join(dir, STATE_FILE), 'utf8')).toContain('"x"');
    expect(await readFile(join(dir, STATE_JOURNAL_FILE), 'utf8')).toContain('"y"');
    for (const f of [STATE_FILE, STATE_JOURNAL_FILE])
      expect(await readFile(join(dir, f), 'utf8')).not.toContain('hunter2');
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

describe('AgentState journal after a crash', () => {
  /** A state dir holding a snapshot and a journal with two changes after it. */
  const withJournal = async (name: string): Promise<string> => {
    const dir = join(base, name);
    const s = await AgentState.open(dir);
    await s.markStarted('a', { deployment_id: 'd1', revision: 1 }); // folds: snapshot and journal
    await s.markFinished('a', 0); // appended
    await s.markStarted('b', { deployment_id: 'd2', revision: 2 }); // appended
    return dir;
  };

  it('a torn last line (an append the crash cut short) is read as never written, and the next write folds', async () => {
    const dir = await withJournal('torn');
    const journal = join(dir, STATE_JOURNAL_FILE);
    await appendFile(journal, '{"items":{"c":{"deployment_id":"d3","revi');
    const s = await AgentState.open(dir);
    expect(s.hasRun('c')).toBe(false);
    expect(s.get('a')?.status_code).toBe(0);
    expect(s.hasRun('b')).toBe(true);
    await s.markStarted('c', { deployment_id: 'd3', revision: 3 });
    // folded: the journal starts afresh, so nothing is ever appended after the torn bytes
    expect((await readFile(journal, 'utf8')).split('\n').filter(Boolean)).toHaveLength(1);
    expect(Object.keys(AgentState.read(dir).items).sort()).toEqual(['a', 'b', 'c']);
  });

  it("a journal the snapshot already holds (a crash between a fold's two replaces) is skipped", async () => {
    const dir = await withJournal('stale');
    const journal = join(dir, STATE_JOURNAL_FILE);
    const old = await readFile(journal, 'utf8');
    // the fold's first replace: a snapshot holding everything, one epoch on; the second (a new
    // journal) never happened, and the old journal says more that must not be applied again
    const snap = JSON.parse(await readFile(join(dir, STATE_FILE), 'utf8')) as { journal_epoch: number };
    writeFileAtomicSync(
      join(dir, STATE_FILE),
      JSON.stringify({
        version: 1,
        journal_epoch: snap.journal_epoch + 1,
        last_fetched_generation: null,
        last_applied_generation: null,
        items: AgentState.read(dir).items,
      }),
    );
    writeFileAtomicSync(journal, `${old}{"items":{"a":null}}\n`);
    expect(Object.keys(AgentState.read(dir).items).sort()).toEqual(['a', 'b']);
    const s = await AgentState.open(dir);
    await s.markStarted('c', { deployment_id: 'd3', revision: 3 }); // folds: the stale journal is replaced
    expect((await readFile(journal, 'utf8')).includes('"a":null')).toBe(false);
    expect(Object.keys(AgentState.read(dir).items).sort()).toEqual(['a', 'b', 'c']);
  });

  it('refuses a damaged line that is not the last, and a journal that continues another snapshot', async () => {
    const dir = await withJournal('damaged');
    const journal = join(dir, STATE_JOURNAL_FILE);
    const good = await readFile(journal, 'utf8');
    await writeFile(journal, `${good}not json\n{"items":{}}\n`);
    await expect(AgentState.open(dir)).rejects.toThrow(/line 4 is not JSON/);
    await writeFile(
      journal,
      good.replace(/^\{"epoch":(\d+)\}/, (_m, e: string) => `{"epoch":${Number(e) + 5}}`),
    );
    await expect(AgentState.open(dir)).rejects.toBeInstanceOf(ConfigError);
    await writeFile(journal, `${good}{"items":{"x":{"deployment_id":"d"}}}\n`);
    await expect(AgentState.open(dir)).rejects.toThrow(/the record of item x/);
  });

  it('a clean stop folds the journal: state.json alone holds everything', async () => {
    const dir = await withJournal('closed');
    const s = await AgentState.open(dir);
    await s.markFinished('b', 2);
    await s.close();
    const journal = (await readFile(join(dir, STATE_JOURNAL_FILE), 'utf8')).split('\n').filter(Boolean);
    expect(journal).toHaveLength(1); // only its head
    const snap = JSON.parse(await readFile(join(dir, STATE_FILE), 'utf8')) as {
      items: Record<string, { status_code?: number }>;
    };
    expect(snap.items.a?.status_code).toBe(0);
    expect(snap.items.b?.status_code).toBe(2);
    await s.close(); // nothing to fold: no write
    expect((await readFile(join(dir, STATE_JOURNAL_FILE), 'utf8')).split('\n').filter(Boolean)).toEqual(journal);
  });

  it('keeps every change acknowledged before a kill -9, and goes on from what it left', async () => {
    const dir = join(base, 'killed');
    // a child that records changes as fast as it can and reports each once its promise resolved
    const script = `
      const { AgentState } = await import(${JSON.stringify(new URL('../../dist/agent/state.js', import.meta.url).href)});
      const s = await AgentState.open(process.argv[1]);
      for (let i = 0; ; i++) {
        await s.markStarted('i' + i, { deployment_id: 'd' + i, revision: i });
        if (i % 3 === 0) await s.markFinished('i' + i, 0);
        process.stdout.write(i + '\\n');
      }`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script, dir], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let acked = -1;
    let buf = '';
    await new Promise<void>((resolve, reject) => {
      child.on('error', reject);
      child.on('exit', () => resolve());
      child.stdout.on('data', (d: Buffer) => {
        buf += d.toString();
        const lines = buf.split('\n');
        buf = lines.pop() ?? '';
        for (const l of lines) acked = Number(l);
        if (acked >= 600) child.kill('SIGKILL'); // past at least one fold
      });
    });
    expect(acked).toBeGreaterThanOrEqual(600);
    const s = await AgentState.open(dir);
    for (let i = 0; i <= acked; i++) {
      expect(s.hasRun(`i${i}`)).toBe(true);
      if (i % 3 === 0) expect(s.get(`i${i}`)?.status_code).toBe(0);
    }
    await s.markStarted('after', { deployment_id: 'd', revision: 1 });
    expect(AgentState.read(dir).items.after).toBeDefined();
  }, 60_000);
});
