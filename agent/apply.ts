/**
 * The apply loop (docs/architecture.md): runs deployment items one at a time, in metadata order. An item runs
 * when its `id` has not run on this node and the controller does not already hold its result
 * (`signalled: true`). For each: started is recorded durably, the hook runs, its signal goes to
 * the outbox (durable), then finished is recorded. An item found started-but-not-finished at the
 * next start is signalled FAILED `interrupted` and never re-run: a new revision has a new id.
 *
 * The running hook's process group is also recorded (`running.json`), so that an agent killed
 * with SIGKILL can kill the group it left behind at its next start, and then remove the run
 * directories it left (their config and outputs may hold secrets, docs/architecture.md).
 */
import { isLiveState, parseProcStat } from '../protocol/proc-stat.js';
import { readdir, readFile, rm, unlink } from 'node:fs/promises';
import { readdirSync, readFileSync, readlinkSync, realpathSync, renameSync, writeFileSync } from 'node:fs';
import { join, sep } from 'node:path';
import { fitSignalBody, type MetadataDocument, type MetadataItem, type SignalBody } from '../protocol/heat.js';
import { withinJsonDepth } from '../protocol/json-depth.js';
import { AGENT_SHUTDOWN_GRACE_MS, MAX_JSON_DEPTH_LEVELS, MAX_SIGNAL_BODY_BYTES } from '../protocol/limits.js';
import type { Logger } from '../certs/tls.js';
import type { RunItem, RunOptions, RunResult } from './hooks/types.js';
import { INTERRUPTED_STATUS_CODE, type AgentState } from './state.js';
import type { OutboxSignal } from './outbox-store.js';
import type { LiveOutput } from './output-sender.js';

/** Where the running hook's process group is recorded. */
export const RUNNING_FILE = 'running.json';
/** The status_reason of an item the agent stopped (or died) in. */
export const INTERRUPTED_REASON = 'interrupted';
/** deploy_status_code of a run that threw instead of returning a result (a bug, not the hook). */
const RUNNER_ERROR_STATUS_CODE = -1;

export interface ApplyLoopOptions {
  node: string;
  state: AgentState;
  /** Puts a signal into the outbox; resolves once it is on disk. */
  enqueue: (signal: OutboxSignal) => Promise<unknown>;
  /** Loads the hook runner (lazily: execa and the hook code load only when a run happens). */
  loadRunItem: () => Promise<RunItem>;
  /** Passed to each run (runsDir, hooksDir, timeouts); `signal` and `onSpawn` are the loop's. */
  runOptions: Omit<RunOptions, 'signal' | 'onSpawn' | 'onOutput'>;
  /** Opens the live output sink of one run (docs/api.md); closed before its signal is queued. */
  openOutput?: (item: MetadataItem) => LiveOutput;
  log: Logger;
  /** Told when a hook process starts (tests). */
  onSpawn?: (pid: number, item: MetadataItem) => void;
}

/** The signal route of a deployment. */
export function signalPath(node: string, deploymentId: string): string {
  return `/v1/nodes/${encodeURIComponent(node)}/deployments/${encodeURIComponent(deploymentId)}/signal`;
}

interface RunningRecord {
  id: string;
  pid: number;
  /** /proc/<pid>/stat start time, so a recycled pid is never killed. */
  start: string | null;
}

export class ApplyLoop {
  readonly #o: ApplyLoopOptions;
  readonly #runningFile: string;
  #latest: MetadataDocument | null = null;
  #running: Promise<void> | null = null;
  #stopping = false;
  #abort = new AbortController();
  /** Items run by this process, for tests and logs. */
  runs = 0;
  readonly #idleWaiters: Array<() => void> = [];

  constructor(opts: ApplyLoopOptions) {
    this.#o = opts;
    this.#runningFile = join(opts.state.dir, RUNNING_FILE);
  }

  /**
   * At start: kills a process group a killed agent left behind, removes the run directories it
   * left, and signals every item that was started and never finished as FAILED `interrupted`.
   */
  async recover(): Promise<void> {
    await this.#killLeftover();
    await this.#removeLeftoverRunDirs();
    for (const it of this.#o.state.interruptedItems()) {
      const body: SignalBody = {
        revision: it.revision,
        deploy_status_code: INTERRUPTED_STATUS_CODE,
        deploy_stdout: '',
        deploy_stderr: `${INTERRUPTED_REASON}: the agent stopped while this deployment ran (started ${it.started_at}); it runs again only in a new revision\n`,
        outputs: {},
        status_reason: INTERRUPTED_REASON,
      };
      await this.#o.enqueue({
        node: this.#o.node,
        deployment_id: it.deployment_id,
        path: signalPath(this.#o.node, it.deployment_id),
        body,
      });
      await this.#o.state.markInterrupted(it.id);
      this.#o.log.warn(
        { item: it.id, deployment_id: it.deployment_id, revision: it.revision, code: 'interrupted' },
        'an item was running when the agent stopped; signalled FAILED interrupted',
      );
    }
  }

  /** Applies `doc` (the newest metadata); a run in progress finishes first. */
  submit(doc: MetadataDocument): void {
    if (this.#stopping) return;
    if (this.#latest === null || doc.generation >= this.#latest.generation) this.#latest = doc;
    if (this.#running) return;
    this.#running = this.#loop()
      .catch((err: unknown) => {
        // never an unhandled rejection: what failed is logged, the next document starts a new loop
        this.#o.log.error({ err }, 'the apply loop failed');
      })
      .finally(() => {
        this.#running = null;
        for (const w of this.#idleWaiters.splice(0)) w();
      });
  }

  /** Resolves when nothing is running or waiting to run. */
  idle(): Promise<void> {
    if (this.#running === null) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  get busy(): boolean {
    return this.#running !== null;
  }

  /**
   * Stops: no new item starts; a running hook may finish within `graceMs`, then its process
   * group is killed and the item recorded (and signalled) as interrupted.
   */
  async stop(graceMs: number = AGENT_SHUTDOWN_GRACE_MS): Promise<void> {
    this.#stopping = true;
    this.#latest = null;
    const running = this.#running;
    if (!running) return;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => resolve('timeout'), graceMs);
    });
    const r = await Promise.race([running.then(() => 'done' as const), timedOut]);
    clearTimeout(timer);
    if (r === 'timeout') {
      this.#o.log.warn({ graceMs }, 'a hook is still running at shutdown; killing its process group');
      this.#abort.abort();
      await running;
    }
  }

  async #loop(): Promise<void> {
    while (this.#latest !== null && !this.#stopping) {
      const doc = this.#latest;
      this.#latest = null;
      const completed = await this.#applyDocument(doc);
      if (completed && !this.#stopping) {
        const { state } = this.#o;
        const prev = state.lastAppliedGeneration;
        // both changes made before either is awaited: they share one state write
        const applied =
          prev === undefined || doc.generation > prev ? state.setLastAppliedGeneration(doc.generation) : undefined;
        const pruned = state
          .prune(doc.deployments.map((d) => d?.id).filter((x): x is string => typeof x === 'string'))
          .catch(() => 0);
        await applied;
        await pruned;
      }
    }
  }

  /** Runs what `doc` asks for; false when a newer document arrived (or stop) before the end. */
  async #applyDocument(doc: MetadataDocument): Promise<boolean> {
    for (const item of doc.deployments) {
      if (this.#stopping) return false;
      if (!isRunnable(item)) {
        this.#o.log.warn(
          { item: (item as { id?: unknown })?.id },
          'metadata item without id, deployment_id or revision; skipped',
        );
        continue;
      }
      if (item.signalled === true || this.#o.state.hasRun(item.id)) continue;
      await this.#runOne(item);
      // a newer document holds whatever is left of this one, in its own order
      if (this.#latest !== null) return false;
    }
    return true;
  }

  async #runOne(item: MetadataItem): Promise<void> {
    const { state, log } = this.#o;
    const meta = { item: item.id, deployment_id: item.deployment_id, revision: item.revision, group: item.group };
    await state.markStarted(item.id, { deployment_id: item.deployment_id, revision: item.revision });
    log.info(meta, 'deployment item started');
    const t0 = Date.now();
    let result: RunResult;
    const live = this.#o.openOutput?.(item);
    try {
      const runItem = await this.#o.loadRunItem();
      result = await runItem(item, {
        ...this.#o.runOptions,
        ...(live === undefined ? {} : { onOutput: live.write }),
        signal: this.#abort.signal,
        onSpawn: (pid) => {
          this.#recordRunning(item.id, pid);
          this.#o.onSpawn?.(pid, item);
        },
      });
    } catch (err) {
      log.error({ ...meta, err }, 'the hook runner failed');
      result = {
        deploy_status_code: RUNNER_ERROR_STATUS_CODE,
        deploy_stdout: '',
        deploy_stderr: `hook_failed: ${(err as Error)?.message ?? String(err)}\n`,
        outputs: {},
        status_reason: 'hook_failed: the agent could not run this item',
      };
    }
    await unlink(this.#runningFile).catch(() => undefined);
    // the last chunks go out before the signal when the controller takes them at once (bounded wait)
    await live?.close();
    const interrupted = this.#abort.signal.aborted;
    const body = signalBodyOf(item, result, interrupted);
    await this.#o.enqueue({
      node: this.#o.node,
      deployment_id: item.deployment_id,
      path: signalPath(this.#o.node, item.deployment_id),
      body,
    });
    if (interrupted) await state.markInterrupted(item.id);
    else await state.markFinished(item.id, body.deploy_status_code);
    this.runs++;
    log.info(
      { ...meta, status: body.deploy_status_code, reason: body.status_reason, ms: Date.now() - t0 },
      'deployment item finished',
    );
  }

  /**
   * Synchronous and without fsync on purpose: it must be on disk before the agent can be
   * killed a moment later, and it only matters while the machine runs (a reboot ends the hook).
   */
  #recordRunning(id: string, pid: number): void {
    const rec: RunningRecord = { id, pid, start: procStart(pid) };
    const tmp = `${this.#runningFile}.${pid}.tmp`;
    try {
      writeFileSync(tmp, JSON.stringify(rec), { mode: 0o600 });
      renameSync(tmp, this.#runningFile);
    } catch (err) {
      this.#o.log.warn({ err }, 'cannot record the running hook');
    }
  }

  /**
   * Kills what a killed agent left running: the recorded hook's process group, and the group of
   * any process still working in a run directory (a child that left the group but not the dir).
   */
  async #killLeftover(): Promise<void> {
    const groups = new Set<number>();
    try {
      const rec = JSON.parse(await readFile(this.#runningFile, 'utf8')) as RunningRecord;
      if (Number.isSafeInteger(rec.pid) && rec.pid > 1) {
        const now = procStart(rec.pid);
        // a live process with another start time is someone else's (pid recycled): leave it; a
        // dead leader may still have children in its group, and Linux never hands out a pid that
        // is in use as a process group id
        if (now === null || now === rec.start) groups.add(rec.pid);
      }
    } catch {
      // no record: nothing was running, or the agent died before the hook started
    }
    for (const pgid of groupsWorkingIn(this.#o.runOptions.runsDir)) groups.add(pgid);
    for (const pgid of groups) {
      if (pgid <= 1 || pgid === process.pid) continue;
      try {
        process.kill(-pgid, 'SIGKILL');
        this.#o.log.warn({ pgid }, 'killed the process group of a hook left by the previous run');
      } catch {
        // ESRCH: nothing left
      }
    }
    await unlink(this.#runningFile).catch(() => undefined);
  }

  /**
   * Removes whatever a killed agent left in the runs dir. Only this process makes run dirs and
   * none has started yet, so everything there is a leftover. Symlinks are removed, not followed.
   */
  async #removeLeftoverRunDirs(): Promise<void> {
    const dir = this.#o.runOptions.runsDir;
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      return; // no runs dir yet
    }
    let removed = 0;
    for (const n of names) {
      try {
        await rm(join(dir, n), { recursive: true, force: true });
        removed++;
      } catch (err) {
        this.#o.log.error(
          { err: (err as Error).message, entry: n },
          'cannot remove a run directory left by the previous run',
        );
      }
    }
    if (removed > 0)
      this.#o.log.warn(
        { removed, code: 'interrupted' },
        'removed run directories left by a previous run that was killed',
      );
  }
}

/** Process groups of processes whose working directory is inside `dir` (Linux /proc). */
function groupsWorkingIn(dir: string): Set<number> {
  const out = new Set<number>();
  let root: string;
  let pids: string[];
  try {
    root = realpathSync(dir);
    pids = readdirSync('/proc').filter((d) => /^\d+$/.test(d));
  } catch {
    return out;
  }
  for (const pid of pids) {
    try {
      const cwd = readlinkSync(`/proc/${pid}/cwd`);
      if (cwd !== root && !cwd.startsWith(root + sep)) continue;
      const s = parseProcStat(readFileSync(`/proc/${pid}/stat`, 'latin1'));
      if (s && isLiveState(s.state)) out.add(s.pgrp);
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/**
 * The signal of a run, fitted to the signal limit. Whatever a hook answered, this cannot throw:
 * outputs nested deeper than the one depth guard allows (docs/api.md) are dropped and the deployment
 * fails `hook_answer_too_deep`, so nothing below (JSON.stringify, the outbox) walks them.
 */
export function signalBodyOf(
  item: Pick<MetadataItem, 'revision'>,
  result: RunResult,
  interrupted: boolean,
): SignalBody {
  const body: SignalBody = {
    revision: item.revision,
    deploy_status_code: interrupted ? INTERRUPTED_STATUS_CODE : result.deploy_status_code,
    deploy_stdout: String(result.deploy_stdout),
    deploy_stderr: String(result.deploy_stderr),
    outputs: result.outputs,
  };
  if (interrupted) body.status_reason = INTERRUPTED_REASON;
  else if (result.status_reason !== undefined) body.status_reason = result.status_reason;
  if (!withinJsonDepth(body.outputs)) {
    const reason = `hook_answer_too_deep: the outputs are nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels and were dropped`;
    body.outputs = {};
    if (!interrupted) {
      body.deploy_status_code = body.deploy_status_code === 0 ? RUNNER_ERROR_STATUS_CODE : body.deploy_status_code;
      body.status_reason = reason;
    }
    body.deploy_stderr += `${body.deploy_stderr === '' || body.deploy_stderr.endsWith('\n') ? '' : '\n'}[herald] ${reason}\n`;
  }
  try {
    return fitSignalBody(body, MAX_SIGNAL_BODY_BYTES);
  } catch (err) {
    // an output JSON cannot encode (a cycle, a BigInt): the result is still told, without them
    const reason = `hook_failed: the outputs could not be encoded (${(err as Error)?.message ?? String(err)})`;
    return fitSignalBody(
      {
        ...body,
        outputs: {},
        deploy_status_code: body.deploy_status_code === 0 ? RUNNER_ERROR_STATUS_CODE : body.deploy_status_code,
        status_reason: reason,
      },
      MAX_SIGNAL_BODY_BYTES,
    );
  }
}

function isRunnable(item: unknown): item is MetadataItem {
  const i = item as Partial<MetadataItem> | null;
  return (
    typeof i === 'object' &&
    i !== null &&
    typeof i.id === 'string' &&
    i.id !== '' &&
    typeof i.deployment_id === 'string' &&
    Number.isSafeInteger(i.revision)
  );
}

/** Field 22 of /proc/<pid>/stat (start time in clock ticks), or null when there is no such process. */
function procStart(pid: number): string | null {
  try {
    return parseProcStat(readFileSync(`/proc/${pid}/stat`, 'latin1'))?.startTimeTicks ?? null;
  } catch {
    return null;
  }
}
