/**
 * A controller and agents as separate `bin/herald` processes on 127.0.0.1, with a PKI made by
 * `bin/herald certs`, for the end-to-end suites.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  api,
  credOf,
  freePort,
  hasExited,
  heraldSync,
  startHerald,
  stopProc,
  waitFor,
  type ApiResponse,
  type Cred,
  type Proc,
} from './procs.js';

export interface Cluster {
  work: string;
  pki: string;
  op: Cred;
  ctl: ControllerProc;
  startController(): Promise<ControllerProc>;
  startAgent(
    node: string,
    extra?: string[],
    opts?: { stateDir?: string; port?: number; name?: string },
  ): Promise<AgentProc>;
  cleanup(): void;
}

export interface ControllerProc {
  port: number;
  proc: Proc;
  db: string;
}

export interface AgentProc {
  node: string;
  port: number;
  proc: Proc;
  state: string;
  hooks: string;
  args: string[];
  cred: Cred;
}

function assertAlive(p: Proc): true {
  if (hasExited(p))
    throw new Error(
      `${p.name} exited early (${p.child.exitCode ?? p.child.signalCode}):\n${p.log().split('\n').slice(-20).join('\n')}`,
    );
  return true;
}

/** `controllerArgs`: more `herald controller` options (`--push-workers 0`, ...). */
export async function makeCluster(nodes: string[], o: { controllerArgs?: string[] } = {}): Promise<Cluster> {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-e2e-'));
  const pki = path.join(work, 'pki');
  const init = heraldSync(['certs', 'init', '--dir', pki]);
  if (init.code !== 0) throw new Error(`certs init: ${init.err}`);
  for (const n of nodes) {
    const r = heraldSync(['certs', 'issue', 'agent', n, '--dir', pki, '--ip', '127.0.0.1', '--dns', 'localhost']);
    if (r.code !== 0) throw new Error(`certs issue ${n}: ${r.err}`);
  }
  const op = credOf(pki, 'operator', 'admin');
  const db = path.join(work, 'herald.db');
  let port = 0;
  let n = 0;

  const startController = async (): Promise<ControllerProc> => {
    if (port === 0) port = await freePort();
    const proc = startHerald(
      `controller-${n++}`,
      ['controller', '--listen', `127.0.0.1:${port}`, '--pki', pki, '--db', db, ...(o.controllerArgs ?? [])],
      work,
    );
    await waitFor(
      'controller /healthz',
      async () => assertAlive(proc) && (await api(port, op, 'GET', '/healthz')).status === 200,
      20_000,
      50,
    );
    const c = { port, proc, db };
    cluster.ctl = c;
    return c;
  };

  const startAgent = async (
    node: string,
    extra: string[] = [],
    o: { stateDir?: string; port?: number; name?: string } = {},
  ): Promise<AgentProc> => {
    const aport = o.port ?? (await freePort());
    const state = o.stateDir ?? path.join(work, `state-${node}`);
    const hooks = path.join(work, `hooks-${node}`);
    fs.mkdirSync(hooks, { recursive: true, mode: 0o755 });
    const args = [
      'agent',
      '--node',
      node,
      '--controller',
      `https://127.0.0.1:${cluster.ctl.port}`,
      '--listen',
      `127.0.0.1:${aport}`,
      '--pki',
      pki,
      '--state-dir',
      state,
      '--hooks-dir',
      hooks,
      ...extra,
    ];
    const proc = startHerald(o.name ?? `agent-${node}-${n++}`, args, work);
    await waitFor(
      `agent ${node} to announce its endpoint`,
      async () => {
        assertAlive(proc);
        const r = await api(cluster.ctl.port, op, 'GET', `/v1/nodes/${node}`);
        // and the agent says its announcement is over: a retried announcement landing later
        // would undo an endpoint a test sets next
        return (
          r.status === 200 &&
          JSON.stringify(r.json ?? {}).includes(`:${aport}/`) &&
          proc.log().includes('"endpoint announced"')
        );
      },
      20_000,
      50,
    );
    return { node, port: aport, proc, state, hooks, args, cred: credOf(pki, 'agent', node) };
  };

  const cluster: Cluster = {
    work,
    pki,
    op,
    ctl: undefined as unknown as ControllerProc,
    startController,
    startAgent,
    cleanup: () => {
      if (!process.env.KEEP) fs.rmSync(work, { recursive: true, force: true });
    },
  };
  await startController();
  return cluster;
}

export async function mkConfig(c: Cluster, body: Record<string, unknown>): Promise<string> {
  const r = await api(c.ctl.port, c.op, 'POST', '/v1/configs', body);
  if (r.status !== 201) throw new Error(`POST /v1/configs → ${r.status} ${r.raw.slice(0, 300)}`);
  return (r.json.id ?? r.json.config?.id) as string;
}

export async function mkDeployment(c: Cluster, body: Record<string, unknown>): Promise<string> {
  const r = await api(c.ctl.port, c.op, 'POST', '/v1/deployments', body);
  if (r.status !== 201) throw new Error(`POST /v1/deployments → ${r.status} ${r.raw.slice(0, 300)}`);
  return (r.json.deployment_id ?? r.json.id ?? r.json.deployment?.id) as string;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Deployment = any;

export async function getDeployment(c: Cluster, id: string): Promise<ApiResponse> {
  return api(c.ctl.port, c.op, 'GET', `/v1/deployments/${id}`);
}

/** Waits until the deployment's status is one of `want` (its current revision's). */
export async function waitDeployment(
  c: Cluster,
  id: string,
  want = ['COMPLETE', 'FAILED'],
  ms = 15_000,
  revision?: number,
): Promise<Deployment> {
  return waitFor(
    `deployment ${id} to reach ${want.join('|')}${revision ? ` at revision ${revision}` : ''}`,
    async () => {
      const r = await getDeployment(c, id);
      const d = r.json?.deployment ?? r.json;
      if (revision !== undefined && d?.revision !== revision) return null;
      return d && want.includes(d.status) ? d : null;
    },
    ms,
    10,
  );
}

export async function getNode(c: Cluster, node: string): Promise<Deployment> {
  return (await api(c.ctl.port, c.op, 'GET', `/v1/nodes/${node}`)).json;
}

export { stopProc };
