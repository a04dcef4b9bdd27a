/**
 * The messages between the PushPool facade (controller main process) and its push worker
 * processes, over the `child_process.fork` IPC channel. Both directions are batched (per event
 * loop turn; a change set's wake-ups once it is applied): a fan-out to 10,000 nodes is a handful
 * of IPC messages, not 10,000.
 */
import type { MaterialPaths } from '../certs/paths.js';
import type { Ed25519PrivateJwk } from '../protocol/jws.js';
import type { WakeReason } from '../protocol/wake.js';
import type { PushMetricsDelta } from './push-metrics.js';
import type { AckEvent, PushReply, PushRequest, PushState, PushTarget } from './push-types.js';

/** Tuning a worker's dialer takes (PushDialerOptions' numbers). */
export interface PushTuning {
  pingIntervalMs?: number;
  answerTimeoutMs?: number;
  dialTimeoutMs?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  maxWakesInFlight?: number;
  maxDialsInFlight?: number;
  closeGraceMs?: number;
}

export interface WorkerInit {
  t: 'init';
  worker: number;
  /** The controller's private signing key: handed over the local IPC pipe, never written out. */
  signingJwk: Ed25519PrivateJwk;
  issuer: string;
  trustDomain: string;
  material: MaterialPaths;
  logLevel: string;
  tuning: PushTuning;
  /** How long it waits for the answer to a request before telling the agent to ask HTTPS (503). */
  requestAnswerTimeoutMs: number;
  /** Where this worker keeps its TLS sessions with the agents (certs/session-file.ts). */
  sessionFile?: string;
}

export type ToWorkerCommand =
  /** `reconnect`: nodes a crashed predecessor held connections to, connected again at once. */
  | { t: 'start'; targets: PushTarget[]; reconnect: string[] }
  | { t: 'notify'; node: string; gen: number; reason: WakeReason }
  | { t: 'endpoint'; node: string; url: string | null; gen: number }
  | { t: 'remove'; node: string }
  | { t: 'signing-key'; jwk: Ed25519PrivateJwk }
  /** The answer to the worker's `request` event `id` (a body arrives as a Uint8Array). */
  | { t: 'answer'; id: number; kind: PushRequest['kind']; r: PushReply };

export type ToWorker = WorkerInit | { t: 'batch'; cmds: ToWorkerCommand[] } | { t: 'close' };

export type WorkerEvent =
  | { t: 'state'; node: string; s: PushState }
  | { t: 'ack'; e: AckEvent }
  | { t: 'nack'; e: { node: string; jti: string | null; code: string } }
  /** An agent's fetch or signal on its push connection, for the main process to answer (`answer`). */
  | { t: 'request'; id: number; r: PushRequest };

export type FromWorker =
  | { t: 'ready' }
  | { t: 'batch'; events: WorkerEvent[]; metrics: PushMetricsDelta | null }
  | { t: 'closed' };
