/**
 * Upgrades, revisions and rollout controls through the API (docs/api.md "Upgrades", "Revisions",
 * "Rollouts"), in-process with a stand-in agent that answers every item: the refusals naming
 * their field and code, a dry run that changes nothing, the revisions with hidden values masked,
 * the controls' answers and their audit rows, and the roles on the new routes. The rules of a
 * rollout run with real agents in test/integration/upgrade.test.ts; the planner's on the
 * in-memory transaction in clusters-upgrade.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';

const GENEROUS = { burst: 100_000, perS: 100_000 };
const NODES = ['u1', 'u2', 'u3'];
const OP = 'spiffe://herald.local/operator/admin';

let pki: ControllerTestPki;
let creds: Map<string, Cred>;
let t: TestController;
let op: Cred;
let install: string, install2: string, uninstall: string;
let id: string;

/** Signals success for every item not yet signalled on the nodes until `done` holds (a stand-in agent). */
async function settle(done: () => Promise<boolean>): Promise<void> {
  await waitFor('the cluster to settle', async () => {
    for (const n of NODES) {
      const md = await t.req(creds.get(n)!, 'GET', `/v1/nodes/${n}/metadata`);
      for (const item of (md.json?.deployments ?? []) as any[]) {
        if (item.signalled) continue;
        await t.req(creds.get(n)!, 'POST', `/v1/nodes/${n}/deployments/${item.deployment_id}/signal`, {
          revision: item.revision,
          deploy_status_code: 0,
          outputs: {},
        });
      }
    }
    return done();
  });
}

const cluster = async () => (await t.req(op, 'GET', `/v1/clusters/${id}`)).json;
const status = async () => (await cluster()).status as string;
const patch = async (body: unknown, p = `/v1/clusters/${id}`) => t.req(op, 'PATCH', p, body);

beforeAll(async () => {
  pki = await makeControllerTestPki();
  creds = new Map();
  for (const n of NODES) creds.set(n, await pki.issueAgent(n));
  op = pki.cred('operator', 'admin');
  t = await startTestController(
    pki,
    {},
    { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS }, stepMarginS: 0, clusterTickMs: 50 },
  );
  for (const n of NODES)
    await t.req(creds.get(n)!, 'PUT', `/v1/nodes/${n}/endpoint`, { url: 'wss://127.0.0.1:7443/v1/wake' });
  const mk = async (name: string, extra: Record<string, unknown> = {}) =>
    (await t.req(op, 'POST', '/v1/configs', { name, group: 'script', config: '#!/bin/sh\n', ...extra })).json
      .id as string;
  install = await mk('install', {
    inputs: [
      { name: 'token', hidden: true },
      { name: 'port', type: 'Number' },
    ],
  });
  install2 = await mk('install-2', { inputs: [{ name: 'port', type: 'Number' }] });
  uninstall = await mk('uninstall');
  const r = await t.req(op, 'POST', '/v1/clusters', {
    name: 'k',
    install_config_id: install,
    uninstall_config_id: uninstall,
    input_values: { token: 's3cr3t', port: 80 },
    nodegroups: [
      { name: 'masters', role: 'master', nodes: ['u1'] },
      { name: 'workers', nodes: ['u2', 'u3'] },
    ],
  });
  expect(r.status, r.text).toBe(201);
  id = r.json.id;
  await settle(async () => (await status()) === 'CREATE_COMPLETE');
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

describe('upgrades through the API', () => {
  it('refuses bad upgrades naming the field and the code, and changes nothing', async () => {
    const err = async (body: unknown, p?: string) => (await patch(body, p)).json?.error;
    expect(await err({ install_config_id: 'nope' })).toMatchObject({
      code: 'unknown_config',
      field: 'install_config_id',
    });
    expect(await err({ input_values: { port: 'eighty' } })).toMatchObject({
      code: 'bad_input_value',
      field: 'input_values.port',
    });
    expect(await err({ install_config_id: install2, canary: '0%' })).toMatchObject({
      code: 'invalid_request',
      field: 'canary',
    });
    expect(await err({ install_config_id: install2, on_failure: 'retry' })).toMatchObject({
      code: 'invalid_request',
      field: 'on_failure',
    });
    expect(await err({ install_config_id: install2, gate: { url: 'http://gate.example/ok' } })).toMatchObject({
      code: 'invalid_request',
      field: 'gate.url',
    });
    // credentials in a gate's URL would be kept and shown: refused
    expect(await err({ install_config_id: install2, gate: { url: 'https://user:pw@gate.example/ok' } })).toMatchObject({
      code: 'invalid_request',
      field: 'gate.url',
    });
    expect(await err({ install_config_id: install2, gate: { prometheus: 'https://prom.example' } })).toMatchObject({
      code: 'invalid_request',
      field: 'gate.query',
    });
    expect(
      await err({
        install_config_id: install2,
        gate: { url: 'https://a.example', prometheus: 'https://b.example', query: 'q' },
      }),
    ).toMatchObject({ code: 'invalid_request', field: 'gate' });
    expect(await err({ install_config_id: install2, progress_deadline_s: 0 })).toMatchObject({
      code: 'invalid_request',
      field: 'progress_deadline_s',
    });
    expect(await err({ input_values: { port: 80 } })).toMatchObject({ code: 'no_change' });
    expect(await err({ install_config_id: install2 }, `/v1/clusters/${id}/nodegroups/gpus`)).toMatchObject({
      code: 'not_found',
    });
    expect(await err({}, `/v1/clusters/nope`)).toMatchObject({ code: 'not_found' });
    expect(await err({ on_failure: 'revert' }, `/v1/clusters/${id}/actions/restart`)).toMatchObject({
      code: 'invalid_request',
      field: 'on_failure',
    });
    expect(await err({}, `/v1/clusters/${id}/actions/undo`)).toMatchObject({
      code: 'no_stable_revision',
      field: 'revision',
    });
    expect(await err({ revision: 9 }, `/v1/clusters/${id}/actions/undo`)).toMatchObject({
      code: 'unknown_cluster_revision',
      field: 'revision',
    });
    const c = await cluster();
    expect(c).toMatchObject({ status: 'CREATE_COMPLETE', revision: 1 });
    expect((await t.req(op, 'GET', `/v1/clusters/${id}/revisions`)).json.items).toHaveLength(1);
  });

  it('answers a dry run with the plan, the revision it would make and the quorum, and changes nothing', async () => {
    const r = await patch({
      install_config_id: install2,
      canary: 1,
      on_failure: 'revert',
      max_unavailable: 5,
      dry_run: true,
    });
    expect(r.status, r.text).toBe(200);
    expect(r.json).toMatchObject({
      cluster: id,
      dry_run: true,
      new_revision: true,
      revision: 2,
      from_revision: 1,
      stable_revision: 1,
      canaries: ['u1', 'u2'],
      on_failure: 'revert',
      nodegroups: [
        { name: 'masters', nodes: ['u1'], max_unavailable: 1, quorum_max_unavailable: 1, canary: 1 },
        { name: 'workers', nodes: ['u2', 'u3'], max_unavailable: 2, canary: 1 },
      ],
    });
    expect(await cluster()).toMatchObject({ status: 'CREATE_COMPLETE', revision: 1 });
  });

  it('an upgrade answers 202 with the cluster; the controls answer for it and each lands in the audit with who', async () => {
    const r = await patch({ install_config_id: install2, input_values: { token: null, port: 8080 }, canary: 1 });
    expect(r.status, r.text).toBe(202);
    expect(r.json).toMatchObject({ status: 'UPDATE_IN_PROGRESS', operation: 'update', revision: 2 });
    expect(r.json.counters).toMatchObject({ targeted: 3 });
    expect((await patch({}, `/v1/clusters/${id}/actions/restart`)).json.error.code).toBe('restart_in_progress');
    const paused = await patch(undefined, `/v1/clusters/${id}/actions/pause`);
    expect(paused.status).toBe(200);
    expect(paused.json.rollout.state).toMatchObject({ phase: 'paused', paused: { by: OP, reason: `paused by ${OP}` } });
    const resumed = await patch(undefined, `/v1/clusters/${id}/actions/resume`);
    expect(resumed.json.rollout.state.paused).toBeNull();
    await settle(async () => (await cluster()).rollout.state.phase === 'awaiting_promotion');
    const promoted = await patch(undefined, `/v1/clusters/${id}/actions/promote`);
    expect(promoted.json.rollout.state.promoted).toMatchObject({ by: OP });
    expect((await patch(undefined, `/v1/clusters/${id}/actions/promote`)).json.error.code).toBe('not_promotable');
    await settle(async () => (await status()) === 'UPDATE_COMPLETE');
    const c = await cluster();
    expect(c.counters).toEqual({ targeted: 3, completed: 3, failed: 0, timed_out: 0, in_flight: 0, reverted: 0 });
    expect(c.input_values).toEqual({ port: 8080 });
    const audit = (await t.req(op, 'GET', '/v1/audit?limit=20')).json.items.map((a: any) => [
      a.action,
      a.who,
      a.target,
    ]);
    for (const what of ['cluster.upgrade', 'cluster.pause', 'cluster.resume', 'cluster.promote'])
      expect(audit).toContainEqual([what, OP, id]);
    for (const what of ['pause', 'resume', 'abort', 'promote'])
      expect((await patch(undefined, `/v1/clusters/${id}/actions/${what}`)).json.error.code).toBe('no_operation');
  });

  it('lists the revisions oldest first, which are stable and current, hidden values masked', async () => {
    const r = await t.req(op, 'GET', `/v1/clusters/${id}/revisions`);
    expect(r.status).toBe(200);
    expect(r.json.items).toMatchObject([
      {
        revision: 1,
        install_config_id: install,
        input_values: { token: '***', port: 80 },
        stable: true,
        current: false,
      },
      {
        revision: 2,
        install_config_id: install2,
        input_values: { port: 8080 },
        stable: true,
        current: true,
        created_by: OP,
      },
    ]);
    expect(r.json.items[0].nodegroups.map((g: any) => g.name)).toEqual(['masters', 'workers']);
    expect((await t.req(op, 'GET', '/v1/clusters/nope/revisions')).status).toBe(404);
  });

  it('an undo rolls the last stable revision before as a new one', async () => {
    const dry = await patch({ dry_run: true }, `/v1/clusters/${id}/actions/undo`);
    expect(dry.json).toMatchObject({ revision: 3, undo_of: 1, new_revision: true });
    const r = await patch({}, `/v1/clusters/${id}/actions/undo`);
    expect(r.status, r.text).toBe(202);
    await settle(async () => (await status()) === 'UPDATE_COMPLETE');
    const revs = (await t.req(op, 'GET', `/v1/clusters/${id}/revisions`)).json.items;
    expect(revs[2]).toMatchObject({
      revision: 3,
      source_revision: 1,
      install_config_id: install,
      current: true,
      stable: true,
    });
    expect((await cluster()).input_values).toEqual({ token: '***', port: 80 });
  });

  it("an agent's certificate on the new routes is 403 wrong_role", async () => {
    const agent = creds.get('u1')!;
    for (const [m, p] of [
      ['PATCH', `/v1/clusters/${id}`],
      ['PATCH', `/v1/clusters/${id}/nodegroups/workers`],
      ['PATCH', `/v1/clusters/${id}/actions/pause`],
      ['PATCH', `/v1/clusters/${id}/actions/undo`],
      ['GET', `/v1/clusters/${id}/revisions`],
    ] as const) {
      const r = await t.req(agent, m, p, {});
      expect(r.status, p).toBe(403);
      expect(r.json.error.code, p).toBe('wrong_role');
    }
  });
});
