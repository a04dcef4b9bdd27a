/**
 * The `--heat` benchmark's template (one DeployedServer per node, its deployments each writing the
 * time its hook started) and its BENCHMARKS.md section: medians and maxima from Heat's PATCH, the
 * stock node's rows only when it ran, and the signal polls' cost net of the idle window.
 */
import { describe, expect, it } from 'vitest';
import { benchTemplate, type HeatBenchResult } from '../../bench/heat.js';
import { HEAT_SECTION_MARKER, heatMarkdown } from '../../bench/heat-report.js';

const result = (over: Partial<HeatBenchResult> = {}): HeatBenchResult => ({
  date: '2026-12-07T22:30:00.000Z',
  machine: '2 cores',
  versions: { 'python3-heat': '1:19.0.0-3' },
  updates: [
    {
      cliMs: 1500,
      completeMs: 20_000,
      herald: { putMs: 1000, hookMs: 1010 },
      stock: { putMs: 1100, hookMs: 12_000, waitedMs: 10_900 },
    },
    {
      cliMs: 1700,
      completeMs: 30_000,
      herald: { putMs: 2000, hookMs: 2030 },
      stock: { putMs: 2100, hookMs: 28_000, waitedMs: 25_900 },
    },
    {
      cliMs: 1600,
      completeMs: 25_000,
      herald: { putMs: 3000, hookMs: 3020 },
      stock: { putMs: 3100, hookMs: 5_000, waitedMs: 1_900 },
    },
  ],
  stockIntervalS: 30,
  heads: [
    {
      deployments: 0,
      windowMs: 20_000,
      requests: {},
      controllerCpuMs: 20,
      heatCpuMs: 100,
      connections: 0,
      maxOpen: 0,
      refused: 0,
    },
    {
      deployments: 10,
      windowMs: 20_000,
      requests: { 'HEAD 200': 200, 'GET 200': 200 },
      controllerCpuMs: 420,
      heatCpuMs: 2000,
      connections: 200,
      maxOpen: 30,
      refused: 0,
    },
    {
      deployments: 20,
      windowMs: 20_000,
      requests: { 'HEAD 200': 300, 'GET 200': 300 },
      controllerCpuMs: 620,
      heatCpuMs: 4000,
      connections: 320,
      maxOpen: 64,
      refused: 20,
    },
  ],
  problems: [],
  ...over,
});

describe('the --heat benchmark', () => {
  it("writes a template of one server per node, each deployment's script appending its start time", () => {
    const t = benchTemplate([
      { node: 'hb1', deployments: 3 },
      { node: 'occb', deployments: 1 },
    ]);
    expect(t.match(/type: OS::Heat::DeployedServer/g)).toHaveLength(2);
    expect(t.match(/type: OS::Heat::SoftwareDeployment/g)).toHaveLength(4);
    expect(t).toContain('        container: occb');
    expect(t).toContain("        index: '2'");
    expect(t).toContain('date +%s%N >> "$marks/$node.$index"');
  });

  it('reports medians and maxima from the PATCH, and, per window, the polls per deployment, their connections and their CPU above idle', () => {
    const md = heatMarkdown(result());
    expect(md.startsWith(`${HEAT_SECTION_MARKER}\n`)).toBe(true);
    expect(md).toContain('| the hook started | Herald agent | 3 | 2030 ms | 3020 ms |');
    expect(md).toContain('| of it: PUT → hook started | Herald agent | 3 | 20 ms | 30 ms |');
    expect(md).toContain('| the hook started | os-collect-config, 30 s | 3 | 12 s | 28 s |');
    expect(md).toContain('| | idle (nothing in progress) | 10 deployments in progress | 20 deployments in progress |');
    expect(md).toContain('| HEADs per second per deployment | – | 1 | 0.75 |');
    // above idle: (420 - 20) ms over 400 requests and 200 connections; (620 - 20) ms over 600 and 320
    expect(md).toContain('| controller CPU per request, above idle (µs) | – | 1000 | 1000 |');
    expect(md).toContain('| controller CPU per connection accepted, above idle (µs) | – | 2000 | 1875 |');
    expect(md).toContain("| connections refused, `too_many_connections` (the controller's log) | 0 | 0 | 20 |");
    expect(md).not.toContain('Problems');
  });

  it('leaves the stock node out, saying why, and names a problem', () => {
    const md = heatMarkdown(result({ stockSkipped: 'no stock node: x (missing)', problems: ['Heat exited'] }));
    expect(md).not.toContain('os-collect-config, 30 s |');
    expect(md).toContain('Stock node left out: no stock node: x (missing).');
    expect(md).toContain('Problems: Heat exited');
  });
});
