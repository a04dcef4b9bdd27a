/**
 * A full garbage collection once the controller's main process has gone quiet with garbage in its
 * heap. A burst of work (a fleet of thousands connecting and announcing itself, a change to every
 * node and the signals after it) leaves what it promoted in V8's old generation until the next
 * mark-compact, and a controller that is quiet but not silent (the agents' polls, the push
 * workers' state) allocates too slowly to reach one soon and too steadily for V8's memory reducer,
 * which waits for a low allocation rate. Measured (docs/performance.md, "Measured 2026-12-06"):
 * a fleet of 10,000 left the main process's V8 heap at 111 MiB used where 23 MiB was live at
 * 5,000, ~85 MB of garbage held through a quiet window, ~8 KB an agent of the controller's memory.
 *
 * Every `everyMs` it reads the event loop's utilisation since the last check and V8's used heap:
 * when the loop was busy at most `maxUtilization` of the time and the heap has grown by
 * `minGarbageBytes` since its last collection (or its start, or the lowest it has seen since), it
 * runs one. What that costs is one mark-compact of the live heap on a quiet process, at most once
 * per `minGarbageBytes` that V8 left uncollected.
 */
import { performance } from 'node:perf_hooks';
import v8 from 'node:v8';
import vm from 'node:vm';

/** What the collector reads and does; `v8Probe()` is the real one, a test gives its own. */
export interface IdleCollectorProbe {
  /** The event loop's utilisation since the last call, 0 to 1. */
  utilization(): number;
  /** V8's used heap, bytes. */
  usedHeapBytes(): number;
  /** Runs a full collection; resolves once it has run. */
  collect(): Promise<void>;
}

export interface IdleCollectorOptions {
  everyMs: number;
  maxUtilization: number;
  minGarbageBytes: number;
  /** Told after each collection: the used heap before and after it, bytes. */
  onCollected?: (beforeBytes: number, afterBytes: number) => void;
}

export class IdleCollector {
  readonly #probe: IdleCollectorProbe;
  readonly #o: IdleCollectorOptions;
  /** The used heap after the last collection this ran, or at the start, or the lowest seen since. */
  #baselineBytes: number;
  #running = false;
  #timer: NodeJS.Timeout | null = null;

  constructor(probe: IdleCollectorProbe, o: IdleCollectorOptions) {
    this.#probe = probe;
    this.#o = o;
    this.#baselineBytes = probe.usedHeapBytes();
  }

  start(): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => void this.check(), this.#o.everyMs);
    this.#timer.unref();
  }

  close(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** One check (the timer's; a test calls it). Resolves true when it collected. */
  async check(): Promise<boolean> {
    if (this.#running) return false;
    const busy = this.#probe.utilization();
    const before = this.#probe.usedHeapBytes();
    // a heap smaller than the baseline (V8 collected on its own) moves the baseline down
    if (before < this.#baselineBytes) this.#baselineBytes = before;
    if (busy > this.#o.maxUtilization) return false;
    if (before - this.#baselineBytes < this.#o.minGarbageBytes) return false;
    this.#running = true;
    try {
      await this.#probe.collect();
    } finally {
      this.#running = false;
    }
    const after = this.#probe.usedHeapBytes();
    this.#baselineBytes = after;
    this.#probe.utilization(); // the collection itself is not the next interval's load
    this.#o.onCollected?.(before, after);
    return true;
  }
}

/**
 * V8's full collection, as `--expose-gc` gives it: the flag is set when the first collection is
 * asked for, and the function is taken from a new context (the main context was made before the
 * flag, so no other code sees it). `vm.measureMemory` in eager mode starts the same marking, but
 * Node 20 prints an ExperimentalWarning for it on stderr.
 */
let fullGc: (() => void) | null = null;
function collectNow(): void {
  if (fullGc === null) {
    v8.setFlagsFromString('--expose-gc');
    fullGc = vm.runInNewContext('gc') as () => void;
  }
  fullGc();
}

/**
 * The real probe: `performance.eventLoopUtilization()` between calls, `v8.getHeapStatistics()`,
 * and V8's full collection (synchronous: tens of ms for the main process's heap at 10,000 agents,
 * run only when the process is quiet).
 */
export function v8Probe(): IdleCollectorProbe {
  let last = performance.eventLoopUtilization();
  return {
    utilization: () => {
      const now = performance.eventLoopUtilization();
      const since = performance.eventLoopUtilization(now, last);
      last = now;
      return since.utilization;
    },
    usedHeapBytes: () => v8.getHeapStatistics().used_heap_size,
    collect: async () => collectNow(),
  };
}
