/**
 * Heat-shaped deployment metadata (SPEC §5) and the name rules both sides enforce (SPEC §4): the
 * controller refuses bad names when a config is created, the agent again before it runs one.
 */
import { RefusalError } from './errors.js';

export const INPUT_TYPES = ['String', 'Number', 'CommaDelimitedList', 'Json', 'Boolean'] as const;
export type InputType = (typeof INPUT_TYPES)[number];

/** Heat's resource actions, plus RESTART for cluster restarts. */
export const DEPLOY_ACTIONS = ['CREATE', 'UPDATE', 'DELETE', 'SUSPEND', 'RESUME', 'CHECK', 'RESTART'] as const;
export type DeployAction = (typeof DEPLOY_ACTIONS)[number];
export const DEFAULT_ACTIONS: DeployAction[] = ['CREATE', 'UPDATE'];

export const GROUP_RE = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export const IO_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

/** Input names that would steer a loader, an interpreter or a shell, refused outright. */
const FORBIDDEN_INPUT_NAMES = new Set([
  'PATH', 'HOME', 'SHELL', 'ENV', 'BASH_ENV', 'IFS', 'CDPATH', 'GLOBIGNORE', 'SHELLOPTS', 'BASHOPTS', 'PS4',
  'PROMPT_COMMAND', 'NODE_OPTIONS', 'NODE_PATH', 'PYTHONPATH', 'PYTHONHOME', 'PYTHONSTARTUP', 'PYTHONINSPECT',
  'PERL5LIB', 'PERL5OPT', 'PERLLIB', 'RUBYLIB', 'RUBYOPT', 'GCONV_PATH', 'LOCPATH', 'NLSPATH', 'HOSTALIASES',
  'RES_OPTIONS', 'TMPDIR', 'JAVA_TOOL_OPTIONS', '_JAVA_OPTIONS', 'GIT_EXEC_PATH', 'GIT_SSH', 'GIT_SSH_COMMAND',
  'TZDIR', 'LANG', 'LANGUAGE', 'heat_outputs_path',
]);
const FORBIDDEN_INPUT_PREFIXES = ['LD_', 'DYLD_', 'BASH_FUNC_', 'LC_', 'MALLOC_', 'GLIBC_', 'HERALD_'];

/** Inputs Herald derives for every item (SPEC §5); a config may not declare them itself. */
export const DERIVED_INPUT_NAMES = [
  'deploy_server_id', 'deploy_action', 'deploy_stack_id', 'deploy_resource_name',
  'deploy_signal_transport', 'deploy_signal_id', 'deploy_signal_verb',
] as const;

/** The outputs every signal reports beside the declared ones. */
export const STANDARD_OUTPUT_NAMES = ['deploy_stdout', 'deploy_stderr', 'deploy_status_code'] as const;

export function isForbiddenInputName(name: string): boolean {
  return FORBIDDEN_INPUT_NAMES.has(name) || FORBIDDEN_INPUT_PREFIXES.some((p) => name.startsWith(p));
}

/** @throws RefusalError bad_name */
export function checkGroupName(name: unknown, field = 'group'): string {
  if (typeof name !== 'string' || !GROUP_RE.test(name)) throw new RefusalError('bad_name', `${field} must match ${GROUP_RE.source}`, { field });
  return name;
}

/** @throws RefusalError bad_name | forbidden_input */
export function checkInputName(name: unknown, field = 'inputs.name'): string {
  if (typeof name !== 'string' || !IO_NAME_RE.test(name)) throw new RefusalError('bad_name', `${field} must match ${IO_NAME_RE.source}`, { field });
  if (isForbiddenInputName(name)) throw new RefusalError('forbidden_input', `input name ${name} would steer a loader or shell`, { field });
  return name;
}

/** @throws RefusalError bad_name */
export function checkOutputName(name: unknown, field = 'outputs.name'): string {
  if (typeof name !== 'string' || !IO_NAME_RE.test(name)) throw new RefusalError('bad_name', `${field} must match ${IO_NAME_RE.source}`, { field });
  return name;
}

export interface MetadataInput {
  name: string;
  type: InputType;
  value: unknown;
  description?: string;
  /**
   * Set when any config that feeds the deployment (for a cluster's deployments, every config of
   * the cluster) marks this input hidden: the agent masks its value in hook output (SPEC §4).
   */
  hidden?: true;
}

export interface MetadataOutput {
  name: string;
  type: InputType;
  error_output: boolean;
}

/** One deployment item, as Heat shapes it, plus Herald's `deployment_id`, `revision`, `signalled`. */
export interface MetadataItem {
  id: string;
  name: string;
  group: string;
  creation_time: string;
  config: unknown;
  inputs: MetadataInput[];
  outputs: MetadataOutput[];
  options: Record<string, unknown>;
  deployment_id: string;
  revision: number;
  signalled: boolean;
}

export interface MetadataDocument {
  node: string;
  generation: number;
  deployments: MetadataItem[];
}

/** A component config (SPEC §5). */
export interface ComponentConfig {
  configs: Array<{ actions: string[]; tool: string; config: unknown }>;
}

/** The body an agent posts to the signal route. */
export interface SignalBody {
  revision: number;
  deploy_status_code: number;
  deploy_stdout: string;
  deploy_stderr: string;
  outputs: Record<string, unknown>;
  status_reason?: string;
}

/** The marker put where the start of a trimmed stdout or stderr was cut. */
export function cutMarker(bytes: number): string {
  return `[herald: ${bytes} bytes cut]\n`;
}

/**
 * Makes a signal fit the controller's signal body limit, so that a result is never refused for
 * its size (and never jams the agent's outbox): stdout and stderr keep their tails (the end of a
 * log is where the error is), shrinking until the JSON fits; as a last resort the outputs are
 * dropped and the deployment fails with the reason `signal_too_large`.
 */
export function fitSignalBody(body: SignalBody, maxBytes: number): SignalBody {
  const size = (b: SignalBody) => Buffer.byteLength(JSON.stringify(b), 'utf8');
  if (size(body) <= maxBytes) return body;
  let keep = Math.floor(maxBytes / 4);
  let fitted: SignalBody = body;
  while (keep >= 1024) {
    fitted = { ...body, deploy_stdout: tail(body.deploy_stdout, keep), deploy_stderr: tail(body.deploy_stderr, keep) };
    if (size(fitted) <= maxBytes) return fitted;
    keep = Math.floor(keep / 2);
  }
  return {
    revision: body.revision,
    deploy_status_code: body.deploy_status_code === 0 ? -1 : body.deploy_status_code,
    deploy_stdout: tail(body.deploy_stdout, 1024),
    deploy_stderr: tail(body.deploy_stderr, 1024),
    outputs: {},
    status_reason: 'signal_too_large: the outputs did not fit the signal limit and were dropped',
  };
}

/** The last `maxChars` characters of `s` (JSON escaping may grow them), with a cut marker. */
function tail(s: string, maxChars: number): string {
  if (s.length <= maxChars) return s;
  return cutMarker(Buffer.byteLength(s.slice(0, s.length - maxChars), 'utf8')) + s.slice(s.length - maxChars);
}
