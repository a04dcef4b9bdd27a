/**
 * Preloaded (`node --import .../prof-preload.js`) into the processes a profiled benchmark run
 * starts: SIGUSR2 starts the V8 CPU profiler, the next SIGUSR2 stops it and writes
 * `$HERALD_BENCH_PROFILE_DIR/<title>-<pid>-<k>.cpuprofile`. So a profile covers exactly the
 * window being measured (a fan-out run), not the set-up before it. With
 * `HERALD_BENCH_PROFILE_HEAP=1` the same window also samples allocations, the collected ones
 * included (what the collector had to deal with, not only what survived), into
 * `<title>-<pid>-<k>.heapprofile` (`node dist/bench/prof-top.js --alloc <file>`). Loads nothing else.
 *
 * The directory may also come as the import's `?dir=` (util.ts profilePreloadArgs), and the start-up
 * profiling as `&from=`: a controller's push workers inherit its node flags but not its
 * environment (protocol/child-env.ts), and a worker without the preload dies of the SIGUSR2.
 */
import fs from 'node:fs';
import { Session } from 'node:inspector';
import path from 'node:path';

const query = new URL(import.meta.url).searchParams;
const dir = process.env.HERALD_BENCH_PROFILE_DIR ?? query.get('dir') ?? undefined;
const heap = process.env.HERALD_BENCH_PROFILE_HEAP === '1';
/** Mean bytes between two sampled allocations (V8's default is 32 KiB; finer for a short window). */
const HEAP_SAMPLING_INTERVAL_BYTES = 4_096;
if (dir) {
  let session: Session | null = null;
  let k = 0;
  const toggle = (): void => {
    if (session === null) {
      const s = new Session();
      s.connect();
      s.post('Profiler.enable', () =>
        s.post('Profiler.setSamplingInterval', { interval: 200 }, () => s.post('Profiler.start')),
      );
      if (heap)
        // (the two include flags are V8's, newer than @types/node's type of these parameters)
        s.post('HeapProfiler.startSampling', {
          samplingInterval: HEAP_SAMPLING_INTERVAL_BYTES,
          includeObjectsCollectedByMajorGC: true,
          includeObjectsCollectedByMinorGC: true,
        } as object);
      session = s;
      return;
    }
    const s = session;
    session = null;
    const title =
      path.basename(process.argv[1] ?? 'node').replace(/\.js$/, '') + (process.argv[2] ? `-${process.argv[2]}` : '');
    const base = path.join(dir, `${title}-${process.pid}-${k++}`);
    fs.mkdirSync(dir, { recursive: true });
    const cpuDone = (): void =>
      s.post('Profiler.stop', (err, res) => {
        if (!err && res) fs.writeFileSync(`${base}.cpuprofile`, JSON.stringify(res.profile));
        s.disconnect();
      });
    if (!heap) {
      cpuDone();
      return;
    }
    s.post('HeapProfiler.stopSampling', (err, res) => {
      if (!err && res) fs.writeFileSync(`${base}.heapprofile`, JSON.stringify(res.profile));
      cpuDone();
    });
  };
  process.on('SIGUSR2', toggle);
  // HERALD_BENCH_PROFILE_FROM_START=<name>: processes whose script name contains it profile
  // from their first line (a harness's start-up, before anyone could signal it)
  const from = process.env.HERALD_BENCH_PROFILE_FROM_START ?? query.get('from') ?? undefined;
  if (from && (process.argv[1] ?? '').includes(from)) toggle();
}
