/**
 * Admission of API connections whose certificate did not authorize (an enrolling node, an agent
 * with an expired certificate, a stranger): decided when the TLS handshake ends, before the HTTP
 * parser sees a byte of the connection, so a request on a connection past a cap is never read
 * and never run (its effect cannot outlive a lost answer). Three caps, all counted at once: the
 * whole pool, one client address, and one network (IPv4 /24, IPv6 /64: protocol/address.ts), so
 * one peer cannot hold the pool and block every enrolment. Pure counting: the API server
 * (controller/api/server.ts) owns the sockets.
 */
import { peerAddressKey, peerPrefixKey } from '../../protocol/address.js';

export interface AdmissionCaps {
  /** All peers together. */
  total: number;
  /** One client address. */
  perAddress: number;
  /** One network (IPv4 /24, IPv6 /64). */
  perPrefix: number;
}

/** Which cap a refused connection hit. */
export type AdmissionScope = 'total' | 'address' | 'prefix';

export type Admission = { ok: true; release: () => void } | { ok: false; scope: AdmissionScope };

export class ConnectionAdmission {
  readonly #caps: AdmissionCaps;
  #total = 0;
  readonly #byAddress = new Map<string, number>();
  readonly #byPrefix = new Map<string, number>();

  /** @throws TypeError when a cap is not a whole number of at least 1 */
  constructor(caps: AdmissionCaps) {
    for (const [name, v] of Object.entries(caps))
      if (!Number.isInteger(v) || v < 1) throw new TypeError(`admission cap ${name} must be a whole number >= 1`);
    this.#caps = { ...caps };
  }

  /**
   * Admits one connection from `address`, or says which cap is full. An admitted connection
   * must be released once (when it closes); `release` is idempotent.
   */
  admit(address: string): Admission {
    const a = peerAddressKey(address);
    const p = peerPrefixKey(address);
    if (this.#total >= this.#caps.total) return { ok: false, scope: 'total' };
    if ((this.#byAddress.get(a) ?? 0) >= this.#caps.perAddress) return { ok: false, scope: 'address' };
    if ((this.#byPrefix.get(p) ?? 0) >= this.#caps.perPrefix) return { ok: false, scope: 'prefix' };
    this.#total++;
    this.#byAddress.set(a, (this.#byAddress.get(a) ?? 0) + 1);
    this.#byPrefix.set(p, (this.#byPrefix.get(p) ?? 0) + 1);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        this.#total--;
        decrement(this.#byAddress, a);
        decrement(this.#byPrefix, p);
      },
    };
  }

  /** Connections admitted and not yet released. */
  get size(): number {
    return this.#total;
  }
}

/** Counts leave no key behind at zero: the maps hold only peers with a connection open. */
function decrement(m: Map<string, number>, key: string): void {
  const n = (m.get(key) ?? 1) - 1;
  if (n <= 0) m.delete(key);
  else m.set(key, n);
}
