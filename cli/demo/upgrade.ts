/**
 * `herald demo --upgrade` (docs/api.md "Upgrades"): after the cluster is created, two upgrades
 * instead of a restart. The first rolls service version 2 with a canary per group, promoted
 * automatically once healthy; the second rolls a broken release (its service dies at start):
 * the canary's health check fails and the rollout reverts the nodes it changed to the stable
 * revision at once. Each with its timeline, then the checks: every node runs version 2 again,
 * its container and volume untouched, and the revisions with which of them are stable.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ClusterRevisionView, ClusterView, ConfigView, ListEnvelope } from '../../protocol/rest.js';
import type { ApiClient } from '../operator/client.js';
import { formatMs, table } from '../operator/format.js';
import { watchRestart, type WatchEvent } from '../operator/watch.js';
import { hashDir, readPid, type DemoNode } from './fixtures.js';
import { timelineLines } from './report.js';
import { BROKEN_INSTALL_SCRIPT } from './scripts.js';
import { DemoFailure, isAlive } from './supervisor.js';

export interface UpgradeDemo {
  api: ApiClient;
  clusterId: string;
  healthId: string;
  nodesDir: string;
  nodes: DemoNode[];
  stepTimeoutMs: number;
  say(s: string): void;
  step(s: string): void;
}

/** Sends one upgrade and follows it; returns how it ended with its events. */
async function upgrade(
  d: UpgradeDemo,
  body: Record<string, unknown>,
  what: string,
): Promise<{ cluster: ClusterView; events: WatchEvent[] }> {
  const startedAt = new Date();
  const c = await d.api.patch<ClusterView>(`/v1/clusters/${encodeURIComponent(d.clusterId)}`, body);
  d.step(
    `${what}: PATCH /v1/clusters/${d.clusterId} ${JSON.stringify(Object.keys(body))} → 202 in ${formatMs(Date.now() - startedAt.getTime())}: revision ${c.revision}, ${c.counters.targeted} node(s) to change, canaries ${c.rollout?.canaries.join(', ')} first`,
  );
  const events: WatchEvent[] = [];
  const result = await watchRestart(d.api, {
    clusterId: d.clusterId,
    startedAt,
    timeoutMs: d.stepTimeoutMs,
    pollIntervalMs: 250,
    onEvent: (e) => void events.push(e),
  });
  if (result.timedOut) throw new DemoFailure(`the ${what} did not finish within ${formatMs(d.stepTimeoutMs)}`);
  for (const line of timelineLines(events, startedAt, 5, what)) d.say(line);
  const cluster = await d.api.get<ClusterView>(`/v1/clusters/${encodeURIComponent(d.clusterId)}`);
  return { cluster, events };
}

/** The two upgrades and the checks; throws DemoFailure when a promise does not hold. */
export async function upgradeAndCheck(d: UpgradeDemo): Promise<void> {
  const before = new Map(d.nodes.map((n) => [n.id, { container: n.containerPid, volume: n.volumeHash }]));
  d.say('');
  const first = await upgrade(
    d,
    { input_values: { service_version: '2' }, canary: 1, auto_promote_s: 1, health_config_id: d.healthId },
    'upgrade to service version 2',
  );
  if (first.cluster.status !== 'UPDATE_COMPLETE')
    throw new DemoFailure(`the first upgrade ended ${first.cluster.status}: ${first.cluster.status_reason}`);
  const promoted = first.events.some((e) => e.kind === 'rollout' && e.phase === 'promoted');
  if (!promoted) throw new DemoFailure('the canaries of the first upgrade were never seen promoted');
  d.say(`✓ the canaries went first, were healthy, and were promoted after 1 s; ${first.cluster.status}`);

  d.say('');
  const broken = await d.api.post<ConfigView>('/v1/configs', {
    name: 'demo-install-broken',
    group: 'script',
    config: BROKEN_INSTALL_SCRIPT,
    inputs: [{ name: 'demo_root', type: 'String', default: d.nodesDir }],
  });
  const second = await upgrade(
    d,
    {
      install_config_id: broken.id,
      input_values: { service_version: '3' },
      canary: 1,
      on_failure: 'revert',
      health_config_id: d.healthId,
    },
    'upgrade to a broken version 3',
  );
  const c = second.cluster;
  const revert = c.rollout?.state?.revert;
  if (c.status !== 'UPDATE_FAILED' || !revert)
    throw new DemoFailure(`the broken upgrade ended ${c.status} without a revert: ${c.status_reason}`);
  d.say(
    `✓ the canary's health check failed; ${revert.nodes.join(', ')} reverted to revision ${revert.revision} at once`,
  );
  d.say(`  ${c.status}: ${c.status_reason}`);
  d.say(
    `  counters: ${Object.entries(c.counters)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}`,
  );

  d.say('');
  const failures: string[] = [];
  const rows = d.nodes.map((n) => {
    const pid = readPid(path.join(n.dir, 'service.pid'));
    const version = fs.readFileSync(path.join(n.dir, 'version'), 'utf8').trim();
    const b = before.get(n.id)!;
    const containerOk = !n.containerExited && isAlive(n.containerPid) && n.containerPid === b.container;
    const volumeOk = hashDir(n.volume) === b.volume;
    const serviceOk = pid !== undefined && isAlive(pid) && version === '2';
    if (!containerOk) failures.push(`${n.id}: the application container is gone`);
    if (!volumeOk) failures.push(`${n.id}: the volume's files changed`);
    if (!serviceOk) failures.push(`${n.id}: not running service version 2 (version ${version}, pid ${pid ?? '-'})`);
    n.servicePid = pid;
    const node = c.nodes.find((x) => x.node === n.id);
    return [
      n.id,
      `${n.containerPid} same ${containerOk ? '✓' : '✗'}`,
      `same ${volumeOk ? '✓' : '✗'}`,
      `v${version} pid ${pid ?? '-'} ${serviceOk ? '✓' : '✗'}`,
      `${node?.revision ?? '?'}`,
      revert.nodes.includes(n.id) ? 'reverted' : 'untouched',
    ];
  });
  d.say(
    table(['NODE', 'CONTAINER PID', 'VOLUME FILES', 'SERVICE', 'REVISION', 'IN THE BROKEN UPGRADE'], rows).trimEnd(),
  );
  const revisions = await d.api.get<ListEnvelope<ClusterRevisionView>>(
    `/v1/clusters/${encodeURIComponent(d.clusterId)}/revisions`,
  );
  d.say('');
  d.say(
    table(
      ['REVISION', 'STABLE', 'INSTALL CONFIG', 'INPUT VALUES'],
      revisions.items.map((r) => [
        `${r.revision}${r.current ? ' (current)' : ''}`,
        r.stable ? 'yes' : 'no',
        r.install_config_id,
        JSON.stringify(r.input_values),
      ]),
    ).trimEnd(),
  );
  d.say('');
  if (failures.length) {
    for (const f of failures) d.say(`✗ ${f}`);
    throw new DemoFailure(`${failures.length} check(s) failed`);
  }
  d.say(
    `✓ every node runs service version 2 (the stable revision ${revert.revision}), same containers, same volumes; revision ${c.revision} is not stable`,
  );
}
