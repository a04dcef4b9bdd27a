/**
 * `herald controllers` against real controllers, run as a child process: the SQLite controller
 * lists itself alone; two controllers on a throwaway PostgreSQL list each other with the nodes
 * they split, and a controller killed -9 turns LIVE no while the other takes its nodes.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ControllerView, ListEnvelope } from '../../protocol/rest.js';
import { ownerOf } from '../../controller/fleet/rendezvous.js';
import { makeFleet, type TestFleet } from '../helpers/fleet.js';
import { pgAvailable } from '../helpers/pg.js';
import { stopProc, waitFor } from '../helpers/procs.js';
import {
  makePki,
  runCli,
  startAgent,
  startController,
  tempDir,
  waitForNodes,
  type Controller,
  type Proc,
} from './harness.js';

/** The table's rows (header and totals line dropped), each split on runs of spaces. */
function rowsOf(stdout: string): string[][] {
  const lines = stdout.trimEnd().split('\n');
  expect(lines[0]).toMatch(/^NAME\s+LIVE\s+OWNED\s+HELD\s+HEARTBEAT\s+API URL$/);
  expect(lines.at(-1)).toMatch(/^\d+ of \d+ live; \d+ nodes owned, \d+ held$/);
  return lines.slice(1, -1).map((l) => l.split(/\s{2,}/));
}

describe('herald controllers on the embedded SQLite', { timeout: 60_000 }, () => {
  let dir: string;
  let ctl: Controller;
  let agent: Proc;
  let conn: string[];

  beforeAll(async () => {
    dir = tempDir('herald-cli-controllers-');
    const pki = await makePki(dir, ['n1']);
    ctl = await startController(dir, pki);
    agent = await startAgent(dir, pki, 'n1', ctl.url);
    await waitForNodes(ctl.client, ['n1']);
    conn = ['--controller', ctl.url, '--pki', pki];
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await ctl?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('lists this controller alone, live, owning and holding its one node', async () => {
    await waitFor(
      'n1 held',
      async () => (await ctl.client.get<ListEnvelope<ControllerView>>('/v1/controllers')).items[0]?.nodes_held === 1,
      20_000,
      100,
    );
    const r = await runCli(['controllers', ...conn]);
    expect(r).toMatchObject({ code: 0, stderr: '' });
    const rows = rowsOf(r.stdout);
    expect(rows).toHaveLength(1);
    const [name, live, owned, held, heartbeat, url] = rows[0]!;
    expect({ name, live, owned, held, url }).toEqual({
      name: 'controller',
      live: 'yes',
      owned: '1',
      held: '1',
      url: ctl.url,
    });
    expect(heartbeat).toMatch(/^(now|\d.* ago)$/);
    expect(r.stdout).toMatch(/^1 of 1 live; 1 nodes owned, 1 held$/m);

    const json = await runCli(['controllers', ...conn, '--json']);
    expect(json.code).toBe(0);
    const body = JSON.parse(json.stdout) as ListEnvelope<ControllerView>;
    expect(body.items).toHaveLength(1);
    expect(body.items[0]).toMatchObject({ name: 'controller', live: true, nodes_owned: 1, api_url: ctl.url });
  });

  it('--help says what the columns mean', async () => {
    const r = await runCli(['controllers', '--help']);
    expect(r.code).toBe(0);
    for (const col of ['LIVE', 'OWNED', 'HELD', 'HEARTBEAT', 'API URL']) expect(r.stdout).toContain(`  ${col} `);
    expect(r.stdout).toMatch(/SQLite lists itself alone/);
  });

  it('a bad --controller-id is one coded line', async () => {
    const r = await runCli(['controllers', ...conn, '--controller-id', 'Not A Name']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^herald: bad_option: --controller-id /);
  });
});

describe.runIf(pgAvailable())('herald controllers with two controllers on PostgreSQL', { timeout: 120_000 }, () => {
  const NODES = ['n01', 'n02', 'n03', 'n04'];
  let f: TestFleet;

  beforeAll(async () => {
    f = await makeFleet(['c1', 'c2'], NODES);
    await f.startController('c1');
    await f.startController('c2');
    await f.startAgents(NODES);
  }, 120_000);

  afterAll(async () => {
    await f?.cleanup();
  });

  const cli = (name: string, extra: string[] = []) =>
    runCli([
      'controllers',
      '--controller',
      f.controllers.get(name)!.url,
      '--controller-id',
      name,
      '--pki',
      f.pki,
      ...extra,
    ]);

  it('both list both, splitting the nodes; after a kill -9 the dead one is LIVE no and the other owns every node', async () => {
    // settled: every live controller owns exactly its rendezvous share and holds all of it (a
    // total of 4 alone is also met mid-handover, by one controller owning every node)
    const settled = (items: ControllerView[], live: number) => {
      const up = items.filter((c) => c.live);
      const names = up.map((c) => c.name);
      return (
        up.length === live &&
        up.every(
          (c) =>
            c.nodes_held === c.nodes_owned &&
            c.nodes_owned === NODES.filter((n) => ownerOf(n, names) === c.name).length,
        )
      );
    };
    // a controller reports its own held count live and the others' as of their last heartbeat:
    // settled when both say so
    const view = async (name: string) =>
      (JSON.parse((await cli(name, ['--json'])).stdout) as ListEnvelope<ControllerView>).items;
    await waitFor(
      'the nodes spread and held, as both controllers tell it',
      async () => settled(await view('c1'), 2) && settled(await view('c2'), 2),
      30_000,
      200,
    );
    for (const name of ['c1', 'c2']) {
      // the table is a read of its own (a late heartbeat or an agent reconnecting between it and
      // the wait above would move a count for a moment): read until it shows the same
      const r = await waitFor(
        `${name}'s table to show the nodes spread and held`,
        async () => {
          const t = await cli(name);
          return /^2 of 2 live; 4 nodes owned, 4 held$/m.test(t.stdout) ? t : null;
        },
        30_000,
        200,
      );
      expect(r).toMatchObject({ code: 0, stderr: '' });
      const rows = rowsOf(r.stdout);
      expect(rows.map((x) => [x[0], x[1], x[5]])).toEqual([
        ['c1', 'yes', f.controllers.get('c1')!.url],
        ['c2', 'yes', f.controllers.get('c2')!.url],
      ]);
      expect(rows.reduce((a, x) => a + Number(x[2]), 0)).toBe(NODES.length);
      expect(r.stdout).toMatch(/^2 of 2 live; 4 nodes owned, 4 held$/m);
    }

    await stopProc(f.controllers.get('c1')!.proc, 'SIGKILL');
    await waitFor('c2 to own every node, c1 dead', async () => settled(await view('c2'), 1), 30_000, 200);
    const rows = rowsOf((await cli('c2')).stdout);
    expect(rows.map((x) => x.slice(0, 4))).toEqual([
      ['c1', 'no', '0', '-'],
      ['c2', 'yes', '4', '4'],
    ]);
  });
});
