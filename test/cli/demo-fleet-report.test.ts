/**
 * The several-controllers demo's verdicts and its tables, socket-free: each check turns ✗ on the
 * case it exists for (a takeover past 10 s, an orphan never pinged, a step run twice, a restart
 * that did not end), the timeline reads in seconds from the kill, and the controllers table
 * shows a dead controller's stale held count as `-`.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { DemoNode } from '../../cli/demo/fixtures.js';
import type { Takeover } from '../../cli/demo/fleet.js';
import { fleetChecks, TAKEOVER_LIMIT_MS, timeline } from '../../cli/demo/fleet-report.js';
import { controllersTable, heartbeatAge } from '../../cli/operator/controllers.js';
import type { WatchEvent, WatchResult } from '../../cli/operator/watch.js';
import type { ControllerView } from '../../protocol/rest.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-fleet-report-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const KILLED_AT = 1_000_000;

function node(id: string, runs: string[]): DemoNode {
  const d = path.join(dir, id);
  fs.mkdirSync(d, { recursive: true });
  fs.writeFileSync(path.join(d, 'runs.log'), `${runs.join('\n')}\n`);
  return { id, dir: d } as DemoNode;
}

const ONCE = ['install CREATE', 'uninstall RESTART', 'install RESTART'];
const ok: WatchResult = { ok: true, timedOut: false, cluster: { status: 'RESTART_COMPLETE' } as never, failed: [] };

function takeover(pingsAfterKillMs: Record<string, number>, takenOverAfterMs = 7_000): Takeover {
  return {
    victim: 'c1',
    orphans: ['n2', 'n3'],
    killedAt: KILLED_AT,
    takenOverAt: KILLED_AT + takenOverAfterMs,
    gained: new Map([
      ['c2', 1],
      ['c3', 1],
    ]),
    pinged: new Map(Object.entries(pingsAfterKillMs).map(([n, ms]) => [n, { by: 'c2', at: KILLED_AT + ms }])),
  };
}

const checksOf = (t: Takeover, r = ok, nodes = [node('n1', ONCE), node('n2', ONCE), node('n3', ONCE)]) =>
  fleetChecks(t, r, {
    nodes,
    startedAt: KILLED_AT - 500,
    endedAt: KILLED_AT + 9_000,
    timeoutMs: 75_000,
    watchMs: 30_000,
  });

describe('fleetChecks', () => {
  it('all ✓: completed, every orphan pinged within 10 s, each step once', () => {
    const [restart, take, once] = checksOf(takeover({ n2: 7_100, n3: 7_200 }));
    expect([restart!.ok, take!.ok, once!.ok]).toEqual([true, true, true]);
    expect(restart!.text).toMatch(/RESTART_COMPLETE 9\.50 s after the PATCH/);
    expect(take!.text).toMatch(/7\.20 s after the kill/);
  });

  it('✗ when the last ping came later than 10 s after the kill', () => {
    const [, take] = checksOf(takeover({ n2: 7_100, n3: TAKEOVER_LIMIT_MS + 500 }));
    expect(take!.ok).toBe(false);
  });

  it('✗ naming the orphan no survivor pinged', () => {
    const [, take] = checksOf(takeover({ n2: 7_100 }));
    expect(take!.ok).toBe(false);
    expect(take!.text).toMatch(/: n3$/);
  });

  it('✗ when the victim was never seen taken over', () => {
    const t = takeover({ n2: 7_100, n3: 7_200 });
    t.takenOverAt = undefined;
    expect(checksOf(t)[1]!.ok).toBe(false);
  });

  it('✗ naming a node whose scripts ran a step twice, or none', () => {
    const nodes = [node('n1', [...ONCE, 'install RESTART']), node('n2', ['install CREATE']), node('n3', ONCE)];
    const once = checksOf(takeover({ n2: 7_100, n3: 7_200 }), ok, nodes)[2]!;
    expect(once.ok).toBe(false);
    expect(once.text).toMatch(/n1: uninstall RESTART, install RESTART, install RESTART; n2: none$/);
  });

  it('✗ when the restart timed out or failed', () => {
    const timedOut: WatchResult = { ok: false, timedOut: true, cluster: undefined, failed: [] };
    expect(checksOf(takeover({ n2: 1, n3: 1 }), timedOut)[0]!.ok).toBe(false);
    const failed: WatchResult = {
      ok: false,
      timedOut: false,
      cluster: { status: 'RESTART_FAILED' } as never,
      failed: [{ node: 'n2', reason: 'exit 3' }],
    };
    expect(checksOf(takeover({ n2: 1, n3: 1 }), failed)[0]!.text).toMatch(/RESTART_FAILED: n2: exit 3/);
  });
});

describe('timeline', () => {
  it('in seconds from the kill, in time order: accepted, kill, taken over, pings, steps, end', () => {
    const at = (ms: number) => new Date(KILLED_AT + ms);
    const events: WatchEvent[] = [
      { kind: 'phase', at: at(-100), node: 'n1', phase: 'complete' },
      { kind: 'phase', at: at(7_500), node: 'n3', phase: 'uninstalling' },
      { kind: 'phase', at: at(7_600), node: 'n1', phase: 'complete' }, // not an orphan: left out
      { kind: 'status', at: at(9_000), status: 'RESTART_COMPLETE' },
    ];
    const lines = timeline(takeover({ n2: 7_100, n3: 7_200 }), events, {
      startedAt: KILLED_AT - 500,
      pid: 42,
      doneAtKill: 1,
      total: 6,
      endedAt: KILLED_AT + 9_000,
    });
    expect(lines.map((l) => l.trim())).toEqual([
      '-0.50 s  restart accepted',
      '+0.00 s  kill -9 c1 (pid 42), owner of 2 of 6 nodes (n2, n3); 1 node(s) restarted so far',
      '+7.00 s  c1 not live, its nodes taken over: c2 +1, c3 +1',
      '+7.10 s  n2 pinged by its new owner c2',
      '+7.20 s  n3 pinged by its new owner c2',
      '+7.50 s  n3 uninstalling',
      '+9.00 s  RESTART_COMPLETE',
    ]);
  });
});

describe('controllersTable', () => {
  const row = (name: string, live: boolean, owned: number, held: number, heartbeatAgoMs: number): ControllerView => ({
    name,
    api_url: `https://10.0.0.${name.slice(1)}:8443`,
    live,
    started_at: new Date(0).toISOString(),
    heartbeat_at: new Date(KILLED_AT - heartbeatAgoMs).toISOString(),
    lease_until: new Date(KILLED_AT).toISOString(),
    nodes_owned: owned,
    nodes_held: held,
  });

  it('one row per controller, a dead one held -, and totals of the live', () => {
    const out = controllersTable([row('c1', false, 0, 3, 12_300), row('c2', true, 6, 6, 840)], KILLED_AT);
    expect(out.split('\n')).toEqual([
      'NAME  LIVE  OWNED  HELD  HEARTBEAT   API URL',
      'c1    no    0      -     12.3 s ago  https://10.0.0.1:8443',
      'c2    yes   6      6     840 ms ago  https://10.0.0.2:8443',
      '1 of 2 live; 6 nodes owned, 6 held',
      '',
    ]);
  });

  it('a heartbeat ahead of our clock (the database is another machine) is now', () => {
    expect(heartbeatAge(new Date(KILLED_AT + 300).toISOString(), KILLED_AT)).toBe('now');
    expect(heartbeatAge('not a time', KILLED_AT)).toBe('-');
  });
});
