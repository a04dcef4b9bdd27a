/**
 * The security battery's harness: a PKI made by `certs/` in a temporary directory, a real
 * `bin/herald controller` and real `bin/herald agent` processes on 127.0.0.1 (through the
 * testbed, cli/testbed/), and the outside
 * oracle every attack is judged by:
 *
 * - the controller's metadata request counter (`herald_api_requests_total` of the metadata
 *   route, every status but 403), read from `/metrics` with the operator certificate: an attack
 *   that made an agent fetch shows here (an attacker's own refused request does not);
 * - the agent's state dir (every path, size and content hash): an attack that made an agent run
 *   something leaves a run dir, a changed `state.json` or an outbox entry.
 *
 * An agent can also run inside the test process (`startAgentInProcess`), through the same
 * `startAgent()` that `herald agent` calls, when a test must hand it a dependency no process
 * option sets (a skewed clock).
 *
 * `close()` kills every process group it started, removes the temp dir, and `leftovers()` says
 * what (if anything) is still there: processes whose command line names the work dir, listening
 * ports, the dir itself.
 *
 * Needs `npm run build` first (`npm test` does it).
 */
import { procAlive } from '../../helpers/procs.js';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { issueCert, newRsaKeyPem, revoke, type Pem } from '../../../certs/pki.js';
import { startAgent as startTestbedAgent } from '../../../cli/testbed/agent.js';
import { startController as startTestbedController } from '../../../cli/testbed/controller.js';
import { makePki } from '../../../cli/testbed/pki.js';
import { pkiPaths } from '../../../certs/paths.js';
import { spiffeIdOf, type Role } from '../../../protocol/identity.js';
import { Signer, type Ed25519PrivateJwk } from '../../../protocol/jws.js';
import { startAgent as startAgentHere, type RunningAgent } from '../../../agent/main.js';
import type { AgentDeps } from '../../../agent/assemble.js';
import {
  api,
  asProc,
  freePort,
  hasExited,
  isBuilt,
  REPO,
  stopProc,
  waitFor,
  type ApiResponse,
  type Proc,
} from '../../helpers/procs.js';

export const TD = 'herald.local';
export { isBuilt, waitFor };

export interface Cred {
  ca: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/** A certificate, its key and the CA: what `https`/`tls` options need. */
export interface FullCred extends Cred {
  cert: Buffer;
  key: Buffer;
}

export interface AgentProc {
  node: string;
  port: number;
  proc: Proc;
  state: string;
  hooks: string;
  /** Agent log lines (pino JSON) written since the agent started. */
  lines(): Array<Record<string, unknown>>;
}

/** An agent running inside the test process (see `Battery.startAgentInProcess`). */
export interface InProcessAgent {
  node: string;
  port: number;
  state: string;
  hooks: string;
  agent: RunningAgent;
}

export interface ControllerProc {
  port: number;
  proc: Proc;
}

export interface StartAgentOptions {
  /** Extra command line options (after the defaults, so they win). */
  extra?: string[];
  env?: NodeJS.ProcessEnv;
  /** Default: the battery's controller. */
  controllerUrl?: string;
  /** Wait until the controller lists the announced endpoint (default true when controllerUrl is not given). */
  waitAnnounce?: boolean;
  /** Default `<work>/hooks-<node>` (made 0755). */
  hooksDir?: string;
}

/**
 * The controllers the battery's agents accept (`--controller-id`): the real one and those the
 * attacks connect as (each holding a valid controller certificate). `c9` is left out on purpose.
 */
export const BATTERY_CONTROLLER_IDS = 'controller,c2,c3,c4,c5,r-new,r-resume,r-live,rv';

/** Slow polling, so that every fetch the oracle sees was caused by something the test did. */
export const QUIET_POLL = ['--poll-interval', '600s', '--poll-interval-healthy', '600s'];
/** How long an attack is given to (wrongly) cause a fetch or a run before the oracle looks. */
export const SETTLE_MS = 250;

export class Battery {
  readonly work: string;
  readonly pkiDir: string;
  readonly ca: Pem;
  /** One RSA key for every extra certificate (key generation is the slow part). */
  readonly keyPem: string;
  readonly signingJwk: Ed25519PrivateJwk;
  readonly signer: Signer;
  readonly op: FullCred;
  ctl!: ControllerProc;
  readonly agents = new Map<string, AgentProc>();
  readonly inProcess = new Map<string, InProcessAgent>();
  #procs: Proc[] = [];
  #ports: number[] = [];
  #closed = false;

  private constructor(work: string) {
    this.work = work;
    this.pkiDir = path.join(work, 'pki');
    const p = pkiPaths(this.pkiDir);
    this.ca = { cert: fs.readFileSync(p.caCrt, 'utf8'), key: fs.readFileSync(p.caKey, 'utf8') };
    this.keyPem = newRsaKeyPem();
    this.signingJwk = JSON.parse(fs.readFileSync(p.signingJwk, 'utf8')) as Ed25519PrivateJwk;
    this.signer = new Signer(this.signingJwk);
    this.op = this.cred('operator', 'admin');
  }

  /** A new PKI (CA, signing key, controller/controller, operator/admin) in a new temp dir. */
  static async create(): Promise<Battery> {
    const work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-sec-'));
    await makePki(path.join(work, 'pki'), { trustDomain: TD });
    return new Battery(work);
  }

  /** Controller `name`'s own private signing key (docs/several-controllers.md): wake-signing.jwk for `controller`. */
  signingJwkOf(name: string): Ed25519PrivateJwk {
    const p = pkiPaths(this.pkiDir);
    const file = name === 'controller' ? p.signingJwk : p.controllerJwk(name);
    return JSON.parse(fs.readFileSync(file, 'utf8')) as Ed25519PrivateJwk;
  }

  /** A signer with controller `name`'s own signing key. */
  signerOf(name: string): Signer {
    return new Signer(this.signingJwkOf(name));
  }

  get caBuf(): Buffer {
    return Buffer.from(this.ca.cert);
  }

  spiffe(role: Role, name: string): string {
    return spiffeIdOf(TD, role, name);
  }

  /** The credentials of `role/name` from the PKI layout. */
  cred(role: Role, name: string): FullCred {
    const p = pkiPaths(this.pkiDir);
    return {
      ca: fs.readFileSync(p.caCrt),
      cert: fs.readFileSync(p.cert(role, name)),
      key: fs.readFileSync(p.key(role, name)),
    };
  }

  /** Issues `role/name` into the PKI (SANs 127.0.0.1 and localhost unless given). */
  async issue(
    role: Role,
    name: string,
    sans: { dns?: string[]; ip?: string[] } = {},
  ): Promise<FullCred & { serial: string }> {
    const r = await issueCert({
      dir: this.pkiDir,
      role,
      name,
      ip: sans.ip ?? ['127.0.0.1'],
      dns: sans.dns ?? ['localhost'],
      keyPem: this.keyPem,
    });
    return { ...this.cred(role, name), serial: r.serial };
  }

  /** Revokes `role/name` in the shared revoked.json (controller and agents re-read it). */
  async revoke(role: Role, name: string): Promise<void> {
    await revoke({ dir: this.pkiDir, target: `${role}/${name}` });
  }

  // ---- processes -------------------------------------------------------------------------

  async startController(extra: string[] = []): Promise<ControllerProc> {
    const port = await freePort();
    this.#ports.push(port);
    let proc: Proc | undefined;
    await startTestbedController({
      label: 'controller',
      pki: this.pkiDir,
      db: path.join(this.work, 'herald.db'),
      port,
      pushWorkers: 0,
      args: extra,
      logFile: path.join(this.work, 'controller.log'),
      cwd: REPO,
      timeoutMs: 30_000,
      onStart: (p) => {
        proc = asProc(p);
        this.#procs.push(proc);
      },
    });
    this.ctl = { port, proc: proc! };
    return this.ctl;
  }

  /** Starts `bin/herald agent --node <node>` (its certificate is issued if missing). */
  async startAgent(node: string, o: StartAgentOptions = {}): Promise<AgentProc> {
    if (!fs.existsSync(pkiPaths(this.pkiDir).cert('agent', node))) await this.issue('agent', node);
    const port = await freePort();
    this.#ports.push(port);
    const state = path.join(this.work, `state-${node}`);
    const hooks = o.hooksDir ?? path.join(this.work, `hooks-${node}`);
    const controllerUrl = o.controllerUrl ?? `https://127.0.0.1:${this.ctl.port}`;
    const proc = asProc(
      startTestbedAgent({
        node,
        controllers: [controllerUrl],
        listen: `127.0.0.1:${port}`,
        pki: this.pkiDir,
        stateDir: state,
        hooksDir: hooks,
        controllerId: BATTERY_CONTROLLER_IDS,
        args: [...QUIET_POLL, ...(o.extra ?? [])],
        logFile: path.join(this.work, `agent-${node}.log`),
        cwd: REPO,
        env: { ...process.env, ...o.env },
      }).proc,
    );
    this.#procs.push(proc);
    const a: AgentProc = { node, port, proc, state, hooks, lines: () => jsonLines(proc.log()) };
    this.agents.set(node, a);
    if (o.waitAnnounce ?? o.controllerUrl === undefined) {
      await waitFor(
        `agent ${node} to announce its endpoint and be pushed to`,
        async () => {
          if (hasExited(proc)) throw new Error(`agent ${node} exited:\n${proc.log().slice(-2000)}`);
          const r = await api(this.ctl.port, this.op, 'GET', `/v1/nodes/${node}`);
          return (
            r.status === 200 && String(r.json?.endpoint ?? '').includes(`:${port}/`) && r.json?.push?.connected === true
          );
        },
        30_000,
        50,
      );
    } else {
      await waitFor(
        `agent ${node} to listen`,
        async () => {
          if (hasExited(proc)) throw new Error(`agent ${node} exited:\n${proc.log().slice(-2000)}`);
          return a.lines().some((l) => l.msg === 'agent started');
        },
        30_000,
        50,
      );
    }
    return a;
  }

  /**
   * Starts agent `node` inside this process with `deps` (a clock, say), configured as
   * `startAgent()` configures `bin/herald agent`, and waits until the controller pushes to it.
   */
  async startAgentInProcess(
    node: string,
    o: { deps?: Partial<Omit<AgentDeps, 'log'>>; pollIntervalMs?: number; pollIntervalHealthyMs?: number } = {},
  ): Promise<InProcessAgent> {
    if (!fs.existsSync(pkiPaths(this.pkiDir).cert('agent', node))) await this.issue('agent', node);
    const port = await freePort();
    this.#ports.push(port);
    const state = path.join(this.work, `state-${node}`);
    const hooks = path.join(this.work, `hooks-${node}`);
    fs.mkdirSync(hooks, { recursive: true, mode: 0o755 });
    const agent = await startAgentHere(
      {
        node,
        controller: `https://127.0.0.1:${this.ctl.port}`,
        listen: { host: '127.0.0.1', port },
        pki: this.pkiDir,
        stateDir: state,
        hooksDir: hooks,
        controllerId: BATTERY_CONTROLLER_IDS,
        pollIntervalMs: o.pollIntervalMs ?? 600_000,
        pollIntervalHealthyMs: o.pollIntervalHealthyMs ?? 600_000,
        logLevel: process.env.HERALD_TEST_LOG ?? 'silent',
      },
      o.deps,
    );
    const a: InProcessAgent = { node, port, state, hooks, agent };
    this.inProcess.set(node, a);
    await waitFor(
      `agent ${node} to announce its endpoint and be pushed to`,
      async () => {
        const r = await api(this.ctl.port, this.op, 'GET', `/v1/nodes/${node}`);
        return (
          r.status === 200 && String(r.json?.endpoint ?? '').includes(`:${port}/`) && r.json?.push?.connected === true
        );
      },
      30_000,
      50,
    );
    return a;
  }

  agent(node: string): AgentProc {
    const a = this.agents.get(node);
    if (!a) throw new Error(`no agent ${node}`);
    return a;
  }

  // ---- the oracle ------------------------------------------------------------------------

  /** A request to the controller as the operator. */
  asOperator(method: string, p: string, body?: unknown): Promise<ApiResponse> {
    return api(this.ctl.port, this.op, method, p, body);
  }

  async metricsText(): Promise<string> {
    const r = await api(this.ctl.port, this.op, 'GET', '/metrics');
    if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
    return r.raw;
  }

  /**
   * Metadata requests that got past authorization (any status but 403: served, 304, rate
   * limited...): every fetch an agent made. An attacker's own refused request does not count.
   */
  /** Metadata fetches the controller answered, over HTTPS (but a 403) or over a push connection. */
  async fetchCount(): Promise<number> {
    const t = await this.metricsText();
    return (
      metricSum(t, 'herald_api_requests_total', (l) => l.route === '/v1/nodes/:node/metadata' && l.status !== '403') +
      metricSum(t, 'herald_metadata_fetches_total', (l) => l.channel === 'push')
    );
  }

  /**
   * Waits until nothing happens: the fetch counter and every agent's state dir did not change for
   * `quietMs`. Resolves with the fetch counter.
   */
  async quiesce(quietMs = 500, timeoutMs = 20_000): Promise<number> {
    const look = async (): Promise<string> =>
      JSON.stringify([
        await this.fetchCount(),
        [...this.agents.keys(), ...this.inProcess.keys()].map((n) => this.snapshot(n)),
      ]);
    let last = await look();
    let since = Date.now();
    const t0 = Date.now();
    for (;;) {
      await sleep(100);
      const now = await look();
      if (now !== last) {
        last = now;
        since = Date.now();
      } else if (Date.now() - since >= quietMs) {
        return this.fetchCount();
      }
      if (Date.now() - t0 > timeoutMs) throw new Error('the fetch counter and state dirs never settled');
    }
  }

  /** Every path in the agent's state dir with its size and content hash (directories as `dir`). */
  snapshot(node: string): Record<string, string> {
    return snapshotDir(this.inProcess.get(node)?.state ?? this.agent(node).state);
  }

  /**
   * Runs `attack` and proves from the outside that it had no effect: the controller saw no new
   * metadata request, and the state dir of every agent named is byte for byte the same, with no
   * run directory and an empty outbox.
   */
  async expectNoEffect<T>(nodes: string[], attack: () => Promise<T>, settleMs = SETTLE_MS): Promise<T> {
    // what an earlier step caused lands first: a fetch counted after the attack is the attack's
    const fetches = await this.quiesce(settleMs);
    const before = nodes.map((n) => this.snapshot(n));
    const out = await attack();
    await sleep(settleMs);
    const after = nodes.map((n) => this.snapshot(n));
    const fetchesAfter = await this.fetchCount();
    if (fetchesAfter !== fetches) throw new Error(`the attack caused ${fetchesAfter - fetches} metadata request(s)`);
    nodes.forEach((n, i) => {
      assertSameState(n, before[i]!, after[i]!);
      assertNoWork(this.inProcess.get(n)?.state ?? this.agent(n).state);
    });
    return out;
  }

  // ---- teardown --------------------------------------------------------------------------

  /** SIGKILLs every process group started here and removes the work dir. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all([...this.inProcess.values()].map((a) => a.agent.stop('test over')));
    await Promise.all(this.#procs.map((p) => stopProc(p, 'SIGKILL')));
    if (!process.env.KEEP) fs.rmSync(this.work, { recursive: true, force: true });
  }

  /** What is left after close(): processes naming the work dir, ports still listening, the dir. */
  async leftovers(): Promise<string[]> {
    const out: string[] = [];
    for (const pid of processesMentioning(this.work)) out.push(`process ${pid} still runs`);
    for (const p of this.#procs)
      if (p.child.pid !== undefined && pidAlive(p.child.pid)) out.push(`process ${p.name} (${p.child.pid}) still runs`);
    for (const port of this.#ports) if (await listening(port)) out.push(`port ${port} still listens`);
    if (fs.existsSync(this.work) && !process.env.KEEP) out.push(`${this.work} still exists`);
    return out;
  }
}

// ---- helpers -------------------------------------------------------------------------------

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function jsonLines(text: string): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  for (const l of text.split('\n')) {
    if (!l.startsWith('{')) continue;
    try {
      out.push(JSON.parse(l) as Record<string, unknown>);
    } catch {
      // a line cut by a kill
    }
  }
  return out;
}

/** Sum of a Prometheus metric's samples whose labels pass `filter`. */
export function metricSum(
  text: string,
  name: string,
  filter: (labels: Record<string, string>) => boolean = () => true,
): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels: Record<string, string> = {};
    for (const kv of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]!] = kv[2]!;
    if (filter(labels)) sum += Number(m[3]);
  }
  return sum;
}

export function snapshotDir(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string): void => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const full = path.join(d, e.name);
      const rel = path.relative(dir, full);
      if (e.isDirectory()) {
        out[rel] = 'dir';
        walk(full);
      } else if (e.isSymbolicLink()) {
        out[rel] = `link ${fs.readlinkSync(full)}`;
      } else {
        const data = fs.readFileSync(full);
        out[rel] = `${data.length} ${crypto.createHash('sha256').update(data).digest('hex').slice(0, 16)}`;
      }
    }
  };
  walk(dir);
  return out;
}

function assertSameState(node: string, before: Record<string, string>, after: Record<string, string>): void {
  const changed = [...new Set([...Object.keys(before), ...Object.keys(after)])].filter((k) => before[k] !== after[k]);
  if (changed.length > 0) throw new Error(`agent ${node}'s state dir changed: ${changed.join(', ')}`);
}

/** No run directory and an empty outbox. */
export function assertNoWork(stateDir: string): void {
  for (const sub of ['runs', 'outbox']) {
    const d = path.join(stateDir, sub);
    const left = fs.existsSync(d) ? fs.readdirSync(d) : [];
    if (left.length > 0) throw new Error(`${d} is not empty: ${left.join(', ')}`);
  }
}

const pidAlive = procAlive;

/** Live (non-zombie) processes whose command line or working directory is inside `dir`. */
export function processesMentioning(dir: string): number[] {
  const out: number[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const cmd = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8');
      let cwd = '';
      try {
        cwd = fs.readlinkSync(`/proc/${d}/cwd`);
      } catch {
        // not ours to read
      }
      if ((cmd.includes(dir) || cwd.startsWith(dir)) && pidAlive(Number(d))) out.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
