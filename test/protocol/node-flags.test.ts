/**
 * V8 takes its heap flags only on node's command line: the places that start Herald's processes
 * outside our own code say them literally, and must say what protocol/node-flags.ts says.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { NODE_MAX_SEMI_SPACE_BYTES } from '../../protocol/limits.js';
import { HERALD_NODE_FLAGS } from '../../protocol/node-flags.js';

const read = (p: string): string => readFileSync(new URL(`../../${p}`, import.meta.url), 'utf8');

describe('node flags of Herald processes', () => {
  it('cap the young generation at NODE_MAX_SEMI_SPACE_BYTES', () => {
    expect(HERALD_NODE_FLAGS).toEqual([`--max-semi-space-size=${NODE_MAX_SEMI_SPACE_BYTES / 2 ** 20}`]);
  });

  it("are on bin/herald's #! line (env -S passes them to node)", () => {
    expect(read('bin/herald').split('\n')[0]).toBe(`#!/usr/bin/env -S node ${HERALD_NODE_FLAGS.join(' ')}`);
  });

  it("are in the agent unit's ExecStart, before the bundle", () => {
    const exec = read('packaging/herald-agent.service')
      .split('\n')
      .find((l) => l.startsWith('ExecStart='));
    expect(exec).toContain(
      `/usr/bin/env node ${HERALD_NODE_FLAGS.join(' ')} /usr/local/lib/herald/herald-agent.mjs agent `,
    );
  });
});
