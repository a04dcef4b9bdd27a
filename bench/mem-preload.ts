/**
 * Preloaded (`node --import .../mem-preload.js`) into the controller of a soak
 * (`npm run bench -- --soak`): every `HERALD_BENCH_MEM_INTERVAL_MS` it appends
 * `process.memoryUsage()` to `$HERALD_BENCH_MEM_DIR/<title>-<pid>.jsonl`, so the soak can tell the
 * JS heap from memory outside it (buffers; the rest of RSS is OpenSSL, SQLite, the allocator).
 * With `HERALD_BENCH_MEM_GC=1` (`--soak-gc`) each sample comes after a forced full GC: what the
 * heap still holds then is what Herald's code keeps. Off by default, as forcing GCs changes RSS.
 * Loads nothing else.
 */
import fs from 'node:fs';
import path from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';

const dir = process.env.HERALD_BENCH_MEM_DIR;
if (dir) {
  let gc = (): void => undefined;
  if (process.env.HERALD_BENCH_MEM_GC === '1') {
    v8.setFlagsFromString('--expose-gc');
    gc = vm.runInNewContext('gc') as () => void;
  }
  const title =
    path.basename(process.argv[1] ?? 'node').replace(/\.js$/, '') + (process.argv[2] ? `-${process.argv[2]}` : '');
  const file = path.join(dir, `${title}-${process.pid}.jsonl`);
  fs.mkdirSync(dir, { recursive: true });
  const t0 = Date.now();
  const every = Number(process.env.HERALD_BENCH_MEM_INTERVAL_MS) || 5_000;
  const sample = (): void => {
    gc();
    const m = process.memoryUsage();
    const line = { atS: (Date.now() - t0) / 1000, ...m };
    fs.appendFileSync(file, `${JSON.stringify(line)}\n`);
  };
  setInterval(sample, every).unref();
}
