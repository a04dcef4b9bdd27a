/**
 * The push dialer's Prometheus metrics, behind a small sink interface: the in-process dialer
 * writes straight into prom-client; a push worker process counts into a `DeltaPushMetrics` and
 * reports the deltas over IPC to the PushPool facade, which feeds the main registry (the one
 * `/metrics` serves).
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';

export interface PushMetricsSink {
  /** Agents with an open push connection now. */
  connected(n: number): void;
  sent(n?: number): void;
  acked(latencyS: number): void;
  nacked(code: string, n?: number): void;
  dialFailed(code: string, n?: number): void;
  /** Of the agents with an open push connection, those that dialled in (docs/protocol.md). */
  dialledIn(n: number): void;
  /** A dialled-in connection refused before or at its upgrade, by code. */
  connectRefused(code: string, n?: number): void;
}

/** Ack latency buckets, seconds: loopback answers take ~0.2 ms, the half-open limit is 1 s. */
export const ACK_LATENCY_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1];

/**
 * Registers the push metrics into `registry` (a private one when none is given):
 * herald_push_connected_agents, herald_wakeups_sent_total, herald_wakeups_acked_total,
 * herald_wakeups_nacked_total{code}, herald_wake_ack_latency_seconds,
 * herald_push_dial_failures_total{code}, herald_push_dialled_in_agents,
 * herald_push_connect_refusals_total{code}.
 */
export function promPushMetrics(registry: Registry = new Registry()): PushMetricsSink {
  const registers = [registry];
  const connected = new Gauge({
    name: 'herald_push_connected_agents',
    help: 'Agents with an open push connection',
    registers,
  });
  const sent = new Counter({ name: 'herald_wakeups_sent_total', help: 'Wake-ups sent to agents', registers });
  const acked = new Counter({ name: 'herald_wakeups_acked_total', help: 'Wake-ups the agent acknowledged', registers });
  const nacked = new Counter({
    name: 'herald_wakeups_nacked_total',
    help: 'Wake-ups the agent refused, by code',
    labelNames: ['code'] as const,
    registers,
  });
  const latency = new Histogram({
    name: 'herald_wake_ack_latency_seconds',
    help: 'From sending a wake-up to its ack',
    buckets: ACK_LATENCY_BUCKETS_S,
    registers,
  });
  const dialFailures = new Counter({
    name: 'herald_push_dial_failures_total',
    help: 'Failed dials and lost push connections, by code',
    labelNames: ['code'] as const,
    registers,
  });
  const dialledIn = new Gauge({
    name: 'herald_push_dialled_in_agents',
    help: 'Agents whose open push connection they dialled in themselves (--connect-listen)',
    registers,
  });
  const connectRefusals = new Counter({
    name: 'herald_push_connect_refusals_total',
    help: 'Dialled-in connections refused before or at their upgrade, by code',
    labelNames: ['code'] as const,
    registers,
  });
  return {
    connected: (n) => connected.set(n),
    dialledIn: (n) => dialledIn.set(n),
    connectRefused: (code, n = 1) => connectRefusals.inc({ code }, n),
    sent: (n = 1) => sent.inc(n),
    acked: (s) => {
      acked.inc();
      latency.observe(s);
    },
    nacked: (code, n = 1) => nacked.inc({ code }, n),
    dialFailed: (code, n = 1) => dialFailures.inc({ code }, n),
  };
}

/** What a push worker reports per batch (acks and nacks travel as events, with their latency). */
export interface PushMetricsDelta {
  connected: number;
  dialledIn: number;
  sent: number;
  dialFailures: Record<string, number>;
  connectRefusals: Record<string, number>;
}

/** Counts into deltas that `take()` hands over and resets (push worker side). */
export class DeltaPushMetrics implements PushMetricsSink {
  #connected = 0;
  #dialledIn = 0;
  #sent = 0;
  #dialFailures: Record<string, number> = {};
  #connectRefusals: Record<string, number> = {};
  #dirty = false;
  readonly #onChange: () => void;

  /** @param onChange called at each change (the worker schedules its next batch: a refusal comes with no event) */
  constructor(onChange: () => void = () => undefined) {
    this.#onChange = onChange;
  }

  #changed(): void {
    this.#dirty = true;
    this.#onChange();
  }

  get dirty(): boolean {
    return this.#dirty;
  }

  connected(n: number): void {
    this.#connected = n;
    this.#changed();
  }

  sent(n = 1): void {
    this.#sent += n;
    this.#changed();
  }

  acked(): void {}

  nacked(): void {}

  dialFailed(code: string, n = 1): void {
    this.#dialFailures[code] = (this.#dialFailures[code] ?? 0) + n;
    this.#changed();
  }

  dialledIn(n: number): void {
    this.#dialledIn = n;
    this.#changed();
  }

  connectRefused(code: string, n = 1): void {
    this.#connectRefusals[code] = (this.#connectRefusals[code] ?? 0) + n;
    this.#changed();
  }

  take(): PushMetricsDelta {
    const d = {
      connected: this.#connected,
      dialledIn: this.#dialledIn,
      sent: this.#sent,
      dialFailures: this.#dialFailures,
      connectRefusals: this.#connectRefusals,
    };
    this.#sent = 0;
    this.#dialFailures = {};
    this.#connectRefusals = {};
    this.#dirty = false;
    return d;
  }
}
