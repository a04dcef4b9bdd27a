/**
 * What the hop between the controller's main process and its push worker costs per woken agent,
 * timed alone: the messages a fan-out sends for each agent (the wake-up command down; two push
 * states, an ack and a fetch request up; the fetch's answer with a body down; each written flat
 * as the two ends write them), in batches as PushPool and the worker send them
 * (controller/push/ipc.ts), over a `child_process.fork` channel with the same `advanced`
 * serialization and the same young-generation cap. Prints the CPU (user + system) of each end
 * per agent and the wall time.
 *
 *   npm run build && node dist/bench/ipc-cost.js [--n 10000] [--batch 1000] [--body-bytes 2600]
 *
 * BENCHMARKS.md ("What limits the figures", the fan-out) compares it with the controller's CPU
 * per agent in a fan-out, and with the dialer in the main process (`--push-workers 0`).
 */
import { fork, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { HERALD_NODE_FLAGS } from '../protocol/node-flags.js';
import {
  readWorkerCommands,
  readWorkerEvents,
  WorkerCommands,
  WorkerEvents,
  type FromWorker,
  type ToWorker,
} from '../controller/push/ipc.js';
import type { PushState } from '../controller/push/types.js';

interface ChildGo {
  t: 'go';
  n: number;
  batch: number;
}
interface ChildDone {
  t: 'done';
  cpuUs: number;
}

/** The worker's end: sends each agent's events in batches, takes the answers. */
function child(): void {
  let answered = 0;
  let total = 0;
  const start = process.cpuUsage();
  process.on('message', (m: ChildGo | ToWorker) => {
    if (m.t === 'go') {
      total = m.n;
      for (let b = 0; b * m.batch < m.n; b++) {
        const events = new WorkerEvents();
        for (let i = b * m.batch; i < Math.min(m.n, (b + 1) * m.batch); i++) {
          const node = `node-${i}`;
          const s: PushState = {
            state: 'connected',
            connected: true,
            via: 'dialled',
            generation_pushed: 5,
            generation_acked: 4,
            last_ack_at: new Date().toISOString(),
            last_error: null,
            last_error_at: null,
          };
          events.state(node, s);
          events.ack({ node, jti: 'jti-0123456789abcdefghij', gen: 5, fetch: 'started', latencyMs: 12.5 });
          events.state(node, { ...s, generation_acked: 5 });
          events.request(i, { kind: 'fetch', node, nonce: 'n'.repeat(32), ifNoneMatch: '"4"' });
        }
        const msg: FromWorker = { t: 'batch', events: events.take(), metrics: null };
        process.send?.(msg);
      }
    } else if (m.t === 'batch') {
      readWorkerCommands(m.words, {
        notify: () => undefined,
        answer: (_id, _kind, r) => {
          // as the worker does: the structured clone's Uint8Array viewed as a Buffer
          if (r.body !== undefined) Buffer.from(r.body.buffer, r.body.byteOffset, r.body.byteLength);
          answered++;
        },
        other: () => undefined,
      });
      if (total > 0 && answered === total) {
        const u = process.cpuUsage(start);
        const done: ChildDone = { t: 'done', cpuUs: u.user + u.system };
        process.send?.(done);
      }
    }
  });
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      n: { type: 'string', default: '10000' },
      batch: { type: 'string', default: '1000' },
      'body-bytes': { type: 'string', default: '2600' },
    },
  });
  const whole = (name: 'n' | 'batch' | 'body-bytes'): number => {
    const v = Number(values[name]);
    if (Number.isInteger(v) && v > 0) return v;
    process.stderr.write(`ipc-cost: --${name} must be a whole number above 0, not ${JSON.stringify(values[name])}\n`);
    process.exit(2);
  };
  const n = whole('n');
  const batch = whole('batch');
  const body = Buffer.alloc(whole('body-bytes'), 0x61);
  const c = fork(fileURLToPath(import.meta.url), ['--child'], {
    serialization: 'advanced',
    execArgv: [...HERALD_NODE_FLAGS],
  });
  const states = new Map<string, PushState>();
  const start = process.cpuUsage();
  const t0 = performance.now();
  const childCpuUs = await new Promise<number>((resolve) => {
    c.on('message', (m: FromWorker | ChildDone) => {
      if (m.t === 'done') resolve(m.cpuUs);
      else if (m.t === 'batch') {
        const cmds = new WorkerCommands();
        // as PushPool does: the states kept, the fetches answered
        readWorkerEvents(m.events, {
          state: (node, s) => states.set(node, s),
          ack: () => undefined,
          nack: () => undefined,
          request: (id) =>
            // the built body as the API hands it over (a Buffer, cloned by the channel)
            cmds.answer(id, 'fetch', { status: 200, etag: '"5"', signature: 's'.repeat(300), body }),
          attach: () => undefined,
          detach: () => undefined,
        });
        const out: ToWorker = { t: 'batch', words: cmds.take() };
        c.send(out);
      }
    });
    // the change's wake-ups, as PushPool queues them
    for (let b = 0; b * batch < n; b++) {
      const wakes = new WorkerCommands();
      for (let i = b * batch; i < Math.min(n, (b + 1) * batch); i++) wakes.notify(`node-${i}`, 5, 'deployment');
      const out: ToWorker = { t: 'batch', words: wakes.take() };
      c.send(out);
    }
    const go: ChildGo = { t: 'go', n, batch };
    c.send(go);
  });
  const wallMs = performance.now() - t0;
  const u = process.cpuUsage(start);
  c.kill();
  const per = (us: number): string => `${(us / n).toFixed(1)} µs`;
  process.stdout.write(
    `IPC hop for ${n} agents in batches of ${batch} (${body.length}-byte bodies): main ${per(u.user + u.system)}, worker ${per(childCpuUs)}, both ${per(u.user + u.system + childCpuUs)} of CPU per agent; wall ${wallMs.toFixed(0)} ms\n`,
  );
}

if (process.argv.includes('--child')) child();
else if (!HERALD_NODE_FLAGS.every((f) => process.execArgv.includes(f))) {
  // both ends run with the flags the controller's processes have (the main process's young generation too)
  const again = spawnSync(process.execPath, [...HERALD_NODE_FLAGS, ...process.argv.slice(1)], { stdio: 'inherit' });
  process.exitCode = again.status ?? 1;
} else await main();
