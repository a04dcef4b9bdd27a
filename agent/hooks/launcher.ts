/**
 * Starts hook processes from a small process that stays beside the agent (the launcher), so the
 * agent does not fork itself for each run.
 *
 * Why: Node 20's libuv starts a child with fork(). A fork copies the page tables of the ~50 MB
 * agent, and the agent then takes a copy-on-write fault at its first write to each page; on a VM
 * where a page fault costs 10-20 µs that is ~4 ms of the agent's CPU a hook, on the critical path
 * of every change (docs/agent-footprint.md, "What a hook's start costs"). The launcher is a perl
 * of a few MB (perl-base is part of every Debian and Ubuntu); its fork is cheap.
 *
 * What a hook sees is what `child_process.spawn` gives it (run-process.ts), except that its stdin,
 * stdout and stderr are pipes, as a shell gives, where libuv gives Unix sockets (on which
 * `/dev/stdout` and `/dev/stderr` cannot be opened): its own session and process group, the
 * environment it was given and nothing else, the run's directory as its cwd, stdin from the agent
 * or /dev/null, stdout and stderr of its own run that only the agent reads, and no signal blocked.
 * Failures to start carry the errno code spawn would (ENOENT, EACCES, ETXTBSY), and a script
 * without an interpreter line runs under /bin/sh (execvp's rule, both ways). An agent starts every
 * run the same way: the first waits for the launcher to start (prepare()), and only where it
 * cannot run at all, or for a field it cannot carry, is a hook spawned directly.
 *
 * How the pipes reach the agent: before each run the launcher makes the run's three pipes and
 * names their descriptors; the agent opens its ends through `/proc/<launcher>/fd/<n>` (the same
 * pipe, a new descriptor of the agent's), and only then sends the request. So output can never
 * cross from one run to another: each run's pipes are new, and a daemon a hook leaves behind keeps
 * only its own run's.
 *
 * The protocol on the launcher's stdin and stdout (one run at a time; the apply loop runs items
 * one at a time, and a second caller meanwhile spawns directly):
 *   launcher → agent  `P <out> <err> <in>`   the next run's pipes (read, read, write ends)
 *   agent → launcher  `<bytes>\n` then id, cwd, file, stdin (1|0), argc, args..., env... joined by NUL
 *   launcher → agent  `S <id> <pid>` started, or `E <id> <errno>` not started
 *   launcher → agent  `X <id> <wait status>` the hook's own process ended
 *
 * Linux on x64 and arm64 only (it needs /proc and two syscall numbers); where perl, /proc or
 * anything in this path is missing, or perl cannot be started, the agent spawns hooks itself. The launcher starts with the
 * first run and ends after HOOK_LAUNCHER_IDLE_CLOSE_MS without a run, or with the agent:
 * it ends at EOF on its stdin and ignores INT, TERM, HUP and QUIT, so a hook's exit status is not
 * lost to a signal sent to the agent's process group. Known limits: a launcher someone stops
 * (SIGSTOP) holds its run's end until it continues, as a stopped agent would; one killed with
 * SIGKILL between a fork and its answer leaves that hook untracked (the run fails: EPIPE).
 */
import { isLiveState, parseProcStat } from '../../protocol/proc-stat.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { closeSync, constants as fsc, existsSync, openSync, readFileSync, readlinkSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants as osc } from 'node:os';
import {
  HOOK_LAUNCHER_IDLE_CLOSE_MS,
  HOOK_LAUNCHER_LOST_PROBE_MS,
  MAX_HOOK_LAUNCHER_STDERR_BYTES,
} from '../../protocol/limits.js';

/**
 * The numbers of setsid(2) and rt_sigprocmask(2), called with perl's `syscall` (POSIX::setsid and
 * POSIX::sigprocmask would put 2 MB more heap into every fork).
 */
const SETSID_SYSCALL: Partial<Record<NodeJS.Architecture, number>> = { x64: 112, arm64: 157 };
const SIGPROCMASK_SYSCALL: Partial<Record<NodeJS.Architecture, number>> = { x64: 14, arm64: 135 };

/** Where perl is looked for: system paths only, never PATH (an agent running as root). */
const PERL_PATHS = ['/usr/bin/perl', '/bin/perl'];

/**
 * The launcher. Perl without `use warnings`, so nothing of its own reaches a hook's stderr. In the
 * child, before exec: a new session; the run's pipes as 0, 1 and 2 (every other descriptor perl
 * holds is close-on-exec); the cwd; the environment exactly as given; default handling of the
 * signals it ignores itself and an empty signal mask (whatever mask perl was started with: a hook
 * with TERM blocked would outlive its timeout's TERM). Exec's errno goes back over a close-on-exec pipe.
 */
const LAUNCHER_SCRIPT = String.raw`
use strict;
my @ours = qw(INT TERM HUP QUIT);
$SIG{$_} = 'IGNORE' for @ours;
my ($setsid, $sigprocmask) = @ARGV;
my $buf = '';
my ($or, $ow, $er, $ew, $ir, $iw);
sub fresh { pipe($or, $ow) && pipe($er, $ew) && pipe($ir, $iw) or exit 1; join ' ', 'P', fileno $or, fileno $er, fileno $iw }
sub more { my $r = sysread(STDIN, $buf, 65536, length $buf); exit 0 unless $r; }
sub tell_ { my $l = "$_[0]\n"; my $w = syswrite(STDOUT, $l); exit 0 unless defined $w && $w == length $l; }
tell_(fresh());
while (1) {
  more() until $buf =~ /\A(\d+)\n/;
  my $len = $1; my $at = length($1) + 1;
  more() while length($buf) < $at + $len;
  my $req = substr($buf, $at, $len); $buf = substr($buf, $at + $len);
  my ($id, $cwd, $file, $stdin, $n, @rest) = split /\0/, $req, -1;
  my @args = splice @rest, 0, $n;
  pipe(my $sr, my $sw) or exit 1;
  my $pid = fork;
  if (!defined $pid) { my $e = $! + 0; close $_ for $sw, $sr, $ow, $ew, $ir, $iw, $or, $er; tell_("E $id $e\n" . fresh()); next; }
  if ($pid == 0) {
    close $sr;
    # each step dies on failure, with its errno in $!; any other death (a perl error) says EINVAL
    eval {
      syscall($setsid) != -1 or die;
      if ($stdin eq '1') { open(STDIN, '<&', $ir) or die; } else { open(STDIN, '<', '/dev/null') or die; }
      open(STDOUT, '>&', $ow) or die;
      open(STDERR, '>&', $ew) or die;
      chdir $cwd or die;
      %ENV = ();
      for (@rest) { my ($k, $v) = split /=/, $_, 2; $ENV{$k} = $v; }
      $SIG{$_} = 'DEFAULT' for @ours;
      my $empty = "\0" x 8;
      syscall($sigprocmask, 2, $empty, 0, 8) != -1 or die; # SIG_SETMASK: nothing blocked
      exec { $file } $file, @args;
      die;
    };
    my $e = ($! + 0) || 22; syswrite $sw, "$e"; exit 127;
  }
  close $_ for $sw, $ow, $ew, $ir, $iw, $or, $er;
  my $got = ''; sysread $sr, $got, 16; close $sr;
  if ($got ne '') { waitpid $pid, 0; tell_("E $id $got\n" . fresh()); next; }
  tell_("S $id $pid");
  while (waitpid($pid, 0) == -1 && $! == 4) {} # EINTR
  tell_("X $id $?\n" . fresh());
}
`;

/** What to start: as ProcessSpec in run-process.ts, stdin as a flag (the text is written after). */
export interface LaunchSpec {
  file: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
  stdin: boolean;
}

/**
 * A hook started by the launcher, with the part of ChildProcess the runner uses: `pid` (set at
 * 'spawn'), the pipes, and the events 'spawn', 'error' (not started; the error carries `code`)
 * and 'exit' (code, signal), in that order.
 */
export class LaunchedProcess extends EventEmitter {
  pid: number | undefined;
  readonly stdout: Socket;
  readonly stderr: Socket;
  readonly stdin: Socket | null;

  constructor(stdout: Socket, stderr: Socket, stdin: Socket | null) {
    super();
    this.stdout = stdout;
    this.stderr = stderr;
    this.stdin = stdin;
  }
}

interface Ready {
  out: number;
  err: number;
  in: number;
}

export interface HookLauncherOptions {
  /** Warnings: the launcher could not start, died, or wrote something of its own. */
  log?: { warn(obj: object, msg: string): void };
  /** Without a run for this long the launcher ends (a later run starts it again). */
  idleCloseMs?: number;
  /** The perl to run (tests); default the first of /usr/bin/perl and /bin/perl that exists. */
  perl?: string;
}

export class HookLauncher {
  readonly #log: HookLauncherOptions['log'];
  readonly #idleCloseMs: number;
  readonly #perl: string | undefined;
  #proc: ChildProcess | null = null;
  #ready: Ready | null = null;
  #current: { id: number; file: string; run: LaunchedProcess } | null = null;
  #lines = '';
  #ids = 0;
  #idle: NodeJS.Timeout | undefined;
  /** Set once the launcher cannot work here (no perl, no /proc, a failure): spawn directly. */
  #off: boolean;
  #closed = false;
  /** Runs asked of this launcher, and hooks it has started (tests: a run went through it). */
  launched = 0;
  started = 0;
  /** Waits for the launcher's lines (an awaited start, a run in progress): its stdout is ref'd meanwhile. */
  #holds = 0;

  constructor(opts: HookLauncherOptions = {}) {
    this.#log = opts.log;
    this.#idleCloseMs = opts.idleCloseMs ?? HOOK_LAUNCHER_IDLE_CLOSE_MS;
    this.#perl = opts.perl ?? PERL_PATHS.find((p) => existsSync(p));
    this.#off =
      process.platform !== 'linux' ||
      SETSID_SYSCALL[process.arch] === undefined ||
      this.#perl === undefined ||
      !existsSync(this.#perl) ||
      !ownProc();
  }

  /** The launcher's pid while it runs (tests: a hook it started has it as parent). */
  get pid(): number | undefined {
    return this.#proc?.pid;
  }

  /** True once a launch can go through the launcher (its next run's pipes are announced). */
  get ready(): boolean {
    return !this.#off && this.#ready !== null && this.#current === null;
  }

  /**
   * Starts the launcher unless it runs or cannot; resolves when it is ready or cannot be.
   * Every run awaits it first (`prepare()`); a run that still finds it not ready is spawned directly.
   */
  start(): Promise<boolean> {
    if (this.#off || this.#closed) return Promise.resolve(false);
    if (this.#proc === null) this.#spawnLauncher();
    if (this.#ready !== null) return Promise.resolve(true);
    const proc = this.#proc;
    if (proc === null) return Promise.resolve(false);
    const out = proc.stdout as unknown as Socket;
    this.#hold(); // an awaited start keeps the process up
    return new Promise((resolve) => {
      let settled = false;
      const check = (): void => {
        if (settled || (this.#ready === null && !this.#off && this.#proc === proc)) return;
        settled = true;
        out.off('data', check);
        proc.off('exit', check);
        proc.off('error', check);
        this.#release();
        resolve(this.#ready !== null && this.#proc === proc);
      };
      out.on('data', check);
      proc.once('exit', check);
      proc.once('error', check); // perl could not be started: #disable has run
    });
  }

  /**
   * Readies the launcher for the next run: starts it when it does not run (the first run, or the
   * first after its idle time), so that every run of an agent starts the same way. Resolves at
   * once when it is ready, busy with a run, or cannot work here (the run is then spawned).
   */
  async prepare(): Promise<void> {
    if (this.#current === null) await this.start();
  }

  /**
   * Starts `spec` through the launcher; undefined when it cannot now (not ready: `prepare()` first;
   * busy with another run, not available here, or a field it cannot carry): the caller spawns it
   * itself.
   */
  launch(spec: LaunchSpec): LaunchedProcess | undefined {
    const ready = this.#ready;
    const proc = this.#proc;
    if (this.#off || this.#closed || ready === null || proc === null || this.#current !== null || !carriable(spec))
      return undefined;
    const pid = proc.pid;
    const fds: number[] = [];
    const sockets: Socket[] = [];
    try {
      const at = (n: number, flags: number): number => {
        const fd = openSync(`/proc/${pid}/fd/${n}`, flags | fsc.O_NONBLOCK);
        fds.push(fd);
        return fd;
      };
      const out = at(ready.out, fsc.O_RDONLY);
      const err = at(ready.err, fsc.O_RDONLY);
      const input = spec.stdin ? at(ready.in, fsc.O_WRONLY) : undefined;
      const socket = (fd: number, readable: boolean): Socket => {
        const sock = new Socket({ fd, readable, writable: !readable });
        sockets.push(sock);
        fds.splice(fds.indexOf(fd), 1); // the socket owns it now
        return sock;
      };
      const run = new LaunchedProcess(
        socket(out, true),
        socket(err, true),
        input === undefined ? null : socket(input, false),
      );
      const id = ++this.#ids;
      const fields = [String(id), spec.cwd, spec.file, spec.stdin ? '1' : '0', String(spec.args.length), ...spec.args];
      for (const [k, v] of Object.entries(spec.env)) fields.push(`${k}=${v}`);
      const body = Buffer.from(fields.join('\0'));
      this.#ready = null;
      this.#current = { id, file: spec.file, run };
      this.launched++;
      this.#hold(); // until its end is heard
      clearTimeout(this.#idle);
      proc.stdin?.write(Buffer.concat([Buffer.from(`${body.length}\n`), body]));
      return run;
    } catch (e) {
      for (const sock of sockets) sock.destroy();
      for (const fd of fds) closeSync(fd);
      this.#disable('the launcher could not hand over a run', e);
      return undefined;
    }
  }

  /** Ends the launcher (idempotent); with a run in progress, once that run has ended. */
  close(): void {
    this.#closed = true;
    this.#end();
  }

  #spawnLauncher(): void {
    let proc: ChildProcess;
    try {
      proc = spawn(
        this.#perl as string,
        ['-f', '-e', LAUNCHER_SCRIPT, String(SETSID_SYSCALL[process.arch]), String(SIGPROCMASK_SYSCALL[process.arch])],
        {
          env: {}, // nothing of the agent's environment (PERL5OPT, PERL5LIB) reaches perl
          cwd: '/',
          stdio: ['pipe', 'pipe', 'pipe'],
        },
      );
    } catch (e) {
      this.#disable('the launcher could not start', e);
      return;
    }
    this.#proc = proc;
    this.#ready = null;
    this.#lines = '';
    this.#holds = 0;
    proc.unref();
    for (const s of [proc.stdin, proc.stdout, proc.stderr]) (s as unknown as Socket | null)?.unref?.();
    proc.stdin?.on('error', () => undefined); // EPIPE: it died; 'exit' says so
    proc.stdout?.setEncoding('latin1');
    proc.stdout?.on('data', (d: string) => this.#onData(proc, d));
    let said = 0;
    proc.stderr?.on('data', (d: Buffer) => {
      if (said >= MAX_HOOK_LAUNCHER_STDERR_BYTES) return;
      said += d.length;
      this.#log?.warn({ text: d.toString('utf8', 0, MAX_HOOK_LAUNCHER_STDERR_BYTES) }, 'hook launcher wrote on stderr');
    });
    // on, not once: a kill that fails after the first error emits another, and none may go unheard
    proc.on('error', (e) => this.#disable('the launcher could not start', e));
    proc.once('exit', (code, sig) => this.#onExit(proc, code, sig));
  }

  #onData(proc: ChildProcess, d: string): void {
    if (this.#proc !== proc) return;
    this.#lines += d;
    for (let nl = this.#lines.indexOf('\n'); nl !== -1; nl = this.#lines.indexOf('\n')) {
      const line = this.#lines.slice(0, nl);
      this.#lines = this.#lines.slice(nl + 1);
      this.#onLine(line);
    }
  }

  #onLine(line: string): void {
    const [kind, a, b, c] = line.split(' ');
    if (kind === 'P') {
      this.#ready = { out: Number(a), err: Number(b), in: Number(c) };
      if (this.#closed) {
        this.#end(); // closed while a run was in progress
        return;
      }
      this.#idle = setTimeout(() => this.#end(), this.#idleCloseMs);
      this.#idle.unref();
      return;
    }
    const cur = this.#current;
    if (cur === null || Number(a) !== cur.id) {
      this.#disable(`the launcher said something unexpected: ${line.slice(0, 80)}`);
      return;
    }
    const run = cur.run;
    if (kind === 'S') {
      this.started++;
      run.pid = Number(b);
      run.emit('spawn');
    } else if (kind === 'E') {
      this.#current = null;
      this.#release();
      const code = errnoName(Number(b));
      const err = Object.assign(new Error(`spawn ${cur.file} ${code}`), {
        code,
        errno: -Number(b),
        syscall: `spawn ${cur.file}`,
        path: cur.file,
      });
      run.stdout.destroy();
      run.stderr.destroy();
      run.stdin?.destroy();
      run.emit('error', err);
    } else if (kind === 'X') {
      this.#current = null;
      this.#release();
      const status = Number(b);
      const signo = status & 0x7f;
      if (signo === 0) run.emit('exit', (status >> 8) & 0xff, null);
      else run.emit('exit', null, signalName(signo));
    } else {
      this.#disable(`the launcher said something unexpected: ${line.slice(0, 80)}`);
    }
  }

  #onExit(proc: ChildProcess, code: number | null, sig: NodeJS.Signals | null): void {
    if (this.#proc !== proc) return;
    this.#proc = null;
    this.#ready = null;
    clearTimeout(this.#idle);
    const cur = this.#current;
    this.#current = null;
    if (cur === null) return; // ended while idle: at EOF, or killed; the next run starts it again
    this.#log?.warn({ code, signal: sig, hook: cur.run.pid }, 'hook launcher died while a hook ran');
    this.#off = true; // something kills it: spawn directly from now on
    const run = cur.run;
    if (run.pid === undefined) {
      run.stdout.destroy();
      run.stderr.destroy();
      run.stdin?.destroy();
      run.emit('error', Object.assign(new Error(`spawn ${cur.file} EPIPE`), { code: 'EPIPE' }));
      return;
    }
    // its exit status went with the launcher: the run ends when the hook's own process has
    // (a timeout or an abort still kills its group meanwhile)
    const pid = run.pid;
    const start = startTimeOf(pid); // a pid used again later is not this hook
    const probe = setInterval(() => {
      if (start !== undefined && startTimeOf(pid) === start) return;
      clearInterval(probe);
      run.emit('exit', null, null);
    }, HOOK_LAUNCHER_LOST_PROBE_MS);
  }

  #hold(): void {
    if (this.#holds++ === 0) (this.#proc?.stdout as unknown as Socket | undefined)?.ref();
  }

  #release(): void {
    if (this.#holds > 0 && --this.#holds === 0) (this.#proc?.stdout as unknown as Socket | undefined)?.unref();
  }

  /** Stops using the launcher for good; a run it holds ends as in #onExit. */
  #disable(why: string, err?: unknown): void {
    if (!this.#off) this.#log?.warn({ err: (err as Error | undefined)?.message }, `${why}; hooks are spawned directly`);
    this.#off = true;
    if (this.#current === null) this.#end();
    else this.#proc?.kill('SIGKILL');
  }

  #end(): void {
    clearTimeout(this.#idle);
    const proc = this.#proc;
    if (proc === null || this.#current !== null) return;
    this.#proc = null;
    this.#ready = null;
    proc.stdin?.end(); // EOF: it exits
  }
}

/** The start time of `pid` while it is a process that has not ended (a zombie has); else undefined. */
function startTimeOf(pid: number): string | undefined {
  try {
    const s = parseProcStat(readFileSync(`/proc/${pid}/stat`, 'latin1'));
    return s !== undefined && isLiveState(s.state) ? s.startTimeTicks : undefined;
  } catch {
    return undefined;
  }
}

/** True when /proc is this process's own (not another PID namespace's): its fd paths name our children. */
function ownProc(): boolean {
  try {
    return readlinkSync('/proc/self') === String(process.pid);
  } catch {
    return false;
  }
}

/** True when every field fits the launcher's framing as spawn would take it (no NUL, no `=` in a name). */
function carriable(spec: LaunchSpec): boolean {
  const clean = (s: string): boolean => !s.includes('\0');
  if (!clean(spec.file) || !clean(spec.cwd) || !spec.args.every(clean)) return false;
  for (const [k, v] of Object.entries(spec.env))
    if (k === '' || k.includes('=') || !clean(k) || !clean(v)) return false;
  return true;
}

/** ENOEXEC and the like by number: os.constants knows every errno (libuv's names stop short of some). */
function errnoName(n: number): string {
  for (const [name, v] of Object.entries(osc.errno)) if (v === n) return name;
  return `errno ${n}`;
}

function signalName(n: number): NodeJS.Signals | null {
  for (const [name, v] of Object.entries(osc.signals)) if (v === n) return name as NodeJS.Signals;
  return null;
}
