/**
 * Latency: operator `PATCH /v1/deployments/{id}` → the agent's hook process has started, with
 * real processes only (`herald controller`, `herald agent`, a `script` hook).
 *
 * The hook's first command creates a marker file (`: > "$mark_dir/m<seq>"`, a shell builtin,
 * no fork); the benchmark watches the directory and takes the time of the inotify event. So the
 * figure includes everything up to the hook's shell running its first line.
 *
 * - push: ≥ 200 changes one after another, each to one agent (each waits for the previous to be
 *   signalled COMPLETE, plus a short random pause), round-robin over 4 agents, each its own
 *   process and deployment; then 100 changes back to back to ONE node (each sent the moment the
 *   previous is COMPLETE, no pause): a fetch answering a wake-up is never rate-limited (docs/api.md),
 *   so the per-node limit must not show here;
 * - polling, push off: agents that announce an endpoint nothing listens on (the controller's
 *   dials fail), polling every 2 s; several agents in parallel, each its own deployment, so
 *   that ≥ 200 samples take ~25 s instead of 200 × 1 s;
 * - 30 s and 120 s polling: computed (the poller's ±10 % jittered interval, a change landing at
 *   a uniformly random moment, plus the measured cost after the poll), the only computed rows.
 *
 * Also here: the first change after the agent started (cold: the hook runner loads lazily), and
 * where the time goes, from the agents' own log lines (ms resolution): PATCH → wake-up
 * verified → metadata fetched → item started (state written) → hook's first line.
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc, tail, type ControllerProc } from './procs.js';
import {
  childrenOf,
  dist,
  launchersOf,
  nowMs,
  procSample,
  round,
  roundDist,
  say,
  sleep,
  waitFor,
  type Dist,
} from './util.js';

export interface LatencyResult {
  push: {
    samples: number;
    /** PATCH sent → hook's first command ran. */
    hookStartMs: Dist;
    /** PATCH sent → PATCH answered (the change is committed). */
    patchAnsweredMs: Dist;
    /** PATCH sent → deployment COMPLETE as the API shows it (includes the signal). */
    completeMs: Dist;
    /** The same figure split into runs of 50 changes: the median of the runs' p50s etc. */
    runs: Array<{ p50: number; p99: number; min: number; max: number }>;
    medianOfRunsP50: number;
    medianOfRunsP99: number;
    /** First change after the agent started: POST /v1/deployments → hook started / COMPLETE. */
    coldHookStartMs: number;
    coldCompleteMs: number;
    agents: number;
    /** Medians, ms, from the agents' log lines (ms resolution). */
    breakdown: {
      patchToWake: number;
      wakeToFetched: number;
      fetchedToItemStarted: number;
      itemStartedToHook: number;
      samples: number;
    } | null;
    /** Every sample, ms, in the order taken. */
    samplesMs: number[];
    /**
     * Back to back to ONE node: each change sent the moment the previous one is COMPLETE in the
     * API, no pause (what an operator's script does; a fetch that answers a wake-up is never
     * rate-limited, docs/api.md).
     */
    oneNode: { samples: number; hookStartMs: Dist; completeMs: Dist; samplesMs: number[] };
  };
  polling2s: {
    agents: number;
    samples: number;
    hookStartMs: Dist;
    runs: Array<{ p50: number; p99: number; min: number; max: number }>;
    /** The model used for 30 s / 120 s, applied to 2 s, to check it against the measurement. */
    modelP50Ms: number;
    modelP99Ms: number;
    samplesMs: number[];
  };
  expected: Array<{ intervalS: number; p50Ms: number; p99Ms: number; meanMs: number; maxMs: number }>;
  problems: string[];
}

export interface LatencyOptions {
  pki: BenchPki;
  runDir: string;
  port: number;
  quick: boolean;
  pushWorkers?: number | undefined;
  /** Node flags for the controller and the push agents (--profile: the preload). */
  profArgs?: string[];
  /**
   * `push` (needs a quiet machine: main.ts runs it last) or `poll` (seconds-scale, insensitive
   * to load: main.ts runs it in a child process beside the fan-out).
   */
  part: 'push' | 'poll';
}

export const HOOK = '#!/bin/sh\n: > "$mark_dir/$mark"\n';
/** How often the bench looks for COMPLETE: with each change's PATCH, under the operator's rate limit. */
const COMPLETE_POLL_MS = 15;

export async function latencyPhase(
  o: LatencyOptions,
): Promise<{ result: LatencyResult; afterHooksRssKb: number; launcherRssKb: number }> {
  const dir = path.join(o.runDir, `latency-${o.part}`);
  fs.mkdirSync(dir, { recursive: true });
  const markDir = path.join(dir, 'marks');
  fs.mkdirSync(markDir, { recursive: true });
  const problems: string[] = [];
  const ctl = await startController({
    pki: o.pki,
    dir,
    port: o.port,
    pushWorkers: o.pushWorkers,
    nodeArgs: o.profArgs,
  });
  const { waitMark, close: closeMarks } = watchMarks(markDir);
  const procs: ChildProcess[] = [];
  const cfg = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
    name: 'latency',
    group: 'script',
    config: HOOK,
    inputs: [
      { name: 'mark_dir', type: 'String' },
      { name: 'mark', type: 'String' },
    ],
  });

  // ---- push: changes round-robin over a few agents, one change in flight at a time -----
  const PUSH_AGENTS = 4;
  const pushSlots = o.part === 'push' ? Array.from({ length: PUSH_AGENTS }, (_, i) => slot('l', 1 + i)) : [];
  const pushProcs = pushSlots.map((a, i) => {
    const p = startAgentProc({
      pki: o.pki,
      node: a.node,
      controllerUrl: ctl.url,
      listen: `${a.ip}:${a.port}`,
      stateDir: path.join(dir, `state-push-${i}`),
      logFile: path.join(dir, `agent-push-${i}.log`),
      nodeArgs: o.profArgs,
    });
    procs.push(p);
    return p;
  });
  const result: LatencyResult = {
    push: {
      samples: 0,
      hookStartMs: dist([]),
      patchAnsweredMs: dist([]),
      completeMs: dist([]),
      runs: [],
      medianOfRunsP50: NaN,
      medianOfRunsP99: NaN,
      coldHookStartMs: NaN,
      coldCompleteMs: NaN,
      agents: PUSH_AGENTS,
      breakdown: null,
      samplesMs: [],
      oneNode: { samples: 0, hookStartMs: dist([]), completeMs: dist([]), samplesMs: [] },
    },
    polling2s: {
      agents: 0,
      samples: 0,
      hookStartMs: dist([]),
      runs: [],
      modelP50Ms: NaN,
      modelP99Ms: NaN,
      samplesMs: [],
    },
    expected: [],
    problems,
  };
  const hookStarts: number[] = [];
  const changes: Array<{ agent: number; revision: number; t0: number; hook: number }> = [];
  if (o.part === 'push')
    try {
      for (const a of pushSlots) await waitConnected(ctl, a.node, 30_000);
      await sleep(500);
      // cold: the first deployment an agent ever runs
      const deps: Array<{ id: string; revision: number }> = [];
      for (const [i, a] of pushSlots.entries()) {
        const t0 = nowMs();
        const dep = await ctl.op.must<{ id: string; revision: number }>(201, 'POST', '/v1/deployments', {
          node: a.node,
          config_id: cfg.id,
          action: 'CREATE',
          input_values: { mark_dir: markDir, mark: `cold${i}` },
        });
        const th = await waitMark(`cold${i}`, 15_000);
        await waitComplete(ctl, dep.id, dep.revision, 15_000);
        if (i === 0) {
          result.push.coldHookStartMs = round(th - t0, 2);
          result.push.coldCompleteMs = round(nowMs() - t0, 2);
        }
        deps.push(dep);
      }
      say(
        `latency: cold first change → hook ${result.push.coldHookStartMs} ms, COMPLETE ${result.push.coldCompleteMs} ms`,
      );

      const count = 200;
      const profiled = o.profArgs?.length ? [ctl.pid, ...childrenOf(ctl.pid), ...pushProcs.map((p) => p.pid!)] : [];
      for (const p of profiled) process.kill(p, 'SIGUSR2');
      const answered: number[] = [];
      const complete: number[] = [];
      for (let k = 1; k <= count; k++) {
        await sleep(10 + Math.random() * 20);
        const i = k % PUSH_AGENTS;
        const dep = deps[i]!;
        const mark = `p${k}`;
        const t0 = nowMs();
        const r = await ctl.op.must<{ revision: number }>(200, 'PATCH', `/v1/deployments/${dep.id}`, {
          input_values: { mark },
        });
        answered.push(nowMs() - t0);
        dep.revision = r.revision;
        const th = await waitMark(mark, 15_000).catch((err: Error) => {
          problems.push(err.message);
          return NaN;
        });
        hookStarts.push(th - t0);
        changes.push({ agent: i, revision: r.revision, t0, hook: th });
        await waitComplete(ctl, dep.id, dep.revision, 15_000).catch((err: Error) => problems.push(err.message));
        complete.push(nowMs() - t0);
      }
      // back to back to one node: the next change leaves the moment the last is COMPLETE
      const oneCount = o.quick ? 50 : 100;
      const one = deps[0]!;
      const oneHook: number[] = [];
      const oneComplete: number[] = [];
      for (let k = 1; k <= oneCount; k++) {
        const mark = `b${k}`;
        const t0 = nowMs();
        const r = await ctl.op.must<{ revision: number }>(200, 'PATCH', `/v1/deployments/${one.id}`, {
          input_values: { mark },
        });
        one.revision = r.revision;
        const th = await waitMark(mark, 15_000).catch((err: Error) => {
          problems.push(`one node: ${err.message}`);
          return NaN;
        });
        if (Number.isFinite(th)) oneHook.push(th - t0);
        await waitComplete(ctl, one.id, one.revision, 15_000).catch((err: Error) => problems.push(err.message));
        oneComplete.push(nowMs() - t0);
      }
      result.push.oneNode = {
        samples: oneHook.length,
        hookStartMs: roundDist(dist(oneHook)),
        completeMs: roundDist(dist(oneComplete)),
        samplesMs: oneHook.map((x) => round(x, 3)),
      };
      say(
        `latency push, one node back to back: ${oneHook.length} changes, hook started p50 ${result.push.oneNode.hookStartMs.p50} ms, p99 ${result.push.oneNode.hookStartMs.p99} ms`,
      );
      for (const p of profiled) process.kill(p, 'SIGUSR2');
      const ok = hookStarts.filter(Number.isFinite);
      result.push.samples = ok.length;
      result.push.samplesMs = ok.map((x) => round(x, 3));
      result.push.hookStartMs = roundDist(dist(ok));
      result.push.patchAnsweredMs = roundDist(dist(answered));
      result.push.completeMs = roundDist(dist(complete));
      result.push.runs = chunks(ok, 50).map((c) => {
        const d = dist(c);
        return { p50: round(d.p50, 2), p99: round(d.p99, 2), min: round(d.min, 2), max: round(d.max, 2) };
      });
      result.push.medianOfRunsP50 = round(medianOf(result.push.runs.map((r) => r.p50)), 2);
      result.push.medianOfRunsP99 = round(medianOf(result.push.runs.map((r) => r.p99)), 2);
      result.push.breakdown = breakdown(
        changes,
        pushSlots.map((_, i) => path.join(dir, `agent-push-${i}.log`)),
      );
      say(
        `latency push: ${ok.length} changes, hook started p50 ${result.push.hookStartMs.p50} ms, p99 ${result.push.hookStartMs.p99} ms`,
      );
    } catch (err) {
      problems.push(`push latency: ${(err as Error).message}`);
      say(tail(path.join(dir, 'agent-push-0.log')));
    }

  // ---- polling at 2 s, push off ----------------------------------------------------------
  const pollAgents = o.quick ? 20 : 20;
  const perAgent = o.quick ? 5 : 12;
  const pollLat: number[] = [];
  const pollProcs: ChildProcess[] = [];
  if (o.part === 'poll')
    try {
      const deps: Array<{ node: string; id: string }> = [];
      for (let i = 0; i < pollAgents; i++) {
        const s = slot('l', 10 + i);
        // the advertised port has no listener: the controller's dials fail, the agent polls
        const p = startAgentProc({
          pki: o.pki,
          node: s.node,
          controllerUrl: ctl.url,
          listen: `${s.ip}:${s.port}`,
          advertise: `${s.ip}:1`,
          stateDir: path.join(dir, `state-poll-${i}`),
          logFile: path.join(dir, `agent-poll-${i}.log`),
          extra: ['--poll-interval', '2s'],
        });
        pollProcs.push(p);
        procs.push(p);
      }
      for (let i = 0; i < pollAgents; i++) {
        const s = slot('l', 10 + i);
        await waitFor(
          `poll agent ${s.node} announced`,
          async () => {
            const r = await ctl.op.request<{ endpoint?: string }>('GET', `/v1/nodes/${s.node}`);
            return r.status === 200 && typeof r.json?.endpoint === 'string';
          },
          30_000,
          100,
        );
        const d = await ctl.op.must<{ id: string; revision: number }>(201, 'POST', '/v1/deployments', {
          node: s.node,
          config_id: cfg.id,
          action: 'CREATE',
          input_values: { mark_dir: markDir, mark: `q${i}-0` },
        });
        deps.push({ node: s.node, id: d.id });
      }
      // the creations above are picked up by a poll; wait for all before measuring
      await Promise.all(deps.map((_, i) => waitMark(`q${i}-0`, 15_000)));
      await sleep(500);
      say(`latency polling: ${pollAgents} agents × ${perAgent} changes at 2 s`);
      await Promise.all(
        deps.map(async (d, i) => {
          await sleep(Math.random() * 2_000);
          for (let k = 1; k <= perAgent; k++) {
            const mark = `q${i}-${k}`;
            const t0 = nowMs();
            await ctl.op.must(200, 'PATCH', `/v1/deployments/${d.id}`, { input_values: { mark } });
            const th = await waitMark(mark, 15_000).catch((err: Error) => {
              problems.push(err.message);
              return NaN;
            });
            if (Number.isFinite(th)) pollLat.push(th - t0);
            // a random pause, so the next change lands at a random phase of the poll cycle
            await sleep(200 + Math.random() * 400);
          }
        }),
      );
      result.polling2s.agents = pollAgents;
      result.polling2s.samples = pollLat.length;
      result.polling2s.hookStartMs = roundDist(dist(pollLat));
      result.polling2s.samplesMs = pollLat.map((x) => round(x, 1));
      result.polling2s.runs = chunks(pollLat, 50).map((c) => {
        const d = dist(c);
        return { p50: round(d.p50, 1), p99: round(d.p99, 1), min: round(d.min, 1), max: round(d.max, 1) };
      });
      say(`latency polling 2 s: ${pollLat.length} changes, p50 ${result.polling2s.hookStartMs.p50} ms`);
    } catch (err) {
      problems.push(`polling latency: ${(err as Error).message}`);
    }
  for (const p of pollProcs) await stopProc(p, 'SIGTERM', 5_000);

  // ---- the computed expectations -----------------------------------------------------------
  if (o.part === 'push') {
    const after = hookStarts.filter(Number.isFinite);
    const model = (intervalS: number): { p50Ms: number; p99Ms: number; meanMs: number; maxMs: number } =>
      pollModel(intervalS * 1000, after);
    const m2 = model(2);
    result.polling2s.modelP50Ms = round(m2.p50Ms, 1);
    result.polling2s.modelP99Ms = round(m2.p99Ms, 1);
    result.expected = [30, 120].map((s) => ({ intervalS: s, ...mapRound(model(s)) }));
    if (result.push.samples < 200) problems.push(`only ${result.push.samples} push changes measured`);
  }

  const agentPid = pushProcs[0]?.pid;
  const afterHooks = agentPid ? procSample(agentPid) : null;
  // its hook launcher, beside it for HOOK_LAUNCHER_IDLE_CLOSE_MS after the last hook
  const launcher = agentPid ? launchersOf([agentPid])[0] : undefined;
  const launcherRss = launcher === undefined ? null : procSample(launcher);
  closeMarks();
  for (const p of procs) await stopProc(p, 'SIGTERM', 5_000);
  await stopController(ctl);
  return { result, afterHooksRssKb: afterHooks?.rssKb ?? NaN, launcherRssKb: launcherRss?.rssKb ?? NaN };
}

/**
 * Watches `markDir` for the hooks' marker files: `waitMark(name, ms)` resolves with the moment
 * (epoch ms) file `name` appeared (the inotify event's), at once when it has already.
 */
export function watchMarks(markDir: string): {
  waitMark: (name: string, ms: number) => Promise<number>;
  close: () => void;
} {
  const marks = new Map<string, number>();
  const waiters = new Map<string, (t: number) => void>();
  const watcher = fs.watch(markDir, (_ev, f) => {
    const t = nowMs();
    if (!f || marks.has(f)) return;
    marks.set(f, t);
    waiters.get(f)?.(t);
  });
  const waitMark = (name: string, ms: number): Promise<number> => {
    const have = marks.get(name);
    if (have !== undefined) return Promise.resolve(have);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => {
        waiters.delete(name);
        reject(new Error(`hook ${name} did not start within ${ms} ms`));
      }, ms);
      waiters.set(name, (x) => {
        clearTimeout(t);
        waiters.delete(name);
        resolve(x);
      });
    });
  };
  return { waitMark, close: () => watcher.close() };
}

/**
 * Where the time of each change went, from the agents' own log lines (pino, ms): the wake-up,
 * the fetch, the item's start (after its state write) before the hook's first line.
 */
export function breakdown(
  changes: Array<{ agent: number; revision: number; t0: number; hook: number }>,
  logs: string[],
): LatencyResult['push']['breakdown'] {
  const lines = logs.map((f) => {
    try {
      return fs
        .readFileSync(f, 'utf8')
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { time: number; msg: string; revision?: number });
    } catch {
      return [];
    }
  });
  const a: number[] = [];
  const b: number[] = [];
  const c: number[] = [];
  const d: number[] = [];
  for (const ch of changes) {
    const ls = lines[ch.agent] ?? [];
    const i = ls.findIndex((l) => l.msg === 'deployment item started' && l.revision === ch.revision);
    if (i < 0) continue;
    let f = -1;
    for (let j = i - 1; j >= 0; j--)
      if (ls[j]!.msg === 'metadata fetched') {
        f = j;
        break;
      }
    let w = -1;
    for (let j = f - 1; j >= 0; j--)
      if (ls[j]!.msg === 'wake-up') {
        w = j;
        break;
      }
    if (f < 0 || w < 0 || !Number.isFinite(ch.hook)) continue;
    a.push(ls[w]!.time - ch.t0);
    b.push(ls[f]!.time - ls[w]!.time);
    c.push(ls[i]!.time - ls[f]!.time);
    d.push(ch.hook - ls[i]!.time);
  }
  if (a.length === 0) return null;
  const md = (xs: number[]): number => round(dist(xs).p50, 1);
  return {
    patchToWake: md(a),
    wakeToFetched: md(b),
    fetchedToItemStarted: md(c),
    itemStartedToHook: md(d),
    samples: a.length,
  };
}

export async function waitConnected(ctl: ControllerProc, node: string, ms: number): Promise<void> {
  await waitFor(
    `agent ${node} push-connected`,
    async () => {
      const r = await ctl.op.request<{ push?: { connected?: boolean } }>('GET', `/v1/nodes/${node}`);
      return r.status === 200 && r.json?.push?.connected === true;
    },
    ms,
    20,
  );
}

export async function waitComplete(ctl: ControllerProc, id: string, revision: number, ms: number): Promise<void> {
  await waitFor(
    `deployment ${id} revision ${revision} COMPLETE`,
    async () => {
      const r = await ctl.op.request<{ revision?: number; status?: string }>('GET', `/v1/deployments/${id}`);
      if (r.json?.status === 'FAILED') throw new Error(`deployment FAILED: ${r.raw.slice(0, 200)}`);
      return r.status === 200 && r.json?.revision === revision && r.json?.status === 'COMPLETE';
    },
    ms,
    // the operator's own API rate limit (API_RATE_PER_S) counts these GETs and the PATCHes
    COMPLETE_POLL_MS,
  );
}

/**
 * Poll latency model: the agent polls at intervals drawn uniformly from interval ±10 % (the
 * poller's jitter); a change lands at a uniformly random moment; it is seen at the next poll,
 * then costs what a push-woken change costs after the wake-up (approximated by the measured
 * push latency, resampled). Monte Carlo, 200,000 draws, fixed seed.
 */
export function pollModel(
  intervalMs: number,
  after: number[],
): { p50Ms: number; p99Ms: number; meanMs: number; maxMs: number } {
  let seed = 42;
  const rnd = (): number => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
  const tail = after.length > 0 ? after : [0];
  // a long run of jittered polls; changes at uniform random times over it
  const polls: number[] = [];
  let t = 0;
  while (t < intervalMs * 5000) {
    t += intervalMs * (0.9 + 0.2 * rnd());
    polls.push(t);
  }
  const xs: number[] = [];
  const span = polls[polls.length - 2]!;
  for (let i = 0; i < 200_000; i++) {
    const at = rnd() * span;
    let lo = 0;
    let hi = polls.length - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (polls[mid]! >= at) hi = mid;
      else lo = mid + 1;
    }
    xs.push(polls[lo]! - at + tail[Math.floor(rnd() * tail.length)]!);
  }
  const d = dist(xs);
  return { p50Ms: d.p50, p99Ms: d.p99, meanMs: d.mean, maxMs: d.max };
}

function chunks<T>(xs: T[], n: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < xs.length; i += n) out.push(xs.slice(i, i + n));
  return out.filter((c) => c.length >= Math.min(n, xs.length));
}

function medianOf(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

function mapRound<T extends Record<string, number>>(o: T): T {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, round(v, 0)])) as T;
}
