/**
 * `herald demo`: a whole Herald installation on 127.0.0.1 in a temporary directory, one cluster
 * restart through it, and the checks that show what a restart promises: every node's service
 * was re-provisioned (new pid) while its volume and application container were left alone.
 *
 * Every process the demo starts is a child in its own process group, logging to a file in the
 * directory; the demo stops them all (and the services the scripts started) on exit, on failure
 * and on Ctrl-C, unless `--keep`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { HeraldError } from '../protocol/errors.js';
import { initPki, issueCert } from '../certs/pki.js';
import { clientFromOptions, type ApiClient } from './operator-client.js';
import { formatMs, parseDuration, parsePositiveInt, table } from './operator-format.js';
import { watchRestart, normalizeCluster, type WatchEvent } from './operator-watch.js';
import { INSTALL_SCRIPT, UNINSTALL_SCRIPT } from './demo-scripts.js';

/** Most nodes the demo starts (each is a Node.js process). */
export const MAX_DEMO_NODES = 50;
/** How long a stopped child may take before it is killed. */
const STOP_GRACE_MS = 3_000;
const POLL_MS = 100;

export interface DemoOptions {
  nodes: string;
  keep: boolean;
  dir?: string | undefined;
  timeout: string;
  /** Where the demo talks (default stdout). */
  out?: NodeJS.WritableStream;
}

interface Child {
  name: string;
  proc: ChildProcess;
  log: string;
  exited: boolean;
}

interface NodeInfo {
  id: string;
  dir: string;
  volume: string;
  containerPid: number;
  container: ChildProcess;
  containerExited: boolean;
  volumeHash: string;
  servicePid: number | undefined;
}

/** The project's `bin/herald`, from this compiled file (dist/cli/demo-run.js). */
function heraldBin(): string {
  return fileURLToPath(new URL('../../bin/herald', import.meta.url));
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => (a && typeof a === 'object' ? resolve(a.port) : reject(new Error('no port'))));
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Set in the environment of every process the demo starts, so cleanup can find them all. */
const DEMO_ENV_MARKER = 'HERALD_DEMO_ROOT';

/**
 * SIGKILLs every process of ours whose environment holds one of `markers` (`NAME=value`);
 * Linux only (reads /proc), elsewhere a no-op. Returns how many it signalled.
 */
function killMarked(markers: string[]): number {
  let n = 0;
  let pids: string[];
  try {
    pids = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid);
  } catch {
    return 0;
  }
  for (const p of pids) {
    let environ: string[];
    try {
      environ = fs.readFileSync(`/proc/${p}/environ`, 'utf8').split('\0');
    } catch {
      continue; // gone, or not ours
    }
    if (!markers.some((m) => environ.includes(m)) || !isAlive(Number(p))) continue;
    try {
      process.kill(Number(p), 'SIGKILL');
      n++;
    } catch {
      // gone already
    }
  }
  return n;
}

/** True when `pid` runs and is not a zombie. */
export function isAlive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
}

function hashDir(dir: string): string {
  const h = crypto.createHash('sha256');
  const walk = (d: string): void => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = path.join(d, e.name);
      h.update(path.relative(dir, p) + '\0');
      if (e.isDirectory()) walk(p);
      else h.update(fs.readFileSync(p));
    }
  };
  walk(dir);
  return h.digest('hex');
}

function readPid(file: string): number | undefined {
  try {
    const n = Number(fs.readFileSync(file, 'utf8').trim());
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

function tail(file: string, lines = 15): string {
  try {
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).map((l) => `    ${l}`).join('\n');
  } catch {
    return '    (no log)';
  }
}

/** Runs the demo; resolves with the exit status. */
export async function runDemo(o: DemoOptions): Promise<number> {
  const out = o.out ?? process.stdout;
  const say = (s: string): void => void out.write(s + '\n');
  const nodeCount = parsePositiveInt(o.nodes, '--nodes');
  if (nodeCount > MAX_DEMO_NODES) throw new HeraldError('bad_option', `--nodes must be at most ${MAX_DEMO_NODES}`);
  const stepTimeoutMs = parseDuration(o.timeout, '--timeout');
  const t0 = Date.now();
  const stamp = (): string => `[${((Date.now() - t0) / 1000).toFixed(1).padStart(5)} s]`;
  const step = (s: string): void => say(`${stamp()} ${s}`);

  const ownDir = o.dir === undefined;
  const root = path.resolve(o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-')));
  fs.mkdirSync(root, { recursive: true, mode: 0o700 });
  const pkiDir = path.join(root, 'pki');
  const nodesDir = path.join(root, 'nodes');
  const children: Child[] = [];
  const nodes: NodeInfo[] = [];
  let client: ApiClient | undefined;
  let cleaned = false;
  const env = { ...process.env, HERALD_NO_CA_WARNING: '1', [DEMO_ENV_MARKER]: root };

  const startChild = (name: string, args: string[]): Child => {
    const log = path.join(root, 'logs', `${name}.log`);
    fs.mkdirSync(path.dirname(log), { recursive: true });
    const fd = fs.openSync(log, 'a');
    // its own process group: Ctrl-C reaches the demo only, and the demo stops the whole group
    const proc = spawn(process.execPath, [heraldBin(), ...args], { detached: true, stdio: ['ignore', fd, fd], env, cwd: root });
    fs.closeSync(fd);
    const c: Child = { name, proc, log, exited: false };
    proc.on('exit', () => (c.exited = true));
    proc.on('error', () => (c.exited = true));
    children.push(c);
    return c;
  };

  const cleanup = async (): Promise<void> => {
    if (cleaned) return;
    cleaned = true;
    client?.close();
    // agents first (they run the hooks), then the controller
    const order = [...children.filter((c) => c.name !== 'controller'), ...children.filter((c) => c.name === 'controller')];
    const signalGroup = (c: Child, sig: NodeJS.Signals): void => {
      if (c.proc.pid === undefined) return;
      try {
        process.kill(-c.proc.pid, sig);
      } catch {
        // gone already
      }
    };
    for (const c of order) signalGroup(c, 'SIGTERM');
    const deadline = Date.now() + STOP_GRACE_MS;
    while (order.some((c) => !c.exited) && Date.now() < deadline) await sleep(50);
    for (const c of order) if (!c.exited) signalGroup(c, 'SIGKILL');
    for (const n of nodes) {
      for (const pid of [readPid(path.join(n.dir, 'service.pid')), n.servicePid, n.containerPid]) {
        if (pid && isAlive(pid)) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            // gone already
          }
        }
      }
    }
    // hooks still running when their agent stopped may start a service after the pid files were
    // read: anything carrying the demo's marker in its environment goes too
    for (let i = 0; i < 3; i++) {
      if (killMarked([`${DEMO_ENV_MARKER}=${root}`, `demo_root=${nodesDir}`]) === 0 && i > 0) break;
      await sleep(200);
    }
    if (ownDir) fs.rmSync(root, { recursive: true, force: true });
  };

  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals): void => {
    interrupted = true;
    process.stderr.write(`\nherald demo: ${sig}: stopping everything\n`);
    void cleanup().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  const waitFor = async <T>(what: string, fn: () => Promise<T | undefined>, watch: Child[] = []): Promise<T> => {
    const deadline = Date.now() + stepTimeoutMs;
    let lastErr: unknown;
    for (;;) {
      const dead = watch.find((c) => c.exited);
      if (dead) throw new DemoFailure(`${dead.name} exited while waiting for ${what}; its log (${dead.log}):\n${tail(dead.log)}`);
      try {
        const v = await fn();
        if (v !== undefined) return v;
      } catch (err) {
        lastErr = err;
      }
      if (Date.now() > deadline) {
        throw new DemoFailure(`timed out after ${formatMs(stepTimeoutMs)} waiting for ${what}${lastErr ? ` (last error: ${(lastErr as Error).message})` : ''}`);
      }
      await sleep(POLL_MS);
    }
  };

  try {
    say(`Herald demo: a ${nodeCount}-node cluster restart on 127.0.0.1, in ${root}`);

    // 1. PKI: the CA, controller and operator (init), one agent certificate per node
    const ids = Array.from({ length: nodeCount }, (_, i) => `n${i + 1}`);
    await initPki({ dir: pkiDir });
    await Promise.all(ids.map((id) => issueCert({ dir: pkiDir, role: 'agent', name: id, dns: ['localhost'], ip: ['127.0.0.1'] })));
    step(`PKI made: CA, controller, operator admin, ${nodeCount} agents`);

    // 2. the controller, on the embedded SQLite
    const port = await freePort();
    const controllerUrl = `https://127.0.0.1:${port}`;
    const controller = startChild('controller', ['controller', '--listen', `127.0.0.1:${port}`, '--pki', pkiDir, '--db', path.join(root, 'controller.db')]);
    client = clientFromOptions({ controller: controllerUrl, pki: pkiDir }, env);
    const api = client;
    await waitFor('the controller to answer', async () => (await api.get('/v1/nodes'), true), [controller]);
    step(`controller listening on ${controllerUrl} (log: logs/controller.log)`);

    // 3. per node: a volume, an application container, an agent
    fs.mkdirSync(nodesDir, { recursive: true });
    const agents: Child[] = [];
    for (const id of ids) {
      const dir = path.join(nodesDir, id);
      const volume = path.join(dir, 'volume');
      fs.mkdirSync(path.join(volume, 'db'), { recursive: true });
      fs.writeFileSync(path.join(volume, 'db', 'data.bin'), crypto.randomBytes(4096));
      fs.writeFileSync(path.join(volume, 'README'), `volume of ${id}: the restart must leave it as it is\n`);
      const container = spawn('sleep', ['86400'], { detached: true, stdio: 'ignore', env });
      if (!container.pid) throw new DemoFailure(`could not start the application container of ${id}`);
      fs.writeFileSync(path.join(dir, 'container.pid'), `${container.pid}\n`);
      const info: NodeInfo = { id, dir, volume, containerPid: container.pid, container, containerExited: false, volumeHash: hashDir(volume), servicePid: undefined };
      container.on('exit', () => (info.containerExited = true));
      nodes.push(info);
      const agentPort = await freePort();
      agents.push(startChild(`agent-${id}`, [
        'agent', '--node', id, '--controller', controllerUrl, '--listen', `127.0.0.1:${agentPort}`, '--pki', pkiDir,
        '--state-dir', path.join(dir, 'agent-state'), '--poll-interval', '30s',
      ]));
    }
    await waitFor('every agent to announce its endpoint', async () => {
      const body = await api.get<{ items?: { id?: string; endpoint?: unknown }[] }>('/v1/nodes');
      const ready = new Set((body.items ?? []).filter((n) => n.endpoint).map((n) => n.id));
      return ids.every((id) => ready.has(id)) ? true : undefined;
    }, [controller, ...agents]);
    step(`${nodeCount} agents registered; each node has a volume and an application container (a sleep process)`);

    // 4. the configs and the cluster
    const input = [{ name: 'demo_root', type: 'String', default: nodesDir }];
    const install = await api.post<Record<string, unknown>>('/v1/configs', { name: 'demo-install', group: 'script', config: INSTALL_SCRIPT, inputs: input, outputs: [{ name: 'service_pid', type: 'String' }] });
    const uninstall = await api.post<Record<string, unknown>>('/v1/configs', { name: 'demo-uninstall', group: 'script', config: UNINSTALL_SCRIPT, inputs: input });
    const created = await api.post<Record<string, unknown>>('/v1/clusters', {
      name: 'demo', nodes: ids, install_config_id: String(install.id), uninstall_config_id: String(uninstall.id),
    });
    const clusterId = String(created.id ?? created.cluster_id);
    const createStart = Date.now();
    const afterCreate = await waitFor('the cluster to be created', async () => {
      const c = normalizeCluster(await api.get(`/v1/clusters/${encodeURIComponent(clusterId)}`));
      if (c.status === 'CREATE_FAILED') throw new DemoFailure(`the cluster's creation failed: ${c.nodes.filter((n) => n.phase === 'failed').map((n) => `${n.node}: ${n.reason ?? '?'}`).join('; ') || c.statusReason || 'no reason'}`);
      return c.status === 'CREATE_COMPLETE' ? c : undefined;
    }, [controller, ...agents]);
    void afterCreate;
    for (const n of nodes) {
      n.servicePid = readPid(path.join(n.dir, 'service.pid'));
      if (!isAlive(n.servicePid)) throw new DemoFailure(`the install script ran on ${n.id} but its service is not running`);
    }
    step(`cluster ${clusterId} CREATE_COMPLETE in ${formatMs(Date.now() - createStart)}: the service runs on every node`);

    // 5. the restart
    say('');
    const startedAt = new Date();
    await api.patch(`/v1/clusters/${encodeURIComponent(clusterId)}/actions/restart`);
    const acceptedMs = Date.now() - startedAt.getTime();
    step(`restart: PATCH /v1/clusters/${clusterId}/actions/restart → 204 in ${formatMs(acceptedMs)}`);
    const events: WatchEvent[] = [];
    const result = await watchRestart(api, { clusterId, startedAt, timeoutMs: stepTimeoutMs, pollIntervalMs: 250, onEvent: (e) => void events.push(e) });
    if (result.timedOut) throw new DemoFailure(`the restart did not finish within ${formatMs(stepTimeoutMs)}`);
    if (!result.ok) throw new DemoFailure(`the restart ended ${result.cluster?.status ?? '?'}: ${result.failed.map((f) => `${f.node}: ${f.reason}`).join('; ')}`);
    const totalMs = Date.now() - startedAt.getTime();

    // 6. the timeline, in order; then the checks
    const rel = (d: Date): string => `+${formatMs(d.getTime() - startedAt.getTime())}`;
    for (const line of timelineLines(events, startedAt)) say(line);
    say('');
    const nth = (node: string, pred: (e: WatchEvent) => boolean, n = 0): string => {
      const e = events.filter((x) => x.kind !== 'status' && x.node === node && pred(x)).sort((a, b) => a.at.getTime() - b.at.getTime())[n];
      return e ? rel(e.at) : '-';
    };
    say('Per node, after the PATCH (woken = the agent acknowledged a signed wake-up):');
    say(table(['NODE', 'WOKEN', 'UNINSTALL DONE', 'WOKEN AGAIN', 'INSTALL DONE'], ids.map((id) => [
      id,
      nth(id, (e) => e.kind === 'woken'),
      nth(id, (e) => e.kind === 'phase' && e.phase === 'installing'),
      nth(id, (e) => e.kind === 'woken', 1),
      nth(id, (e) => e.kind === 'phase' && e.phase === 'complete'),
    ])).trimEnd());
    say(`RESTART_COMPLETE ${formatMs(totalMs)} after the PATCH, with the agents' fallback polling set to 30 s: push did it.`);

    const failures: string[] = [];
    const rows = nodes.map((n) => {
      const containerOk = !n.containerExited && isAlive(n.containerPid);
      const volumeOk = hashDir(n.volume) === n.volumeHash;
      const newPid = readPid(path.join(n.dir, 'service.pid'));
      const serviceOk = newPid !== undefined && newPid !== n.servicePid && isAlive(newPid) && !isAlive(n.servicePid);
      const runs = fs.readFileSync(path.join(n.dir, 'runs.log'), 'utf8').trim().split('\n');
      const orderOk = runs.slice(-2).join(',') === 'uninstall RESTART,install RESTART';
      if (!containerOk) failures.push(`${n.id}: the application container (pid ${n.containerPid}) is gone`);
      if (!volumeOk) failures.push(`${n.id}: the volume's files changed`);
      if (!serviceOk) failures.push(`${n.id}: the service pid did not change to a new running process (${n.servicePid ?? '-'} → ${newPid ?? '-'})`);
      if (!orderOk) failures.push(`${n.id}: the scripts did not run uninstall then install (${runs.join(', ')})`);
      const mark = (ok: boolean): string => (ok ? '✓' : '✗');
      const oldPid = n.servicePid;
      n.servicePid = newPid;
      return [n.id, `${n.containerPid} same ${mark(containerOk)}`, `same ${mark(volumeOk)}`,
        `${oldPid ?? '-'} → ${newPid ?? '-'} changed ${mark(serviceOk)}`, `${runs.slice(-2).map((r) => r.split(' ')[0]).join(' → ')} ${mark(orderOk)}`];
    });
    say('');
    say(table(['NODE', 'CONTAINER PID', 'VOLUME FILES', 'SERVICE PID', 'SCRIPTS'], rows).trimEnd());
    say('');
    if (failures.length) {
      for (const f of failures) say(`✗ ${f}`);
      throw new DemoFailure(`${failures.length} check(s) failed`);
    }
    say(`✓ all ${nodeCount} nodes re-provisioned: new service pids, same containers, same volumes (${((Date.now() - t0) / 1000).toFixed(1)} s in all)`);

    if (o.keep) {
      keepRunning(say, { root, pkiDir, controllerUrl, clusterId, children, nodes, ownDir });
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      client.close();
      for (const c of children) c.proc.unref();
      for (const n of nodes) n.container.unref();
      return 0;
    }
    await cleanup();
    say(ownDir ? 'Stopped everything and removed the directory.' : `Stopped everything; ${root} is kept.`);
    return 0;
  } catch (err) {
    // after Ctrl-C the steps in flight fail as their processes go: that is not news
    if (interrupted) return new Promise<number>(() => undefined);
    const msg = err instanceof DemoFailure || err instanceof HeraldError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
    process.stderr.write(`herald demo: failed: ${msg}\n`);
    if (o.keep) {
      process.stderr.write(`herald demo: --keep: left everything in ${root} (logs in ${path.join(root, 'logs')}; stop with: sh ${path.join(root, 'stop.sh')})\n`);
      writeStopScript(root, children, nodes, ownDir);
      client?.close();
      for (const c of children) c.proc.unref();
      for (const n of nodes) n.container.unref();
    } else {
      for (const c of children.filter((c) => c.exited)) process.stderr.write(`  ${c.name} exited; its log:\n${tail(c.log)}\n`);
      await cleanup();
    }
    return 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

class DemoFailure extends Error {}

/** What a timeline line says of an event. */
function labelOf(e: WatchEvent): string {
  if (e.kind === 'woken') return 'woken';
  if (e.kind === 'status') return `cluster ${e.status}`;
  if (e.phase === 'installing') return 'uninstall done, installing';
  if (e.phase === 'complete') return 'install done';
  if (e.phase === 'failed') return `FAILED: ${e.reason ?? '?'}`;
  return e.phase;
}

/**
 * The restart's events in time order, one line per step, nodes that did the same thing within
 * a few milliseconds on one line: `+2 ms  n1, n2, n3 uninstalling`.
 */
export function timelineLines(events: WatchEvent[], startedAt: Date, mergeWithinMs = 5): string[] {
  const sorted = events.filter((e) => e.kind !== 'status' || !e.status.endsWith('_IN_PROGRESS')).sort((a, b) => a.at.getTime() - b.at.getTime());
  const lines: string[] = [`${'+0 ms'.padStart(19)}  restart accepted`];
  for (let i = 0; i < sorted.length;) {
    const first = sorted[i]!;
    const label = labelOf(first);
    const nodes: string[] = [];
    let j = i;
    while (j < sorted.length && labelOf(sorted[j]!) === label && sorted[j]!.at.getTime() - first.at.getTime() <= mergeWithinMs) {
      const e = sorted[j]!;
      if (e.kind !== 'status') nodes.push(e.node);
      j++;
    }
    const t = `+${formatMs(first.at.getTime() - startedAt.getTime())}`;
    lines.push(`${t.padStart(19)}  ${nodes.length ? `${nodes.join(', ')} ` : ''}${label}`);
    i = j;
  }
  return lines;
}

function writeStopScript(root: string, children: Child[], nodes: NodeInfo[], removeDir: boolean): string {
  const file = path.join(root, 'stop.sh');
  const groups = children.map((c) => c.proc.pid).filter((p): p is number => !!p);
  const lines = [
    '#!/bin/sh',
    '# stops what `herald demo --keep` left running',
    ...groups.map((pid) => `kill -TERM -${pid} 2>/dev/null`),
    'sleep 1',
    ...groups.map((pid) => `kill -KILL -${pid} 2>/dev/null`),
    ...nodes.map((n) => `[ -s '${n.dir}/service.pid' ] && kill "$(cat '${n.dir}/service.pid')" 2>/dev/null`),
    ...nodes.map((n) => `kill ${n.containerPid} 2>/dev/null`),
    removeDir ? `rm -rf '${root}'` : `echo 'kept ${root}'`,
    'true',
  ];
  fs.writeFileSync(file, lines.join('\n') + '\n', { mode: 0o700 });
  return file;
}

function keepRunning(say: (s: string) => void, k: { root: string; pkiDir: string; controllerUrl: string; clusterId: string; children: Child[]; nodes: NodeInfo[]; ownDir: boolean }): void {
  const stop = writeStopScript(k.root, k.children, k.nodes, k.ownDir);
  const bin = path.relative(process.cwd(), heraldBin());
  const herald = bin.startsWith('..') ? heraldBin() : bin;
  const conn = `--controller ${k.controllerUrl} --pki ${k.pkiDir}`;
  const p = (f: string): string => path.join(k.pkiDir, f);
  say('');
  say(`Left running (--keep): the controller, ${k.nodes.length} agents, their containers and services. Logs: ${path.join(k.root, 'logs')}`);
  say('');
  say('With the CLI:');
  say(`  ${herald} cluster show ${k.clusterId} ${conn}`);
  say(`  ${herald} cluster restart ${k.clusterId} --wait ${conn}`);
  say(`  ${herald} node ls ${conn}`);
  say(`  or: export HERALD_CONTROLLER=${k.controllerUrl} HERALD_PKI=${k.pkiDir}; ${herald} cluster ls`);
  say('  (this PKI directory also holds the CA key, so the CLI warns about it; HERALD_NO_CA_WARNING=1 silences that)');
  say('');
  say('With curl:');
  say(`  curl --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/clusters`);
  say(`  curl -X PATCH --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/clusters/${k.clusterId}/actions/restart`);
  say(`  curl -N --cacert ${p('ca.crt')} --cert ${p('operator/admin.crt')} --key ${p('operator/admin.key')} ${k.controllerUrl}/v1/events`);
  say('');
  say(`Stop everything${k.ownDir ? ' and remove the directory' : ''}: sh ${stop}`);
}
