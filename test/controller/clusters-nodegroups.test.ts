/**
 * Node groups and restart options through the API (docs/api.md), in-process: creating a cluster
 * with groups (and the flat form's one group), what GET shows, the refusals naming their
 * field, and a dry run's plan. The rules of a rollout run with real agents in
 * test/integration/rollout.test.ts; the planner's on the in-memory transaction in
 * clusters-rollout.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';

const GENEROUS = { burst: 100_000, perS: 100_000 };
const NODES = ['g1', 'g2', 'g3', 'g4'];

let pki: ControllerTestPki;
let creds: Map<string, Cred>;
let t: TestController;
let op: Cred;
let install: string, uninstall: string, gpuInstall: string;

/** Signals success for every item not yet signalled on `nodes` until `done` holds (a stand-in agent). */
async function settle(nodes: string[], done: () => Promise<boolean>): Promise<void> {
  await waitFor('the cluster to settle', async () => {
    for (const n of nodes) {
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
  install = await mk('install', { inputs: [{ name: 'token', hidden: true }, { name: 'zone' }] });
  uninstall = await mk('uninstall');
  gpuInstall = await mk('install-gpu', { inputs: [{ name: 'zone' }] });
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

describe('node groups through the API', () => {
  const base = () => ({ name: 'k', install_config_id: install, uninstall_config_id: uninstall });
  let id: string;

  it('refuses bad groups naming the field: a node in two groups, a bad name or role, a group twice, both forms', async () => {
    const post = async (body: unknown) => (await t.req(op, 'POST', '/v1/clusters', body)).json.error;
    expect(
      await post({
        ...base(),
        nodegroups: [
          { name: 'a', nodes: ['g1', 'g2'] },
          { name: 'b', nodes: ['g3', 'g1'] },
        ],
      }),
    ).toMatchObject({ code: 'invalid_request', field: 'nodegroups.1.nodes.1' });
    expect(await post({ ...base(), nodegroups: [{ name: 'Bad Name', nodes: ['g1'] }] })).toMatchObject({
      code: 'invalid_request',
      field: 'nodegroups.0.name',
    });
    expect(await post({ ...base(), nodegroups: [{ name: 'a', role: 'boss', nodes: ['g1'] }] })).toMatchObject({
      code: 'invalid_request',
      field: 'nodegroups.0.role',
    });
    expect(
      await post({
        ...base(),
        nodegroups: [
          { name: 'a', nodes: ['g1'] },
          { name: 'a', nodes: ['g2'] },
        ],
      }),
    ).toMatchObject({ code: 'invalid_request', field: 'nodegroups.1.name' });
    expect(await post({ ...base(), nodes: ['g1'], nodegroups: [{ name: 'a', nodes: ['g2'] }] })).toMatchObject({
      code: 'invalid_request',
      field: 'nodegroups',
    });
    expect(
      await post({ ...base(), nodegroups: [{ name: 'a', nodes: ['g1'], install_config_id: 'nope' }] }),
    ).toMatchObject({ code: 'unknown_config', field: 'nodegroups.0.install_config_id' });
    expect((await t.req(op, 'GET', '/v1/clusters')).json.items).toEqual([]);
  });

  it("creates a cluster of groups, each with its role, nodes and phases; a group's config and values override the cluster's", async () => {
    const r = await t.req(op, 'POST', '/v1/clusters', {
      ...base(),
      input_values: { token: 's3cr3t', zone: 'a' },
      nodegroups: [
        { name: 'workers', nodes: ['g3', 'g4'], install_config_id: gpuInstall, input_values: { zone: 'b' } },
        { name: 'masters', role: 'master', nodes: ['g1', 'g2'] },
      ],
    });
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    id = r.json.id;
    expect(r.json.input_values).toEqual({ token: '***', zone: 'a' });
    expect(
      r.json.nodegroups.map((g: any) => [g.name, g.role, g.install_config_id, g.nodes.map((n: any) => n.node)]),
    ).toEqual([
      ['workers', 'worker', gpuInstall, ['g3', 'g4']],
      ['masters', 'master', install, ['g1', 'g2']],
    ]);
    expect(r.json.nodegroups[0].input_values).toEqual({ zone: 'b' });
    expect(r.json.nodegroups[1].nodes.map((n: any) => n.phase)).toEqual(['installing', 'installing']);
    // the group's own config runs on its nodes, with its values over the cluster's
    const md = await t.req(creds.get('g3')!, 'GET', '/v1/nodes/g3/metadata');
    const item = (md.json.deployments as any[]).find((i) => !i.signalled);
    expect(item.inputs.find((i: any) => i.name === 'zone').value).toBe('b');
    // a value the cluster's install config hides is hidden in the group's config too, which does not declare it
    expect(item.inputs.find((i: any) => i.name === 'token')).toMatchObject({ hidden: true });
    await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${id}`)).json.status === 'CREATE_COMPLETE');
  });

  it('refuses a node of a cluster in another one', async () => {
    const r = await t.req(op, 'POST', '/v1/clusters', {
      ...base(),
      name: 'other',
      nodegroups: [{ name: 'x', nodes: ['g2'] }],
    });
    expect(r.status).toBe(409);
    expect(r.json.error).toMatchObject({ code: 'cluster_busy', field: 'nodes.0' });
  });

  it('refuses bad restart options naming the field, and changes nothing', async () => {
    const patch = async (body: unknown, p = `/v1/clusters/${id}/actions/restart`) =>
      (await t.req(op, 'PATCH', p, body)).json?.error;
    expect(await patch({ nodegroups: ['masters', 'gpus'] })).toMatchObject({
      code: 'unknown_nodegroup',
      field: 'nodegroups.1',
    });
    expect(await patch({ max_unavailable: '150%' })).toMatchObject({
      code: 'invalid_request',
      field: 'max_unavailable',
    });
    expect(await patch({ max_unavailable: 0 })).toMatchObject({ code: 'invalid_request', field: 'max_unavailable' });
    expect(await patch({ pause_s: -1 })).toMatchObject({ code: 'invalid_request', field: 'pause_s' });
    expect(await patch({ max_failures: -1 })).toMatchObject({ code: 'invalid_request', field: 'max_failures' });
    expect(await patch({ health_config_id: 'nope' })).toMatchObject({
      code: 'unknown_config',
      field: 'health_config_id',
    });
    expect(await patch({}, `/v1/clusters/${id}/nodegroups/gpus/actions/restart`)).toMatchObject({ code: 'not_found' });
    expect(
      await patch({ nodegroups: ['workers'] }, `/v1/clusters/${id}/nodegroups/masters/actions/restart`),
    ).toMatchObject({ code: 'invalid_request', field: 'nodegroups' });
    expect((await t.req(op, 'GET', `/v1/clusters/${id}`)).json.status).toBe('CREATE_COMPLETE');
  });

  it('answers a dry run with the plan: masters first, each group with its nodes and limits', async () => {
    const r = await t.req(op, 'PATCH', `/v1/clusters/${id}/actions/restart`, {
      dry_run: true,
      max_unavailable: '50%',
      pause_s: 2,
      max_failures: 1,
    });
    expect(r.status).toBe(200);
    expect(r.json).toEqual({
      cluster: id,
      dry_run: true,
      nodegroups: [
        // a master group of two keeps its quorum: one down at a time, max(1, (2-1)/2)
        {
          name: 'masters',
          role: 'master',
          nodes: ['g1', 'g2'],
          max_unavailable: 1,
          quorum_max_unavailable: 1,
          canary: 0,
        },
        { name: 'workers', role: 'worker', nodes: ['g3', 'g4'], max_unavailable: 1, canary: 0 },
      ],
      pause_s: 2,
      max_failures: 1,
      health_config_id: null,
      canaries: [],
      auto_promote_s: null,
      on_failure: 'abort',
      node_deadline_s: null,
      progress_deadline_s: 3600,
      gate: null,
      force: false,
    });
    const one = await t.req(op, 'PATCH', `/v1/clusters/${id}/nodegroups/workers/actions/restart`, { dry_run: true });
    expect(one.json.nodegroups).toEqual([
      { name: 'workers', role: 'worker', nodes: ['g3', 'g4'], max_unavailable: 2, canary: 0 },
    ]);
    expect(one.json.progress_deadline_s).toBe(3600);
    expect((await t.req(op, 'GET', `/v1/clusters/${id}`)).json).toMatchObject({
      status: 'CREATE_COMPLETE',
      rollout: null,
    });
  });

  it('makes one group default-worker from the flat form', async () => {
    const other = await t.req(op, 'DELETE', `/v1/clusters/${id}`);
    expect(other.status).toBe(202);
    await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${id}`)).status === 404);
    const r = await t.req(op, 'POST', '/v1/clusters', { ...base(), nodes: ['g1', 'g2'] });
    expect(r.status).toBe(201);
    expect(r.json.nodegroups.map((g: any) => [g.name, g.role, g.nodes.length])).toEqual([
      ['default-worker', 'worker', 2],
    ]);
    expect(r.json.nodes.map((n: any) => n.nodegroup)).toEqual(['default-worker', 'default-worker']);
  });

  it('adds a group (its nodes install) and removes one (its nodes uninstall, then it goes)', async () => {
    const flat = (await t.req(op, 'GET', '/v1/clusters')).json.items[0];
    const cid = flat.id as string;
    await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json.status === 'CREATE_COMPLETE');
    const add = await t.req(op, 'POST', `/v1/clusters/${cid}/nodegroups`, {
      name: 'extra',
      nodes: ['g3', 'g4'],
      install_config_id: gpuInstall,
    });
    expect(add.status, JSON.stringify(add.json)).toBe(201);
    expect(add.headers.location).toBe(`/v1/clusters/${cid}/nodegroups/extra`);
    expect(add.json).toMatchObject({ name: 'extra', role: 'worker', install_config_id: gpuInstall });
    expect(add.json.nodes.map((n: any) => [n.node, n.phase])).toEqual([
      ['g3', 'installing'],
      ['g4', 'installing'],
    ]);
    expect((await t.req(op, 'GET', `/v1/clusters/${cid}`)).json.status).toBe('UPDATE_IN_PROGRESS');
    await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json.status === 'UPDATE_COMPLETE');
    const one = await t.req(op, 'GET', `/v1/clusters/${cid}/nodegroups/extra`);
    expect(one.json.nodes.map((n: any) => n.phase)).toEqual(['complete', 'complete']);
    // the other group was not touched
    const g1 = (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json.nodes.find((n: any) => n.node === 'g1');
    expect((await t.req(op, 'GET', `/v1/deployments/${g1.install_deployment_id}`)).json.revision).toBe(1);

    const post = async (body: unknown) => (await t.req(op, 'POST', `/v1/clusters/${cid}/nodegroups`, body)).json.error;
    expect(await post({ name: 'extra', nodes: ['g2'] })).toMatchObject({ code: 'invalid_request', field: 'name' });
    expect(await post({ name: 'more', nodes: ['g1'] })).toMatchObject({ code: 'cluster_busy', field: 'nodes.0' });
    expect(await post({ name: 'more', nodes: ['ghost'] })).toMatchObject({ code: 'unknown_node', field: 'nodes.0' });
    expect(await post({ name: 'more', nodes: ['g3'], uninstall_config_id: 'nope' })).toMatchObject({
      code: 'unknown_config',
      field: 'uninstall_config_id',
    });

    const del = await t.req(op, 'DELETE', `/v1/clusters/${cid}/nodegroups/extra`);
    expect(del.status).toBe(202);
    expect(del.json.status).toBe('UPDATE_IN_PROGRESS');
    const md = await t.req(creds.get('g3')!, 'GET', '/v1/nodes/g3/metadata');
    const pending = (md.json.deployments as any[]).filter((i) => !i.signalled);
    expect(pending.map((i) => i.inputs.find((x: any) => x.name === 'deploy_action').value)).toEqual(['DELETE']);
    await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json.status === 'UPDATE_COMPLETE');
    const after = (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json;
    expect(after.nodegroups.map((g: any) => g.name)).toEqual(['default-worker']);
    expect(after.nodes.map((n: any) => n.node)).toEqual(['g1', 'g2']);
    expect((await t.req(creds.get('g3')!, 'GET', '/v1/nodes/g3/metadata')).json.deployments).toEqual([]);
    expect((await t.req(op, 'GET', `/v1/clusters/${cid}/nodegroups/extra`)).status).toBe(404);
    expect((await t.req(op, 'DELETE', `/v1/clusters/${cid}/nodegroups/extra`)).status).toBe(404);
    expect((await t.req(op, 'DELETE', `/v1/clusters/${cid}/nodegroups/default-worker`)).json.error.code).toBe(
      'invalid_request',
    );
  });

  it('answers Prefer: return=minimal with the cluster without its members, counted instead; GET shows them all', async () => {
    const r = await t.req(
      op,
      'POST',
      '/v1/clusters',
      {
        ...base(),
        name: 'small-answer',
        input_values: { token: 's3cr3t' },
        nodegroups: [
          { name: 'masters', role: 'master', nodes: ['g3'] },
          { name: 'workers', nodes: ['g4'] },
        ],
      },
      { headers: { prefer: 'respond-async, return=minimal' } },
    );
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    expect(r.headers['preference-applied']).toBe('return=minimal');
    expect(r.headers.location).toBe(`/v1/clusters/${r.json.id}`);
    const full = (await t.req(op, 'GET', `/v1/clusters/${r.json.id}`)).json;
    const { nodes, nodegroups, ...head } = full;
    expect(nodes).toHaveLength(2);
    expect(r.json).toEqual({
      ...head,
      node_count: 2,
      nodegroups: nodegroups.map(({ nodes: members, ...g }: any) => ({ ...g, node_count: members.length })),
    });
    expect(r.json.input_values).toEqual({ token: '***' });
    // only the create takes the preference: GET shows the whole cluster
    const other = await t.req(op, 'GET', `/v1/clusters/${r.json.id}`, undefined, {
      headers: { prefer: 'return=minimal' },
    });
    expect(other.json.nodes).toHaveLength(2);
    await settle(
      ['g3', 'g4'],
      async () => (await t.req(op, 'GET', `/v1/clusters/${r.json.id}`)).json.status === 'CREATE_COMPLETE',
    );
  });

  it("makes a node's uninstall deployment at its first uninstall, of its group's config and values (a group added later too), and revises it at the next", async () => {
    for (const c of (await t.req(op, 'GET', '/v1/clusters')).json.items as Array<{ id: string }>) {
      expect((await t.req(op, 'DELETE', `/v1/clusters/${c.id}`)).status).toBe(202);
      await settle(NODES, async () => (await t.req(op, 'GET', `/v1/clusters/${c.id}`)).status === 404);
    }
    const ownUninstall = (
      await t.req(op, 'POST', '/v1/configs', {
        name: 'uninstall-own',
        group: 'script',
        config: '#!/bin/sh\n',
        inputs: [{ name: 'zone' }, { name: 'size', type: 'Number' }],
      })
    ).json.id as string;
    // a value the uninstall config refuses is refused at creation, though its deployment is made later
    for (const body of [
      { ...base(), uninstall_config_id: ownUninstall, nodes: ['g1'], input_values: { size: 'big' } },
      {
        ...base(),
        nodegroups: [{ name: 'own', nodes: ['g1'], uninstall_config_id: ownUninstall }],
        input_values: { size: 'big' },
      },
    ]) {
      const refused = await t.req(op, 'POST', '/v1/clusters', body);
      expect(refused.json.error.code, JSON.stringify(refused.json)).toBe('bad_input_value');
    }
    expect((await t.req(op, 'GET', '/v1/clusters')).json.items).toEqual([]);
    const r = await t.req(op, 'POST', '/v1/clusters', {
      ...base(),
      name: 'lazy',
      input_values: { token: 's3cr3t', zone: 'a', size: '1' },
      nodegroups: [
        { name: 'own', nodes: ['g1'], uninstall_config_id: ownUninstall, input_values: { zone: 'b', size: '2' } },
        { name: 'plain', nodes: ['g2'] },
      ],
    });
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    const cid = r.json.id as string;
    const cluster = async () => (await t.req(op, 'GET', `/v1/clusters/${cid}`)).json;
    const done = (status: string) => async () => (await cluster()).status === status;
    await settle(['g1', 'g2'], done('CREATE_COMPLETE'));
    expect((await cluster()).nodes.map((n: any) => n.uninstall_deployment_id)).toEqual([null, null]);
    expect((await t.req(op, 'GET', `/v1/deployments?node=g1`)).json.items.map((d: any) => d.name)).toEqual([
      'lazy-install',
    ]);

    const uninstallOf = async (node: string) => {
      const id = (await cluster()).nodes.find((n: any) => n.node === node).uninstall_deployment_id;
      return (await t.req(op, 'GET', `/v1/deployments/${id}`)).json;
    };
    expect((await t.req(op, 'PATCH', `/v1/clusters/${cid}/actions/restart`)).status).toBe(204);
    await settle(['g1', 'g2'], done('RESTART_COMPLETE'));
    const first = await uninstallOf('g1');
    // the group's own config, its values over the cluster's, coerced to the config's inputs, hidden ones masked
    expect(first).toMatchObject({
      name: 'lazy-uninstall',
      config_id: ownUninstall,
      revision: 1,
      action: 'RESTART',
      status: 'COMPLETE',
      input_values: { token: '***', zone: 'b', size: 2 },
    });
    expect(await uninstallOf('g2')).toMatchObject({
      config_id: uninstall,
      revision: 1,
      input_values: { token: '***', zone: 'a', size: '1' },
    });

    // a group added later: its nodes' uninstall deployments come from its own config and values as well
    const add = await t.req(op, 'POST', `/v1/clusters/${cid}/nodegroups`, {
      name: 'later',
      nodes: ['g3'],
      uninstall_config_id: ownUninstall,
      input_values: { zone: 'c' },
    });
    expect(add.status, JSON.stringify(add.json)).toBe(201);
    await settle(['g3'], done('UPDATE_COMPLETE'));
    expect((await cluster()).nodes.find((n: any) => n.node === 'g3').uninstall_deployment_id).toBeNull();
    expect((await t.req(op, 'PATCH', `/v1/clusters/${cid}/actions/restart`)).status).toBe(204);
    await settle(['g1', 'g2', 'g3'], done('RESTART_COMPLETE'));
    // the second uninstall revises the deployment the first made
    expect(await uninstallOf('g1')).toMatchObject({ id: first.id, revision: 2, action: 'RESTART' });
    expect(await uninstallOf('g3')).toMatchObject({
      config_id: ownUninstall,
      revision: 1,
      input_values: { token: '***', zone: 'c', size: 1 },
    });
  });
});
