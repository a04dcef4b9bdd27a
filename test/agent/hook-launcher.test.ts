/**
 * The hook launcher (agent/hooks/launcher.ts): a hook it starts sees what a hook the agent spawns
 * sees, each run has pipes of its own, and whatever happens to the launcher a run still ends
 * and later runs still start. test/agent/hooks-process.test.ts runs the runner's process tests
 * both ways.
 */
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { HookLauncher } from '../../agent/hooks/launcher.js';
import { runProcess, type ProcessSpec } from '../../agent/hooks/run-process.js';
import { procState, waitDead } from './hooks-helpers.js';

const dir = mkdtempSync(join(tmpdir(), 'herald-launcher-'));
const launchers: HookLauncher[] = [];
afterAll(() => {
  for (const l of launchers) l.close();
  rmSync(dir, { recursive: true, force: true });
});

function newLauncher(opts: ConstructorParameters<typeof HookLauncher>[0] = {}): HookLauncher {
  const l = new HookLauncher(opts);
  launchers.push(l);
  return l;
}

let n = 0;
function script(text: string, mode = 0o700): string {
  const file = join(dir, `hook-${++n}`);
  writeFileSync(file, text, { mode });
  chmodSync(file, mode);
  return file;
}

function spec(file: string, over: Partial<ProcessSpec> = {}): ProcessSpec {
  return {
    file,
    cwd: dir,
    env: { PATH: '/usr/bin:/bin' },
    timeoutMs: 20_000,
    killGraceMs: 1_000,
    drainMs: 200,
    maxOutputBytes: 1024 * 1024,
    ...over,
  };
}

/** Polls /proc until `pid` is gone, within a bound; false when it still runs. */
async function gone(pid: number | undefined): Promise<boolean> {
  return pid === undefined || (await waitDead(pid, 5_000));
}

describe('a hook the launcher starts', () => {
  it('sees what a spawned one sees: environment, cwd, stdin, its own session and group, fds, signals', async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    // perl itself runs with nothing of this process's environment (PERL5OPT, PERL5LIB)
    expect(readFileSync(`/proc/${l.pid}/environ`, 'latin1')).toBe('');
    const file = script(
      [
        '#!/bin/sh',
        'env | sort',
        'pwd',
        'cat',
        'echo',
        // pid, pgrp and session of this shell (its comm, "sh", has no space)
        'set -- $(cut -d" " -f1,5,6 /proc/$$/stat)',
        '[ "$1" = "$2" ] && [ "$1" = "$3" ] && echo leader-of-own-session-and-group',
        // the shell's masks, read by the shell itself: dash blocks every signal around each fork
        // it makes, so a child reading /proc/<shell>/status sees that for a moment (about half the
        // time here), not the mask the hook was started with
        'while read -r k v; do case $k in SigIgn:|SigBlk:) echo "$k $v";; esac; done < /proc/$$/status',
        // the shell's own glob: no pipeline, whose pipes the shell holds for a moment
        'cd /proc/$$/fd && echo * && cd - >/dev/null',
        'echo to-stderr >&2',
        'exit 7',
      ].join('\n'),
    );
    const s = spec(file, {
      env: { PATH: '/usr/bin:/bin', A: 'x=y', EMPTY: '', 'not-an-identifier': 'v', MULTI: 'a\nb' },
      stdin: 'the input\n',
    });
    const spawned = await runProcess(s);
    const before = l.started;
    const launched = await runProcess({ ...s, launcher: l });
    expect(l.started - before).toBe(1);
    expect(spawned.exitCode).toBe(7);
    // the last line lists the open descriptors: the launcher's hook holds no more than the
    // spawned one (which may also hold one the test process had open without close-on-exec)
    const last = (out: string) => out.slice(out.lastIndexOf('\n', out.length - 2) + 1);
    const fds = (out: string) => new Set(last(out).trim().split(' '));
    const cut = (r: typeof spawned) => ({ ...r, stdout: r.stdout.slice(0, -last(r.stdout).length) });
    expect(cut(launched)).toEqual(cut(spawned));
    expect([...fds(launched.stdout)].filter((fd) => !fds(spawned.stdout).has(fd))).toEqual([]);
    expect(fds(launched.stdout)).toContain('0');
    expect(launched.stdout).toContain('A=x=y\nEMPTY=\nMULTI=a\nPATH=/usr/bin:/bin\n');
    expect(launched.stdout).toContain(`${dir}\nthe input\n\nleader-of-own-session-and-group\n`);
    expect(launched.stdout).toContain('SigBlk: 0000000000000000\nSigIgn: 0000000000000000\n');
    expect(launched.stderr).toBe('to-stderr\n');

    // no shell between: the environment exactly as given, names a shell would drop included
    const env = { ...s, file: '/usr/bin/env', args: ['-0'], stdin: undefined };
    const exact = await runProcess({ ...env, launcher: l });
    expect(l.started - before).toBe(2);
    expect(exact.stdout.split('\0').sort()).toEqual(
      ['', 'A=x=y', 'EMPTY=', 'MULTI=a\nb', 'PATH=/usr/bin:/bin', 'not-an-identifier=v'].sort(),
    );
    expect(exact).toEqual(await runProcess(env));
  });

  it('starts hooks with no signal blocked, whatever mask its perl was started with', async () => {
    // a "perl" that blocks every signal it can (rt_sigprocmask SIG_BLOCK), then becomes the real one
    const number = { x64: 14, arm64: 135 }[process.arch as 'x64' | 'arm64'];
    if (number === undefined) throw new Error(`no rt_sigprocmask number for ${process.arch}`);
    const perl = ['/usr/bin/perl', '/bin/perl'].find((x) => existsSync(x));
    if (perl === undefined) throw new Error('no system perl');
    const blocking = script(
      `#!${perl}\nmy $all = "\\xff" x 8;\nsyscall(${number}, 0, $all, 0, 8) != -1 or die "block: $!";\nexec { '${perl}' } '${perl}', @ARGV;\n`,
    );
    const l = newLauncher({ perl: blocking });
    expect(await l.start()).toBe(true);
    const mask = (status: string) => /^SigBlk:\s+(\w+)$/m.exec(status)?.[1];
    expect(mask(readFileSync(`/proc/${l.pid}/status`, 'latin1'))).not.toBe('0000000000000000');
    const r = await runProcess({
      ...spec(script('#!/bin/sh\nwhile read -r k v; do [ "$k" = SigBlk: ] && echo "$v"; done < /proc/$$/status\n')),
      launcher: l,
    });
    expect(l.started).toBe(1);
    expect(r.stdout).toBe('0000000000000000\n');
  });

  it('fails to start with the codes spawn gives: ENOENT, EACCES, a bad interpreter, a bad cwd', async () => {
    const l = newLauncher();
    const cases: ProcessSpec[] = [
      spec(join(dir, 'missing')),
      spec(script('#!/bin/sh\necho never\n', 0o600)),
      spec(script('#!/no/such/interpreter\necho never\n')),
      spec(script('#!/bin/sh\necho never\n'), { cwd: join(dir, 'no-such-dir') }),
    ];
    const codes = (r: { spawnError?: Error }) => (r.spawnError as NodeJS.ErrnoException | undefined)?.code;
    for (const c of cases) {
      expect(await l.start()).toBe(true);
      const before = l.started;
      const asked = l.launched;
      const spawned = await runProcess(c);
      const launched = await runProcess({ ...c, launcher: l });
      expect(l.launched - asked).toBe(1); // the launcher's answer, not a fallback to spawn
      expect(codes(launched)).toBeDefined();
      expect(codes(launched)).toBe(codes(spawned));
      expect(launched.exitCode).toBeNull();
      expect(launched.stdout + launched.stderr).toBe('');
      expect(l.started).toBe(before); // not started: nothing counted
    }
    // a script without an interpreter line runs under /bin/sh both ways (execvp's rule)
    const bare = spec(script('echo no interpreter line\n'));
    const launched = await runProcess({ ...bare, launcher: l });
    expect(launched).toEqual(await runProcess(bare));
    expect(launched.stdout).toBe('no interpreter line\n');
  });

  it('a value no process can carry (NUL) is spawned directly and refused as before', async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const s = spec(script('#!/bin/sh\ntrue\n'), { env: { PATH: '/usr/bin:/bin', BAD: 'a\0b' } });
    const spawned = await runProcess(s);
    const launched = await runProcess({ ...s, launcher: l });
    expect((launched.spawnError as NodeJS.ErrnoException).code).toBe('ERR_INVALID_ARG_VALUE');
    expect(launched).toEqual(spawned);
    expect(l.ready).toBe(true); // still there for the next run
  });
});

describe('each run has pipes of its own', () => {
  it("a daemon one run leaves behind never writes into a later run's output", async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const go = join(dir, 'daemon-go');
    const wrote = join(dir, 'daemon-wrote');
    // the daemon waits until the second run is running, writes on the first run's pipes (which
    // it holds; their reader is gone, so the writes fail, SIGPIPE ignored), and says so; the
    // second run waits for that before it ends
    const first = await runProcess({
      ...spec(
        script(
          `#!/bin/sh\n(trap '' PIPE; while [ ! -e ${go} ]; do sleep 0.02; done; echo late-from-the-first-run; echo late-err >&2; touch ${wrote}) &\necho first\n`,
        ),
      ),
      launcher: l,
    });
    expect(first.stdout).toBe('first\n');
    const second = await runProcess({
      ...spec(script(`#!/bin/sh\necho second\ntouch ${go}\nwhile [ ! -e ${wrote} ]; do sleep 0.02; done\necho end\n`)),
      launcher: l,
    });
    expect(l.started).toBe(2);
    expect(existsSync(wrote)).toBe(true); // the daemon did write meanwhile
    expect(second.stdout).toBe('second\nend\n');
    expect(second.stderr).toBe('');
  });
});

describe('whatever happens to the launcher', () => {
  it("ignores TERM and INT sent to it (the agent's process group): the run keeps its status", async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const r = await runProcess({
      ...spec(script('#!/bin/sh\nsleep 0.3\nexit 5\n')),
      launcher: l,
      onSpawn: () => {
        process.kill(l.pid as number, 'SIGTERM');
        process.kill(l.pid as number, 'SIGINT');
      },
    });
    expect(r.exitCode).toBe(5);
    expect(l.started).toBe(1);
    expect(l.ready).toBe(true);
  });

  it('killed while a hook runs: the run ends when the hook does, and later hooks are spawned directly', async () => {
    const warnings: string[] = [];
    const l = newLauncher({ log: { warn: (_o, m) => warnings.push(m) } });
    expect(await l.start()).toBe(true);
    const launcherPid = l.pid;
    let hook = 0;
    const r = await runProcess({
      ...spec(script('#!/bin/sh\nsleep 0.3\necho out\nexit 5\n')),
      launcher: l,
      onSpawn: (pid) => {
        hook = pid;
        process.kill(launcherPid as number, 'SIGKILL');
      },
    });
    expect(hook).toBeGreaterThan(0);
    expect(procState(hook) ?? 'Z').toBe('Z'); // ended (a zombie until whoever adopted it reaps it)
    expect(r.exitCode).toBeNull(); // its status went with the launcher
    expect(r.stdout).toBe('out\n');
    expect(warnings).toContain('hook launcher died while a hook ran');
    expect(await gone(launcherPid)).toBe(true);
    const next = await runProcess({ ...spec(script('#!/bin/sh\nexit 3\n')), launcher: l });
    expect(next.exitCode).toBe(3);
    expect(l.started).toBe(1);
    expect(l.pid).toBeUndefined();
    expect(await l.start()).toBe(false);
  });

  it('ends after its idle time, and the run after that starts a new one first', async () => {
    const l = newLauncher({ idleCloseMs: 100 });
    expect(await l.start()).toBe(true);
    const first = l.pid;
    expect(await gone(first)).toBe(true);
    expect(l.pid).toBeUndefined();
    // the next run waits for a new launcher: every run of an agent starts the same way
    expect((await runProcess({ ...spec(script('#!/bin/sh\nexit 4\n')), launcher: l })).exitCode).toBe(4);
    expect(l.started).toBe(1);
    expect(l.pid).not.toBe(first);
  });

  it('a timeout or abort before the hook is known to have started still kills its group', async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const pidfile = join(dir, 'early-abort.pid');
    let hook = 0;
    const r = await runProcess({
      ...spec(script(`#!/bin/sh\necho $$ > ${pidfile}\nexec sleep 600\n`)),
      launcher: l,
      signal: AbortSignal.abort(), // the abort comes before the launcher's answer
      killGraceMs: 600_000, // TERM must do it: a KILL after the grace would outlast the test
      onSpawn: (pid) => {
        hook = pid;
      },
    });
    expect(l.started).toBe(1);
    expect(r.aborted).toBe(true);
    expect(r.exitSignal).toBe('SIGTERM');
    expect(hook).toBeGreaterThan(0);
    expect(await gone(hook)).toBe(true);
  });

  it('its hooks get pipes, as from a shell: /dev/stdout and /dev/stderr can be opened', async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const r = await runProcess({
      ...spec(
        script(
          '#!/bin/sh\nreadlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2 | cut -d: -f1 | tr "\\n" " "\necho to-dev-stderr > /dev/stderr\n',
        ),
      ),
      stdin: 'x',
      launcher: l,
    });
    expect(l.started).toBe(1);
    expect(r.stdout).toBe('pipe pipe pipe ');
    expect(r.stderr).toBe('to-dev-stderr\n');
  });

  it('runs the system perl, never one found on PATH', async () => {
    const fake = join(dir, 'fake-bin');
    mkdirSync(fake, { recursive: true });
    writeFileSync(join(fake, 'perl'), '#!/bin/sh\nexit 99\n', { mode: 0o755 });
    const path = process.env.PATH;
    process.env.PATH = `${fake}:${path}`;
    try {
      const l = newLauncher();
      expect(await l.start()).toBe(true);
      const exe = realpathSync(readlinkSync(`/proc/${l.pid}/exe`));
      expect([realpathSync('/usr/bin/perl'), realpathSync('/bin/perl')]).toContain(exe);
    } finally {
      process.env.PATH = path;
    }
  });

  it('close() ends it, after the run in progress; without perl there is none, and hooks are spawned directly', async () => {
    const l = newLauncher();
    expect(await l.start()).toBe(true);
    const pid = l.pid;
    const r = await runProcess({
      ...spec(script('#!/bin/sh\nsleep 0.2\nexit 6\n')),
      launcher: l,
      onSpawn: () => l.close(),
    });
    expect(r.exitCode).toBe(6); // the run kept its status
    expect(l.started).toBe(1);
    expect(await gone(pid)).toBe(true);
    expect(await l.start()).toBe(false);
    expect((await runProcess({ ...spec(script('#!/bin/sh\nexit 2\n')), launcher: l })).exitCode).toBe(2);
    expect(l.started).toBe(1);

    // a perl that cannot be started (not executable): found out at the first start, not a hang
    const broken = newLauncher({ perl: script('not a program\n', 0o600) });
    expect(await broken.start()).toBe(false);
    const spawned = await runProcess({ ...spec(script('#!/bin/sh\necho still-runs\n')), launcher: broken });
    expect(spawned.stdout).toBe('still-runs\n');
    expect(broken.started).toBe(0);
    // the same, found by a run's prepare() (as the agent meets it), with no start() before
    const unstarted = newLauncher({ perl: script('not a program either\n', 0o600) });
    const first = await runProcess({ ...spec(script('#!/bin/sh\necho first-run\n')), launcher: unstarted });
    expect(first.stdout).toBe('first-run\n');
    expect(unstarted.started).toBe(0);

    const none = newLauncher({ perl: join(dir, 'no-perl-here') });
    expect(await none.start()).toBe(false);
    const direct = await runProcess({ ...spec(script('#!/bin/sh\necho direct\n')), launcher: none });
    expect(direct.stdout).toBe('direct\n');
    expect(none.started).toBe(0);
  });
});
