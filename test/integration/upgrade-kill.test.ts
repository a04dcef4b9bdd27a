/**
 * An upgrade, and its revert, carried on across a controller killed with SIGKILL, on SQLite and
 * on PostgreSQL (docs/api.md "Upgrades"): real agents, scripts that log each run. The controller
 * dies while a node's step runs (held at a gate), the step ends while it is down, and a new
 * controller on the same database finishes the rollout with every step run exactly once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import { makeUpgradeBed, mostAtOnce, spans, type Run, type UpgradeBed } from '../helpers/upgrade-bed.js';

const MASTERS = ['m1'];
const WORKERS = ['w1', 'w2'];

const names = (rs: Run[], node: string) => rs.filter((r) => r.node === node).map((r) => `${r.name}:${r.action}`);

let pg: PgServer | undefined;

afterAll(async () => {
  await killAll();
  await pg?.close();
});

describe.each(['sqlite', 'postgresql'] as const)('a controller killed with -9 mid-rollout (%s)', (store) => {
  let b: UpgradeBed;

  beforeAll(async () => {
    if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
    let db: string | undefined;
    if (store === 'postgresql') {
      pg ??= await startPg();
      db = await pg.createDatabase();
    }
    b = await makeUpgradeBed({ masters: MASTERS, workers: WORKERS, versions: 3, ...(db ? { db } : {}) });
  }, 240_000);

  afterAll(() => b?.c.cleanup());

  const cfg = (name: string) => b.configs[name]!;
  const version = (v: number) => ({
    install_config_id: cfg(`install-v${v}`),
    uninstall_config_id: cfg(`uninstall-v${v}`),
  });
  /** Holds `name` on `node` at its gate, kills the controller once it runs, lets it end, starts a new controller. */
  const killWhileRunning = async (from: number, name: string, node: string) => {
    await waitFor(
      `${name} to start on ${node}`,
      () => b.runs(from).some((r) => r.name === name && r.node === node && r.end === undefined),
      30_000,
      20,
    );
    await stopProc(b.c.ctl.proc, 'SIGKILL');
    b.unflag(`${name}-gate-${node}`);
    await waitFor(`${name} to end on ${node} while the controller is down`, () =>
      b.runs(from).some((r) => r.name === name && r.node === node && r.end !== undefined),
    );
    await b.c.startController();
  };

  it('mid-upgrade: the rollout carries on to UPDATE_COMPLETE, each step once, in order and within the window', async () => {
    const from = b.lineCount();
    b.flag('install-v2-gate-w1');
    const r = await b.send('PATCH', `/v1/clusters/${b.id}`, {
      ...version(2),
      input_values: { version: '2' },
      max_unavailable: 1,
      health_config_id: cfg('check'),
    });
    expect(r.status, r.raw).toBe(202);
    await killWhileRunning(from, 'install-v2', 'w1');
    expect(await b.ended()).toBe('UPDATE_COMPLETE');
    const rs = b.runs(from);
    for (const n of b.nodes)
      expect(names(rs, n), n).toEqual(['uninstall-v1:UPDATE', 'install-v2:UPDATE', 'check:CHECK']);
    expect(mostAtOnce(spans(rs), WORKERS)).toBe(1);
    const cl = await b.cluster();
    expect(cl.nodes.every((n: any) => n.revision === 2)).toBe(true);
    const revs = (await b.send('GET', `/v1/clusters/${b.id}/revisions`)).json.items;
    expect(revs.map((x: any) => [x.revision, x.stable])).toEqual([
      [1, true],
      [2, true],
    ]);
  });

  it('mid-revert: the revert carries on to UPDATE_FAILED naming the nodes, each step once', async () => {
    const from = b.lineCount();
    b.flag('check-fail-w2-v3');
    // w1's reinstall of revision 2's configs (its revert) waits at the gate
    b.flag('install-v2-gate-w1');
    try {
      const r = await b.send('PATCH', `/v1/clusters/${b.id}`, {
        ...version(3),
        on_failure: 'revert',
        max_unavailable: 1,
        health_config_id: cfg('check'),
      });
      expect(r.status, r.raw).toBe(202);
      await killWhileRunning(from, 'install-v2', 'w1');
      expect(await b.ended()).toBe('UPDATE_FAILED');
    } finally {
      b.unflag('check-fail-w2-v3');
    }
    const rs = b.runs(from);
    const there = ['uninstall-v2:UPDATE', 'install-v3:UPDATE', 'check:CHECK'];
    const back = ['uninstall-v3:UPDATE', 'install-v2:UPDATE', 'check:CHECK'];
    for (const n of b.nodes) expect(names(rs, n), n).toEqual([...there, ...back]);
    const cl = await b.cluster();
    expect(cl.status_reason).toMatch(/^update failed on w2: check: /);
    expect(cl.status_reason).toMatch(/reverted to revision 2: m1, w1, w2/);
    expect(cl.counters).toMatchObject({ targeted: 3, failed: 1, reverted: 3, in_flight: 0 });
    expect(cl.nodes.every((n: any) => n.revision === 2 && n.phase === 'complete')).toBe(true);
  });
});
