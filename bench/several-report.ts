/**
 * The several-controllers section of BENCHMARKS.md (`npm run bench -- --controllers`): the
 * fan-out with 1, 2 and 3 controllers on one PostgreSQL, the failover after a `kill -9`, and the
 * two stores' commit latency. The section replaces its own kept block of BENCHMARKS.md and
 * leaves every other section as it was (see replaceKeptSection in report.ts).
 */
import type { FetchStatements } from './fetch-statements.js';
import type { SeveralFanoutRun, SeveralResult } from './several.js';
import type { StoreLatency } from './store-latency.js';
import { median, pushWorkersPhrase, round } from './util.js';

/** The marker the section starts with; `npm run bench -- --controllers` replaces the block it opens. */
export const SEVERAL_MARKER =
  '<!-- kept: several controllers (npm run bench -- --controllers replaces this section) -->';

/** When and how a part was measured, for a part carried over from an earlier run. */
export interface PartMeta {
  date: string;
  command: string;
  commit: string;
  loadStart: number[];
  loadEnd: number[];
}

export interface SeveralReport {
  date: string;
  command: string;
  elapsedS: number;
  machine: string;
  loadStart: number[];
  loadEnd: number[];
  isolation: string;
  pgVersion: string;
  commit: string;
  several: SeveralResult | null;
  store: StoreLatency[] | null;
  /** Statements per fetch on PostgreSQL (pg_stat_statements; absent without it, or in runs before 2026-12-08). */
  fetchStatements?: FetchStatements | null;
  problems: string[];
  /** Written while the run was still going (after each finished run, so a stopped run keeps them). */
  partial?: boolean;
  /** Parts this run did not measure, kept from the last run that did (BENCHMARKS-controllers.json). */
  carried?: { several?: PartMeta; store?: PartMeta };
}

function carriedLine(m: PartMeta | undefined): string | null {
  if (!m) return null;
  return `(Kept from an earlier run: \`${m.command}\` on ${m.date.replace('T', ' ').slice(0, 16)} UTC, commit ${m.commit}, load average ${m.loadStart.join(' ')} at its start.)`;
}

const s = (ms: number): string => (Number.isFinite(ms) ? `${round(ms / 1000, 2)} s` : 'n/a');
const ms = (x: number): string => (Number.isFinite(x) ? `${x.toLocaleString('en-US')} ms` : 'n/a');
const n = (x: number): string => x.toLocaleString('en-US');

function fanoutRows(runs: SeveralFanoutRun[]): string[] {
  const L: string[] = [];
  const keys = [...new Set(runs.map((r) => `${r.n}/${r.controllers}`))];
  for (const key of keys) {
    const rs = runs.filter((r) => `${r.n}/${r.controllers}` === key);
    const r0 = rs[0]!;
    const med = (f: (r: SeveralFanoutRun) => number): number => median(rs.map(f));
    const split = rs[rs.length - 1]!.perController.map(
      (c) => `${c.name}: ${n(c.owned)} owned, ${c.cpuS} s, ${n(c.fetch200)} fetches`,
    );
    L.push(
      `| ${n(r0.n)} | ${r0.controllers} | ${rs.length} | ${rs.map((r) => `${r.acked}/${r.fetched}`).join(', ')} | ${s(med((r) => r.commitMs))} | ${s(med((r) => r.firstAckedMs))} | ${s(med((r) => r.allAckedMs))} | ${s(med((r) => r.allFetchedMs))} (${rs.map((r) => s(r.allFetchedMs)).join(', ')}) | ${ms(r0.ackMs.p50)} / ${ms(r0.ackMs.p99)} | ${ms(r0.fetchMs.p50)} / ${ms(r0.fetchMs.p99)} | ${round(
        med((r) => r.controllerCpuS),
        2,
      )} s | ${n(Math.round(med((r) => r.cpuPerAgentUs)))} µs | ${split.join('; ')} | ${round(
        med((r) => r.db.commitsPerNode),
        2,
      )} / ${round(
        med((r) => r.db.writeTxPerNode),
        2,
      )} |`,
    );
  }
  return L;
}

export function severalMarkdown(r: SeveralReport): string {
  const L: string[] = [];
  const p = (x = ''): void => {
    L.push(x);
  };
  p(SEVERAL_MARKER);
  p('## Several controllers on one PostgreSQL');
  p();
  p(
    `\`${r.command}\` on ${r.date.replace('T', ' ').slice(0, 19)} UTC in ${Math.round(r.elapsedS)} s; commit ${r.commit}. Machine: ${r.machine}. PostgreSQL ${r.pgVersion} (a throwaway server the run started: \`initdb\` in the run directory, \`fsync\` on, \`max_connections\` 100).`,
  );
  p(
    `Load average (1, 5, 15 min) at start ${r.loadStart.join(' ')}, at end ${r.loadEnd.join(' ')}: shared cores, timings are upper bounds. ${r.isolation}`,
  );
  p();
  if (r.partial) {
    p(
      '**Partial: written while the run was still going (after its last finished step); the parts below are the finished ones.**',
    );
    p();
  }
  p(
    r.problems.length === 0
      ? 'Checks: all passed (every agent acked and fetched each change; every orphaned node pinged by a survivor).'
      : `Checks: **${r.problems.length} failed**: ${r.problems.map((x) => x.replace(/\|/g, '/')).join('; ')}`,
  );
  p();
  const sev = r.several;
  const sevCarried = carriedLine(r.carried?.several);
  if (sev && sev.fanout.length > 0) {
    p('### Fan-out with 1, 2 and 3 controllers');
    p();
    if (sevCarried) {
      p(sevCarried);
      p();
    }
    p(`Controllers: ${workersText(sev.workersPerController)}.`);
    p();
    p(
      "| N | controllers | runs | acked / fetched | request answered | first acked | all acked | all fetched (runs) | ack p50 / p99 | fetch p50 / p99 | controllers' CPU | CPU per agent | per controller (last run) | commits per node changed: all / write |",
    );
    p('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
    for (const line of fanoutRows(sev.fanout)) p(line);
    p();
    const st = sev.fanout.filter((f) => f.db.statements !== undefined);
    if (st.length > 0) {
      p(
        `Statements per node changed (\`bench/pg-statements.ts\`, last run of each): ${st
          .filter((f, i) => st.findLastIndex((g) => g.n === f.n && g.controllers === f.controllers) === i)
          .map(
            (f) =>
              `${n(f.n)} × ${f.controllers}: ${f.db.statements!.perNode} (${f.db
                .statements!.top.slice(0, 4)
                .map((x) => `\`${x.query.slice(0, 48)}\` ${x.perNode}`)
                .join(', ')})`,
          )
          .join('; ')}.`,
      );
      p();
    }
    const bg = sev.fanout.map(
      (f) => `${n(f.n)} × ${f.controllers}: ${f.db.bgCommitsPerS}/s (${f.db.bgWriteTxPerS} write/s)`,
    );
    p(
      `Background commits subtracted (N × controllers: commits per second in the quieter of the idle windows before and after the run): ${[...new Set(bg)].join(', ')}.`,
    );
    if (sev.grow.length > 0)
      p(
        `Starting the fleets (agents announced and dialled, until their controllers hold every node): ${sev.grow
          .filter((g) => g.added > 0)
          .map((g) => `${g.label ?? ''} +${n(g.added)} to ${n(g.n)} in ${s(g.addMs)}`)
          .join(', ')}.`,
      );
    p();
  }
  if (sev && sev.failover.length > 0) {
    p('### Failover: `kill -9` of one controller of three');
    p();
    if (sevCarried) {
      p(sevCarried);
      p();
    }
    p(
      "| N | victim's nodes | pinged | kill → lease ended | → first claimed | → last claimed | → first pinged | → last pinged | claim → ping p50 / p99 | dial rate | survivors' CPU (per orphan) |",
    );
    p('|---|---|---|---|---|---|---|---|---|---|---|');
    for (const f of sev.failover)
      p(
        `| ${n(f.n)} | ${n(f.orphans)} (${f.victim}) | ${n(f.pinged)}${f.timedOut ? ' **(window closed)**' : ''} | ${s(f.leaseEndMs)} | ${s(f.firstClaimMs)} | ${s(f.lastClaimMs)} | ${s(f.firstPingMs)} | **${s(f.lastPingMs)}** | ${ms(f.claimToPingMs.p50)} / ${ms(f.claimToPingMs.p99)} | ${n(f.dialRatePerS)}/s | ${f.survivorCpuS} s (${n(f.cpuPerOrphanUs)} µs) |`,
      );
    p();
    for (const f of sev.failover) {
      const detect = f.firstClaimMs;
      const redial = f.lastPingMs - f.firstClaimMs;
      p(
        `- N = ${n(f.n)}: kill → last ping ${s(f.lastPingMs)}: detection ${s(detect)} (${Math.round((100 * detect) / f.lastPingMs)} %; lease ended at ${s(f.leaseEndMs)}), re-dialling ${n(f.orphans)} agents ${s(redial)} (${n(f.dialRatePerS)}/s).`,
      );
    }
    p();
  }
  if (r.store && r.store.length > 0) {
    p('### Commit latency: PostgreSQL store next to SQLite');
    p();
    const storeCarried = carriedLine(r.carried?.store);
    if (storeCarried) {
      p(storeCarried);
      p();
    }
    const [a, b] = [r.store.find((x) => x.store === 'sqlite'), r.store.find((x) => x.store === 'postgres')];
    p(
      `\`bench/store-latency.ts\`, one call at a time, ${n(a?.samples ?? b?.samples ?? 0)} samples each after a warm-up.`,
    );
    p();
    p('| transaction | SQLite p50 / p99 | PostgreSQL p50 / p99 | PostgreSQL / SQLite (p50) |');
    p('|---|---|---|---|');
    const label: Record<string, string> = {
      createDeployment: '`createDeployment` (new deployment: generation, audit)',
      updateDeployment: '`updateDeployment` (a PATCH: new revision)',
      signal: "signal (`recordSignal` in one `transaction()`, the API's signal route)",
      recordAcked: '`recordAcked` (one node)',
    };
    for (const op of Object.keys(label)) {
      const x = a?.ops[op as keyof StoreLatency['ops']];
      const y = b?.ops[op as keyof StoreLatency['ops']];
      p(
        `| ${label[op]} | ${x ? `${x.p50} / ${x.p99} ms` : 'n/a'} | ${y ? `${y.p50} / ${y.p99} ms` : 'n/a'} | ${x && y ? `${round(y.p50 / x.p50, 1)}×` : 'n/a'} |`,
      );
    }
    p();
    const fs = r.fetchStatements;
    if (fs) {
      p(
        `Statements per fetch (\`bench/fetch-statements.ts\`, ${n(fs.nodes)} nodes): **${fs.per200}** (200, nothing cached), **${fs.per304}** (304).`,
      );
      p();
    }
    const [ca, cb] = [a?.cluster, b?.cluster];
    const c = ca ?? cb;
    if (c) {
      p(`A cluster of ${n(c.n)} nodes in the same stores, ${c.concurrency} signals in flight at once:`);
      p();
      p('| store | create: wall / CPU of this process | every install signalled | signals per second | status |');
      p('|---|---|---|---|---|');
      for (const [label, x] of [
        ['SQLite', ca],
        ['PostgreSQL', cb],
      ] as const)
        if (x)
          p(
            `| ${label} | ${n(x.createMs)} / ${n(x.createCpuMs)} ms | ${n(x.signalsMs)} ms | ${n(round((x.n * 1000) / x.signalsMs, 0))} | ${x.status} |`,
          );
      p();
    }
  }
  return L.join('\n');
}

/**
 * `one push worker each, …`: what each controller ran, counted at the first bed's start (results
 * from before 2026-12-06 did not count: their controllers ran the default of then, one).
 */
function workersText(workers: number | undefined): string {
  return `${pushWorkersPhrase(workers ?? 1)} each: the default on these cores unless the command above gives \`--push-workers\``;
}
