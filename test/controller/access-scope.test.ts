/**
 * Scopes at the API (docs/access.md), on SQLite and on PostgreSQL: every way a request names
 * nodes is checked against the grant's scope, selectors of each kind (node name pattern, label,
 * cluster, node group). A deployment by its node; a cluster by name or by its members, and one
 * group of it; a new cluster's and a new group's nodes as they are before they join; a node read,
 * relabelled, deleted, revoked, created; a join token by its node; lists and `/metrics` filtered;
 * the event stream showing only what its operator may read and ended when the grant goes;
 * hidden outputs masked to those who may not deploy to the node; the routes of the whole fleet;
 * and `can-i` / `whoami` answering as the routes decide. A real controller over real TLS.
 */
import { Gauge } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueIssuer } from '../../certs/pki.js';
import { IDLE_PUSH_STATE } from '../../controller/push/types.js';
import { newNonce } from '../../protocol/metadata.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, waitFor, type Res, type TestController } from '../helpers/controller-harness.js';
import { readEvents, type EventReader } from '../helpers/event-stream.js';
import { startPg, type PgServer } from '../helpers/pg.js';
import type { Cred as FullCred } from '../helpers/procs.js';

let pki: ControllerTestPki;
let pg: PgServer;
const OPERATORS = ['oncall', 'webdev', 'shopdev', 'workersdev', 'webadmin', 'labeladmin', 'streamdev', 'nobody'];
const op = {} as Record<string, Cred>;
const agents = {} as Record<string, Cred>;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  await issueIssuer({ dir: pki.dir, name: 'i1' });
  for (const name of OPERATORS) op[name] = await pki.issueOperator(name);
  for (const node of ['web-1', 'web-2', 'web-3', 'db-1', 'db-2']) agents[node] = await pki.issueAgent(node);
  pg = await startPg();
}, 60_000);

afterAll(async () => {
  await pg?.close();
  pki?.cleanup();
});

function refused(r: Res, code: 'forbidden' | 'out_of_scope'): void {
  expect({ status: r.status, code: r.json?.error?.code }, r.text).toEqual({ status: 403, code });
}

function passed(r: Res, status: number): void {
  expect(r.status, r.text).toBe(status);
}

describe.each(['sqlite', 'postgres'] as const)('scopes (%s)', (kind) => {
  let t: TestController;
  const admin = (): Cred => pki.cred('operator', 'admin');
  const grantIds: Record<string, string> = {};
  let install: string;
  let uninstall: string;
  let shop: string;
  let data: string;
  let dWeb: string;
  let dDb: string;
  const req = (c: Cred, method: string, path: string, body?: unknown) => t.req(c, method, path, body);

  beforeAll(async () => {
    t = await startTestController(
      pki,
      { issuer: 'i1', ...(kind === 'postgres' ? { db: await pg.createDatabase() } : {}) },
      { rates: { announce: { burst: 1000, perS: 1000 }, other: { burst: 100_000, perS: 100_000 } } },
    );
    const labels: Record<string, string> = {
      'web-1': 'web',
      'web-2': 'web',
      'web-3': 'web',
      'web-4': 'web',
      'db-1': 'db',
      'db-2': 'db',
    };
    for (const [id, team] of Object.entries(labels))
      passed(await req(admin(), 'POST', '/v1/nodes', { id, labels: { team } }), 201);
    const cfg = async (body: Record<string, unknown>) => {
      const r = await req(admin(), 'POST', '/v1/configs', { group: 'script', config: '#!/bin/sh\n', ...body });
      passed(r, 201);
      return r.json.id as string;
    };
    install = await cfg({ name: 'install', outputs: [{ name: 'secret', hidden: true }, { name: 'url' }] });
    uninstall = await cfg({ name: 'uninstall' });
    const cluster = async (body: Record<string, unknown>) => {
      const r = await req(admin(), 'POST', '/v1/clusters', {
        install_config_id: install,
        uninstall_config_id: uninstall,
        ...body,
      });
      passed(r, 201);
      // each member's install succeeds: the cluster is CREATE_COMPLETE, ready for a restart
      for (const n of r.json.nodes as Array<{ node: string; install_deployment_id: string }>)
        passed(
          await t.req(agents[n.node]!, 'POST', `/v1/nodes/${n.node}/deployments/${n.install_deployment_id}/signal`, {
            revision: 1,
            deploy_status_code: 0,
          }),
          200,
        );
      return r.json.id as string;
    };
    shop = await cluster({
      name: 'shop',
      nodegroups: [
        { name: 'masters', role: 'master', nodes: ['web-1'] },
        { name: 'workers', nodes: ['web-2'] },
      ],
    });
    data = await cluster({ name: 'data', nodes: ['db-1'] });
    const dep = async (node: string) => {
      const r = await req(admin(), 'POST', '/v1/deployments', { node, config_id: install });
      passed(r, 201);
      return r.json.id as string;
    };
    dWeb = await dep('web-3');
    dDb = await dep('db-2');
    const grants: Array<[string, string, string[]]> = [
      ['oncall', 'viewer', ['*']],
      ['webdev', 'deployer', ['label:team=web']],
      ['shopdev', 'deployer', ['cluster:shop']],
      ['workersdev', 'deployer', ['nodegroup:shop/workers']],
      ['webadmin', 'admin', ['node:web-*']],
      ['labeladmin', 'admin', ['label:team=web']],
      ['streamdev', 'viewer', ['label:team=web']],
    ];
    for (const [name, role, scope] of grants) {
      const r = await req(admin(), 'POST', '/v1/access/grants', { subject: name, role, scope });
      passed(r, 201);
      grantIds[name] = r.json.id as string;
    }
  }, 60_000);

  afterAll(async () => {
    await t?.close();
  });

  it("checks a deployment by its node: create, read, revisions, output, update, delete, and the list's filter", async () => {
    const webdev = op.webdev!;
    passed(await req(webdev, 'POST', '/v1/deployments', { node: 'web-3', config_id: install, name: 'x' }), 201);
    refused(await req(webdev, 'POST', '/v1/deployments', { node: 'db-2', config_id: install }), 'out_of_scope');
    passed(await req(webdev, 'GET', `/v1/deployments/${dWeb}`), 200);
    for (const [method, path, body] of [
      ['GET', `/v1/deployments/${dDb}`],
      ['GET', `/v1/deployments/${dDb}/revisions`],
      ['GET', `/v1/deployments/${dDb}/output`],
      ['PATCH', `/v1/deployments/${dDb}`, { input_values: { a: '1' } }],
      ['DELETE', `/v1/deployments/${dDb}`],
    ] as const)
      refused(await req(webdev, method, path, body), 'out_of_scope');
    // the viewer reads them all and changes none
    passed(await req(op.oncall!, 'GET', `/v1/deployments/${dDb}/revisions`), 200);
    refused(await req(op.oncall!, 'PATCH', `/v1/deployments/${dWeb}`, {}), 'forbidden');
    const list = (await req(webdev, 'GET', '/v1/deployments')).json.items as Array<{ id: string; node: string }>;
    expect(list.map((d) => d.id)).toContain(dWeb);
    expect(list.every((d) => d.node.startsWith('web-'))).toBe(true);
    expect((await req(webdev, 'GET', '/v1/deployments?node=db-2')).json.items).toEqual([]);
    const all = (await req(op.oncall!, 'GET', '/v1/deployments')).json.items as Array<{ id: string }>;
    expect(all.map((d) => d.id)).toContain(dDb);
    // the log line names the rule that refused
    const line = await waitFor('the refusal logged with its rule', () =>
      t
        .logLines()
        .find(
          (l) =>
            l.event === 'access.refused' && String(l.rule).includes('node db-2') && String(l.peer).endsWith('/webdev'),
        ),
    );
    expect(line).toMatchObject({ code: 'out_of_scope', verb: 'deploy', status: 403 });
  });

  it('checks a cluster by name or by all its members, and one node group by its name', async () => {
    const plan = { dry_run: true };
    const clusters = (c: Cred) =>
      req(c, 'GET', '/v1/clusters').then((r) => (r.json.items as Array<{ name: string }>).map((x) => x.name).sort());
    expect(await clusters(op.shopdev!)).toEqual(['shop']);
    expect(await clusters(op.webdev!)).toEqual(['shop']); // every member of shop is team=web
    expect(await clusters(op.oncall!)).toEqual(['data', 'shop']);
    passed(await req(op.shopdev!, 'GET', `/v1/clusters/${shop}`), 200);
    refused(await req(op.shopdev!, 'GET', `/v1/clusters/${data}`), 'out_of_scope');
    passed(await req(op.shopdev!, 'PATCH', `/v1/clusters/${shop}/actions/restart`, plan), 200);
    passed(await req(op.webdev!, 'PATCH', `/v1/clusters/${shop}/actions/restart`, plan), 200);
    refused(await req(op.shopdev!, 'PATCH', `/v1/clusters/${data}/actions/restart`, plan), 'out_of_scope');
    refused(await req(op.shopdev!, 'DELETE', `/v1/clusters/${data}`), 'out_of_scope');
    refused(await req(op.oncall!, 'PATCH', `/v1/clusters/${shop}/actions/restart`, plan), 'forbidden');
    // one group: its own selector reaches it, not the whole cluster nor the other group
    const w = op.workersdev!;
    passed(await req(w, 'PATCH', `/v1/clusters/${shop}/nodegroups/workers/actions/restart`, plan), 200);
    passed(await req(w, 'GET', `/v1/clusters/${shop}/nodegroups/workers`), 200);
    refused(await req(w, 'PATCH', `/v1/clusters/${shop}/nodegroups/masters/actions/restart`, plan), 'out_of_scope');
    refused(await req(w, 'GET', `/v1/clusters/${shop}/nodegroups/masters`), 'out_of_scope');
    refused(await req(w, 'DELETE', `/v1/clusters/${shop}/nodegroups/masters`), 'out_of_scope');
    refused(await req(w, 'PATCH', `/v1/clusters/${shop}/actions/restart`, plan), 'out_of_scope');
    refused(await req(w, 'GET', `/v1/clusters/${shop}`), 'out_of_scope');
  });

  it("checks a new cluster's and a new node group's nodes as they are: naming the cluster reaches none of them", async () => {
    const body = { install_config_id: install, uninstall_config_id: uninstall };
    refused(
      await req(op.webdev!, 'POST', '/v1/clusters', { ...body, name: 'mix', nodes: ['web-4', 'db-2'] }),
      'out_of_scope',
    );
    refused(
      await req(op.webdev!, 'POST', '/v1/clusters', {
        ...body,
        name: 'mix',
        nodegroups: [
          { name: 'a', nodes: ['web-4'] },
          { name: 'b', nodes: ['db-2'] },
        ],
      }),
      'out_of_scope',
    );
    // a cluster: selector names a cluster's members, not the nodes someone would put in it
    refused(await req(op.shopdev!, 'POST', '/v1/clusters', { ...body, name: 'shop', nodes: ['db-2'] }), 'out_of_scope');
    refused(
      await req(op.shopdev!, 'POST', `/v1/clusters/${shop}/nodegroups`, { name: 'more', nodes: ['db-2'] }),
      'out_of_scope',
    );
    refused(
      await req(op.webdev!, 'POST', `/v1/clusters/${data}/nodegroups`, { name: 'more', nodes: ['web-4'] }),
      'out_of_scope',
    );
    const made = await req(op.webdev!, 'POST', '/v1/clusters', { ...body, name: 'web-only', nodes: ['web-4'] });
    passed(made, 201);
    // an unreadable body names nothing: the route's own validation answers
    expect((await req(op.webdev!, 'POST', '/v1/clusters', { ...body, name: 'x', nodes: 'db-2' })).json.error.code).toBe(
      'invalid_request',
    );
  });

  it('checks a node read, relabelled, deleted, revoked and created, before and after a relabelling', async () => {
    const ids = (r: Res) => (r.json.items as Array<{ id: string }>).map((n) => n.id).sort();
    expect(ids(await req(op.webdev!, 'GET', '/v1/nodes'))).toEqual(['web-1', 'web-2', 'web-3', 'web-4']);
    expect((await req(op.webdev!, 'GET', '/v1/nodes/web-1')).json.labels).toEqual({ team: 'web' });
    refused(await req(op.webdev!, 'GET', '/v1/nodes/db-1'), 'out_of_scope');
    const wa = op.webadmin!;
    refused(await req(wa, 'POST', '/v1/nodes', { id: 'db-9' }), 'out_of_scope');
    passed(await req(wa, 'POST', '/v1/nodes', { id: 'web-9', labels: { team: 'db' } }), 201);
    refused(await req(wa, 'DELETE', '/v1/nodes/db-2'), 'out_of_scope');
    refused(await req(wa, 'POST', '/v1/nodes/db-2/revoke', {}), 'out_of_scope');
    passed(await req(wa, 'POST', '/v1/nodes/web-9/revoke', {}), 200);
    refused(await req(op.webdev!, 'DELETE', '/v1/nodes/web-9'), 'forbidden');
    // labels: a scoped admin can move a node neither into nor out of its scope
    const la = op.labeladmin!;
    refused(await req(la, 'POST', '/v1/nodes', { id: 'x-1', labels: { team: 'db' } }), 'out_of_scope');
    passed(await req(la, 'POST', '/v1/nodes', { id: 'x-1', labels: { team: 'web' } }), 201);
    refused(await req(la, 'PATCH', '/v1/nodes/db-1', { labels: { team: 'web' } }), 'out_of_scope');
    refused(await req(la, 'PATCH', '/v1/nodes/web-3', { labels: { team: 'db' } }), 'out_of_scope');
    refused(await req(la, 'PATCH', '/v1/nodes/web-3', { labels: { team: null } }), 'out_of_scope');
    const set = await req(la, 'PATCH', '/v1/nodes/web-3', { labels: { tier: 'front' } });
    passed(set, 200);
    expect(set.json.labels).toEqual({ team: 'web', tier: 'front' });
    passed(await req(wa, 'DELETE', '/v1/nodes/web-9'), 204);
  });

  it('checks a join token by its node: made, listed and revoked within the scope only', async () => {
    const token = (c: Cred, node: string) => req(c, 'POST', '/v1/enrollment-tokens', { node });
    refused(await token(op.webadmin!, 'db-1'), 'out_of_scope');
    refused(await token(op.webdev!, 'web-5'), 'forbidden');
    const t5 = await token(op.webadmin!, 'web-5'); // no such node yet: its name puts it in the scope
    passed(t5, 201);
    refused(await token(op.labeladmin!, 'web-7'), 'out_of_scope'); // a node not yet made has no labels
    const t3 = await token(op.labeladmin!, 'web-3');
    passed(t3, 201);
    const listed = async (c: Cred) =>
      ((await req(c, 'GET', '/v1/enrollment-tokens')).json.items as Array<{ node: string }>).map((x) => x.node).sort();
    expect(await listed(op.labeladmin!)).toEqual(['web-3']);
    expect(await listed(op.webadmin!)).toEqual(['web-3', 'web-5']);
    const dbToken = await token(admin(), 'db-2');
    passed(dbToken, 201);
    refused(await req(op.webadmin!, 'DELETE', `/v1/enrollment-tokens/${dbToken.json.id}`), 'out_of_scope');
    passed(await req(op.webadmin!, 'DELETE', `/v1/enrollment-tokens/${t3.json.id}`), 200);
  });

  it('needs the role over the whole fleet for the audit trail and the grants', async () => {
    refused(await req(op.webadmin!, 'GET', '/v1/audit'), 'out_of_scope');
    refused(await req(op.webadmin!, 'GET', '/v1/access/grants'), 'out_of_scope');
    refused(
      await req(op.webadmin!, 'POST', '/v1/access/grants', { subject: 'webadmin', role: 'admin' }),
      'out_of_scope',
    );
    refused(await req(op.oncall!, 'GET', '/v1/audit'), 'forbidden');
    passed(await req(admin(), 'GET', '/v1/audit'), 200);
    // the bootstrap admin is the controller's option: not revocable through the API, so no one locks the fleet out
    const boot = await req(admin(), 'DELETE', '/v1/access/grants/bootstrap:admin');
    expect({ status: boot.status, code: boot.json.error.code }).toEqual({ status: 400, code: 'invalid_request' });
    const grants = (await req(admin(), 'GET', '/v1/access/grants')).json.items as Array<{ id: string; source: string }>;
    expect(grants[0]).toMatchObject({ id: 'bootstrap:admin', source: 'bootstrap' });
    // a grant changes what an operator may do, and is in the audit trail with who made it
    const audit = (await req(admin(), 'GET', '/v1/audit?limit=1000')).json.items as Array<{
      action: string;
      target: string;
      who: string;
    }>;
    expect(audit).toContainEqual(
      expect.objectContaining({
        action: 'access.grant',
        target: grantIds.webdev,
        who: pki.spiffe('operator', 'admin'),
      }),
    );
  });

  it('shows hidden outputs only to who may deploy to the node', async () => {
    const sig = await t.req(agents['web-3']!, 'POST', `/v1/nodes/web-3/deployments/${dWeb}/signal`, {
      revision: 1,
      deploy_status_code: 0,
      outputs: { secret: 's3cr3t', url: 'http://web-3' },
    });
    passed(sig, 200);
    const seen = async (c: Cred) => (await req(c, 'GET', `/v1/deployments/${dWeb}`)).json.output_values;
    expect(await seen(op.oncall!)).toMatchObject({ secret: '***', url: 'http://web-3' });
    expect(await seen(op.webdev!)).toMatchObject({ secret: 's3cr3t', url: 'http://web-3' });
    expect(await seen(op.shopdev!)).toBeUndefined(); // web-3 is outside shop: not even read
    const revs = (await req(op.oncall!, 'GET', `/v1/deployments/${dWeb}/revisions`)).json.items;
    expect(revs[0].output_values.secret).toBe('***');
    const listed = (await req(op.oncall!, 'GET', '/v1/deployments?node=web-3')).json.items as Array<{
      id: string;
      output_values: Record<string, unknown> | null;
    }>;
    expect(listed.find((d) => d.id === dWeb)?.output_values?.secret).toBe('***');
    expect(JSON.stringify((await req(op.oncall!, 'GET', `/v1/deployments/${dWeb}`)).json)).not.toContain('s3cr3t');
  });

  it('filters /metrics: a series naming a node the caller may not read is left out', async () => {
    const g = new Gauge({
      name: 'herald_test_node_gauge',
      help: 'test',
      labelNames: ['node'],
      registers: [t.ctl.metrics.registry],
    });
    g.set({ node: 'web-1' }, 1);
    g.set({ node: 'db-1' }, 2);
    const text = async (c: Cred) => (await req(c, 'GET', '/metrics')).text;
    const scoped = await text(op.webdev!);
    expect(scoped).toContain('herald_test_node_gauge{node="web-1"} 1');
    expect(scoped).not.toContain('node="db-1"');
    expect(scoped).toContain('herald_api_requests_total');
    expect(await text(op.oncall!)).toContain('herald_test_node_gauge{node="db-1"} 2');
    t.ctl.metrics.registry.removeSingleMetric('herald_test_node_gauge');
  });

  it('shows on the event stream only what its operator may read, and ends it when the grant goes', async () => {
    const full = (c: Cred) => c as FullCred;
    const all: EventReader = readEvents(t.port, full(op.oncall!));
    const web: EventReader = readEvents(t.port, full(op.streamdev!));
    await Promise.all([all.opened, web.opened]);
    const key = (e: { event: string; data: Record<string, unknown> }) =>
      `${e.event} ${String(e.data.node ?? e.data.name ?? e.data.id)}${e.data.deleted ? ' deleted' : ''}`;
    // a deployment and its removal, push states, live output, a cluster, a node's labels
    const onDb = await req(admin(), 'POST', '/v1/deployments', { node: 'db-2', config_id: uninstall });
    const onWeb = await req(admin(), 'POST', '/v1/deployments', { node: 'web-3', config_id: uninstall });
    t.push.emit('state', 'db-1', { ...IDLE_PUSH_STATE, state: 'connected', connected: true });
    t.push.emit('state', 'web-1', { ...IDLE_PUSH_STATE, state: 'connected', connected: true });
    for (const [node, id] of [
      ['db-2', onDb.json.id],
      ['web-3', onWeb.json.id],
    ] as const) {
      const out = await t.req(agents[node]!, 'POST', `/v1/nodes/${node}/deployments/${id}/output`, {
        revision: 1,
        stream: 'stdout',
        seq: 1,
        text: `hello from ${node}\n`,
      });
      passed(out, 200);
    }
    passed(await req(admin(), 'DELETE', `/v1/deployments/${onDb.json.id}`), 204);
    passed(await req(admin(), 'DELETE', `/v1/deployments/${onWeb.json.id}`), 204);
    passed(
      await req(admin(), 'POST', '/v1/clusters', {
        name: 'data2',
        nodes: ['db-2'],
        install_config_id: install,
        uninstall_config_id: uninstall,
      }),
      201,
    );
    // db-2 relabelled into the reader's scope: its node event says so, and what follows is shown
    passed(await req(admin(), 'PATCH', '/v1/nodes/db-2', { labels: { team: 'web' } }), 200);
    t.push.emit('state', 'db-2', { ...IDLE_PUSH_STATE, state: 'connecting' });
    await waitFor('both streams to see the last event', () =>
      [web, all].every((s) => s.events.some((e) => key(e) === 'push db-2')),
    );
    const seen = new Set(web.events.map(key));
    const everything = new Set(all.events.map(key));
    for (const k of ['deployment db-2', 'deployment db-2 deleted', 'push db-1', 'output db-2', 'cluster data2'])
      expect({ k, all: everything.has(k), scoped: seen.has(k) }).toEqual({ k, all: true, scoped: false });
    for (const k of ['deployment web-3', 'deployment web-3 deleted', 'push web-1', 'output web-3', 'node db-2'])
      expect({ k, scoped: seen.has(k) }).toEqual({ k, scoped: true });
    // hidden outputs are masked in every event
    expect(JSON.stringify(all.events)).not.toContain('s3cr3t');
    passed(await req(admin(), 'PATCH', '/v1/nodes/db-2', { labels: { team: 'db' } }), 200);
    // the grant revoked through this controller: the stream ends at once, not at its next refresh
    passed(await req(admin(), 'DELETE', `/v1/access/grants/${grantIds.streamdev}`), 200);
    await web.ended;
    all.close();
  });

  it('answers can-i and whoami as the routes decide', async () => {
    const can = async (c: Cred, verb: string, target = '') =>
      (await req(c, 'GET', `/v1/access/can-i?verb=${verb}&target=${encodeURIComponent(target)}`)).json;
    expect(await can(op.webdev!, 'deploy', 'node:web-1')).toMatchObject({ allowed: true, code: null });
    expect(await can(op.webdev!, 'deploy', 'node:db-1')).toEqual({
      allowed: false,
      verb: 'deploy',
      target: 'node:db-1',
      code: 'out_of_scope',
      rule: "deploy on node db-1: outside operator/webdev's deploy scope (label:team=web)",
    });
    expect(await can(op.webdev!, 'deploy', 'cluster:shop')).toMatchObject({ allowed: true });
    expect(await can(op.webdev!, 'deploy', `cluster:${data}`)).toMatchObject({ allowed: false, code: 'out_of_scope' });
    expect(await can(op.workersdev!, 'deploy', 'nodegroup:shop/workers')).toMatchObject({ allowed: true });
    expect(await can(op.workersdev!, 'deploy', 'nodegroup:shop/masters')).toMatchObject({ allowed: false });
    expect(await can(op.webdev!, 'deploy', `deployment:${dWeb}`)).toMatchObject({ allowed: true });
    expect(await can(op.webdev!, 'author')).toMatchObject({ allowed: false, code: 'forbidden', target: '-' });
    expect(await can(op.webadmin!, 'admin', '*')).toMatchObject({ allowed: false, code: 'out_of_scope' });
    expect(await can(admin(), 'admin', '*')).toMatchObject({ allowed: true });
    const bad = await req(op.webdev!, 'GET', '/v1/access/can-i?verb=fly&target=node:web-1');
    expect({ status: bad.status, field: bad.json.error.field }).toEqual({ status: 400, field: 'verb' });
    const none = await req(op.webdev!, 'GET', '/v1/access/can-i?verb=read&target=cluster:nope');
    expect(none.status).toBe(404);
    const me = (await req(op.webdev!, 'GET', '/v1/access/whoami')).json;
    expect(me).toMatchObject({
      operator: 'webdev',
      identity: pki.spiffe('operator', 'webdev'),
      grants: [{ subject: 'webdev', role: 'deployer', scope: ['label:team=web'], source: 'database' }],
      verbs: { read: ['label:team=web'], deploy: ['label:team=web'], author: [], admin: [] },
    });
    const boss = (await req(admin(), 'GET', '/v1/access/whoami')).json;
    expect(boss.grants).toEqual([
      expect.objectContaining({ id: 'bootstrap:admin', role: 'admin', scope: ['*'], source: 'bootstrap' }),
    ]);
    // an operator without any grant may still ask
    const nobody = op.nobody!;
    expect((await req(nobody, 'GET', '/v1/access/whoami')).json.grants).toEqual([]);
    expect((await can(nobody, 'read', 'node:web-1')).code).toBe('forbidden');
    // a fetch of an agent is unaffected by any of this (its own node's metadata)
    const m = await t.req(agents['web-2']!, 'GET', '/v1/nodes/web-2/metadata', undefined, {
      headers: { 'herald-nonce': newNonce() },
    });
    expect(m.status).toBe(200);
  });
});
