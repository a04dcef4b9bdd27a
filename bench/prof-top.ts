/**
 * `node dist/bench/prof-top.js <file.cpuprofile> [n]`: the functions with the most self time
 * and the most inclusive time in a V8 CPU profile (what `npm run bench -- --profile <dir>`
 * writes), for a first look without a browser; `--alloc <file.heapprofile>`: the functions that
 * allocated the most in the same window (`HERALD_BENCH_PROFILE_HEAP=1`). Flame graphs: open the file in Chrome DevTools
 * (Performance) or speedscope.
 */
import fs from 'node:fs';

interface ProfNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfNode[];
  samples: number[];
  timeDeltas: number[];
}

export function top(file: string, n = 25): string {
  const prof = JSON.parse(fs.readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(prof.nodes.map((x) => [x.id, x]));
  const parent = new Map<number, number>();
  for (const x of prof.nodes) for (const c of x.children ?? []) parent.set(c, x.id);
  const us = new Map<number, number>();
  prof.samples.forEach((id, i) => {
    us.set(id, (us.get(id) ?? 0) + (prof.timeDeltas[i] ?? 0));
  });
  const key = (x: ProfNode): string =>
    `${x.callFrame.functionName || '(anonymous)'} ${x.callFrame.url.replace(/^.*\/(dist|node_modules)\//, '$1/')}:${x.callFrame.lineNumber + 1}`;
  const self = new Map<string, number>();
  const incl = new Map<string, number>();
  let total = 0;
  for (const [id, t] of us) {
    total += t;
    const k = key(byId.get(id)!);
    self.set(k, (self.get(k) ?? 0) + t);
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const kk = key(byId.get(cur)!);
      if (seen.has(kk)) continue;
      seen.add(kk);
      incl.set(kk, (incl.get(kk) ?? 0) + t);
    }
  }
  const show = (m: Map<string, number>, title: string): string[] => [
    `-- ${title} (of ${(total / 1000).toFixed(0)} ms sampled)`,
    ...[...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([k, v]) => `${(v / 1000).toFixed(0).padStart(8)} ms ${((v / total) * 100).toFixed(1).padStart(5)} %  ${k}`),
  ];
  return [...show(self, 'self time'), '', ...show(incl, 'inclusive time')].join('\n');
}

interface HeapNode {
  callFrame: ProfNode['callFrame'];
  selfSize: number;
  children: HeapNode[];
}

/**
 * The functions that allocated the most in a sampling heap profile (`HERALD_BENCH_PROFILE_HEAP=1`
 * with `--profile`), by their own allocations and with their callees'.
 */
export function topAlloc(file: string, n = 25): string {
  const root = (JSON.parse(fs.readFileSync(file, 'utf8')) as { head: HeapNode }).head;
  const key = (x: HeapNode): string =>
    `${x.callFrame.functionName || '(anonymous)'} ${x.callFrame.url.replace(/^.*\/(dist|node_modules)\//, '$1/')}:${x.callFrame.lineNumber + 1}`;
  const self = new Map<string, number>();
  const incl = new Map<string, number>();
  let total = 0;
  const walk = (x: HeapNode, above: ReadonlySet<string>): number => {
    const k = key(x);
    let sum = x.selfSize;
    self.set(k, (self.get(k) ?? 0) + x.selfSize);
    total += x.selfSize;
    const here = above.has(k) ? above : new Set([...above, k]);
    for (const c of x.children) sum += walk(c, here);
    if (!above.has(k)) incl.set(k, (incl.get(k) ?? 0) + sum);
    return sum;
  };
  walk(root, new Set());
  const show = (m: Map<string, number>, title: string): string[] => [
    `-- ${title} (of ${(total / 2 ** 20).toFixed(1)} MiB sampled)`,
    ...[...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(
        ([k, v]) => `${(v / 2 ** 20).toFixed(1).padStart(8)} MiB ${((v / total) * 100).toFixed(1).padStart(5)} %  ${k}`,
      ),
  ];
  return [...show(self, 'allocated'), '', ...show(incl, 'allocated, callees included')].join('\n');
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].replace(/^.*\//, ''))) {
  const alloc = process.argv[2] === '--alloc';
  const [file, count] = process.argv.slice(alloc ? 3 : 2);
  if (!file) {
    process.stderr.write('usage: node dist/bench/prof-top.js [--alloc] <file.cpuprofile|file.heapprofile> [n]\n');
    process.exit(2);
  }
  process.stdout.write(`${(alloc ? topAlloc : top)(file, Number(count ?? 25))}\n`);
}
