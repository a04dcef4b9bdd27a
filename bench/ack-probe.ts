/**
 * Acks during a reconnect storm: while a restarted controller takes its whole fleet back (TLS
 * handshakes on every core, each agent's pending change), is a change to a node already back
 * still answered at once? Every PROBE step, the next probe node that the controller shows
 * push-connected gets a change of its own (a PATCH of its probe deployment); the figure is PATCH
 * sent → its agent verified the wake-up carrying that change's generation (the agent answers the
 * wake-up with its ack in the same turn, agent/push-connections.ts). Timestamps are the agents'
 * own (bench/util.ts nowMs, one clock for every process of the machine), read after the window,
 * so asking costs the storm nothing.
 *
 * A probe node not connected when its turn comes is skipped (counted): its change would reach it
 * with its attach ping, which times the reconnection, not the ack. The probe deployments are made
 * (and their first runs signalled) before the crash, with a config of their own.
 *
 * The probe agents are agents of the same kind as the fleet's (listening or dialling out), cut off
 * by the same kill, but in a harness process of their own (FanoutOptions.probeAgents): an agent of
 * the fleet shares its event loop with thousands of others handshaking at once, and its ack would
 * time that process, not the controller.
 */
import type { Fleet } from './fleet.js';
import type { ControllerProc } from './procs.js';
import { dist, type Dist, nowMs, round, roundDist, sleep, waitFor } from './util.js';

/** The probe agents' nodes and the pause between two probes. */
export interface AckProbeSpec {
  nodes: string[];
  everyMs: number;
}

/** Probe agents of a crash run (FanoutOptions.probeAgents): a few, so that each gets a change only every few seconds. */
export const PROBE_AGENTS = 16;

/** What a prepared probe needs: the deployment of each probe node. */
export interface AckProbes {
  deployments: Array<{ node: string; id: string }>;
  everyMs: number;
}

export interface AckProbeResult {
  /** Probe changes made (PATCH answered 200). */
  sent: number;
  /** Of them, acked by their agent (within the window and the probe's wait after it). */
  acked: number;
  /** Probe turns skipped: the node was not connected yet. */
  skipped: number;
  /** PATCH sent → the agent verified the wake-up carrying it, ms. */
  ackMs: Dist;
  /** PATCH sent → PATCH answered (the change committed), ms. */
  commitMs: Dist;
  /** Every sample of ackMs, in the order taken. */
  samplesMs: number[];
  everyMs: number;
  problems: string[];
}

interface Bed {
  ctl: ControllerProc;
  probeConfigId: string;
}

/** The probes' config (once per bed) and one deployment per probe node, each COMPLETE. */
export async function prepareAckProbe(bed: Bed, spec: AckProbeSpec): Promise<AckProbes> {
  const op = bed.ctl.op;
  if (bed.probeConfigId === '') {
    const cfg = await op.must<{ id: string }>(201, 'POST', '/v1/configs', {
      name: 'ack-probe',
      group: 'script',
      config: '#!/bin/sh\ntrue\n',
      inputs: [{ name: 'probe', type: 'String' }],
    });
    bed.probeConfigId = cfg.id;
  }
  const deployments: AckProbes['deployments'] = [];
  for (const node of spec.nodes) {
    const d = await op.must<{ id: string }>(201, 'POST', '/v1/deployments', {
      node,
      config_id: bed.probeConfigId,
      action: 'CREATE',
      input_values: { probe: '0' },
    });
    deployments.push({ node, id: d.id });
  }
  for (const d of deployments)
    await waitFor(
      `probe deployment on ${d.node} COMPLETE`,
      async () => (await op.request<{ status?: string }>('GET', `/v1/deployments/${d.id}`)).json?.status === 'COMPLETE',
      60_000,
      100,
    );
  return { deployments, everyMs: spec.everyMs };
}

/**
 * A change to every probe node, made just before the crash (its push workers stopped: no wake-up
 * leaves): the restarted controller finds them behind, as the fleet's nodes, and dials them in
 * listener mode (a node up to date is dialled only at its next change).
 */
export async function pendAckProbes(ctl: ControllerProc, p: AckProbes): Promise<void> {
  for (const d of p.deployments)
    await ctl.op.must(200, 'PATCH', `/v1/deployments/${d.id}`, { input_values: { probe: 'pending' } });
}

/** How long, after the window, an unanswered probe may still be acked. */
const PROBE_LATE_MS = 5_000;

/** Starts probing the restarted controller `ctl` (its fleet `fleet`); `stop()` ends it and reads the agents' times. */
export function startAckProbe(ctl: ControllerProc, fleet: Fleet, p: AckProbes): { stop(): Promise<AckProbeResult> } {
  let stopped = false;
  const sent: Array<{ node: string; t0: number; gen: number }> = [];
  const commits: number[] = [];
  const problems: string[] = [];
  let skipped = 0;
  const started = nowMs();
  const loop = (async (): Promise<void> => {
    for (let k = 0; !stopped; k++) {
      const d = p.deployments[k % p.deployments.length]!;
      await sleep(p.everyMs);
      if (stopped) break;
      try {
        const node = await ctl.op.request<{ push?: { connected?: boolean } }>('GET', `/v1/nodes/${d.node}`);
        if (node.json?.push?.connected !== true) {
          skipped++;
          continue;
        }
        const t0 = nowMs();
        const r = await ctl.op.request('PATCH', `/v1/deployments/${d.id}`, { input_values: { probe: String(k + 1) } });
        const t1 = nowMs();
        if (r.status !== 200) {
          problems.push(`probe PATCH on ${d.node} → ${r.status}`);
          continue;
        }
        // the node's generation now: this change's, or a later one (nothing else changes a probe node in the window)
        const after = await ctl.op.request<{ generation?: number }>('GET', `/v1/nodes/${d.node}`);
        const gen = after.json?.generation;
        if (typeof gen !== 'number') {
          problems.push(`probe: no generation for ${d.node} (${after.status})`);
          continue;
        }
        commits.push(t1 - t0);
        sent.push({ node: d.node, t0, gen });
      } catch (err) {
        problems.push(`probe on ${d.node}: ${(err as Error).message}`);
      }
    }
  })();
  return {
    async stop(): Promise<AckProbeResult> {
      stopped = true;
      await loop;
      const read = (): Promise<Array<number | null>> =>
        fleet.wakesAtLeast(sent.map((x) => ({ node: x.node, since: x.t0, gen: x.gen })));
      let ts = await read();
      const deadline = Date.now() + PROBE_LATE_MS;
      while (ts.some((t) => t === null) && Date.now() < deadline) {
        await sleep(250);
        ts = await read();
      }
      const samples = sent.flatMap((x, i) => (ts[i] === null ? [] : [ts[i]! - x.t0]));
      sent.forEach((x, i) => {
        if (ts[i] === null)
          problems.push(
            `probe on ${x.node} (generation ${x.gen}, made ${round(x.t0 - started)} ms into the window) not acked`,
          );
      });
      return {
        sent: sent.length,
        acked: samples.length,
        skipped,
        ackMs: roundDist(dist(samples)),
        commitMs: roundDist(dist(commits)),
        samplesMs: samples.map((x) => round(x, 2)),
        everyMs: p.everyMs,
        problems,
      };
    },
  };
}
