/**
 * Admission of API connections whose certificate did not authorize (an enrolling node, an agent
 * with an expired certificate, a stranger): decided when the TLS handshake ends, before the HTTP
 * parser sees a byte of the connection, so a request on a connection past a cap is never read
 * and never run (its effect cannot outlive a lost answer). Three caps, all counted at once: the
 * whole pool, one host (IPv4 address, IPv6 /64) and one network (IPv4 /24, IPv6 /48), keyed as
 * the enrolment rate limits are (protocol/address.ts peerNetworks), so a peer inside one network
 * cannot hold the pool. Pure counting: the API server (controller/api/server.ts) owns the
 * sockets and the deadline by which an admitted connection must have sent its request.
 */
import { peerNetworks } from '../protocol/address.js';

export interface AdmissionCaps {
  /** All peers together. */
  total: number;
  /** One host (an IPv4 address, an IPv6 /64). */
  perHost: number;
  /** One network (IPv4 /24, IPv6 /48). */
  perNetwork: number;
}

/** Which cap a refused connection hit. */
export type AdmissionScope = 'total' | 'host' | 'network';

export type Admission = { ok: true; release: () => void } | { ok: false; scope: AdmissionScope };

export class ConnectionAdmission {
  readonly #caps: AdmissionCaps;
  #total = 0;
  readonly #byHost = new Map<string, number>();
  readonly #byNetwork = new Map<string, number>();

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
    const { host: h, network: n } = peerNetworks(address);
    if (this.#total >= this.#caps.total) return { ok: false, scope: 'total' };
    if ((this.#byHost.get(h) ?? 0) >= this.#caps.perHost) return { ok: false, scope: 'host' };
    if ((this.#byNetwork.get(n) ?? 0) >= this.#caps.perNetwork) return { ok: false, scope: 'network' };
    this.#total++;
    this.#byHost.set(h, (this.#byHost.get(h) ?? 0) + 1);
    this.#byNetwork.set(n, (this.#byNetwork.get(n) ?? 0) + 1);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        this.#total--;
        decrement(this.#byHost, h);
        decrement(this.#byNetwork, n);
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
