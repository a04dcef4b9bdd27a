/**
 * Restart: a 100-node cluster restart with trivial scripts, `PATCH
 * /v1/clusters/{id}/actions/restart` → the cluster reads `RESTART_COMPLETE` (polled every
 * 10 ms). The agents are harness agents (the agent's own modules) with the REAL hook runner
 * (`agent/hooks/run-item.ts`): every step spawns a real `/bin/sh` script, 200 per restart,
 * ten agents per harness process.
 */
import fs from 'node:fs';
import path from 'node:path';
import { agentStateRoot } from './fanout.js';
import { metricSum } from './api-client.js';
import { Fleet } from './fleet.js';
import { slot, type BenchPki } from './pki-cache.js';
import { startController, stopController } from './procs.js';
import { childrenOf, dist, nowMs, round, say, sleep, treeSample, waitFor, type Dist } from './util.js';

/** Harness processes for the restart's agents (see restartPhase). */
export const RESTART_HARNESS_PROCS = 10;

export interface RestartResult {
  nodes: number;
  /** `real`: agent/hooks/run-item.ts spawning /bin/sh; `noop`: the result returned at once. */
  runner: 'real' | 'noop';
  createMs: number;
  runs: Array<{ ms: number; controllerCpuS: number; status: string }>;
  restartMs: Dist;
  medianMs: number;
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
}

export async function restartPhase(o: RestartOptions): Promise<RestartResult> {
  const n = o.nodes ?? 100;
  const dir = path.join(o.runDir, `restart-${n}-${o.runner}`);
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
  const stateRoot = agentStateRoot(o.runDir, `restart-${o.runner}`);
  fs.rmSync(stateRoot, { recursive: true, force: true });
  const result: RestartResult = {
    nodes: n,
    runner: o.runner,
    createMs: NaN,
    runs: [],
    restartMs: dist([]),
    medianMs: NaN,
    problems,
  };
  // the real hook runner spawns a process per step, and spawn() costs a Node process ~10 ms of
  // page-table copying here, more the larger it is: small harness processes, so that 200 spawns
  // per restart do not queue in one process as they never would on 100 machines
  const { fleet, failed } = await Fleet.start({
    pki: o.pki,
    slots,
    controllerUrl: ctl.url,
    stateRoot,
    hook: o.runner,
    procs: RESTART_HARNESS_PROCS,
    execArgv: o.profArgs,
  });
  try {
    if (failed.length) problems.push(`${failed.length} agents failed to start`);
    await waitFor(
      `${n} agents connected`,
      async () => metricSum(await ctl.op.metrics(), 'herald_push_connected_agents') >= n,
      60_000,
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
    let t0 = nowMs();
    const cl = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/clusters', {
      name: 'bench',
      nodes: slots.map((s) => s.node),
      install_config_id: install.id,
      uninstall_config_id: uninstall.id,
    });
    await waitStatus(ctl.op, cl.id, 'CREATE_COMPLETE', 60_000);
    result.createMs = round(nowMs() - t0, 1);
    const profiled = o.profArgs?.length ? [ctl.pid, ...childrenOf(ctl.pid), ...fleet.pids()] : [];
    for (let r = 1; r <= o.runs; r++) {
      await sleep(500);
      if (r === o.runs) for (const p of profiled) process.kill(p, 'SIGUSR2');
      const cpu0 = treeSample(ctl.pid).cpuS;
      t0 = nowMs();
      const res = await ctl.op.request('PATCH', `/v1/clusters/${cl.id}/actions/restart`);
      if (res.status !== 204) throw new Error(`restart → ${res.status} ${res.raw.slice(0, 200)}`);
      const status = await waitStatus(ctl.op, cl.id, 'RESTART_COMPLETE', 60_000).catch((err: Error) => {
        problems.push(err.message);
        return 'TIMEOUT';
      });
      const ms = nowMs() - t0;
      result.runs.push({ ms: round(ms, 1), controllerCpuS: round(treeSample(ctl.pid).cpuS - cpu0, 2), status });
      if (r === o.runs) for (const p of profiled) process.kill(p, 'SIGUSR2');
      say(`restart ${n} nodes (${o.runner} hooks) run ${r}: ${round(ms, 0)} ms (${status})`);
    }
    const ok = result.runs.filter((r) => r.status === 'RESTART_COMPLETE').map((r) => r.ms);
    result.restartMs = dist(ok);
    result.medianMs = round(dist(ok).p50, 1);
    if (ok.length !== o.runs) problems.push(`${o.runs - ok.length} restart(s) did not complete`);
  } catch (err) {
    problems.push((err as Error).message);
  } finally {
    if (o.profArgs?.length) await sleep(2_000);
    await stopController(ctl, 'SIGKILL');
    await fleet.stop();
  }
  fs.rmSync(stateRoot, { recursive: true, force: true });
  return result;
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
