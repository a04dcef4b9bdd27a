/**
 * The controller's state-change events, for `GET /v1/events` (Server-Sent Events). Payloads are
 * the same masked views the API returns: a hidden input is never in an event.
 */
import { EventEmitter } from 'node:events';

export type ControllerEventType = 'deployment' | 'node' | 'cluster' | 'push' | 'output';

export interface ControllerEvent {
  /** Increasing within one controller process (the SSE `id`). */
  id: number;
  type: ControllerEventType;
  at: string;
  data: Record<string, unknown>;
}

export class EventBus {
  readonly #emitter = new EventEmitter();
  #seq = 0;

  constructor() {
    // one listener per SSE client
    this.#emitter.setMaxListeners(0);
  }

  publish(type: ControllerEventType, data: Record<string, unknown>): void {
    // no one listening (the usual case): nothing to stamp; a fan-out publishes several per node
    if (this.#emitter.listenerCount('event') === 0) return;
    const e: ControllerEvent = { id: ++this.#seq, type, at: new Date().toISOString(), data };
    this.#emitter.emit('event', e);
  }

  subscribe(fn: (e: ControllerEvent) => void): () => void {
    this.#emitter.on('event', fn);
    return () => this.#emitter.off('event', fn);
  }

  get subscribers(): number {
    return this.#emitter.listenerCount('event');
  }
}
