/** `bin/herald demo`: the whole restart story end to end, as a user runs it after `npm ci`. */
import { describe, expect, it } from 'vitest';
import { runCli } from './harness.js';

describe('herald demo', () => {
  it('exits 0 showing changed service pids, same containers and volumes, and cleans up', async () => {
    const started = Date.now();
    const r = await runCli(['demo'], { timeoutMs: 90_000 });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(Date.now() - started).toBeLessThan(60_000);
    const rows = r.stdout.split('\n').filter((l) => /^n\d+\s/.test(l) && l.includes('→') && l.includes('changed'));
    expect(rows).toHaveLength(5);
    for (const row of rows) {
      const m = /^(n\d+)\s+(\d+) same ✓\s+same ✓\s+(\d+) → (\d+) changed ✓/.exec(row);
      expect(m, row).not.toBeNull();
      expect(m![3]).not.toBe(m![4]);
    }
    expect(r.stdout).toMatch(/RESTART_COMPLETE/);
    expect(r.stdout).toMatch(/Stopped everything and removed the directory/);
    const root = /in (\S+herald-demo-\S+)$/m.exec(r.stdout)?.[1];
    expect(root).toBeDefined();
    const fs = await import('node:fs');
    expect(fs.existsSync(root!)).toBe(false);
  }, 100_000);
});
