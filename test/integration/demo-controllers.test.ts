/**
 * `bin/herald demo --controllers 3` end to end, as a user runs it: a throwaway PostgreSQL, three
 * controllers, six agents, a restart through the kill -9 of the controller owning the most nodes,
 * its timeline and checks; then nothing left behind. And its option errors, one coded line each.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { planFleet } from '../../cli/demo/fleet-plan.js';
import { isAlive } from '../../cli/demo/supervisor.js';
import { pgBinDir } from '../../cli/throwaway-pg.js';
import { HeraldError } from '../../protocol/errors.js';
import { freePort, runCli } from '../cli/harness.js';
import { pgAvailable, startPg, type PgServer } from '../helpers/pg.js';
import { waitFor } from '../helpers/procs.js';

const NODES = 6;

function expectBadOption(r: { code: number; stderr: string }, option: string): void {
  expect(r.code).toBe(1);
  const lines = r.stderr.trim().split('\n');
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(new RegExp(`^herald: bad_option: .*${option.replace(/-/g, '\\-')}`));
}

describe.runIf(pgBinDir() !== undefined)('herald demo --controllers 3', () => {
  it('survives the kill -9 of the controller owning the most nodes mid restart, with the timeline and every check ✓', async () => {
    const started = Date.now();
    const r = await runCli(['demo', '--controllers', '3', '--nodes', String(NODES)], { timeoutMs: 100_000 });
    expect(r.stderr).toBe('');
    expect(r.code, r.stdout).toBe(0);
    expect(Date.now() - started).toBeLessThan(60_000);
    const out = r.stdout;

    // the spread before: three live controllers owning the six nodes between them, each holding its own
    const spread = [...out.matchAll(/^ {2}(c\d)\s+(yes|no)\s+(\d+)\s+(\d+|-)\s/gm)];
    const first = spread.slice(0, 3);
    expect(first.map((m) => [m[1], m[2]])).toEqual([
      ['c1', 'yes'],
      ['c2', 'yes'],
      ['c3', 'yes'],
    ]);
    expect(first.reduce((a, m) => a + Number(m[3]), 0)).toBe(NODES);
    for (const m of first) expect(m[4]).toBe(m[3]);

    // the victim is the one that owned the most
    const kill = /^\s+\+0\.00 s {2}kill -9 (c\d) \(pid (\d+)\), owner of (\d+) of 6 nodes \(([^)]*)\)/m.exec(out);
    expect(kill, out).not.toBeNull();
    const [, victim, pid, count, list] = kill!;
    expect(Number(count)).toBe(Math.max(...first.map((m) => Number(m[3]))));
    const orphans = list!.split(', ');
    expect(orphans).toHaveLength(Number(count));
    expect(isAlive(Number(pid))).toBe(false);

    // the timeline: taken over, each orphan pinged by a survivor within 10 s, then RESTART_COMPLETE
    expect(out).toMatch(
      new RegExp(`^\\s+\\+\\d+\\.\\d\\d s  ${victim} not live, its nodes taken over: c\\d \\+\\d`, 'm'),
    );
    for (const n of orphans) {
      const ping = new RegExp(`^\\s+\\+(\\d+\\.\\d\\d) s  ${n} pinged by its new owner (c\\d)$`, 'm').exec(out);
      expect(ping, `${n} pinged\n${out}`).not.toBeNull();
      expect(ping![2]).not.toBe(victim);
      expect(Number(ping![1])).toBeLessThanOrEqual(10);
    }
    expect(out).toMatch(/^\s+\+\d+\.\d\d s {2}RESTART_COMPLETE$/m);

    // after: the victim is not live and owns nothing; the survivors own every node
    const after = spread.slice(3);
    expect(after.find((m) => m[1] === victim)?.slice(2, 4)).toEqual(['no', '0']);
    expect(after.filter((m) => m[2] === 'yes').reduce((a, m) => a + Number(m[3]), 0)).toBe(NODES);

    expect(out).toMatch(/^✓ the restart completed: RESTART_COMPLETE /m);
    expect(out).toMatch(
      new RegExp(`^✓ takeover: every node of ${victim} .* after the kill \\(limit 10\\.0 s\\)$`, 'm'),
    );
    expect(out).toMatch(/^✓ every step ran exactly once: on each of the 6 nodes/m);
    expect(out).toMatch(/^✓ all checks hold/m);
    expect(out).not.toMatch(/✗/);

    // nothing left behind: the run's directory and PostgreSQL's
    const root = /; in (\S+herald-demo-\S+)$/m.exec(out)?.[1];
    const pgDir = /\(data in (\S+)\)/.exec(out)?.[1];
    expect(root).toBeDefined();
    expect(pgDir).toBeDefined();
    expect(fs.existsSync(root!)).toBe(false);
    expect(fs.existsSync(pgDir!)).toBe(false);
    expect(out).toMatch(/Stopped everything, PostgreSQL included, and removed the directory\./);
  }, 110_000);
});

describe.runIf(pgAvailable())('herald demo --controllers 2 --db postgres://…', () => {
  let pg: PgServer | undefined;
  afterAll(async () => {
    await pg?.close();
  });

  it('runs on the database --db names; --keep leaves the survivors answering and a stop.sh that stops them; the database is then refused', async () => {
    pg = await startPg();
    const db = await pg.createDatabase();
    const r = await runCli(['demo', '--controllers', '2', '--nodes', '2', '--db', db, '--keep'], { timeoutMs: 90_000 });
    expect(r.stderr).toBe('');
    expect(r.code, r.stdout).toBe(0);
    expect(r.stdout).toContain(`PostgreSQL: ${db}`);
    expect(r.stdout).not.toMatch(/throwaway/);
    expect(r.stdout).toMatch(/^✓ takeover: every node of c\d /m);
    expect(r.stdout).toMatch(/^✓ all checks hold/m);

    // the command it prints works: the survivor lists both, the killed one not live
    const cmd = /^ {2}\S*herald (controllers --controller \S+ --controller-id (c\d) --pki \S+)$/m.exec(r.stdout);
    expect(cmd, r.stdout).not.toBeNull();
    const listed = await runCli(cmd![1]!.split(' '));
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toMatch(/^1 of 2 live; 2 nodes owned, 2 held$/m);
    expect(listed.stdout).toMatch(new RegExp(`^${cmd![2]}\\s+yes\\s+2\\s+2\\s`, 'm'));

    const stop = /^Stop everything and remove the directory: sh (\S+)$/m.exec(r.stdout)?.[1];
    expect(stop).toBeDefined();
    const root = path.dirname(stop!);
    const groups = fs
      .readFileSync(stop!, 'utf8')
      .split('\n')
      .flatMap((l) => /^kill -TERM -(\d+)/.exec(l)?.[1] ?? [])
      .map(Number);
    expect(groups.filter(isAlive)).toHaveLength(groups.length - 1); // all but the one killed -9
    expect(spawnSync('sh', [stop!]).status).toBe(0);
    // SIGKILLed by then; gone once the kernel has torn them down (a zombie is not alive)
    await waitFor('the kept processes to be gone', async () => groups.filter(isAlive).length === 0, 5_000, 50);
    expect(fs.existsSync(root)).toBe(false);

    expectBadOption(await runCli(['demo', '--controllers', '2', '--nodes', '2', '--db', db]), '--db');
  }, 100_000);
});

describe('herald demo --controllers: option errors', { timeout: 30_000 }, () => {
  it('--controllers out of range, --db not a postgres URL or unreachable, --db alone, too few --nodes: bad_option naming it', async () => {
    expectBadOption(await runCli(['demo', '--controllers', '1']), '--controllers');
    expectBadOption(await runCli(['demo', '--controllers', '6']), '--controllers');
    expectBadOption(await runCli(['demo', '--controllers', 'three']), '--controllers');
    expectBadOption(await runCli(['demo', '--controllers', '3', '--db', 'mysql://u@127.0.0.1/x']), '--db');
    expectBadOption(await runCli(['demo', '--controllers', '3', '--db', 'demo.db']), '--db');
    expectBadOption(await runCli(['demo', '--db', 'postgres://u@127.0.0.1/x']), '--db');
    expectBadOption(await runCli(['demo', '--controllers', '3', '--nodes', '2']), '--nodes');
    const port = await freePort(); // nothing listens there
    expectBadOption(
      await runCli(['demo', '--controllers', '2', '--db', `postgres://herald@127.0.0.1:${port}/herald_demo`]),
      '--db',
    );
  });

  it('without --db and without PostgreSQL installed: bad_option naming --db and the package', () => {
    let err: unknown;
    try {
      planFleet({ controllers: '3', timeout: '45s' }, () => undefined);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(HeraldError);
    expect((err as HeraldError).code).toBe('bad_option');
    expect((err as HeraldError).message).toMatch(/--db postgres:\/\/.*postgresql/);
  });

  it('--help says what --controllers does and what it needs', async () => {
    const r = await runCli(['demo', '--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/--controllers <n>/);
    expect(r.stdout).toMatch(/--db <url>/);
    expect(r.stdout).toMatch(/throwaway/);
    expect(r.stdout).toMatch(/within|at most 10 s/);
  });
});
