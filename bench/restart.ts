/**
 * Restart: a 100-node cluster restart with trivial scripts, `PATCH
 * /v1/clusters/{id}/actions/restart` → the cluster reads `RESTART_COMPLETE` (polled every
 * 10 ms); with `upgradeRuns`, then upgrades of the same cluster in the same run, `PATCH
 * /v1/clusters/{id}` with another install config → `UPDATE_COMPLETE`. The agents are either harness agents (the agent's own modules, ten per harness
 * process) or 100 real `herald agent` processes as `bin/herald` starts them, one per node. With
 * the real hook runner (`agent/hooks/run-item.ts`) every step spawns a real `/bin/sh` script, 200
 * per restart; with the no-op runner (harness agents only) the result comes back at once, so the
 * figure is Herald's own orchestration. All of it shares this machine's two cores.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { agentStateRoot } from './fanout.js';
import { metricSum } from './api-client.js';
import { Fleet } from './fleet.js';
import { slot, type BenchPki } from './pki-cache.js';
import { startAgentProc, startController, stopController, stopProc } from './procs.js';
import {
  childrenOf,
  dist,
  launchersOf,
  nowMs,
  procSample,
  round,
  say,
  sleep,
  treeSample,
  waitFor,
  type Dist,
} from './util.js';

/** Harness processes for the no-op restart's agents (see restartPhase). */
export const RESTART_HARNESS_PROCS = 10;
/** How long 100 real agent processes may take to start and be dialled (on two cores). */
const RESTART_AGENTS_CONNECT_TIMEOUT_MS = 180_000;

export interface RestartResult {
  nodes: number;
  /** `real`: agent/hooks/run-item.ts spawning /bin/sh; `noop`: the result returned at once. */
  runner: 'real' | 'noop';
  /** `processes`: one `herald agent` process per node; `harness`: the agent's modules, many per process. */
  agents?: 'processes' | 'harness';
  createMs: number;
  /**
   * `agentsCpuS`: the agent processes' own CPU and their hook launchers' (not their hooks'); absent
   * in older results (before 2026-12-06 08:20 UTC the agents forked the hooks themselves).
   */
  runs: Array<{ ms: number; controllerCpuS: number; agentsCpuS?: number; status: string }>;
  restartMs: Dist;
  medianMs: number;
  /**
   * Upgrades of the same cluster after its restarts (docs/api.md "Upgrades"), each to a new
   * revision whose install config differs: on each node the uninstall, then the install of the
   * new config (deploy_action UPDATE), as many hook runs as a restart. Absent before 2026-12-08.
   */
  upgrades?: {
    runs: Array<{ ms: number; controllerCpuS: number; agentsCpuS?: number; status: string }>;
    ms: Dist;
    medianMs: number;
  };
  problems: string[];
}

export interface RestartOptions {
  pki: BenchPki;
  runDir: string;
  port: number;
  runs: number;
  pushWorkers?: number | undefined;
  nodes?: number;
  profArgs?: string[];
  runner: 'real' | 'noop';
  /** `harness` (default) or `processes`: one `herald agent` process per node (real hooks only). */
  agents?: 'processes' | 'harness';
  /** Upgrades after the restarts, in the same run (default none). */
  upgradeRuns?: number;
}

export async function restartPhase(o: RestartOptions): Promise<RestartResult> {
  const n = o.nodes ?? 100;
  const agents = o.agents ?? 'harness';
  if (agents === 'processes' && o.runner !== 'real') throw new Error('a `herald agent` process runs real hooks only');
  const dir = path.join(o.runDir, `restart-${n}-${o.runner}-${agents}`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const problems: string[] = [];
  const ctl = await startController({
    pki: o.pki,
    dir,
    port: o.port,
    pushWorkers: o.pushWorkers,
    nodeArgs: o.profArgs,
  });
  const slots = Array.from({ length: n }, (_, i) => slot('b', i));
  const stateRoot = agentStateRoot(o.runDir, `restart-${o.runner}-${agents}`);
  fs.rmSync(stateRoot, { recursive: true, force: true });
  const result: RestartResult = {
    nodes: n,
    runner: o.runner,
    agents,
    createMs: NaN,
    runs: [],
    restartMs: dist([]),
    medianMs: NaN,
    problems,
  };
  let fleet: Fleet | null = null;
  const procs: ChildProcess[] = [];
  if (agents === 'harness') {
    const started = await Fleet.start({
      pki: o.pki,
      slots,
      controllerUrl: ctl.url,
      stateRoot,
      hook: o.runner,
      procs: RESTART_HARNESS_PROCS,
      execArgv: o.profArgs,
    });
    fleet = started.fleet;
    if (started.failed.length) problems.push(`${started.failed.length} agents failed to start`);
  } else {
    fs.mkdirSync(stateRoot, { recursive: true });
    for (const s of slots)
      procs.push(
        startAgentProc({
          pki: o.pki,
          node: s.node,
          controllerUrl: ctl.url,
          listen: `${s.ip}:${s.port}`,
          stateDir: path.join(stateRoot, s.node),
          logFile: path.join(dir, `agent-${s.node}.log`),
          nodeArgs: o.profArgs,
        }),
      );
  }
  try {
    await waitFor(
      `${n} agents connected`,
      async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n,
      RESTART_AGENTS_CONNECT_TIMEOUT_MS,
      100,
    );
    const script = '#!/bin/sh\ntrue\n';
    const install = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'install',
      group: 'script',
      config: script,
    });
    const uninstall = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'uninstall',
      group: 'script',
      config: script,
    });
    // an upgrade alternates between the install config and this one: a new revision each time
    const install2 = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'install-next',
      group: 'script',
      config: script,
    });
    let t0 = nowMs();
    const cl = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/clusters', {
      name: 'bench',
      nodes: slots.map((s) => s.node),
      install_config_id: install.id,
      uninstall_config_id: uninstall.id,
    });
    await waitStatus(ctl.op, cl.id, 'CREATE_COMPLETE', 60_000);
    result.createMs = round(nowMs() - t0, 1);
    const agentPids = fleet ? fleet.pids() : procs.flatMap((p) => (p.pid === undefined ? [] : [p.pid]));
    const profiled = o.profArgs?.length ? [ctl.pid, ...childrenOf(ctl.pid), ...agentPids] : [];
    for (let r = 1; r <= o.runs; r++) {
      await sleep(500);
      if (r === o.runs) for (const p of profiled) process.kill(p, 'SIGUSR2');
      const cpu0 = treeSample(ctl.pid).cpuS;
      // the agents' hook launchers start their hooks: their own CPU is the agents' (the hooks' is not)
      const counted = [...agentPids, ...launchersOf(agentPids)];
      const agentsCpu0 = agentsCpu(counted);
      t0 = nowMs();
      const res = await ctl.op.request('PATCH', `/v1/clusters/${cl.id}/actions/restart`);
      if (res.status !== 204) throw new Error(`restart → ${res.status} ${res.raw.slice(0, 200)}`);
      const status = await waitStatus(ctl.op, cl.id, 'RESTART_COMPLETE', 60_000).catch((err: Error) => {
        problems.push(err.message);
        return 'TIMEOUT';
      });
      const ms = nowMs() - t0;
      const agentsCpuS = round(agentsCpu(counted) - agentsCpu0, 2);
      result.runs.push({
        ms: round(ms, 1),
        controllerCpuS: round(treeSample(ctl.pid).cpuS - cpu0, 2),
        agentsCpuS,
        status,
      });
      if (r === o.runs) for (const p of profiled) process.kill(p, 'SIGUSR2');
      say(
        `restart ${n} nodes (${o.runner} hooks, ${agents}) run ${r}: ${round(ms, 0)} ms (${status}); CPU: controller ${result.runs.at(-1)!.controllerCpuS} s, agents ${agentsCpuS} s`,
      );
    }
    const ok = result.runs.filter((r) => r.status === 'RESTART_COMPLETE').map((r) => r.ms);
    result.restartMs = dist(ok);
    result.medianMs = round(dist(ok).p50, 1);
    if (ok.length !== o.runs) problems.push(`${o.runs - ok.length} restart(s) did not complete`);
    if (o.upgradeRuns) {
      const counted = [...agentPids, ...launchersOf(agentPids)];
      const runs: NonNullable<RestartResult['upgrades']>['runs'] = [];
      for (let u = 1; u <= o.upgradeRuns; u++) {
        await sleep(500);
        const cpu0 = treeSample(ctl.pid).cpuS;
        const agentsCpu0 = agentsCpu(counted);
        t0 = nowMs();
        const res = await ctl.op.request('PATCH', `/v1/clusters/${cl.id}`, {
          install_config_id: u % 2 === 1 ? install2.id : install.id,
        });
        if (res.status !== 202) throw new Error(`upgrade → ${res.status} ${res.raw.slice(0, 200)}`);
        const status = await waitStatus(ctl.op, cl.id, 'UPDATE_COMPLETE', 60_000).catch((err: Error) => {
          problems.push(err.message);
          return 'TIMEOUT';
        });
        const ms = nowMs() - t0;
        const agentsCpuS = round(agentsCpu(counted) - agentsCpu0, 2);
        runs.push({ ms: round(ms, 1), controllerCpuS: round(treeSample(ctl.pid).cpuS - cpu0, 2), agentsCpuS, status });
        say(
          `upgrade ${n} nodes (${o.runner} hooks, ${agents}) run ${u}: ${round(ms, 0)} ms (${status}); CPU: controller ${runs.at(-1)!.controllerCpuS} s, agents ${agentsCpuS} s`,
        );
      }
      const done = runs.filter((r) => r.status === 'UPDATE_COMPLETE').map((r) => r.ms);
      result.upgrades = { runs, ms: dist(done), medianMs: round(dist(done).p50, 1) };
      if (done.length !== o.upgradeRuns) problems.push(`${o.upgradeRuns - done.length} upgrade(s) did not complete`);
    }
  } catch (err) {
    problems.push((err as Error).message);
  } finally {
    if (o.profArgs?.length) await sleep(2_000);
    await stopController(ctl, 'SIGKILL');
    await fleet?.stop();
    await Promise.all(procs.map((p) => stopProc(p)));
  }
  fs.rmSync(stateRoot, { recursive: true, force: true });
  return result;
}

/** The agent processes' own CPU, seconds (their hooks, reaped by then, are not counted). */
function agentsCpu(pids: number[]): number {
  return pids.reduce((a, p) => {
    const x = procSample(p);
    return a + (x ? (x.cpuPreciseS ?? x.cpuS) : 0);
  }, 0);
}

async function waitStatus(
  op: { request: <T>(m: string, p: string) => Promise<{ status: number; json: T }> },
  id: string,
  want: string,
  ms: number,
): Promise<string> {
  let last = '';
  await waitFor(
    `cluster ${want}`,
    async () => {
      const r = await op.request<{ status?: string }>('GET', `/v1/clusters/${id}`);
      last = r.json?.status ?? '';
      if (last.endsWith('_FAILED')) throw new Error(`cluster ${last}`);
      return last === want;
    },
    ms,
    10,
  );
  return last;
}
