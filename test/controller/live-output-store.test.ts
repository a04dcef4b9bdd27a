/**
 * Live output in the SQLite store (docs/api.md): a chunk kept once per sequence number, the newest
 * 1 MiB per revision (the rest counted as cut), rendered with its markers, the last chunk of the
 * current revision, and the output removed with its deployment. In-process, `:memory:`. Then
 * both stores (PostgreSQL a throwaway server): a revision whose result is in takes no more chunks.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ClusterEngine } from '../../controller/clusters/engine.js';
import { renderOutput } from '../../controller/service/output-view.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { recordSignal } from '../../controller/service/signal.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import type { NewConfig, Store } from '../../controller/store/store.js';
import { rejectedCode } from '../helpers/controller-codes.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const WHO = 'spiffe://herald.local/operator/test';
const CONFIG: NewConfig = { name: 'c', group: 'script', config: 'x', inputs: [], outputs: [], options: {} };
const stores: Store[] = [];
let pg: PgServer | undefined;
beforeAll(async () => {
  pg = await startPg();
});
afterAll(async () => {
  await pg?.close();
});
afterEach(async () => {
  for (const s of stores.splice(0)) await s.close();
});

async function withDeployment(kind: 'sqlite' | 'postgres' = 'sqlite'): Promise<{ s: Store; id: string }> {
  const s =
    kind === 'sqlite'
      ? new SqliteStore(':memory:')
      : await PgStore.open(await pg!.createDatabase(), { controller: 'c1' });
  stores.push(s);
  await s.createNode('a', null, WHO);
  const cfg = await s.createConfig(CONFIG, WHO);
  const { deployment } = await s.createDeployment(
    { node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: {} },
    WHO,
  );
  return { s, id: deployment.id };
}

const chunk = (id: string, seq: number, text: string, stream: 'stdout' | 'stderr' = 'stdout') => ({
  deploymentId: id,
  revision: 1,
  seq,
  stream,
  text,
  droppedBytes: 0,
});

describe('live output in the store', () => {
  it('keeps a sequence number once', async () => {
    const { s, id } = await withDeployment();
    expect(await s.appendOutput(chunk(id, 1, 'a\n'))).toEqual({ duplicate: false });
    expect(await s.appendOutput(chunk(id, 1, 'a\n'))).toEqual({ duplicate: true });
    expect(await s.appendOutput(chunk(id, 2, 'e\n', 'stderr'))).toEqual({ duplicate: false });
    const view = renderOutput(await s.readOutput(id, 1));
    expect(view.stdout).toEqual({ text: 'a\n', first_seq: 1, last_seq: 1 });
    expect(view.stderr).toEqual({ text: 'e\n', first_seq: 2, last_seq: 2 });
  });

  it('keeps the newest 1 MiB per revision and says how much was cut', async () => {
    const { s, id } = await withDeployment();
    const piece = `${'x'.repeat(64 * 1024 - 1)}\n`;
    for (let i = 1; i <= 40; i++) await s.appendOutput(chunk(id, i, piece));
    await s.appendOutput({ ...chunk(id, 41, 'last\n'), droppedBytes: 7 });
    const kept = await s.readOutput(id, 1);
    expect(kept.chunks.length).toBeLessThanOrEqual(18);
    const view = renderOutput(kept);
    const m = /^\[herald: (\d+) bytes cut\]\n/.exec(view.stdout.text);
    expect(m).not.toBeNull();
    const body = view.stdout.text.slice(m![0].length).replace('[herald: 7 bytes of output not streamed]\n', '');
    expect(Buffer.byteLength(body)).toBe(1024 * 1024);
    expect(Number(m![1]) + 1024 * 1024).toBe(40 * 64 * 1024 + 5);
    expect(view.stdout.text.endsWith('[herald: 7 bytes of output not streamed]\nlast\n')).toBe(true);
    expect(view.stdout.last_seq).toBe(41);
  });

  it("gives the newest chunk of the current revision, and removes a deployment's output with it", async () => {
    const { s, id } = await withDeployment();
    await s.appendOutput(chunk(id, 1, 'one\n'));
    await s.appendOutput(chunk(id, 2, 'two\n'));
    expect(await s.lastOutput([id, 'nope'])).toEqual(new Map([[id, 'two\n']]));
    await s.deleteDeployment(id, WHO); // DELETE is not in its actions: removed at once
    expect(await s.getDeployment(id)).toBeUndefined();
    expect((await s.readOutput(id, 1)).chunks).toEqual([]);
    expect(await s.lastOutput([id])).toEqual(new Map());
  });
});

describe.each(['sqlite', 'postgres'] as const)('live output after the result (%s store)', (kind) => {
  it('refuses a chunk for a revision whose result is in (output_closed), a new sequence number or a kept one, and the kept output stays as it was', async () => {
    const { s, id } = await withDeployment(kind);
    expect(await s.appendOutput(chunk(id, 1, 'ran\n'))).toEqual({ duplicate: false });
    await s.transaction((tx) =>
      recordSignal(
        tx,
        new ClusterEngine(),
        'a',
        id,
        { revision: 1, deployStatusCode: 0, deployStdout: 'ran\n', deployStderr: '', outputs: {} },
        WHO,
        Date.now(),
      ),
    );
    expect(await rejectedCode(s.appendOutput(chunk(id, 2, 'appended later\n')))).toBe('output_closed');
    expect(await rejectedCode(s.appendOutput(chunk(id, 1, 'rewritten\n')))).toBe('output_closed');
    expect(renderOutput(await s.readOutput(id, 1)).stdout).toEqual({ text: 'ran\n', first_seq: 1, last_seq: 1 });
  });
});
