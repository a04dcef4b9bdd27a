/**
 * Agents behind NAT (docs/dial-out.md): an agent in a network namespace nothing can connect into
 * (test/helpers/netns.ts) dials out to the controller's `--connect-listen` and gets its changes by
 * push over that connection. Real `bin/herald` processes, real TLS, a real kernel dropping the
 * packets. Polling is set to 10 minutes, so a change that runs within a test's wait came by push.
 */
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { TestbedAgent } from '../../cli/testbed/agent.js';
import type { TestbedController } from '../../cli/testbed/controller.js';
import { Testbed } from '../../cli/testbed/testbed.js';
import { freePort } from '../../cli/testbed/ports.js';
import { makeNetns, type Netns, netnsAvailable } from '../helpers/netns.js';
import { api, credOf, isBuilt, waitFor } from '../helpers/procs.js';

const here = netnsAvailable() && isBuilt();
if (!netnsAvailable())
  console.log('dial-out: skipped, needs root, iproute2 and iptables (apt-get install iptables) for network namespaces');

/** Longer than any wait below: a change that runs came by push, not by a poll. */
const POLL = '600s';
/** The agent's pong timeout plus ping interval (docs/dial-out.md), plus a reconnect and a run. */
const BLACKHOLE_BOUND_MS = 40_000 + 35_000;

let bed: Testbed;
let ns: Netns;
let ctl: TestbedController;
let apiPort: number;
let connectPort: number;
const agents = new Map<string, TestbedAgent>();

async function startController(): Promise<void> {
  ctl = await bed.startController({
    host: '0.0.0.0',
    port: apiPort,
    pushWorkers: 1,
    args: ['--connect-listen', `0.0.0.0:${connectPort}`],
  });
}

function startNsAgent(node: string, extra: string[] = [], env: NodeJS.ProcessEnv = {}): TestbedAgent {
  const a = bed.startAgent({
    node,
    listen: null,
    controllers: [`https://${ns.hostIp}:${apiPort}`],
    pollInterval: POLL,
    hooksDir: path.join(bed.dir, `hooks-${node}`),
    wrap: ns.exec,
    env: { ...process.env, HERALD_LOG_LEVEL: process.env.HERALD_LOG_LEVEL ?? 'info', ...env },
    args: ['--dial-out', `wss://${ns.hostIp}:${connectPort}/v1/connect`, ...extra],
  });
  agents.set(node, a);
  return a;
}

const op = () => credOf(bed.pki!.dir, 'operator', 'admin');

async function deploy(node: string, text: string): Promise<string> {
  const c = await api(apiPort, op(), 'POST', '/v1/configs', {
    name: text,
    group: 'script',
    config: `#!/bin/sh\necho ${text}\n`,
  });
  expect(c.status).toBe(201);
  const d = await api(apiPort, op(), 'POST', '/v1/deployments', { node, config_id: c.json.id, action: 'CREATE' });
  expect(d.status).toBe(201);
  return d.json.id as string;
}

async function complete(id: string, ms: number): Promise<void> {
  await waitFor(
    `deployment ${id} COMPLETE`,
    async () => (await api(apiPort, op(), 'GET', `/v1/deployments/${id}`)).json?.status === 'COMPLETE',
    ms,
  );
}

/** The namespace's local port of the agent's dialled connection to the controller. */
function dialledPort(): number {
  const r = spawnSync(ns.exec[0]!, [...ns.exec.slice(1), 'ss', '-Htn', 'state', 'established'], { encoding: 'utf8' });
  const line = r.stdout.split('\n').find((l) => l.includes(`${ns.hostIp}:${connectPort}`));
  if (!line) throw new Error(`no dialled connection in ${ns.name}:\n${r.stdout}`);
  return Number(/\s\S+:(\d+)\s+\S+:\d+\s*$/.exec(line.trim())?.[1] ?? /:(\d+)\s/.exec(line)![1]);
}

beforeAll(async () => {
  if (!here) return;
  ns = makeNetns();
  bed = new Testbed({ prefix: 'herald-dial-out-', keep: process.env.KEEP !== undefined });
  await bed.makePki({ agents: ['dn1', 'dn2', 'dn4'] });
  // dn3 also listens, and announces its namespace's address: its certificate must name it
  await bed.pki!.issue('agent', 'dn3', { ip: [ns.nsIp, '127.0.0.1'] });
  apiPort = await freePort();
  connectPort = await freePort();
  await startController();
  startNsAgent('dn1');
  await waitFor('dn1 dialled in', () => agents.get('dn1')!.proc.log().includes('push connection up'), 30_000);
}, 120_000);

afterAll(async () => {
  await bed?.stop();
  ns?.remove();
});

describe.skipIf(!here)('an agent nothing can connect to', { timeout: 240_000 }, () => {
  it('nothing can connect into its namespace, and it listens on nothing', async () => {
    const res = await new Promise<string>((resolve) => {
      const c = net.connect({ host: ns.nsIp, port: 7443, timeout: 1_500 });
      c.once('connect', () => resolve('connected'));
      c.once('timeout', () => {
        c.destroy();
        resolve('timeout');
      });
      c.once('error', (e) => resolve(String(e)));
    });
    expect(res).toBe('timeout');
    const node = await api(apiPort, op(), 'GET', '/v1/nodes/dn1');
    expect(node.json.endpoint ?? null).toBeNull();
  });

  it('a change runs its hook by push, over the connection the agent dialled', async () => {
    const id = await deploy('dn1', 'pushed');
    await complete(id, 30_000);
    // the agent fetched because a wake-up for that change came on the connection it dialled
    expect(agents.get('dn1')!.proc.log()).toMatch(/"reason":"deployment","fetch":"started","msg":"wake-up"/);
  });

  it('the controller killed with -9 and started again: the agent dials back and gets the change it missed', async () => {
    await ctl.proc.kill9();
    await startController();
    const id = await deploy('dn1', 'missed');
    await complete(id, 60_000);
  });

  it('a NAT mapping dropped silently (no RST) is detected and the agent recovers within the documented bound', async () => {
    const port = dialledPort();
    ns.blackhole(port);
    try {
      const id = await deploy('dn1', 'after-blackhole');
      await complete(id, BLACKHOLE_BOUND_MS);
      expect(dialledPort()).not.toBe(port);
    } finally {
      ns.restore();
    }
    expect(agents.get('dn1')!.proc.log()).toContain('half_open');
  });

  it('through an HTTP CONNECT proxy, as outbound-only networks mandate', async () => {
    const seen: string[] = [];
    const proxy = http.createServer((_req, res) => res.writeHead(405).end());
    proxy.on('connect', (req, client, head) => {
      seen.push(String(req.url));
      const [host, port] = String(req.url).split(':');
      const up = net.connect(Number(port), host, () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        up.write(head);
        up.pipe(client).pipe(up);
      });
      up.on('error', () => client.destroy());
      client.on('error', () => up.destroy());
    });
    await new Promise<void>((r) => proxy.listen(0, ns.hostIp, r));
    const pport = (proxy.address() as net.AddressInfo).port;
    try {
      startNsAgent('dn2', [], { HTTPS_PROXY: `http://${ns.hostIp}:${pport}` });
      await waitFor('dn2 dialled in', () => agents.get('dn2')!.proc.log().includes('push connection up'), 30_000);
      expect(seen).toContain(`${ns.hostIp}:${connectPort}`);
      // its start-up announcement and fetch went through the proxy too
      expect(seen).toContain(`${ns.hostIp}:${apiPort}`);
      const id = await deploy('dn2', 'proxied');
      await complete(id, 30_000);
    } finally {
      await agents.get('dn2')?.proc.stop();
      proxy.close();
    }
  });

  it('listening and dialling out at once, with the inbound path cut: the dialled connection carries the change, once', async () => {
    const a = startNsAgent('dn3', ['--listen', '0.0.0.0:7443', '--advertise', `${ns.nsIp}:7443`]);
    await waitFor('dn3 dialled in', () => a.proc.log().includes('push connection up'), 30_000);
    const id = await deploy('dn3', 'both-modes');
    await complete(id, 30_000);
    const runs = a.proc
      .log()
      .split('\n')
      .filter((l) => l.includes('both-modes') && l.includes('"hook')).length;
    expect(runs).toBeLessThanOrEqual(1);
  });

  it('listening and dialling out at once, with the dialled path cut: the listener carries the change', async () => {
    const nothing = await freePort(); // nothing listens there: every dial is refused
    const a = bed.startAgent({
      node: 'dn4',
      controllers: [`https://127.0.0.1:${apiPort}`],
      pollInterval: POLL,
      hooksDir: path.join(bed.dir, 'hooks-dn4'),
      args: ['--dial-out', `wss://127.0.0.1:${nothing}/v1/connect`],
    });
    await a.announced();
    const id = await deploy('dn4', 'via-listener');
    await complete(id, 30_000);
    expect(a.proc.log()).not.toContain('push connection up');
    expect(a.proc.log()).toMatch(/"reason":"deployment","fetch":"started","msg":"wake-up"/);
  });
});
