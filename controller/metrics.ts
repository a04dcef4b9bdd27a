/**
 * The controller's Prometheus metrics, in a registry of its own (never prom-client's global
 * default, so two controllers in one test process do not collide). The push dialer registers
 * its metrics (connected agents, wake-ups sent/acked/nacked, ack latency) into `registry`.
 */
import { Counter, Gauge, Registry } from 'prom-client';

export class ControllerMetrics {
  readonly registry: Registry;
  readonly apiRequests: Counter<'route' | 'method' | 'status'>;
  readonly refusals: Counter<'code'>;
  readonly fetches: Counter<'status' | 'channel'>;
  readonly signals: Counter<'outcome' | 'status'>;
  readonly eventClients: Gauge;

  constructor(registry = new Registry()) {
    this.registry = registry;
    const registers = [registry];
    this.apiRequests = new Counter({
      name: 'herald_api_requests_total',
      help: 'API requests answered, by route template, method and status',
      labelNames: ['route', 'method', 'status'],
      registers,
    });
    this.refusals = new Counter({
      name: 'herald_api_refusals_total',
      help: 'API requests refused, by error code',
      labelNames: ['code'],
      registers,
    });
    this.fetches = new Counter({
      name: 'herald_metadata_fetches_total',
      help: 'Metadata fetches answered, by status (200 or 304; over the push connection also a refusal, 429 and the like) and channel (https, or push: over the push connection)',
      labelNames: ['status', 'channel'],
      registers,
    });
    this.signals = new Counter({
      name: 'herald_signals_total',
      help: 'Deployment signals received, by outcome (recorded or duplicate) and resulting status',
      labelNames: ['outcome', 'status'],
      registers,
    });
    this.eventClients = new Gauge({
      name: 'herald_event_stream_clients',
      help: 'Clients connected to GET /v1/events',
      registers,
    });
  }

  /** The Prometheus text exposition. */
  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
