/**
 * `npm run bench -- --controllers [store,fanout,failover]`: the several-controllers benchmark
 * alone. Starts a throwaway PostgreSQL, runs the parts asked for (the stores' commit
 * latency first, on a machine the fleet does not load yet; then the fan-out and failover steps on
 * one bed), writes BENCHMARKS-controllers.json (every raw figure) and replaces its section of
 * BENCHMARKS.md, leaving the others as they were. Exits non-zero when a check failed (an agent
 * that did not ack or fetch a change, an orphan not pinged in its window).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { benchPki, slot } from './pki-cache.js';
import { startBenchPg } from './pg.js';
import { replaceKeptSection } from './report.js';
import { CONTROLLER_NAMES, ensureControllerCerts, SeveralBed } from './several-bed.js';
import { type PartMeta, SEVERAL_MARKER, severalMarkdown, type SeveralReport } from './several-report.js';
import { severalPhase, type SeveralResult } from './several.js';
import { storeLatencyPhase, type StoreLatency } from './store-latency.js';
import { fetchStatementsPhase, type FetchStatements } from './fetch-statements.js';
import { loadAvg, say } from './util.js';

/** Single-change transactions timed per store. */
const STORE_SAMPLES = 400;

export interface SeveralMainOptions {
  parts: Set<string>;
  controllerNs: number[];
  failoverNs: number[];
  runs: number | null;
  pushWorkers: number | undefined;
  out: string;
  root: string;
  inNs: boolean;
  /** Controllers at port + 1..3, PostgreSQL at port + 10. */
  port: number;
  command: string;
}

export async function severalMain(o: SeveralMainOptions): Promise<number> {
  const started = new Date();
  const loadStart = loadAvg();
  const tmp = path.join(o.root, 'tmp');
  const runDir = path.join(tmp, 'bench-run');
  fs.rmSync(runDir, { recursive: true, force: true });
  fs.mkdirSync(runDir, { recursive: true });
  const fanoutNs = o.parts.has('fanout') ? o.controllerNs : [];
  const failoverNs = o.parts.has('failover') ? o.failoverNs : [];
  const maxN = Math.max(0, ...fanoutNs, ...failoverNs);
  say(
    `several controllers (${[...o.parts].join(', ')}): fan-out N ${fanoutNs.join(', ') || '-'}, failover N ${failoverNs.join(', ') || '-'}; load average ${loadStart.join(' ')}`,
  );
  const { pki, issued, issueMs } = await benchPki(
    path.join(tmp, 'bench-pki'),
    Array.from({ length: maxN }, (_, i) => slot('b', i)),
  );
  say(`PKI ready (${issued} agent certificates issued in ${issueMs} ms)`);
  await ensureControllerCerts(pki, CONTROLLER_NAMES);
  const pg = await startBenchPg(o.port + 10);
  say(`PostgreSQL ${pg.version} on 127.0.0.1:${pg.port}`);
  let store: StoreLatency[] | null = null;
  let fetchStatements: FetchStatements | null = null;
  let several: SeveralResult | null = null;
  const problems: string[] = [];
  const write = (final: boolean): SeveralReport => {
    const report: SeveralReport = {
      date: started.toISOString(),
      command: o.command,
      elapsedS: (Date.now() - started.getTime()) / 1000,
      machine: `${os.cpus().length} cores (${os.cpus()[0]?.model.split(' ').slice(0, 2).join(' ')}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}, Linux ${os.release()}`,
      loadStart,
      loadEnd: loadAvg(),
      isolation: o.inNs
        ? 'The run had its own network and PID namespaces (its loopback carried only its own traffic).'
        : 'The run shared the network namespace of the machine.',
      pgVersion: pg.version,
      commit: gitCommit(o.root),
      several,
      store,
      fetchStatements,
      problems: [...problems, ...(several?.problems ?? [])],
      ...(final ? {} : { partial: true }),
    };
    fs.mkdirSync(o.out, { recursive: true });
    const jsonPath = path.join(o.out, 'BENCHMARKS-controllers.json');
    carryOver(report, jsonPath);
    fs.writeFileSync(jsonPath, `${JSON.stringify(report, null, 2)}\n`);
    formatLikeTheTree(jsonPath);
    const md = path.join(o.out, 'BENCHMARKS.md');
    const old = fs.existsSync(md) ? fs.readFileSync(md, 'utf8') : '';
    fs.writeFileSync(md, replaceKeptSection(old, SEVERAL_MARKER, severalMarkdown(report)));
    return report;
  };
  try {
    if (o.parts.has('store')) {
      store = await storeLatencyPhase({
        runDir,
        pgUrl: await pg.createDatabase('herald_latency'),
        samples: STORE_SAMPLES,
      });
      for (const x of store)
        say(
          `store latency ${x.store}: createDeployment p50 ${x.ops.createDeployment.p50} ms, p99 ${x.ops.createDeployment.p99} ms; signal p50 ${x.ops.signal.p50} ms; a cluster of ${x.cluster?.n} created in ${x.cluster?.createMs} ms, its installs signalled in ${x.cluster?.signalsMs} ms (${x.cluster?.status})`,
        );
      if (pg.statements) {
        fetchStatements = await fetchStatementsPhase(await pg.createDatabase('herald_fetch'));
        if (fetchStatements)
          say(
            `statements per fetch on PostgreSQL: ${fetchStatements.per200} (200, nothing cached), ${fetchStatements.per304} (304)`,
          );
      }
    }
    if (fanoutNs.length + failoverNs.length > 0) {
      several = await severalPhase({
        makeBed: async (label, names) =>
          new SeveralBed({
            pki,
            runDir,
            port: o.port,
            pg,
            dbUrl: await pg.createDatabase(`herald_${label.replace(/-/g, '_')}`),
            pushWorkers: o.pushWorkers,
            names,
            label,
          }),
        fanoutNs,
        failoverNs,
        runsFor: (n) => o.runs ?? (n >= 5_000 ? 1 : 2),
        onProgress: (partial) => {
          several = partial;
          write(false);
        },
      });
    }
  } catch (err) {
    problems.push(`the benchmark stopped: ${(err as Error).message}`);
    say(`several controllers: ${(err as Error).stack ?? String(err)}`);
  } finally {
    await pg.close();
  }
  const report = write(true);
  const failed = report.problems;
  say(
    `several controllers: done in ${Math.round(report.elapsedS)} s; ${failed.length === 0 ? 'all checks passed' : `${failed.length} check(s) FAILED`}`,
  );
  for (const p of failed) say(`FAILED: ${p}`);
  return failed.length === 0 ? 0 : 1;
}

/**
 * A part this run did not measure keeps the last run's figures (and says when they were taken), so
 * `--controllers store` alone does not drop the fan-out and failover tables.
 */
function carryOver(report: SeveralReport, jsonPath: string): void {
  let old: SeveralReport;
  try {
    old = JSON.parse(fs.readFileSync(jsonPath, 'utf8')) as SeveralReport;
  } catch {
    return;
  }
  const meta = (m: PartMeta | undefined): PartMeta =>
    m ?? { date: old.date, command: old.command, commit: old.commit, loadStart: old.loadStart, loadEnd: old.loadEnd };
  report.carried = {};
  if (report.several === null && old.several) {
    report.several = old.several;
    report.carried.several = meta(old.carried?.several);
  }
  if (report.store === null && old.store) {
    report.store = old.store;
    report.fetchStatements = old.fetchStatements ?? null;
    report.carried.store = meta(old.carried?.store);
  }
}

/**
 * The JSON lies in the checkout, where `biome format .` (part of every commit's checks) would
 * refuse JSON.stringify's layout: it is written in the formatter's when the formatter is there.
 */
export function formatLikeTheTree(file: string): void {
  const biome = path.join(path.dirname(file), 'node_modules', '.bin', 'biome');
  if (fs.existsSync(biome)) spawnSync(biome, ['format', '--write', file], { stdio: 'ignore' });
}

/** The checkout's commit, short (`unknown` outside git). */
export function gitCommit(root: string): string {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim();
  } catch {
    return 'unknown';
  }
}
