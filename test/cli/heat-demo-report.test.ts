/**
 * What `herald demo --heat` and the benchmark read of Heat's log (cli/testbed/heat-log.ts, on lines
 * as heat-all 19 writes them) and of the controller's log, and how the demo judges and prints a
 * restart (cli/demo/heat-report.ts).
 */
import { describe, expect, it } from 'vitest';
import {
  heatChecks,
  heatMetadataPuts,
  heatTimelineLines,
  pollingLines,
  type HeatRestartFacts,
} from '../../cli/demo/heat-report.js';
import { heatLogLines, requestReceivedAt, stackEndedAt } from '../../cli/testbed/heat-log.js';

const CTX = '[None req-6b06252a-35b0-4d4b-9ae8-474353e3f057 admin - - - - -]';
const HEAT_LOG = [
  `2026-12-07 21:49:54.006 5256 INFO heat.engine.stack ${CTX} Stack CREATE COMPLETE (h1): Stack CREATE completed successfully`,
  `2026-12-07 21:50:00.888 5256 DEBUG heat.api.middleware.version_negotiation ${CTX} Processing request: PATCH /v1/admin/stacks/h1 Accept: application/json process_request /usr/lib/python3/dist-packages/heat/api/middleware/version_negotiation.py:57`,
  `2026-12-07 21:50:00.889 5256 INFO heat.common.wsgi ${CTX} Processing request: PATCH /v1/admin/stacks/h1`,
  `2026-12-07 21:50:00.935 5256 INFO heat.common.wsgi ${CTX} Processing request: PATCH /v1/admin/stacks/h1/785434c8-5e79-4ded-a5cb-51b5a0532eb0`,
  'Traceback (most recent call last):',
  '  File "x.py", line 1, in <module>',
  `2026-12-07 21:50:01.100 5256 INFO heat.common.wsgi ${CTX} Processing request: PATCH /v1/admin/stacks/h10`,
  `2026-12-07 21:50:02.000 5256 INFO heat.engine.stack ${CTX} Stack UPDATE IN_PROGRESS (h1): Stack UPDATE started`,
  `2026-12-07 21:50:03.188 5256 INFO heat.engine.stack ${CTX} Stack UPDATE COMPLETE (h1): Stack UPDATE completed successfully`,
  `2026-12-07 21:50:09.500 5256 INFO heat.engine.stack ${CTX} Stack UPDATE FAILED (h10): Resource UPDATE failed: Error: Deployment to server failed: deploy_status_code : Deployment exited with non-zero status code: 3`,
].join('\n');
const at = (t: string): number => Date.parse(`2026-12-07T${t}Z`);

describe("Heat's log", () => {
  it('reads each line of oslo.log shape in UTC, skipping a traceback', () => {
    const lines = heatLogLines(HEAT_LOG);
    expect(lines).toHaveLength(8);
    expect(lines[0]).toMatchObject({ at: at('21:49:54.006'), logger: 'heat.engine.stack' });
    expect(lines[0]!.message).toMatch(/^Stack CREATE COMPLETE \(h1\)/);
  });

  it("finds the stack's PATCH as the API received it (by name, the first after the time given)", () => {
    expect(requestReceivedAt(HEAT_LOG, 'PATCH', 'h1')).toBe(at('21:50:00.889'));
    expect(requestReceivedAt(HEAT_LOG, 'PATCH', 'h1', at('21:50:00.900'))).toBe(at('21:50:00.935'));
    expect(requestReceivedAt(HEAT_LOG, 'PATCH', 'h10')).toBe(at('21:50:01.100'));
    expect(requestReceivedAt(HEAT_LOG, 'PATCH', 'h1', at('21:50:01.000'))).toBeUndefined();
    expect(requestReceivedAt(HEAT_LOG, 'DELETE', 'h1')).toBeUndefined();
  });

  it("finds the end of a stack's operation, COMPLETE or FAILED with its reason, never IN_PROGRESS or another stack's", () => {
    expect(stackEndedAt(HEAT_LOG, 'h1', 'UPDATE')).toEqual({
      at: at('21:50:03.188'),
      action: 'UPDATE',
      status: 'COMPLETE',
      reason: 'Stack UPDATE completed successfully',
    });
    expect(stackEndedAt(HEAT_LOG, 'h10', 'UPDATE')).toMatchObject({
      status: 'FAILED',
      reason: /non-zero status code: 3/,
    });
    expect(stackEndedAt(HEAT_LOG, 'h1', 'UPDATE', at('21:50:04'))).toBeUndefined();
    expect(stackEndedAt(HEAT_LOG, 'h1', 'CREATE')).toMatchObject({ status: 'COMPLETE' });
  });
});

describe("the demo's restart report", () => {
  const T = 1_000_000;
  const facts = (over: Partial<HeatRestartFacts> = {}): HeatRestartFacts => ({
    nodes: ['n1', 'n2'],
    cmdAt: T,
    patchAt: T + 800,
    puts: [
      { node: 'n1', at: T + 3000 },
      { node: 'n2', at: T + 3005 },
      { node: 'n1', at: T + 3400 },
      { node: 'n2', at: T + 3420 },
    ],
    hooks: [
      { node: 'n1', hook: 'uninstall', at: T + 3010 },
      { node: 'n2', hook: 'uninstall', at: T + 3015 },
      { node: 'n1', hook: 'install', at: T + 3412 },
      { node: 'n2', hook: 'install', at: T + 3431 },
    ],
    ended: { at: T + 5000, action: 'UPDATE', status: 'COMPLETE', reason: 'Stack UPDATE completed successfully' },
    pollIntervalS: 30,
    ...over,
  });

  it("reads the controller's heat.metadata events after the command, those that changed something", () => {
    const log = [
      JSON.stringify({ level: 30, time: T - 5, event: 'heat.metadata', node: 'n1', changed: 1 }),
      JSON.stringify({ level: 30, time: T + 3000, event: 'heat.metadata', node: 'n1', changed: 1 }),
      JSON.stringify({ level: 30, time: T + 3001, event: 'heat.metadata', node: 'n2', changed: 0 }),
      '{"level":30,"time":',
      JSON.stringify({ level: 30, time: T + 3002, event: 'other', node: 'n2', changed: 1 }),
    ].join('\n');
    expect(heatMetadataPuts(log, T)).toEqual([{ node: 'n1', at: T + 3000 }]);
  });

  it('prints the steps in time order, nodes doing the same at once on one line', () => {
    expect(heatTimelineLines(facts())).toEqual([
      '     +0 ms  openstack stack update --existing --parameter restart_trigger=… started',
      "   +800 ms  Heat's API received the PATCH",
      "   +3.00 s  n1, n2      Heat's metadata PUT reached Herald",
      '   +3.01 s  n1, n2      uninstall hook started',
      "   +3.40 s  n1          Heat's metadata PUT reached Herald",
      '   +3.41 s  n1          install hook started',
      "   +3.42 s  n2          Heat's metadata PUT reached Herald",
      '   +3.43 s  n2          install hook started',
      '   +5.00 s  Heat: stack UPDATE_COMPLETE',
    ]);
  });

  it('holds when every node ran uninstall then install and Heat completed; says what did not, otherwise', () => {
    expect(heatChecks(facts())).toEqual([]);
    const f = facts({
      hooks: [
        { node: 'n1', hook: 'install', at: T + 3000 },
        { node: 'n1', hook: 'uninstall', at: T + 3100 },
        { node: 'n2', hook: 'uninstall', at: T + 3015 },
      ],
      ended: { at: T + 9000, action: 'UPDATE', status: 'FAILED', reason: 'timed out' },
    });
    expect(heatChecks(f)).toEqual([
      'n1: the install started before the uninstall',
      'n2: the install hook did not start',
      'Heat ended the stack update UPDATE_FAILED: timed out',
    ]);
    expect(heatChecks(facts({ ended: undefined }))).toEqual(['Heat did not end the stack update']);
  });

  it("sets Herald's measured gaps beside polling's computed wait", () => {
    const lines = pollingLines(facts());
    expect(lines[0]).toMatch(/^Herald \(measured\): each hook started 10-12 ms after/);
    expect(lines[1]).toMatch(
      /computed, not measured\): a write waits for the next poll, 15 s on average, up to 30 s\.$/,
    );
    // the install's write came 0.4 s after the uninstall started: 15 + (30 - 0.4) s on average
    expect(lines[3]).toMatch(/about 45 s more than Herald on average, up to 60 s\.$/);
  });
});
