/**
 * Every route of the API against every role (docs/access.md), driven by one table: for each route
 * the least role that may call it. The table must name exactly the routes the server has, so a
 * route added without a row here fails; each route's declared rule must say what its row says;
 * docs/api.md's route table must show that role; and a real request from each caller (no grant,
 * viewer, deployer, author, admin, an agent) is refused by the policy exactly when the row says so.
 * The ids in the paths name nothing: a caller the policy lets through gets the route's own answer
 * (404, 400, ...), never a refusal of the policy, and nothing is changed.
 */
import fs from 'node:fs';
import https from 'node:https';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ACCESS_ROLES, VERB_ROLE } from '../../protocol/access.js';
import type { RouteSpec } from '../../controller/api/router.js';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, type TestController } from '../helpers/controller-harness.js';

/** Who may call: `any` identity, the node's `agent`, any `operator` (no grant needed), or the least role. */
type Least = 'any' | 'agent' | 'operator' | 'viewer' | 'deployer' | 'author' | 'admin';

/** Every route, and the least that may call it. A new route needs a row here. */
const ROUTES: Record<string, Least> = {
  'GET /healthz': 'any',
  'PUT /v1/nodes/:node/endpoint': 'agent',
  'POST /v1/nodes/:node/certificate': 'agent',
  'GET /v1/nodes/:node/metadata': 'agent',
  'POST /v1/nodes/:node/deployments/:deployment/signal': 'agent',
  'POST /v1/nodes/:node/deployments/:deployment/output': 'agent',
  'POST /v1/enrollment-tokens': 'admin',
  'GET /v1/enrollment-tokens': 'admin',
  'DELETE /v1/enrollment-tokens/:id': 'admin',
  'POST /v1/nodes': 'admin',
  'GET /v1/nodes': 'viewer',
  'GET /v1/controllers': 'viewer',
  'GET /v1/nodes/:id': 'viewer',
  'PATCH /v1/nodes/:id': 'admin',
  'POST /v1/nodes/:id/revoke': 'admin',
  'DELETE /v1/nodes/:id': 'admin',
  'POST /v1/configs': 'author',
  'GET /v1/configs': 'viewer',
  'GET /v1/configs/:id': 'viewer',
  'POST /v1/deployments': 'deployer',
  'GET /v1/deployments': 'viewer',
  'GET /v1/deployments/:id': 'viewer',
  'GET /v1/deployments/:id/revisions': 'viewer',
  'GET /v1/deployments/:id/output': 'viewer',
  'PATCH /v1/deployments/:id': 'deployer',
  'DELETE /v1/deployments/:id': 'deployer',
  'POST /v1/clusters': 'deployer',
  'GET /v1/clusters': 'viewer',
  'GET /v1/clusters/:id': 'viewer',
  'DELETE /v1/clusters/:id': 'deployer',
  'PATCH /v1/clusters/:id/actions/restart': 'deployer',
  'POST /v1/clusters/:id/nodegroups': 'deployer',
  'GET /v1/clusters/:id/nodegroups/:name': 'viewer',
  'DELETE /v1/clusters/:id/nodegroups/:name': 'deployer',
  'PATCH /v1/clusters/:id/nodegroups/:name/actions/restart': 'deployer',
  'PATCH /v1/clusters/:id': 'deployer',
  'PATCH /v1/clusters/:id/nodegroups/:name': 'deployer',
  'PATCH /v1/clusters/:id/actions/undo': 'deployer',
  'PATCH /v1/clusters/:id/actions/pause': 'deployer',
  'PATCH /v1/clusters/:id/actions/resume': 'deployer',
  'PATCH /v1/clusters/:id/actions/abort': 'deployer',
  'PATCH /v1/clusters/:id/actions/promote': 'deployer',
  'GET /v1/clusters/:id/revisions': 'viewer',
  'GET /v1/audit': 'admin',
  'GET /v1/events': 'viewer',
  'GET /metrics': 'viewer',
  'GET /v1/access/whoami': 'operator',
  'GET /v1/access/can-i': 'operator',
  'GET /v1/access/grants': 'admin',
  'POST /v1/access/grants': 'admin',
  'DELETE /v1/access/grants/:id': 'admin',
};

/** Routes that need the role over the whole fleet (`*`), not over some nodes. */
const FLEET = new Set([
  'GET /v1/audit',
  'GET /v1/access/grants',
  'POST /v1/access/grants',
  'DELETE /v1/access/grants/:id',
]);

type Caller = 'nobody' | (typeof ACCESS_ROLES)[number] | 'agent';
const CALLERS: Caller[] = ['nobody', 'viewer', 'deployer', 'author', 'admin', 'agent'];

let pki: ControllerTestPki;
let t: TestController;
const creds = {} as Record<Caller, Cred>;
let routes: readonly RouteSpec[];

beforeAll(async () => {
  pki = await makeControllerTestPki();
  t = await startTestController(pki, {}, { rates: { other: { burst: 100_000, perS: 100_000 } } });
  const admin = pki.cred('operator', 'admin'); // --bootstrap-admin's default
  for (const role of ACCESS_ROLES) {
    creds[role] = await pki.issueOperator(`op-${role}`);
    const r = await t.req(admin, 'POST', '/v1/access/grants', { subject: `op-${role}`, role, scope: ['*'] });
    expect(r.status, r.text).toBe(201);
  }
  creds.nobody = await pki.issueOperator('op-nobody');
  creds.agent = pki.cred('agent', 'n1');
  routes = t.ctl.api.routes();
}, 60_000);

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

const keyOf = (r: Pick<RouteSpec, 'method' | 'path'>): string => `${r.method} ${r.path}`;

/** A concrete path: the agent's own node, ids that name nothing. */
function concrete(path: string): string {
  return path
    .replace(':node', 'n1')
    .replace(':deployment', '0191aaaa-0000-7000-8000-000000000000')
    .replace(':name', 'nogroup')
    .replace(':id', path.startsWith('/v1/nodes/') ? 'ghost' : '0191aaaa-0000-7000-8000-000000000001');
}

/** One request; a stream's answer is read only up to its status. */
function probe(cred: Cred, method: string, path: string): Promise<{ status: number; code: string | undefined }> {
  const body = method === 'POST' || method === 'PUT' || method === 'PATCH' ? Buffer.from('{}') : undefined;
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: t.port,
        method,
        path,
        ...cred,
        servername: 'localhost',
        agent: false,
        headers: body ? { 'content-type': 'application/json', 'content-length': String(body.length) } : {},
      },
      (res) => {
        if (String(res.headers['content-type']).startsWith('text/event-stream')) {
          resolve({ status: res.statusCode ?? 0, code: undefined });
          req.destroy();
          return;
        }
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          let code: string | undefined;
          try {
            code = JSON.parse(Buffer.concat(chunks).toString('utf8'))?.error?.code;
          } catch {
            code = undefined;
          }
          resolve({ status: res.statusCode ?? 0, code });
        });
      },
    );
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

/** What `caller` must meet on a route whose least caller is `least`: a refusal's code, or none. */
function expected(least: Least, caller: Caller): string | undefined {
  if (least === 'any') return undefined;
  if (least === 'agent') return caller === 'agent' ? undefined : 'wrong_role';
  if (caller === 'agent') return 'wrong_role';
  if (least === 'operator') return undefined;
  if (caller === 'nobody') return 'forbidden';
  return ACCESS_ROLES.indexOf(caller) >= ACCESS_ROLES.indexOf(least) ? undefined : 'forbidden';
}

const POLICY_CODES = new Set(['forbidden', 'out_of_scope', 'wrong_role', 'wrong_node']);

describe('the route table', () => {
  it('names every route the server has, and no other: a new route needs its row', () => {
    expect(routes.map(keyOf).sort()).toEqual(Object.keys(ROUTES).sort());
  });

  it("each route's declared rule says what its row says", () => {
    for (const r of routes) {
      const least = ROUTES[keyOf(r)];
      const rule = r.rule;
      const declared =
        rule.caller !== 'operator' ? rule.caller : rule.verb === null ? 'operator' : VERB_ROLE[rule.verb];
      expect({ route: keyOf(r), least: declared }).toEqual({ route: keyOf(r), least });
      const fleet = rule.caller === 'operator' && rule.verb !== null && rule.targets === 'fleet';
      expect({ route: keyOf(r), fleet }).toEqual({ route: keyOf(r), fleet: FLEET.has(keyOf(r)) });
    }
  });

  it("docs/api.md's route table shows each route's least role", () => {
    const doc = fs.readFileSync(new URL('../../docs/api.md', import.meta.url), 'utf8');
    const rows = doc.split('\n').filter((l) => l.startsWith('| `'));
    for (const [key, least] of Object.entries(ROUTES)) {
      const [method, path] = key.split(' ') as [string, string];
      const shown = `\`${method} ${path.replace(/:(\w+)/g, '{$1}')}`;
      const row = rows.find((l) => [...'`[?'].some((end) => l.split('|')[1]!.includes(`${shown}${end}`)));
      expect(row, `docs/api.md has no row for ${key}`).toBeDefined();
      const who = row!.split('|')[2]!.trim().split(/[ ,(]/)[0];
      expect({ key, who }).toEqual({ key, who: least === 'any' ? 'any' : least });
    }
  });
});

describe('every route against every role', () => {
  it.each(Object.entries(ROUTES))('%s (least: %s)', async (key, least) => {
    const [method, path] = key.split(' ') as [string, string];
    const seen: Record<string, string> = {};
    const want: Record<string, string> = {};
    for (const caller of CALLERS) {
      const r = await probe(creds[caller], method, concrete(path));
      const code = r.status === 403 && r.code !== undefined && POLICY_CODES.has(r.code) ? r.code : 'passed';
      seen[caller] = code;
      want[caller] = expected(least, caller) ?? 'passed';
    }
    expect(seen).toEqual(want);
  });
});
