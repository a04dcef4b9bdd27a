/**
 * A stock OpenStack node for tests: the testbed's (cli/testbed/occ-node.ts), with heat-agents'
 * files from test/fixtures/heat-agents/ (laid out by hand, never committed: README.md there).
 */
import path from 'node:path';
import {
  heatAgentsProblems as problemsIn,
  type OccNode,
  type OccNodeOptions,
  startOccNode as startIn,
} from '../../cli/testbed/occ-node.js';
import { REPO } from './procs.js';

export {
  HEAT_AGENTS_COMMIT,
  HEAT_AGENTS_FILES,
  OCC_POLLING_INTERVAL_DEFAULT_S,
  type OccNode,
  type OccNodeOptions,
  type WaitOptions,
} from '../../cli/testbed/occ-node.js';

export const HEAT_AGENTS_DIR = path.join(REPO, 'test', 'fixtures', 'heat-agents');

/** The heat-agents files missing from test/fixtures/heat-agents/ or changed there; empty when a node can run. */
export function heatAgentsProblems(): string[] {
  return problemsIn(HEAT_AGENTS_DIR);
}

/** Starts a stock node with test/fixtures/heat-agents/'s files (see cli/testbed/occ-node.ts). */
export function startOccNode(o: Omit<OccNodeOptions, 'heatAgentsDir'>): Promise<OccNode> {
  return startIn({ ...o, heatAgentsDir: HEAT_AGENTS_DIR });
}
