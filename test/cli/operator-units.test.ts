import { describe, expect, it } from 'vitest';
import { SseParser, ApiError, type SseEvent } from '../../cli/operator/client.js';
import { parseDuration, parseInputDecl, parseKeyValues, table, keyValues } from '../../cli/operator/format.js';
import { buildConfigRequest } from '../../cli/operator/requests.js';
import { clusterStateOf, watchRestart, type WatchEvent } from '../../cli/operator/watch.js';
import type { ClusterNodePhase, ClusterNodeView, ClusterStatus, ClusterView } from '../../protocol/rest.js';
import { lineOf } from '../../cli/operator/progress.js';
import type { ApiClient } from '../../cli/operator/client.js';
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
    expect(
      table(
        ['A', 'LONGER'],
        [
          ['xx', null],
          ['y', 3],
        ],
      ),
    ).toBe('A   LONGER\nxx  -\ny   3\n');
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
    expect(
      buildConfigRequest({
        name: 'i',
        group: 'script',
        text: 'echo',
        input: ['a=1'],
        hiddenInput: ['p'],
        output: ['url'],
        hookTimeout: '90s',
      }),
    ).toEqual({
      name: 'i',
      group: 'script',
      config: 'echo',
      inputs: [
        { name: 'a', type: 'String', default: '1' },
        { name: 'p', type: 'String', hidden: true },
      ],
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
  const node = (n: string, phase: ClusterNodePhase, extra: Partial<ClusterNodeView> = {}): ClusterNodeView => ({
    node: n,
    phase,
    reason: null,
    install_deployment_id: `i-${n}`,
    uninstall_deployment_id: `u-${n}`,
    uninstall_started_at: null,
    uninstall_finished_at: null,
    install_started_at: null,
    install_finished_at: null,
    step_deadline_at: null,
    nodegroup: 'default-worker',
    health_deployment_id: null,
    check_started_at: null,
    ended_at: null,
    revision: 1,
    ...extra,
  });
  const cluster = (id: string, status: ClusterStatus, nodes: ClusterNodeView[]): ClusterView => ({
    id,
    name: 'demo',
    status,
    status_reason: '',
    install_config_id: 'ci',
    uninstall_config_id: 'cu',
    input_values: {},
    operation: 'restart',
    max_unavailable: nodes.length,
    operation_started_at: null,
    operation_finished_at: null,
    creation_time: '',
    updated_time: '',
    nodes,
    nodegroups: [],
    rollout: null,
    revision: 1,
    counters: { targeted: nodes.length, completed: 0, failed: 0, timed_out: 0, in_flight: 0, reverted: 0 },
  });

  function fakeClient(states: ClusterView[]): ApiClient {
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
      cluster('c', 'RESTART_IN_PROGRESS', [node('n1', 'uninstalling'), node('n2', 'pending')]),
      cluster('c', 'RESTART_COMPLETE', [
        node('n1', 'complete', {
          uninstall_started_at: iso(0),
          uninstall_finished_at: iso(40),
          install_started_at: iso(40),
          install_finished_at: iso(75),
        }),
        node('n2', 'complete'),
      ]),
    ]);
    const events: WatchEvent[] = [];
    const r = await watchRestart(client, {
      clusterId: 'c',
      startedAt: new Date(t),
      timeoutMs: 5_000,
      pollIntervalMs: 10,
      onEvent: (e) => events.push(e),
    });
    expect(r.ok).toBe(true);
    const phases = events
      .filter((e) => e.kind === 'phase')
      .map((e) => `${(e as { node: string }).node} ${(e as { phase: string }).phase}`);
    expect(phases).toEqual([
      'n1 uninstalling',
      'n1 installing',
      'n1 complete',
      'n2 uninstalling',
      'n2 installing',
      'n2 complete',
    ]);
    const done = events.find((e) => e.kind === 'phase' && e.node === 'n1' && e.phase === 'complete')!;
    expect(lineOf(done)).toMatch(/n1 complete \(uninstall 40 ms, install 35 ms\)$/);
  });

  it('reports the failing node on RESTART_FAILED and times out otherwise', async () => {
    const failed = await watchRestart(
      fakeClient([
        cluster('c', 'RESTART_FAILED', [
          node('n1', 'complete'),
          node('n2', 'failed', { reason: 'exit 3' }),
          node('n3', 'pending'),
        ]),
      ]),
      { clusterId: 'c', startedAt: new Date(), timeoutMs: 5_000, pollIntervalMs: 10, onEvent: () => undefined },
    );
    expect(failed).toMatchObject({ ok: false, timedOut: false, failed: [{ node: 'n2', reason: 'exit 3' }] });

    const slow = await watchRestart(fakeClient([cluster('c', 'RESTART_IN_PROGRESS', [node('n1', 'uninstalling')])]), {
      clusterId: 'c',
      startedAt: new Date(),
      timeoutMs: 100,
      pollIntervalMs: 10,
      onEvent: () => undefined,
    });
    expect(slow).toMatchObject({ ok: false, timedOut: true });
  });

  it('reads the typed cluster view: times as epoch ms, an empty reason as none', () => {
    const c = clusterStateOf(
      cluster('c', 'RESTART_IN_PROGRESS', [
        node('n1', 'installing', { uninstall_finished_at: '2026-01-01T00:00:00.040Z' }),
      ]),
    );
    expect(c).toMatchObject({ id: 'c', name: 'demo', status: 'RESTART_IN_PROGRESS', statusReason: undefined });
    expect(c.nodes).toEqual([
      {
        node: 'n1',
        phase: 'installing',
        reason: undefined,
        uninstallStartedMs: undefined,
        uninstallDoneMs: Date.parse('2026-01-01T00:00:00.040Z'),
        installStartedMs: undefined,
        installDoneMs: undefined,
      },
    ]);
  });

  it('reports wake-ups from the push-state events of member nodes, once per acknowledgement', async () => {
    const t = Date.now();
    let onEvent: ((e: SseEvent) => void) | undefined;
    let looks = 0;
    const states = [
      cluster('c', 'RESTART_IN_PROGRESS', [node('n1', 'uninstalling')]),
      cluster('c', 'RESTART_COMPLETE', [node('n1', 'complete')]),
    ];
    const client = {
      get: async () => states[Math.min(looks++, 1)],
      events: (fn: (e: SseEvent) => void) => {
        onEvent = fn;
        return { close: () => undefined };
      },
    } as unknown as ApiClient;
    const events: WatchEvent[] = [];
    const push = (n: string, ackMs: number): SseEvent => ({
      event: 'push',
      id: '1',
      data: {
        type: 'push',
        at: '',
        node: n,
        state: 'connected',
        connected: true,
        generation_pushed: 3,
        generation_acked: 3,
        last_ack_at: new Date(ackMs).toISOString(),
        last_error: null,
        last_error_at: null,
      },
    });
    const watching = watchRestart(client, {
      clusterId: 'c',
      startedAt: new Date(t),
      timeoutMs: 5_000,
      pollIntervalMs: 60_000,
      onEvent: (e) => events.push(e),
    });
    await new Promise((r) => setTimeout(r, 20));
    onEvent!(push('n1', t + 5));
    onEvent!(push('n1', t + 5));
    onEvent!(push('other', t + 6));
    onEvent!(push('n1', t - 1_000));
    expect(await watching).toMatchObject({ ok: true });
    expect(events.filter((e) => e.kind === 'woken')).toEqual([
      { kind: 'woken', at: new Date(t + 5), node: 'n1', detail: 'gen 3' },
    ]);
  });
});

describe('demo timeline', () => {
  it('orders events and puts nodes that did the same thing at once on one line', async () => {
    const { timelineLines } = await import('../../cli/demo/run.js');
    const t0 = new Date('2026-01-01T00:00:00.000Z');
    const at = (ms: number): Date => new Date(t0.getTime() + ms);
    const lines = timelineLines(
      [
        { kind: 'phase', at: at(300), node: 'n1', phase: 'installing' },
        { kind: 'phase', at: at(2), node: 'n1', phase: 'uninstalling' },
        { kind: 'phase', at: at(3), node: 'n2', phase: 'uninstalling' },
        { kind: 'status', at: at(50), status: 'RESTART_IN_PROGRESS' },
        { kind: 'woken', at: at(70), node: 'n2', detail: '' },
        { kind: 'status', at: at(900), status: 'RESTART_COMPLETE' },
      ],
      t0,
    );
    expect(lines.map((l) => l.trim().replace(/\s+/g, ' '))).toEqual([
      '+0 ms restart accepted',
      '+2 ms n1, n2 uninstalling',
      '+70 ms n2 woken',
      '+300 ms n1 uninstall done, installing',
      '+900 ms cluster RESTART_COMPLETE',
    ]);
  });
});
