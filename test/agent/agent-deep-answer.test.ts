/**
 * A hook answer nested ~4,500 levels: the one depth guard fails that deployment
 * with `hook_answer_too_deep`, and the apply loop, the signal and the outbox never walk the value,
 * so the agent cannot crash on what a hook prints.
 */
import { chmod, mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApplyLoop, signalBodyOf } from '../../agent/apply.js';
import { HOOK_ERROR_STATUS_CODE, runItem } from '../../agent/hooks/run-item.js';
import { OutboxStore, type OutboxSignal } from '../../agent/outbox-store.js';
import { AgentState } from '../../agent/state.js';
import { MAX_JSON_DEPTH_LEVELS } from '../../protocol/limits.js';
import { quietLog } from '../helpers/agent-pki.js';
import { item, tempDir } from './hooks-helpers.js';

const DEEP_LEVELS = 4_500;
let base: string;
let hooksDir: string;

/** A Heat-protocol hook whose answer nests `levels` arrays in the declared output `result`. */
function deepHook(levels: number): string {
  return `#!${process.execPath}
process.stdout.write('{"deploy_status_code":0,"deploy_stdout":"ok","result":' + '['.repeat(${levels}) + ']'.repeat(${levels}) + '}');
`;
}

beforeAll(async () => {
  base = await tempDir();
  await chmod(base, 0o755);
  hooksDir = join(base, 'hooks');
  await mkdir(hooksDir, { mode: 0o755 });
  for (const [group, levels] of [
    ['deep', DEEP_LEVELS],
    ['edge', MAX_JSON_DEPTH_LEVELS - 1],
    ['over', MAX_JSON_DEPTH_LEVELS],
  ] as const) {
    await writeFile(join(hooksDir, group), deepHook(levels), { mode: 0o755 });
    await chmod(join(hooksDir, group), 0o755);
  }
});
afterAll(async () => rm(base, { recursive: true, force: true }));

const opts = () => ({ runsDir: join(base, 'runs'), hooksDir, uid: 1000, env: { PATH: process.env.PATH } });

describe('hook answers deeper than the depth guard', () => {
  it('a real hook answering 4,500 levels deep fails hook_answer_too_deep, its answer unread', async () => {
    const r = await runItem(item({ group: 'deep', outputNames: ['result'] }), opts());
    expect(r.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
    expect(r.status_reason?.split(':')[0]).toBe('hook_answer_too_deep');
    expect(r.outputs).toEqual({});
    // and the signal built from it is ordinary JSON
    expect(() => JSON.stringify(signalBodyOf({ revision: 1 }, r, false))).not.toThrow();
  });

  it('the limit is 64 levels: an answer of 64 (output 63 deep) is read, one of 65 is refused', async () => {
    const ok = await runItem(item({ group: 'edge', outputNames: ['result'] }), opts());
    expect(ok.deploy_status_code).toBe(0);
    expect(ok.status_reason).toBeUndefined();
    const over = await runItem(item({ group: 'over', outputNames: ['result'] }), opts());
    expect(over.status_reason?.split(':')[0]).toBe('hook_answer_too_deep');
  });

  it('outputs too deep from any runner are dropped before the signal is encoded: the deployment fails, the loop goes on', async () => {
    let deep: unknown = 'x';
    for (let i = 0; i < DEEP_LEVELS; i++) deep = [deep];
    const body = signalBodyOf(
      { revision: 3 },
      { deploy_status_code: 0, deploy_stdout: 'out', deploy_stderr: '', outputs: { result: deep } },
      false,
    );
    expect(body.outputs).toEqual({});
    expect(body.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
    expect(body.status_reason?.split(':')[0]).toBe('hook_answer_too_deep');

    // through the real apply loop, state and outbox: the deep item is signalled failed and the
    // item after it still runs
    const dir = join(base, 'state');
    const state = await AgentState.open(dir);
    const store = await OutboxStore.open(dir);
    const queued: OutboxSignal[] = [];
    const apply = new ApplyLoop({
      node: 'n1',
      state,
      log: quietLog(),
      enqueue: async (s) => {
        queued.push(s);
        return store.enqueue(s);
      },
      loadRunItem: async () => async (it) =>
        it.id === 'deep-1'
          ? { deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: { result: deep } }
          : { deploy_status_code: 0, deploy_stdout: 'after', deploy_stderr: '', outputs: {} },
      runOptions: { runsDir: join(dir, 'runs') },
    });
    apply.submit({ node: 'n1', generation: 1, deployments: [item({ id: 'deep-1' }), item({ id: 'after-1' })] });
    await apply.idle();
    expect(queued.map((q) => [q.body.deploy_status_code, q.body.status_reason?.split(':')[0]])).toEqual([
      [HOOK_ERROR_STATUS_CODE, 'hook_answer_too_deep'],
      [0, undefined],
    ]);
    const files = (await readdir(join(dir, 'outbox'))).filter((f) => f.endsWith('.json'));
    expect(files).toHaveLength(2);
    expect((await store.list()).map((e) => e.body.status_reason?.split(':')[0])).toEqual([
      'hook_answer_too_deep',
      undefined,
    ]);
    expect(state.hasRun('deep-1') && state.hasRun('after-1')).toBe(true);
  });
});
