/**
 * What an idle agent holds and wakes up for (docs/agent-footprint.md): a real `bin/herald agent`,
 * push connected, that never got work. A probe preloaded into its process (`NODE_OPTIONS=--import`)
 * records every timer the process arms (async_hooks 'Timeout' resources, with the stack that
 * armed them) and every module it loads (the ES module loader's `load` hook, and require.cache
 * for the CommonJS packages the agent require()s), and writes what is live on SIGUSR2.
 *
 * - idle: the only timers are the poll at the healthy interval, the controller connection's idle
 *   check, the renewal at two thirds of the certificate's life and Node's own HTTP connection
 *   check; the hook runner, enrolment, node-forge and everything of the controller and the
 *   operator CLI are not loaded;
 * - after one deployment the hook runner is loaded (the probe sees lazy loads, so the first
 *   test's absences mean something).
 */
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AGENT_API_IDLE_CLOSE_MS,
  AGENT_IDLE_CLOSE_MS,
  LISTENER_HTTP_CHECK_INTERVAL_MS,
  PUSH_TLS_SESSION_LIFETIME_S,
} from '../../protocol/limits.js';
import {
  getNode,
  makeCluster,
  mkConfig,
  mkDeployment,
  waitDeployment,
  type Cluster,
} from '../helpers/agent-cluster.js';
import { freePort, isBuilt, killAll, startHerald, waitFor, type Proc } from '../helpers/procs.js';

const HEALTHY_MS = 600_000;

const PROBE_HOOKS = `
import fs from 'node:fs';
let out;
export function initialize(data) { out = data.out; }
export async function load(url, context, next) {
  fs.appendFileSync(out, url + '\\n');
  return next(url, context);
}
`;

const PROBE = `
import { register, createRequire } from 'node:module';
import async_hooks from 'node:async_hooks';
import fs from 'node:fs';
const out = process.env.HERALD_TEST_PROBE_OUT;
register(new URL('./probe-hooks.mjs', import.meta.url), { data: { out: out + '.esm' } });
const live = new Map();
async_hooks.createHook({
  init(id, type, _trigger, res) {
    if (type === 'Timeout') live.set(id, { res, stack: new Error().stack });
  },
  destroy(id) { live.delete(id); },
}).enable();
const require = createRequire(import.meta.url);
process.on('SIGUSR2', () => {
  const timers = [...live.values()]
    .filter(({ res }) => !res._destroyed && res._idleTimeout > 0)
    .map(({ res, stack }) => ({ ms: res._idleTimeout, repeat: res._repeat != null, stack }));
  let esm = [];
  try { esm = fs.readFileSync(out + '.esm', 'utf8').split('\\n').filter(Boolean); } catch {}
  fs.writeFileSync(out + '.tmp', JSON.stringify({ timers, esm, cjs: Object.keys(require.cache) }));
  fs.renameSync(out + '.tmp', out);
});
`;

interface Timer {
  ms: number;
  repeat: boolean;
  stack: string;
}
interface Report {
  timers: Timer[];
  esm: string[];
  cjs: string[];
}

/** Who armed a timer, from its stack; 'other' is anything this test does not know. */
function kindOf(t: Timer): string {
  if (t.stack.includes('/agent/poller.js')) return 'poll';
  if (t.stack.includes('/agent/renewal.js')) return 'renewal';
  if (t.stack.includes('#armIdle')) return 'connection idle check';
  if (t.stack.includes('setupConnectionsTracking')) return "node's http connection check";
  if (t.stack.includes('keepSocketAlive')) return 'api connection idle close';
  // the listener's session-ticket key, replaced every PUSH_TLS_SESSION_LIFETIME_S (armed in its constructor)
  if (t.stack.includes('new WakeListener')) return 'ticket key rotation';
  return 'other';
}

/** Packages no idle agent needs: the controller's, the operator's, the CA's. */
const NOT_IDLE = /\/node_modules\/(node-forge|better-sqlite3|pg|prom-client|zod|undici|execa|fastify|cli-progress)\//;
/** Our modules no idle agent needs. */
const NOT_IDLE_OURS =
  /\/dist\/(controller\/|cli\/(operator|demo|throwaway)|certs\/(pki|cli|csr)\.js|agent\/(enroll|hooks\/run-item|hooks\/run-process)\.js)/;

const built = isBuilt();
let c: Cluster;
let agent: Proc;
let out: string;

async function report(): Promise<Report> {
  fs.rmSync(out, { force: true });
  process.kill(agent.child.pid!, 'SIGUSR2');
  return waitFor(
    'the probe report',
    () => (fs.existsSync(out) ? (JSON.parse(fs.readFileSync(out, 'utf8')) as Report) : null),
    5_000,
    20,
  );
}

beforeAll(async () => {
  if (!built) return;
  c = await makeCluster(['n1']);
  const probeDir = path.join(c.work, 'probe');
  fs.mkdirSync(probeDir);
  fs.writeFileSync(path.join(probeDir, 'probe-hooks.mjs'), PROBE_HOOKS);
  fs.writeFileSync(path.join(probeDir, 'probe.mjs'), PROBE);
  out = path.join(c.work, 'probe.json');
  const port = await freePort();
  // a short fallback interval: the start-up fetch comes before the push connection, so the poll
  // after it is at the short interval; with 1 s it is soon over and the next is at the healthy one
  agent = startHerald(
    'agent-n1',
    [
      'agent',
      '--node',
      'n1',
      '--controller',
      `https://127.0.0.1:${c.ctl.port}`,
      '--listen',
      `127.0.0.1:${port}`,
      '--pki',
      c.pki,
      '--state-dir',
      path.join(c.work, 'state-n1'),
      '--poll-interval',
      '1s',
      '--poll-interval-healthy',
      `${HEALTHY_MS / 1000}s`,
    ],
    c.work,
    {
      NODE_OPTIONS: `--import ${pathToFileURL(path.join(probeDir, 'probe.mjs')).href}`,
      HERALD_TEST_PROBE_OUT: out,
    },
  );
  await waitFor('n1 push-connected', async () => (await getNode(c, 'n1'))?.push?.connected === true, 20_000, 50);
}, 90_000);

afterAll(async () => {
  await killAll();
  c?.cleanup();
});

describe.skipIf(!built)('an idle agent', { timeout: 60_000 }, () => {
  it('arms only its poll at the healthy interval, the connection idle check, the renewal and Node’s HTTP check', async () => {
    // once the poll after the start-up fetch is over, the next one is planned at the healthy
    // interval; and the start-up's API connection is closed once idle (AGENT_API_IDLE_CLOSE_MS),
    // its idle timer with it: an idle agent holds its push connection only
    const r = await waitFor(
      'the poll planned at the healthy interval, and the API connection closed',
      async () => {
        const x = await report();
        const planned = x.timers.some((t) => kindOf(t) === 'poll' && t.ms >= HEALTHY_MS * 0.9);
        const apiOpen = x.timers.some((t) => kindOf(t) === 'api connection idle close');
        return planned && !apiOpen ? x : null;
      },
      20_000 + AGENT_API_IDLE_CLOSE_MS,
      200,
    );
    const kinds = r.timers.map((t) => `${kindOf(t)}${t.repeat ? ' (repeating)' : ''}`).sort();
    expect(kinds, JSON.stringify(r.timers.filter((t) => kindOf(t) === 'other'))).toEqual([
      'connection idle check',
      "node's http connection check (repeating)",
      'poll',
      'renewal',
      'ticket key rotation (repeating)',
    ]);
    const ms = (k: string): number => r.timers.find((t) => kindOf(t) === k)!.ms;
    expect(ms('poll')).toBeGreaterThanOrEqual(HEALTHY_MS * 0.9);
    expect(ms('poll')).toBeLessThanOrEqual(HEALTHY_MS * 1.1);
    expect(ms('connection idle check')).toBeLessThanOrEqual(AGENT_IDLE_CLOSE_MS);
    // the certificate lives a year: its renewal is far off (a timer waits at most ~24.8 days)
    expect(ms('renewal')).toBeGreaterThan(86_400_000);
    expect(ms('ticket key rotation')).toBe(PUSH_TLS_SESSION_LIFETIME_S * 1000);
    // Node's own check is a backstop behind the listener's handshake timer: not a wake-up every 30 s
    expect(ms("node's http connection check")).toBe(LISTENER_HTTP_CHECK_INTERVAL_MS);
  });

  it('has loaded neither the hook runner nor enrolment, node-forge, nor anything of the controller or operator CLI', async () => {
    const r = await report();
    const all = [...r.esm, ...r.cjs];
    // the probe sees what the agent did load
    expect(all.some((m) => m.includes('/dist/agent/listener.js'))).toBe(true);
    expect(all.some((m) => m.includes('/node_modules/ws/'))).toBe(true);
    expect(all.filter((m) => NOT_IDLE.test(m) || NOT_IDLE_OURS.test(m))).toEqual([]);
  });

  it('loads the hook runner with its first deployment', async () => {
    const cfg = await mkConfig(c, { name: 'idle-first', group: 'script', config: '#!/bin/sh\necho first\n' });
    const dep = await mkDeployment(c, { node: 'n1', config_id: cfg, action: 'CREATE' });
    expect((await waitDeployment(c, dep)).status).toBe('COMPLETE');
    const r = await report();
    expect(r.esm.some((m) => m.includes('/dist/agent/hooks/run-item.js'))).toBe(true);
  });
});
