/**
 * Unmodified OpenStack Heat drives Herald: Heat (test/helpers/heat.ts) finds Herald's object store
 * through its catalog, writes each DeployedServer's metadata there, and a node's Herald agent runs
 * its SoftwareDeployments at once (pushed, not polled); the result reaches Heat through the signal
 * object. A stock os-collect-config node (test/helpers/occ-node.ts) in the same stack polls its
 * metadata from Herald and signals through it. Driven by the unmodified `openstack` CLI, with a
 * token Heat passes on to Herald, which checks it against its static token file. docs/heat.md.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AgentProc, type Cluster, makeCluster } from '../helpers/agent-cluster.js';
import { HEAT_FIXTURE_DIR, HEAT_PACKAGES, type Heat, heatAvailable, startHeat } from '../helpers/heat.js';
import { HEAT_AGENTS_DIR, heatAgentsProblems, type OccNode, startOccNode } from '../helpers/occ-node.js';
import { api, freePort, isBuilt, killAll, stopProc, waitFor } from '../helpers/procs.js';

const heatHere = heatAvailable();
const ready = heatHere && isBuilt();
const agentProblems = heatHere ? heatAgentsProblems() : [];
const stockReady = ready && agentProblems.length === 0;
if (!heatHere)
  console.log(
    `heat-herald: skipped, OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')})`,
  );
else if (!stockReady)
  console.log(
    `heat-herald: the stock os-collect-config node is skipped, heat-agents' files are not laid out in ${HEAT_AGENTS_DIR} (see README.md there): ${agentProblems.join(', ')}`,
  );

const ONE = path.join(HEAT_FIXTURE_DIR, 'herald-node.yaml');
const PAIR = path.join(HEAT_FIXTURE_DIR, 'herald-pair.yaml');
const TOKEN = `herald-test-${crypto.randomBytes(12).toString('hex')}`;
const STEP_TIMEOUT_MS = 240_000;

let c: Cluster;
let heat: Heat;
let osPort: number;
const agents = new Map<string, AgentProc>();
let stock: OccNode | undefined;

beforeAll(async () => {
  if (!ready) return;
  osPort = await freePort();
  const tokens = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'herald-heat-tokens-')), 'tokens');
  fs.writeFileSync(tokens, `${crypto.createHash('sha256').update(TOKEN).digest('hex')} admin heat\n`, {
    mode: 0o600,
  });
  c = await makeCluster(['hnode1', 'hnode2', 'hnode3'], {
    controllerArgs: [
      '--object-store-listen',
      `127.0.0.1:${osPort}`,
      '--object-store-tokens',
      tokens,
      '--heat-project',
      'admin',
    ],
  });
  for (const n of ['hnode1', 'hnode2', 'hnode3']) agents.set(n, await c.startAgent(n));
  heat = await startHeat({
    objectStoreUrl: `https://127.0.0.1:${osPort}/v1/AUTH_admin`,
    caFile: path.join(c.pki, 'ca.crt'),
    token: TOKEN,
  });
}, STEP_TIMEOUT_MS);

afterAll(async () => {
  await stock?.stop();
  await heat?.stop();
  await killAll();
  c?.cleanup();
});

async function cli(args: string[]): Promise<string> {
  const r = await heat.openstack(args);
  if (r.code !== 0)
    throw new Error(`openstack ${args.join(' ')} → ${r.code}\n${r.stderr}\n${r.stdout}\n${heat.logTail(40)}`);
  return r.stdout;
}

async function stackStatus(name: string): Promise<{ status: string; reason: string }> {
  const s = JSON.parse(await cli(['stack', 'show', name, '-f', 'json'])) as Record<string, unknown>;
  return { status: String(s.stack_status), reason: String(s.stack_status_reason) };
}

async function output(stack: string, key: string): Promise<unknown> {
  const o = JSON.parse(await cli(['stack', 'output', 'show', stack, key, '-f', 'json'])) as { output_value: unknown };
  return o.output_value;
}

async function heraldDeployments(node: string): Promise<Array<Record<string, unknown>>> {
  const r = await api(c.ctl.port, c.op, 'GET', `/v1/deployments?node=${node}`);
  expect(r.status).toBe(200);
  return r.json.items as Array<Record<string, unknown>>;
}

/** `herald_object_store_requests_total{method,code}` as the controller's /metrics shows it. */
async function objectStoreRequests(method: string, code: string): Promise<number> {
  const r = await api(c.ctl.port, c.op, 'GET', '/metrics');
  expect(r.status).toBe(200);
  const m = new RegExp(`^herald_object_store_requests_total\\{method="${method}",code="${code}"\\} (\\d+)$`, 'm').exec(
    r.raw,
  );
  return m ? Number(m[1]) : 0;
}

/** An object as Herald's object store serves it to a token holder (or to anyone, with `token` null). */
function getObject(p: string, token: string | null = TOKEN): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: osPort,
        path: `/v1/AUTH_admin/${p}`,
        headers: token === null ? {} : { 'x-auth-token': token },
        ca: fs.readFileSync(path.join(c.pki, 'ca.crt')),
        agent: false,
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** Runs `args` in the background: a stack update Heat carries out while the test does other things. */
function background(args: string[]): Promise<{ code: number | null; stderr: string }> {
  return heat.openstack(args);
}

describe.skipIf(!ready)('real Heat drives Herald', { timeout: STEP_TIMEOUT_MS * 3 }, () => {
  it('stack create runs the install on the Herald node by push, and Heat completes with its output', async () => {
    await cli(['stack', 'create', '-t', ONE, '--parameter', 'node=hnode1', '--wait', '--poll', '1', 'h1']);
    expect((await stackStatus('h1')).status).toBe('CREATE_COMPLETE');
    expect(await output('h1', 'result')).toBe('installed for world at 0');
    const ds = await heraldDeployments('hnode1');
    expect(ds).toHaveLength(1);
    expect(ds[0]).toMatchObject({ status: 'COMPLETE', action: 'CREATE' });
    // the agent was woken: it fetched after a wake-up, not at a poll
    expect(agents.get('hnode1')!.proc.log()).toMatch(/"wake"|wake-up|woken/);
  });

  it('a parameter update re-runs it (a new revision of the same deployment) and Heat completes', async () => {
    const before = (await heraldDeployments('hnode1'))[0]!;
    await cli(['stack', 'update', '--existing', '--parameter', 'restart_trigger=1', '--wait', 'h1']);
    expect((await stackStatus('h1')).status).toBe('UPDATE_COMPLETE');
    expect(await output('h1', 'result')).toBe('installed for world at 1');
    const after = (await heraldDeployments('hnode1'))[0]!;
    expect(after.id).toBe(before.id);
    expect(after).toMatchObject({ status: 'COMPLETE', action: 'UPDATE', revision: 2 });
    const id = String(await output('h1', 'deployment_id'));
    expect(await cli(['software', 'deployment', 'output', 'show', id, 'result'])).toContain('installed for world at 1');
  });

  it("the controller counts the object store's answers: Heat's metadata PUTs, its HEADs of the signal object, a refusal", async () => {
    expect(await objectStoreRequests('PUT', '201')).toBeGreaterThanOrEqual(2);
    expect(await objectStoreRequests('HEAD', '200')).toBeGreaterThanOrEqual(2);
    const refused = await objectStoreRequests('GET', '401');
    expect((await getObject('hnode1', null)).status).toBe(401);
    expect(await objectStoreRequests('GET', '401')).toBe(refused + 1);
  });

  it('a failing hook makes the stack FAILED, with its stderr in the deployment output', async () => {
    const r = await heat.openstack(['stack', 'update', '--existing', '--parameter', 'fail=yes', '--wait', 'h1']);
    expect(r.code).not.toBe(0);
    const s = await stackStatus('h1');
    expect(s.status).toBe('UPDATE_FAILED');
    expect(s.reason).toContain('3');
    const id = String(await output('h1', 'deployment_id'));
    expect(await cli(['software', 'deployment', 'output', 'show', id, 'deploy_stderr'])).toContain(
      'install of world broke',
    );
  });

  it('kill -9 of the controller after Heat wrote the change, and again before Heat read the result, loses nothing', async () => {
    const a1 = agents.get('hnode1')!;
    await stopProc(a1.proc);
    const running = async () => (await heraldDeployments('hnode1')).filter((d) => d.status === 'IN_PROGRESS');
    const update = background([
      'stack',
      'update',
      '--existing',
      '--parameter',
      'fail=no',
      '--parameter',
      'restart_trigger=2',
      '--wait',
      'h1',
    ]);
    // Heat's PUT is committed (the node has work nobody ran) and Heat has its answer: Heat sends
    // that PUT once, without a retry, so a kill before its 201 reaches Heat fails the update as
    // any object store's death would; Heat's first HEAD of the signal object comes after the 201
    const heads = await objectStoreRequests('HEAD', '200');
    await waitFor(
      'Heat wrote the change and polls for its result',
      async () => (await running()).length === 1 && (await objectStoreRequests('HEAD', '200')) > heads,
      STEP_TIMEOUT_MS,
    );
    await stopProc(c.ctl.proc, 'SIGKILL');
    await c.startController();
    // Heat may not read the result yet: the controller is killed again once the node signalled
    process.kill(-heat.pid, 'SIGSTOP');
    try {
      agents.set('hnode1', await c.startAgent('hnode1'));
      await waitFor('the node ran the change', async () => (await running()).length === 0, 60_000);
      await stopProc(c.ctl.proc, 'SIGKILL');
      await c.startController();
    } finally {
      process.kill(-heat.pid, 'SIGCONT');
    }
    const r = await update;
    const s = await stackStatus('h1');
    expect(r.code, `${r.stderr}\n${s.reason}\n${heat.logTail(60)}`).toBe(0);
    expect(s.status).toBe('UPDATE_COMPLETE');
    expect(await output('h1', 'result')).toBe('installed for world at 2');
  });

  it('two stacks, three nodes: back-to-back updates of both run on every node, each once', async () => {
    await cli([
      'stack',
      'create',
      '-t',
      PAIR,
      '--parameter',
      'node_a=hnode2',
      '--parameter',
      'node_b=hnode3',
      '--wait',
      '--poll',
      '1',
      'h2',
    ]);
    expect(await output('h2', 'result_b')).toBe('hnode3 at 0');
    for (const n of [10, 11, 12]) {
      const [one, two] = await Promise.all([
        heat.openstack(['stack', 'update', '--existing', '--parameter', `restart_trigger=${n}`, '--wait', 'h1']),
        heat.openstack(['stack', 'update', '--existing', '--parameter', `restart_trigger=${n}`, '--wait', 'h2']),
      ]);
      expect(one.code, one.stderr).toBe(0);
      expect(two.code, two.stderr).toBe(0);
      expect(await output('h1', 'result')).toBe(`installed for world at ${n}`);
      expect(await output('h2', 'result_a')).toBe(`hnode2 at ${n}`);
      expect(await output('h2', 'result_b')).toBe(`hnode3 at ${n}`);
    }
    // one revision per update: created, then 10, 11, 12
    for (const n of ['hnode2', 'hnode3']) expect((await heraldDeployments(n))[0]).toMatchObject({ revision: 4 });
  });

  it.skipIf(!stockReady)(
    'a stock os-collect-config node and a Herald node in one stack: create and update run on both',
    async () => {
      stock = await startOccNode({ name: 'occ1', caFile: path.join(c.pki, 'ca.crt'), pollingIntervalS: 1 });
      const create = background([
        'stack',
        'create',
        '-t',
        PAIR,
        '--parameter',
        'node_a=hnode2',
        '--parameter',
        'node_b=occ1',
        '--wait',
        '--poll',
        '1',
        'm1',
      ]);
      // the stock node boots with its metadata URL, as Heat minted it into the first metadata (the
      // object is named after the stack's id)
      let url: string | undefined;
      await waitFor(
        "Heat wrote occ1's first metadata",
        async () => {
          const list = await getObject('occ1?format=json');
          if (list.status !== 200) return false;
          const name = (JSON.parse(list.body) as Array<{ name: string }>)[0]?.name;
          const r = name ? await getObject(`occ1/${name}`) : { status: 404, body: '' };
          if (r.status !== 200) return false;
          url = (JSON.parse(r.body) as { 'os-collect-config'?: { request?: { metadata_url?: string } } })[
            'os-collect-config'
          ]?.request?.metadata_url;
          return url !== undefined;
        },
        STEP_TIMEOUT_MS,
      );
      await stock.setMetadataUrl(url!);
      const r = await create;
      expect(r.code, r.stderr).toBe(0);
      expect(await output('m1', 'result_a')).toBe('hnode2 at 0');
      expect(await output('m1', 'result_b')).toBe('occ1 at 0');
      await cli(['stack', 'update', '--existing', '--parameter', 'restart_trigger=5', '--wait', 'm1']);
      expect(await output('m1', 'result_a')).toBe('hnode2 at 5');
      expect(await output('m1', 'result_b')).toBe('occ1 at 5');
      await cli(['stack', 'delete', '--yes', '--wait', 'm1']);
    },
  );

  it('stack delete removes its deployments from the nodes', async () => {
    await cli(['stack', 'delete', '--yes', '--wait', 'h1']);
    await cli(['stack', 'delete', '--yes', '--wait', 'h2']);
    for (const n of ['hnode1', 'hnode2', 'hnode3'])
      await waitFor(`${n} has no deployments`, async () => (await heraldDeployments(n)).length === 0, 30_000);
  });
});
