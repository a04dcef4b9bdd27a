/**
 * Identity floors: how the controller revokes an agent identity whatever issued its certificates
 * (docs/certificates-over-time.md, "Revoking a node"). Each node may have a floor, a time kept in
 * the database (shared by every controller): a certificate of `agent/<node>` whose notBefore is
 * earlier is refused by `authorizePeer` like a revoked serial, on live connections too. Revoking
 * a node sets its floor to now; a renewal raises it to the notBefore of the certificate that
 * renewed, and the first use of the certificate it issued raises it to that one's, so a
 * superseded certificate, and one renewed from a stolen one before, is refused.
 *
 * The floors reach `PkiMaterial.setIdentityFloors`, read again every IDENTITY_FLOOR_REFRESH_MS
 * for what other controllers set, and the push workers (`onChange`: PushPool.setIdentityFloors).
 */
import type { Logger } from 'pino';
import type { CertIdentity } from '../../certs/identity.js';
import { identityKey } from '../../certs/revoked.js';
import type { PkiMaterial } from '../../certs/tls.js';
import { HeraldError } from '../../protocol/errors.js';
import { isValidName } from '../../protocol/identity.js';
import { IDENTITY_FLOOR_REFRESH_MS } from '../../protocol/limits.js';
import type { Store } from '../store/store.js';

export interface IdentityFloorsOptions {
  store: Store;
  material: PkiMaterial;
  logger: Logger;
  now?: () => number;
  /** Default IDENTITY_FLOOR_REFRESH_MS. */
  refreshMs?: number;
  /**
   * Told the floors read (`role/name` -> ms) after each read that changed them, the first read
   * included: for the push workers, whose material is not `material` (PushPool.setIdentityFloors).
   */
  onChange?: (floors: ReadonlyMap<string, number>) => void;
}

/** `POST /v1/nodes/{id}/revoke`'s answer. */
export interface NodeRevocation {
  node: string;
  /** Every certificate of the node with an earlier notBefore is refused (ISO 8601). */
  revoked_before: string;
}

/**
 * The floor a revocation at `nowMs` sets: the next whole second. Certificate times have whole
 * seconds, so every certificate issued up to now (notBefore ≤ now) is under it, and one issued
 * later is given a notBefore at it or after (`Enrollment` clamps).
 */
export function revocationFloorMs(nowMs: number): number {
  return Math.floor(nowMs / 1000) * 1000 + 1000;
}

export class IdentityFloors {
  readonly #o: IdentityFloorsOptions;
  readonly #now: () => number;
  /** Node -> the serial its last renewal issued and that has not been used yet. */
  #renewed = new Map<string, string>();
  #timer: NodeJS.Timeout | undefined;
  #refreshing: Promise<void> | undefined;
  #closed = false;
  /** The floors of the last read. */
  #floors: ReadonlyMap<string, number> | undefined;

  constructor(o: IdentityFloorsOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
  }

  /** Loads the floors and follows them. @throws what the store throws on the first load */
  async start(): Promise<void> {
    await this.refresh();
    this.#timer = setInterval(() => {
      this.refresh().catch((err: unknown) =>
        this.#o.logger.warn({ err }, 'could not read the identity floors; keeping the last ones'),
      );
    }, this.#o.refreshMs ?? IDENTITY_FLOOR_REFRESH_MS);
    this.#timer.unref();
  }

  close(): void {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
  }

  /** Reads every floor from the store into the material (one read at a time). */
  refresh(): Promise<void> {
    this.#refreshing ??= this.#load().finally(() => {
      this.#refreshing = undefined;
    });
    return this.#refreshing;
  }

  async #load(): Promise<void> {
    const rows = await this.#o.store.listIdentityFloors();
    if (this.#closed) return;
    const floors = new Map<string, number>();
    const renewed = new Map<string, string>();
    for (const r of rows) {
      floors.set(identityKey('agent', r.node), Date.parse(r.notBefore));
      if (r.renewedSerial !== null) renewed.set(r.node, r.renewedSerial);
    }
    this.#renewed = renewed;
    this.#o.material.setIdentityFloors(floors);
    const prev = this.#floors;
    if (prev !== undefined && prev.size === floors.size && [...floors].every(([k, v]) => prev.get(k) === v)) return;
    this.#floors = floors;
    this.#o.onChange?.(floors);
  }

  /**
   * Revokes every certificate of `node` issued up to now, whatever issued it (the node need not
   * exist: an enrolled agent may not have announced). Live connections of it are closed.
   * @throws HeraldError `bad_name`
   */
  async revoke(node: string, who: string): Promise<NodeRevocation> {
    if (!isValidName(node))
      throw new HeraldError('bad_name', 'node must match ^[a-z0-9][a-z0-9._-]{0,62}$', { field: 'node' });
    const floor = new Date(revocationFloorMs(this.#now())).toISOString();
    await this.#o.store.raiseIdentityFloor(node, floor, null, 'revoke', who);
    await this.refresh();
    this.#o.logger.warn(
      { event: 'node.revoke', node, revoked_before: floor, who },
      'node identity revoked: every certificate of it issued before this time is refused',
    );
    return { node, revoked_before: floor };
  }

  /**
   * A renewal from `presented` issued `issued`: every certificate of the node older than the
   * presented one is refused from now on, and the issued one's first use retires the presented one.
   */
  async renewed(node: string, presented: CertIdentity, issued: { serial: string; notBefore: string }): Promise<void> {
    await this.#o.store.raiseIdentityFloor(
      node,
      presented.validFrom.toISOString(),
      issued,
      'renewal',
      presented.spiffeId,
    );
    this.#renewed.set(node, issued.serial);
    await this.refresh();
  }

  /**
   * An agent connected with `identity`: when it is the certificate the node's last renewal
   * issued, the certificates before it are retired. Synchronous and cheap (one map lookup); the
   * write runs in the background.
   */
  used(identity: CertIdentity): void {
    if (identity.role !== 'agent' || this.#renewed.get(identity.name) !== identity.serial) return;
    this.#renewed.delete(identity.name);
    this.#o.store
      .retireSupersededCertificates(identity.name, identity.serial)
      .then((changed) => {
        if (!changed) return;
        this.#o.logger.info(
          { event: 'certificate.supersede', node: identity.name, serial: identity.serial },
          'renewed certificate in use: the certificates before it are refused',
        );
        return this.refresh();
      })
      .catch((err: unknown) =>
        this.#o.logger.warn({ err, node: identity.name }, 'could not retire the superseded certificates'),
      );
  }
}
