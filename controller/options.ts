/**
 * `herald controller` options, from (highest first) the command line, the environment
 * (`HERALD_CONTROLLER_<OPTION>`), a JSON config file (`--config`, keys as the long options) and
 * the defaults. Everything is checked here, before anything starts, and a mistake names the
 * option (ConfigError `bad_option`).
 */
import fs from 'node:fs';
import net from 'node:net';
import { availableParallelism } from 'node:os';
import { ConfigError } from '../protocol/errors.js';
import { isValidName, TRUST_DOMAIN_RE } from '../protocol/identity.js';
import {
  AGENT_CERT_LIFETIME_S,
  AUDIT_CHECKPOINT_INTERVAL_MS,
  CONNECT_DRAIN_WINDOW_MAX_MS,
  CONNECT_DRAIN_WINDOW_MS,
  DEFAULT_CONTROLLER_PORT,
  MAX_DEFAULT_PUSH_WORKER_PROCESSES,
  MAX_JOIN_TOKEN_TTL_S,
  MAX_PUSH_WORKER_PROCESSES,
  MIN_AGENT_CERT_LIFETIME_S,
} from '../protocol/limits.js';

export interface HostPort {
  host: string;
  port: number;
}

export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
const LOG_LEVELS: LogLevel[] = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

export interface ControllerOptions {
  listen: HostPort;
  pki: string;
  db: string;
  /** The controller's certificate name (`<pki>/controller/<name>.crt`). */
  name: string;
  /** Undefined: read from the PKI (pki.json, else the CA's SPIFFE SAN). */
  trustDomain: string | undefined;
  healthListen: HostPort | null;
  autoRegister: boolean;
  /** Base URL agents reach the API at (`deploy_signal_id`); default from --listen. */
  publicUrl: string | null;
  /** Push worker processes; 0 runs the dialer in the API process. */
  pushWorkers: number;
  /** Where agents dial in (`wss://<here>/v1/connect`, docs/protocol.md "Dialled-in connections"); null or absent: off. */
  connectListen?: HostPort | null | undefined;
  /** The window a stop closes the dialled-in connections over (default CONNECT_DRAIN_WINDOW_MS). */
  connectDrainMs?: number | undefined;
  logLevel: LogLevel;
  /** Overrides of the PKI layout's files. */
  ca: string | undefined;
  cert: string | undefined;
  key: string | undefined;
  signingKey: string | undefined;
  /**
   * The issuing CA `<pki>/issuer/<name>` the controller signs agent certificates with (docs/adding-nodes.md); undefined: none.
   */
  issuer?: string | undefined;
  /** Lifetime of the agent certificates enrolment and renewal issue (`--agent-cert-lifetime`). */
  agentCertLifetimeS?: number | undefined;
  /** How often the audit chain's head is signed (`--audit-checkpoint-interval`, default AUDIT_CHECKPOINT_INTERVAL_MS). */
  auditCheckpointIntervalMs?: number | undefined;
  /** Serve Heat's object store here (docs/heat.md); null: off. */
  objectStoreListen?: HostPort | null | undefined;
  /** The accounts (projects) whose metadata writes may make deployments on Herald nodes. */
  heatProjects?: string[] | undefined;
  /** Who may call it with a token: a file of token digests (standalone Heat)... */
  objectStoreTokens?: string | undefined;
  /** ...or Keystone, through the credentials in this file (a cloud). */
  keystoneCredentials?: string | undefined;
  keystoneCa?: string | undefined;
  /** The roles a Keystone token must hold on the account's project. */
  keystoneRoles?: string[] | undefined;
  /**
   * Operators (names) who hold admin over the whole fleet whatever the database's grants say
   * (docs/access.md); default `['admin']`, the operator `herald certs init` makes.
   */
  bootstrapAdmins?: string[] | undefined;
}

/** Option name (long, kebab-case) → key of ControllerOptions. */
const KEYS = {
  listen: 'listen',
  pki: 'pki',
  db: 'db',
  name: 'name',
  'trust-domain': 'trustDomain',
  'health-listen': 'healthListen',
  'auto-register': 'autoRegister',
  'public-url': 'publicUrl',
  'push-workers': 'pushWorkers',
  'connect-listen': 'connectListen',
  'connect-drain-ms': 'connectDrainMs',
  'log-level': 'logLevel',
  ca: 'ca',
  cert: 'cert',
  key: 'key',
  'signing-key': 'signingKey',
  issuer: 'issuer',
  'agent-cert-lifetime': 'agentCertLifetimeS',
  'audit-checkpoint-interval': 'auditCheckpointIntervalMs',
  'object-store-listen': 'objectStoreListen',
  'object-store-tokens': 'objectStoreTokens',
  'heat-project': 'heatProjects',
  'keystone-credentials': 'keystoneCredentials',
  'keystone-ca': 'keystoneCa',
  'keystone-roles': 'keystoneRoles',
  'bootstrap-admin': 'bootstrapAdmins',
} as const;
type OptionName = keyof typeof KEYS;

/**
 * The push workers a controller starts when `--push-workers` is not given: one fewer than the
 * cores it may run on, from 1 to MAX_DEFAULT_PUSH_WORKER_PROCESSES (1 for a count that is not a
 * number). The workers sign and send a change's wake-ups and write the fetches' answers, each
 * for its shard of the nodes: one worker spent ~0.25 ms of CPU a woken node in the 10,000-agent
 * fan-out (BENCHMARKS.md, gross, on two shared cores), so one worker alone puts a large change
 * seconds behind one core. The core left over is the main process's, which answers every fetch.
 */
export function defaultPushWorkers(cores: number): number {
  if (!Number.isFinite(cores)) return 1;
  return Math.min(MAX_DEFAULT_PUSH_WORKER_PROCESSES, Math.max(1, Math.floor(cores) - 1));
}

/** Raw values by option name, each as a string, boolean or number. */
export type RawOptions = Partial<Record<OptionName, string | boolean | number>>;

export function envName(option: string): string {
  return `HERALD_CONTROLLER_${option.toUpperCase().replace(/-/g, '_')}`;
}

/** Options set in the environment. */
export function fromEnv(env: NodeJS.ProcessEnv): RawOptions & { config?: string } {
  const out: RawOptions & { config?: string } = {};
  for (const name of Object.keys(KEYS) as OptionName[]) {
    const v = env[envName(name)];
    if (v !== undefined && v !== '') out[name] = v;
  }
  // docs/several-controllers.md names the database HERALD_DB; HERALD_CONTROLLER_DB wins when both are set
  if (out.db === undefined && env.HERALD_DB) out.db = env.HERALD_DB;
  const config = env[envName('config')];
  if (config) out.config = config;
  return out;
}

/**
 * Options from a JSON config file: an object whose keys are the long option names.
 * @throws ConfigError naming the file and the bad key
 */
export function fromConfigFile(file: string): RawOptions {
  let j: unknown;
  try {
    j = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(`--config ${file}: ${(err as Error).message}`, { cause: err, field: 'config' });
  }
  if (typeof j !== 'object' || j === null || Array.isArray(j))
    throw new ConfigError(`--config ${file}: must hold a JSON object`, { field: 'config' });
  const out: RawOptions = {};
  for (const [k, v] of Object.entries(j)) {
    if (!(k in KEYS))
      throw new ConfigError(
        `--config ${file}: unknown key "${k}" (keys are the long option names: ${Object.keys(KEYS).join(', ')})`,
        { field: k },
      );
    if (typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'boolean')
      throw new ConfigError(`--config ${file}: "${k}" must be a string, number or boolean`, { field: k });
    out[k as OptionName] = v;
  }
  return out;
}

/**
 * Merges the sources (cli over env over file over defaults) and checks every value. `cores`: what
 * the default number of push workers follows (defaultPushWorkers).
 * @throws ConfigError bad_option naming the option
 */
export function resolveOptions(
  cli: RawOptions & { config?: string },
  env: NodeJS.ProcessEnv = process.env,
  cores: number = availableParallelism(),
): ControllerOptions {
  const e = fromEnv(env);
  const configFile = cli.config ?? e.config;
  const file = configFile ? fromConfigFile(configFile) : {};
  const pick = (name: OptionName): string | boolean | number | undefined => cli[name] ?? e[name] ?? file[name];
  const str = (name: OptionName): string | undefined => {
    const v = pick(name);
    if (v === undefined) return undefined;
    if (typeof v !== 'string' || v.trim() === '')
      throw new ConfigError(`--${name} must be a non-empty string`, { field: name });
    return v.trim();
  };

  const listen = parseHostPort(str('listen') ?? `127.0.0.1:${DEFAULT_CONTROLLER_PORT}`, 'listen');
  const pki = str('pki');
  if (!pki) throw new ConfigError(`--pki <dir> is required (or ${envName('pki')})`, { field: 'pki' });
  const db = str('db');
  if (!db)
    throw new ConfigError(
      `--db <file|postgres://...> is required (or ${envName('db')} / HERALD_DB); the controller keeps its state there`,
      {
        field: 'db',
      },
    );
  const name = str('name') ?? 'controller';
  if (!isValidName(name))
    throw new ConfigError(`--name ${JSON.stringify(name)} must match ^[a-z0-9][a-z0-9._-]{0,62}$`, { field: 'name' });
  const trustDomain = str('trust-domain');
  if (trustDomain !== undefined && !TRUST_DOMAIN_RE.test(trustDomain))
    throw new ConfigError(`--trust-domain ${JSON.stringify(trustDomain)} is not a lowercase DNS-like name`, {
      field: 'trust-domain',
    });
  const hl = str('health-listen');
  const healthListen = hl === undefined ? null : parseHostPort(hl, 'health-listen');
  const autoRegister = parseBool(pick('auto-register') ?? true, 'auto-register');
  const pu = str('public-url');
  let publicUrl: string | null = null;
  if (pu !== undefined) {
    let u: URL;
    try {
      u = new URL(pu);
    } catch {
      throw new ConfigError(`--public-url ${JSON.stringify(pu)} is not a URL`, { field: 'public-url' });
    }
    if (u.protocol !== 'https:' || u.search || u.hash || u.username)
      throw new ConfigError('--public-url must be https://host[:port] (no query, fragment or user)', {
        field: 'public-url',
      });
    publicUrl = u.toString().replace(/\/+$/, '');
  }
  const pw = pick('push-workers') ?? defaultPushWorkers(cores);
  const pushWorkers = typeof pw === 'number' ? pw : Number(pw);
  if (!Number.isInteger(pushWorkers) || pushWorkers < 0 || pushWorkers > MAX_PUSH_WORKER_PROCESSES) {
    throw new ConfigError(
      `--push-workers must be a whole number from 0 (dialer in the API process) to ${MAX_PUSH_WORKER_PROCESSES}`,
      { field: 'push-workers' },
    );
  }
  const cl = str('connect-listen');
  const connectListen = cl === undefined ? null : parseHostPort(cl, 'connect-listen');
  const cd = pick('connect-drain-ms') ?? CONNECT_DRAIN_WINDOW_MS;
  const connectDrainMs = typeof cd === 'number' ? cd : Number(cd);
  if (!Number.isInteger(connectDrainMs) || connectDrainMs < 0 || connectDrainMs > CONNECT_DRAIN_WINDOW_MAX_MS)
    throw new ConfigError(`--connect-drain-ms must be a whole number of ms from 0 to ${CONNECT_DRAIN_WINDOW_MAX_MS}`, {
      field: 'connect-drain-ms',
    });
  const issuer = str('issuer');
  if (issuer !== undefined && !isValidName(issuer))
    throw new ConfigError(`--issuer ${JSON.stringify(issuer)} must match ^[a-z0-9][a-z0-9._-]{0,62}$`, {
      field: 'issuer',
    });
  const lifetime = str('agent-cert-lifetime');
  const agentCertLifetimeS = lifetime === undefined ? AGENT_CERT_LIFETIME_S : parseLifetimeS(lifetime);
  const checkpoints = str('audit-checkpoint-interval');
  const auditCheckpointIntervalMs =
    checkpoints === undefined ? AUDIT_CHECKPOINT_INTERVAL_MS : parseCheckpointIntervalMs(checkpoints);
  const osl = str('object-store-listen');
  const objectStoreListen = osl === undefined ? null : parseHostPort(osl, 'object-store-listen');
  const objectStoreTokens = str('object-store-tokens');
  const keystoneCredentials = str('keystone-credentials');
  if (objectStoreListen && (objectStoreTokens === undefined) === (keystoneCredentials === undefined))
    throw new ConfigError(
      '--object-store-listen needs exactly one of --object-store-tokens <file> (standalone Heat) and --keystone-credentials <file> (a cloud): docs/heat.md',
      { field: objectStoreTokens === undefined ? 'object-store-tokens' : 'keystone-credentials' },
    );
  const hp = str('heat-project');
  const heatProjects =
    hp === undefined
      ? undefined
      : hp
          .split(',')
          .map((p) => p.trim())
          .filter((p) => p !== '');
  if (objectStoreListen && (heatProjects === undefined || heatProjects.length === 0))
    throw new ConfigError(
      "--object-store-listen needs --heat-project <project,...>: the projects whose Heat may make deployments on Herald's nodes (any other account is a plain object store): docs/heat.md",
      { field: 'heat-project' },
    );
  const roles = str('keystone-roles');
  const keystoneRoles =
    roles === undefined
      ? undefined
      : roles
          .split(',')
          .map((r) => r.trim())
          .filter((r) => r !== '');
  if (keystoneRoles !== undefined && keystoneRoles.length === 0)
    throw new ConfigError('--keystone-roles must name at least one role', { field: 'keystone-roles' });
  const bootstrapAdmins = parseBootstrapAdmins(str('bootstrap-admin') ?? DEFAULT_BOOTSTRAP_ADMIN);
  const logLevel = (str('log-level') ?? 'info') as LogLevel;
  if (!LOG_LEVELS.includes(logLevel))
    throw new ConfigError(`--log-level must be one of ${LOG_LEVELS.join(', ')}`, { field: 'log-level' });
  return {
    listen,
    pki,
    db,
    name,
    trustDomain,
    healthListen,
    autoRegister,
    publicUrl,
    pushWorkers,
    connectListen,
    connectDrainMs,
    logLevel,
    ca: str('ca'),
    cert: str('cert'),
    key: str('key'),
    signingKey: str('signing-key'),
    issuer,
    agentCertLifetimeS,
    auditCheckpointIntervalMs,
    objectStoreListen,
    objectStoreTokens,
    heatProjects,
    keystoneCredentials,
    keystoneCa: str('keystone-ca'),
    keystoneRoles,
    bootstrapAdmins,
  };
}

/** The operator `herald certs init` makes, and so the default of --bootstrap-admin. */
export const DEFAULT_BOOTSTRAP_ADMIN = 'admin';

/**
 * `--bootstrap-admin`: operator names, comma-separated, or `none`.
 * @throws ConfigError naming the option
 */
export function parseBootstrapAdmins(s: string): string[] {
  if (s.trim() === 'none') return [];
  const names = s.split(',').map((n) => n.trim());
  for (const n of names)
    if (!isValidName(n))
      throw new ConfigError(
        `--bootstrap-admin ${JSON.stringify(s.slice(0, 200))}: ${JSON.stringify(n.slice(0, 80))} is not an operator name (^[a-z0-9][a-z0-9._-]{0,62}$); give names separated by commas, or none`,
        { field: 'bootstrap-admin' },
      );
  return [...new Set(names)];
}

const LIFETIME_UNITS_S: Record<string, number> = { s: 1, m: 60, h: 3_600, d: 86_400 };

/**
 * `--agent-cert-lifetime`: a duration like `7d`, `12h` or `90s`, from MIN_AGENT_CERT_LIFETIME_S
 * up to the longest join token lifetime (7 days) times 52 (a year).
 * @throws ConfigError naming the option
 */
export function parseLifetimeS(s: string): number {
  const m = /^(\d+)([smhd])$/.exec(s.trim());
  const v = m ? Number(m[1]) * LIFETIME_UNITS_S[m[2]!]! : Number.NaN;
  const max = MAX_JOIN_TOKEN_TTL_S * 52;
  if (!Number.isSafeInteger(v) || v < MIN_AGENT_CERT_LIFETIME_S || v > max)
    throw new ConfigError(
      `--agent-cert-lifetime ${JSON.stringify(s)} must be a duration like 7d, 12h or 90s, from ${MIN_AGENT_CERT_LIFETIME_S}s to ${max / 86_400}d`,
      { field: 'agent-cert-lifetime' },
    );
  return v;
}

/**
 * `--audit-checkpoint-interval`: a duration like `60s`, `5m` or `1h`, from 1 s to 1 day (docs/access.md).
 * @throws ConfigError naming the option
 */
export function parseCheckpointIntervalMs(s: string): number {
  const m = /^(\d+)([smh])$/.exec(s.trim());
  const v = m ? Number(m[1]) * LIFETIME_UNITS_S[m[2]!]! : Number.NaN;
  if (!Number.isSafeInteger(v) || v < 1 || v > 86_400)
    throw new ConfigError(
      `--audit-checkpoint-interval ${JSON.stringify(s)} must be a duration like 60s, 5m or 1h, from 1s to 24h`,
      { field: 'audit-checkpoint-interval' },
    );
  return v * 1000;
}

/**
 * `host:port` or `[v6]:port`; port 0 to 65535.
 * @throws ConfigError naming `option`
 */
export function parseHostPort(s: string, option: string): HostPort {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(s.trim());
  const host = m?.[1] ?? m?.[2];
  const port = Number(m?.[3]);
  if (!m || !host || !Number.isInteger(port) || port > 65535)
    throw new ConfigError(`--${option} ${JSON.stringify(s)} must be host:port (IPv6 as [addr]:port)`, {
      field: option,
    });
  if (m[1] !== undefined && !net.isIPv6(host))
    throw new ConfigError(`--${option}: ${host} is not an IPv6 address`, { field: option });
  return { host, port };
}

function parseBool(v: string | boolean | number, option: string): boolean {
  if (typeof v === 'boolean') return v;
  const s = String(v).trim().toLowerCase();
  if (['1', 'true', 'yes', 'on'].includes(s)) return true;
  if (['0', 'false', 'no', 'off'].includes(s)) return false;
  throw new ConfigError(`--${option} must be true or false`, { field: option });
}
