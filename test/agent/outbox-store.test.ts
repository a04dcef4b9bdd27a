import { readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { OUTBOX_DIR, OutboxStore } from '../../agent/outbox-store.js';
import type { SignalBody } from '../../protocol/heat.js';
import { tempDir } from './hooks-helpers.js';

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-outbox-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

const body = (code: number): SignalBody => ({
  revision: 1,
  deploy_status_code: code,
  deploy_stdout: 'o',
  deploy_stderr: 'e',
  outputs: { x: code },
});
const sig = (dep: string, code: number) => ({
  node: 'n1',
  deployment_id: dep,
  path: `/v1/deployments/${dep}/signal`,
  body: body(code),
});

describe('OutboxStore', () => {
  it('keeps order across a re-open and continues the sequence', async () => {
    const dir = join(base, 'a');
    const s = await OutboxStore.open(dir);
    await Promise.all([s.enqueue(sig('d1', 1)), s.enqueue(sig('d2', 2)), s.enqueue(sig('d1', 3))]);
    const again = await OutboxStore.open(dir);
    const list = await again.list();
    expect(list.map((e) => [e.seq, e.deployment_id, e.body.deploy_status_code])).toEqual([
      [1, 'd1', 1],
      [2, 'd2', 2],
      [3, 'd1', 3],
    ]);
    expect(list[0]).toMatchObject({ node: 'n1', path: '/v1/deployments/d1/signal', body: body(1) });
    await again.remove(list[0]!);
    await again.remove(list[0]!); // idempotent
    const e4 = await again.enqueue(sig('d3', 4));
    expect(e4.seq).toBe(4);
    const third = await OutboxStore.open(dir);
    expect((await third.list()).map((e) => e.seq)).toEqual([2, 3, 4]);
    const e5 = await third.enqueue(sig('d4', 5));
    expect(e5.seq).toBe(5);
  });

  it('writes 0600 files in a 0700 dir', async () => {
    const dir = join(base, 'b');
    const s = await OutboxStore.open(dir);
    await s.enqueue(sig('d1', 0));
    expect((await stat(join(dir, OUTBOX_DIR))).mode & 0o777).toBe(0o700);
    const [name] = await readdir(join(dir, OUTBOX_DIR));
    expect(name).toBe('000000000001-d1.json');
    expect((await stat(join(dir, OUTBOX_DIR, name!))).mode & 0o777).toBe(0o600);
  });

  it('keeps only SignalBody keys: inputs passed by mistake never reach the disk', async () => {
    const dir = join(base, 'c');
    const s = await OutboxStore.open(dir);
    const leaky = { ...body(0), inputs: [{ name: 'password', value: 'hunter2' }] } as SignalBody;
    const e = await s.enqueue({ ...sig('d1', 0), body: leaky });
    expect(Object.keys(e.body).sort()).toEqual([
      'deploy_status_code',
      'deploy_stderr',
      'deploy_stdout',
      'outputs',
      'revision',
    ]);
    const [name] = await readdir(join(dir, OUTBOX_DIR));
    expect(await readFile(join(dir, OUTBOX_DIR, name!), 'utf8')).not.toContain('hunter2');
  });

  it('refuses a body of the wrong shape', async () => {
    const s = await OutboxStore.open(join(base, 'd'));
    await expect(s.enqueue({ ...sig('d1', 0), body: { revision: 1 } as SignalBody })).rejects.toBeInstanceOf(TypeError);
  });

  it('sets a bad entry aside and skips it; names odd ids safely; clears temp files', async () => {
    const dir = join(base, 'e');
    const s = await OutboxStore.open(dir);
    await s.enqueue(sig('../../etc/x', 1));
    await writeFile(join(dir, OUTBOX_DIR, '000000000002-d2.json'), 'not json');
    await writeFile(join(dir, OUTBOX_DIR, '.tmp-000000000003-d3.json-abc'), 'partial');
    const again = await OutboxStore.open(dir);
    const list = await again.list();
    expect(list.map((e) => e.deployment_id)).toEqual(['../../etc/x']);
    expect((await readdir(join(dir, OUTBOX_DIR))).sort()).toEqual([
      '000000000001-deployment.json',
      '000000000002-d2.json.bad',
    ]);
    expect((await again.enqueue(sig('d9', 9))).seq).toBe(3);
    // removed by the name it was written under, odd id and all
    await again.remove(list[0]!);
    expect((await readdir(join(dir, OUTBOX_DIR))).sort()).toEqual(['000000000002-d2.json.bad', '000000000003-d9.json']);
  });

  it('sets aside an entry nested deeper than the depth guard, instead of overflowing the stack on every send', async () => {
    const dir = join(base, 'f');
    await OutboxStore.open(dir);
    const deep = '['.repeat(5_000) + ']'.repeat(5_000);
    const planted = `{"seq":1,"node":"n1","deployment_id":"d1","path":"/x","enqueued_at":"2026-01-01T00:00:00Z","body":{"revision":1,"deploy_status_code":0,"deploy_stdout":"","deploy_stderr":"","outputs":{"x":${deep}}}}`;
    await writeFile(join(dir, OUTBOX_DIR, '000000000001-d1.json'), planted);
    const s = await OutboxStore.open(dir);
    await s.enqueue(sig('d2', 2));
    const list = await s.list();
    expect(list.map((e) => e.deployment_id)).toEqual(['d2']);
    expect(() => JSON.stringify(list)).not.toThrow();
    expect((await readdir(join(dir, OUTBOX_DIR))).sort()).toEqual(['000000000001-d1.json.bad', '000000000002-d2.json']);
  });
});
