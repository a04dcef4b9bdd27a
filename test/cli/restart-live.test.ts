/**
 * `herald cluster restart <id> --wait` shows each node's live output (docs/api.md): against a real
 * controller and real agents, its (non-TTY) lines carry each member's output line with where its
 * step stands against the deadline while the step runs, and the summary names the last line.
 * The pure parts (the step clock, a chunk's last line) are tested without sockets.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stepClock } from '../../cli/operator/progress.js';
import { outputEventOf, type NodeState } from '../../cli/operator/watch.js';
import {
  makePki,
  runCli,
  startAgent,
  startController,
  tempDir,
  waitForNodes,
  type Controller,
  type Proc,
} from './harness.js';

const INSTALL = `#!/bin/sh
for i in 1 2 3 4 5 6; do echo "install step $i of 6"; sleep 0.25; done
`;
const UNINSTALL = '#!/bin/sh\necho "stopping"\n';

describe('the step clock and a chunk line (pure)', () => {
  const base: NodeState = {
    node: 'n1',
    phase: 'installing',
    reason: undefined,
    uninstallStartedMs: 0,
    uninstallDoneMs: 1_000,
    installStartedMs: 1_000,
    installDoneMs: undefined,
    checkStartedMs: undefined,
    stepDeadlineMs: 661_000,
  };

  it('says the phase, its time and its deadline, and when it is past it', () => {
    expect(stepClock(base, 13_000)).toBe('installing 12.0 s of 11m00s');
    expect(stepClock(base, 700_000)).toBe('installing 11m39s of 11m00s (past its deadline)');
    expect(stepClock({ ...base, phase: 'complete' }, 13_000)).toBeUndefined();
  });

  it("takes a member's chunk's last non-empty line, and nothing of other nodes or events", () => {
    const members = new Set(['n1']);
    const ev = (data: unknown, event = 'output') => ({ event, id: '1', data });
    expect(outputEventOf(ev({ node: 'n1', text: 'a\nb\r\n\n' }), members)).toMatchObject({ node: 'n1', line: 'b' });
    expect(outputEventOf(ev({ node: 'n2', text: 'a\n' }), members)).toBeUndefined();
    expect(outputEventOf(ev({ node: 'n1', text: '\n\n' }), members)).toBeUndefined();
    expect(outputEventOf(ev({ node: 'n1', text: 'a\n' }, 'deployment'), members)).toBeUndefined();
  });
});

let dir: string;
let ctl: Controller;
let agent: Proc | undefined;
let conn: string[];
let clusterId: string;

beforeAll(async () => {
  dir = tempDir('herald-restart-live-');
  const pki = await makePki(dir, ['n1']);
  ctl = await startController(dir, pki);
  agent = await startAgent(dir, pki, 'n1', ctl.url);
  await waitForNodes(ctl.client, ['n1']);
  conn = ['--controller', ctl.url, '--pki', pki];
  const install = await ctl.client.post<{ id: string }>('/v1/configs', { name: 'i', group: 'script', config: INSTALL });
  const uninstall = await ctl.client.post<{ id: string }>('/v1/configs', {
    name: 'u',
    group: 'script',
    config: UNINSTALL,
  });
  const created = await runCli([
    'cluster',
    'create',
    '--name',
    'live',
    '--nodes',
    'n1',
    '--install',
    install.id,
    '--uninstall',
    uninstall.id,
    '--wait',
    '--json',
    ...conn,
  ]);
  clusterId = (JSON.parse(created.stdout) as { id: string }).id;
}, 90_000);

afterAll(async () => {
  await agent?.stop();
  await ctl?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('herald cluster restart --wait with live output', () => {
  it("shows the node's output lines while its step runs, with its time against the deadline, and a summary", async () => {
    // meanwhile, what GET /v1/clusters/{id} says of n1 while it installs
    const seen: Array<{ phase: string; line: string | null }> = [];
    const sample = async (): Promise<void> => {
      const c = await ctl.client.get<{ nodes: Array<{ phase: string; last_output_line: string | null }> }>(
        `/v1/clusters/${clusterId}`,
      );
      seen.push({ phase: c.nodes[0]!.phase, line: c.nodes[0]!.last_output_line });
    };
    let running = true;
    const watching = (async () => {
      while (running) {
        await sample();
        await new Promise((res) => setTimeout(res, 100));
      }
    })();
    const r = await runCli(['cluster', 'restart', clusterId, '--wait', '--timeout', '40s', ...conn], {
      timeoutMs: 50_000,
    });
    running = false;
    await watching;
    await sample(); // once the restart is over
    expect(seen.some((s) => s.phase === 'installing' && /^install step [1-5] of 6$/.test(s.line ?? ''))).toBe(true);
    expect(seen.at(-1)).toEqual({ phase: 'complete', line: 'install step 6 of 6' });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const lines = r.stdout.trim().split('\n');
    const installing = lines.findIndex((l) => / n1 installing$/.test(l));
    const complete = lines.findIndex((l) => / n1 complete/.test(l));
    expect(installing).toBeGreaterThan(-1);
    expect(complete).toBeGreaterThan(installing);
    const shown = lines
      .slice(installing + 1, complete)
      .filter((l) => / n1 \| /.test(l))
      .map((l) => /\| (install step \d of 6) {2}\[installing [\d.]+ m?s of 11m00s\]$/.exec(l)?.[1]);
    // several lines while it ran, each with the step's clock, in order
    expect(shown.length).toBeGreaterThanOrEqual(3);
    expect(shown.every((s) => s !== undefined)).toBe(true);
    expect([...shown].sort()).toEqual(shown);
    // the summary, before the last line, names the last output line
    expect(lines.at(-1)).toMatch(new RegExp(`^cluster ${clusterId} restarted: RESTART_COMPLETE in `));
    expect(r.stdout).toMatch(/^NODE\s+PHASE\s+UNINSTALL\s+INSTALL\s+REASON\s+LAST OUTPUT$/m);
    expect(r.stdout).toMatch(/^n1\s+complete\s+.*install step 6 of 6$/m);
  }, 60_000);
});
