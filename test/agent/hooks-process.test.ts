/** The hook runner's process handling, with real children checked in /proc. */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { HookLauncher } from '../../agent/hooks/launcher.js';
import { HOOK_TIMEOUT_STATUS_CODE, INTERRUPTED_STATUS_CODE, runItem } from '../../agent/hooks/run-item.js';
import { cutMarker, TailBuffer } from '../../agent/hooks/tail-buffer.js';
import type { RunOptions } from '../../agent/hooks/types.js';
import { item, procState, tempDir, waitDead, waitFile } from './hooks-helpers.js';

let base: string;
const leftovers: number[] = [];

beforeAll(async () => {
  base = await tempDir();
});
afterAll(async () => {
  for (const pid of leftovers) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  await rm(base, { recursive: true, force: true });
});

const launcher = new HookLauncher();
afterAll(() => launcher.close());

// the tests below run both ways a hook can start: each must hold whichever starts it
describe('hook processes', () => processTests(undefined));
describe('hook processes started by the launcher', () => processTests(launcher));
describe('a script busy being written (ETXTBSY)', () => busyTests(undefined));
describe('a script busy being written (ETXTBSY) for the launcher', () => busyTests(launcher));

describe('TailBuffer', () => {
  it('keeps the last bytes with a marker', () => {
    const t = new TailBuffer(10);
    for (let i = 0; i < 7; i++) t.push(Buffer.from('abc'));
    expect(t.totalBytes).toBe(21);
    expect(t.text()).toBe(`${cutMarker(11)}cabcabcabc`);
  });
  it('keeps everything below the limit without a marker', () => {
    const t = new TailBuffer(10);
    t.push(Buffer.from('0123456789'));
    expect(t.text()).toBe('0123456789');
  });
  it('drops a split UTF-8 character whole', () => {
    const t = new TailBuffer(4);
    t.push(Buffer.from('xé€')); // 1 + 2 + 3 bytes: the cut lands inside é
    expect(t.text()).toBe(`${cutMarker(3)}€`);
  });
});

function processTests(l: HookLauncher | undefined): void {
  let spawns = 0;
  let before = 0;
  beforeEach(async () => {
    spawns = 0;
    if (l !== undefined) expect(await l.start()).toBe(true);
    before = l?.started ?? 0;
  });
  afterEach(() => {
    if (l !== undefined) expect(l.started - before).toBe(spawns);
  });

  function opts(over: Partial<RunOptions> = {}): RunOptions {
    const onSpawn = over.onSpawn;
    return {
      runsDir: join(base, 'runs'),
      env: { PATH: process.env.PATH },
      uid: 1000,
      ...over,
      ...(l === undefined ? {} : { launcher: l }),
      onSpawn: (pid) => {
        spawns++;
        onSpawn?.(pid);
      },
    };
  }

  it('keeps the last 1 MiB of 5 MiB of stdout, with the marker', async () => {
    const r = await runItem(
      item({ config: '#!/bin/sh\nhead -c 5242880 /dev/zero | tr "\\0" a\nprintf END\necho err >&2\n' }),
      opts(),
    );
    expect(r.deploy_status_code).toBe(0);
    const marker = cutMarker(5242883 - 1048576);
    expect(r.deploy_stdout.startsWith(marker)).toBe(true);
    expect(r.deploy_stdout.length).toBe(marker.length + 1048576);
    expect(r.deploy_stdout.endsWith('aaaEND')).toBe(true);
    expect(r.deploy_stderr).toBe('err\n');
  });

  it('kills the hook and its children at the timeout (TERM)', async () => {
    const pidfile = join(base, 'timeout.pid');
    let hookPid = 0;
    const r = await runItem(
      item({
        config: '#!/bin/sh\nsleep 60 &\necho $! > "$pidfile"\necho before\nsleep 60\n',
        inputValues: { pidfile },
        options: { timeout: 0.5 },
      }),
      opts({
        onSpawn: (pid) => {
          hookPid = pid;
        },
        killGraceMs: 600_000, // TERM must suffice: a KILL after the grace would outlast the test
      }),
    );
    const child = Number(await waitFile(pidfile));
    leftovers.push(child);
    expect(r.deploy_status_code).toBe(HOOK_TIMEOUT_STATUS_CODE);
    expect(r.status_reason).toMatch(/^hook_timeout: /);
    expect(r.deploy_stdout).toBe('before\n');
    expect(hookPid).toBeGreaterThan(0);
    expect(await waitDead(hookPid)).toBe(true);
    expect(await waitDead(child)).toBe(true);
  });

  it('KILLs children that ignore TERM after the grace', async () => {
    const pidfile = join(base, 'stubborn.pid');
    const r = await runItem(
      item({
        config:
          '#!/bin/sh\ntrap "" TERM\nsh -c \'trap "" TERM; echo $$ > "$pidfile"; while :; do sleep 1; done\' &\nwait\n',
        inputValues: { pidfile },
      }),
      opts({ timeoutMs: 500, killGraceMs: 300 }),
    );
    const child = Number(await waitFile(pidfile));
    leftovers.push(child);
    expect(r.status_reason).toMatch(/^hook_timeout: /);
    expect(await waitDead(child)).toBe(true);
  });

  it('ends when the hook exits even if a daemon it started holds the pipes', async () => {
    const pidfile = join(base, 'daemon.pid');
    const r = await runItem(
      item({
        config: '#!/bin/sh\nsleep 30 &\necho $! > "$pidfile"\necho done\n',
        inputValues: { pidfile },
      }),
      opts({ timeoutMs: 20_000 }),
    );
    const daemon = Number(await waitFile(pidfile));
    leftovers.push(daemon);
    expect(r).toMatchObject({ deploy_status_code: 0, deploy_stdout: 'done\n' });
    expect(r.status_reason).toBeUndefined();
    // the daemon is left alone: it is the hook's business
    expect(procState(daemon)).toMatch(/^[RSD]$/);
    process.kill(daemon, 'SIGKILL');
  });

  it('an abort kills the group and reports interrupted', async () => {
    const ac = new AbortController();
    let hookPid = 0;
    const r = await runItem(
      item({ config: '#!/bin/sh\nsleep 60\n' }),
      opts({
        signal: ac.signal,
        onSpawn: (pid) => {
          hookPid = pid;
          ac.abort();
        },
      }),
    );
    expect(r.deploy_status_code).toBe(INTERRUPTED_STATUS_CODE);
    expect(r.status_reason).toMatch(/^interrupted: /);
    expect(await waitDead(hookPid)).toBe(true);
  });

  it('does not start when already aborted', async () => {
    let spawned = false;
    const r = await runItem(
      item({}),
      opts({
        signal: AbortSignal.abort(),
        onSpawn: () => {
          spawned = true;
        },
      }),
    );
    expect(spawned).toBe(false);
    expect(r.status_reason).toMatch(/^interrupted: /);
  });

  it('reports a hook killed by a signal as 128 + signo', async () => {
    const r = await runItem(item({ config: '#!/bin/sh\nkill -KILL $$\n' }), opts());
    expect(r.deploy_status_code).toBe(137);
  });
}

function busyTests(l: HookLauncher | undefined): void {
  it('is started once the writer lets go, not failed', async () => {
    if (l !== undefined) expect(await l.start()).toBe(true);
    const before = l?.started ?? 0;
    const { mkdtemp, open, rm: rmDir } = await import('node:fs/promises');
    const { tmpdir } = await import('node:os');
    const { runProcess } = await import('../../agent/hooks/run-process.js');
    const dir = await mkdtemp(join(tmpdir(), 'herald-txtbsy-'));
    try {
      const script = join(dir, 'hook');
      // a writable descriptor held open: exec of the file fails with ETXTBSY while it exists
      const fh = await open(script, 'w', 0o700);
      await fh.write('#!/bin/sh\necho started\n');
      const released = new Promise<void>((resolve) => setTimeout(() => void fh.close().then(resolve), 60));
      const r = await runProcess({
        file: script,
        cwd: dir,
        env: { PATH: '/usr/bin:/bin' },
        timeoutMs: 10_000,
        killGraceMs: 1_000,
        drainMs: 100,
        maxOutputBytes: 1024,
        ...(l === undefined ? {} : { launcher: l }),
      });
      await released;
      if (l !== undefined) expect(l.started - before).toBe(1);
      expect(r.spawnError).toBeUndefined();
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toBe('started\n');
    } finally {
      await rmDir(dir, { recursive: true, force: true });
    }
  });
}
