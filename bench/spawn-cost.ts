/**
 * What starting a child costs the hook runner: `child_process.spawn` against `execa`, each
 * spawning `/bin/true` and `sh -c true` N times (one at a time, wall time from the call to the
 * child's exit) from a process grown to the idle agent's resident size (BENCHMARKS.md: ~54 MB),
 * so the fork copies what the agent's would. Prints p50/p99 in µs per way.
 *
 * Herald does not depend on execa (this measurement is why: README, "Hooks"); to re-measure,
 * install it beside the tree without saving it:
 *
 *   npm install --no-save execa@9.6.1
 *   npx tsc -p tsconfig.build.json && node dist/bench/spawn-cost.js [--n 200] [--rss-mb 54]
 *
 * Without execa installed only the spawn rows are printed.
 */
import { spawn } from 'node:child_process';
import { parseArgs } from 'node:util';
import { pct } from './util.js';

type Way = (file: string, args: string[]) => Promise<void>;

const spawnWay: Way = (file, args) =>
  new Promise((resolve, reject) => {
    const c = spawn(file, args, { stdio: 'ignore' });
    c.once('error', reject);
    c.once('exit', () => resolve());
  });

type Execa = (file: string, args: string[], o: { stdio: 'ignore' }) => Promise<unknown>;

/** execa when it is installed (a variable specifier, so the build does not need it). */
async function execaWay(): Promise<Way | undefined> {
  const name = 'execa';
  try {
    const { execa } = (await import(name)) as { execa: Execa };
    return async (file, args) => void (await execa(file, args, { stdio: 'ignore' }));
  } catch {
    return undefined;
  }
}

const COMMANDS: Array<[string, string[]]> = [
  ['/bin/true', []],
  ['sh', ['-c', 'true']],
];

/** Grows the heap to about `mb` MB of touched memory, as an agent that has run a while. */
function ballast(mb: number): Buffer[] {
  const have = process.memoryUsage().rss / 2 ** 20;
  const chunks: Buffer[] = [];
  for (let i = 0; i < Math.max(0, mb - have); i++) chunks.push(Buffer.alloc(2 ** 20, i));
  return chunks;
}

async function timeOne(way: Way, file: string, args: string[]): Promise<number> {
  const t = process.hrtime.bigint();
  await way(file, args);
  return Number(process.hrtime.bigint() - t) / 1_000;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { n: { type: 'string', default: '200' }, 'rss-mb': { type: 'string', default: '54' } },
  });
  const n = Number(values.n);
  const execa = await execaWay();
  const ways: Record<string, Way> = execa ? { spawn: spawnWay, execa } : { spawn: spawnWay };
  const keep = ballast(Number(values['rss-mb']));
  if (!execa) process.stdout.write('execa is not installed (npm install --no-save execa@9.6.1): spawn only\n');
  process.stdout.write(
    `spawn cost, N=${n} each, from a process of ${(process.memoryUsage().rss / 2 ** 20).toFixed(0)} MB RSS (${keep.length} MB ballast)\n`,
  );
  for (const [file, args] of COMMANDS) {
    // interleaved, so a noisy neighbour on a shared machine hits both ways alike
    const samples = Object.fromEntries(Object.keys(ways).map((w) => [w, [] as number[]]));
    for (const w of Object.keys(ways)) for (let i = 0; i < 10; i++) await timeOne(ways[w]!, file, args); // warm-up
    for (let i = 0; i < n; i++)
      for (const w of Object.keys(ways)) samples[w]!.push(await timeOne(ways[w]!, file, args));
    for (const [w, xs] of Object.entries(samples)) {
      process.stdout.write(
        `  ${[file, ...args].join(' ').padEnd(12)} ${w.padEnd(6)} p50 ${pct(xs, 50).toFixed(0).padStart(6)} µs  p99 ${pct(xs, 99).toFixed(0).padStart(6)} µs\n`,
      );
    }
  }
}

await main();
