/**
 * Unmodified OpenStack Heat drives Herald: Heat (test/helpers/heat.ts) finds Herald's object store
 * through its catalog, writes a DeployedServer's metadata there, and the node's Herald agent runs
 * the SoftwareDeployment at once (pushed, not polled) and its result reaches Heat through the
 * signal object. Driven by the unmodified `openstack` CLI. docs/heat.md.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AgentProc, type Cluster, makeCluster } from '../helpers/agent-cluster.js';
import { HEAT_FIXTURE_DIR, HEAT_PACKAGES, type Heat, heatAvailable, startHeat } from '../helpers/heat.js';
import { api, freePort, isBuilt, killAll, waitFor } from '../helpers/procs.js';

const ready = heatAvailable() && isBuilt();
if (!heatAvailable())
  console.log(
    `heat-herald: skipped, OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')})`,
  );

const TEMPLATE = path.join(HEAT_FIXTURE_DIR, 'herald-node.yaml');
/** What `openstack --os-auth-type none` sends as X-Auth-Token, and Heat passes on to the object store. */
const CLI_TOKEN = 'notused';
const STEP_TIMEOUT_MS = 240_000;

let c: Cluster;
let heat: Heat;
let agent1: AgentProc;

beforeAll(async () => {
  if (!ready) return;
  const osPort = await freePort();
  const tokens = path.join(await fs.promises.mkdtemp('/tmp/herald-heat-tokens-'), 'tokens');
  fs.writeFileSync(tokens, `${crypto.createHash('sha256').update(CLI_TOKEN).digest('hex')} admin heat\n`, {
    mode: 0o600,
  });
  c = await makeCluster(['hnode1', 'hnode2'], {
    controllerArgs: ['--object-store-listen', `127.0.0.1:${osPort}`, '--object-store-tokens', tokens],
  });
  agent1 = await c.startAgent('hnode1');
  heat = await startHeat({
    objectStoreUrl: `https://127.0.0.1:${osPort}/v1/AUTH_admin`,
    caFile: path.join(c.pki, 'ca.crt'),
  });
}, STEP_TIMEOUT_MS);

afterAll(async () => {
  await heat?.stop();
  await killAll();
  c?.cleanup();
});

async function os(args: string[]): Promise<string> {
  const r = await heat.openstack(args);
  if (r.code !== 0)
    throw new Error(`openstack ${args.join(' ')} → ${r.code}\n${r.stderr}\n${r.stdout}\n${heat.logTail(40)}`);
  return r.stdout;
}

async function stackShow(name: string): Promise<Record<string, unknown>> {
  return JSON.parse(await os(['stack', 'show', name, '-f', 'json'])) as Record<string, unknown>;
}

async function output(stack: string, key: string): Promise<unknown> {
  const o = JSON.parse(await os(['stack', 'output', 'show', stack, key, '-f', 'json'])) as { output_value: unknown };
  return o.output_value;
}

async function heraldDeployments(node: string): Promise<Array<Record<string, unknown>>> {
  const r = await api(c.ctl.port, c.op, 'GET', `/v1/deployments?node=${node}`);
  expect(r.status).toBe(200);
  return r.json.items as Array<Record<string, unknown>>;
}

describe.skipIf(!ready)('real Heat drives Herald', { timeout: STEP_TIMEOUT_MS * 3 }, () => {
  it('stack create runs the install on the Herald node, and Heat completes with its output', async () => {
    await os(['stack', 'create', '-t', TEMPLATE, '--parameter', 'node=hnode1', '--wait', '--poll', '1', 'h1']);
    expect((await stackShow('h1')).stack_status).toBe('CREATE_COMPLETE');
    expect(await output('h1', 'result')).toBe('installed for world at 0');
    const ds = await heraldDeployments('hnode1');
    expect(ds).toHaveLength(1);
    expect(ds[0]).toMatchObject({ status: 'COMPLETE', action: 'CREATE' });
    expect(agent1.proc.log()).toContain('wake'); // it came by push
  });

  it('a parameter update re-runs it (a new revision of the same deployment) and Heat completes', async () => {
    const before = (await heraldDeployments('hnode1'))[0]!;
    await os(['stack', 'update', '--existing', '--parameter', 'restart_trigger=1', '--wait', 'h1']);
    expect((await stackShow('h1')).stack_status).toBe('UPDATE_COMPLETE');
    expect(await output('h1', 'result')).toBe('installed for world at 1');
    const after = (await heraldDeployments('hnode1'))[0]!;
    expect(after.id).toBe(before.id);
    expect(after).toMatchObject({ status: 'COMPLETE', action: 'UPDATE', revision: 2 });
    const id = String(await output('h1', 'deployment_id'));
    expect(await os(['software', 'deployment', 'output', 'show', id, 'result'])).toContain('installed for world at 1');
  });

  it('a failing hook makes the stack FAILED, with its stderr in the deployment output', async () => {
    const r = await heat.openstack(['stack', 'update', '--existing', '--parameter', 'fail=yes', '--wait', 'h1']);
    expect(r.code).not.toBe(0);
    const s = await stackShow('h1');
    expect(s.stack_status).toBe('UPDATE_FAILED');
    expect(String(s.stack_status_reason)).toContain('3');
    const id = String(await output('h1', 'deployment_id'));
    const err = await os(['software', 'deployment', 'output', 'show', id, 'deploy_stderr']);
    expect(err).toContain('install of world broke');
  });

  it('stack delete removes the deployment from the node', async () => {
    await os(['stack', 'delete', '--yes', '--wait', 'h1']);
    await waitFor('hnode1 has no deployments', async () => (await heraldDeployments('hnode1')).length === 0, 30_000);
  });
});
