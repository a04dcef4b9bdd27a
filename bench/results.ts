/** What one benchmark run measured, by phase: what the report and its findings read. */
import type { FanoutResult } from './fanout.js';
import type { IdleResult } from './idle.js';
import type { LatencyResult } from './latency.js';
import type { RestartResult } from './restart.js';

export type BenchResults = {
  latency?: LatencyResult;
  fanout: FanoutResult[];
  restart?: RestartResult;
  restartFast?: RestartResult;
  idle?: IdleResult;
};
