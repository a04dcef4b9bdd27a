/**
 * The agent as `herald agent` assembles it, against a real controller started in-process with its
 * own push dialer (real TLS on 127.0.0.1): a wake-up's fetch that got its answer counts as a poll
 * (docs/architecture.md: the agent fetches every interval; that fetch was one), so the next poll is planned an
 * interval after it, not on the schedule of the last poll. A fleet that has just fetched a change
 * then does not poll a controller that died moments later while it redials them.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { assembleAgent } from '../../agent/assemble.js';
import { memoryLog } from '../helpers/agent-pki.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';
import { startTestController, waitFor } from '../helpers/controller-harness.js';

const INTERVAL_MS = 120_000;
const HEALTHY_INTERVAL_MS = 600_000;

let pki: ControllerTestPki;
const closers: Array<() => unknown> = [];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-poll-wake-'));

beforeAll(async () => {
  pki = await makeControllerTestPki();
}, 60_000);
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});
afterAll(() => {
  pki?.cleanup();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('agent polling after a wake-up', () => {
  it("a wake-up's fetch over the push connection moves the next poll to an interval after it; no poll is made for it", async () => {
    const t = await startTestController(pki, {}, { realPush: true });
    closers.push(() => t.close());
    const { log, lines } = memoryLog();
    const a = await assembleAgent(
      {
        node: 'n1',
        controller: `https://127.0.0.1:${t.port}`,
        listen: { host: '127.0.0.1', port: 0 },
        pki: pki.dir,
        stateDir: fs.mkdtempSync(path.join(tmp, 'state-')),
        controllerId: 'controller',
        pollIntervalMs: INTERVAL_MS,
        pollIntervalHealthyMs: HEALTHY_INTERVAL_MS,
      },
      // random 0.5: no jitter, so the intervals below are exact
      { log, watchPki: false, random: () => 0.5 },
    );
    closers.push(() => a.stop('test over'));
    await a.start();
    const { poller, listener } = a.parts;
    await waitFor(
      'the start-up poll and a healthy push connection',
      () => poller.polls === 1 && listener!.isPushHealthy(),
    );
    await waitFor('the start-up poll to end', () => poller.nextDueAt !== null);
    const planned = poller.nextDueAt!;
    expect(planned).toBeLessThanOrEqual(Date.now() + HEALTHY_INTERVAL_MS);

    const op = pki.cred('operator', 'admin');
    const cfg = await t.req(op, 'POST', '/v1/configs', { name: 'step', group: 'script', config: '#!/bin/sh\n:\n' });
    expect(cfg.status, cfg.text).toBe(201);
    const sent = Date.now();
    const d = await t.req(op, 'POST', '/v1/deployments', { node: 'n1', config_id: cfg.json.id });
    expect(d.status, d.text).toBe(201);
    await waitFor('the woken agent to fetch the change', () =>
      lines.some((l) => l.msg === 'metadata fetched' && (l.gen as number) > 0 && (l.items as number) === 1),
    );

    // the fetch came from the wake-up, not from a poll
    expect(poller.polls).toBe(1);
    // push is healthy: the long interval, counted from that fetch (after `sent`), not from the poll
    expect(poller.nextDueAt!).toBeGreaterThanOrEqual(sent + HEALTHY_INTERVAL_MS);
    expect(poller.nextDueAt!).toBeLessThanOrEqual(Date.now() + HEALTHY_INTERVAL_MS);
    expect(poller.nextDueAt!).toBeGreaterThan(planned);
  });
});
