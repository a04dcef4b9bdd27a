/**
 * What one deployment item costs a real agent: a `herald controller` and one `herald agent`
 * process as `bin/herald` starts them, N changes back to back to one deployment (each PATCH sent
 * once the previous revision reads COMPLETE), and the agent's CPU read from /proc/<pid>/stat
 * around them: its own (utime + stime, all threads) and its reaped children's (the hooks), and
 * those of its hook launcher (agent/hooks/launcher.ts: the perl that forks the hooks, whose
 * children are the hooks then) when it has one.
 * Prints one JSON line: the wall time per change, the CPU figures per item (the agent's split into
 * user and system time), the agent's minor page faults per item, its RSS.
 *
 *   npm run build && node dist/bench/item-cost.js [--n 100] [--script '#!/bin/sh\ntrue\n'] [--node-args '--opt']
 *     [--no-hook-launcher]
 *
 * docs/agent-footprint.md and BENCHMARKS.md (findings, the cluster restart) quote it.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { benchPki, slot } from './pki-cache.js';
import { freeLowPort, startAgentProc, startController, stopController, stopProc } from './procs.js';
import { waitComplete, waitConnected } from './latency.js';
import { launchersOf, procUsage } from './util.js';

/** How long one change may take. */
const CHANGE_TIMEOUT_MS = 15_000;
/** How long the agent may take to start and be dialled. */
const CONNECT_TIMEOUT_MS = 30_000;
/** The repository (this file runs as dist/bench/item-cost.js). */
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** What the API answers of a deployment, as far as this reads it. */
interface Deployment {
  id: string;
  revision: number;
}

async function main(): Promise<void> {
  const { values: a } = parseArgs({
    options: {
      n: { type: 'string', default: '100' },
      script: { type: 'string', default: '#!/bin/sh\ntrue\n' },
      'node-args': { type: 'string', default: '' },
      'no-hook-launcher': { type: 'boolean', default: false },
    },
  });
  const n = Number(a.n);
  const s = slot('b', 0);
  const { pki } = await benchPki(path.join(ROOT, 'tmp', 'bench-pki'), [s]);
  const dir = path.join(ROOT, 'tmp', 'bench-run', 'item-cost');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const ctl = await startController({ pki, dir, port: await freeLowPort() });
  const agent = startAgentProc({
    pki,
    node: s.node,
    controllerUrl: ctl.url,
    listen: `${s.ip}:${s.port}`,
    stateDir: path.join(dir, 'state'),
    logFile: path.join(dir, 'agent.log'),
    nodeArgs: a['node-args'].split(' ').filter(Boolean),
    ...(a['no-hook-launcher'] ? { extra: ['--no-hook-launcher'] } : {}),
  });
  try {
    await waitConnected(ctl, s.node, CONNECT_TIMEOUT_MS);
    const cfg = await ctl.op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'item-cost',
      group: 'script',
      config: a.script.replace(/\\n/g, '\n'),
    });
    const dep = await ctl.op.must<Deployment>(201, 'POST', '/v1/deployments', {
      node: s.node,
      config_id: cfg.id,
      action: 'CREATE',
      input_values: { k: 0 },
    });
    const complete = (revision: number): Promise<void> => waitComplete(ctl, dep.id, revision, CHANGE_TIMEOUT_MS);
    await complete(dep.revision);
    const pid = agent.pid!;
    const launcher = launchersOf([pid])[0];
    const c0 = procUsage(pid);
    const l0 = launcher === undefined ? undefined : procUsage(launcher);
    const t0 = performance.now();
    for (let k = 1; k <= n; k++) {
      const r = await ctl.op.must<Deployment>(200, 'PATCH', `/v1/deployments/${dep.id}`, { input_values: { k } });
      await complete(r.revision);
    }
    const wallMs = performance.now() - t0;
    const c1 = procUsage(pid);
    const l1 = launcher === undefined ? undefined : procUsage(launcher);
    const rss = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
    process.stdout.write(
      `${JSON.stringify({
        changes: n,
        wallMsPerChange: Math.round((wallMs / n) * 100) / 100,
        agentOwnCpuMsPerItem: Math.round(((c1.selfMs - c0.selfMs) / n) * 100) / 100,
        agentUserMsPerItem: Math.round(((c1.userMs - c0.userMs) / n) * 100) / 100,
        agentSystemMsPerItem: Math.round(((c1.systemMs - c0.systemMs) / n) * 100) / 100,
        agentMinorFaultsPerItem: Math.round((c1.minorFaults - c0.minorFaults) / n),
        hookCpuMsPerItem:
          Math.round(((c1.childrenMs - c0.childrenMs + (l0 && l1 ? l1.childrenMs - l0.childrenMs : 0)) / n) * 100) /
          100,
        launcherCpuMsPerItem: l0 && l1 ? Math.round(((l1.selfMs - l0.selfMs) / n) * 100) / 100 : null,
        agentRssKb: Number(rss),
      })}\n`,
    );
  } finally {
    await stopProc(agent);
    await stopController(ctl, 'SIGKILL');
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`item-cost: ${(err as Error).message}\n`);
  process.exit(1);
});
