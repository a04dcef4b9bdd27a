/**
 * A store of TLS client sessions of our own, used instead of Node's session cache (which
 * `httpsAgentFor` keeps off): the agent's with the controller API, and the push dialer's with the
 * agents' listeners. On Node 20 a resumed client session skips
 * `checkServerIdentity` and shows no server certificate, so a session is worth only what was
 * checked when it was made: each entry carries the identity of a server that passed
 * `checkServerCertificate` in a full handshake (or was inherited from such a session), its
 * serials (leaf and issuer) and the certificate's validity, and is offered only while none of
 * those serials is revoked and its identity's floor is not above its notBefore (read from the
 * material at the moment of offering), before notAfter,
 * and within TLS_SESSION_LIFETIME_S. `clear()` drops everything; the owner calls it on the
 * material's 'tls-change' and 'revoked-change' (HttpsAgentHolder does). No I/O of its own: a
 * `SessionPersistence` (certs/session-file.ts) may follow its changes, and may keep a session's
 * bytes for it (`saved` answers true): the store then drops its copy and asks for them back
 * (`load`) when it offers the session, so a store of 10,000 push sessions does not hold the
 * bytes of each in memory for the rare redial. A session is kept without the server's certificate
 * (certs/session-der.ts): ~0.4 KB instead of ~1.2 KB, and offering it costs no certificate decoding.
 */
import { TLS_SESSION_LIFETIME_S, TLS_SESSION_STORE_ENTRIES } from '../protocol/limits.js';
import type { Role } from '../protocol/identity.js';
import { isExpectedServer, type ExpectedServer } from './expected-server.js';
import { identityKey } from './revoked.js';
import { withoutPeerCertificate } from './session-der.js';

/**
 * What the store reads of the PKI material (certs/tls.ts `PkiMaterial`): today's revoked serials
 * and identity floors (`role/name` -> ms: a certificate of it whose notBefore is earlier is revoked).
 */
export interface RevocationSource {
  current(): { readonly revokedSerials: ReadonlySet<string>; readonly identityFloors?: ReadonlyMap<string, number> };
}

/** Whom a session was made with, as checked in its full handshake. */
export interface SessionPeer {
  spiffeId: string;
  role: Role;
  name: string;
  /** Lowercase hex: the server certificate's serial, then its issuer's when it has one (`chainSerialsOf`). */
  serials: readonly string[];
  /** The server certificate's notAfter, ms since the epoch. */
  notAfterMs: number;
  /**
   * The server certificate's notBefore, ms since the epoch; absent in a session kept before it was
   * recorded, which counts as older than any identity floor (`belowIdentityFloor`).
   */
  notBeforeMs?: number;
}

/** `e`'s peer alone: a copy that holds none of a session's bytes. */
export function peerOf(e: SessionPeer): SessionPeer {
  const p: SessionPeer = {
    spiffeId: e.spiffeId,
    role: e.role,
    name: e.name,
    serials: [...e.serials],
    notAfterMs: e.notAfterMs,
  };
  if (e.notBeforeMs !== undefined) p.notBeforeMs = e.notBeforeMs;
  return p;
}

/**
 * The identity floor `peer`'s certificate stands under (its identity was revoked since before the
 * certificate was issued: certs/tls.ts `identityFloorRefusal`), or undefined.
 */
export function belowIdentityFloor(
  peer: SessionPeer,
  floors: ReadonlyMap<string, number> | undefined,
): number | undefined {
  const floor = floors?.get(identityKey(peer.role, peer.name));
  return floor !== undefined && (peer.notBeforeMs ?? 0) < floor ? floor : undefined;
}

export interface StoredSession extends SessionPeer {
  /** What the 'session' event gave: for `tls.connect({ session })`. */
  session: Buffer;
  storedAtMs: number;
}

/** An entry as the store keeps it: `session` is null while its persistence holds the bytes. */
export interface KeptSession extends SessionPeer {
  session: Buffer | null;
  storedAtMs: number;
}

/** Told of every change of a store (certs/session-file.ts keeps it in a file). */
export interface SessionPersistence {
  /** True when it keeps the session's bytes and `load` gives them back: the store drops its copy. */
  saved(key: string, entry: StoredSession): boolean;
  deleted(key: string): void;
  cleared(): void;
  /** The bytes of `key`'s session as last saved, or undefined when they cannot be read back. */
  load(key: string): Buffer | undefined;
}

export interface TlsSessionStoreOptions {
  /** Default Date.now. */
  now?: () => number;
  /** Default TLS_SESSION_LIFETIME_S * 1000. */
  maxAgeMs?: number;
  /** Default TLS_SESSION_STORE_ENTRIES. */
  maxEntries?: number;
}

export class TlsSessionStore {
  readonly #material: RevocationSource;
  readonly #now: () => number;
  readonly #maxAgeMs: number;
  readonly #maxEntries: number;
  readonly #entries = new Map<string, KeptSession>();
  #epoch = 0;
  #persistence: SessionPersistence | undefined;

  constructor(material: RevocationSource, o: TlsSessionStoreOptions = {}) {
    this.#material = material;
    this.#now = o.now ?? Date.now;
    this.#maxAgeMs = o.maxAgeMs ?? TLS_SESSION_LIFETIME_S * 1000;
    this.#maxEntries = o.maxEntries ?? TLS_SESSION_STORE_ENTRIES;
  }

  /**
   * Bumped by `clear()`. A connection takes it when it starts and stores its sessions only while
   * it is unchanged: a ticket that arrives after a revocation or a certificate change is not kept.
   */
  get epoch(): number {
    return this.#epoch;
  }

  get size(): number {
    return this.#entries.size;
  }

  /**
   * The session to offer when dialling `key` (host:port), or undefined. An entry whose serials
   * are revoked now, whose certificate's notAfter has passed, that is older than the ticket
   * lifetime, or that is not `expected` is dropped instead, and so is one whose bytes its
   * persistence cannot give back.
   */
  offer(key: string, expected: ExpectedServer): StoredSession | undefined {
    const e = this.#entries.get(key);
    if (e === undefined) return undefined;
    const now = this.#now();
    const m = this.#material.current();
    const revoked = m.revokedSerials;
    if (
      e.serials.some((s) => revoked.has(s)) ||
      belowIdentityFloor(e, m.identityFloors) !== undefined ||
      now >= e.notAfterMs ||
      now - e.storedAtMs >= this.#maxAgeMs ||
      !isExpectedServer(expected, e)
    ) {
      this.delete(key);
      return undefined;
    }
    // bytes in memory were stripped by save(); a file written before that still has the certificate
    const loaded = e.session === null ? this.#persistence?.load(key) : undefined;
    const session = e.session ?? (loaded === undefined ? undefined : withoutPeerCertificate(loaded));
    if (session === undefined) {
      this.delete(key);
      return undefined;
    }
    return { ...e, session };
  }

  /**
   * Keeps `session` for `key`, made with `peer`, without the server's certificate in it (nothing
   * reads it back, and decoding it is most of the cost of offering it: certs/session-der.ts);
   * ignored when `epoch` is no longer current.
   */
  save(key: string, peer: SessionPeer, whole: Buffer, epoch: number): void {
    if (epoch !== this.#epoch) return;
    const session = withoutPeerCertificate(whole);
    const entry: KeptSession = { ...peerOf(peer), session, storedAtMs: this.#now() };
    this.#put(key, entry);
    if (this.#persistence?.saved(key, { ...entry, session }) === true) entry.session = null;
  }

  /**
   * Takes back an entry kept by an earlier process (certs/session-file.ts; `session` null when its
   * persistence holds the bytes); false (not kept) when it is past its age or notAfter already.
   * `offer` checks it again, as any other.
   */
  restore(key: string, entry: KeptSession): boolean {
    const now = this.#now();
    if (now >= entry.notAfterMs || now - entry.storedAtMs >= this.#maxAgeMs || entry.storedAtMs > now) return false;
    this.#put(key, entry);
    return true;
  }

  /** The entries kept, oldest first (`session` null where the persistence holds the bytes). */
  entries(): IterableIterator<[string, KeptSession]> {
    return this.#entries.entries();
  }

  /**
   * For the persistence: it holds `key`'s bytes from now on (`null`), or no longer does and
   * hands them back. Ignored for a key the store no longer has.
   */
  keepBytes(key: string, session: Buffer | null): void {
    const e = this.#entries.get(key);
    if (e !== undefined) e.session = session;
  }

  /** Tells `p` of every change from now on. */
  persistTo(p: SessionPersistence): void {
    this.#persistence = p;
  }

  #put(key: string, entry: KeptSession): void {
    this.#entries.delete(key);
    this.#entries.set(key, entry);
    while (this.#entries.size > this.#maxEntries) {
      const oldest = this.#entries.keys().next().value!;
      this.#entries.delete(oldest);
      this.#persistence?.deleted(oldest);
    }
  }

  /** Forgets `key`'s session (a connection that offered it failed). */
  delete(key: string): void {
    if (this.#entries.delete(key)) this.#persistence?.deleted(key);
  }

  /** Forgets every session. */
  clear(): void {
    this.#epoch++;
    this.#entries.clear();
    this.#persistence?.cleared();
  }
}
