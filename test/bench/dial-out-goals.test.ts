import { Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { AGENT_DIAL_PING_INTERVAL_MS, PING_INTERVAL_MS } from '../../protocol/limits.js';
import type { AckProbeResult } from '../../bench/ack-probe.js';
import { countAbove, histogramShares, parseProm } from '../../bench/api-client.js';
import { ackStorm, idleBytesPerHour, pairedRatio } from '../../bench/dial-out-goals.js';
import type { FanoutPair } from '../../bench/dial-out-fanout.js';
import type { DialOutLatency } from '../../bench/dial-out-latency.js';
import { dialOutGoals } from '../../bench/dial-out-report.js';
import type { CrashRun, FanoutResult } from '../../bench/fanout.js';
import { pushHealthyBytesPerHour, type IdlePart } from '../../bench/idle.js';
import { dist } from '../../bench/util.js';

/** The ack latency histogram as a restarted controller serves it (prom-client's own text). */
async function scrape(observedS: number[]): Promise<Map<string, number>> {
  const registry = new Registry();
  const h = new Histogram({
    name: 'herald_wake_ack_latency_seconds',
    help: 'x',
    buckets: [0.001, 0.01, 0.1, 0.5, 1],
    registers: [registry],
  });
  for (const s of observedS) h.observe(s);
  return parseProm(await registry.metrics());
}

const probe = (samplesMs: number[], sent = samplesMs.length): AckProbeResult => ({
  sent,
  acked: samplesMs.length,
  skipped: 0,
  ackMs: dist(samplesMs),
  commitMs: dist([]),
  samplesMs,
  everyMs: 200,
  problems: [],
});

describe('dial-out beside listener mode: the figures its goals read', () => {
  it('compares runs that took turns run by run (the median of the ratios), else by their medians', () => {
    // ratios 2, 0.5, 1.1: the median 1.1 (the medians' ratio would be 3/2 = 1.5)
    expect(pairedRatio([1, 4, 2], [2, 2, 2.2])).toBeCloseTo(1.1, 9);
    expect(pairedRatio([1, 2, 3], [3, 3])).toBeCloseTo(1.5, 9);
    expect(pairedRatio([], [1])).toBeNaN();
  });

  it("reads the controller's ack latency histogram from its scrape, and counts what exceeded a bound", async () => {
    const m = await scrape([0.0005, 0.005, 0.05, 0.3, 0.8, 2]);
    const h = histogramShares(m, 'herald_wake_ack_latency_seconds');
    expect(h.count).toBe(6);
    expect(h.sum).toBeCloseTo(3.1555, 9);
    expect(h.atMost).toEqual([
      { le: 0.001, count: 1 },
      { le: 0.01, count: 2 },
      { le: 0.1, count: 3 },
      { le: 0.5, count: 4 },
      { le: 1, count: 5 },
    ]);
    expect(countAbove(h, 1)).toBe(1);
    expect(countAbove(h, 0.1)).toBe(3);
    // between two bounds: the lower one counts (what is known to be at most the bound)
    expect(countAbove(h, 0.2)).toBe(3);
  });

  it('calls acks starved unless every probe was acked within 1 s, no ack exceeded it and nothing was dropped half-open', async () => {
    const ok = await scrape([0.01, 0.2, 0.9]);
    const ackLatency = histogramShares(ok, 'herald_wake_ack_latency_seconds');
    const good: Pick<CrashRun, 'ackProbe' | 'ackLatency' | 'dialFailures'> = {
      ackProbe: probe([12, 40, 900]),
      ackLatency,
      dialFailures: {},
    };
    expect(ackStorm(good)).toMatchObject({ probesSent: 3, probesAcked: 3, slowestMs: 900, acks: 3, met: true });
    expect(ackStorm({ ...good, ackProbe: probe([12, 1_200]) }).met).toBe(false);
    expect(ackStorm({ ...good, ackProbe: probe([12, 40], 3) }).met).toBe(false);
    expect(ackStorm({ ...good, dialFailures: { half_open: 2 } })).toMatchObject({ halfOpen: 2, met: false });
    const late = histogramShares(await scrape([0.01, 1.5]), 'herald_wake_ack_latency_seconds');
    expect(ackStorm({ ...good, ackLatency: late })).toMatchObject({ acksOverLimit: 1, met: false });
    // no probe made: nothing shows the acks were served
    expect(ackStorm({ ...good, ackProbe: probe([]) }).met).toBe(false);
  });

  it("puts an idle agent's hour together from its own ping interval and the healthy polls over push", () => {
    const ping = {
      bytesPerPing: 200,
      pushPoll: { windowS: 16, bytes: 0, packets: 0, polls: 1, overPush: 1, bytesPerPoll: 800 },
    };
    // 120 pings of 200 B and 6 polls of 800 B an hour at 30 s
    expect(pushHealthyBytesPerHour(ping, Number.NaN, 30_000)).toBe(28_800);
    expect(pushHealthyBytesPerHour(ping, Number.NaN, 60_000)).toBe(16_800);
    // window 1b not measured: the HTTPS poll's bytes stand in
    expect(pushHealthyBytesPerHour({ bytesPerPing: 200 }, 1_000, 30_000)).toBe(30_000);
    const part = {
      exact: true,
      agents: 100,
      problems: [],
      ping: { ...ping, windowS: 30, bytes: 0, packets: 0, pings: 100, polls: 0, packetsPerPing: 3 },
    } as IdlePart;
    expect(idleBytesPerHour(part, 'listener')).toBe(pushHealthyBytesPerHour(ping, 0, PING_INTERVAL_MS));
    expect(idleBytesPerHour(part, 'dialOut')).toBe(pushHealthyBytesPerHour(ping, 0, AGENT_DIAL_PING_INTERVAL_MS));
    expect(idleBytesPerHour({ ...part, ping: { ...part.ping!, pushPoll: undefined } }, 'dialOut')).toBeNaN();
    expect(idleBytesPerHour(null, 'dialOut')).toBeNaN();
  });

  it('gives each goal its verdict from the two modes measured in the run', () => {
    const mode = (cpuS: number[], rssKb: number, fetchedMs: number): FanoutResult =>
      ({
        n: 1_000,
        runs: cpuS.map((c) => ({
          controllerCpuS: c,
          allFetchedMs: fetchedMs,
          allAckedMs: fetchedMs / 2,
          controllerIdleCpuPerS: 0,
          controllerRssKb: { perAgent: rssKb },
        })),
        crash: null,
      }) as unknown as FanoutResult;
    const fanout: FanoutPair[] = [
      { n: 1_000, listener: mode([0.5, 0.6], 70, 2_000), dialOut: mode([0.55, 0.66], 68, 2_000) },
    ];
    const lat = (p50: number) => ({ samples: 10, hookStartMs: { ...dist([p50]), p99: 2 * p50 } });
    const latencyOf = (dialOutP50: number) =>
      ({ listener: lat(10), dialOut: lat(dialOutP50), block: 10, problems: [] }) as unknown as DialOutLatency;
    const latency = latencyOf(12.5);
    const rows = dialOutGoals({ latency, fanout, idle: { listener: null, dialOut: null } });
    const byFigure = (start: string) => rows.find((r) => r.figure.startsWith(start))!;
    // 12.5 / 10 = 1.25 > 1.2
    expect(byFigure('PATCH → hook started')).toMatchObject({ met: false });
    // CPU 1.1× listener mode's in both runs: missed by 10 %; memory 68 of 70 KB: met
    expect(byFigure('controller CPU')).toMatchObject({ met: false, by: 'missed by 10 % (1.1×)' });
    expect(byFigure('controller memory')).toMatchObject({ met: true });
    expect(byFigure('one change to')).toMatchObject({ met: null });
    const fast = dialOutGoals({
      latency: latencyOf(11),
      fanout,
      idle: { listener: null, dialOut: null },
    });
    expect(fast.find((r) => r.figure.startsWith('PATCH'))).toMatchObject({ met: true });
  });
});
