/**
 * The throwaway PostgreSQL (cli/throwaway-pg.ts) on a port another process holds: it says so
 * (`portTaken`, which makes a server started on a port picked free pick again), whether the
 * holder is a plain listener (the postmaster cannot bind and exits) or another PostgreSQL that
 * would answer in its place (its data directory is not ours). Its directory is removed.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { npmPgBinDir, pgBinDir, startThrowawayPg, ThrowawayPgError } from '../../cli/throwaway-pg.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const bin = pgBinDir();
let other: PgServer | undefined;
beforeAll(async () => {
  if (bin && !process.env.HERALD_TEST_PG) other = await startPg();
}, 60_000);
afterAll(async () => {
  await other?.close();
});

async function refusal(port: number): Promise<ThrowawayPgError> {
  // a directory of this attempt's own: other test files start throwaway servers at the same time
  const tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pg-test-'));
  fs.chmodSync(tmpDir, 0o755); // the server's user (not root) must reach its directory inside
  try {
    const err = await startThrowawayPg(bin!, process.env, { port, tmpDir }).then(
      async (pg) => {
        await pg.stop();
        throw new Error(`started on port ${port}, which another process holds`);
      },
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ThrowawayPgError);
    expect(fs.readdirSync(tmpDir)).toEqual([]);
    return err as ThrowawayPgError;
  } finally {
    fs.rmSync(tmpDir, { recursive: true, force: true });
  }
}

describe.skipIf(!bin || process.env.HERALD_TEST_PG)('a throwaway PostgreSQL on a port another process holds', () => {
  it('a plain listener: refused as portTaken, nothing left behind', async () => {
    const holder = net.createServer();
    await new Promise<void>((r) => holder.listen(0, '127.0.0.1', r));
    try {
      const err = await refusal((holder.address() as net.AddressInfo).port);
      expect(err.portTaken).toBe(true);
      expect(err.message).toMatch(/port \d+ .*(taken by another process|another server's)/);
    } finally {
      holder.close();
    }
  }, 60_000);

  it("another PostgreSQL: refused as portTaken, not used in this one's place", async () => {
    const err = await refusal(other!.port);
    expect(err.portTaken).toBe(true);
  }, 60_000);
});

// A machine without Debian's postgresql has neither its binaries nor its `postgres` user: the
// tests and `herald demo --controllers` then use the server npm installed, run as `nobody`.
const npmBin = npmPgBinDir();
describe.skipIf(!npmBin || process.getuid?.() !== 0)('a throwaway PostgreSQL from the npm package', () => {
  it('starts from the npm binaries as nobody, answers queries, and leaves nothing behind', async () => {
    const pg = await startThrowawayPg(npmBin!, process.env, { runAs: 'nobody' });
    const { default: postgres } = await import('postgres');
    const sql = postgres(await pg.createDatabase('herald_npm_pg'), { max: 1, onnotice: () => {} });
    try {
      const [row] = await sql<{ v: string; u: string }[]>`SELECT version() AS v, current_user AS u`;
      expect(row!.v).toMatch(/^PostgreSQL \d+/);
      const owner = fs.statSync(pg.data).uid;
      expect(owner).toBe(Number(execFileSync('id', ['-u', 'nobody'], { encoding: 'utf8' }).trim()));
    } finally {
      await sql.end({ timeout: 1 });
      await pg.stop();
    }
    expect(fs.existsSync(pg.dir)).toBe(false);
  }, 60_000);

  it('starts when its binaries sit below a directory only root may enter (a mktemp -d checkout)', async () => {
    const closed = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-pg-closed-'));
    try {
      fs.cpSync(path.dirname(npmBin!), path.join(closed, 'native'), { recursive: true, verbatimSymlinks: true });
      expect(fs.statSync(closed).mode & 0o777).toBe(0o700);
      const pg = await startThrowawayPg(path.join(closed, 'native', 'bin'), process.env, { runAs: 'nobody' });
      await pg.stop();
      expect(fs.existsSync(pg.dir)).toBe(false);
    } finally {
      fs.rmSync(closed, { recursive: true, force: true });
    }
  }, 60_000);
});
