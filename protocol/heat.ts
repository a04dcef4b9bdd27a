/**
 * Heat-shaped deployment metadata (docs/protocol.md) and the name rules both sides enforce (docs/architecture.md): the
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

/**
 * One rule of the input-name refusal list (docs/architecture.md): an exact name, or a family (every name that
 * starts with `prefix`). Exported whole so that docs/hook-inputs.md shows the same list and a
 * test keeps the two in step.
 */
export interface ForbiddenInputRule {
  /** The name, or the prefix of the family. */
  match: string;
  kind: 'name' | 'prefix';
  /** What the variable makes a loader, interpreter or shell do. */
  why: string;
}

const exact = (match: string, why: string): ForbiddenInputRule => ({ match, kind: 'name', why });
const family = (match: string, why: string): ForbiddenInputRule => ({ match, kind: 'prefix', why });

/**
 * Input names that steer a loader, an interpreter or a shell into running code or reading files
 * of someone else's choosing, refused by family (`forbidden_input`) on both sides: the controller
 * when a config or deployment names one, the agent again before it runs an item. Families are
 * wide on purpose: a new variable of a known family (`PYTHONWARNINGS`, `GIT_CONFIG_COUNT`) is
 * refused without a change here.
 */
export const FORBIDDEN_INPUT_RULES: readonly ForbiddenInputRule[] = Object.freeze([
  // the dynamic loader and the C library
  family('LD_', 'dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT load code into every program'),
  family('DYLD_', 'the macOS dynamic loader (DYLD_INSERT_LIBRARIES)'),
  family('GCONV_', 'glibc loads iconv modules from GCONV_PATH'),
  family('MALLOC_', 'glibc allocator tuning and checks'),
  family('GLIBC_', 'glibc tunables (GLIBC_TUNABLES)'),
  exact('LOCPATH', 'glibc reads locale data from here'),
  exact('NLSPATH', 'message catalogues read from here'),
  exact('HOSTALIASES', 'host name aliases read from this file'),
  exact('RES_OPTIONS', 'resolver options'),
  exact('TZDIR', 'time zone files read from here'),
  exact('TMPDIR', 'where programs create temporary files'),
  // shells
  exact('PATH', 'where every command is looked up'),
  exact('HOME', 'where shells and tools read their start-up files'),
  exact('SHELL', 'the shell programs start for commands'),
  exact('ENV', 'a POSIX sh or ksh sources this file at start'),
  family(
    'BASH_',
    'bash: BASH_ENV is sourced at start, BASH_FUNC_* define functions, BASH_XTRACEFD, BASH_LOADABLES_PATH',
  ),
  exact('BASHOPTS', 'bash options at start'),
  exact('SHELLOPTS', 'shell options at start'),
  exact('IFS', 'how the shell splits words'),
  exact('CDPATH', 'where cd looks for directories'),
  exact('GLOBIGNORE', 'what globbing skips'),
  exact('FPATH', 'ksh and zsh autoload functions from here'),
  exact('ZDOTDIR', 'zsh reads its start-up files from here'),
  exact('PS1', 'prompt: expanded (and run) by an interactive shell'),
  exact('PS2', 'prompt: expanded (and run) by an interactive shell'),
  exact('PS3', 'prompt of select'),
  exact('PS4', 'the xtrace prefix, expanded (command substitution included) for every traced line'),
  family('PROMPT_', 'PROMPT_COMMAND runs before every prompt'),
  // interpreters and runtimes
  family('PYTHON', 'Python: PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONWARNINGS (imports a module), ...'),
  family('PERL', 'Perl: PERL5OPT, PERL5LIB, PERL5DB, PERLLIB, PERLIO, ...'),
  family('RUBY', 'Ruby: RUBYOPT, RUBYLIB'),
  family('GEM_', 'RubyGems: GEM_PATH, GEM_HOME (where gems are loaded from)'),
  family('NODE_', 'Node.js: NODE_OPTIONS (--require), NODE_PATH, NODE_EXTRA_CA_CERTS, ...'),
  family('NPM_CONFIG_', 'npm configuration (script-shell, node-options, ...)'),
  family('npm_config_', 'npm configuration (script-shell, node-options, ...)'),
  exact('JAVA_TOOL_OPTIONS', 'every JVM adds these options (-javaagent)'),
  exact('_JAVA_OPTIONS', 'every JVM adds these options (-javaagent)'),
  exact('JDK_JAVA_OPTIONS', 'the java launcher adds these options (-javaagent)'),
  exact('CLASSPATH', 'where the JVM loads classes from'),
  family('DOTNET_', '.NET: DOTNET_STARTUP_HOOKS load an assembly into every process'),
  family('COREHOST_', '.NET host tracing (COREHOST_TRACEFILE writes where it is told)'),
  family('LUA_', 'Lua: LUA_INIT runs code at start, LUA_PATH, LUA_CPATH'),
  exact('PHPRC', 'PHP reads php.ini from here (auto_prepend_file)'),
  exact('PHP_INI_SCAN_DIR', 'PHP reads extra .ini files from here'),
  exact('TCLLIBPATH', 'Tcl loads packages from here'),
  // tools that run or trust what a variable names
  family('GIT_', 'git: GIT_CONFIG_* (core.pager, core.sshCommand), GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_ASKPASS, ...'),
  family('OPENSSL_', 'OpenSSL: OPENSSL_CONF loads engines and providers, OPENSSL_MODULES'),
  family('SSL_CERT_', 'OpenSSL trust store: SSL_CERT_FILE, SSL_CERT_DIR'),
  exact('SSH_ASKPASS', 'ssh runs this program for a passphrase'),
  exact('SUDO_ASKPASS', 'sudo runs this program for a password'),
  exact('PAGER', 'many tools run this program for output'),
  exact('MANPAGER', 'man runs this program for output'),
  exact('EDITOR', 'tools run this program to edit'),
  exact('VISUAL', 'tools run this program to edit'),
  exact('LESSOPEN', 'less runs this command on every file it opens'),
  exact('LESSCLOSE', 'less runs this command on every file it closes'),
  // the hook's own environment, which Herald sets
  family('LC_', "locale: Herald passes the agent's own LC_* to hooks"),
  exact('LANG', "locale: Herald passes the agent's own LANG"),
  exact('LANGUAGE', 'message language list'),
  family('HERALD_', "Herald's own settings"),
  exact('heat_outputs_path', 'Herald sets it: where the hook writes its outputs'),
]);

const FORBIDDEN_INPUT_NAMES = new Set(FORBIDDEN_INPUT_RULES.filter((r) => r.kind === 'name').map((r) => r.match));
const FORBIDDEN_INPUT_PREFIXES = FORBIDDEN_INPUT_RULES.filter((r) => r.kind === 'prefix').map((r) => r.match);

/** Inputs Herald derives for every item (docs/protocol.md); a config may not declare them itself. */
export const DERIVED_INPUT_NAMES = [
  'deploy_server_id',
  'deploy_action',
  'deploy_stack_id',
  'deploy_resource_name',
  'deploy_signal_transport',
  'deploy_signal_id',
  'deploy_signal_verb',
] as const;

/** The outputs every signal reports beside the declared ones. */
export const STANDARD_OUTPUT_NAMES = ['deploy_stdout', 'deploy_stderr', 'deploy_status_code'] as const;

/** The rule that refuses `name`, if one does. */
export function forbiddenInputRule(name: string): ForbiddenInputRule | undefined {
  if (FORBIDDEN_INPUT_NAMES.has(name)) return FORBIDDEN_INPUT_RULES.find((r) => r.kind === 'name' && r.match === name);
  return FORBIDDEN_INPUT_RULES.find((r) => r.kind === 'prefix' && name.startsWith(r.match));
}

export function isForbiddenInputName(name: string): boolean {
  return FORBIDDEN_INPUT_NAMES.has(name) || FORBIDDEN_INPUT_PREFIXES.some((p) => name.startsWith(p));
}

/** @throws RefusalError bad_name */
export function checkGroupName(name: unknown, field = 'group'): string {
  if (typeof name !== 'string' || !GROUP_RE.test(name))
    throw new RefusalError('bad_name', `${field} must match ${GROUP_RE.source}`, { field });
  return name;
}

/** @throws RefusalError bad_name | forbidden_input */
export function checkInputName(name: unknown, field = 'inputs.name'): string {
  if (typeof name !== 'string' || !IO_NAME_RE.test(name))
    throw new RefusalError('bad_name', `${field} must match ${IO_NAME_RE.source}`, { field });
  const rule = forbiddenInputRule(name);
  if (rule !== undefined) {
    const what = rule.kind === 'prefix' ? `the ${rule.match}* family` : rule.match;
    throw new RefusalError(
      'forbidden_input',
      `input name ${name} would steer a loader, interpreter or shell (${what}: ${rule.why})`,
      { field },
    );
  }
  return name;
}

/** @throws RefusalError bad_name */
export function checkOutputName(name: unknown, field = 'outputs.name'): string {
  if (typeof name !== 'string' || !IO_NAME_RE.test(name))
    throw new RefusalError('bad_name', `${field} must match ${IO_NAME_RE.source}`, { field });
  return name;
}

export interface MetadataInput {
  name: string;
  type: InputType;
  value: unknown;
  description?: string;
  /**
   * Set when any config that feeds the deployment (for a cluster's deployments, every config of
   * the cluster) marks this input hidden: the agent masks its value in hook output (docs/architecture.md).
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

/** A component config (docs/protocol.md). */
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
