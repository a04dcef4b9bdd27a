/**
 * `--controller a,b` (docs/several-controllers.md) against real controllers started in-process (real TLS on
 * 127.0.0.1, their own SQLite files, one PKI), and the real agent assembled as `herald agent`
 * assembles it:
 * - the first URL is dead: the agent announces, fetches, runs a deployment and delivers its
 *   signal through the second, a controller of another name (`c2`, signing with its own key),
 *   accepted through `--controller-id controller,c2`;
 * - two URLs (TCP proxies in front of one controller) and the first goes away while a hook runs,
 *   then the second too: the signal waits in the outbox and is delivered through the second URL
 *   once it is back, the first staying dead.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { assembleAgent, type AgentConfig, type AssembledAgent } from '../../agent/assemble.js';
import { issueCert } from '../../certs/pki.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';
import { memoryLog } from '../helpers/agent-pki.js';
import { deadPort, TcpProxy } from '../helpers/tcp-proxy.js';

let pki: ControllerTestPki;
const closers: Array<() => unknown> = [];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-failover-'));

beforeAll(async () => {
  pki = await makeControllerTestPki();
  await issueCert({ dir: pki.dir, role: 'controller', name: 'c2', ip: ['127.0.0.1'], dns: ['localhost'] });
}, 60_000);
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});
afterAll(() => {
  pki?.cleanup();
  fs.rmSync(tmp, { recursive: true, force: true });
});

const op = (): ReturnType<ControllerTestPki['cred']> => pki.cred('operator', 'admin');

async function controller(name = 'controller'): Promise<TestController> {
  const t = await startTestController(pki, { name });
  closers.push(() => t.close());
  return t;
}

interface Agent {
  agent: AssembledAgent;
  lines: Array<Record<string, unknown>>;
}

async function agent(node: string, over: Partial<AgentConfig>): Promise<Agent> {
  const { log, lines } = memoryLog();
  const stateDir = fs.mkdtempSync(path.join(tmp, `state-${node}-`));
  const a = await assembleAgent(
    {
      node,
      controller: '',
      listen: { host: '127.0.0.1', port: 0 },
      pki: pki.dir,
      stateDir,
      controllerId: 'controller',
      // polling is what tells the agent of a new deployment here (the harness's push is a stub)
      pollIntervalMs: 200,
      pollIntervalHealthyMs: 200,
      ...over,
    },
    { log, watchPki: false, random: () => 0.5 },
  );
  closers.push(() => a.stop('test over'));
  await a.start();
  return { agent: a, lines };
}

async function deploy(t: TestController, node: string, script: string): Promise<string> {
  const cfg = await t.req(op(), 'POST', '/v1/configs', { name: 'step', group: 'script', config: script });
  expect(cfg.status, cfg.text).toBe(201);
  const d = await t.req(op(), 'POST', '/v1/deployments', { node, config_id: cfg.json.id });
  expect(d.status, d.text).toBe(201);
  return d.json.id as string;
}

async function statusOf(t: TestController, id: string): Promise<string | undefined> {
  const r = await t.req(op(), 'GET', `/v1/deployments/${id}`);
  return (r.json?.status ?? r.json?.deployment?.status) as string | undefined;
}

const switches = (lines: Array<Record<string, unknown>>): Array<Record<string, unknown>> =>
  lines.filter((l) => String(l.msg).startsWith('controller failed; switched to the next'));

describe('agent --controller with a dead first URL', () => {
  it('announces, fetches, runs a deployment and delivers its signal through the second controller (c2, its own key)', async () => {
    const c2 = await controller('c2');
    const dead = `https://127.0.0.1:${await deadPort()}`;
    const live = `https://127.0.0.1:${c2.port}`;
    const a = await agent('n1', { controller: `${dead},${live}`, controllerId: 'controller,c2' });
    expect(await a.agent.announced()).toBe(true);
    const node = await c2.req(op(), 'GET', '/v1/nodes/n1');
    expect(node.status).toBe(200);
    expect(JSON.stringify(node.json)).toContain(`:${a.agent.parts.listener!.port}/v1/wake`);

    const id = await deploy(c2, 'n1', '#!/bin/sh\necho ran through c2\n');
    await waitFor('the deployment to complete on c2', async () => (await statusOf(c2, id)) === 'COMPLETE');
    // the controller records the signal before the agent reads its answer
    await waitFor('the agent to see its signal taken', () => a.agent.parts.outbox.delivered === 1);
    // c2 signed the metadata with controller/c2.jwk, and the agent verified it as c2's
    expect(a.lines.some((l) => l.msg === 'metadata fetched')).toBe(true);
    expect(a.lines.filter((l) => l.code === 'wrong_issuer' || l.code === 'wrong_peer')).toEqual([]);
    // one switch, dead → live, and the agent stayed there
    const sw = switches(a.lines);
    expect(sw).toHaveLength(1);
    expect(sw[0]).toMatchObject({ from: new URL(dead).origin, to: new URL(live).origin, reason: 'ECONNREFUSED' });
    expect(a.agent.parts.fetcher.endpoints.current.origin).toBe(new URL(live).origin);
  });

  it('--controller-id without c2 refuses c2 as the API server (wrong_peer): nothing is announced', async () => {
    const c2 = await controller('c2');
    const dead = `https://127.0.0.1:${await deadPort()}`;
    const a = await agent('n2', { controller: `${dead},https://127.0.0.1:${c2.port}`, controllerId: 'controller' });
    await waitFor('a refused announcement', () =>
      a.lines.some((l) => l.msg === 'endpoint announcement failed; retrying' && l.code === 'wrong_peer'),
    );
    expect((await c2.req(op(), 'GET', '/v1/nodes/n2')).status).toBe(404);
  });
});

describe('agent --controller when the first controller goes away mid-run', () => {
  it('the signal queued while both were down is delivered through the second URL; the first stays dead', async () => {
    const t = await controller();
    const p1 = await new TcpProxy(t.port).start();
    const p2 = await new TcpProxy(t.port).start();
    closers.push(
      () => p1.stop(),
      () => p2.stop(),
    );
    const a = await agent('n1', { controller: `${p1.url},${p2.url}`, controllerId: '*' });
    expect(await a.agent.announced()).toBe(true);

    const started = path.join(tmp, 'hook-started');
    const gate = path.join(tmp, 'hook-gate');
    const id = await deploy(
      t,
      'n1',
      `#!/bin/sh\ntouch ${started}\nwhile [ ! -e ${gate} ]; do sleep 0.05; done\necho finished\n`,
    );
    await waitFor('the hook to start', () => fs.existsSync(started));
    expect(p1.connections).toBeGreaterThan(0);
    expect(p2.connections).toBe(0); // everything went through the first URL so far

    await p1.stop(); // the first controller goes away mid-run ...
    await p2.stop(); // ... and for a while the second is unreachable too
    fs.writeFileSync(gate, '');
    await waitFor('a failed delivery', () => a.lines.some((l) => l.msg === 'signal not delivered; retrying'), 20_000);
    expect(await statusOf(t, id)).toBe('IN_PROGRESS');
    expect(a.agent.parts.outbox.delivered).toBe(0);

    await p2.start(); // the second URL is back, the first is not
    await waitFor('the queued signal to arrive', async () => (await statusOf(t, id)) === 'COMPLETE', 20_000);
    await waitFor('the agent to see its signal taken', () => a.agent.parts.outbox.delivered === 1);
    expect(p2.connections).toBeGreaterThan(0);
    expect(a.agent.parts.fetcher.endpoints.current.port).toBe(String(p2.port));
    const sw = switches(a.lines);
    expect(sw.length).toBeGreaterThanOrEqual(1);
    expect(sw[0]).toMatchObject({ from: new URL(p1.url).origin, to: new URL(p2.url).origin });
  });
});
