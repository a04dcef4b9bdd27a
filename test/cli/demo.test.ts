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

  it('--upgrade: a new version with canaries promoted once healthy, then a broken one the canary catches and the rollout reverts', async () => {
    const r = await runCli(['demo', '--upgrade', '--nodes', '4'], { timeoutMs: 90_000 });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    const out = r.stdout;
    expect(out).toMatch(/ rollout: canary phase: n1, n3 first$/m);
    expect(out).toMatch(/ rollout: canaries promoted automatically \(auto_promote_s 1\)$/m);
    expect(out).toMatch(/ cluster UPDATE_COMPLETE$/m);
    expect(out).toMatch(/ rollout: reverting n1 to revision 2: update failed on n1: check: /m);
    expect(out).toMatch(/^ {2}UPDATE_FAILED: update failed on n1: check: .*; reverted to revision 2: n1$/m);
    expect(out).toMatch(/counters: targeted 4, completed 0, failed 1, timed_out 0, in_flight 0, reverted 1/);
    const rows = out.split('\n').filter((l) => /^n\d+\s/.test(l) && l.includes(' v2 pid '));
    expect(rows).toHaveLength(4);
    for (const row of rows) expect(row, row).toMatch(/same ✓\s+same ✓\s+v2 pid \d+ ✓\s+2\s+(reverted|untouched)$/);
    expect(out).toMatch(/^3 \(current\)\s+no\s/m);
    expect(out).toMatch(/✓ every node runs service version 2/);
  }, 100_000);

  it('--dial-out with --heat, --controllers or --db is bad_option', async () => {
    const r = await runCli(['demo', '--dial-out', '--controllers', '3'], { timeoutMs: 30_000 });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain('bad_option');
  });
});
