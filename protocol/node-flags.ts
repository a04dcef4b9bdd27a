/**
 * The node flags every long-running Herald process starts with. V8 takes them only on node's
 * command line, so they are spelled out where processes start: `bin/herald`'s `#!` line, the
 * agent's systemd unit (packaging/herald-agent.service), and the processes the demo, the tests and
 * the benchmark start with `process.execPath`. test/protocol/node-flags.test.ts keeps the first
 * two equal to this list. Pure: no I/O.
 */
import { NODE_MAX_SEMI_SPACE_BYTES } from './limits.js';

export const HERALD_NODE_FLAGS: readonly string[] = [`--max-semi-space-size=${NODE_MAX_SEMI_SPACE_BYTES / 2 ** 20}`];
