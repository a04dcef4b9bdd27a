/** Shared bits of the hook runner tests: items, temp dirs, /proc polling. */
import { readProcStat } from '../helpers/procs.js';
import { readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { MetadataInput, MetadataItem } from '../../protocol/heat.js';

export async function tempDir(prefix = 'herald-hooks-'): Promise<string> {
  return mkdtemp(join(tmpdir(), prefix));
}

let n = 0;
export function item(
  over: Partial<MetadataItem> & { inputValues?: Record<string, unknown>; outputNames?: string[] } = {},
): MetadataItem {
  n++;
  const { inputValues, outputNames, ...rest } = over;
  const inputs: MetadataInput[] = Object.entries(inputValues ?? {}).map(([name, value]) => ({
    name,
    value,
    type:
      typeof value === 'number'
        ? 'Number'
        : typeof value === 'boolean'
          ? 'Boolean'
          : Array.isArray(value)
            ? 'CommaDelimitedList'
            : typeof value === 'object'
              ? 'Json'
              : 'String',
  }));
  return {
    id: `item-${n}`,
    name: `dep-${n}`,
    group: 'script',
    creation_time: '2026-01-01T00:00:00Z',
    config: '#!/bin/sh\ntrue\n',
    inputs,
    outputs: (outputNames ?? []).map((name) => ({ name, type: 'String', error_output: false })),
    options: {},
    deployment_id: `d-${n}`,
    revision: 1,
    signalled: false,
    ...rest,
  };
}

/** The state letter of /proc/<pid>/stat, undefined when the process is gone. */
export function procState(pid: number): string | undefined {
  return readProcStat(pid)?.state;
}

/** Polls /proc until the process is gone or a zombie; false when still alive after `boundMs`. */
export async function waitDead(pid: number, boundMs = 5_000): Promise<boolean> {
  const deadline = Date.now() + boundMs;
  for (;;) {
    const s = procState(pid);
    if (s === undefined || s === 'Z') return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Polls until `path` can be read and is non-empty, with a bound. */
export async function waitFile(path: string, boundMs = 5_000): Promise<string> {
  const deadline = Date.now() + boundMs;
  for (;;) {
    try {
      const t = readFileSync(path, 'utf8');
      if (t.trim() !== '') return t.trim();
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) throw new Error(`${path} did not appear`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
