/**
 * What starting a child costs the hook runner, from a process grown to the agent's resident size
 * (BENCHMARKS.md: ~54-60 MB), so the fork copies what the agent's would. Each way starts
 * `sh -c true` N times, one at a time, and is timed from the call to the child's exit. Per start
 * it prints the wall time (p50, p99), the CPU of this process, of the helper that stays (if any)
 * and of the reaped children (all from /proc), and this process's minor page faults; then what one
 * page fault costs here (`pageFaultUs`, as the benchmark's machine line gives it).
 *
 * - `spawn`: `child_process.spawn`, as `agent/hooks/run-process.ts` starts a hook (its own
 *   process group, pipes for stdout and stderr). Node 20's libuv forks this process for it.
 * - `execa`: the same through execa, when it is installed beside the tree (Herald does not depend
 *   on it: README, "Hooks"): `npm install --no-save execa@9.6.1`.
 * - `launcher`: the runner's way by default, `agent/hooks/launcher.ts`: a perl that stays hands
 *   each run pipes of its own, which this process opens through /proc, and forks the child.
 * - `shell-stays`: one `bash` started once (`set -m`: each job in its own process group) is
 *   asked over a pipe to start each child and to say when it ended: the fork is bash's, not this
 *   process's. A measurement of what the runner would save; the runner does not do it (the child's
 *   stdout and stderr would be bash's, shared by every run: docs/agent-footprint.md).
 *
 * The ways run one after another, N each (each way's CPU is read from /proc around its block, at
 * 10 ms resolution), so run it on a quiet machine.
 *
 *   npm run build && node dist/bench/spawn-cost.js [--n 200] [--rss-mb 54]
 */
import { spawn } from 'node:child_process';
import { HookLauncher } from '../agent/hooks/launcher.js';
import { parseArgs } from 'node:util';
import { pageFaultUs, pct, procUsage } from './util.js';

interface Way {
  name: string;
  /** Starts `sh -c true` and resolves when it has exited. */
  run: () => Promise<void>;
  /** The helper process that stays, if the way has one. */
  helperPid?: number;
  close?: () => void;
}

const spawnWay: Way = {
  name: 'spawn',
  run: () =>
    new Promise((resolve, reject) => {
      const c = spawn('sh', ['-c', 'true'], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
      c.once('error', reject);
      c.once('close', () => resolve());
    }),
};

type Execa = (file: string, args: string[], o: { stdin: 'ignore'; detached: true }) => Promise<unknown>;

/** execa when it is installed (a variable specifier, so the build does not need it). */
async function execaWay(): Promise<Way | undefined> {
  const name = 'execa';
  try {
    const { execa } = (await import(name)) as { execa: Execa };
    // as the spawn way: stdin ignored, stdout and stderr piped, a process group of its own
    return {
      name: 'execa',
      run: async () => void (await execa('sh', ['-c', 'true'], { stdin: 'ignore', detached: true })),
    };
  } catch {
    return undefined;
  }
}

/** The hook runner's launcher, started once; each start asked of it waits for the child's exit. */
async function launcherWay(): Promise<Way | undefined> {
  const launcher = new HookLauncher();
  if (!(await launcher.start())) return undefined;
  const spec = { file: 'sh', args: ['-c', 'true'], cwd: '/', env: { PATH: '/usr/bin:/bin' }, stdin: false };
  return {
    name: 'launcher',
    helperPid: launcher.pid as number,
    run: () =>
      new Promise((resolve, reject) => {
        const c = launcher.launch(spec);
        if (c === undefined) return reject(new Error('the launcher is not ready'));
        c.once('error', reject);
        c.once('exit', () => {
          c.stdout.destroy();
          c.stderr.destroy();
          resolve();
        });
      }),
    close: () => launcher.close(),
  };
}

/** A bash that stays, starting each child as a job of its own and answering its exit status. */
function shellStaysWay(): Way {
  const sh = spawn(
    'bash',
    ['--noprofile', '--norc', '-c', 'set -m; while read -r _; do sh -c true </dev/null & wait $!; echo $?; done'],
    {
      stdio: ['pipe', 'pipe', 'ignore'],
    },
  );
  let pending: (() => void) | undefined;
  let buf = '';
  sh.stdout.setEncoding('utf8');
  sh.stdout.on('data', (d: string) => {
    buf += d;
    while (buf.includes('\n')) {
      buf = buf.slice(buf.indexOf('\n') + 1);
      const p = pending;
      pending = undefined;
      p?.();
    }
  });
  return {
    name: 'shell-stays',
    helperPid: sh.pid,
    run: () =>
      new Promise((resolve) => {
        pending = resolve;
        sh.stdin.write('\n');
      }),
    close: () => sh.stdin.end(),
  };
}

/** Grows the heap to about `mb` MB of touched memory, as an agent that has run a while. */
function ballast(mb: number): Buffer[] {
  const have = process.memoryUsage().rss / 2 ** 20;
  const chunks: Buffer[] = [];
  for (let i = 0; i < Math.max(0, mb - have); i++) chunks.push(Buffer.alloc(2 ** 20, i));
  return chunks;
}

async function measure(way: Way, n: number): Promise<string> {
  for (let i = 0; i < 10; i++) await way.run(); // warm-up
  const me0 = procUsage(process.pid);
  const h0 = way.helperPid === undefined ? undefined : procUsage(way.helperPid);
  const wall: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    await way.run();
    wall.push(Number(process.hrtime.bigint() - t) / 1_000);
  }
  const me1 = procUsage(process.pid);
  const h1 = way.helperPid === undefined ? undefined : procUsage(way.helperPid);
  const per = (x: number): string => (x / n).toFixed(2).padStart(6);
  const self = me1.selfMs - me0.selfMs;
  const helper = h0 && h1 ? h1.selfMs - h0.selfMs : 0;
  const kids = me1.childrenMs - me0.childrenMs + (h0 && h1 ? h1.childrenMs - h0.childrenMs : 0);
  return (
    `  ${way.name.padEnd(11)} p50 ${pct(wall, 50).toFixed(0).padStart(6)} µs  p99 ${pct(wall, 99).toFixed(0).padStart(6)} µs` +
    `  CPU ms a start: this process ${per(self)}, helper ${per(helper)}, children ${per(kids)}, all ${per(self + helper + kids)}` +
    `  faults here ${((me1.minorFaults - me0.minorFaults) / n).toFixed(0)}\n`
  );
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { n: { type: 'string', default: '200' }, 'rss-mb': { type: 'string', default: '54' } },
  });
  const n = Number(values.n);
  const execa = await execaWay();
  const keep = ballast(Number(values['rss-mb']));
  process.stdout.write(
    `sh -c true, N=${n} each, from a process of ${(process.memoryUsage().rss / 2 ** 20).toFixed(0)} MB RSS (${keep.length} MB ballast)${execa ? '' : '; execa not installed'}\n`,
  );
  const launcher = await launcherWay();
  const ways = [spawnWay, ...(execa ? [execa] : []), ...(launcher ? [launcher] : []), shellStaysWay()];
  for (const way of ways) process.stdout.write(await measure(way, n));
  for (const way of ways) way.close?.();
  process.stdout.write(`a page fault here (the first write to a fresh 4 KiB page): ${pageFaultUs()} µs\n`);
}

await main();
