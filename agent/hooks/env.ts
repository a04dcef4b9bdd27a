/**
 * The hook's environment, built from scratch (docs/architecture.md): of the agent's own only PATH, HOME,
 * LANG and LC_*; then the inputs and `heat_outputs_path`. Key paths, credentials and HERALD_*
 * variables of the agent never reach a hook.
 */
import { DEFAULT_PATH, inheritedEnv } from '../../protocol/child-env.js';
import type { MetadataInput } from '../../protocol/heat.js';

export { DEFAULT_PATH };

/** The part of the agent's environment a hook inherits: what every child of Herald does (protocol/child-env.ts). */
export function baseEnv(agentEnv: NodeJS.ProcessEnv): Record<string, string> {
  return inheritedEnv(agentEnv);
}

/**
 * An input value as an environment string: strings as they are, numbers and booleans in their
 * usual text, null/absent as empty, lists and objects JSON-encoded (docs/protocol.md).
 */
export function inputEnvValue(value: unknown): string {
  if (typeof value === 'string') return value;
  if (value === null || value === undefined) return '';
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value);
  return JSON.stringify(value) ?? '';
}

/** The name of the first input whose value holds a NUL byte anywhere (nested strings too). */
export function inputWithNul(inputs: MetadataInput[]): string | undefined {
  for (const input of inputs) if (hasNul(input.value, 0)) return input.name;
  return undefined;
}

function hasNul(v: unknown, depth: number): boolean {
  if (typeof v === 'string') return v.includes('\0');
  if (depth > 64 || typeof v !== 'object' || v === null) return false;
  if (Array.isArray(v)) return v.some((x) => hasNul(x, depth + 1));
  return Object.entries(v).some(([k, x]) => k.includes('\0') || hasNul(x, depth + 1));
}

/** The environment of a `script` run. Input names must have been checked already. */
export function scriptEnv(
  agentEnv: NodeJS.ProcessEnv,
  inputs: MetadataInput[],
  outputsPath: string,
): Record<string, string> {
  const env = baseEnv(agentEnv);
  for (const input of inputs) env[input.name] = inputEnvValue(input.value);
  env.heat_outputs_path = outputsPath;
  return env;
}
