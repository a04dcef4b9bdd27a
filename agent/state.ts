/**
 * The agent's durable memory (SPEC §4): which item ids started and finished on this node, and the
 * generations last fetched and applied. One JSON file, `state.json`, in the 0700 state dir,
 * replaced atomically on every change, so a crash leaves the previous or the next state, never a
 * torn one.
 *
 * No input values are stored, hidden or not: only ids, deployment ids, revisions, times and exit
 * codes.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ConfigError } from '../protocol/errors.js';
import { ensurePrivateDir, type WarnLogger, writeFileAtomicSync } from './atomic-file.js';

export const STATE_FILE = 'state.json';
const STATE_VERSION = 1;

/** Exit code recorded for an item that was running when the agent stopped (128 + SIGTERM). */
export const INTERRUPTED_STATUS_CODE = 143;

export interface ItemRecord {
  deployment_id: string;
  revision: number;
  /** ISO time the item was marked started (before its hook was spawned). */
  started_at: string;
  /** ISO time the item finished; absent while it runs (or when the agent died during it). */
  finished_at?: string;
  /** The run's `deploy_status_code`. */
  status_code?: number;
  /** Set when the item was closed as interrupted at a later start. */
  interrupted?: boolean;
}

export interface InterruptedItem extends ItemRecord {
  id: string;
}

interface StateFile {
  version: number;
  last_fetched_generation: number | null;
  last_applied_generation: number | null;
  items: Record<string, ItemRecord>;
}

export interface AgentStateOptions {
  log?: WarnLogger;
  /** The clock, for tests. */
  now?: () => Date;
}

/**
 * Open with `AgentState.open(stateDir)`. Reads are synchronous from memory; every change is
 * written through before its promise resolves. Changes are serialised: callers may fire several
 * without awaiting each, and the file always ends with the latest.
 */
export class AgentState {
  readonly dir: string;
  readonly file: string;
  private data: StateFile;
  private readonly now: () => Date;
  private writing: Promise<void> = Promise.resolve();
  /** The write that has not started yet, which every change made now joins. */
  private queued: Promise<void> | null = null;

  private constructor(dir: string, data: StateFile, now: () => Date) {
    this.dir = dir;
    this.file = join(dir, STATE_FILE);
    this.data = data;
    this.now = now;
  }

  /**
   * Creates the state dir (0700, tightened if looser) and loads `state.json` if present.
   * @throws ConfigError (bad_option, field `state-dir`) when the file is not valid state: it is
   *   written atomically, so that means someone else wrote it; starting empty could re-run work.
   */
  static async open(dir: string, opts: AgentStateOptions = {}): Promise<AgentState> {
    await ensurePrivateDir(dir, opts.log);
    const file = join(dir, STATE_FILE);
    let data: StateFile = {
      version: STATE_VERSION,
      last_fetched_generation: null,
      last_applied_generation: null,
      items: Object.create(null) as Record<string, ItemRecord>,
    };
    let text: string | undefined;
    try {
      text = await readFile(file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    if (text !== undefined) data = parseState(text, file);
    return new AgentState(dir, data, opts.now ?? (() => new Date()));
  }

  get lastFetchedGeneration(): number | undefined {
    return this.data.last_fetched_generation ?? undefined;
  }

  get lastAppliedGeneration(): number | undefined {
    return this.data.last_applied_generation ?? undefined;
  }

  setLastFetchedGeneration(gen: number): Promise<void> {
    this.data.last_fetched_generation = gen;
    return this.save();
  }

  setLastAppliedGeneration(gen: number): Promise<void> {
    this.data.last_applied_generation = gen;
    return this.save();
  }

  /** True once the item id was started here, whether it finished or not. */
  hasRun(id: string): boolean {
    return Object.hasOwn(this.data.items, id);
  }

  get(id: string): ItemRecord | undefined {
    return this.hasRun(id) ? this.data.items[id] : undefined;
  }

  /** Records, durably, that the item is about to run. Await it before spawning the hook. */
  markStarted(id: string, meta: { deployment_id: string; revision: number }): Promise<void> {
    this.data.items[id] = {
      deployment_id: meta.deployment_id,
      revision: meta.revision,
      started_at: this.now().toISOString(),
    };
    return this.save();
  }

  /** Records that the item finished with `statusCode` (its `deploy_status_code`). */
  markFinished(id: string, statusCode?: number): Promise<void> {
    const rec = this.get(id);
    if (rec === undefined) throw new Error(`markFinished: item ${id} was never started`);
    rec.finished_at = this.now().toISOString();
    if (statusCode !== undefined) rec.status_code = statusCode;
    return this.save();
  }

  /**
   * Items started and never finished: the agent died (or was stopped) while they ran. The agent
   * signals each FAILED `interrupted`, then calls `markInterrupted` so it never runs again; a new
   * revision brings a new id.
   */
  interruptedItems(): InterruptedItem[] {
    return Object.entries(this.data.items)
      .filter(([, rec]) => rec.finished_at === undefined)
      .map(([id, rec]) => ({ id, ...rec }));
  }

  /** Closes an interrupted item: finished, `interrupted: true`, code INTERRUPTED_STATUS_CODE. */
  markInterrupted(id: string): Promise<void> {
    const rec = this.get(id);
    if (rec === undefined) throw new Error(`markInterrupted: item ${id} was never started`);
    rec.finished_at = this.now().toISOString();
    rec.status_code = INTERRUPTED_STATUS_CODE;
    rec.interrupted = true;
    return this.save();
  }

  /**
   * Bounds growth: forgets finished items whose id is not in `currentIds` (the ids of the latest
   * metadata). Such an item can never be asked for again: a new revision has a new id. Unfinished
   * items are kept until closed. Writes only when something was removed.
   * @returns how many records were removed
   */
  async prune(currentIds: Iterable<string>): Promise<number> {
    const keep = new Set(currentIds);
    let removed = 0;
    for (const [id, rec] of Object.entries(this.data.items)) {
      if (rec.finished_at !== undefined && !keep.has(id)) {
        delete this.data.items[id];
        removed++;
      }
    }
    if (removed > 0) await this.save();
    return removed;
  }

  /** Number of item records held. */
  get size(): number {
    return Object.keys(this.data.items).length;
  }

  /** Resolves once every change made so far is on disk. */
  flush(): Promise<void> {
    return this.writing;
  }

  private save(): Promise<void> {
    // One write serialises the state as it is when it runs, so it holds every change made
    // before it. It runs in a microtask, so the changes made in one synchronous stretch (an
    // item's finish, the applied generation and the prune after a document) share ONE write;
    // the write itself is synchronous (writeFileAtomicSync: no thread-pool round trips on the
    // way to a hook's start). A failed write rejects the promises of the changes it held; a
    // later change gets a write of its own.
    if (this.queued !== null) return this.queued;
    const next = Promise.resolve().then(() => {
      this.queued = null; // a change from here on needs a write of its own
      writeFileAtomicSync(this.file, JSON.stringify(this.data));
    });
    this.queued = next;
    this.writing = next;
    return next;
  }
}

function parseState(text: string, file: string): StateFile {
  const bad = (why: string): never => {
    throw new ConfigError(`${file} is not valid agent state (${why}); move it away to start afresh`, {
      field: 'state-dir',
    });
  };
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return bad('not JSON');
  }
  if (typeof raw !== 'object' || raw === null) return bad('not an object');
  const o = raw as Record<string, unknown>;
  if (o.version !== STATE_VERSION) return bad(`version ${String(o.version)}`);
  const gen = (v: unknown): number | null =>
    v === null || v === undefined ? null : Number.isSafeInteger(v) ? (v as number) : bad('generation');
  const itemsRaw = o.items;
  if (typeof itemsRaw !== 'object' || itemsRaw === null || Array.isArray(itemsRaw)) return bad('items');
  // null prototype: an id such as `__proto__` stays an ordinary key
  const items = Object.create(null) as Record<string, ItemRecord>;
  for (const [id, r] of Object.entries(itemsRaw as Record<string, unknown>)) {
    if (typeof r !== 'object' || r === null) return bad(`item ${id}`);
    const rec = r as Record<string, unknown>;
    if (
      typeof rec.deployment_id !== 'string' ||
      !Number.isSafeInteger(rec.revision) ||
      typeof rec.started_at !== 'string'
    )
      return bad(`item ${id}`);
    const out: ItemRecord = {
      deployment_id: rec.deployment_id,
      revision: rec.revision as number,
      started_at: rec.started_at,
    };
    if (typeof rec.finished_at === 'string') out.finished_at = rec.finished_at;
    if (typeof rec.status_code === 'number') out.status_code = rec.status_code;
    if (rec.interrupted === true) out.interrupted = true;
    items[id] = out;
  }
  return {
    version: STATE_VERSION,
    last_fetched_generation: gen(o.last_fetched_generation),
    last_applied_generation: gen(o.last_applied_generation),
    items,
  };
}
