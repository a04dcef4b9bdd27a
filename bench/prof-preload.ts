/**
 * Preloaded (`node --import .../prof-preload.js`) into the processes a profiled benchmark run
 * starts: SIGUSR2 starts the V8 CPU profiler, the next SIGUSR2 stops it and writes
 * `$HERALD_BENCH_PROFILE_DIR/<title>-<pid>-<k>.cpuprofile`. So a profile covers exactly the
 * window being measured (a fan-out run), not the set-up before it. Loads nothing else.
 */
import fs from 'node:fs';
import { Session } from 'node:inspector';
import path from 'node:path';

const dir = process.env.HERALD_BENCH_PROFILE_DIR;
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
      session = s;
      return;
    }
    const s = session;
    session = null;
    s.post('Profiler.stop', (err, res) => {
      if (!err && res) {
        const title =
          path.basename(process.argv[1] ?? 'node').replace(/\.js$/, '') +
          (process.argv[2] ? `-${process.argv[2]}` : '');
        fs.mkdirSync(dir, { recursive: true });
        fs.writeFileSync(path.join(dir, `${title}-${process.pid}-${k++}.cpuprofile`), JSON.stringify(res.profile));
      }
      s.disconnect();
    });
  };
  process.on('SIGUSR2', toggle);
  // HERALD_BENCH_PROFILE_FROM_START=<name>: processes whose script name contains it profile
  // from their first line (a harness's start-up, before anyone could signal it)
  const from = process.env.HERALD_BENCH_PROFILE_FROM_START;
  if (from && (process.argv[1] ?? '').includes(from)) toggle();
}
