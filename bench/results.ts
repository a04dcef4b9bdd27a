/** What one benchmark run measured, by phase: what the report and its findings read. */
import type { FanoutResult } from './fanout.js';
import type { FloorResult } from './floor.js';
import type { IdleResult } from './idle.js';
import type { LatencyResult } from './latency.js';
import type { RestartResult } from './restart.js';

export type BenchResults = {
  latency?: LatencyResult;
  fanout: FanoutResult[];
  /** The fan-out's floor in the same run: a minimal controller of the same protocol (bench/floor.ts). */
  floor?: FloorResult;
  restart?: RestartResult;
  restartFast?: RestartResult;
  /** The real-hooks restart with one `herald agent` process per node (absent in older results). */
  restartProcs?: RestartResult;
  idle?: IdleResult;
};
