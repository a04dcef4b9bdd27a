/**
 * What the demo sets up before the restart it shows: the PKI, the controller, per node a volume,
 * an application container and an agent, then the two configs and the cluster. Each step waits
 * until it holds (through the supervisor), so the next one starts on solid ground.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { ClusterView, ConfigView, ListEnvelope, NodeView } from '../../protocol/rest.js';
import { clientFromOptions, type ApiClient } from '../operator/client.js';
import { makePki as makeTestbedPki } from '../testbed/pki.js';
import { HEALTH_SCRIPT, INSTALL_SCRIPT, UNINSTALL_SCRIPT } from './scripts.js';
import { DEMO_VIEWER } from './viewer.js';
import { DemoFailure, isAlive, type Child, type DemoSupervisor } from './supervisor.js';

/** One node of the demo: its directory, what the restart must leave alone, and its service. */
export interface DemoNode {
  id: string;
  dir: string;
  volume: string;
  containerPid: number;
  container: ChildProcess;
  containerExited: boolean;
  /** The volume's contents before the restart (`hashDir`). */
  volumeHash: string;
  /** The service the install script started, once it has. */
  servicePid: number | undefined;
}

/** A digest of a directory's names and contents, to tell whether anything in it changed. */
export function hashDir(dir: string): string {
  const h = crypto.createHash('sha256');
  const walk = (d: string): void => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      h.update(`${path.relative(dir, p)}\0`);
      if (e.isDirectory()) walk(p);
      else h.update(fs.readFileSync(p));
    }
  };
  walk(dir);
  return h.digest('hex');
}

/** The pid a script wrote to `file`, or undefined. */
export function readPid(file: string): number | undefined {
  try {
    const n = Number(fs.readFileSync(file, 'utf8').trim());
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** The CA, controller and operator `admin`, the viewer the demo shows (viewer.ts), and one agent certificate per node. */
export async function makePki(pkiDir: string, ids: string[]): Promise<void> {
  const pki = await makeTestbedPki(pkiDir, { agents: ids });
  await pki.issue('operator', DEMO_VIEWER);
}

export interface DemoController {
  url: string;
  proc: Child;
  api: ApiClient;
}

/** The controller on the embedded SQLite, once it listens (port 0: the kernel picks, the controller logs it). */
export async function startController(
  sup: DemoSupervisor,
  root: string,
  pkiDir: string,
  timeoutMs: number,
  /** Also take dialled-in connections on 127.0.0.1:<connectPort> (docs/dial-out.md). */
  connectPort?: number,
): Promise<DemoController> {
  const c = await sup.bed.startController({
    pki: pkiDir,
    db: path.join(root, 'controller.db'),
    timeoutMs,
    ...(connectPort !== undefined ? { args: ['--connect-listen', `127.0.0.1:${connectPort}`] } : {}),
  });
  return { url: c.url, proc: c.proc, api: clientFromOptions({ controller: c.url, pki: pkiDir }, sup.env) };
}

/** A node's volume (files the restart must not touch) and application container (a sleep). */
function makeNode(sup: DemoSupervisor, nodesDir: string, id: string): DemoNode {
  const dir = path.join(nodesDir, id);
  const volume = path.join(dir, 'volume');
  fs.mkdirSync(path.join(volume, 'db'), { recursive: true });
  fs.writeFileSync(path.join(volume, 'db', 'data.bin'), crypto.randomBytes(4096));
  fs.writeFileSync(path.join(volume, 'README'), `volume of ${id}: the restart must leave it as it is\n`);
  const container = spawn('sleep', ['86400'], { detached: true, stdio: 'ignore', env: sup.env });
  if (!container.pid) throw new DemoFailure(`could not start the application container of ${id}`);
  fs.writeFileSync(path.join(dir, 'container.pid'), `${container.pid}\n`);
  const node: DemoNode = {
    id,
    dir,
    volume,
    containerPid: container.pid,
    container,
    containerExited: false,
    volumeHash: hashDir(volume),
    servicePid: undefined,
  };
  container.on('exit', () => (node.containerExited = true));
  return node;
}

/**
 * Per id a node and its agent (fallback polling at 30 s, so only push can make the restart
 * quick), once every agent has announced its endpoint. Pushes each node to `nodes` as it is
 * made, so a failure half-way still stops what was started.
 */
export async function startNodes(
  sup: DemoSupervisor,
  ctl: DemoController,
  o: {
    pkiDir: string;
    nodesDir: string;
    ids: string[];
    timeoutMs: number;
    nodes: DemoNode[];
    /** Several controllers: every agent knows all of them (and accepts any, `--controller-id *`). */
    controllerUrls?: string[];
    /** The agents listen on nothing and dial out to this connect URL (docs/dial-out.md). */
    dialOut?: string;
  },
): Promise<Child[]> {
  fs.mkdirSync(o.nodesDir, { recursive: true });
  const agents: Child[] = [];
  for (const id of o.ids) {
    const node = makeNode(sup, o.nodesDir, id);
    o.nodes.push(node);
    const agent = sup.bed.startAgent({
      node: id,
      pki: o.pkiDir,
      // several controllers: every agent knows all of them (and accepts any)
      controllers: o.controllerUrls ?? [ctl.url],
      controllerId: o.controllerUrls ? '*' : undefined,
      // port 0 (the default): the agent announces the port it was given
      stateDir: path.join(node.dir, 'agent-state'),
      pollInterval: '30s',
      ...(o.dialOut ? { listen: null, args: ['--dial-out', o.dialOut] } : {}),
    });
    agents.push(agent.proc);
  }
  await sup.waitFor(
    o.dialOut ? 'every agent to dial in' : 'every agent to announce its endpoint',
    o.timeoutMs,
    async () => {
      const body = await ctl.api.get<ListEnvelope<NodeView>>('/v1/nodes');
      const ready = new Set(
        body.items.filter((n) => (o.dialOut ? n.push?.via === 'dialled-in' : n.endpoint)).map((n) => n.id),
      );
      return o.ids.every((id) => ready.has(id)) ? true : undefined;
    },
    [ctl.proc, ...agents],
  );
  return agents;
}

/**
 * The install and uninstall configs (cli/demo/scripts.ts) and a cluster of `nodes`, once it is
 * CREATE_COMPLETE and every node's service runs. Returns the cluster's id.
 * @throws DemoFailure on CREATE_FAILED (naming the failed nodes) or a service that is not running
 */
/** The demo's node groups: up to two masters (never more than half the nodes), the rest workers. */
export function demoGroups(ids: string[]): { masters: string[]; workers: string[] } {
  const m = Math.min(2, Math.floor(ids.length / 2));
  return { masters: ids.slice(0, m), workers: ids.slice(m) };
}

/** The health config each node's restart ends with (deploy_action CHECK). */
export async function createHealthConfig(api: ApiClient, nodesDir: string): Promise<string> {
  const cfg = await api.post<ConfigView>('/v1/configs', {
    name: 'demo-health',
    group: 'script',
    config: HEALTH_SCRIPT,
    inputs: [{ name: 'demo_root', type: 'String', default: nodesDir }],
  });
  return cfg.id;
}

export async function createCluster(
  sup: DemoSupervisor,
  api: ApiClient,
  o: { nodesDir: string; nodes: DemoNode[]; timeoutMs: number; watch: Child[] },
): Promise<string> {
  const input = [{ name: 'demo_root', type: 'String', default: o.nodesDir }];
  const install = await api.post<ConfigView>('/v1/configs', {
    name: 'demo-install',
    group: 'script',
    config: INSTALL_SCRIPT,
    inputs: [...input, { name: 'service_version', type: 'String', default: '1' }],
    outputs: [{ name: 'service_pid', type: 'String' }],
  });
  const uninstall = await api.post<ConfigView>('/v1/configs', {
    name: 'demo-uninstall',
    group: 'script',
    config: UNINSTALL_SCRIPT,
    inputs: input,
  });
  const { masters, workers } = demoGroups(o.nodes.map((n) => n.id));
  const created = await api.post<ClusterView>('/v1/clusters', {
    name: 'demo',
    nodegroups: [
      ...(masters.length > 0 ? [{ name: 'masters', role: 'master', nodes: masters }] : []),
      ...(workers.length > 0 ? [{ name: 'workers', role: 'worker', nodes: workers }] : []),
    ],
    install_config_id: install.id,
    uninstall_config_id: uninstall.id,
  });
  await sup.waitFor(
    'the cluster to be created',
    o.timeoutMs,
    async () => {
      const c = await api.get<ClusterView>(`/v1/clusters/${encodeURIComponent(created.id)}`);
      if (c.status === 'CREATE_FAILED') {
        const why = c.nodes
          .filter((n) => n.phase === 'failed')
          .map((n) => `${n.node}: ${n.reason ?? '?'}`)
          .join('; ');
        throw new DemoFailure(`the cluster's creation failed: ${why || c.status_reason || 'no reason'}`);
      }
      return c.status === 'CREATE_COMPLETE' ? true : undefined;
    },
    o.watch,
  );
  for (const n of o.nodes) {
    n.servicePid = readPid(path.join(n.dir, 'service.pid'));
    if (!isAlive(n.servicePid))
      throw new DemoFailure(`the install script ran on ${n.id} but its service is not running`);
  }
  return created.id;
}
