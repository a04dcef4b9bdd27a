/**
 * The V8 flags an agent process sets for itself, first thing, before its modules load
 * (docs/agent-footprint.md). `node` is started by whoever starts the agent (bin/herald, a systemd
 * unit, a test), so the agent cannot count on its command line and sets them at run time.
 *
 * `--no-opt`: no TurboFan. An agent's JavaScript never runs hot enough to gain from it (the
 * heavy parts, TLS, signatures, JSON, spawning hooks, are native), and the first function it
 * optimises, during start-up module resolution or later at any hour, pages in ~3.5 MB of the
 * optimising compiler's code for the life of the process. Measured here (2 cores): idle RSS
 * 53.5 → 49.8 MB; per deployment item the agent's CPU is the same either way (15-19 ms, most of
 * it native: the hook's fork, TLS, signatures, fdatasync; docs/agent-footprint.md). Ignition and
 * Sparkplug (the baseline compiler) still run.
 */
import v8 from 'node:v8';

/** What `applyAgentV8Flags` sets. */
export const AGENT_V8_FLAGS: readonly string[] = ['--no-opt'];

/** Flags on node's own command line that say the operator chose the optimiser themselves. */
const OPERATOR_CHOICE = /^--(no-)?(opt|turbofan)$/;

/**
 * Sets AGENT_V8_FLAGS, unless node was started with `--opt`/`--turbofan` (or their `--no-`
 * forms) on its command line or in NODE_OPTIONS: that choice stands.
 */
export function applyAgentV8Flags(): void {
  const given = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/)];
  if (given.some((a) => OPERATOR_CHOICE.test(a))) return;
  for (const f of AGENT_V8_FLAGS) v8.setFlagsFromString(f);
}
