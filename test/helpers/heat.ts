/**
 * Unmodified OpenStack Heat for tests: the testbed's (cli/testbed/heat.ts, its files in
 * cli/testbed/heat/), and the folder of the templates the tests hand it (test/fixtures/heat/).
 */
import path from 'node:path';
import { REPO } from './procs.js';

export * from '../../cli/testbed/heat.js';

/** The tests' Heat templates and metadata (README.md there). */
export const HEAT_FIXTURE_DIR = path.join(REPO, 'test', 'fixtures', 'heat');
