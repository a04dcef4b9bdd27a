/**
 * The outbox keeps at most one deliverable result per deployment: a result of an older revision
 * can only be answered 409 stale_revision once a newer revision of the same deployment ran (the
 * controller made it current first), so it is dropped unsent. Found by the soak benchmark: with
 * changes coming faster than the per-node signal limit, the queue (and the agent's memory) grew
 * with every change.
 */
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { OutboxSender } from '../../agent/outbox.js';
import { OUTBOX_DIR, OutboxStore } from '../../agent/outbox-store.js';
import type { SignalBody } from '../../protocol/heat.js';
import { tempDir } from './hooks-helpers.js';

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-outbox-sup-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

const quiet = { info() {}, warn() {}, error() {}, debug() {} } as never;
const signal = (dep: string, revision: number) => ({
  node: 'n1',
  deployment_id: dep,
  path: `/v1/nodes/n1/deployments/${dep}/signal`,
  body: {
    revision,
    deploy_status_code: 0,
    deploy_stdout: `r${revision}`,
    deploy_stderr: '',
    outputs: {},
  } as SignalBody,
});

describe('outbox: superseded results', () => {
  it('while the controller refuses, results of older revisions of a deployment are dropped unsent; other deployments keep theirs', async () => {
    const dir = join(base, 'a');
    const store = await OutboxStore.open(dir);
    const sent: Array<[string, number]> = [];
    let accept = false;
    let release: () => void = () => {};
    const open = new Promise<void>((r) => {
      release = r;
    });
    const outbox = new OutboxSender({
      store,
      log: quiet,
      backoffBaseMs: 1,
      backoffMaxMs: 2,
      send: async (_p, body) => {
        if (!accept) {
          await open;
          accept = true;
          return { status: 429 }; // the first attempt is refused: the queue builds up behind it
        }
        sent.push([_p.split('/')[5]!, body.revision]);
        return { status: 200 };
      },
    });
    await outbox.put(signal('d1', 1));
    for (let r = 2; r <= 50; r++) await outbox.put(signal('d1', r));
    await outbox.put(signal('d2', 7));
    release();
    await new Promise((r) => setTimeout(r, 0));
    await outbox.idle();
    // d1 revision 1 was refused; its retry finds it superseded: only d1's newest and d2's go out
    expect(sent).toEqual([
      ['d1', 50],
      ['d2', 7],
    ]);
    expect(outbox.superseded).toBe(49);
    expect(await readdir(join(dir, OUTBOX_DIR))).toEqual([]);
    await outbox.stop();
  });

  it('after a restart, a queue left on disk is thinned the same way before anything is sent', async () => {
    const dir = join(base, 'b');
    const first = await OutboxStore.open(dir);
    for (let r = 1; r <= 5; r++) await first.enqueue(signal('d1', r));
    await first.enqueue(signal('d3', 2));
    const store = await OutboxStore.open(dir);
    const sent: Array<[string, number]> = [];
    const outbox = new OutboxSender({
      store,
      log: quiet,
      send: async (p, body) => {
        sent.push([p.split('/')[5]!, body.revision]);
        return { status: 200 };
      },
    });
    outbox.kick();
    await outbox.idle();
    expect(sent).toEqual([
      ['d1', 5],
      ['d3', 2],
    ]);
    expect(outbox.superseded).toBe(4);
    await outbox.stop();
  });
});
