/**
 * The seam between the controller's API/store and its push dialer. The dialer may run in this
 * process or in worker processes (see README "Architecture"); either way the API side only
 * sees this interface.
 */
import type { ErrorCode } from '../../protocol/errors.js';
import type { Ed25519PrivateJwk } from '../../protocol/jws.js';
import type { WakeReason } from '../../protocol/wake.js';

import type { AddressInfo } from 'node:net';
import type WebSocket from 'ws';
export type { PushConnectionState, PushVia } from '../../protocol/rest.js';
import type { PushConnectionState, PushVia } from '../../protocol/rest.js';

/** Per-node push state, shown in `GET /v1/nodes/{id}` and metrics. */
export interface PushState {
  state: PushConnectionState;
  connected: boolean;
  /** How the open connection was made (`dialled`, `dialled-in`); null while none is open. */
  via: PushVia | null;
  /** Highest generation sent in a wake-up. */
  generation_pushed: number | null;
  /** Highest generation the agent acknowledged (its `gen`: last fetched). */
  generation_acked: number | null;
  /** ISO time of the last ack. */
  last_ack_at: string | null;
  /** Code of the last failure (dial error, nack code, `half_open`, ...). */
  last_error: ErrorCode | string | null;
  last_error_at: string | null;
}

/** A node the push service holds nothing for yet. Copy it (`{ ...IDLE_PUSH_STATE }`) before use. */
export const IDLE_PUSH_STATE: Readonly<PushState> = Object.freeze({
  state: 'idle',
  connected: false,
  via: null,
  generation_pushed: null,
  generation_acked: null,
  last_ack_at: null,
  last_error: null,
  last_error_at: null,
});

export interface PushTarget {
  node: string;
  /** `wss://host:port/v1/wake`, or null when the node has announced none. */
  url: string | null;
  /** The node's current metadata generation. */
  generation: number;
  /** The generation the agent last acknowledged, as stored. */
  ackedGeneration: number | null;
}

export interface AckEvent {
  node: string;
  jti: string;
  gen: number;
  fetch: 'started' | 'queued' | 'current';
  latencyMs: number;
}

/** An agent's fetch on its push connection (docs/protocol.md): the metadata route's request. */
export interface PushFetchRequest {
  kind: 'fetch';
  node: string;
  nonce: string;
  ifNoneMatch: string | null;
}

/** An agent's signal on its push connection (docs/protocol.md): the signal route's request. */
export interface PushSignalRequest {
  kind: 'signal';
  node: string;
  deploymentId: string;
  /** The route's JSON body, unparsed. */
  body: Uint8Array;
}

/**
 * What an agent asks on its push connection, answered as its HTTPS route would be
 * (controller/service/agent-answers.ts).
 */
export type PushRequest = PushFetchRequest | PushSignalRequest;

/**
 * What the route would answer: for a fetch, a `metadata` frame's content; for a signal, a
 * `signalled` frame's (status and error alone) (protocol/frames.ts).
 */
export interface PushReply {
  status: number;
  etag?: string;
  signature?: string;
  /** A 200's body, the exact bytes the signature's `sha256` covers. */
  body?: Uint8Array;
  /** An error's code. */
  error?: string;
  retryAfterS?: number;
}

/** The answer to a request nobody can answer now (no handler yet, busy, a stalled main process): the agent asks over HTTPS. */
export function unavailableReply(kind: PushRequest['kind']): PushReply {
  return { status: 503, error: kind === 'fetch' ? 'fetch_unavailable' : 'signal_unavailable' };
}

/**
 * Answers the agents' requests on push connections (the controller's `AgentAnswers`,
 * controller/service/agent-answers.ts); never rejects: an error is a reply.
 */
export type PushRequestHandler = (r: PushRequest) => Promise<PushReply>;

export interface PushEvents {
  ack: (e: AckEvent) => void;
  nack: (e: { node: string; jti: string | null; code: string }) => void;
  state: (node: string, s: PushState) => void;
  /**
   * The node's agent dialled in (docs/protocol.md, "Dialled-in connections") and its connection
   * is held here now; no wake-up goes on it until a `notify` for the node (its ping, with the
   * generation the caller reads: controller/service/service.ts).
   */
  attach: (node: string) => void;
  /** The node's dialled-in connection held here is gone (closed, lost, replaced on another worker). */
  detach: (node: string) => void;
}

/** An agent's connection to `--connect-listen`, authorized and upgraded (controller/push/connect-listener.ts). */
export interface DialledIn {
  /** The node its certificate names (`agent/<node>`). */
  node: string;
  ws: WebSocket;
  /** `address:port`, for the logs. */
  peer: string;
  /** The serials of its certificate and, when one issued it, of its Herald issuer (revocation closes the connection). */
  serials: string[];
  notBeforeMs: number;
  notAfterMs: number;
}

/** Where the agents dial in (`--connect-listen`). */
export interface ConnectListen {
  host: string;
  port: number;
}

export interface PushService {
  /** Starts the dialer; connects at once to every target whose acked generation is behind. */
  start(targets: PushTarget[]): Promise<void>;
  /** A node's metadata changed in a way that gives the agent work: wake it (coalesced). */
  notify(node: string, generation: number, reason: WakeReason): void;
  /** A node's endpoint changed (null: none). A changed URL closes the old connection. */
  setEndpoint(node: string, url: string | null, generation: number): void;
  /** The node was deleted: close and forget it. */
  remove(node: string): void;
  state(node: string): PushState;
  /** A rotated signing key: wake-ups from now on are signed with it. */
  setSigningKey(jwk: Ed25519PrivateJwk): void;
  /**
   * The identity floors of the database (`IdentityFloors`, `role/name` -> ms), every one, each
   * time they change: for a dialer whose TLS material is not the main process's (push workers).
   * A dialer that shares the main process's `PkiMaterial` has them already and has no such method.
   */
  setIdentityFloors?(floors: ReadonlyMap<string, number>): void;
  /**
   * Who answers the agents' fetches and signals on their push connections. Until it is set, a
   * fetch frame is answered 503 `fetch_unavailable` and a signal frame 503 `signal_unavailable`:
   * the agent asks over HTTPS.
   */
  serveRequests(handler: PushRequestHandler): void;
  on<E extends keyof PushEvents>(event: E, fn: PushEvents[E]): void;
  /**
   * Serves the agents' dialled-in connections on `listen` (docs/protocol.md, "Dialled-in
   * connections"), each held as its node's push connection. Resolves with the bound address.
   * @throws ConfigError `bad_option` (field `connect-listen`) when it cannot listen there
   */
  serveConnect?(listen: ConnectListen): Promise<AddressInfo>;
  /**
   * Stops taking dialled-in connections and closes those held, 1012, spread evenly over
   * `windowMs` (the controller's stop: its agents move to another controller over the window, not
   * all at once). Resolves once all are closed. Dialled connections are left to `close()`.
   */
  drainConnect?(windowMs: number): Promise<void>;
  /** Closes every agent connection with 1001 and stops. Idempotent. */
  close(): Promise<void>;
}
