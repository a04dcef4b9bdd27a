/**
 * Who may call Herald's object store with a token: may the `X-Auth-Token` of a request act on the
 * account `/v1/AUTH_<project>`? (docs/heat.md, "Who may call the object store".) TempURL requests
 * never come here. Two answers behind one interface:
 *
 * - `keystoneValidator` (a cloud): asks Keystone v3 (`GET /v3/auth/tokens`) with the controller's
 *   own service token, then requires the token's project to be the account's and one of the
 *   configured roles on it (Swift's keystoneauth `operator_roles`, default admin and swiftoperator).
 *   Keystone's answers are kept by the token's SHA-256 for a bounded time and number.
 * - `staticTokenValidator` (standalone Heat, noauth): a file of SHA-256 digests of tokens, each
 *   line optionally scoped to a project, compared in constant time and re-read when it changes.
 *
 * `check` never throws: a refusal carries a code (protocol/errors.ts) and a reason for the log;
 * `token_unverifiable` means Herald could not decide (Keystone unreachable or failing, the file
 * unreadable), and the caller answers 503 so the client retries. A token itself is never kept,
 * logged or put in a reason: only its digest.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import type { Logger } from 'pino';
import { ConfigError } from '../../protocol/errors.js';
import {
  KEYSTONE_INVALID_TOKEN_CACHE_ENTRIES,
  KEYSTONE_INVALID_TOKEN_CACHE_MS,
  KEYSTONE_MAX_REQUESTS_IN_FLIGHT,
  KEYSTONE_MAX_RESPONSE_BYTES,
  KEYSTONE_REQUEST_TIMEOUT_MS,
  KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS,
  KEYSTONE_TOKEN_CACHE_ENTRIES,
  KEYSTONE_TOKEN_CACHE_MS,
  MAX_OBJECT_STORE_TOKEN_BYTES,
  MAX_STATIC_TOKEN_FILE_BYTES,
} from '../../protocol/limits.js';
import { RefusalSummary } from '../../protocol/refusal-summary.js';

export interface TokenVerdict {
  ok: true;
  /** The account's project (the part after AUTH_). */
  project: string;
  /** Keystone: the user's id (names repeat across domains). Static file: the line's name. */
  user: string;
  /** The token's roles as Keystone names them; none for a static token. */
  roles: string[];
  /** When the token expires, ms since the epoch; Infinity for a static token (it holds until its line goes). */
  expiresAtMs: number;
}

export interface TokenRefusal {
  ok: false;
  code: 'token_invalid' | 'token_wrong_project' | 'token_role_missing' | 'token_unverifiable';
  /** For the log: never holds the token. */
  reason: string;
}

export interface TokenValidator {
  /** May `token` act on the account of `project` (the part after AUTH_)? Never throws. */
  check(token: string, project: string): Promise<TokenVerdict | TokenRefusal>;
  /** Idempotent; later checks answer `token_unverifiable`. */
  close(): void;
}

/** Swift keystoneauth's default `operator_roles`: the roles that own an account of their project. */
export const DEFAULT_OPERATOR_ROLES: readonly string[] = ['admin', 'swiftoperator'];

const refuse = (code: TokenRefusal['code'], reason: string): TokenRefusal => ({ ok: false, code, reason });

/** SHA-256 of a token, lowercase hex: the only form in which a token is kept or written down. */
export function tokenDigest(token: string): string {
  return crypto.createHash('sha256').update(token, 'utf8').digest('hex');
}

/** A token fit to send on in a header: printable ASCII without spaces, at most MAX_OBJECT_STORE_TOKEN_BYTES. */
function wellFormed(token: string): boolean {
  return token.length > 0 && token.length <= MAX_OBJECT_STORE_TOKEN_BYTES && /^[\x21-\x7e]+$/.test(token);
}

/** Refuses at start a file group or others may write (`bad`: 0o022), or also read (0o077, for secrets). */
function checkMode(file: string, mode: number, bad: number, option: string): void {
  if ((mode & bad) !== 0)
    throw new ConfigError(
      `${option} ${file} is mode ${(mode & 0o777).toString(8)}: group and others may not ${bad === 0o077 ? 'read or write' : 'write'} it`,
      { code: 'unsafe_file_mode', field: option },
    );
}

/** A map that forgets entries at their deadline and its oldest past `max` entries. */
class BoundedCache<V> {
  readonly #map = new Map<string, { value: V; untilMs: number }>();
  readonly #max: number;

  constructor(max: number) {
    this.#max = max;
  }

  get(key: string, now: number): V | undefined {
    const e = this.#map.get(key);
    if (!e) return undefined;
    this.#map.delete(key);
    if (e.untilMs <= now) return undefined;
    this.#map.set(key, e);
    return e.value;
  }

  set(key: string, value: V, untilMs: number): void {
    this.#map.delete(key);
    this.#map.set(key, { value, untilMs });
    while (this.#map.size > this.#max) this.#map.delete(this.#map.keys().next().value!);
  }

  clear(): void {
    this.#map.clear();
  }
}

// ---- Keystone ---------------------------------------------------------------------------------

export interface KeystoneOptions {
  /**
   * An INI file with a `[keystone_authtoken]` section as keystonemiddleware reads it: `auth_url`,
   * `username` (with `user_domain_name` or `user_domain_id`) or `user_id`, `password`,
   * `project_name` (with `project_domain_name` or `project_domain_id`) or `project_id`, optionally
   * `auth_type = password` and `cafile`; other keys are ignored, `insecure = true` is refused. It
   * holds a password: group and others may not read it.
   */
  credentialsFile: string;
  /** PEM CA bundle Keystone's certificate must chain to; default the file's `cafile`, else Node's roots. */
  caFile?: string;
  /** The token must hold one of these on the account's project, compared case-insensitively. Default DEFAULT_OPERATOR_ROLES. */
  roles?: readonly string[];
  /** Keystone failures (unreachable, refusing Herald's credentials) are logged here, summarised. */
  logger: Logger;
  /** Wall-clock ms (default Date.now): caches and token expiry. */
  now?: () => number;
  /** One request to Keystone, connect to last byte. Default KEYSTONE_REQUEST_TIMEOUT_MS. */
  timeoutMs?: number;
  /** Valid tokens kept. Default KEYSTONE_TOKEN_CACHE_ENTRIES. */
  validCacheEntries?: number;
  /** Tokens Keystone did not know, kept. Default KEYSTONE_INVALID_TOKEN_CACHE_ENTRIES. */
  invalidCacheEntries?: number;
}

interface KeystoneCredentials {
  /** Without a trailing `/v3` or `/`. */
  authUrl: string;
  cafile: string | undefined;
  /** The body of `POST /v3/auth/tokens`. */
  authBody: string;
}

/** One section of an INI file in oslo.config's syntax (`key = value`, `#`/`;` comment lines); other sections are skipped. */
function readIniSection(file: string, text: string, section: string): Map<string, string> {
  const out = new Map<string, string>();
  let current: string | undefined;
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const head = /^\[([^\]]+)\]$/.exec(line);
    if (head) {
      current = head[1]!.trim();
      continue;
    }
    if (current !== section) continue;
    const eq = line.indexOf('=');
    if (eq <= 0 || /^\s/.test(raw))
      throw new ConfigError(`${file} line ${i + 1}: not "key = value" (continued values are not read)`, {
        field: 'credentials-file',
      });
    const value = line.slice(eq + 1).trim();
    // as oslo.config: one pair of matching quotes around a value is not part of it
    const quoted = value.length >= 2 && (value[0] === '"' || value[0] === "'") && value.at(-1) === value[0];
    out.set(line.slice(0, eq).trim(), quoted ? value.slice(1, -1) : value);
  }
  return out;
}

/** Reads and checks the credentials file at start. @throws ConfigError naming what is wrong */
function readKeystoneCredentials(file: string): KeystoneCredentials {
  let st: fs.Stats;
  let text: string;
  try {
    st = fs.statSync(file);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`credentials file ${file} cannot be read: ${(err as Error).message}`, {
      field: 'credentials-file',
      cause: err,
    });
  }
  checkMode(file, st.mode, 0o077, 'credentials-file');
  const s = readIniSection(file, text, 'keystone_authtoken');
  const need = (k: string): string => {
    const v = s.get(k);
    if (!v) throw new ConfigError(`${file}: [keystone_authtoken] has no ${k}`, { field: 'credentials-file' });
    return v;
  };
  const authType = s.get('auth_type') ?? 'password';
  if (authType !== 'password' && authType !== 'v3password')
    throw new ConfigError(`${file}: auth_type ${authType}: only password is supported`, { field: 'credentials-file' });
  if (/^(1|true|yes|on)$/i.test(s.get('insecure') ?? ''))
    throw new ConfigError(`${file}: insecure = ${s.get('insecure')}: Herald always verifies Keystone's certificate`, {
      field: 'credentials-file',
    });
  let url: URL;
  try {
    url = new URL(need('auth_url'));
  } catch (err) {
    throw new ConfigError(`${file}: auth_url is not a URL`, { field: 'credentials-file', cause: err });
  }
  // the service password and every token checked travel to this URL
  if (url.protocol !== 'https:')
    throw new ConfigError(`${file}: auth_url must be https://, not ${url.protocol}`, { field: 'credentials-file' });
  const authUrl = url.href.replace(/\/+$/, '').replace(/\/v3$/, '');

  const domain = (prefix: string): { name: string } | { id: string } => {
    const id = s.get(`${prefix}_domain_id`);
    const name = s.get(`${prefix}_domain_name`);
    if (id && name)
      throw new ConfigError(`${file}: give ${prefix}_domain_id or ${prefix}_domain_name, not both`, {
        field: 'credentials-file',
      });
    if (id) return { id };
    if (name) return { name };
    throw new ConfigError(`${file}: ${prefix}_domain_name (or ${prefix}_domain_id) is missing`, {
      field: 'credentials-file',
    });
  };
  const userId = s.get('user_id');
  const user = userId
    ? { id: userId, password: need('password') }
    : { name: need('username'), domain: domain('user'), password: need('password') };
  const projectId = s.get('project_id');
  const project = projectId ? { id: projectId } : { name: need('project_name'), domain: domain('project') };
  const authBody = JSON.stringify({
    auth: { identity: { methods: ['password'], password: { user } }, scope: { project } },
  });
  return { authUrl, cafile: s.get('cafile'), authBody };
}

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

/** Keystone could not be asked, or answered something Herald cannot use: `token_unverifiable`. */
class KeystoneTrouble extends Error {
  /** One key per kind of trouble: the log summarises per key. */
  readonly key: string;

  constructor(key: string, message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.key = key;
  }
}

/** What Keystone said of a token (`GET /v3/auth/tokens`, 200). */
interface TokenFacts {
  /** undefined for a token scoped to a domain or the system, or unscoped. */
  project: string | undefined;
  user: string;
  roles: string[];
  expiresAtMs: number;
}

type Lookup = { facts: TokenFacts } | { refusal: TokenRefusal };

/** Keystone's `token` object, as far as Herald reads it. */
function factsOf(body: Buffer): TokenFacts | undefined {
  let t: unknown;
  try {
    t = (JSON.parse(body.toString('utf8')) as { token?: unknown }).token;
  } catch {
    return undefined;
  }
  if (typeof t !== 'object' || t === null) return undefined;
  const tok = t as {
    project?: { id?: unknown };
    user?: { id?: unknown; name?: unknown };
    roles?: unknown;
    expires_at?: unknown;
  };
  const expiresAtMs = typeof tok.expires_at === 'string' ? Date.parse(tok.expires_at) : Number.NaN;
  const user = tok.user?.id ?? tok.user?.name;
  if (!Number.isFinite(expiresAtMs) || typeof user !== 'string') return undefined;
  const roles = Array.isArray(tok.roles)
    ? tok.roles.map((r: { name?: unknown }) => r?.name).filter((n): n is string => typeof n === 'string')
    : [];
  const project = typeof tok.project?.id === 'string' ? tok.project.id : undefined;
  return { project, user, roles, expiresAtMs };
}

class KeystoneTokenValidator implements TokenValidator {
  readonly #creds: KeystoneCredentials;
  readonly #roles: ReadonlySet<string>;
  readonly #now: () => number;
  readonly #timeoutMs: number;
  readonly #agent: https.Agent;
  readonly #log: Logger;
  readonly #summary: RefusalSummary;
  readonly #valid: BoundedCache<TokenFacts>;
  readonly #invalid: BoundedCache<TokenRefusal>;
  /** Lookups under way, by digest: a burst of one token asks Keystone once. */
  readonly #inFlight = new Map<string, Promise<Lookup>>();
  #service: { token: string; renewAtMs: number } | undefined;
  #serviceIssuing: Promise<string> | undefined;
  #closed = false;

  constructor(o: Required<Omit<KeystoneOptions, 'caFile'>> & { creds: KeystoneCredentials; ca: Buffer | undefined }) {
    this.#creds = o.creds;
    this.#roles = new Set(o.roles.map((r) => r.toLowerCase()));
    this.#now = o.now;
    this.#timeoutMs = o.timeoutMs;
    this.#log = o.logger.child({ component: 'heat-tokens' });
    this.#agent = new https.Agent({
      keepAlive: true,
      maxSockets: KEYSTONE_MAX_REQUESTS_IN_FLIGHT + 1,
      ...(o.ca ? { ca: o.ca } : {}),
    });
    this.#valid = new BoundedCache(o.validCacheEntries);
    this.#invalid = new BoundedCache(o.invalidCacheEntries);
    this.#summary = new RefusalSummary(
      (l) => this.#log.warn({ code: l.code, count: l.count, ...l.fields }, `Keystone: ${l.fields.why} (${l.count}x)`),
      this.#now,
    );
  }

  async check(token: string, project: string): Promise<TokenVerdict | TokenRefusal> {
    try {
      if (this.#closed) return refuse('token_unverifiable', 'the token validator is closed');
      if (!wellFormed(token)) return refuse('token_invalid', 'the token is empty, too long or not printable ASCII');
      const key = tokenDigest(token);
      const now = this.#now();
      const bad = this.#invalid.get(key, now);
      if (bad) return bad;
      const known = this.#valid.get(key, now);
      const found = known ? { facts: known } : await this.#lookup(key, token);
      return 'refusal' in found ? found.refusal : this.#judge(found.facts, project);
    } catch (err) {
      this.#log.error({ err }, 'token check failed unexpectedly');
      return refuse('token_unverifiable', 'unexpected error while checking the token');
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#summary.flush(true);
    this.#agent.destroy();
    this.#valid.clear();
    this.#invalid.clear();
  }

  #judge(f: TokenFacts, project: string): TokenVerdict | TokenRefusal {
    if (f.expiresAtMs <= this.#now()) return refuse('token_invalid', 'the token has expired');
    if (f.project !== project)
      return refuse(
        'token_wrong_project',
        f.project === undefined
          ? 'the token is not scoped to a project'
          : `the token is scoped to project ${f.project}, not ${project}`,
      );
    if (!f.roles.some((r) => this.#roles.has(r.toLowerCase())))
      return refuse('token_role_missing', `the token holds none of the roles ${[...this.#roles].join(', ')}`);
    return { ok: true, project, user: f.user, roles: f.roles, expiresAtMs: f.expiresAtMs };
  }

  #lookup(key: string, token: string): Promise<Lookup> {
    const pending = this.#inFlight.get(key);
    if (pending) return pending;
    if (this.#inFlight.size >= KEYSTONE_MAX_REQUESTS_IN_FLIGHT)
      return Promise.resolve({
        refusal: this.#trouble(
          new KeystoneTrouble('busy', `${KEYSTONE_MAX_REQUESTS_IN_FLIGHT} token validations already wait for Keystone`),
        ),
      });
    const p = this.#ask(key, token)
      .catch((err: unknown): Lookup => {
        if (err instanceof KeystoneTrouble) return { refusal: this.#trouble(err) };
        throw err;
      })
      .finally(() => this.#inFlight.delete(key));
    this.#inFlight.set(key, p);
    return p;
  }

  #trouble(err: KeystoneTrouble): TokenRefusal {
    this.#summary.record('token_unverifiable', { why: err.message }, err.key);
    return refuse('token_unverifiable', `Keystone: ${err.message}`);
  }

  /** Asks Keystone about `token`, renewing the service token once if Keystone refuses it; caches the answer. */
  async #ask(key: string, token: string): Promise<Lookup> {
    let service = await this.#serviceToken();
    let a = await this.#validate(service, token);
    if (a.status === 401) {
      // keystonemiddleware's reading: a 401 is about the caller's token (ours), a 404 about the subject
      service = await this.#serviceToken(service);
      a = await this.#validate(service, token);
      if (a.status === 401)
        throw new KeystoneTrouble('service_token_refused', 'refuses a service token it has just issued (401)');
    }
    const now = this.#now();
    if (a.status === 404) {
      const r = refuse('token_invalid', 'Keystone does not know the token, or it expired or was revoked (404)');
      this.#invalid.set(key, r, now + KEYSTONE_INVALID_TOKEN_CACHE_MS);
      return { refusal: r };
    }
    if (a.status === 403)
      throw new KeystoneTrouble('forbidden', "does not let Herald's service user validate tokens (403)");
    if (a.status !== 200) throw new KeystoneTrouble(`status_${a.status}`, `answered ${a.status} to a token validation`);
    const facts = factsOf(a.body);
    if (!facts) throw new KeystoneTrouble('bad_answer', 'answered 200 without a token Herald can read');
    if (facts.expiresAtMs <= now) return { refusal: refuse('token_invalid', 'the token has expired') };
    this.#valid.set(key, facts, Math.min(now + KEYSTONE_TOKEN_CACHE_MS, facts.expiresAtMs));
    return { facts };
  }

  #validate(service: string, token: string): Promise<Answer> {
    return this.#request('GET', { 'x-auth-token': service, 'x-subject-token': token });
  }

  /**
   * The controller's own token: kept until KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS (at most half its
   * lifetime) before it expires; `refused` is one Keystone answered 401 to, renewed unless that
   * happened already. Concurrent callers share one issue.
   */
  async #serviceToken(refused?: string): Promise<string> {
    const s = this.#service;
    if (s && s.token !== refused && this.#now() < s.renewAtMs) return s.token;
    this.#serviceIssuing ??= this.#issueServiceToken().finally(() => {
      this.#serviceIssuing = undefined;
    });
    return this.#serviceIssuing;
  }

  async #issueServiceToken(): Promise<string> {
    const issuedAt = this.#now();
    const a = await this.#request('POST', { 'content-type': 'application/json' }, this.#creds.authBody);
    if (a.status === 401)
      throw new KeystoneTrouble('credentials_refused', "refuses Herald's service credentials (401)");
    if (a.status !== 201 && a.status !== 200)
      throw new KeystoneTrouble(`issue_status_${a.status}`, `answered ${a.status} when Herald asked for its token`);
    const token = a.headers['x-subject-token'];
    const facts = factsOf(a.body);
    if (typeof token !== 'string' || !wellFormed(token) || !facts)
      throw new KeystoneTrouble('bad_answer', "issued Herald's token without X-Subject-Token or expires_at");
    const lifeMs = facts.expiresAtMs - issuedAt;
    this.#service = {
      token,
      renewAtMs: facts.expiresAtMs - Math.min(KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS, lifeMs / 2),
    };
    return token;
  }

  /** One request to `{auth_url}/v3/auth/tokens?nocatalog` (the catalog is large and unused). */
  #request(method: 'GET' | 'POST', headers: Record<string, string>, body?: string): Promise<Answer> {
    const url = `${this.#creds.authUrl}/v3/auth/tokens?nocatalog`;
    return new Promise<Answer>((resolve, reject) => {
      const fail = (key: string, message: string, cause?: unknown): void => {
        req.destroy();
        reject(new KeystoneTrouble(key, message, { cause }));
      };
      const req = https.request(url, {
        method,
        agent: this.#agent,
        headers: {
          accept: 'application/json',
          ...headers,
          ...(body ? { 'content-length': Buffer.byteLength(body) } : {}),
        },
      });
      const timer = setTimeout(() => fail('timeout', `did not answer within ${this.#timeoutMs} ms`), this.#timeoutMs);
      req.on('error', (err: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        fail('unreachable', `unreachable at ${this.#creds.authUrl}: ${err.code ?? err.message}`, err);
      });
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (d: Buffer) => {
          size += d.length;
          if (size > KEYSTONE_MAX_RESPONSE_BYTES) {
            clearTimeout(timer);
            fail('too_large', `answered more than ${KEYSTONE_MAX_RESPONSE_BYTES} bytes`);
          } else chunks.push(d);
        });
        res.on('end', () => {
          clearTimeout(timer);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) });
        });
        res.on('error', (err) => {
          clearTimeout(timer);
          fail('unreachable', `connection lost: ${err.message}`, err);
        });
      });
      req.end(body);
    });
  }
}

/**
 * Validates tokens with Keystone v3 (docs/heat.md). Reads the credentials file and the CA now; asks
 * Keystone for its own token at the first check.
 * @throws ConfigError (`bad_option`, `unsafe_file_mode`) naming what is wrong with the options or the files
 */
export function keystoneValidator(o: KeystoneOptions): TokenValidator {
  const opts = {
    roles: DEFAULT_OPERATOR_ROLES,
    now: Date.now,
    timeoutMs: KEYSTONE_REQUEST_TIMEOUT_MS,
    validCacheEntries: KEYSTONE_TOKEN_CACHE_ENTRIES,
    invalidCacheEntries: KEYSTONE_INVALID_TOKEN_CACHE_ENTRIES,
    ...o,
  };
  if (opts.roles.length === 0 || opts.roles.some((r) => typeof r !== 'string' || r.trim() === ''))
    throw new ConfigError('roles: give at least one role name', { field: 'roles' });
  for (const k of ['timeoutMs', 'validCacheEntries', 'invalidCacheEntries'] as const)
    if (!Number.isInteger(opts[k]) || opts[k] <= 0)
      throw new ConfigError(`${k} must be a positive integer`, { field: k });
  const creds = readKeystoneCredentials(opts.credentialsFile);
  if (opts.caFile && creds.cafile)
    throw new ConfigError(`the CA is named twice: caFile and cafile in ${opts.credentialsFile}; give one`, {
      field: 'ca-file',
    });
  const caFile = opts.caFile ?? creds.cafile;
  let ca: Buffer | undefined;
  if (caFile) {
    try {
      ca = fs.readFileSync(caFile);
    } catch (err) {
      throw new ConfigError(`Keystone CA file ${caFile} cannot be read: ${(err as Error).message}`, {
        field: 'ca-file',
        cause: err,
      });
    }
  }
  return new KeystoneTokenValidator({ ...opts, creds, ca });
}

// ---- the static token file (standalone Heat) ----------------------------------------------------

export interface StaticTokenOptions {
  /**
   * One token a line: `<sha256 hex of the token> [<project>|*] [<name>]`; `#` starts a comment
   * line. Without a project (or with `*`) the token may act on any account. Re-read when its
   * modification time, size or inode changes. Group and others may not write it.
   */
  file: string;
  /** A file that cannot be read or parsed is logged here, once per change of the file. */
  logger: Logger;
}

interface StaticEntry {
  digest: Buffer;
  /** `*` for any project. */
  project: string;
  name: string;
}

type StaticState = { stamp: string; entries: StaticEntry[] } | { stamp: string; error: string };

/** Parses the file's text. @throws Error naming the line */
function parseStaticTokens(text: string): StaticEntry[] {
  const out: StaticEntry[] = [];
  for (const [i, raw] of text.split(/\r?\n/).entries()) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const f = line.split(/\s+/);
    const hex = f[0]!.toLowerCase();
    if (!/^[0-9a-f]{64}$/.test(hex))
      throw new Error(
        `line ${i + 1}: the first field is not a SHA-256 digest (64 hex digits); the file holds digests, not tokens`,
      );
    if (f.length > 3) throw new Error(`line ${i + 1}: more than three fields (digest, project, name)`);
    out.push({ digest: Buffer.from(hex, 'hex'), project: f[1] ?? '*', name: f[2] ?? `static:${hex.slice(0, 12)}` });
  }
  return out;
}

const stampOf = (st: fs.Stats): string => `${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}`;

class StaticTokenValidator implements TokenValidator {
  readonly #file: string;
  readonly #log: Logger;
  #state: StaticState;
  #reading: Promise<StaticState> | undefined;
  #closed = false;

  constructor(file: string, logger: Logger, state: StaticState) {
    this.#file = file;
    this.#log = logger.child({ component: 'heat-tokens', file });
    this.#state = state;
  }

  async check(token: string, project: string): Promise<TokenVerdict | TokenRefusal> {
    try {
      if (this.#closed) return refuse('token_unverifiable', 'the token validator is closed');
      if (!wellFormed(token)) return refuse('token_invalid', 'the token is empty, too long or not printable ASCII');
      const state = await this.#current();
      if ('error' in state) return refuse('token_unverifiable', `the token file is unusable: ${state.error}`);
      const digest = crypto.createHash('sha256').update(token, 'utf8').digest();
      let known = false;
      let match: StaticEntry | undefined;
      // every line is compared, in constant time each, whether or not an earlier one matched
      for (const e of state.entries) {
        if (crypto.timingSafeEqual(e.digest, digest)) {
          known = true;
          if (!match && (e.project === '*' || e.project === project)) match = e;
        }
      }
      if (match) return { ok: true, project, user: match.name, roles: [], expiresAtMs: Number.POSITIVE_INFINITY };
      return known
        ? refuse('token_wrong_project', `the token file scopes this token to other projects than ${project}`)
        : refuse('token_invalid', 'the token is not in the token file');
    } catch (err) {
      this.#log.error({ err }, 'token check failed unexpectedly');
      return refuse('token_unverifiable', 'unexpected error while checking the token');
    }
  }

  close(): void {
    this.#closed = true;
  }

  /** The file's entries as of now: re-read when its stamp changed since the last read. */
  #current(): Promise<StaticState> {
    this.#reading ??= this.#refresh().finally(() => {
      this.#reading = undefined;
    });
    return this.#reading;
  }

  async #refresh(): Promise<StaticState> {
    let next: StaticState;
    try {
      const st = await fs.promises.stat(this.#file);
      const stamp = stampOf(st);
      if (stamp === this.#state.stamp) return this.#state;
      next = { stamp, ...(await readStaticFile(this.#file, st)) };
    } catch (err) {
      // unreadable now (removed, permissions): nothing is accepted until it is back
      const e = err as NodeJS.ErrnoException;
      next = { stamp: `error:${e.code ?? e.message}`, error: e.code ?? e.message };
      if (next.stamp === this.#state.stamp) return this.#state;
    }
    this.#state = next;
    if ('error' in next) this.#log.warn({ code: 'token_unverifiable', why: next.error }, 'the token file is unusable');
    else this.#log.info({ tokens: next.entries.length }, 'the token file was read again');
    return next;
  }
}

/** Reads the file whose stat is `st`; a mistake in it is an `error`, not a throw. */
async function readStaticFile(file: string, st: fs.Stats): Promise<{ entries: StaticEntry[] } | { error: string }> {
  if ((st.mode & 0o022) !== 0) return { error: `mode ${(st.mode & 0o777).toString(8)}: group or others may write it` };
  if (!st.isFile()) return { error: 'not a regular file' };
  if (st.size > MAX_STATIC_TOKEN_FILE_BYTES) return { error: `over ${MAX_STATIC_TOKEN_FILE_BYTES} bytes` };
  try {
    return { entries: parseStaticTokens(await fs.promises.readFile(file, 'utf8')) };
  } catch (err) {
    return { error: (err as Error).message };
  }
}

/**
 * Validates tokens against a file of their digests (docs/heat.md), for Heat without Keystone.
 * @throws ConfigError (`bad_option`, `unsafe_file_mode`) when the file cannot be read or parsed at start
 */
export function staticTokenValidator(o: StaticTokenOptions): TokenValidator {
  let st: fs.Stats;
  let text: string;
  try {
    st = fs.statSync(o.file);
    text = fs.readFileSync(o.file, 'utf8');
  } catch (err) {
    throw new ConfigError(`token file ${o.file} cannot be read: ${(err as Error).message}`, {
      field: 'token-file',
      cause: err,
    });
  }
  checkMode(o.file, st.mode, 0o022, 'token-file');
  if (!st.isFile() || st.size > MAX_STATIC_TOKEN_FILE_BYTES)
    throw new ConfigError(
      `token file ${o.file} is not a regular file of at most ${MAX_STATIC_TOKEN_FILE_BYTES} bytes`,
      {
        field: 'token-file',
      },
    );
  let entries: StaticEntry[];
  try {
    entries = parseStaticTokens(text);
  } catch (err) {
    throw new ConfigError(`token file ${o.file}: ${(err as Error).message}`, { field: 'token-file' });
  }
  return new StaticTokenValidator(o.file, o.logger, { stamp: stampOf(st), entries });
}
