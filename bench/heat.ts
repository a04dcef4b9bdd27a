/**
 * `npm run bench -- --heat`: unmodified OpenStack Heat (cli/testbed/heat.ts) driving Herald, in one
 * run on this machine. Its section of BENCHMARKS.md is replaced by each run (a kept section, like
 * the soak's); docs/heat.md says how Heat reaches Herald.
 *
 * - Stack update → hook started: a stack of one DeployedServer on a Herald agent's node and one on
 *   a stock os-collect-config node (cli/testbed/occ-node.ts, unmodified, its default 30 s
 *   interval), one install SoftwareDeployment each, updated UPDATES times by
 *   `openstack stack update --existing --parameter restart_trigger=<k>`, each after a random wait
 *   of up to one polling interval (so the stock node's poll falls at a random phase). Times on one
 *   clock: the command's start, Heat's API receiving the PATCH (Heat's log, UTC), the metadata PUT
 *   arriving (the controller's `heat.metadata` event for the Herald node; the object's
 *   X-Timestamp for the stock node's, which Herald stores as it is), the hook's start (its first
 *   line appends the time), Heat's UPDATE_COMPLETE (its log). Without heat-agents' files
 *   (test/fixtures/heat-agents/, README.md there) the stock node is left out and the run says so.
 * - Heat's signal polls: Heat HEADs (and GETs) the signal object of each deployment in progress
 *   about once a second. With the Herald agent stopped, stacks of deployments on its node stay in
 *   progress, HEAD_STEP more at a time up to HEAD_DEPLOYMENTS; over a window at each step (and one
 *   before the first, nothing in progress) the controller's object store requests are counted
 *   (`herald_object_store_requests_total`), the controller's and heat-all's CPU read from /proc
 *   (schedstat), the TCP connections accepted counted (/proc/net/snmp, exact in the run's own
 *   network namespace), the object store's open connections sampled every second
 *   (/proc/net/tcp) and its `too_many_connections` refusals read from the controller's log.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { heatMetadataPuts } from '../cli/demo/heat-report.js';
import { heatAvailable, HEAT_PACKAGES, startHeat, type Heat } from '../cli/testbed/heat.js';
import { requestReceivedAt, stackEndedAt } from '../cli/testbed/heat-log.js';
import {
  heatAgentsProblems,
  OCC_POLLING_INTERVAL_DEFAULT_S,
  startOccNode,
  type OccNode,
} from '../cli/testbed/occ-node.js';
import { Testbed } from '../cli/testbed/testbed.js';
import { OperatorClient, parseProm } from './api-client.js';
import { dist, nowMs, procSample, round, roundDist, say, sleep, waitFor, type Dist } from './util.js';

/** Stack updates measured (the stock node's at a random phase of its interval each). */
export const HEAT_UPDATES = 6;
/** Deployments kept in progress while Heat's signal polls are counted: HEAD_STEP more at each window. */
export const HEAD_DEPLOYMENTS = 20;
export const HEAD_STEP = 10;
/** Each counting window, the idle one before them included. */
export const HEAD_WINDOW_MS = 30_000;
/** After the last deployment is in progress, before the window: Heat's polls of it under way. */
const HEAD_SETTLE_MS = 5_000;
/** Heat's steps on a loaded 2-core machine. */
const STEP_TIMEOUT_MS = 240_000;
const PROJECT = 'admin';
/** Polls after os-collect-config's start before it sleeps its whole interval (1, 2, 4, 8, 16 s, then 30). */
const OCC_BACKOFF_POLLS = 6;
const HERALD_NODE = 'hb1';
const STOCK_NODE = 'occb';

/** One update: times in ms from Heat's API receiving the PATCH (NaN where not seen). */
export interface HeatUpdateSample {
  /** The `openstack` command started → Heat's API received the PATCH. */
  cliMs: number;
  /** Heat's API received the PATCH → the stack's UPDATE_COMPLETE. */
  completeMs: number;
  /** Per node kind: PATCH → the metadata PUT arrived, PATCH → the hook started. */
  herald: { putMs: number; hookMs: number };
  stock?: { putMs: number; hookMs: number; waitedMs: number };
}

export interface HeatBenchResult {
  date: string;
  machine: string;
  versions: Record<string, string>;
  updates: HeatUpdateSample[];
  /** Why the stock node was left out, when it was. */
  stockSkipped?: string;
  stockIntervalS: number;
  /** The idle window (0 deployments), then one per step. */
  heads: HeadsWindow[];
  problems: string[];
}

/** One window of Heat's signal polls. */
export interface HeadsWindow {
  /** Deployments in progress (0: the idle window). */
  deployments: number;
  windowMs: number;
  /** Object store requests in the window, by `method code`. */
  requests: Record<string, number>;
  controllerCpuMs: number;
  heatCpuMs: number;
  /** TCP connections accepted (/proc/net/snmp): all the object store's with a network namespace of the run's own; else null. */
  connections: number | null;
  /** The most connections to the object store open at once, sampled every second (/proc/net/tcp). */
  maxOpen: number;
  /** Connections the object store refused (`too_many_connections`), as its log summarised them in the window. */
  refused: number;
}

/** Heat's template: one DeployedServer per node given, with `deployments` install SoftwareDeployments each. */
export function benchTemplate(servers: ReadonlyArray<{ node: string; deployments: number }>): string {
  const L: string[] = [
    'heat_template_version: 2018-08-31',
    'parameters:',
    '  marks: {type: string}',
    "  restart_trigger: {type: string, default: '0'}",
    'resources:',
    '  config:',
    '    type: OS::Heat::SoftwareConfig',
    '    properties:',
    '      group: script',
    '      inputs: [{name: node}, {name: marks}, {name: restart_trigger}, {name: index}]',
    '      config: |',
    '        #!/bin/sh',
    '        date +%s%N >> "$marks/$node.$index"',
  ];
  for (const [s, srv] of servers.entries()) {
    L.push(
      `  server_${s}:`,
      '    type: OS::Heat::DeployedServer',
      '    properties:',
      `      name: ${srv.node}`,
      '      software_config_transport: POLL_TEMP_URL',
      '      deployment_swift_data:',
      `        container: ${srv.node}`,
      "        object: {list_join: ['', [{get_param: 'OS::stack_id'}, '.json']]}",
    );
    for (let i = 0; i < srv.deployments; i++)
      L.push(
        `  deploy_${s}_${i}:`,
        '    type: OS::Heat::SoftwareDeployment',
        '    properties:',
        '      config: {get_resource: config}',
        `      server: {get_resource: server_${s}}`,
        '      signal_transport: TEMP_URL_SIGNAL',
        '      actions: [CREATE, UPDATE]',
        '      input_values:',
        `        node: ${srv.node}`,
        '        marks: {get_param: marks}',
        '        restart_trigger: {get_param: restart_trigger}',
        `        index: '${i}'`,
      );
  }
  return `${L.join('\n')}\n`;
}

/** Reads a growing log from where it left off: Heat's debug log is read many times a second. */
class LogFollower {
  #at = 0;
  #kept = '';
  constructor(
    readonly file: string,
    readonly keep: (line: string) => boolean,
  ) {}

  /** The kept lines so far. */
  text(): string {
    let fd: number;
    try {
      fd = fs.openSync(this.file, 'r');
    } catch {
      return this.#kept;
    }
    try {
      const size = fs.fstatSync(fd).size;
      if (size > this.#at) {
        const buf = Buffer.alloc(size - this.#at);
        fs.readSync(fd, buf, 0, buf.length, this.#at);
        const text = buf.toString('utf8');
        const end = text.lastIndexOf('\n') + 1;
        this.#at += Buffer.byteLength(text.slice(0, end));
        this.#kept += text
          .slice(0, end)
          .split('\n')
          .filter((l) => l !== '' && this.keep(l))
          .map((l) => `${l}\n`)
          .join('');
      }
    } finally {
      fs.closeSync(fd);
    }
    return this.#kept;
  }
}

/** One request to the object store with the token; its status and headers. */
function objectStore(
  port: number,
  ca: Buffer,
  token: string,
  method: string,
  p: string,
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: `/v1/AUTH_${PROJECT}/${p}`,
        ca,
        agent: false,
        headers: { 'x-auth-token': token },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** The hook starts on `node` (deployment `index`), ms, at or after `afterMs`. */
function hookStarts(marks: string, node: string, index: number, afterMs: number): number[] {
  let text: string;
  try {
    text = fs.readFileSync(path.join(marks, `${node}.${index}`), 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => /^\d{10,}$/.test(l))
    .map((l) => Number(BigInt(l) / 1000n) / 1000)
    .filter((ms) => ms >= afterMs);
}

/** `herald_object_store_requests_total` by `method code`. */
async function requestCounts(op: OperatorClient): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const [k, v] of parseProm((await op.request('GET', '/metrics')).raw)) {
    const m = /^herald_object_store_requests_total\{method="([^"]+)",code="([^"]+)"\}$/.exec(k);
    if (m) out[`${m[1]} ${m[2]}`] = v;
  }
  return out;
}

/** The requests counted, of `method` only when given. */
export function total(c: Record<string, number>, method?: string): number {
  return Object.entries(c)
    .filter(([k]) => method === undefined || k.startsWith(`${method} `))
    .reduce((a, [, n]) => a + n, 0);
}

function countsDelta(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(b)) if (v - (a[k] ?? 0) > 0) out[k] = v - (a[k] ?? 0);
  return out;
}

/** TCP connections this network namespace has accepted so far (/proc/net/snmp's PassiveOpens). */
function passiveOpens(): number {
  try {
    const lines = fs.readFileSync('/proc/net/snmp', 'utf8').split('\n');
    for (let i = 0; i + 1 < lines.length; i++) {
      const keys = lines[i]!.split(/\s+/);
      if (keys[0] !== 'Tcp:' || !lines[i + 1]!.startsWith('Tcp:')) continue;
      return Number(lines[i + 1]!.split(/\s+/)[keys.indexOf('PassiveOpens')]);
    }
  } catch {
    // not Linux
  }
  return Number.NaN;
}

/** Connections to `port` on 127.0.0.1 established now (/proc/net/tcp, state 01). */
function openConnections(port: number): number {
  try {
    const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')} `;
    return fs
      .readFileSync('/proc/net/tcp', 'utf8')
      .split('\n')
      .filter((l) => {
        const f = l.trim().split(/\s+/);
        return f[1]?.endsWith(hex.trim()) === true && f[3] === '01';
      }).length;
  } catch {
    return Number.NaN;
  }
}

/** The `too_many_connections` refusals the controller's log summarised between `from` and `to` (epoch ms). */
function refusedIn(log: string, from: number, to: number): number {
  let n = 0;
  for (const line of log.split('\n')) {
    if (!line.includes('"too_many_connections"')) continue;
    try {
      const o = JSON.parse(line) as { time?: number; count?: number; component?: string };
      if (o.component === 'object-store' && o.time !== undefined && o.time >= from && o.time <= to) n += o.count ?? 1;
    } catch {
      // a line cut off mid-write
    }
  }
  return n;
}

function cpuMs(pid: number): number {
  const s = procSample(pid);
  return s === null ? Number.NaN : (s.cpuPreciseS ?? s.cpuS) * 1000;
}

function debianVersions(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of ['python3-heat', 'python3-os-collect-config']) {
    try {
      const text = fs.readFileSync('/var/lib/dpkg/status', 'utf8');
      const m = new RegExp(`^Package: ${p}\\n(?:[^\\n]+\\n)*?Version: (\\S+)`, 'm').exec(text);
      if (m) out[p] = m[1]!;
    } catch {
      // not Debian
    }
  }
  return out;
}

/** The whole `--heat` run; its processes are stopped before it resolves. */
export async function heatPhase(o: {
  runDir: string;
  quick: boolean;
  heatAgentsDir: string;
  machine: string;
  /** The run has a network namespace of its own: every connection in it is the run's. */
  ownNetwork: boolean;
}): Promise<HeatBenchResult> {
  const r: HeatBenchResult = {
    date: new Date().toISOString(),
    machine: o.machine,
    versions: debianVersions(),
    updates: [],
    stockIntervalS: OCC_POLLING_INTERVAL_DEFAULT_S,
    heads: [],
    problems: [],
  };
  if (!heatAvailable(false)) {
    r.problems.push(
      `OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')})`,
    );
    return r;
  }
  const stockProblems = heatAvailable(true)
    ? heatAgentsProblems(o.heatAgentsDir)
    : ['os-collect-config is not installed'];
  if (stockProblems.length > 0) r.stockSkipped = `no stock node: ${stockProblems.join(', ')}`;
  const dir = path.join(o.runDir, 'heat');
  fs.rmSync(dir, { recursive: true, force: true });
  const marks = path.join(dir, 'marks');
  fs.mkdirSync(marks, { recursive: true });
  const bed = new Testbed({ dir, keep: true });
  let heat: Heat | undefined;
  let stock: OccNode | undefined;
  let op: OperatorClient | undefined;
  try {
    const pki = await bed.makePki({ agents: [HERALD_NODE] });
    const token = crypto.randomBytes(32).toString('hex');
    const tokens = path.join(dir, 'object-store-tokens');
    fs.writeFileSync(tokens, `${crypto.createHash('sha256').update(token).digest('hex')} ${PROJECT} bench\n`, {
      mode: 0o600,
    });
    const ctl = await bed.startController({
      args: ['--object-store-listen', '127.0.0.1:0', '--object-store-tokens', tokens, '--heat-project', PROJECT],
    });
    const osPort = ctl.objectStorePort!;
    op = new OperatorClient(pki.operator(), '127.0.0.1', ctl.port);
    const agent = bed.startAgent({ node: HERALD_NODE, pollInterval: '120s' });
    await agent.announced();
    const ca = fs.readFileSync(pki.paths.caCrt);
    say('heat: starting OpenStack Heat');
    heat = await startHeat({
      objectStoreUrl: `https://127.0.0.1:${osPort}/v1/AUTH_${PROJECT}`,
      caFile: pki.paths.caCrt,
      token,
      dir: path.join(dir, 'heat'),
    });
    if (r.stockSkipped === undefined)
      stock = await startOccNode({
        name: STOCK_NODE,
        heatAgentsDir: o.heatAgentsDir,
        caFile: pki.paths.caCrt,
        dir: path.join(dir, 'occ'),
        pollingIntervalS: OCC_POLLING_INTERVAL_DEFAULT_S,
      });
    const h = heat;
    const cli = async (args: string[]): Promise<string> => {
      const x = await h.openstack(args, STEP_TIMEOUT_MS);
      if (x.code !== 0)
        throw new Error(`openstack ${args.slice(0, 2).join(' ')} → ${x.code}: ${x.stderr.trim()}\n${h.logTail(20)}`);
      return x.stdout;
    };
    const heatLog = new LogFollower(
      h.logFile,
      (l) => l.includes('Processing request: PATCH') || l.includes(' heat.engine.stack '),
    );

    // ---- stack update → hook started ------------------------------------------------------
    const servers = [{ node: HERALD_NODE, deployments: 1 }, ...(stock ? [{ node: STOCK_NODE, deployments: 1 }] : [])];
    const latTemplate = path.join(dir, 'latency.yaml');
    fs.writeFileSync(latTemplate, benchTemplate(servers));
    say(`heat: creating the stack (${servers.map((s) => s.node).join(', ')})`);
    const create = h.openstack(
      ['stack', 'create', '-t', latTemplate, '--parameter', `marks=${marks}`, '--wait', '--poll', '1', 'lat'],
      STEP_TIMEOUT_MS,
    );
    if (stock) {
      // the stock node boots with the metadata URL Heat minted into its first metadata
      const url = await waitFor(
        `Heat's first metadata for ${STOCK_NODE}`,
        async () => {
          const list = await objectStore(osPort, ca, token, 'GET', `${STOCK_NODE}?format=json`);
          const name = list.status === 200 ? (JSON.parse(list.body) as Array<{ name: string }>)[0]?.name : undefined;
          if (!name) return undefined;
          const obj = await objectStore(osPort, ca, token, 'GET', `${STOCK_NODE}/${name}`);
          return obj.status === 200
            ? (JSON.parse(obj.body) as { 'os-collect-config'?: { request?: { metadata_url?: string } } })[
                'os-collect-config'
              ]?.request?.metadata_url
            : undefined;
        },
        STEP_TIMEOUT_MS,
        250,
      );
      await stock.setMetadataUrl(url);
    }
    const created = await create;
    if (created.code !== 0)
      throw new Error(`openstack stack create → ${created.code}: ${created.stderr.trim()}\n${h.logTail(20)}`);
    const stackId = (JSON.parse(await cli(['stack', 'show', 'lat', '-f', 'json'])) as { id: string }).id;
    if (stock) {
      // os-collect-config sleeps 1, 2, 4, 8, 16 s, then its interval after each start, and it started
      // again (a changed config) before it signalled: its 6th poll since the create sleeps the whole
      // interval. Nothing else HEADs an object now (no stack operation is in progress).
      say(`heat: waiting for ${STOCK_NODE} to poll every ${OCC_POLLING_INTERVAL_DEFAULT_S} s`);
      const base = total(await requestCounts(op), 'HEAD');
      const api = op;
      await waitFor(
        `${STOCK_NODE}'s 6th poll since the create`,
        async () => total(await requestCounts(api), 'HEAD') - base >= OCC_BACKOFF_POLLS,
        STEP_TIMEOUT_MS,
        500,
      );
    }
    const updates = o.quick ? 2 : HEAT_UPDATES;
    for (let k = 1; k <= updates; k++) {
      if (stock) await sleep(Math.random() * OCC_POLLING_INTERVAL_DEFAULT_S * 1000);
      const cmdAt = nowMs();
      await cli(['stack', 'update', '--existing', '--parameter', `restart_trigger=${k}`, 'lat']);
      const ended = await waitFor(
        'UPDATE_COMPLETE',
        () => stackEndedAt(heatLog.text(), 'lat', 'UPDATE', cmdAt),
        STEP_TIMEOUT_MS,
        100,
      );
      if (ended.status !== 'COMPLETE') throw new Error(`update ${k}: ${ended.action}_${ended.status}: ${ended.reason}`);
      const patchAt = requestReceivedAt(heatLog.text(), 'PATCH', 'lat', cmdAt) ?? Number.NaN;
      const put = heatMetadataPuts(ctl.proc.log(), cmdAt).find((p) => p.node === HERALD_NODE)?.at ?? Number.NaN;
      const hook = hookStarts(marks, HERALD_NODE, 0, cmdAt)[0] ?? Number.NaN;
      const sample: HeatUpdateSample = {
        cliMs: patchAt - cmdAt,
        completeMs: ended.at - patchAt,
        herald: { putMs: put - patchAt, hookMs: hook - patchAt },
      };
      if (stock) {
        const head = await objectStore(osPort, ca, token, 'HEAD', `${STOCK_NODE}/${stackId}.json`);
        const stored = Number(head.headers['x-timestamp']) * 1000;
        const sHook = hookStarts(marks, STOCK_NODE, 0, cmdAt)[0] ?? Number.NaN;
        sample.stock = { putMs: stored - patchAt, hookMs: sHook - patchAt, waitedMs: sHook - stored };
      }
      r.updates.push(sample);
      say(
        `heat: update ${k}/${updates}: PATCH → Herald hook ${round(sample.herald.hookMs, 0)} ms${sample.stock ? `, stock hook ${round(sample.stock.hookMs, 0)} ms` : ''}; UPDATE_COMPLETE ${round(sample.completeMs, 0)} ms`,
      );
    }
    await stock?.stop();
    stock = undefined;

    // ---- Heat's signal polls ------------------------------------------------------------------
    const windowMs = o.quick ? 10_000 : HEAD_WINDOW_MS;
    const step = o.quick ? 5 : HEAD_STEP;
    const most = o.quick ? 5 : HEAD_DEPLOYMENTS;
    await agent.proc.stop();
    const ctlPid = ctl.proc.child.pid!;
    const client = op;
    const measure = async (deployments: number): Promise<HeadsWindow> => {
      const sample = async () => ({
        at: nowMs(),
        req: await requestCounts(client),
        ctl: cpuMs(ctlPid),
        heat: cpuMs(h.pid),
        tcp: passiveOpens(),
      });
      const a = await sample();
      let maxOpen = 0;
      while (nowMs() - a.at < windowMs) {
        maxOpen = Math.max(maxOpen, openConnections(osPort));
        await sleep(Math.min(1_000, windowMs - (nowMs() - a.at)));
      }
      const b = await sample();
      return {
        deployments,
        windowMs: round(b.at - a.at, 0),
        requests: countsDelta(a.req, b.req),
        controllerCpuMs: round(b.ctl - a.ctl, 2),
        heatCpuMs: round(b.heat - a.heat, 1),
        connections: o.ownNetwork ? b.tcp - a.tcp : null,
        maxOpen,
        refused: refusedIn(ctl.proc.log(), a.at, b.at),
      };
    };
    say(
      `heat: idle window (${windowMs / 1000} s), then up to ${most} deployments kept in progress, ${step} more a window`,
    );
    r.heads.push(await measure(0));
    for (let n = step; n <= most; n += step) {
      const template = path.join(dir, `heads-${n}.yaml`);
      fs.writeFileSync(template, benchTemplate([{ node: HERALD_NODE, deployments: step }]));
      await cli(['stack', 'create', '-t', template, '--parameter', `marks=${marks}`, `heads-${n}`]);
      await waitFor(
        `${n} deployments in progress on ${HERALD_NODE}`,
        async () => {
          const list = await client.must<{ items: Array<{ status: string }> }>(
            200,
            'GET',
            `/v1/deployments?node=${HERALD_NODE}`,
          );
          return list.items.filter((d) => d.status === 'IN_PROGRESS').length >= n;
        },
        STEP_TIMEOUT_MS,
        500,
      );
      await sleep(HEAD_SETTLE_MS);
      const w = await measure(n);
      r.heads.push(w);
      say(
        `heat: ${n} in progress: ${total(w.requests, 'HEAD')} HEADs in ${w.windowMs / 1000} s, controller ${w.controllerCpuMs} ms CPU, ${w.maxOpen} connections open at most, ${w.refused} refused`,
      );
    }
  } catch (err) {
    r.problems.push((err as Error).message);
  } finally {
    op?.close();
    await stock?.stop();
    await heat?.stop();
    await bed.stop();
  }
  return r;
}

/** The figures of a set of samples (NaN ones left out). */
export function figures(xs: readonly number[]): Dist {
  return roundDist(dist(xs.filter((x) => Number.isFinite(x))), 0);
}
