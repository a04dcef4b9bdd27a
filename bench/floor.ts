/**
 * The fan-out's floor, measured in the same run as Herald's figures: the least a controller can
 * do per agent for one change under Herald's protocol, written as plainly as Node allows, so the
 * controller's CPU per agent is compared with what this run's CPU makes possible, not with a
 * figure from another day (this host's CPU speed varies by the hour; BENCHMARKS.md, "CPU speed").
 *
 * Per agent the floor does exactly what docs/protocol.md requires of any controller, with Herald's own
 * protocol functions and the same libraries (`ws`, `node:tls`, better-sqlite3, `node:crypto`, and
 * the controller's Ed25519 signing, libsodium's: controller/ed25519.ts):
 * - the change: one SQLite transaction (WAL, `synchronous=FULL`, as Herald's store) writing each
 *   node's new generation and its document, built there once (a Heat-shaped body of Herald's size);
 * - a wake-up: an Ed25519 JWS naming the node, sent on a held mutual-TLS WebSocket it dialled;
 * - the fetch answering it, on the same connection: the node's row read, the body's SHA-256 and
 *   the response JWS bound to the agent's nonce, one metadata frame.
 * What it leaves out is all Herald adds around that: the HTTP request and its answer, the store's
 * normalised rows (deployments, revisions, clusters), the push worker and its IPC hop, the wake-up
 * slots and timers, metrics, logs and push states. The agents' side is as small: one TLS server per
 * process, each connection an agent that verifies its wake-up (`WakeVerifier`), answers with an
 * ack and a fetch in one write, and checks the metadata frame (`verifyMetadataResponse`).
 *
 * Processes (forked from this file): one controller, FLOOR_AGENT_PROCS agent processes; the bench
 * samples the controller's CPU from /proc around the window, as it does Herald's.
 */
import { type ChildProcess, fork } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import type { Socket } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { WebSocket, WebSocketServer } from 'ws';
import { pkiPaths } from '../certs/paths.js';
import {
  decodeAgentFrame,
  decodeControllerAnswer,
  encodeAck,
  encodeFetch,
  encodeMetadataFrame,
} from '../protocol/frames.js';
import { spiffeIdOf } from '../protocol/identity.js';
import { fastEd25519 } from '../controller/ed25519.js';
import { KeySet, Signer } from '../protocol/jws.js';
import { newNonce, sha256b64url, signMetadata, verifyMetadataResponse } from '../protocol/metadata.js';
import { HERALD_NODE_FLAGS } from '../protocol/node-flags.js';
import { newJti, signWake, WakeVerifier } from '../protocol/wake.js';
import { type BenchPki, slot } from './pki-cache.js';
import { track } from './procs.js';
import { nowMs, round, say, sleep, treeSample } from './util.js';

/** Agent processes of the floor: the agents' half of the work, spread as the harness spreads it. */
export const FLOOR_AGENT_PROCS = 4;
/** Dials in flight at once while the floor controller connects (handshakes, outside the window). */
const FLOOR_DIAL_CONCURRENCY = 200;
/**
 * The floor's document: about the size of Herald's for a node of one cluster (1.35 KB in the
 * fan-out: its install's item; 2.6 KB before 2026-12-07, when the uninstall's item, born not
 * triggered, was in it too).
 */
const FLOOR_BODY_BYTES = 1_350;
/** How long the floor's window may take before the run is reported as timed out. */
const FLOOR_WINDOW_TIMEOUT_MS = 120_000;
/** How long dialling every agent may take. */
const FLOOR_CONNECT_TIMEOUT_MS = 180_000;
/** How long an agent process may take to listen, and to answer a report. */
const FLOOR_AGENT_ANSWER_TIMEOUT_MS = 30_000;
/** How often the agents are asked whether all of them hold the change. */
const FLOOR_REPORT_EVERY_MS = 20;
/** The pause before each measured change (the last one's frames settle), the floor's CPU sampled over it. */
const FLOOR_SETTLE_MS = 5_000;

/** One measured change of the floor. */
export interface FloorRun {
  /** The change's transaction, from the start of the window. */
  commitMs: number;
  allAckedMs: number;
  allFetchedMs: number;
  acked: number;
  fetched: number;
  /** The floor controller's CPU over the window, from /proc (user + system, all threads). */
  controllerCpuS: number;
  cpuPerAgentMs: number;
  /**
   * The floor controller's CPU per second while quiet, sampled over the settle before the change
   * (as Herald's before its runs; absent in older results).
   */
  idleCpuPerS?: number;
  agentsCpuS: number;
  timedOut: boolean;
}

/**
 * The floor at N: its figures are those of its median run by CPU, the lower of the middle two for
 * an even count (`runs` has each, in order; when
 * the fan-out's runs at N took turns with them, the i-th was measured just before Herald's i-th).
 */
export interface FloorResult extends FloorRun {
  n: number;
  /** The document's size, bytes. */
  bodyBytes: number;
  connectMs: number;
  /** Processes its agents ran in (FLOOR_AGENT_PROCS; absent in results before 2026-12-06 13:30 UTC). */
  agentProcs?: number;
  runs?: FloorRun[];
  problems: string[];
}

interface FloorPki {
  ca: string;
  controllerCert: string;
  controllerKey: string;
  agentCert: string;
  agentKey: string;
  signingJwk: string;
  jwks: string;
  trustDomain: string;
}

type ToAgents = { t: 'listen'; nodes: string[]; pki: FloorPki; ip: string } | { t: 'report' };
type FromAgents =
  | { t: 'listening'; port: number }
  | { t: 'done'; acked: number; fetched: number; lastAckMs: number; lastFetchMs: number; errors: string[] };
type ToController =
  | { t: 'setup'; agents: Array<{ ip: string; port: number; nodes: string[] }>; pki: FloorPki; dir: string }
  | { t: 'go'; gen: number };
type FromController = { t: 'connected'; ms: number; failed: string[] } | { t: 'started'; t0: number; commitMs: number };

const entry = fileURLToPath(import.meta.url);

/**
 * A Heat-shaped document of one deployment, padded to the floor's size (node names have one
 * length, so one padding fits all): one JSON.stringify per document, as a builder would do.
 */
function documentOf(node: string, gen: number, pad: string): Buffer {
  return Buffer.from(
    JSON.stringify({
      generation: gen,
      deployments: [
        {
          id: `floor-${node}`,
          server_id: node,
          config: '#!/bin/sh\ntrue\n',
          group: 'script',
          name: `floor-install-${node}`,
          inputs: [
            {
              name: 'deploy_server_id',
              value: node,
              type: 'String',
              description: 'ID of the server being deployed to',
            },
            { name: 'deploy_action', value: 'CREATE', type: 'String', description: 'Name of the current action' },
            { name: 'deploy_signal_transport', value: 'HERALD', type: 'String', description: 'How the server signals' },
            {
              name: 'deploy_signal_id',
              value: `https://127.0.0.1/v1/nodes/${node}/deployments/floor-${node}/signal`,
              type: 'String',
              description: 'ID of signal to use for signaling output values',
            },
            { name: 'deploy_signal_verb', value: 'POST', type: 'String', description: 'HTTP verb to use' },
          ],
          outputs: [],
          options: {},
          creation_time: '2026-12-04T00:00:00.000Z',
          updated_time: new Date().toISOString(),
          pad,
        },
      ],
    }),
  );
}

/** The padding that makes a document FLOOR_BODY_BYTES long. */
function paddingFor(node: string): string {
  return 'x'.repeat(Math.max(0, FLOOR_BODY_BYTES - documentOf(node, 1, '').length));
}

// ---- the floor controller ----------------------------------------------------------------------

async function controllerMain(): Promise<void> {
  const send = (m: FromController): void => void process.send!(m);
  let setup: Extract<ToController, { t: 'setup' }> | null = null;
  const conns: Array<{ node: string; aud: string; ws: WebSocket }> = [];
  let signer: Signer;
  let db: Database.Database;
  let iss = '';
  let pad = '';
  process.on('message', (m: ToController) => {
    if (m.t === 'setup') {
      setup = m;
      void connectAll().catch((err: Error) => {
        console.error(err);
        process.exit(1);
      });
    } else if (m.t === 'go') go(m.gen);
  });
  process.on('disconnect', () => process.exit(0));

  async function connectAll(): Promise<void> {
    const s = setup!;
    signer = new Signer(JSON.parse(fs.readFileSync(s.pki.signingJwk, 'utf8')), fastEd25519);
    iss = spiffeIdOf(s.pki.trustDomain, 'controller', 'controller');
    db = new Database(path.join(s.dir, 'floor.db'));
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = FULL');
    db.exec('CREATE TABLE docs (node TEXT PRIMARY KEY, gen INTEGER NOT NULL, body BLOB NOT NULL)');
    const put = db.prepare('INSERT INTO docs (node, gen, body) VALUES (?, 0, ?)');
    const all = s.agents.flatMap((a) => a.nodes.map((node) => ({ node, ip: a.ip, port: a.port })));
    pad = paddingFor(all[0]!.node);
    db.transaction(() => {
      for (const a of all) put.run(a.node, documentOf(a.node, 0, pad));
    })();
    const tls = {
      ca: fs.readFileSync(s.pki.ca),
      cert: fs.readFileSync(s.pki.controllerCert),
      key: fs.readFileSync(s.pki.controllerKey),
    };
    const get = db.prepare('SELECT gen, body FROM docs WHERE node = ?').raw(true);
    const t0 = nowMs();
    const failed: string[] = [];
    let next = 0;
    const dialOne = (a: (typeof all)[number]): Promise<void> =>
      new Promise((resolve) => {
        const ws = new WebSocket(`wss://${a.ip}:${a.port}/${a.node}`, { ...tls, perMessageDeflate: false });
        const aud = spiffeIdOf(s.pki.trustDomain, 'agent', a.node);
        ws.once('open', () => {
          conns.push({ node: a.node, aud, ws });
          resolve();
        });
        ws.once('error', (err) => {
          failed.push(`${a.node}: ${err.message}`);
          resolve();
        });
        ws.on('message', (data: Buffer) => {
          const f = decodeAgentFrame(data);
          if (f.type !== 'fetch') return; // an ack: nothing to do but let the slot go
          const [gen, body] = get.get(a.node) as [number, Buffer];
          const signature = signMetadata(signer, {
            iss,
            aud,
            gen,
            nonce: f.nonce,
            sha256: sha256b64url(body),
            nowS: Date.now() / 1000,
          });
          ws.send(
            encodeMetadataFrame({ type: 'metadata', nonce: f.nonce, status: 200, etag: `"${gen}"`, signature }, body),
          );
        });
      });
    await Promise.all(
      Array.from({ length: FLOOR_DIAL_CONCURRENCY }, async () => {
        while (next < all.length) await dialOne(all[next++]!);
      }),
    );
    send({ t: 'connected', ms: round(nowMs() - t0, 1), failed: failed.slice(0, 5) });
  }

  function go(gen: number): void {
    const t0 = nowMs();
    const put = db.prepare('UPDATE docs SET gen = ?, body = ? WHERE node = ?');
    db.transaction(() => {
      for (const c of conns) put.run(gen, documentOf(c.node, gen, pad), c.node);
    })();
    const commitMs = round(nowMs() - t0, 1);
    for (const c of conns)
      c.ws.send(
        signWake(signer, { iss, aud: c.aud, gen, reason: 'deployment', nowS: Date.now() / 1000, jti: newJti() }),
      );
    send({ t: 'started', t0, commitMs });
  }
}

// ---- the floor agents ------------------------------------------------------------------------

function agentsMain(): void {
  const send = (m: FromAgents): void => void process.send!(m);
  let acked = 0;
  let fetched = 0;
  let lastAckMs = 0;
  let lastFetchMs = 0;
  const errors: string[] = [];
  const fail = (err: unknown): void => {
    if (errors.length < 5) errors.push(String((err as Error)?.message ?? err));
  };
  process.on('disconnect', () => process.exit(0));
  process.on('message', (m: ToAgents) => {
    if (m.t === 'report') {
      send({ t: 'done', acked, fetched, lastAckMs, lastFetchMs, errors });
      return;
    }
    const keys = new KeySet(JSON.parse(fs.readFileSync(m.pki.jwks, 'utf8')));
    const issuer = spiffeIdOf(m.pki.trustDomain, 'controller', 'controller');
    const mine = new Set(m.nodes);
    const startedAtS = Date.now() / 1000;
    const server = https.createServer({
      ca: fs.readFileSync(m.pki.ca),
      cert: fs.readFileSync(m.pki.agentCert),
      key: fs.readFileSync(m.pki.agentKey),
      requestCert: true,
      rejectUnauthorized: true,
    });
    const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
    server.on('upgrade', (req, socket, head) => {
      const node = (req.url ?? '/').slice(1);
      if (!mine.has(node)) return socket.destroy();
      wss.handleUpgrade(req, socket, head, (ws) => {
        const audience = spiffeIdOf(m.pki.trustDomain, 'agent', node);
        const verifier = new WakeVerifier({ audience, keys: () => keys, startedAtS });
        const sock = socket as Socket;
        let nonce = '';
        ws.on('message', (data: Buffer, isBinary: boolean) => {
          try {
            if (!isBinary) {
              const w = verifier.verify(data.toString('utf8'), issuer);
              nonce = newNonce();
              sock.cork();
              ws.send(encodeAck(w.jti, w.gen, 'started'));
              ws.send(encodeFetch(nonce));
              sock.uncork();
              acked++;
              lastAckMs = nowMs();
              return;
            }
            const a = decodeControllerAnswer(data);
            if (a.type !== 'metadata') return;
            verifyMetadataResponse({
              status: 200,
              signature: a.head.signature,
              body: a.body,
              nonce,
              audience,
              issuer,
              keys,
            });
            fetched++;
            lastFetchMs = nowMs();
          } catch (err) {
            fail(err);
          }
        });
      });
    });
    server.listen(0, m.ip, () => send({ t: 'listening', port: (server.address() as { port: number }).port }));
  });
}

// ---- the bench's side ------------------------------------------------------------------------

function forkFloor(mode: 'controller' | 'agents'): ChildProcess {
  return track(
    fork(entry, [mode], { execArgv: [...HERALD_NODE_FLAGS], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }),
  );
}

function nextMessage<T extends { t: string }>(c: ChildProcess, t: T['t'], timeoutMs: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`floor: no '${t}' within ${timeoutMs} ms`)), timeoutMs);
    const on = (m: T): void => {
      if (m.t !== t) return;
      clearTimeout(timer);
      c.off('message', on);
      resolve(m);
    };
    c.on('message', on);
  });
}

/** A floor at N agents, connected and warmed up: `measure()` times one more change to all of them. */
export interface FloorBed {
  readonly n: number;
  /** Runs measured so far. */
  readonly runs: number;
  measure(): Promise<FloorRun>;
  /** The floor's figures over the runs measured so far (none: a result with no runs is not made). */
  result(): FloorResult;
  /** Ends every process it started. */
  stop(): void;
}

/** Starts the floor at N agents: connects them and warms the code up with a first change, unmeasured. */
export async function startFloor(o: { pki: BenchPki; runDir: string; n: number }): Promise<FloorBed> {
  const p = pkiPaths(o.pki.dir);
  // every floor agent listens on the first bench agent's address and presents its certificate
  const agentSlot = slot('b', 0);
  const pki: FloorPki = {
    ca: o.pki.caPath,
    controllerCert: p.cert('controller', 'controller'),
    controllerKey: p.key('controller', 'controller'),
    agentCert: o.pki.certPath(agentSlot.node),
    agentKey: o.pki.sharedKeyPath,
    signingJwk: p.signingJwk,
    jwks: p.jwks,
    trustDomain: o.pki.trustDomain,
  };
  const dir = path.join(o.runDir, 'floor');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const problems: string[] = [];
  const agents = Array.from({ length: FLOOR_AGENT_PROCS }, () => forkFloor('agents'));
  const ctl = forkFloor('controller');
  const stop = (): void => {
    for (const c of [ctl, ...agents]) c.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    const shares = agents.map((_, k) =>
      Array.from(
        { length: Math.ceil((o.n - k) / FLOOR_AGENT_PROCS) },
        (_, j) => `f${String(k + j * FLOOR_AGENT_PROCS).padStart(5, '0')}`,
      ),
    );
    const listening = await Promise.all(
      agents.map((a, k) => {
        const l = nextMessage<Extract<FromAgents, { t: 'listening' }>>(a, 'listening', FLOOR_AGENT_ANSWER_TIMEOUT_MS);
        a.send({ t: 'listen', nodes: shares[k]!, pki, ip: agentSlot.ip } satisfies ToAgents);
        return l;
      }),
    );
    const connected = nextMessage<Extract<FromController, { t: 'connected' }>>(
      ctl,
      'connected',
      FLOOR_CONNECT_TIMEOUT_MS,
    );
    ctl.send({
      t: 'setup',
      agents: listening.map((l, k) => ({ ip: agentSlot.ip, port: l.port, nodes: shares[k]! })),
      pki,
      dir,
    } satisfies ToController);
    const c = await connected;
    if (c.failed.length > 0) problems.push(`floor: dials failed: ${c.failed.join('; ')}`);
    say(`floor: ${o.n} agents connected in ${c.ms} ms`);
    const ask = (): Promise<Array<Extract<FromAgents, { t: 'done' }>>> =>
      Promise.all(
        agents.map((a) => {
          const r = nextMessage<Extract<FromAgents, { t: 'done' }>>(a, 'done', FLOOR_AGENT_ANSWER_TIMEOUT_MS);
          a.send({ t: 'report' } satisfies ToAgents);
          return r;
        }),
      );
    let gen = 0;
    /** One change to every agent; resolves when all hold it (the agents count fetches across rounds). */
    const change = async () => {
      gen++;
      const started = nextMessage<Extract<FromController, { t: 'started' }>>(ctl, 'started', FLOOR_WINDOW_TIMEOUT_MS);
      ctl.send({ t: 'go', gen } satisfies ToController);
      const s = await started;
      for (;;) {
        const reports = await ask();
        if (reports.reduce((x, r) => x + r.fetched, 0) >= o.n * gen) return { s, reports, timedOut: false };
        if (nowMs() - s.t0 > FLOOR_WINDOW_TIMEOUT_MS) return { s, reports, timedOut: true };
        await sleep(FLOOR_REPORT_EVERY_MS);
      }
    };
    // a first change warms the code up (Herald's figure is its fleet's fifth or later), unmeasured
    const warm = await change();
    if (warm.timedOut) problems.push('floor: the warm-up change did not reach every agent');
    const cpu = (): number => treeSample(ctl.pid!).cpuS;
    const agentsCpu = (): number => agents.reduce((x, a) => x + treeSample(a.pid!).cpuS, 0);
    // the agents' counters are totals over every change: a run's are the difference
    let before = {
      acked: warm.reports.reduce((x, r) => x + r.acked, 0),
      fetched: warm.reports.reduce((x, r) => x + r.fetched, 0),
    };
    const runs: FloorRun[] = [];
    const bodyBytes = documentOf('f00000', 2, paddingFor('f00000')).length;
    return {
      n: o.n,
      get runs() {
        return runs.length;
      },
      async measure(): Promise<FloorRun> {
        const idle0 = cpu();
        const idleT0 = nowMs();
        await sleep(FLOOR_SETTLE_MS);
        const idleCpuPerS = (cpu() - idle0) / ((nowMs() - idleT0) / 1000);
        const cpu0 = cpu();
        const agentsCpu0 = agentsCpu();
        const { s, reports, timedOut } = await change();
        const lastFetch = Math.max(...reports.map((r) => r.lastFetchMs));
        // CPU to the last fetch: the polling above ends within FLOOR_REPORT_EVERY_MS of it, the controller idle then
        const cpuS = cpu() - cpu0;
        const agentsCpuS = agentsCpu() - agentsCpu0;
        for (const r of reports) for (const e of r.errors) problems.push(`floor agent: ${e}`);
        const totals = {
          acked: reports.reduce((x, r) => x + r.acked, 0),
          fetched: reports.reduce((x, r) => x + r.fetched, 0),
        };
        const acked = totals.acked - before.acked;
        const fetched = totals.fetched - before.fetched;
        before = totals;
        if (fetched < o.n) problems.push(`floor: ${fetched} of ${o.n} agents fetched`);
        const run: FloorRun = {
          commitMs: s.commitMs,
          allAckedMs: round(Math.max(...reports.map((r) => r.lastAckMs)) - s.t0, 1),
          allFetchedMs: round(lastFetch - s.t0, 1),
          acked,
          fetched,
          controllerCpuS: round(cpuS, 3),
          cpuPerAgentMs: round((cpuS * 1000) / o.n, 3),
          idleCpuPerS: round(idleCpuPerS, 4),
          agentsCpuS: round(agentsCpuS, 2),
          timedOut,
        };
        runs.push(run);
        say(
          `floor N=${o.n} run ${runs.length}: commit ${run.commitMs} ms, all acked ${run.allAckedMs} ms, all fetched ${run.allFetchedMs} ms; controller CPU ${run.controllerCpuS} s (${run.cpuPerAgentMs} ms per agent), agents ${run.agentsCpuS} s`,
        );
        return run;
      },
      result(): FloorResult {
        const mid = [...runs].sort((a, b) => a.cpuPerAgentMs - b.cpuPerAgentMs)[Math.floor((runs.length - 1) / 2)]!;
        return {
          n: o.n,
          bodyBytes,
          connectMs: c.ms,
          agentProcs: FLOOR_AGENT_PROCS,
          ...mid,
          runs: [...runs],
          problems,
        };
      },
      stop,
    };
  } catch (err) {
    stop();
    throw err;
  }
}

/** Runs the floor once at N agents and reports it. Every process it starts is gone when it returns. */
export async function floorPhase(o: { pki: BenchPki; runDir: string; n: number }): Promise<FloorResult> {
  const bed = await startFloor(o);
  try {
    await bed.measure();
    return bed.result();
  } finally {
    bed.stop();
  }
}

if (process.argv[1] === entry) {
  if (process.argv[2] === 'controller') void controllerMain();
  else if (process.argv[2] === 'agents') agentsMain();
}
