/**
 * A controller's own standing: whether its certificate still makes it a controller of the
 * fleet (not revoked in revoked.json, not expired, already valid). Agents refuse a controller
 * without standing at the TLS handshake, so one that kept its lease would hold its nodes
 * unreachable until it stopped, and one that kept writing would change what the fleet runs
 * with credentials the fleet has withdrawn (docs/several-controllers.md, "A revoked or expired
 * controller").
 *
 * The answer is computed at every call from the current PKI material and the clock, so a gate
 * that asks (the store's writes, the API's) is never behind; the fleet, which must act when
 * the standing is lost (give up its lease), is told by `onChange`, fired at a change of
 * revoked.json or of the certificate and by a check every CONTROLLER_STANDING_CHECK_INTERVAL_MS
 * (expiry is a moment in time, not an event).
 */
import type { Logger } from 'pino';
import type { CertIdentity } from '../../certs/identity.js';
import { HeraldError } from '../../protocol/errors.js';
import { CONTROLLER_STANDING_CHECK_INTERVAL_MS } from '../../protocol/limits.js';

/** What Standing reads of the PKI material (certs/tls.ts PkiMaterial). */
export interface StandingMaterial {
  current(): { identity: CertIdentity; revokedSerials: ReadonlySet<string> };
  on(event: 'revoked-change' | 'tls-change', fn: () => void): unknown;
  off(event: 'revoked-change' | 'tls-change', fn: () => void): unknown;
}

export interface StandingOptions {
  material: StandingMaterial;
  logger: Logger;
  /** Wall-clock ms (default Date.now): certificates expire in wall time. */
  now?: () => number;
  /** Default CONTROLLER_STANDING_CHECK_INTERVAL_MS. */
  checkMs?: number;
}

/** The certificate a controller writes to its membership row, so its peers can judge it too. */
export interface OwnCertificate {
  /** Lowercase hex, as revoked.json holds it. */
  serial: string;
  notAfter: Date;
}

export class Standing {
  readonly #o: Required<StandingOptions>;
  readonly #log: Logger;
  readonly #listeners = new Set<() => void>();
  #timer: NodeJS.Timeout | undefined;
  /** The code last reported (undefined: in standing), so a change is logged and told once. */
  #last: string | undefined;
  #onMaterial = (): void => this.check();

  constructor(o: StandingOptions) {
    this.#o = { now: Date.now, checkMs: CONTROLLER_STANDING_CHECK_INTERVAL_MS, ...o };
    this.#log = o.logger.child({ component: 'standing' });
  }

  /** Checks now, then on every change of the material and on a timer. Idempotent. */
  start(): void {
    if (this.#timer) return;
    this.#o.material.on('revoked-change', this.#onMaterial);
    this.#o.material.on('tls-change', this.#onMaterial);
    this.#timer = setInterval(this.#onMaterial, this.#o.checkMs);
    this.#timer.unref();
    this.check();
  }

  /** Idempotent. */
  close(): void {
    clearInterval(this.#timer);
    this.#o.material.off('revoked-change', this.#onMaterial);
    this.#o.material.off('tls-change', this.#onMaterial);
    this.#listeners.clear();
  }

  /**
   * Why this controller may not change the fleet or hold nodes now, or undefined when it may:
   * HeraldError `controller_revoked` (its serial is in revoked.json) or `controller_expired`
   * (now is outside its certificate's validity).
   */
  refusal(): HeraldError | undefined {
    const { identity, revokedSerials } = this.#o.material.current();
    if (revokedSerials.has(identity.serial))
      return new HeraldError(
        'controller_revoked',
        `this controller's certificate (serial ${identity.serial}) is revoked: it changes nothing; ask another controller`,
      );
    const now = this.#o.now();
    if (now >= identity.validTo.getTime() || now < identity.validFrom.getTime())
      return new HeraldError(
        'controller_expired',
        `this controller's certificate is valid from ${identity.validFrom.toISOString()} to ${identity.validTo.toISOString()}: it changes nothing until it is renewed; ask another controller`,
      );
    return undefined;
  }

  /** The certificate in use now. */
  certificate(): OwnCertificate {
    const { identity } = this.#o.material.current();
    return { serial: identity.serial, notAfter: identity.validTo };
  }

  /** The serials revoked.json lists now (peers' membership rows are checked against them). */
  revokedSerials(): ReadonlySet<string> {
    return this.#o.material.current().revokedSerials;
  }

  /** `fn` runs when the standing is lost or regained. */
  onChange(fn: () => void): void {
    this.#listeners.add(fn);
  }

  /** Compares with the last check; logs and tells the listeners on a change. */
  check(): void {
    const r = this.refusal();
    if (r?.code === this.#last) return;
    this.#last = r?.code;
    if (r) this.#log.error({ code: r.code }, `${r.message}; gave up its nodes and refuses writes`);
    else this.#log.info({ serial: this.certificate().serial }, 'own certificate in standing again');
    for (const fn of this.#listeners) fn();
  }
}
