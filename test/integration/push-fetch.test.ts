/**
 * Fetches and signals over the push connection (docs/protocol.md), end to end with `bin/herald` processes:
 * a woken agent asks for its metadata on the connection the wake-up came on and posts its results
 * there too, so changes to one node back to back cost no API request at all, whether the
 * controller dials from push worker processes (the default) or from its API process
 * (`--push-workers 0`); and the agent closes its idle API connection (AGENT_API_IDLE_CLOSE_MS)
 * and opens none for a change, so a connected agent costs the controller one TLS connection, not two.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AGENT_API_IDLE_CLOSE_MS, SIGNAL_RATE_BURST } from '../../protocol/limits.js';
import { api, isBuilt, killAll, waitFor } from '../helpers/procs.js';
import {
  getNode,
  makeCluster,
  mkConfig,
  mkDeployment,
  waitDeployment,
  type AgentProc,
  type Cluster,
} from '../helpers/agent-cluster.js';
import { metricSum } from '../security/helpers/battery.js';

const built = isBuilt();

/** Established TCP connections of process `pid` whose remote port is `port` (from /proc). */
function connectionsTo(pid: number, port: number): number {
  const inodes = new Set<string>();
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      // closed meanwhile
    }
  }
  let n = 0;
  for (const table of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = fs.readFileSync(`/proc/${pid}/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      const remotePort = Number.parseInt(f[2]!.split(':')[1]!, 16);
      // state 01: ESTABLISHED
      if (f[3] === '01' && remotePort === port && inodes.has(f[9]!)) n++;
    }
  }
  return n;
}

async function fetchCounts(
  c: Cluster,
): Promise<{ https: number; push: number; push200: number; httpsSignals: number; signals: number }> {
  const t = (await api(c.ctl.port, c.op, 'GET', '/metrics')).raw;
  return {
    https: metricSum(t, 'herald_api_requests_total', (l) => l.route === '/v1/nodes/:node/metadata'),
    httpsSignals: metricSum(
      t,
      'herald_api_requests_total',
      (l) => l.route === '/v1/nodes/:node/deployments/:deployment/signal',
    ),
    signals: metricSum(t, 'herald_signals_total', () => true),
    push: metricSum(t, 'herald_metadata_fetches_total', (l) => l.channel === 'push'),
    push200: metricSum(t, 'herald_metadata_fetches_total', (l) => l.channel === 'push' && l.status === '200'),
  };
}

for (const workers of ['1', '0']) {
  describe.skipIf(!built)(`fetches over the push connection (--push-workers ${workers})`, { timeout: 90_000 }, () => {
    let c: Cluster;
    let n1: AgentProc;

    beforeAll(async () => {
      if (!built) return;
      c = await makeCluster(['n1'], { controllerArgs: ['--push-workers', workers] });
      n1 = await c.startAgent('n1');
      await waitFor('n1 push-connected', async () => (await getNode(c, 'n1'))?.push?.connected === true, 20_000);
    }, 90_000);

    afterAll(async () => {
      await killAll();
      c?.cleanup();
    });

    it('five changes to one node back to back are all applied and signalled with no request over HTTPS', async () => {
      const before = await fetchCounts(c);
      const cfg = await mkConfig(c, { name: 'hello', group: 'script', config: '#!/bin/sh\necho hi\n' });
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push(await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' }));
      for (const id of ids) expect((await waitDeployment(c, id)).status).toBe('COMPLETE');
      const after = await fetchCounts(c);
      expect(after.https).toBe(before.https);
      expect(after.push200 - before.push200).toBeGreaterThanOrEqual(1);
      // the five results were recorded, none of them through the HTTPS route
      expect(after.signals - before.signals).toBe(5);
      expect(after.httpsSignals).toBe(before.httpsSignals);
      expect(n1.proc.log()).not.toContain('fetching over HTTPS');
      expect(n1.proc.log()).not.toContain('signalling over HTTPS');
    });

    it(`more quick changes than the signal burst (${SIGNAL_RATE_BURST}): every result arrives and the push connection stays`, async () => {
      const connects = (): number => n1.proc.log().split('controller connected').length - 1;
      const before = connects();
      const cfg = await mkConfig(c, { name: 'burst', group: 'script', config: '#!/bin/sh\ntrue\n' });
      const ids: string[] = [];
      for (let i = 0; i < SIGNAL_RATE_BURST + 40; i++)
        ids.push(await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' }));
      for (const id of ids) expect((await waitDeployment(c, id, undefined, 30_000)).status).toBe('COMPLETE');
      // each change's wake-up lets its result past the signal limit (EXEMPT_SIGNALS_CAPACITY held
      // at most); one the agent fell too far behind for is refused 429 and sent again after its
      // Retry-After, never three in a row: the controller never closed the push connection (it is
      // the wake-ups' path)
      expect(connects()).toBe(before);
      expect((await getNode(c, 'n1')).push.connected).toBe(true);
    });

    it(`the agent closes its idle API connection after ${AGENT_API_IDLE_CLOSE_MS} ms; its push connection stays`, async () => {
      const pid = n1.proc.child.pid!;
      // the endpoint announcement at start used an API connection; it closes once idle long enough
      await waitFor(
        'no API connection from the agent',
        () => connectionsTo(pid, c.ctl.port) === 0,
        AGENT_API_IDLE_CLOSE_MS + 10_000,
      );
      expect((await getNode(c, 'n1')).push.connected).toBe(true);
      // and push still brings the next change, fetched on the push connection
      const before = await fetchCounts(c);
      const cfg = await mkConfig(c, { name: 'again', group: 'script', config: '#!/bin/sh\ntrue\n' });
      const id = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
      expect((await waitDeployment(c, id)).status).toBe('COMPLETE');
      // fetched and signalled on the push connection: no API connection was opened for it (one
      // would stay open AGENT_API_IDLE_CLOSE_MS after its request)
      expect(connectionsTo(pid, c.ctl.port)).toBe(0);
      const after = await fetchCounts(c);
      expect(after.push - before.push).toBeGreaterThanOrEqual(1);
      expect(after.https).toBe(before.https);
      expect(after.httpsSignals).toBe(before.httpsSignals);
      expect(after.signals - before.signals).toBe(1);
    });
  });
}
