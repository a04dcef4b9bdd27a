/**
 * The controller's Prometheus metrics, in a registry of its own (never prom-client's global
 * default, so two controllers in one test process do not collide). The push dialer registers
 * its metrics (connected agents, wake-ups sent/acked/nacked, ack latency) into `registry`.
 * The main process's memory is read when scraped, under the names prom-client's defaults use
 * (not its collector: that one also samples the event loop every 10 ms, which an idle controller
 * should not pay): what a controller holds, and whether V8's heap or native memory holds it.
 */
import v8 from 'node:v8';
import { Counter, Gauge, Registry } from 'prom-client';

export class ControllerMetrics {
  readonly registry: Registry;
  readonly apiRequests: Counter<'route' | 'method' | 'status'>;
  readonly refusals: Counter<'code'>;
  readonly fetches: Counter<'status' | 'channel'>;
  readonly signals: Counter<'outcome' | 'status'>;
  readonly eventClients: Gauge;
  readonly objectStoreRequests: Counter<'method' | 'code'>;
  readonly changeReads: Counter<'for'>;

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
    this.objectStoreRequests = new Counter({
      name: 'herald_object_store_requests_total',
      help: "Requests answered by Heat's object store (--object-store-listen), by method and HTTP status code",
      labelNames: ['method', 'code'],
      registers,
    });
    this.changeReads = new Counter({
      name: 'herald_change_reads_total',
      help: 'Records read back from the store to act on a committed change, by what for (push: a node the push service must learn of; events: the event stream; cluster: an operation that may have ended)',
      labelNames: ['for'],
      registers,
    });
    const memory = (name: string, help: string, read: () => number): void => {
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read());
        },
      });
    };
    memory('process_resident_memory_bytes', "The main process's resident memory (its push workers apart)", () =>
      process.memoryUsage.rss(),
    );
    memory(
      'nodejs_heap_size_total_bytes',
      "V8's heap in the main process: what it has taken from the system",
      () => v8.getHeapStatistics().total_heap_size,
    );
    memory(
      'nodejs_heap_size_used_bytes',
      "V8's heap in the main process: what its objects take, garbage not yet collected included",
      () => v8.getHeapStatistics().used_heap_size,
    );
    memory(
      'nodejs_external_memory_bytes',
      'Memory outside V8 that the main process holds through JavaScript objects (buffers)',
      () => v8.getHeapStatistics().external_memory,
    );
  }

  /** The Prometheus text exposition. */
  async text(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
