/**
 * The BENCHMARKS.md section of `npm run bench -- --heat` (bench/heat.ts): generated tables only;
 * the reading of them is the hand-written kept section after it.
 */
import type { HeadsWindow, HeatBenchResult, HeatUpdateSample } from './heat.js';
import { HEAT_UPDATES, total } from './heat.js';
import { median, round } from './util.js';

/** The marker that starts the generated section (replaceKeptSection replaces up to the next kept marker). */
export const HEAT_SECTION_MARKER = '<!-- kept: heat (npm run bench -- --heat replaces this section) -->';

const finite = (xs: readonly number[]): number[] => xs.filter((x) => Number.isFinite(x));

/** `median | max` of the samples, ms (or s from 10 s on), `–` when none. */
function medMax(xs: readonly number[]): string {
  const ys = finite(xs);
  if (ys.length === 0) return '– | –';
  const t = (ms: number): string => (ms >= 10_000 ? `${round(ms / 1000, 1)} s` : `${Math.round(ms)} ms`);
  return `${t(median(ys))} | ${t(Math.max(...ys))}`;
}

function row(what: string, node: string, xs: readonly number[]): string {
  return `| ${what} | ${node} | ${finite(xs).length} | ${medMax(xs)} |`;
}

function samplesText(xs: readonly number[]): string {
  return xs.map((x) => (Number.isFinite(x) ? String(Math.round(x)) : '–')).join(', ');
}

function countsText(c: Record<string, number>): string {
  const e = Object.entries(c).sort((a, b) => b[1] - a[1]);
  return e.length === 0 ? 'none' : e.map(([k, n]) => `${k}: ${n}`).join(', ');
}

/** The section, from its marker to its last table. */
export function heatMarkdown(r: HeatBenchResult): string {
  const u = r.updates;
  const of = (f: (s: HeatUpdateSample) => number | undefined): number[] => u.map((s) => f(s) ?? Number.NaN);
  const stock = `os-collect-config, ${r.stockIntervalS} s`;
  const versions = Object.entries(r.versions)
    .map(([p, v]) => `${p} ${v}`)
    .join(', ');
  const L: string[] = [
    HEAT_SECTION_MARKER,
    '## Heat: stack update → hook started, and what its signal polls cost',
    '',
    `\`npm run bench -- --heat\` on ${r.date.slice(0, 16).replace('T', ' ')} UTC; ${r.machine}. Debian ${versions || 'packages unknown'}.`,
    '',
    `### Stack update → hook started (${u.length} updates${u.length < HEAT_UPDATES ? ', quick' : ''})`,
    '',
    "| from Heat's API receiving the PATCH to … | node | updates | median | max |",
    '|---|---|---|---|---|',
    row(
      "the metadata PUT at Herald (Heat's share)",
      'Herald agent',
      of((s) => s.herald.putMs),
    ),
    row(
      'the hook started',
      'Herald agent',
      of((s) => s.herald.hookMs),
    ),
    row(
      'of it: PUT → hook started',
      'Herald agent',
      of((s) => s.herald.hookMs - s.herald.putMs),
    ),
  ];
  if (r.stockSkipped === undefined)
    L.push(
      row(
        "the metadata PUT at Herald (Heat's share)",
        stock,
        of((s) => s.stock?.putMs),
      ),
      row(
        'the hook started',
        stock,
        of((s) => s.stock?.hookMs),
      ),
      row(
        'of it: PUT → hook started',
        stock,
        of((s) => s.stock?.waitedMs),
      ),
    );
  L.push(
    row(
      'UPDATE_COMPLETE',
      'the stack',
      of((s) => s.completeMs),
    ),
    row(
      '(before it) the `openstack stack update` command started → the PATCH',
      'the CLI',
      of((s) => s.cliMs),
    ),
    '',
    `PATCH → hook started, each update (ms): Herald agent ${samplesText(of((s) => s.herald.hookMs))}.`,
  );
  if (r.stockSkipped === undefined) L.push(`${stock}: ${samplesText(of((s) => s.stock?.hookMs))}.`);
  else L.push(`Stock node left out: ${r.stockSkipped}.`);
  const idle = r.heads.find((w) => w.deployments === 0);
  const busy = r.heads.filter((w) => w.deployments > 0);
  if (idle !== undefined && busy.length > 0) {
    const windowS = round(idle.windowMs / 1000, 0);
    // the controller's CPU above the idle window's rate, ms
    const net = (w: HeadsWindow): number => w.controllerCpuMs - (idle.controllerCpuMs / idle.windowMs) * w.windowMs;
    const per = (w: HeadsWindow, d: number | null): string => (d ? String(round((net(w) * 1000) / d, 0)) : '–');
    const cells = (f: (w: HeadsWindow) => string | number): string => busy.map((w) => ` ${f(w)} |`).join('');
    const pctCore = (ms: number, w: HeadsWindow): number => round((ms / w.windowMs) * 100, 1);
    L.push(
      '',
      `### Heat's signal polls: deployments kept in progress (the agent stopped), ${windowS} s windows`,
      '',
      `| | idle (nothing in progress) |${busy.map((w) => ` ${w.deployments} deployments in progress |`).join('')}`,
      `|---|---|${busy.map(() => '---|').join('')}`,
      `| object store requests (method, status: count) | ${countsText(idle.requests)} |${cells((w) => countsText(w.requests))}`,
      `| HEADs per second per deployment | – |${cells((w) => round(total(w.requests, 'HEAD') / (w.windowMs / 1000) / w.deployments, 2))}`,
      `| TCP connections accepted (the run's network namespace) | ${idle.connections ?? '–'} |${cells((w) => w.connections ?? '–')}`,
      `| object store connections open at once (most, sampled each second) | ${idle.maxOpen} |${cells((w) => w.maxOpen)}`,
      `| connections refused, \`too_many_connections\` (the controller's log) | ${idle.refused} |${cells((w) => w.refused)}`,
      `| controller main process CPU (ms) | ${idle.controllerCpuMs} |${cells((w) => w.controllerCpuMs)}`,
      `| controller CPU per request, above idle (µs) | – |${cells((w) => per(w, total(w.requests)))}`,
      `| controller CPU per connection accepted, above idle (µs) | – |${cells((w) => per(w, w.connections))}`,
      `| controller CPU per deployment in progress (% of one core) | – |${cells((w) => round((net(w) / w.windowMs / w.deployments) * 100, 3))}`,
      `| heat-all CPU (ms; % of one core) | ${idle.heatCpuMs}; ${pctCore(idle.heatCpuMs, idle)} |${cells((w) => `${w.heatCpuMs}; ${pctCore(w.heatCpuMs, w)}`)}`,
    );
  }
  if (r.problems.length > 0) L.push('', `Problems: ${r.problems.join('; ')}`);
  L.push('');
  return L.join('\n');
}
