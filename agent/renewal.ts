/**
 * The agent renews its own certificate (docs/adding-nodes.md): once two thirds of its lifetime have passed it
 * makes a new key here, posts a CSR for the same identity and SANs over mTLS with the current
 * certificate, installs the answer atomically (key, then certificate) and reloads its material
 * at once, so the listener's server certificate and the API client's certificate change without
 * a restart ('tls-change': certs/tls.ts). A failure is retried with backoff (never later than a
 * quarter of the time left); from 90 % of the lifetime on every failure is a `renewal_overdue`
 * warning. Each attempt tells the controller how many failed before it (its node state shows
 * them). Timers and the clock are handed in, so the schedule is tested with a fake clock.
 */
import crypto from 'node:crypto';
import { identityOf } from '../certs/identity.js';
import type { Logger, PkiMaterial } from '../certs/tls.js';
import { fullJitterMs } from '../protocol/backoff.js';
import { renewAtMs, renewalWarnAtMs, type CertificateBundle, type RenewRequest } from '../protocol/enroll.js';
import { codeOf, isErrorCode, RefusalError } from '../protocol/errors.js';
import { MAX_TIMER_DELAY_MS, RENEWAL_BACKOFF_BASE_MS, RENEWAL_BACKOFF_MAX_MS } from '../protocol/limits.js';

/** Shortest wait between two attempts, so a certificate already past its time is not hammered. */
const MIN_RETRY_MS = 250;

export interface RenewerTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface RenewerOptions {
  material: PkiMaterial;
  /** The files the material reads (the agent's `agent/<node>.crt` and `.key`, or --cert/--key). */
  certPath: string;
  keyPath: string;
  /** Posts the renewal to the controller; resolves with the status and the body. */
  send: (body: RenewRequest) => Promise<{ status: number; body: Buffer }>;
  log: Logger;
  now?: () => number;
  random?: () => number;
  timers?: RenewerTimers;
  /** Makes the new key (default RSA, off the main thread). */
  newKey?: () => Promise<string>;
}

export interface RenewalStatus {
  /** Failed attempts since the last success. */
  failures: number;
  lastError: string | null;
  /** Successful renewals since start. */
  renewed: number;
  /** When the next attempt is due (epoch ms), or null when stopped. */
  nextAttemptAt: number | null;
}

export class CertificateRenewer {
  readonly #o: RenewerOptions;
  readonly #now: () => number;
  readonly #timers: RenewerTimers;
  #timer: unknown;
  #stopped = true;
  #running: Promise<void> | null = null;
  /** The key of the renewal in progress (made on its first attempt, dropped when it succeeds). */
  #pendingKey: string | null = null;
  readonly status: RenewalStatus = { failures: 0, lastError: null, renewed: 0, nextAttemptAt: null };

  constructor(o: RenewerOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
    this.#timers = o.timers ?? {
      setTimeout: (fn, ms) => {
        const t = setTimeout(fn, ms);
        t.unref();
        return t;
      },
      clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
    };
  }

  /** Schedules the first attempt at two thirds of the current certificate's lifetime. */
  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#schedule();
  }

  /** No further attempts; an attempt in flight finishes (and installs what it got). Idempotent. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#timers.clearTimeout(this.#timer);
    this.status.nextAttemptAt = null;
    await this.#running;
  }

  /** Runs one attempt now (tests; also what the timer calls). */
  attempt(): Promise<void> {
    this.#running ??= this.#attempt().finally(() => {
      this.#running = null;
    });
    return this.#running;
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timers.clearTimeout(this.#timer);
    const id = this.#o.material.current().identity;
    const from = id.validFrom.getTime();
    const to = id.validTo.getTime();
    const now = this.#now();
    let at = renewAtMs(from, to);
    if (this.status.failures > 0) {
      const backoff = fullJitterMs(
        this.status.failures,
        RENEWAL_BACKOFF_BASE_MS,
        RENEWAL_BACKOFF_MAX_MS,
        this.#o.random,
      );
      const left = Math.max(0, to - now);
      at = now + Math.max(MIN_RETRY_MS, Math.min(backoff, left / 4));
      // one attempt at the warning point itself: a renewal failing there is told while the
      // certificate still works, not only once a backoff has carried the next try past its end
      const warnAt = renewalWarnAtMs(from, to);
      if (now < warnAt) at = Math.min(at, warnAt);
    }
    const delay = Math.max(0, at - now);
    this.status.nextAttemptAt = now + delay;
    // a timer cannot wait longer than ~24.8 days (Node fires it at once): wait in steps
    this.#timer =
      delay > MAX_TIMER_DELAY_MS
        ? this.#timers.setTimeout(() => this.#schedule(), MAX_TIMER_DELAY_MS)
        : this.#timers.setTimeout(() => void this.attempt(), delay);
  }

  async #attempt(): Promise<void> {
    const m = this.#o.material.current();
    const id = m.identity;
    try {
      // one new key per renewal, kept across its retries: an RSA key takes up to seconds on a busy
      // node, and making one per attempt pushed a retry due at the 90 % point past the certificate's end
      // loaded at the first attempt (months after start): an idle agent does not carry them
      const [{ installCertificate, newKeyPem }, { makeCsr }] = await Promise.all([
        import('./enroll.js'),
        import('../certs/csr.js'),
      ]);
      this.#pendingKey ??= await (this.#o.newKey ?? newKeyPem)();
      const key = this.#pendingKey;
      const body: RenewRequest = {
        csr: makeCsr({ keyPem: key, commonName: id.name, uris: [id.spiffeId], dns: id.dns, ips: id.ips }),
        failed_attempts: this.status.failures,
        ...(this.status.lastError !== null ? { last_error: this.status.lastError } : {}),
      };
      const res = await this.#o.send(body);
      let json: unknown;
      try {
        json = JSON.parse(res.body.toString('utf8'));
      } catch {
        json = undefined;
      }
      if (res.status !== 200) {
        const code = (json as { error?: { code?: unknown } } | undefined)?.error?.code;
        throw new RefusalError(
          isErrorCode(code) ? code : 'bad_response',
          `the controller answered the renewal ${res.status}${typeof code === 'string' ? ` ${code}` : ''}`,
        );
      }
      const bundle = json as CertificateBundle;
      const next = identityOf(String(bundle?.certificate ?? ''), m.trustDomain);
      if (next.spiffeId !== id.spiffeId)
        throw new RefusalError('bad_response', `the renewed certificate is ${next.spiffeId}, not ${id.spiffeId}`);
      const issued = new crypto.X509Certificate(bundle.certificate);
      if (!issued.checkPrivateKey(crypto.createPrivateKey(key)))
        throw new RefusalError('bad_response', 'the renewed certificate is not for the key this agent made');
      installCertificate(this.#o.certPath, this.#o.keyPath, key, bundle.certificate);
      this.#pendingKey = null; // the next renewal makes a new one
      // at once, not at the watcher's next event: the listener and the API client take it now
      this.#o.material.reload();
      const took = this.#o.material.current().identity.serial === next.serial;
      this.status.failures = 0;
      this.status.lastError = null;
      this.status.renewed++;
      this.#o.log.info(
        {
          event: 'certificate.renewed',
          old_serial: id.serial,
          serial: next.serial,
          not_after: next.validTo,
          loaded: took,
        },
        'certificate renewed',
      );
    } catch (err) {
      this.status.failures++;
      const code = codeOf(err) ?? (err as { code?: string }).code ?? 'unknown';
      this.status.lastError = isErrorCode(code) ? code : 'bad_response';
      const now = this.#now();
      const warnAt = renewalWarnAtMs(id.validFrom.getTime(), id.validTo.getTime());
      const fields = {
        code,
        err: (err as Error).message,
        failures: this.status.failures,
        not_after: id.validTo.toISOString(),
      };
      if (now >= warnAt)
        this.#o.log.warn(
          { ...fields, code: 'renewal_overdue', cause: code },
          now > id.validTo.getTime()
            ? 'certificate expired and renewal keeps failing: this node needs a new enrolment'
            : 'certificate renewal keeps failing and 90 % of its lifetime has passed',
        );
      else this.#o.log.warn(fields, 'certificate renewal failed; retrying');
    }
    this.#schedule();
  }
}
