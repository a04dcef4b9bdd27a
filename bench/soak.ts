/**
 * Soak (`npm run bench -- --soak [minutes]`): one `herald controller` and 4 `herald agent`
 * processes; a change every 50 ms, round-robin over the 4 nodes, for the given minutes (default
 * 9: more than 10,000 changes), without waiting for one change to finish before the next. Every
 * 5 s the resident memory of the controller's main process, its push worker(s) and each agent is
 * sampled from /proc. At the end every node must hold its last change (COMPLETE at its latest
 * revision). The figure that matters: how much each process grew from the end of the run's first
 * quarter to its end (at most 10 %).
 */
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc } from './procs.js';
import { childrenOf, nowMs, procSample, residentByKind, round, say, sleep, waitFor } from './util.js';

/** A change is sent this often. */
export const SOAK_CHANGE_INTERVAL_MS = 50;
/** Memory is sampled this often. */
export const SOAK_SAMPLE_INTERVAL_MS = 5_000;
/** Changes in flight (sent, not yet answered) before a tick is skipped rather than queued. */
const SOAK_MAX_IN_FLIGHT = 16;
const AGENTS = 4;

export interface SoakSample {
  /** Seconds since the first change. */
  atS: number;
  changes: number;
  controllerMainKb: number;
  pushWorkersKb: number;
  agentsKb: number[];
  /** The controller's main process (bench/mem-preload.ts; after a forced GC with --soak-gc): JS heap used, and memory outside it that JS objects hold (buffers). */
  controllerHeapUsedKb?: number;
  controllerExternalKb?: number;
  /** The controller's main process: resident C heap (main malloc arena, `[heap]`), from smaps. */
  controllerBrkKb?: number;
}

export interface SoakResult {
  minutes: number;
  changesSent: number;
  changesAnswered: number;
  skippedTicks: number;
  converged: boolean;
  samples: SoakSample[];
  /** Growth from the sample at the end of the first quarter to the last sample, in percent. */
  growthPct: { controllerMain: number; pushWorkers: number; agentsMax: number };
  problems: string[];
}

const HOOK = '#!/bin/sh\n: "$n"\n';

export async function soakPhase(o: {
  pki: BenchPki;
  runDir: string;
  port: number;
  minutes: number;
}): Promise<SoakResult> {
  const dir = path.join(o.runDir, 'soak');
  fs.mkdirSync(dir, { recursive: true });
  const problems: string[] = [];
  // the controller (and its push worker: fork keeps execArgv) samples its own memory after a
  // forced GC, to tell what the JS heap holds from what lies outside it
  const memDir = path.join(dir, 'mem');
  process.env.HERALD_BENCH_MEM_DIR = memDir;
  process.env.HERALD_BENCH_MEM_INTERVAL_MS = String(SOAK_SAMPLE_INTERVAL_MS);
  const ctl = await startController({
    pki: o.pki,
    dir,
    port: o.port,
    nodeArgs: ['--import', new URL('./mem-preload.js', import.meta.url).href],
  }).finally(() => {
    delete process.env.HERALD_BENCH_MEM_DIR;
    delete process.env.HERALD_BENCH_MEM_INTERVAL_MS;
  });
  const agents: ChildProcess[] = [];
  const slots = Array.from({ length: AGENTS }, (_, i) => slot('l', 40 + i));
  for (const [i, s] of slots.entries()) {
    agents.push(
      startAgentProc({
        pki: o.pki,
        node: s.node,
        controllerUrl: ctl.url,
        listen: `${s.ip}:${s.port}`,
        stateDir: path.join(dir, `state-${i}`),
        logFile: path.join(dir, `agent-${i}.log`),
      }),
    );
  }
  const result: SoakResult = {
    minutes: o.minutes,
    changesSent: 0,
    changesAnswered: 0,
    skippedTicks: 0,
    converged: false,
    samples: [],
    growthPct: { controllerMain: NaN, pushWorkers: NaN, agentsMax: NaN },
    problems,
  };
  try {
    for (const s of slots) {
      await waitFor(
        `${s.node} connected`,
        async () => {
          const r = await ctl.op.request<{ push?: { connected?: boolean } }>('GET', `/v1/nodes/${s.node}`);
          return r.status === 200 && r.json?.push?.connected === true;
        },
        30_000,
        100,
      );
    }
    const cfg = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'soak',
      group: 'script',
      config: HOOK,
      inputs: [{ name: 'n', type: 'String' }],
    });
    const deps: Array<{ id: string; revision: number }> = [];
    for (const s of slots) {
      const d = await ctl.op.must<{ id: string; revision: number }>(201, 'POST', '/v1/deployments', {
        node: s.node,
        config_id: cfg.id,
        input_values: { n: '0' },
      });
      deps.push({ id: d.id, revision: d.revision });
    }
    const t0 = nowMs();
    const endAt = t0 + o.minutes * 60_000;
    let inFlight = 0;
    let k = 0;
    const sample = (): void => {
      const workers = childrenOf(ctl.pid);
      const mem = lastMemSample(memDir, ctl.pid);
      const kinds = residentByKind(ctl.pid);
      result.samples.push({
        ...(kinds ? { controllerBrkKb: kinds.brk } : {}),
        ...(mem
          ? {
              controllerHeapUsedKb: Math.round(mem.heapUsed / 1024),
              controllerExternalKb: Math.round(mem.external / 1024),
            }
          : {}),
        atS: round((nowMs() - t0) / 1000, 1),
        changes: result.changesAnswered,
        controllerMainKb: procSample(ctl.pid)?.rssKb ?? 0,
        pushWorkersKb: workers.reduce((n, p) => n + (procSample(p)?.rssKb ?? 0), 0),
        agentsKb: agents.map((a) => procSample(a.pid!)?.rssKb ?? 0),
      });
    };
    sample();
    let nextSample = t0 + SOAK_SAMPLE_INTERVAL_MS;
    let nextTick = t0;
    while (nowMs() < endAt) {
      if (inFlight >= SOAK_MAX_IN_FLIGHT) result.skippedTicks++;
      else {
        const i = k % AGENTS;
        const dep = deps[i]!;
        const n = String(++k);
        inFlight++;
        result.changesSent++;
        void ctl.op
          .must<{ revision: number }>(200, 'PATCH', `/v1/deployments/${dep.id}`, { input_values: { n } })
          .then((r) => {
            result.changesAnswered++;
            if (r.revision > dep.revision) dep.revision = r.revision;
          })
          .catch((err: Error) => {
            if (problems.length < 10) problems.push(`PATCH: ${err.message}`);
          })
          .finally(() => inFlight--);
      }
      if (nowMs() >= nextSample) {
        sample();
        nextSample += SOAK_SAMPLE_INTERVAL_MS;
        if (result.samples.length % 12 === 0) {
          const last = result.samples.at(-1)!;
          say(
            `soak: ${last.atS} s, ${last.changes} changes; controller ${Math.round(last.controllerMainKb / 1024)} MB + workers ${Math.round(last.pushWorkersKb / 1024)} MB, agents ${last.agentsKb.map((a) => Math.round(a / 1024)).join('/')} MB`,
          );
        }
      }
      nextTick += SOAK_CHANGE_INTERVAL_MS;
      await sleep(Math.max(0, nextTick - nowMs()));
    }
    await waitFor('the last PATCHes answered', () => inFlight === 0, 30_000, 50);
    sample();
    // every node ends on its latest revision, COMPLETE
    result.converged = await waitFor(
      'every node holding its last change',
      async () => {
        for (const d of deps) {
          const r = await ctl.op.request<{ revision: number; status: string }>('GET', `/v1/deployments/${d.id}`);
          if (r.json?.revision !== d.revision || r.json?.status !== 'COMPLETE') return false;
        }
        return true;
      },
      60_000,
      200,
    ).catch((err: Error) => {
      problems.push(err.message);
      return false;
    });
    result.growthPct = growth(result.samples);
  } finally {
    for (const a of agents) await stopProc(a);
    await stopController(ctl);
  }
  return result;
}

/** The newest line bench/mem-preload.ts wrote for `pid`, or undefined. */
function lastMemSample(memDir: string, pid: number): { heapUsed: number; external: number } | undefined {
  try {
    const f = fs.readdirSync(memDir).find((n) => n.endsWith(`-${pid}.jsonl`));
    if (f === undefined) return undefined;
    const lines = fs.readFileSync(path.join(memDir, f), 'utf8').trim().split('\n');
    return JSON.parse(lines.at(-1)!) as { heapUsed: number; external: number };
  } catch {
    return undefined;
  }
}

/**
 * Percent growth of each process from window `from` to window `to` (each the highest sample in it),
 * the agents' the most of them.
 */
function growthBetween(from: SoakSample[], to: SoakSample[]): SoakResult['growthPct'] {
  const top = (xs: SoakSample[], v: (x: SoakSample) => number): number => Math.max(...xs.map(v));
  const grow = (v: (x: SoakSample) => number): number => {
    const a = top(from, v);
    return a > 0 ? round(((top(to, v) - a) / a) * 100, 1) : NaN;
  };
  return {
    controllerMain: grow((x) => x.controllerMainKb),
    pushWorkers: grow((x) => x.pushWorkersKb),
    agentsMax: Math.max(...(to[0]?.agentsKb ?? []).map((_, i) => grow((x) => x.agentsKb[i] ?? 0))),
  };
}

/** Percent growth from the sample at the end of the first quarter (by time) to the last one. */
function growth(samples: SoakSample[]): SoakResult['growthPct'] {
  const last = samples.at(-1);
  if (!last || samples.length < 4) return { controllerMain: NaN, pushWorkers: NaN, agentsMax: NaN };
  return growthBetween([samples.find((s) => s.atS >= last.atS / 4) ?? samples[0]!], [last]);
}

/** Percent growth of the highest sample of the last quarter (by time) over the highest of the first. */
export function levelGrowth(samples: SoakSample[]): SoakResult['growthPct'] {
  const last = samples.at(-1);
  if (!last || samples.length < 8) return { controllerMain: NaN, pushWorkers: NaN, agentsMax: NaN };
  return growthBetween(
    samples.filter((x) => x.atS <= last.atS / 4),
    samples.filter((x) => x.atS >= (last.atS * 3) / 4),
  );
}

/** The BENCHMARKS.md section of a soak run (kept by the main renderer; a new soak replaces it). */
export function soakMarkdown(r: SoakResult, when: Date, machine: string): string {
  const mb = (kb: number): string => (kb / 1024).toFixed(1);
  const every = Math.max(1, Math.round(r.samples.length / 16));
  const rows = r.samples
    .filter((_, i) => i % every === 0 || i === r.samples.length - 1)
    .map(
      (s) =>
        `| ${s.atS} | ${s.changes} | ${mb(s.controllerMainKb)} | ${s.controllerHeapUsedKb !== undefined ? `${mb(s.controllerHeapUsedKb)} / ${mb(s.controllerExternalKb ?? 0)}` : '– / –'} / ${s.controllerBrkKb !== undefined ? mb(s.controllerBrkKb) : '–'} | ${mb(s.pushWorkersKb)} | ${s.agentsKb.map(mb).join(' / ')} |`,
    );
  const ok = (p: number): string => (Number.isFinite(p) ? `${p} %${p <= 10 ? '' : ' (over 10 %)'}` : '–');
  // the verdict: RSS under a garbage collector is a sawtooth, and one sample may sit in a trough
  // (a soak of 2026-12-02 put one agent's quarter sample 5 MB under its neighbours')
  const level = levelGrowth(r.samples);
  return [
    '<!-- kept: soak (npm run bench -- --soak replaces this section) -->',
    '## Soak: memory over a long run of changes',
    '',
    `\`npm run bench -- --soak ${r.minutes}\` on ${when.toISOString().slice(0, 16).replace('T', ' ')} UTC; ${machine}.`,
    `One controller, 4 agents, a change every ${SOAK_CHANGE_INTERVAL_MS} ms round-robin, at most ${SOAK_MAX_IN_FLIGHT} in flight.`,
    '',
    `Changes sent ${r.changesSent}, answered ${r.changesAnswered}, ticks skipped (${SOAK_MAX_IN_FLIGHT} in flight) ${r.skippedTicks}; every node ended on its last change: ${r.converged ? 'yes' : '**no**'}.`,
    `Growth of the level (last quarter's highest sample over the first's): controller main process ${ok(level.controllerMain)}, push worker(s) ${ok(level.pushWorkers)}, agents (the most) ${ok(level.agentsMax)}.`,
    `From the one sample at the end of the first quarter to the last sample: controller main process ${ok(r.growthPct.controllerMain)}, push worker(s) ${ok(r.growthPct.pushWorkers)}, agents (the most) ${ok(r.growthPct.agentsMax)}.${r.problems.length ? ` Problems: ${r.problems.join('; ')}.` : ''}`,
    '',
    '| s | changes answered | controller main (MB) | of it: JS heap used / buffers / C heap (main arena) (MB) | push worker(s) (MB) | agents (MB) |',
    '|---|---|---|---|---|---|',
    ...rows,
    '',
  ].join('\n');
}
