/**
 * A controller and agents as separate `bin/herald` processes on 127.0.0.1, with a PKI made by
 * certs/, for the end-to-end suites: a testbed (cli/testbed/) whose processes `killAll()` stops.
 */
import fs from 'node:fs';
import path from 'node:path';
import { Testbed } from '../../cli/testbed/testbed.js';
import { api, freePort, REPO, stopProc, track, waitFor, type ApiResponse, type Cred, type Proc } from './procs.js';

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

/**
 * `controllerArgs`: more `herald controller` options (`--push-workers 0`, ...); `db`: a
 * `postgres://` URL (default SQLite in the bed); `controllerEnv`: more environment for the
 * controller (NODE_EXTRA_CA_CERTS, ...), or what makes it from the PKI's directory.
 */
export async function makeCluster(
  nodes: string[],
  o: {
    controllerArgs?: string[];
    db?: string;
    controllerEnv?: NodeJS.ProcessEnv | ((pki: string) => NodeJS.ProcessEnv);
  } = {},
): Promise<Cluster> {
  const bed = new Testbed({ prefix: 'herald-e2e-', cwd: REPO, keep: true, onSpawn: track });
  const work = bed.dir;
  const pki = await bed.makePki({ agents: nodes });
  const op = pki.operator();
  const db = o.db ?? path.join(work, 'herald.db');
  let port = 0;
  let n = 0;

  const startController = async (): Promise<ControllerProc> => {
    // a port of its own, kept across restarts (the agents know it)
    if (port === 0) port = await freePort();
    const c = await bed.startController({
      label: `controller-${n++}`,
      port,
      db,
      args: o.controllerArgs,
      ...(o.controllerEnv
        ? { env: typeof o.controllerEnv === 'function' ? o.controllerEnv(pki.dir) : o.controllerEnv }
        : {}),
    });
    const ctl = { port, proc: c.proc, db };
    cluster.ctl = ctl;
    return ctl;
  };

  const startAgent = async (
    node: string,
    extra: string[] = [],
    o: { stateDir?: string; port?: number; name?: string } = {},
  ): Promise<AgentProc> => {
    const aport = o.port ?? (await freePort());
    const a = bed.startAgent({
      node,
      label: o.name ?? `agent-${node}-${n++}`,
      controllers: [`https://127.0.0.1:${cluster.ctl.port}`],
      listen: `127.0.0.1:${aport}`,
      stateDir: o.stateDir ?? path.join(work, `state-${node}`),
      hooksDir: path.join(work, `hooks-${node}`),
      args: extra,
    });
    // the agent says its announcement is over: a retried announcement landing later would undo
    // an endpoint a test sets next
    await a.announced(20_000);
    return {
      node,
      port: aport,
      proc: a.proc,
      state: a.stateDir,
      hooks: a.hooksDir!,
      args: [...a.args],
      cred: pki.cred('agent', node),
    };
  };

  const cluster: Cluster = {
    work,
    pki: pki.dir,
    op,
    ctl: undefined as unknown as ControllerProc,
    startController,
    startAgent,
    cleanup: () => {
      // the processes are killAll()'s; a test keeps the directory with KEEP=1
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
