/**
 * `herald agent enroll` (docs/adding-nodes.md): a node with nothing but a join token and the CA's
 * fingerprint gets its certificate. The key is made here and never leaves the node; the
 * controller's TLS chain is checked against the fingerprint before a byte is sent, and the
 * request then goes over a connection OpenSSL verifies against that CA, to the expected
 * controller identity; the answer is written in the PKI layout of docs/configuration.md (keys 0600, every file atomic).
 * A connection error, a 429 or a 503 is tried again a few times with the same key, so an answer
 * lost on the way is asked for again and the controller gives the same certificate
 * (controller/service/enroll-replay.ts, docs/adding-nodes.md). The key is kept (0600) until its
 * certificate is installed, so a later run of the command asks with it again (`pendingKeyPath`).
 * Also the files both enrolment and renewal
 * install (`installCertificate`).
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { makeCsr } from '../certs/csr.js';
import { ensureDir, PRIVATE_FILE_MODE, PUBLIC_FILE_MODE, writeFileAtomic } from '../certs/files.js';
import { identityOf, trustDomainOf } from '../certs/identity.js';
import { pkiPaths } from '../certs/paths.js';
import { tlsCodeOf } from '../certs/tls-codes.js';
import { fullJitterMs } from '../protocol/backoff.js';
import { normalizeFingerprint, type CertificateBundle, type EnrollRequest } from '../protocol/enroll.js';
import { HeraldError, isErrorCode, RefusalError, type ErrorCode } from '../protocol/errors.js';
import { spiffeIdOf } from '../protocol/identity.js';
import {
  API_REQUEST_TIMEOUT_MS,
  ENROLL_CLIENT_BACKOFF_BASE_MS,
  ENROLL_CLIENT_BACKOFF_MAX_MS,
  ENROLL_CLIENT_RETRY_AFTER_MAX_S,
  ENROLL_CLIENT_RETRY_BUDGET_MS,
  MAX_ENROLL_BODY_BYTES,
  RSA_KEY_BITS,
} from '../protocol/limits.js';
import { netCodeOf } from '../protocol/net-codes.js';
import { tunnelVia, type DialProxy } from './dial-proxy.js';

export interface EnrollOptions {
  /** `https://host:port` of the controller API. */
  controller: string;
  /** SHA-256 of ca.crt's DER (hex, colons allowed). */
  caSha256: string;
  token: string;
  node: string;
  /** Where the PKI layout (docs/configuration.md) is written. */
  pki: string;
  /** The controller must present `controller/<name>` (default `controller`). */
  controllerId?: string;
  /** Replace an existing agent/<node> key and certificate. */
  force?: boolean;
  /** Default API_REQUEST_TIMEOUT_MS, for each of the two connections. */
  timeoutMs?: number;
  /**
   * The HTTP CONNECT proxy of `HTTPS_PROXY` and `NO_PROXY` (docs/dial-out.md): both connections go
   * through its tunnel when it covers the controller's host. Absent: they are direct.
   */
  proxy?: DialProxy | undefined;
  /**
   * How long after the first try another may start, on a connection error, a 429 or a 503
   * (default ENROLL_CLIENT_RETRY_BUDGET_MS).
   */
  retryBudgetMs?: number;
  now?: () => number;
  /** Told before each wait between tries (the CLI prints one line). */
  onRetry?: (r: RetryNote) => void;
  sleep?: (ms: number) => Promise<void>;
  random?: () => number;
}

/** One failed try that is tried again. */
export interface RetryNote {
  /** The try that failed, from 1. */
  attempt: number;
  code: ErrorCode;
  waitMs: number;
  /** What is left of the retry budget once this wait is over. */
  leftMs: number;
}

export interface EnrollResult {
  spiffeId: string;
  certPath: string;
  keyPath: string;
  notAfter: string;
  serial: string;
}

/** A new RSA key (PKCS#8 PEM) made by Node, off the main thread. */
export function newKeyPem(): Promise<string> {
  return new Promise((resolve, reject) =>
    crypto.generateKeyPair('rsa', { modulusLength: RSA_KEY_BITS }, (err, _pub, key) =>
      err ? reject(err) : resolve(key.export({ type: 'pkcs8', format: 'pem' }) as string),
    ),
  );
}

/**
 * The key an enrolment made before asking, kept beside where the key goes until a certificate is
 * installed for it: a later run (a cloud-init retry after its answer was lost, the token spent)
 * asks with the same key, and the controller gives that key's certificate again
 * (controller/service/enroll-replay.ts) instead of refusing a new key.
 */
export function pendingKeyPath(pki: string, node: string): string {
  return `${pkiPaths(pki).key('agent', node)}.enrolling`;
}

/** The pending key of an earlier run, if one is there and parses; else a new one, kept there (0600) first. */
async function enrolmentKey(pki: string, node: string): Promise<string> {
  const file = pendingKeyPath(pki, node);
  try {
    const pem = fs.readFileSync(file, 'utf8');
    crypto.createPrivateKey(pem);
    return pem;
  } catch {
    // none (the first run), or not a key: a new one replaces it
  }
  const pem = await newKeyPem();
  ensureDir(pki);
  ensureDir(pkiPaths(pki).roleDir('agent'));
  writeFileAtomic(file, pem, PRIVATE_FILE_MODE);
  return pem;
}

/**
 * Enrols the node. Before it asks, it writes only the pending key (`pendingKeyPath`, 0600), or
 * reuses the one an earlier run left there; the rest is written once the controller issued a
 * certificate, and the pending key is then removed.
 * @throws HeraldError `bad_option` (a key exists without `force`, a bad URL or fingerprint),
 *   `ca_fingerprint_mismatch` (nothing was sent), the controller's code (`enrollment_refused`,
 *   `rate_limited`, `enrollment_disabled`), `wrong_peer`, or a network error
 */
export async function enroll(o: EnrollOptions): Promise<EnrollResult> {
  const fingerprint = normalizeFingerprint(o.caSha256);
  const url = controllerUrl(o.controller);
  const paths = pkiPaths(o.pki);
  if (!o.force && (fs.existsSync(paths.key('agent', o.node)) || fs.existsSync(paths.cert('agent', o.node))))
    throw new HeraldError(
      'bad_option',
      `${paths.cert('agent', o.node)} exists already: this node is enrolled (--force replaces it)`,
    );
  const timeoutMs = o.timeoutMs ?? API_REQUEST_TIMEOUT_MS;
  const via = o.proxy !== undefined ? tunnelVia(o.proxy, timeoutMs) : undefined;
  const retry = retryPolicy(o);
  const ca = await retry(async () => {
    try {
      return { ok: true, value: await pinnedCa(url, fingerprint, timeoutMs, via) };
    } catch (err) {
      return failedTry(url, err);
    }
  });
  const trustDomain = trustDomainOf(ca);
  const controllerSpiffeId = spiffeIdOf(trustDomain, 'controller', o.controllerId ?? 'controller');
  const spiffeId = spiffeIdOf(trustDomain, 'agent', o.node);
  const keyPem = await enrolmentKey(o.pki, o.node);
  const body: EnrollRequest = {
    token: o.token,
    node: o.node,
    csr: makeCsr({ keyPem, commonName: o.node, uris: [spiffeId] }),
  };
  // the same key and request every try: a try whose answer was lost spent the token, and the
  // controller gives the same certificate again for the same key
  let tried = 0;
  const res = await retry(async () => {
    tried++;
    let a: JsonAnswer;
    try {
      a = await postJson(url, '/v1/enroll', body, {
        ca: ca.toString(),
        expected: controllerSpiffeId,
        trustDomain,
        timeoutMs,
        via,
      });
    } catch (err) {
      return failedTry(url, err);
    }
    if (a.status === 200) return { ok: true, value: a };
    const error = answerError(a);
    if (error.code === 'enrollment_refused' && tried > 1)
      return {
        ok: false,
        retryable: false,
        error: new RefusalError(
          error.code,
          `${error.message} (an earlier try may have spent the token where its answer was lost: make a new token)`,
        ),
      };
    return { ok: false, retryable: a.status === 429 || a.status === 503, retryAfterS: a.retryAfterS, error };
  });
  const bundle = res.json as CertificateBundle;
  const id = identityOf(bundle.certificate, trustDomain);
  if (id.spiffeId !== spiffeId)
    throw new RefusalError('bad_response', `the controller issued ${id.spiffeId}, not ${spiffeId}`);
  const written = installBundle(o.pki, o.node, keyPem, bundle);
  fs.rmSync(pendingKeyPath(o.pki, o.node), { force: true });
  return { spiffeId, ...written, notAfter: id.validTo.toISOString(), serial: id.serial };
}

/**
 * Writes what enrolment answered in the PKI layout (docs/configuration.md): the key first (0600), then the certificate,
 * ca.crt, wake-signing.jwks and revoked.json, each atomically.
 */
export function installBundle(
  pki: string,
  node: string,
  keyPem: string,
  bundle: CertificateBundle,
): { certPath: string; keyPath: string } {
  const p = pkiPaths(pki);
  ensureDir(pki);
  ensureDir(p.roleDir('agent'));
  writeFileAtomic(p.caCrt, bundle.ca, PUBLIC_FILE_MODE);
  writeFileAtomic(p.jwks, `${JSON.stringify(bundle.jwks, null, 2)}\n`, PUBLIC_FILE_MODE);
  writeFileAtomic(p.revoked, `${JSON.stringify(bundle.revoked, null, 2)}\n`, PUBLIC_FILE_MODE);
  return installCertificate(p.cert('agent', node), p.key('agent', node), keyPem, bundle.certificate);
}

/**
 * Replaces a key and certificate: the key first, then the certificate, each atomically. A
 * PkiMaterial watching them keeps its last good pair until both match (certs/tls.ts).
 */
export function installCertificate(
  certPath: string,
  keyPath: string,
  keyPem: string,
  certificate: string,
): { certPath: string; keyPath: string } {
  writeFileAtomic(keyPath, keyPem, PRIVATE_FILE_MODE);
  writeFileAtomic(certPath, certificate, PUBLIC_FILE_MODE);
  return { certPath, keyPath };
}

function controllerUrl(s: string): URL {
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    throw new HeraldError('bad_option', `--controller ${JSON.stringify(s)} is not a URL`);
  }
  if (u.protocol !== 'https:' || u.pathname.replace(/\/+$/, '') !== '' || u.search || u.hash || u.username)
    throw new HeraldError('bad_option', `--controller must be https://host:port, not ${JSON.stringify(s)}`);
  return u;
}

function hostOf(u: URL): string {
  return u.hostname.replace(/^\[|\]$/g, '');
}

/**
 * Connects without trusting anything, takes the chain the controller presents, and returns the
 * CA certificate (PEM) whose SHA-256 is `fingerprint`: a self-signed CA that the controller's
 * certificate chains to. Sends nothing; the connection is closed at once.
 * @throws RefusalError `ca_fingerprint_mismatch`
 */
function pinnedCa(u: URL, fingerprint: string, timeoutMs: number, via?: Via): Promise<Buffer> {
  const host = hostOf(u);
  const port = Number(u.port || 443);
  const tunnel = via?.(host, port);
  if (tunnel === undefined) return pinnedCaOver(u, fingerprint, timeoutMs, undefined);
  return tunnel.then((socket) => pinnedCaOver(u, fingerprint, timeoutMs, socket));
}

/** `pinnedCa` over `socket` (a proxy's tunnel), or over a direct connection. */
function pinnedCaOver(u: URL, fingerprint: string, timeoutMs: number, socket: net.Socket | undefined): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const host = hostOf(u);
    const s = tls.connect({
      host,
      port: Number(u.port || 443),
      ...(socket !== undefined ? { socket } : {}),
      ...(net.isIP(host) === 0 ? { servername: host } : {}),
      rejectUnauthorized: false,
      minVersion: 'TLSv1.3',
      maxVersion: 'TLSv1.3',
    });
    const timer = setTimeout(
      () => s.destroy(new HeraldError('dial_timeout', 'the controller did not answer the TLS handshake')),
      timeoutMs,
    );
    s.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    s.once('secureConnect', () => {
      clearTimeout(timer);
      // the chain first (NODE20-NOTES: getPeerX509Certificate alone would take it)
      const chain: crypto.X509Certificate[] = [];
      const seen = new Set<string>();
      for (let c: tls.DetailedPeerCertificate | undefined = s.getPeerCertificate(true); c?.raw; ) {
        const fp = c.fingerprint256;
        if (seen.has(fp)) break;
        seen.add(fp);
        chain.push(new crypto.X509Certificate(c.raw));
        c = c.issuerCertificate;
      }
      s.destroy();
      const ca = chain.find(
        (c) => crypto.createHash('sha256').update(c.raw).digest('hex') === fingerprint && c.ca && c.checkIssued(c),
      );
      const leaf = chain[0];
      const chained =
        ca !== undefined &&
        leaf !== undefined &&
        chain
          .slice(0, chain.indexOf(ca) + 1)
          .every((c, i, a) => i === a.length - 1 || (c.checkIssued(a[i + 1]!) && c.verify(a[i + 1]!.publicKey)));
      if (!ca || !chained) {
        reject(
          new RefusalError(
            'ca_fingerprint_mismatch',
            `the controller at ${u.host} does not present a chain to the CA with SHA-256 ${fingerprint}; nothing was sent`,
          ),
        );
        return;
      }
      resolve(Buffer.from(ca.toString()));
    });
  });
}

type Try<T> =
  | { ok: true; value: T }
  | { ok: false; retryable: boolean; error: HeraldError; retryAfterS?: number | undefined };

/**
 * Runs a try until it succeeds, fails for good, or the retry budget (ENROLL_CLIENT_RETRY_BUDGET_MS
 * from the first try) would be over before the next one; waits the controller's Retry-After plus
 * jitter (so a boot storm does not come back all at once) or, without one, full jitter doubling
 * from ENROLL_CLIENT_BACKOFF_BASE_MS to ENROLL_CLIENT_BACKOFF_MAX_MS. A Retry-After over
 * ENROLL_CLIENT_RETRY_AFTER_MAX_S ends the tries with the controller's code.
 */
/** Errors `enroll` gave up on that may pass (a connection error, a 429, a 503): see `mayPass`. */
const passing = new WeakSet<object>();

/**
 * Whether `enroll` failed for a reason that may pass (a connection error, a 429, a 503 after its
 * own tries): running it again later may succeed. False for a definite refusal (a spent or wrong
 * token, a wrong CA fingerprint, a bad option, a TLS refusal).
 */
export function mayPass(err: unknown): boolean {
  return typeof err === 'object' && err !== null && passing.has(err);
}

function retryPolicy(o: EnrollOptions): <T>(once: () => Promise<Try<T>>) => Promise<T> {
  const budgetMs = o.retryBudgetMs ?? ENROLL_CLIENT_RETRY_BUDGET_MS;
  const now = o.now ?? Date.now;
  const sleep = o.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  const random = o.random ?? Math.random;
  return async (once) => {
    const start = now();
    for (let attempt = 1; ; attempt++) {
      const r = await once();
      if (r.ok) return r.value;
      if (r.retryable) passing.add(r.error);
      if (!r.retryable) throw r.error;
      if (r.retryAfterS !== undefined && r.retryAfterS > ENROLL_CLIENT_RETRY_AFTER_MAX_S) throw r.error;
      const jitterMs = fullJitterMs(attempt - 1, ENROLL_CLIENT_BACKOFF_BASE_MS, ENROLL_CLIENT_BACKOFF_MAX_MS, random);
      const waitMs = (r.retryAfterS ?? 0) * 1000 + jitterMs;
      const leftMs = start + budgetMs - (now() + waitMs);
      if (leftMs < 0) throw r.error;
      o.onRetry?.({ attempt, code: r.error.code, waitMs, leftMs });
      await sleep(waitMs);
    }
  };
}

/**
 * A try that threw: a connection error (tried again) or a TLS refusal (not), as a coded error
 * with one readable line; a coded error as it is.
 */
function failedTry(u: URL, err: unknown): Try<never> {
  if (err instanceof HeraldError) return { ok: false, retryable: err.code === 'dial_timeout', error: err };
  const net = netCodeOf(err);
  const message = err instanceof Error ? err.message.split('\n')[0]! : String(err);
  if (net !== undefined)
    return {
      ok: false,
      retryable: true,
      error: new RefusalError(net, `the controller at ${u.host}: ${message}`, { cause: err }),
    };
  const code = (err as { code?: unknown } | null)?.code;
  const tls = typeof code === 'string' ? tlsCodeOf(code) : undefined;
  return {
    ok: false,
    retryable: false,
    error: new RefusalError(tls ?? 'tls_error', `the controller at ${u.host}: ${message}`, { cause: err }),
  };
}

interface JsonAnswer {
  status: number;
  json: unknown;
  text: string;
  /** The answer's Retry-After in whole seconds, when it has one. */
  retryAfterS?: number | undefined;
}

/** One POST over TLS 1.3 verified by OpenSSL against `ca`, to the server `expected` only. */
export function postJson(
  u: URL,
  path: string,
  body: unknown,
  o: {
    ca: string;
    expected: string;
    trustDomain: string;
    timeoutMs: number;
    cert?: string;
    key?: string;
    /** A proxy's tunnel to the controller (`tunnelVia`); absent: a direct connection. */
    via?: Via | undefined;
  },
): Promise<JsonAnswer> {
  const data = Buffer.from(JSON.stringify(body));
  const host = hostOf(u);
  const port = Number(u.port || 443);
  const via = o.via;
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host,
        port,
        method: 'POST',
        path,
        ...(via === undefined
          ? { agent: false }
          : {
              // no agent: the request's own connection, TLS (with the options below) over the tunnel
              ...(net.isIP(host) === 0 ? { servername: host } : {}),
              createConnection: (
                args: http.ClientRequestArgs,
                cb: (err: Error | null, socket: Duplex) => void,
              ): tls.TLSSocket | undefined => {
                const opts = args as tls.ConnectionOptions;
                const tunnel = via(host, port);
                if (tunnel === undefined) return tls.connect(opts);
                tunnel.then(
                  (socket) => cb(null, tls.connect({ ...opts, socket })),
                  (err: Error) => cb(err, undefined as never),
                );
                return undefined;
              },
            }),
        ca: o.ca,
        ...(o.cert !== undefined ? { cert: o.cert, key: o.key } : {}),
        minVersion: 'TLSv1.3',
        maxVersion: 'TLSv1.3',
        rejectUnauthorized: true,
        checkServerIdentity: (_host, cert) => {
          try {
            const id = identityOf(cert, o.trustDomain);
            return id.spiffeId === o.expected
              ? undefined
              : new RefusalError('wrong_peer', `the server is ${id.spiffeId}, not ${o.expected}`);
          } catch (err) {
            return err as Error;
          }
        },
        headers: { 'content-type': 'application/json', 'content-length': String(data.length) },
        timeout: o.timeoutMs,
      },
      (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          // a bundle is a few KiB; a JWKS or revoked list of a big fleet stays far below this
          if (size > 64 * MAX_ENROLL_BODY_BYTES) req.destroy(new RefusalError('response_too_large'));
          else chunks.push(c);
        });
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json: unknown;
          try {
            json = JSON.parse(text);
          } catch {
            json = undefined;
          }
          const retryAfter = Number(res.headers['retry-after']);
          resolve({
            status: res.statusCode ?? 0,
            json,
            text,
            retryAfterS: Number.isInteger(retryAfter) && retryAfter >= 0 ? retryAfter : undefined,
          });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new HeraldError('dial_timeout', 'the controller did not answer in time')));
    req.on('error', reject);
    req.end(data);
  });
}

/** Opens a proxy's tunnel to host:port, or undefined for a direct connection (`tunnelVia`). */
type Via = ReturnType<typeof tunnelVia>;

/** The controller's coded refusal as a HeraldError (`bad_response` when it sent no code). */
export function answerError(res: JsonAnswer): HeraldError {
  const code = (res.json as { error?: { code?: unknown } } | undefined)?.error?.code;
  const message = (res.json as { error?: { message?: unknown } } | undefined)?.error?.message;
  if (isErrorCode(code))
    return new RefusalError(code, `the controller answered ${res.status} ${code}: ${String(message ?? '')}`);
  return new RefusalError('bad_response', `the controller answered ${res.status}: ${res.text.slice(0, 200)}`);
}
