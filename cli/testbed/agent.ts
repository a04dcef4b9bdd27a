/**
 * A real `herald agent` process of the testbed (docs/development.md, "The testbed"). Started, it
 * is not waited for: a caller waits for what it needs, that it listens (`started()`, which also
 * tells the port the kernel gave to `--listen <host>:0`) or that a controller accepted its
 * endpoint (`announced()`), or for something the controller shows.
 */
import fs from 'node:fs';
import { loggedPort, spawnHerald, type HeraldProcess, type SpawnOptions } from './process.js';
import { waitFor } from './wait.js';

/** How long an agent may take to listen or to have its endpoint accepted, unless told. */
export const AGENT_READY_TIMEOUT_MS = 30_000;

export interface AgentOptions extends Omit<SpawnOptions, 'args' | 'name'> {
  node: string;
  /** The name the process is known by (default `agent-<node>`). */
  label?: string | undefined;
  /** `--pki` (unless `args` gives it). */
  pki?: string | undefined;
  /** `--controller`: every controller's URL (joined with commas). */
  controllers: readonly string[];
  /** `--controller-id` (default: none given, `controller`); `*` accepts any controller of the trust domain. */
  controllerId?: string | undefined;
  /**
   * `--listen` (default `127.0.0.1:0`: the kernel picks, and the agent announces what it picked);
   * null: none (an agent that only dials out, `--dial-out` in `args`).
   */
  listen?: string | null | undefined;
  /** `--advertise`. */
  advertise?: string | undefined;
  /** `--state-dir`. */
  stateDir: string;
  /** `--hooks-dir` (made, 0755, when missing). */
  hooksDir?: string | undefined;
  /** `--poll-interval`, e.g. `30s`. */
  pollInterval?: string | undefined;
  /** More `herald agent` options, after the testbed's (where one is given twice, the later wins). */
  args?: readonly string[] | undefined;
}

export interface TestbedAgent {
  readonly node: string;
  readonly proc: HeraldProcess;
  readonly stateDir: string;
  readonly hooksDir: string | undefined;
  /** Its whole `herald agent` command line (for a start again with the same options). */
  readonly args: readonly string[];
  /**
   * Resolves with the port it listens on once it logged "agent started".
   * @throws TestbedError `exited` or `timeout`
   */
  started(timeoutMs?: number): Promise<number>;
  /**
   * Resolves once it logged "endpoint announced" (a controller accepted its endpoint).
   * @throws TestbedError `exited` or `timeout`
   */
  announced(timeoutMs?: number): Promise<void>;
}

/** Starts an agent (see AgentOptions); does not wait for it. */
export function startAgent(o: AgentOptions): TestbedAgent {
  if (o.hooksDir !== undefined) fs.mkdirSync(o.hooksDir, { recursive: true, mode: 0o755 });
  const args = [
    'agent',
    '--node',
    o.node,
    '--controller',
    o.controllers.join(','),
    ...(o.controllerId !== undefined ? ['--controller-id', o.controllerId] : []),
    ...(o.listen === null ? [] : ['--listen', o.listen ?? '127.0.0.1:0']),
    ...(o.advertise !== undefined ? ['--advertise', o.advertise] : []),
    ...(o.pki !== undefined ? ['--pki', o.pki] : []),
    '--state-dir',
    o.stateDir,
    ...(o.hooksDir !== undefined ? ['--hooks-dir', o.hooksDir] : []),
    ...(o.pollInterval !== undefined ? ['--poll-interval', o.pollInterval] : []),
    ...(o.args ?? []),
  ];
  const proc = spawnHerald({ ...o, name: o.label ?? `agent-${o.node}`, args });
  const wait = <T>(what: string, fn: () => T | undefined, timeoutMs = AGENT_READY_TIMEOUT_MS) =>
    waitFor(`${proc.name} ${what}`, fn, { timeoutMs, watch: [proc] });
  return {
    node: o.node,
    proc,
    stateDir: o.stateDir,
    hooksDir: o.hooksDir,
    args,
    started: (ms) => wait('to listen', () => startedPortIn(proc.log()), ms),
    announced: async (ms) => {
      await wait('to have its endpoint accepted', () => proc.log().includes('"endpoint announced"'), ms);
    },
  };
}

/** The port in the last "agent started" line (pino JSON) of `text`, if it holds one. */
export function startedPortIn(text: string): number | undefined {
  return loggedPort(text, 'agent started');
}
