/**
 * What Herald's children inherit (protocol/child-env.ts), read from /proc/<pid>/environ of the
 * real processes: a controller's push worker (the controller started with the database URL and
 * its password in HERALD_DB), a throwaway PostgreSQL server, and the demo's children.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pgBinDir, startThrowawayPg } from '../../cli/throwaway-pg.js';
import { DemoSupervisor } from '../../cli/demo/supervisor.js';
import { parseProcStat } from '../../protocol/proc-stat.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import { startController } from '../../cli/testbed/controller.js';
import { makePki } from '../../cli/testbed/pki.js';
import { asProc, isBuilt, REPO, stopProc, waitFor, type Proc } from '../helpers/procs.js';

const SECRET = 'pw-not-for-children';
const hasProc = fs.existsSync('/proc/self/environ');

/** `NAME=value` lines of a live process's environment. */
const environOf = (pid: number): string[] => fs.readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');

/** The pids whose parent is `pid`. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      if (parseProcStat(fs.readFileSync(`/proc/${p}/stat`, 'latin1'))?.ppid === pid) out.push(Number(p));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Passes when no variable of `env` holds the secret, and none is a Herald setting or NODE_OPTIONS. */
function expectClean(env: string[]): void {
  expect(env.filter((l) => l.includes(SECRET))).toEqual([]);
  expect(env.filter((l) => /^(HERALD_|NODE_OPTIONS=|LD_)/.test(l))).toEqual([]);
  expect(env.some((l) => l.startsWith('PATH='))).toBe(true);
}

describe.skipIf(!hasProc)("Herald's children inherit only the allow-listed environment", { timeout: 120_000 }, () => {
  let pg: PgServer;
  let work: string;
  let controller: Proc | undefined;

  beforeAll(async () => {
    if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-child-env-'));
    pg = await startPg();
  }, 60_000);

  afterAll(async () => {
    if (controller) await stopProc(controller, 'SIGKILL').catch(() => {});
    await pg?.close();
    fs.rmSync(work, { recursive: true, force: true });
  });

  it('a push worker of a controller started with the database password in HERALD_DB gets neither the URL nor any HERALD_* setting', async () => {
    const pki = (await makePki(path.join(work, 'pki'))).dir;
    const db = new URL(await pg.createDatabase());
    db.password = SECRET; // the throwaway server trusts every local connection: any password will do
    // the database only in the environment: no --db
    await startController({
      name: 'controller',
      pki,
      pushWorkers: 1,
      logFile: path.join(work, 'controller.log'),
      cwd: REPO,
      env: { ...process.env, HERALD_DB: db.toString(), HERALD_UNRELATED_TOKEN: SECRET },
      onStart: (p) => {
        controller = asProc(p);
      },
    });
    const c = controller!;
    // the controller itself was given the secret (the test would prove nothing otherwise)
    expect(environOf(c.child.pid!).some((l) => l.includes(SECRET))).toBe(true);
    const workers = await waitFor('the push worker', () => childrenOf(c.child.pid!).filter(Boolean), 10_000, 50);
    expect(workers.length).toBeGreaterThan(0);
    for (const w of workers) {
      const env = environOf(w);
      expectClean(env);
      expect(env.some((l) => l.startsWith('GLIBC_TUNABLES='))).toBe(true); // what it is given by name
    }
  });

  it.skipIf(pgBinDir() === undefined)(
    'a throwaway PostgreSQL server started from a process holding a secret does not get it',
    async () => {
      process.env.HERALD_DB = `postgres://herald:${SECRET}@127.0.0.1:1/herald`;
      let server: Awaited<ReturnType<typeof startThrowawayPg>> | undefined;
      try {
        server = await startThrowawayPg(pgBinDir()!);
        const postmaster = Number(fs.readFileSync(path.join(server.data, 'postmaster.pid'), 'utf8').split('\n')[0]);
        expectClean(environOf(postmaster));
      } finally {
        delete process.env.HERALD_DB;
        await server?.stop();
      }
    },
  );

  it("the demo's children get the marker and the CA-host switch, not the caller's HERALD_* settings", () => {
    process.env.HERALD_DB = `postgres://herald:${SECRET}@127.0.0.1:1/herald`;
    try {
      const sup = new DemoSupervisor(work);
      const env = Object.entries(sup.env).map(([k, v]) => `${k}=${v}`);
      expect(env.filter((l) => l.includes(SECRET))).toEqual([]);
      expect(env.filter((l) => l.startsWith('HERALD_')).map((l) => l.split('=')[0])).toEqual([
        'HERALD_NO_CA_WARNING',
        'HERALD_DEMO_ROOT',
      ]);
    } finally {
      delete process.env.HERALD_DB;
    }
  });
});
