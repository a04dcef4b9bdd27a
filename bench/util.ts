/**
 * Small helpers shared by the benchmark's processes: a clock comparable across processes,
 * percentiles, /proc readers (CPU and RSS of a process and its children), bounded waits.
 */
import fs from 'node:fs';
import { parseProcStat, reapedChildrenTicks, type ProcStat } from '../protocol/proc-stat.js';

/** Epoch milliseconds with microsecond resolution, comparable between processes of one machine. */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

/**
 * The node flags that preload bench/prof-preload.ts into a process, with the profiles' directory
 * (and `from`: profile from its first line a process whose script path contains it) in the
 * import's URL, which a controller's push workers inherit with its node flags.
 */
export function profilePreloadArgs(dir: string, from?: string): string[] {
  const url = new URL('./prof-preload.js', import.meta.url);
  url.searchParams.set('dir', dir);
  if (from !== undefined) url.searchParams.set('from', from);
  return ['--import', url.href];
}

/** `args` with the preload's URL (profilePreloadArgs) asking to profile from their first line the processes whose script path contains `from`. */
export function profileFromStart(args: readonly string[], from: string): string[] {
  return args.map((a) => {
    if (!a.startsWith('file:') || !a.includes('prof-preload.js')) return a;
    const url = new URL(a);
    url.searchParams.set('from', from);
    return url.href;
  });
}

/** Set to '1' by `--no-hook-launcher`: the run's agents spawn their hooks themselves. */
export const NO_HOOK_LAUNCHER_ENV = 'HERALD_BENCH_NO_HOOK_LAUNCHER';

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Nearest-rank percentile of `xs` (p in 0..100); NaN for an empty list. */
export function pct(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export interface Dist {
  n: number;
  p50: number;
  p99: number;
  min: number;
  max: number;
  mean: number;
}

/** The value of `xs` that `better` keeps over every other, scanning from `start` (a NaN never wins, unlike Math.min/max). */
function extreme(xs: readonly number[], better: (b: number, a: number) => boolean, start: number): number {
  let a = start;
  for (const b of xs) if (better(b, a)) a = b;
  return a;
}

export function dist(xs: readonly number[]): Dist {
  return {
    n: xs.length,
    p50: pct(xs, 50),
    p99: pct(xs, 99),
    min: xs.length ? extreme(xs, (b, a) => b < a, Infinity) : NaN,
    max: xs.length ? extreme(xs, (b, a) => b > a, -Infinity) : NaN,
    mean: xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN,
  };
}

/** `d` with every figure rounded to `digits` decimals (for reports). */
export function roundDist(d: Dist, digits = 2): Dist {
  return {
    n: d.n,
    p50: round(d.p50, digits),
    p99: round(d.p99, digits),
    min: round(d.min, digits),
    max: round(d.max, digits),
    mean: round(d.mean, digits),
  };
}

/**
 * A figure measured in several runs: the median of the runs' values, with the spread of all
 * samples pooled (p50, p99, min, max) and each run's own value kept.
 */
export interface RunFigure {
  median: number;
  runs: number[];
  p50: number;
  p99: number;
  min: number;
  max: number;
}

export function runFigure(runs: readonly number[]): RunFigure {
  const d = dist(runs);
  return { median: median(runs), runs: [...runs], p50: d.p50, p99: d.p99, min: d.min, max: d.max };
}

/** Polls `fn` every `everyMs` until it returns a truthy value or `ms` passes (then throws). */
export async function waitFor<T>(
  what: string,
  fn: () => T | Promise<T>,
  ms: number,
  everyMs = 25,
): Promise<NonNullable<T>> {
  const t0 = Date.now();
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (err) {
      last = err;
    }
    if (Date.now() - t0 > ms) {
      throw new Error(
        `timed out after ${ms} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message ?? String(last)})` : ''}`,
      );
    }
    await sleep(everyMs);
  }
}

// ---- /proc ------------------------------------------------------------------------------------

const CLK_TCK = 100;

export interface ProcSample {
  pid: number;
  /** utime + stime, seconds (10 ms resolution). */
  cpuS: number;
  /** Sum of the threads' on-CPU time from schedstat, seconds (ns resolution), when available. */
  cpuPreciseS: number | null;
  /** Of cpuS, the time in the kernel (stime), seconds (10 ms resolution). */
  sysS: number;
  rssKb: number;
}

function statOf(pid: number): ProcStat | null {
  try {
    return parseProcStat(fs.readFileSync(`/proc/${pid}/stat`, 'latin1')) ?? null;
  } catch {
    return null;
  }
}

/**
 * A process's CPU from /proc/<pid>/stat, ms (10 ms resolution): its own (all threads; user and
 * system) and its reaped children's; and its minor page faults so far.
 * @throws Error when it cannot be read (the process is gone)
 */
export function procUsage(pid: number): {
  selfMs: number;
  userMs: number;
  systemMs: number;
  childrenMs: number;
  minorFaults: number;
} {
  const text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  const st = parseProcStat(text);
  const children = reapedChildrenTicks(text);
  if (st === undefined || children === undefined) throw new Error(`cannot read /proc/${pid}/stat`);
  const ms = (ticks: number): number => (ticks * 1000) / CLK_TCK;
  return {
    selfMs: ms(st.utimeTicks + st.stimeTicks),
    userMs: ms(st.utimeTicks),
    systemMs: ms(st.stimeTicks),
    childrenMs: ms(children),
    minorFaults: st.minorFaults,
  };
}

/**
 * What a page fault costs here, µs: the first write to each 4 KiB page of a fresh 64 MiB buffer
 * (the kernel maps and zeroes it), less the same writes once mapped. Every fork (a hook's spawn
 * copies the agent's page tables, then each page either side writes first faults again), fresh
 * heap page and TLS buffer pays it; on this VM it is far above the write it stands for. With
 * transparent huge pages on `always` the buffer may be mapped 2 MiB at a time and the figure would
 * be a fraction of a 4 KiB fault's cost (this VM has them on `madvise`).
 */
export function pageFaultUs(): number {
  const PAGE_BYTES = 4096;
  const pages = (64 * 2 ** 20) / PAGE_BYTES;
  const runs: number[] = [];
  for (let r = 0; r < 3; r++) {
    const u8 = new Uint8Array(new ArrayBuffer(pages * PAGE_BYTES));
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < u8.length; i += PAGE_BYTES) u8[i] = 1;
    const t1 = process.hrtime.bigint();
    for (let i = 0; i < u8.length; i += PAGE_BYTES) u8[i] = 2;
    const t2 = process.hrtime.bigint();
    runs.push(Number(t1 - t0 - (t2 - t1)) / 1e3 / pages);
  }
  return round(median(runs), 2);
}

/** Parent pid of `pid`, or null when gone. */
export function ppidOf(pid: number): number | null {
  return statOf(pid)?.ppid ?? null;
}

/** CPU and RSS of one process from /proc, or null when it is gone. */
export function procSample(pid: number): ProcSample | null {
  const st = statOf(pid);
  if (!st) return null;
  const cpuS = (st.utimeTicks + st.stimeTicks) / CLK_TCK;
  let rssKb = 0;
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    rssKb = m ? Number(m[1]) : 0;
  } catch {
    return null;
  }
  const threads = threadSamples(pid);
  const precise = threads === null ? null : threads.reduce((x, t) => x + t.ns, 0) / 1e9;
  return { pid, cpuS, cpuPreciseS: precise, sysS: st.stimeTicks / CLK_TCK, rssKb };
}

/** One kind of thread's on-CPU time (schedstat, ns) and how often it was put on a CPU. */
export interface ThreadCpu {
  /**
   * `main`, or the thread's name with its number dropped: Node 20 names its helper threads (V8's
   * collector and compiler workers, libuv's pool, the inspector) `node` all alike.
   */
  kind: string;
  ns: number;
  /** Times it was scheduled in (schedstat's third field): for an idle thread, its wake-ups. */
  runs: number;
}

/** One thread's counters at one moment (`threadSamples`). */
export interface ThreadSample extends ThreadCpu {
  tid: number;
}

/**
 * A process's threads' CPU, from /proc/<pid>/task/<tid>/{comm,schedstat}: what tells a process's
 * own wake-ups (the main thread) from V8's collector and compiler threads and libuv's pool. A
 * thread that ends while it is read is left out; null only when the process is gone.
 */
export function threadSamples(pid: number): ThreadSample[] | null {
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return null;
  }
  const out: ThreadSample[] = [];
  for (const t of tids) {
    const tid = Number(t);
    try {
      const f = fs.readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ');
      const kind =
        tid === pid ? 'main' : fs.readFileSync(`/proc/${pid}/task/${t}/comm`, 'utf8').trim().replace(/\d+$/, '').trim();
      out.push({ tid, kind, ns: Number(f[0]), runs: Number(f[2]) });
    } catch {
      // the thread ended between the listing and its files
    }
  }
  return out;
}

/**
 * What each kind of thread did between two samples, most CPU first: each thread's own difference
 * (one born in between counts from zero), summed by kind. A thread that ended in between is not
 * in the later sample, so its work is lost; an idle agent's threads live as long as it does.
 */
export function threadCpuDelta(a: readonly ThreadSample[], b: readonly ThreadSample[]): ThreadCpu[] {
  const before = new Map(a.map((t) => [t.tid, t]));
  const byKind = new Map<string, ThreadCpu>();
  for (const t of b) {
    const was = before.get(t.tid);
    const x = byKind.get(t.kind) ?? { kind: t.kind, ns: 0, runs: 0 };
    x.ns += t.ns - (was?.ns ?? 0);
    x.runs += t.runs - (was?.runs ?? 0);
    byKind.set(t.kind, x);
  }
  return [...byKind.values()].filter((x) => x.ns > 0 || x.runs > 0).sort((x, y) => y.ns - x.ns);
}

/** `main 5.1 ms in 22 runs, node 1.2 ms in 4 runs`: a footprint's window by thread. */
export function byThreadText(x: readonly ThreadCpu[] | undefined): string {
  if (x === undefined || x.length === 0) return 'n/a';
  return x.map((t) => `${t.kind} ${round(t.ns / 1e6, 1)} ms in ${t.runs} runs`).join(', ');
}

/**
 * A process's resident memory by kind, from /proc/<pid>/smaps, in KB: `brk` is the C heap's main
 * arena (`[heap]`: malloc from the main thread: OpenSSL, SQLite, buffers' backing stores),
 * `anon` the other anonymous mappings (V8's heap, mmap'd malloc chunks, other malloc arenas,
 * thread stacks; shared anonymous memory such as memfd or /dev/shm too), `file` file-backed pages
 * (the node binary, libraries).
 */
export interface ResidentKinds {
  brk: number;
  anon: number;
  file: number;
}

/** Names of shared anonymous mappings: file-backed in form, memory in fact. */
const SHARED_ANON_RE = /^(\/dev\/zero|\/SYSV|\/memfd:|\/dev\/shm\/)/;

/** ResidentKinds from the text of /proc/<pid>/smaps. Pure. */
export function residentByKindOf(smaps: string): ResidentKinds {
  const out: ResidentKinds = { brk: 0, anon: 0, file: 0 };
  let kind: keyof ResidentKinds = 'anon';
  for (const line of smaps.split('\n')) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) {
      const name = (head[1] ?? '').trim();
      kind =
        name === '[heap]' ? 'brk' : name === '' || name.startsWith('[') || SHARED_ANON_RE.test(name) ? 'anon' : 'file';
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss) out[kind] += Number(rss[1]);
  }
  return out;
}

/** ResidentKinds of the live process `pid`; null when it cannot be read (gone). */
export function residentByKind(pid: number): ResidentKinds | null {
  try {
    return residentByKindOf(fs.readFileSync(`/proc/${pid}/smaps`, 'utf8'));
  } catch {
    return null;
  }
}

/** The sum of several processes' ResidentKinds (those gone skipped); null when none was read. */
export function addResident(parts: readonly (ResidentKinds | null)[]): ResidentKinds | null {
  const read = parts.filter((p): p is ResidentKinds => p !== null);
  if (read.length === 0) return null;
  return read.reduce((a, p) => ({ brk: a.brk + p.brk, anon: a.anon + p.anon, file: a.file + p.file }), {
    brk: 0,
    anon: 0,
    file: 0,
  });
}

/**
 * `malloc heap 474, other anonymous 130, files 42 MiB`: ResidentKinds for a line of text;
 * `anonNote` follows the anonymous part (what of it is V8's heap).
 */
export function residentText(x: ResidentKinds, anonNote = ''): string {
  const mib = (kb: number): string => round(kb / 1024, 0).toLocaleString('en-US');
  const note = anonNote === '' ? '' : ` (${anonNote})`;
  return `malloc heap ${mib(x.brk)}, other anonymous ${mib(x.anon)}${note}, files ${mib(x.file)} MiB`;
}

/** `V8's heap 29, 26 used`: the note on a main process's anonymous memory, from its heap gauges (KB). */
export function heapNote(h: { totalKb: number; usedKb: number } | undefined): string {
  if (h === undefined) return '';
  return `V8's heap ${round(h.totalKb / 1024, 0)}, ${round(h.usedKb / 1024, 0)} used`;
}

/** `no push worker`, `one push worker`, `3 push workers`: a controller's worker count in a report's text. */
export function pushWorkersPhrase(n: number): string {
  return n === 0 ? 'no push worker' : n === 1 ? 'one push worker' : `${n} push workers`;
}

/** Direct children of `pid` (Linux /proc scan). */
export function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    if (ppidOf(Number(d)) === pid) out.push(Number(d));
  }
  return out;
}

/**
 * The hook launchers (agent/hooks/launcher.ts: a perl child of an agent process, whose children are
 * the hooks) of these agent processes. Their own CPU is the agents' share of a hook's start.
 */
export function launchersOf(agents: number[]): number[] {
  const set = new Set(agents);
  const out: number[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = parseProcStat(fs.readFileSync(`/proc/${d}/stat`, 'latin1'));
      if (st !== undefined && set.has(st.ppid) && st.comm === 'perl') out.push(st.pid);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** Every process below `pid`, children before their own children. */
export function descendantsOf(pid: number): number[] {
  const out: number[] = [];
  for (let next = 0, at = pid; ; at = out[next++]!) {
    out.push(...childrenOf(at));
    if (next >= out.length) return out;
  }
}

/** A process and its direct children (the controller and its push workers), summed. */
export interface TreeSample {
  cpuS: number;
  rssKb: number;
  pids: number[];
  /** cpuS: schedstat's ns when available (else ticks); sysS: stime, 10 ms ticks. */
  byPid: Record<number, { cpuS: number; sysS: number; rssKb: number }>;
}

export function treeSample(pid: number): TreeSample {
  const pids = [pid, ...childrenOf(pid)];
  const out: TreeSample = { cpuS: 0, rssKb: 0, pids: [], byPid: {} };
  for (const p of pids) {
    const s = procSample(p);
    if (!s) continue;
    const cpu = s.cpuPreciseS ?? s.cpuS;
    out.cpuS += cpu;
    out.rssKb += s.rssKb;
    out.pids.push(p);
    out.byPid[p] = { cpuS: cpu, sysS: s.sysS, rssKb: s.rssKb };
  }
  return out;
}

/**
 * A process tree's CPU over a window, its root apart from its children (a controller's push
 * workers). The CPU is the threads' schedstat time (ns); the kernel's part is stime, in 10 ms
 * ticks, so a short window's share is coarse.
 */
export interface ProcessSplit {
  /** The root process: CPU-s in the window, and of it in the kernel. */
  mainS: number;
  mainSysS: number;
  /** Its children alive at both ends of the window, summed (one that started or ended inside it is left out). */
  childrenS: number;
  childrenSysS: number;
}

/** The CPU each side of `root`'s tree used between two samples of it (`treeSample`). */
export function splitByProcess(before: TreeSample, after: TreeSample, root: number): ProcessSplit {
  const out: ProcessSplit = { mainS: 0, mainSysS: 0, childrenS: 0, childrenSysS: 0 };
  for (const [key, b] of Object.entries(after.byPid)) {
    const a = before.byPid[Number(key)];
    if (a === undefined) continue;
    const cpu = b.cpuS - a.cpuS;
    const sys = b.sysS - a.sysS;
    if (Number(key) === root) {
      out.mainS += cpu;
      out.mainSysS += sys;
    } else {
      out.childrenS += cpu;
      out.childrenSysS += sys;
    }
  }
  return out;
}

/** Loopback counters from /proc/net/dev: bytes and packets received (each packet once). */
export function loCounters(): { bytes: number; packets: number } | null {
  try {
    const line = fs
      .readFileSync('/proc/net/dev', 'utf8')
      .split('\n')
      .find((l) => l.trim().startsWith('lo:'));
    if (!line) return null;
    const f = line.trim().slice(3).trim().split(/\s+/).map(Number);
    return { bytes: f[0]!, packets: f[1]! };
  } catch {
    return null;
  }
}

export function loadAvg(): number[] {
  try {
    return fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).map(Number);
  } catch {
    return [];
  }
}

/** Prints a progress line to stderr (the report goes to files). */
export function say(msg: string): void {
  const t = new Date().toISOString().slice(11, 19);
  process.stderr.write(`[bench ${t}] ${msg}\n`);
}

/** A logger with the shape the agent modules take; counts warnings and keeps the last few. */
export class CountingLogger {
  warns = 0;
  errors = 0;
  readonly last: string[] = [];
  readonly #echo: boolean;

  constructor(echo = false) {
    this.#echo = echo;
  }

  info(): void {}
  debug(): void {}
  warn(obj: object, msg?: string): void {
    this.warns++;
    this.#keep('warn', obj, msg);
  }
  error(obj: object, msg?: string): void {
    this.errors++;
    this.#keep('error', obj, msg);
  }
  #keep(level: string, obj: object, msg?: string): void {
    let o = '';
    try {
      o = JSON.stringify(obj, (_k, v: unknown) =>
        v instanceof Error ? { message: v.message, code: (v as { code?: unknown }).code } : v,
      );
    } catch {
      o = '?';
    }
    const line = `${level}: ${msg ?? ''} ${o}`.slice(0, 400);
    if (this.#echo) process.stderr.write(`${line}\n`);
    this.last.push(line);
    if (this.last.length > 20) this.last.shift();
  }
}

export function round(x: number, digits = 1): number {
  if (!Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** TCP counters of this network namespace that tell of overload (listen queue overflows, resets). */
export function tcpTroubles(): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    const lines = fs.readFileSync('/proc/net/netstat', 'utf8').split('\n');
    for (let i = 0; i + 1 < lines.length; i += 2) {
      const keys = lines[i]!.split(/\s+/);
      const vals = lines[i + 1]!.split(/\s+/);
      if (keys[0] !== 'TcpExt:') continue;
      keys.forEach((k, j) => {
        if (
          [
            'ListenOverflows',
            'ListenDrops',
            'TCPAbortOnData',
            'TCPAbortOnClose',
            'TCPReqQFullDrop',
            'TCPReqQFullDoCookies',
            'SyncookiesSent',
            'TCPTimeouts',
            'TCPSynRetrans',
          ].includes(k)
        )
          out[k] = Number(vals[j]);
      });
    }
    const snmp = fs.readFileSync('/proc/net/snmp', 'utf8').split('\n');
    for (let i = 0; i + 1 < snmp.length; i += 2) {
      const keys = snmp[i]!.split(/\s+/);
      const vals = snmp[i + 1]!.split(/\s+/);
      if (keys[0] !== 'Tcp:') continue;
      keys.forEach((k, j) => {
        if (['AttemptFails', 'EstabResets', 'OutRsts'].includes(k)) out[k] = Number(vals[j]);
      });
    }
  } catch {
    // not Linux
  }
  return out;
}

export function diffCounters(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of Object.keys(b)) {
    const d = (b[k] ?? 0) - (a[k] ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
}
