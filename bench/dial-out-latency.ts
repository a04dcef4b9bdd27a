/**
 * PATCH → hook started, one node, back to back, in listener mode and in dial-out mode side by
 * side (docs/dial-out.md): one `herald controller` with a connect listener and two `herald agent`
 * processes, one listening (the controller dials it), one dialling out and listening on nothing;
 * each its own deployment of the latency bench's hook (bench/latency.ts: its first command makes
 * a marker file, whose inotify event is the moment taken).
 *
 * Each change is sent the moment the previous one of its node is COMPLETE, as in the latency
 * bench's one-node part. The changes go in blocks of LATENCY_BLOCK to one node, the blocks
 * alternating between the two nodes, so that both modes share every minute of the machine (its
 * speed moves within minutes, and other work shares it). Cold (each agent's first deployment)
 * and where the time goes (from the agents' own log lines) are kept per mode too.
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { breakdown, HOOK, waitComplete, waitConnected, watchMarks, type LatencyResult } from './latency.js';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc } from './procs.js';
import { dist, type Dist, nowMs, round, roundDist, say } from './util.js';

/** Changes sent back to back to one node before the other node's turn. */
export const LATENCY_BLOCK = 10;

export interface ModeLatency {
  samples: number;
  /** PATCH sent → the hook's first command ran. */
  hookStartMs: Dist;
  /** PATCH sent → the deployment COMPLETE in the API (hook run, signal, commit). */
  completeMs: Dist;
  samplesMs: number[];
  /** The agent's first deployment (POST → hook started): the hook runner loads lazily. */
  coldHookStartMs: number;
  breakdown: LatencyResult['push']['breakdown'];
}

export interface DialOutLatency {
  listener: ModeLatency;
  dialOut: ModeLatency;
  block: number;
  problems: string[];
}

export interface DialOutLatencyOptions {
  pki: BenchPki;
  runDir: string;
  /** The API at `port`, the connect listener at `port + 1`. */
  port: number;
  /** Changes per mode. */
  count: number;
}

type Mode = 'listener' | 'dialOut';

export async function dialOutLatencyPhase(o: DialOutLatencyOptions): Promise<DialOutLatency> {
  const dir = path.join(o.runDir, 'latency-dial-out');
  fs.rmSync(dir, { recursive: true, force: true });
  const markDir = path.join(dir, 'marks');
  fs.mkdirSync(markDir, { recursive: true });
  const problems: string[] = [];
  const connectPort = o.port + 1;
  const ctl = await startController({
    pki: o.pki,
    dir,
    port: o.port,
    extra: ['--connect-listen', `127.0.0.1:${connectPort}`],
  });
  const { waitMark, close: closeMarks } = watchMarks(markDir);
  const modes: Mode[] = ['listener', 'dialOut'];
  const slots = { listener: slot('l', 1), dialOut: slot('l', 2) };
  const logOf = (m: Mode): string => path.join(dir, `agent-${m}.log`);
  const procs: ChildProcess[] = modes.map((m) =>
    startAgentProc({
      pki: o.pki,
      node: slots[m].node,
      controllerUrl: ctl.url,
      listen: m === 'listener' ? `${slots[m].ip}:${slots[m].port}` : null,
      ...(m === 'dialOut' ? { dialOut: `wss://127.0.0.1:${connectPort}/v1/connect` } : {}),
      stateDir: path.join(dir, `state-${m}`),
      logFile: logOf(m),
    }),
  );
  const empty = (): ModeLatency => ({
    samples: 0,
    hookStartMs: dist([]),
    completeMs: dist([]),
    samplesMs: [],
    coldHookStartMs: Number.NaN,
    breakdown: null,
  });
  const out: DialOutLatency = { listener: empty(), dialOut: empty(), block: LATENCY_BLOCK, problems };
  try {
    const cfg = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'latency',
      group: 'script',
      config: HOOK,
      inputs: [
        { name: 'mark_dir', type: 'String' },
        { name: 'mark', type: 'String' },
      ],
    });
    for (const m of modes) await waitConnected(ctl, slots[m].node, 30_000);
    const deps = {} as Record<Mode, { id: string; revision: number }>;
    for (const m of modes) {
      const t0 = nowMs();
      deps[m] = await ctl.op.must<{ id: string; revision: number }>(201, 'POST', '/v1/deployments', {
        node: slots[m].node,
        config_id: cfg.id,
        action: 'CREATE',
        input_values: { mark_dir: markDir, mark: `cold-${m}` },
      });
      out[m].coldHookStartMs = round((await waitMark(`cold-${m}`, 15_000)) - t0, 2);
      await waitComplete(ctl, deps[m].id, deps[m].revision, 15_000);
    }
    const hook: Record<Mode, number[]> = { listener: [], dialOut: [] };
    const complete: Record<Mode, number[]> = { listener: [], dialOut: [] };
    const changes: Record<Mode, Array<{ agent: number; revision: number; t0: number; hook: number }>> = {
      listener: [],
      dialOut: [],
    };
    for (let k = 0; k < o.count; k += LATENCY_BLOCK)
      for (const m of modes)
        for (let j = k; j < Math.min(o.count, k + LATENCY_BLOCK); j++) {
          const dep = deps[m];
          const mark = `${m}-${j}`;
          const t0 = nowMs();
          const r = await ctl.op.must<{ revision: number }>(200, 'PATCH', `/v1/deployments/${dep.id}`, {
            input_values: { mark },
          });
          dep.revision = r.revision;
          const th = await waitMark(mark, 15_000).catch((err: Error) => {
            problems.push(`${m}: ${err.message}`);
            return Number.NaN;
          });
          if (Number.isFinite(th)) hook[m].push(th - t0);
          changes[m].push({ agent: 0, revision: r.revision, t0, hook: th });
          await waitComplete(ctl, dep.id, dep.revision, 15_000).catch((err: Error) => problems.push(err.message));
          complete[m].push(nowMs() - t0);
        }
    for (const m of modes) {
      Object.assign(out[m], {
        samples: hook[m].length,
        hookStartMs: roundDist(dist(hook[m])),
        completeMs: roundDist(dist(complete[m])),
        samplesMs: hook[m].map((x) => round(x, 3)),
        breakdown: breakdown(changes[m], [logOf(m)]),
      });
      say(
        `latency (${m}): ${hook[m].length} changes back to back to one node, hook started p50 ${out[m].hookStartMs.p50} ms, p99 ${out[m].hookStartMs.p99} ms; cold ${out[m].coldHookStartMs} ms`,
      );
      if (hook[m].length < o.count) problems.push(`${m}: only ${hook[m].length} of ${o.count} changes measured`);
    }
  } catch (err) {
    problems.push(`latency: ${(err as Error).message}`);
  } finally {
    closeMarks();
    for (const p of procs) await stopProc(p, 'SIGTERM', 5_000);
    await stopController(ctl);
  }
  return out;
}
