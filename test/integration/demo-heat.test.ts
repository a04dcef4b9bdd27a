/**
 * `bin/herald demo --heat` end to end, as a user runs it: a controller serving Heat's object store,
 * three agents, unmodified OpenStack Heat (cli/testbed/heat.ts), a stack of the cluster-restart
 * blueprint created and restarted with `openstack stack update`; the timeline must show every
 * node's uninstall and install hooks started after Heat's metadata PUT reached Herald, and Heat's
 * UPDATE_COMPLETE; then nothing left running. And its option errors, one coded line each.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { HEAT_DEMO_NODES } from '../../cli/demo/heat.js';
import { HEAT_SERVICE_PACKAGES, heatAvailable } from '../../cli/testbed/heat.js';
import { runCli } from '../cli/harness.js';
import { isBuilt } from '../helpers/procs.js';

const heatHere = heatAvailable(false);
if (!heatHere)
  console.log(
    `demo-heat: the demo's run is skipped, OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_SERVICE_PACKAGES.join(' ')})`,
  );

/** Heat's start, a stack create and an update on a loaded 2-core machine. */
const DEMO_TIMEOUT_MS = 420_000;
const dirs: string[] = [];

afterAll(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** The pids of processes whose command line names `dir`. */
function processesIn(dir: string): number[] {
  const out: number[] = [];
  for (const p of fs.readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      if (fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(dir)) out.push(Number(p));
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/** A timeline line: `+3.25 s  n1, n2  uninstall hook started` → its time in ms, its nodes and what. */
function timeline(out: string): Array<{ ms: number; nodes: string[]; what: string }> {
  const rows: Array<{ ms: number; nodes: string[]; what: string }> = [];
  for (const m of out.matchAll(/^ +\+(\d+(?:\.\d+)?) (ms|s) {2}(?:((?:n\d, )*n\d) +)?(\S.*)$/gm)) {
    rows.push({
      ms: Number(m[1]) * (m[2] === 's' ? 1000 : 1),
      nodes: m[3] ? m[3].split(', ') : [],
      what: m[4]!,
    });
  }
  return rows;
}

describe.skipIf(!isBuilt())('herald demo --heat', () => {
  it.skipIf(!heatHere)(
    "restarts Heat's stack: every node's uninstall then install started after Heat's metadata PUT reached Herald, and Heat's UPDATE_COMPLETE",
    async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-heat-'));
      dirs.push(dir);
      const r = await runCli(['demo', '--heat', '--dir', dir], { timeoutMs: DEMO_TIMEOUT_MS });
      expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stderr).toBe('');
      const rows = timeline(r.stdout);
      const first = (what: string, node?: string) =>
        rows.find((x) => x.what === what && (node === undefined || x.nodes.includes(node)));

      expect(rows[0]).toMatchObject({ ms: 0, what: expect.stringMatching(/^openstack stack update --existing/) });
      const patch = first("Heat's API received the PATCH");
      expect(patch, r.stdout).toBeDefined();
      const done = first('Heat: stack UPDATE_COMPLETE');
      expect(done, r.stdout).toBeDefined();
      expect(rows.at(-1)).toBe(done);
      for (const n of HEAT_DEMO_NODES) {
        const put = first("Heat's metadata PUT reached Herald", n);
        const un = first('uninstall hook started', n);
        const inst = first('install hook started', n);
        expect(put, `${n}\n${r.stdout}`).toBeDefined();
        expect(un, `${n}\n${r.stdout}`).toBeDefined();
        expect(inst, `${n}\n${r.stdout}`).toBeDefined();
        expect(patch!.ms).toBeLessThanOrEqual(put!.ms);
        expect(put!.ms).toBeLessThanOrEqual(un!.ms);
        expect(un!.ms).toBeLessThanOrEqual(inst!.ms);
        expect(inst!.ms).toBeLessThanOrEqual(done!.ms);
        // each node's row of the gaps table: both hooks have a gap from their write
        expect(r.stdout).toMatch(new RegExp(`^${n} +\\d+(\\.\\d+)? m?s +\\d+(\\.\\d+)? m?s *$`, 'm'));
      }
      expect(r.stdout).toMatch(/^os-collect-config at its default 30 s interval \(computed, not measured\)/m);
      expect(r.stdout).toMatch(/^✓ every node ran its uninstall, then its install, and Heat completed the update/m);
      expect(r.stdout).not.toMatch(/✗/);

      // the scripts' own record: the install at the create and at the restart, the uninstall at the restart
      for (const n of HEAT_DEMO_NODES) {
        const lines = (hook: string) =>
          fs
            .readFileSync(path.join(dir, 'marks', `${n}.${hook}`), 'utf8')
            .trim()
            .split('\n').length;
        expect(lines('install')).toBe(2);
        expect(lines('uninstall')).toBe(1);
      }
      // nothing left running: Herald's processes and Heat's
      expect(processesIn(dir)).toEqual([]);
    },
    DEMO_TIMEOUT_MS + 30_000,
  );

  it('refuses --nodes, --controllers and --db beside --heat, with one coded line', async () => {
    for (const extra of [
      ['--nodes', '4'],
      ['--controllers', '3'],
      ['--db', 'postgres://h@127.0.0.1:1/d'],
    ]) {
      const r = await runCli(['demo', '--heat', ...extra]);
      expect(r.code).toBe(1);
      const lines = r.stderr.trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(/^herald: bad_option: --heat runs its own three nodes/);
    }
  });
});
