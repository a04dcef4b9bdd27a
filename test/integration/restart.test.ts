/**
 * A cluster restart with real processes: a controller and three agents started through
 * `bin/herald`, scripts that count their own runs. The controller is SIGKILLed in the middle of
 * the restart and started again on the same database; the restart must carry on to
 * RESTART_COMPLETE without re-running any node's finished step.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';
import { makeCluster, mkConfig, type Cluster } from '../helpers/agent-cluster.js';

const NODES = ['r1', 'r2', 'r3'];
let c: Cluster;

beforeAll(async () => {
  if (!isBuilt()) throw new Error('run `npm run build` first (npm test does)');
  c = await makeCluster(NODES);
  for (const n of NODES) await c.startAgent(n);
}, 120_000);

afterAll(async () => {
  await killAll();
  c?.cleanup();
});

const clusterOf = async (id: string) => (await api(c.ctl.port, c.op, 'GET', `/v1/clusters/${id}`)).json;
const phases = (cl: { nodes: Array<{ node?: string; id?: string; phase: string }> }) =>
  Object.fromEntries(cl.nodes.map((n) => [n.node ?? n.id, n.phase]));

describe('cluster restart with real agents', () => {
  it("survives a controller SIGKILL mid-restart: RESTART_COMPLETE, each node's uninstall and install ran exactly once (counted by the scripts)", async () => {
    const log = path.join(c.work, 'ops.log');
    const gate = path.join(c.work, 'gate');
    // r2's RESTART install waits for the gate, so the controller can be killed with r1 done,
    // r2 between its steps and r3 not started (max_unavailable 1)
    const install = await mkConfig(c, {
      name: 'install',
      group: 'script',
      config: `#!/bin/sh\nif [ "$deploy_server_id" = r2 ] && [ "$deploy_action" = RESTART ]; then\n  while [ ! -f ${gate} ]; do sleep 0.02; done\nfi\necho "install $deploy_server_id $deploy_action" >> ${log}\n`,
    });
    const uninstall = await mkConfig(c, {
      name: 'uninstall',
      group: 'script',
      config: `#!/bin/sh\necho "uninstall $deploy_server_id $deploy_action" >> ${log}\n`,
    });
    const created = await api(c.ctl.port, c.op, 'POST', '/v1/clusters', {
      name: 'k8s',
      nodes: NODES,
      install_config_id: install,
      uninstall_config_id: uninstall,
    });
    expect(created.status).toBe(201);
    const id = created.json.id as string;
    await waitFor('CREATE_COMPLETE', async () => (await clusterOf(id))?.status === 'CREATE_COMPLETE', 20_000, 50);
    expect(fs.readFileSync(log, 'utf8').trim().split('\n').sort()).toEqual(NODES.map((n) => `install ${n} CREATE`));
    fs.writeFileSync(log, '');

    const r = await api(c.ctl.port, c.op, 'PATCH', `/v1/clusters/${id}/actions/restart`, { max_unavailable: 1 });
    expect(r.status).toBe(204);
    await waitFor(
      'r1 complete and r2 installing',
      async () => {
        const p = phases(await clusterOf(id));
        return p.r1 === 'complete' && p.r2 === 'installing' && p.r3 === 'pending';
      },
      20_000,
      20,
    );
    await stopProc(c.ctl.proc, 'SIGKILL');
    fs.writeFileSync(gate, '');
    await waitFor(
      'r2 to finish its install while the controller is down',
      () => fs.readFileSync(log, 'utf8').includes('install r2 RESTART'),
      15_000,
    );

    await c.startController();
    const done = await waitFor(
      'the restart to end',
      async () => {
        const s = (await clusterOf(id))?.status as string;
        return s === 'RESTART_COMPLETE' || s === 'RESTART_FAILED' ? s : null;
      },
      60_000,
      50,
    );
    expect(done).toBe('RESTART_COMPLETE');

    const lines = fs.readFileSync(log, 'utf8').trim().split('\n');
    for (const n of NODES) {
      const mine = lines.filter((l) => l.split(' ')[1] === n);
      expect(mine, `runs on ${n}`).toEqual([`uninstall ${n} RESTART`, `install ${n} RESTART`]);
    }
    // the window held: r3's uninstall started only after r2's install had finished
    expect(lines.indexOf('uninstall r3 RESTART')).toBeGreaterThan(lines.indexOf('install r2 RESTART'));
  });
});
