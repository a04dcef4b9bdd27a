/**
 * The agent process (docs/architecture.md): the parts are assembled by `assembleAgent()` (assemble.ts) from
 * the dependencies a process has: pino on stderr, the system clock, `Math.random`, the real hook
 * runner, this process's uid and file system. Everything else in agent/ receives what it needs.
 *
 * Start: check the certificate is `agent/<node>`, recover interrupted items, drain the outbox,
 * listen, announce the endpoint, fetch and apply. Stop (SIGTERM/SIGINT): no new work; a running
 * hook may finish within AGENT_SHUTDOWN_GRACE_MS, then its group is killed and the item
 * signalled as interrupted.
 */
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import type { Logger as PinoLogger } from 'pino';
import { pkiPaths } from '../certs/paths.js';
import { assembleAgent, type AgentConfig, type AgentDeps } from './assemble.js';

export { DEFAULT_AGENT_CONFIG, formatHostPort, type AgentConfig, type HostPort } from './assemble.js';

// CommonJS, so require()d: see the note in listener.ts (idle RSS)
const { pino } = createRequire(import.meta.url)('pino') as typeof import('pino');

export interface RunningAgent {
  /** The bound listener port (0 without a listener: `--dial-out` alone). */
  port: number;
  log: PinoLogger;
  /** Stops everything; resolves when done. Idempotent. */
  stop(reason?: string): Promise<void>;
}

/**
 * Starts the agent. `deps` replaces what a process would use (a test hands in a clock); the
 * logger is pino on stderr at `cfg.logLevel` (else HERALD_LOG_LEVEL, else info).
 * @throws ConfigError naming the option when the configuration or PKI is unusable
 */
export async function startAgent(cfg: AgentConfig, deps: Partial<Omit<AgentDeps, 'log'>> = {}): Promise<RunningAgent> {
  const log = pino(
    { name: 'herald-agent', level: cfg.logLevel ?? process.env.HERALD_LOG_LEVEL ?? 'info', base: { node: cfg.node } },
    pino.destination({ fd: 2, sync: true }),
  );
  const agent = await assembleAgent(cfg, { ...deps, log });
  // after the start-up checks, so that a refusal stays one line
  const p = pkiPaths(cfg.pki);
  for (const secret of [p.caKey, p.signingJwk, ...controllerKeyFiles(p.roleDir('controller'))]) {
    if (readable(secret))
      log.warn(
        { file: secret },
        'this agent can read a CA or controller secret; it belongs on the CA host or controller only',
      );
  }
  const port = await agent.start();
  return { port, log, stop: agent.stop };
}

/** The controllers' own signing keys (`controller/<name>.jwk`, docs/several-controllers.md) in `dir`, if any. */
function controllerKeyFiles(dir: string): string[] {
  try {
    return fs
      .readdirSync(dir)
      .filter((f) => f.endsWith('.jwk'))
      .map((f) => path.join(dir, f));
  } catch {
    return [];
  }
}

function readable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.R_OK);
    return true;
  } catch {
    return false;
  }
}
