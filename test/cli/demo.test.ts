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
    // one admin certificate runs it all; the viewer it grants reads and is refused a restart
    expect(r.stdout).toMatch(/^ {2}oncall: GET \/v1\/clusters\/\S+ → 200, RESTART_COMPLETE$/m);
    expect(r.stdout).toMatch(
      /^ {2}oncall: PATCH \/v1\/clusters\/\S+\/actions\/restart → 403 forbidden: deploy needs the role deployer/m,
    );
    expect(r.stdout).toMatch(/Stopped everything and removed the directory/);
    const root = /in (\S+herald-demo-\S+)$/m.exec(r.stdout)?.[1];
    expect(root).toBeDefined();
    const fs = await import('node:fs');
    expect(fs.existsSync(root!)).toBe(false);
  }, 100_000);

  it('--dial-out: agents that listen on nothing dial in, and the restart reaches them by push', async () => {
    const r = await runCli(['demo', '--dial-out', '--nodes', '3'], { timeoutMs: 90_000 });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/3 agents dialled in \(they listen on nothing\)/);
    expect(r.stdout).toMatch(/RESTART_COMPLETE/);
    const rows = r.stdout.split('\n').filter((l) => /^n\d+\s/.test(l) && l.includes('changed ✓'));
    expect(rows).toHaveLength(3);
  }, 100_000);

  it('--dial-out with --heat, --controllers or --db is bad_option', async () => {
    const r = await runCli(['demo', '--dial-out', '--controllers', '3'], { timeoutMs: 30_000 });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('bad_option');
  });
});
