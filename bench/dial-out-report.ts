/**
 * The dial-out section of BENCHMARKS.md (`npm run bench -- --dial-out`): each figure of agents
 * that dial out (docs/dial-out.md) beside listener mode's, measured in the same run, with its goal
 * and verdict. The section replaces its own kept block of BENCHMARKS.md and leaves every other
 * section as it was (replaceKeptSection in report.ts); its reading is a kept block of its own.
 */
import { FRAME_ANSWER_TIMEOUT_MS } from '../protocol/limits.js';
import type { HistogramShares } from './api-client.js';
import {
  ackStorm,
  cpuPerAgentRuns,
  IDLE_BYTES_PER_HOUR_GOAL,
  idleBytesPerHour,
  LATENCY_RATIO_GOAL,
  pairedRatio,
  RESTART_ALL_GOAL_MS,
  rssPerAgentRuns,
} from './dial-out-goals.js';
import type { FanoutMode, FanoutPair } from './dial-out-fanout.js';
import type { DialOutLatency, ModeLatency } from './dial-out-latency.js';
import type { CrashRun, FanoutResult } from './fanout.js';
import type { IdlePart } from './idle.js';
import { fmt, ratio, type Goal } from './report.js';
import { median } from './util.js';

/** The marker the section starts with; `npm run bench -- --dial-out` replaces the block it opens. */
export const DIAL_OUT_MARKER = '<!-- kept: dial-out (npm run bench -- --dial-out replaces this section) -->';

export interface DialOutReport {
  date: string;
  command: string;
  elapsedS: number;
  machine: string;
  loadStart: number[];
  loadEnd: number[];
  isolation: string;
  commit: string;
  latency: DialOutLatency | null;
  fanout: FanoutPair[];
  idle: { listener: IdlePart | null; dialOut: IdlePart | null };
  problems: string[];
  /** Written while the run was still going (after each finished part). */
  partial?: boolean;
}

const MODES: FanoutMode[] = ['listener', 'dialOut'];
const NAME: Record<FanoutMode, string> = { listener: 'listener', dialOut: 'dial-out' };
const n = (x: number): string => x.toLocaleString('en-US');
const ms = (x: number, d = 1): string => `${fmt(x, d)} ms`;
const s = (xMs: number | null | undefined, d = 2): string =>
  typeof xMs === 'number' && Number.isFinite(xMs) ? `${fmt(xMs / 1000, d)} s` : 'n/a';
const kb = (bytes: number): string => `${fmt(bytes / 1000, 1)} kB`;
const range = (xs: number[], d: number, unit: string): string =>
  xs.length === 0 ? 'n/a' : `${fmt(Math.min(...xs), d)}-${fmt(Math.max(...xs), d)} ${unit}`;

/** `dial-out at most listener mode's`: met when the ratio is at most 1; by how much otherwise. */
function atMost(r: number): string {
  if (!Number.isFinite(r)) return 'not measured';
  return r <= 1 ? `met (${fmt(r, 2)}× listener mode's)` : `missed by ${fmt((r - 1) * 100, 0)} % (${fmt(r, 2)}×)`;
}

/** The goals table's rows: dial-out against listener mode, or against a bound of its own. */
export function dialOutGoals(
  r: Pick<DialOutReport, 'latency' | 'fanout' | 'idle'>,
): Array<Goal & { listener: string }> {
  const out: Array<Goal & { listener: string }> = [];
  const lat = r.latency;
  if (lat && lat.listener.samples > 0 && lat.dialOut.samples > 0) {
    const [a, b] = [lat.listener.hookStartMs, lat.dialOut.hookStartMs];
    const x = b.p50 / a.p50;
    out.push({
      figure: `PATCH → hook started, ${lat.dialOut.samples} back-to-back changes to one node (p50, p99)`,
      floor: '',
      listener: `${ms(a.p50, 2)}, ${ms(a.p99, 2)}`,
      goal: `p50 ≤ ${LATENCY_RATIO_GOAL}× listener mode's`,
      measured: `${ms(b.p50, 2)}, ${ms(b.p99, 2)} (${fmt(x, 2)}×, p99 ${fmt(b.p99 / a.p99, 2)}×)`,
      met: x <= LATENCY_RATIO_GOAL,
      by: ratio(x, LATENCY_RATIO_GOAL),
    });
  }
  const big = [...r.fanout].sort((p, q) => q.n - p.n)[0];
  if (big) {
    const N = n(big.n);
    const [l, d] = [big.listener, big.dialOut];
    const acked = (f: FanoutResult): number => median(f.runs.map((x) => x.allAckedMs));
    const fetched = (f: FanoutResult): number => median(f.runs.map((x) => x.allFetchedMs));
    out.push({
      figure: `one change to ${N} agents: all acked / all fetched (${d.runs.length === 1 ? 'one run' : `medians of ${d.runs.length} runs`})`,
      floor: '',
      listener: `${s(acked(l))} / ${s(fetched(l))}`,
      goal: 'beside listener mode',
      measured: `${s(acked(d))} / ${s(fetched(d))}`,
      met: null,
      by: `${fmt(
        pairedRatio(
          l.runs.map((x) => x.allFetchedMs),
          d.runs.map((x) => x.allFetchedMs),
        ),
        2,
      )}× listener mode's all fetched`,
    });
    const [cl, cd] = [cpuPerAgentRuns(l), cpuPerAgentRuns(d)];
    const cpuX = pairedRatio(cl, cd);
    out.push({
      figure: `controller CPU per agent in that fan-out, net of background (runs' median; their spread)`,
      floor: '',
      listener: `${ms(median(cl), 3)} (${range(cl, 3, 'ms')})`,
      goal: "≤ listener mode's",
      measured: `${ms(median(cd), 3)} (${range(cd, 3, 'ms')})`,
      met: cpuX <= 1,
      by: atMost(cpuX),
    });
    const [ml, md] = [median(rssPerAgentRuns(l)), median(rssPerAgentRuns(d))];
    out.push({
      figure: `controller memory per connected agent (N = ${N})`,
      floor: '',
      listener: `${fmt(ml)} KB`,
      goal: "≤ listener mode's",
      measured: `${fmt(md)} KB`,
      met: md <= ml,
      by: atMost(md / ml),
    });
    const [xl, xd] = [l.crash, d.crash];
    if (xl && xd) {
      const with_ = (c: CrashRun): string => (c.noneLost ? s(c.allFetchedMs) : `${n(c.fetched)} of ${N} in the window`);
      out.push({
        figure: `${N} agents after a controller restart (SIGKILL, started again): all holding the change, from its answering`,
        floor: '',
        listener: with_(xl),
        goal: `all within ${s(RESTART_ALL_GOAL_MS, 0)}`,
        measured: `${with_(xd)} (${s(xd.restartMs + xd.allFetchedMs, 1)} from the kill)`,
        met: xd.noneLost && xd.allFetchedMs <= RESTART_ALL_GOAL_MS,
        by: xd.noneLost ? ratio(xd.allFetchedMs / 1000, RESTART_ALL_GOAL_MS / 1000) : 'missed: not every agent had it',
      });
      const [al, ad] = [ackStorm(xl), ackStorm(xd)];
      const storm = (a: ReturnType<typeof ackStorm>): string =>
        `${a.probesAcked} of ${a.probesSent} probes acked, p50 ${ms(a.p50Ms)}, slowest ${ms(a.slowestMs)}; ${a.acksOverLimit} of ${n(a.acks)} acks over ${ms(FRAME_ANSWER_TIMEOUT_MS, 0)}; ${a.halfOpen} half-open`;
      out.push({
        figure: 'acks during that reconnect storm: changes to single nodes already back, PATCH → ack',
        floor: '',
        listener: storm(al),
        goal: `every probe acked, none slower than ${ms(FRAME_ANSWER_TIMEOUT_MS, 0)}, no connection dropped half-open`,
        measured: storm(ad),
        met: ad.met,
        by: ad.met ? ratio(ad.slowestMs, FRAME_ANSWER_TIMEOUT_MS) : starvedBy(ad),
      });
    }
  }
  const [il, id] = [idleBytesPerHour(r.idle.listener, 'listener'), idleBytesPerHour(r.idle.dialOut, 'dialOut')];
  if (Number.isFinite(id)) {
    const exact = r.idle.dialOut?.exact ? '' : ' (approximate)';
    out.push({
      figure: 'idle IP traffic per agent, push healthy',
      floor: '',
      listener: `${kb(il)}/h`,
      goal: `≤ ${kb(IDLE_BYTES_PER_HOUR_GOAL)}/h`,
      measured: `${kb(id)}/h${exact}`,
      met: id <= IDLE_BYTES_PER_HOUR_GOAL,
      by: ratio(id / 1000, IDLE_BYTES_PER_HOUR_GOAL / 1000),
    });
  }
  return out;
}

function starvedBy(a: ReturnType<typeof ackStorm>): string {
  const why: string[] = [];
  if (a.probesSent === 0) why.push('no probe was made');
  if (a.probesAcked < a.probesSent) why.push(`${a.probesSent - a.probesAcked} probes not acked`);
  if (a.slowestMs > FRAME_ANSWER_TIMEOUT_MS) why.push(`slowest ${ratio(a.slowestMs, FRAME_ANSWER_TIMEOUT_MS)}`);
  if (a.acksOverLimit > 0) why.push(`${a.acksOverLimit} acks over the limit`);
  if (a.halfOpen > 0) why.push(`${a.halfOpen} connections dropped half-open`);
  return `missed: ${why.join('; ')}`;
}

/** Of a histogram's observations, how many at most `le` (the bucket bound). */
function atMostLe(h: HistogramShares | undefined, le: number): number {
  return h?.atMost.find((b) => b.le === le)?.count ?? Number.NaN;
}

function latencyRows(l: DialOutLatency, p: (x?: string) => void): void {
  p(
    '| mode | changes | p50 | p99 | min | max | COMPLETE p50 / p99 | cold (first deployment) | PATCH → wake-up verified | → fetched | → item started | → hook |',
  );
  p('|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const m of MODES) {
    const x: ModeLatency = l[m];
    const b = x.breakdown;
    const parts = b
      ? [b.patchToWake, b.wakeToFetched, b.fetchedToItemStarted, b.itemStartedToHook].map((v) => ms(v))
      : [];
    p(
      `| ${NAME[m]} | ${x.samples} | ${ms(x.hookStartMs.p50, 2)} | ${ms(x.hookStartMs.p99, 2)} | ${ms(x.hookStartMs.min, 2)} | ${ms(x.hookStartMs.max, 2)} | ${ms(x.completeMs.p50)} / ${ms(x.completeMs.p99)} | ${ms(x.coldHookStartMs)} | ${(parts.length ? parts : ['n/a', 'n/a', 'n/a', 'n/a']).join(' | ')} |`,
    );
  }
}

function fanoutRows(pairs: FanoutPair[], p: (x?: string) => void): void {
  p(
    '| N | mode | runs | all acked (median) | all fetched (median; runs) | ack p50 / p99 | fetch p50 / p99 | controller CPU per agent, net (runs) | background | RSS per agent (highest sample) | growing to N: added, time, controller CPU |',
  );
  p('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const pair of pairs)
    for (const m of MODES) {
      const f = pair[m];
      const r0 = f.runs[0];
      const cpu = cpuPerAgentRuns(f);
      const bg = median(f.runs.map((x) => x.controllerIdleCpuPerS ?? Number.NaN)) * 1000;
      p(
        `| ${n(pair.n)} | ${NAME[m]} | ${f.runs.length} | ${s(median(f.runs.map((x) => x.allAckedMs)), 3)} | ${s(median(f.runs.map((x) => x.allFetchedMs)), 3)} (${f.runs.map((x) => s(x.allFetchedMs)).join(', ')}) | ${r0 ? `${ms(r0.ackMs.p50, 0)} / ${ms(r0.ackMs.p99, 0)}` : 'n/a'} | ${r0 ? `${ms(r0.fetchMs.p50, 0)} / ${ms(r0.fetchMs.p99, 0)}` : 'n/a'} | ${ms(median(cpu), 3)} (${cpu.map((x) => fmt(x, 3)).join(', ')}) | ${fmt(bg, 0)} ms/s | ${r0 ? `${fmt(median(rssPerAgentRuns(f)))} KB (${fmt(r0.controllerRssKb.perAgentMax)} KB)` : 'n/a'} | ${r0 ? `+${n(r0.agentsAdded)}: ${s(r0.connectAllMs, 1)}, ${fmt(r0.controllerCpuConnectS)} s` : 'n/a'} |`,
      );
    }
}

/** ` (main x s, workers y s)`, or nothing for a result without the split. */
function split(c: CrashRun): string {
  const x = c.controllerSplit;
  return x ? ` (${fmt(x.mainS)} s, ${fmt(x.childrenS)} s)` : '';
}

function crashRows(pairs: FanoutPair[], p: (x?: string) => void): void {
  p(
    "| N | mode | SIGKILL → answering | → all connected | → all acked | → all fetched | fetched by a poll | push connections made (resumed) | controller CPU | agents' CPU | dial failures | connect refusals |",
  );
  p('|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const pair of pairs)
    for (const m of MODES) {
      const c = pair[m].crash;
      if (!c) continue;
      const codes = (x: Record<string, number> | undefined): string =>
        x && Object.keys(x).length
          ? Object.entries(x)
              .map(([k, v]) => `${k} ${n(v)}`)
              .join(', ')
          : 'none';
      p(
        `| ${n(pair.n)} | ${NAME[m]} | ${s(c.restartMs, 1)} | ${s(c.connectAllMs, 1)} | ${s(c.allAckedMs, 1)} | ${s(c.allFetchedMs, 1)}${c.noneLost ? '' : ` (${n(c.fetched)} of ${n(pair.n)})`} | ${n(c.fetchedByPoll)} | ${n(c.reconnections ?? 0)} (${n(c.resumed ?? 0)}) | ${fmt(c.controllerCpuS)} s${split(c)} | ${ms((1000 * c.controllerCpuS) / Math.max(1, c.reconnections ?? pair.n), 2)} | ${fmt(c.harnessCpuS)} s (${ms(c.harnessLoopDelayMaxMs ?? Number.NaN, 0)}) | ${codes(c.dialFailures)} | ${codes(c.connectRefusals)} |`,
      );
    }
  p();
  p(
    '| N | mode | probes made (skipped: not back yet) | acked | PATCH → ack p50 / p99 / slowest | PATCH answered p50 / p99 | controller: acks in the window | ≤ 10 ms | ≤ 100 ms | ≤ 1 s | half-open drops |',
  );
  p('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const pair of pairs)
    for (const m of MODES) {
      const c = pair[m].crash;
      if (!c) continue;
      const a = ackStorm(c);
      const pr = c.ackProbe;
      const h = c.ackLatency;
      p(
        `| ${n(pair.n)} | ${NAME[m]} | ${a.probesSent} (${pr?.skipped ?? 0}) | ${a.probesAcked} | ${pr ? `${ms(pr.ackMs.p50)} / ${ms(pr.ackMs.p99)} / ${ms(pr.ackMs.max)}` : 'n/a'} | ${pr ? `${ms(pr.commitMs.p50)} / ${ms(pr.commitMs.p99)}` : 'n/a'} | ${n(a.acks)} | ${n(atMostLe(h, 0.01))} | ${n(atMostLe(h, 0.1))} | ${n(atMostLe(h, 1))} | ${a.halfOpen} |`,
      );
    }
  const every5 = pairs.flatMap((pair) =>
    MODES.flatMap((m) => {
      const c = pair[m].crash;
      return c?.connectedEvery5s?.length ? [`${n(pair.n)} ${NAME[m]}: ${c.connectedEvery5s.map(n).join(', ')}`] : [];
    }),
  );
  if (every5.length) {
    p();
    p(`Push connections every 5 s after the restarted controller answered: ${every5.join('; ')}.`);
  }
}

function idleRows(idle: DialOutReport['idle'], p: (x?: string) => void): void {
  p(
    '| mode | agents | ping exchanges in the window | bytes (packets) | per ping exchange | poll over the push connection | per agent-hour |',
  );
  p('|---|---|---|---|---|---|---|');
  for (const m of MODES) {
    const x = idle[m];
    const g = x?.ping;
    if (!x || !g) {
      p(`| ${NAME[m]} | n/a | | | | | |`);
      continue;
    }
    p(
      `| ${NAME[m]} | ${x.agents} | ${g.pings} in ${g.windowS} s | ${n(g.bytes)} B (${n(g.packets)}) | ${fmt(g.bytesPerPing)} B, ${fmt(g.packetsPerPing, 2)} packets | ${g.pushPoll ? `${fmt(g.pushPoll.bytesPerPoll)} B (${g.pushPoll.overPush} of ${g.pushPoll.polls} over push)` : 'n/a'} | **${kb(idleBytesPerHour(x, m))}** |`,
    );
  }
}

export function dialOutMarkdown(r: DialOutReport): string {
  const L: string[] = [];
  const p = (x = ''): void => {
    L.push(x);
  };
  p(DIAL_OUT_MARKER);
  p('## Dial-out beside listener mode');
  p();
  p(
    `\`${r.command}\` on ${r.date.replace('T', ' ').slice(0, 19)} UTC in ${Math.round(r.elapsedS)} s; commit ${r.commit}. Machine: ${r.machine}.`,
  );
  p(
    `Load average (1, 5, 15 min) at start ${r.loadStart.join(' ')}, at end ${r.loadEnd.join(' ')}: shared cores, timings are upper bounds. ${r.isolation}`,
  );
  p();
  if (r.partial) {
    p('**Partial: written while the run was still going; the parts below are the finished ones.**');
    p();
  }
  p(
    r.problems.length === 0
      ? 'Checks: all passed.'
      : `Checks: **${r.problems.length} failed**: ${r.problems.map((x) => x.replace(/\|/g, '/')).join('; ')}`,
  );
  p();
  const goals = dialOutGoals(r);
  if (goals.length) {
    p('| figure | listener mode (same run) | goal | dial-out | verdict |');
    p('|---|---|---|---|---|');
    for (const g of goals)
      p(
        `| ${g.figure} | ${g.listener} | ${g.goal} | ${g.measured} | ${g.met === null ? g.by : `**${g.met ? 'met' : 'missed'}**: ${g.by}`} |`,
      );
    p();
  }
  if (r.latency) {
    p(`### PATCH → hook started, one node back to back (blocks of ${r.latency.block}, the modes in turn)`);
    p();
    latencyRows(r.latency, p);
    p();
  }
  if (r.fanout.length) {
    p("### One change to every node (the modes' runs in turn)");
    p();
    fanoutRows(r.fanout, p);
    p();
    if (r.fanout.some((x) => x.listener.crash || x.dialOut.crash)) {
      p('### After a controller restart: SIGKILL with a change pending, started again on its database');
      p();
      crashRows(r.fanout, p);
      p();
    }
  }
  if (r.idle.listener || r.idle.dialOut) {
    p('### Idle traffic per agent, on the wire');
    p();
    idleRows(r.idle, p);
    p();
  }
  return L.join('\n');
}
