import { describe, expect, it } from 'vitest';
import { SseParser, ApiError, type SseEvent } from '../../cli/operator-client.js';
import { parseDuration, parseInputDecl, parseKeyValues, table, keyValues } from '../../cli/operator-format.js';
import { buildConfigRequest } from '../../cli/operator-requests.js';
import { normalizeCluster, watchRestart, type WatchEvent } from '../../cli/operator-watch.js';
import { lineOf } from '../../cli/operator-progress.js';
import type { ApiClient } from '../../cli/operator-client.js';
import { HeraldError } from '../../protocol/errors.js';

describe('SseParser', () => {
  it('parses events split across chunks, joins data lines, skips comments', () => {
    const got: SseEvent[] = [];
    const p = new SseParser((e) => got.push(e));
    p.push(': hello\n\nevent: cluster\nid: 7\ndata: {"id":"c1",');
    p.push('\ndata: "x":1}\n\r\ndata: plain\n\n');
    expect(got).toEqual([
      { event: 'cluster', id: '7', data: { id: 'c1', x: 1 } },
      { event: 'message', id: '7', data: 'plain' },
    ]);
  });
});

describe('format', () => {
  it('aligns tables without trailing spaces', () => {
    expect(table(['A', 'LONGER'], [['xx', null], ['y', 3]])).toBe('A   LONGER\nxx  -\ny   3\n');
  });
  it('shows nested objects and scripts', () => {
    expect(keyValues({ id: 'a', config: '#!/bin/sh\necho hi\n', push: { connected: true } })).toBe(
      'id:     a\nconfig: |\n    #!/bin/sh\n    echo hi\npush:\n  connected: true\n',
    );
  });
  it('parses durations, k=v and input declarations', () => {
    expect(parseDuration('10m', '--timeout')).toBe(600_000);
    expect(parseDuration('90', '--timeout')).toBe(90_000);
    expect(() => parseDuration('soon', '--timeout')).toThrow(HeraldError);
    expect(parseKeyValues(['a=1', 'b=x=y', 'c=json:[1,2]'], '--input')).toEqual({ a: '1', b: 'x=y', c: [1, 2] });
    expect(() => parseKeyValues(['novalue'], '--input')).toThrow(/key=value/);
    expect(parseInputDecl('port:number=8080', '--input')).toEqual({ name: 'port', type: 'Number', default: '8080' });
    expect(parseInputDecl('pw', '--hidden-input', true)).toEqual({ name: 'pw', type: 'String', hidden: true });
    expect(() => parseInputDecl('x:Float', '--input')).toThrow(/type must be/);
  });
  it('builds a config request', () => {
    expect(buildConfigRequest({ name: 'i', group: 'script', text: 'echo', input: ['a=1'], hiddenInput: ['p'], output: ['url'], hookTimeout: '90s' })).toEqual({
      name: 'i', group: 'script', config: 'echo',
      inputs: [{ name: 'a', type: 'String', default: '1' }, { name: 'p', type: 'String', hidden: true }],
      outputs: [{ name: 'url', type: 'String' }],
      options: { timeout: 90 },
    });
  });
});

describe('ApiError', () => {
  it('keeps a known code, names the field; wraps an unknown code in api_error', () => {
    const e = new ApiError(400, 'invalid_request', 'bad group', 'group');
    expect(e.code).toBe('invalid_request');
    expect(e.message).toBe('bad group (field group)');
    const u = new ApiError(400, 'brand_new', 'what');
    expect(u.code).toBe('api_error');
    expect(u.message).toBe('brand_new: what');
  });
});

describe('watchRestart', () => {
  const node = (n: string, phase: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({ node: n, phase, ...extra });

  function fakeClient(states: unknown[]): ApiClient {
    let i = 0;
    return {
      get: async () => states[Math.min(i++, states.length - 1)],
      events: () => ({ close: () => undefined }),
    } as unknown as ApiClient;
  }

  it('fills in skipped phases in order and ends on RESTART_COMPLETE', async () => {
    const t = Date.parse('2026-01-01T00:00:00.000Z');
    const iso = (ms: number): string => new Date(t + ms).toISOString();
    const client = fakeClient([
      { id: 'c', status: 'RESTART_IN_PROGRESS', nodes: [node('n1', 'uninstalling'), node('n2', 'pending')] },
      { id: 'c', status: 'RESTART_COMPLETE', nodes: [
        node('n1', 'complete', { uninstall_started_at: iso(0), uninstall_finished_at: iso(40), install_started_at: iso(40), install_finished_at: iso(75) }),
        node('n2', 'complete'),
      ] },
    ]);
    const events: WatchEvent[] = [];
    const r = await watchRestart(client, { clusterId: 'c', startedAt: new Date(t), timeoutMs: 5_000, pollIntervalMs: 10, onEvent: (e) => events.push(e) });
    expect(r.ok).toBe(true);
    const phases = events.filter((e) => e.kind === 'phase').map((e) => `${(e as { node: string }).node} ${(e as { phase: string }).phase}`);
    expect(phases).toEqual(['n1 uninstalling', 'n1 installing', 'n1 complete', 'n2 uninstalling', 'n2 installing', 'n2 complete']);
    const done = events.find((e) => e.kind === 'phase' && e.node === 'n1' && e.phase === 'complete')!;
    expect(lineOf(done)).toMatch(/n1 complete \(uninstall 40 ms, install 35 ms\)$/);
  });

  it('reports the failing node on RESTART_FAILED and times out otherwise', async () => {
    const failed = await watchRestart(fakeClient([
      { id: 'c', status: 'RESTART_FAILED', nodes: [node('n1', 'complete'), node('n2', 'failed', { reason: 'exit 3' }), node('n3', 'pending')] },
    ]), { clusterId: 'c', startedAt: new Date(), timeoutMs: 5_000, pollIntervalMs: 10, onEvent: () => undefined });
    expect(failed).toMatchObject({ ok: false, timedOut: false, failed: [{ node: 'n2', reason: 'exit 3' }] });

    const slow = await watchRestart(fakeClient([{ id: 'c', status: 'RESTART_IN_PROGRESS', nodes: [node('n1', 'uninstalling')] }]),
      { clusterId: 'c', startedAt: new Date(), timeoutMs: 100, pollIntervalMs: 10, onEvent: () => undefined });
    expect(slow).toMatchObject({ ok: false, timedOut: true });
  });

  it('normalizes node maps and bare ids', () => {
    expect(normalizeCluster({ id: 'c', status: 'X', nodes: { n1: 'complete' } }).nodes[0]).toMatchObject({ node: 'n1', phase: 'complete' });
    expect(normalizeCluster({ cluster_id: 'c', nodes: ['n1'] })).toMatchObject({ id: 'c', status: 'UNKNOWN', nodes: [{ node: 'n1', phase: 'pending' }] });
  });
});

describe('demo timeline', () => {
  it('orders events and puts nodes that did the same thing at once on one line', async () => {
    const { timelineLines } = await import('../../cli/demo-run.js');
    const t0 = new Date('2026-01-01T00:00:00.000Z');
    const at = (ms: number): Date => new Date(t0.getTime() + ms);
    const lines = timelineLines([
      { kind: 'phase', at: at(300), node: 'n1', phase: 'installing' },
      { kind: 'phase', at: at(2), node: 'n1', phase: 'uninstalling' },
      { kind: 'phase', at: at(3), node: 'n2', phase: 'uninstalling' },
      { kind: 'status', at: at(50), status: 'RESTART_IN_PROGRESS' },
      { kind: 'woken', at: at(70), node: 'n2', detail: '' },
      { kind: 'status', at: at(900), status: 'RESTART_COMPLETE' },
    ], t0);
    expect(lines.map((l) => l.trim().replace(/\s+/g, ' '))).toEqual([
      '+0 ms restart accepted',
      '+2 ms n1, n2 uninstalling',
      '+70 ms n2 woken',
      '+300 ms n1 uninstall done, installing',
      '+900 ms cluster RESTART_COMPLETE',
    ]);
  });
});
