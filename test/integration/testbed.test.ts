/**
 * The testbed itself (cli/testbed/, docs/development.md "The testbed"), with real processes: a
 * PKI, a controller on SQLite started on port 0 (ready once it logs where it listens, and then
 * answering), an agent whose endpoint the controller accepted, a controller that cannot start
 * (a TestbedError `exited` naming its log), `stop()` with SIGTERM and with SIGKILL, nothing left
 * running and the directory gone; and two controllers on a throwaway PostgreSQL the testbed
 * starts and stops.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { Testbed } from '../../cli/testbed/testbed.js';
import { TestbedError } from '../../cli/testbed/wait.js';
import { pgBinDir } from '../../cli/throwaway-pg.js';
import { parseProcStat } from '../../protocol/proc-stat.js';
import { api, isBuilt, procAlive, waitFor } from '../helpers/procs.js';

const built = isBuilt();
let bed: Testbed | undefined;

afterEach(async () => {
  await bed?.stop({ kill9: true });
  bed = undefined;
});

/** Every pid in the process group `pgid` (from /proc). */
function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (parseProcStat(fs.readFileSync(`/proc/${p}/stat`, 'latin1'))?.pgrp === pgid && procAlive(Number(p)))
        out.push(Number(p));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

describe.skipIf(!built)('the testbed', { timeout: 90_000 }, () => {
  it('starts a controller on SQLite on port 0 and an agent the controller lists; kill -9 of it all leaves nothing', async () => {
    bed = new Testbed({ prefix: 'herald-testbed-test-' });
    const pki = await bed.makePki({ agents: ['n1'] });
    const ctl = await bed.startController({ pushWorkers: 1 });
    expect(ctl.port).toBeGreaterThan(0);
    expect(ctl.url).toBe(`https://127.0.0.1:${ctl.port}`);
    expect((await api(ctl.port, pki.operator(), 'GET', '/healthz')).status).toBe(200);

    const a = bed.startAgent({ node: 'n1' });
    const port = await a.started();
    await a.announced();
    const node = await api(ctl.port, pki.operator(), 'GET', '/v1/nodes/n1');
    expect(node.json.endpoint).toContain(`:${port}/`);
    // its push worker is a child in the controller's group
    const pgid = ctl.proc.child.pid!;
    await waitFor('the push worker', () => groupMembers(pgid).length >= 2, 20_000, 50);

    const dir = bed.dir;
    const procs = bed.processes.map((p) => p.proc);
    await bed.stop({ kill9: true });
    for (const p of procs) expect((await p.exited).signal).toBe('SIGKILL');
    await waitFor('the group to be gone', () => groupMembers(pgid).length === 0, 10_000, 20);
    expect(fs.existsSync(dir)).toBe(false);
  });

  it('a controller that cannot start (its port taken) is TestbedError exited, naming its log', async () => {
    bed = new Testbed({ prefix: 'herald-testbed-test-' });
    await bed.makePki();
    const first = await bed.startController();
    const err = await bed
      .startController({ label: 'second', port: first.port, db: `${bed.dir}/second.db` })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TestbedError);
    expect((err as TestbedError).code).toBe('exited');
    expect((err as TestbedError).message).toContain(`${bed.dir}/second.log`);
    // the first is untouched
    expect(first.proc.hasExited()).toBe(false);
  });

  it('stop() sends SIGTERM: the controller and the agent stop cleanly', async () => {
    bed = new Testbed({ prefix: 'herald-testbed-test-' });
    await bed.makePki({ agents: ['n1'] });
    const ctl = await bed.startController();
    const a = bed.startAgent({ node: 'n1' });
    await a.announced();
    const dir = bed.dir;
    await bed.stop();
    expect(await ctl.proc.exited).toEqual({ code: 0, signal: null });
    expect(await a.proc.exited).toEqual({ code: 0, signal: null });
    expect(fs.existsSync(dir)).toBe(false);
  });

  it.skipIf(pgBinDir() === undefined)(
    'starts a throwaway PostgreSQL and two controllers on it, and stops the server with the rest',
    async () => {
      bed = new Testbed({ prefix: 'herald-testbed-test-' });
      const pki = await bed.makePki({ controllers: ['c1', 'c2'] });
      const db = await bed.startPg(pgBinDir()!, 'testbed');
      expect(db).toMatch(/^postgres:\/\/.*\/testbed$/);
      const [c1, c2] = await Promise.all([
        bed.startController({ name: 'c1', db }),
        bed.startController({ name: 'c2', db }),
      ]);
      expect(c1!.proc.logFile).toBe(`${bed.dir}/controller-c1.log`);
      const live = await waitFor(
        'both controllers live',
        async () => {
          const items = (await api(c2!.port, pki.operator(), 'GET', '/v1/controllers')).json.items as Array<{
            name: string;
            live: boolean;
          }>;
          return items.filter((c) => c.live).length === 2 ? items : undefined;
        },
        20_000,
        100,
      );
      expect(live.map((c) => c.name).sort()).toEqual(['c1', 'c2']);
      const pgDir = bed.pg!.dir;
      await bed.stop();
      expect(fs.existsSync(pgDir)).toBe(false);
    },
  );
});
