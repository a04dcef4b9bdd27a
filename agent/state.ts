/**
 * The agent's durable memory (docs/architecture.md): which item ids started and finished on this node, and the
 * generations last fetched and applied. Two files in the 0700 state dir:
 * - `state.json`, a snapshot, replaced atomically (temporary file, fsync, rename, directory fsync);
 * - `state.journal`, the changes since that snapshot, one JSON line each, appended and
 *   fdatasync'd before the change's promise resolves: one flush of one file per change (an
 *   item's start, on the way to its hook), where a replace costs two.
 * Once the journal holds AGENT_STATE_JOURNAL_MAX_BYTES it is folded into a new snapshot. Each
 * snapshot carries an epoch and the journal's first line names the snapshot it continues, so a
 * crash between the fold's two replaces leaves a journal the new snapshot already holds, which
 * is then skipped. A crash during an append leaves a torn last line, which is read as never
 * written (its change was not acknowledged); any other damage is refused.
 *
 * No input values are stored, hidden or not: only ids, deployment ids, revisions, times and exit
 * codes.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../protocol/errors.js';
import { AGENT_STATE_JOURNAL_MAX_BYTES } from '../protocol/limits.js';
import { appendFileDurableSync, ensurePrivateDir, type WarnLogger, writeFileAtomicSync } from './atomic-file.js';

export const STATE_FILE = 'state.json';
export const STATE_JOURNAL_FILE = 'state.journal';
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
  /** The snapshot's epoch: the journal that continues it starts with the same number. */
  journal_epoch: number;
  last_fetched_generation: number | null;
  last_applied_generation: number | null;
  items: Record<string, ItemRecord>;
}

/** One journal line: items set (a record) or removed (null), and generations set. */
interface JournalEntry {
  items?: Record<string, ItemRecord | null>;
  last_fetched_generation?: number;
  last_applied_generation?: number;
}

/** What the files hold, read without writing anything. */
export interface StateView {
  lastFetchedGeneration: number | undefined;
  lastAppliedGeneration: number | undefined;
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
 * without awaiting each, and the files always end with the latest.
 */
export class AgentState {
  readonly dir: string;
  readonly file: string;
  readonly journalFile: string;
  private data: StateFile;
  private readonly now: () => Date;
  private writing: Promise<void> = Promise.resolve();
  /** The write that has not started yet, which every change made now joins. */
  private queued: Promise<void> | null = null;
  /** Item ids and generations changed since the last write that reached the disk. */
  private readonly dirtyItems = new Set<string>();
  private dirtyFetched = false;
  private dirtyApplied = false;
  /** Bytes in the journal; past AGENT_STATE_JOURNAL_MAX_BYTES the next write folds it. */
  private journalBytes: number;
  /** The next write folds (the journal is missing, stale, torn, or an append failed). */
  private mustFold: boolean;

  private constructor(dir: string, loaded: Loaded, now: () => Date) {
    this.dir = dir;
    this.file = join(dir, STATE_FILE);
    this.journalFile = join(dir, STATE_JOURNAL_FILE);
    this.data = loaded.data;
    this.journalBytes = loaded.journalBytes;
    this.mustFold = loaded.mustFold;
    this.now = now;
  }

  /**
   * Creates the state dir (0700, tightened if looser) and loads `state.json` and the journal
   * after it, if present. Writes nothing: the first change folds what needs folding.
   * @throws ConfigError (bad_option, field `state-dir`) when the files are not valid state: they
   *   are written atomically or appended line by line, so that means someone else wrote them;
   *   starting empty could re-run work.
   */
  static async open(dir: string, opts: AgentStateOptions = {}): Promise<AgentState> {
    await ensurePrivateDir(dir, opts.log);
    return new AgentState(dir, load(dir), opts.now ?? (() => new Date()));
  }

  /** What the state dir holds, read without changing anything (tests, diagnosis). */
  static read(dir: string): StateView {
    const { data } = load(dir);
    return {
      lastFetchedGeneration: data.last_fetched_generation ?? undefined,
      lastAppliedGeneration: data.last_applied_generation ?? undefined,
      items: data.items,
    };
  }

  get lastFetchedGeneration(): number | undefined {
    return this.data.last_fetched_generation ?? undefined;
  }

  get lastAppliedGeneration(): number | undefined {
    return this.data.last_applied_generation ?? undefined;
  }

  setLastFetchedGeneration(gen: number): Promise<void> {
    this.data.last_fetched_generation = gen;
    this.dirtyFetched = true;
    return this.save();
  }

  setLastAppliedGeneration(gen: number): Promise<void> {
    this.data.last_applied_generation = gen;
    this.dirtyApplied = true;
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
    return this.changed(id);
  }

  /** Records that the item finished with `statusCode` (its `deploy_status_code`). */
  markFinished(id: string, statusCode?: number): Promise<void> {
    const rec = this.get(id);
    if (rec === undefined) throw new Error(`markFinished: item ${id} was never started`);
    rec.finished_at = this.now().toISOString();
    if (statusCode !== undefined) rec.status_code = statusCode;
    return this.changed(id);
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
    return this.changed(id);
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
        this.dirtyItems.add(id);
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

  /**
   * At a clean stop: every change on disk, then the journal folded into `state.json`, so the
   * snapshot alone holds the state (a start replays nothing, and a Herald from before the journal
   * reads it all). Changes made after it get writes of their own, as ever.
   */
  async close(): Promise<void> {
    await this.writing.catch(() => undefined);
    if (this.mustFold || this.journalBytes > Buffer.byteLength(journalHead(this.data.journal_epoch))) this.fold();
  }

  private changed(id: string): Promise<void> {
    this.dirtyItems.add(id);
    return this.save();
  }

  private save(): Promise<void> {
    // One write carries every change made before it runs. It runs in a microtask, so the changes
    // made in one synchronous stretch (an item's finish, the applied generation and the prune
    // after a document) share ONE write; the write itself is synchronous (no thread-pool round
    // trips on the way to a hook's start). A failed write rejects the promises of the changes it
    // held; they stay pending, and the next write (a fold) carries them.
    if (this.queued !== null) return this.queued;
    const next = Promise.resolve().then(() => {
      this.queued = null; // a change from here on needs a write of its own
      this.write();
    });
    this.queued = next;
    this.writing = next;
    return next;
  }

  private write(): void {
    if (this.mustFold || this.journalBytes >= AGENT_STATE_JOURNAL_MAX_BYTES) {
      this.fold();
      return;
    }
    const entry: JournalEntry = {};
    if (this.dirtyItems.size > 0) {
      const items = Object.create(null) as Record<string, ItemRecord | null>;
      for (const id of this.dirtyItems) items[id] = this.get(id) ?? null;
      entry.items = items;
    }
    if (this.dirtyFetched) entry.last_fetched_generation = this.data.last_fetched_generation ?? 0;
    if (this.dirtyApplied) entry.last_applied_generation = this.data.last_applied_generation ?? 0;
    const line = `${JSON.stringify(entry)}\n`;
    try {
      appendFileDurableSync(this.journalFile, line);
    } catch (err) {
      // the journal may end in a torn line now: never append after it
      this.mustFold = true;
      throw err;
    }
    this.journalBytes += Buffer.byteLength(line);
    this.clean();
  }

  /** A new snapshot holding everything, then a new journal continuing it. */
  private fold(): void {
    const epoch = this.data.journal_epoch + 1;
    writeFileAtomicSync(this.file, JSON.stringify({ ...this.data, journal_epoch: epoch }));
    this.data.journal_epoch = epoch;
    // from here a crash leaves the old journal, which names the old epoch: skipped at the next open
    const head = journalHead(epoch);
    writeFileAtomicSync(this.journalFile, head);
    this.journalBytes = Buffer.byteLength(head);
    this.mustFold = false;
    this.clean();
  }

  private clean(): void {
    this.dirtyItems.clear();
    this.dirtyFetched = false;
    this.dirtyApplied = false;
  }
}

interface Loaded {
  data: StateFile;
  journalBytes: number;
  mustFold: boolean;
}

function journalHead(epoch: number): string {
  return `${JSON.stringify({ epoch })}\n`;
}

function readIfThere(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/** The snapshot with its journal replayed over it (a start: at most a snapshot and 64 KiB of journal, read at once). */
function load(dir: string): Loaded {
  const file = join(dir, STATE_FILE);
  const snapshot = readIfThere(file);
  const journal = readIfThere(join(dir, STATE_JOURNAL_FILE));
  const data: StateFile =
    snapshot === undefined
      ? {
          version: STATE_VERSION,
          journal_epoch: 0,
          last_fetched_generation: null,
          last_applied_generation: null,
          items: Object.create(null) as Record<string, ItemRecord>,
        }
      : parseState(snapshot, file);
  if (journal === undefined) return { data, journalBytes: 0, mustFold: true };
  const jfile = join(dir, STATE_JOURNAL_FILE);
  const bad = (why: string): never => {
    throw new ConfigError(`${jfile} is not a valid agent state journal (${why}); move it away to start afresh`, {
      field: 'state-dir',
    });
  };
  const end = journal.lastIndexOf('\n');
  // the text after the last newline is a torn append (or nothing): its change was never acknowledged
  const torn = end !== journal.length - 1;
  const lines = end < 0 ? [] : journal.slice(0, end).split('\n');
  if (lines.length === 0) return { data, journalBytes: 0, mustFold: true };
  const head = parseLine(lines[0]!, 1, bad);
  const epoch = head.epoch;
  if (!Number.isSafeInteger(epoch) || Object.keys(head).length !== 1) return bad('line 1 is not its head');
  // a journal the snapshot has folded in already (a crash between a fold's two replaces)
  if (epoch === data.journal_epoch - 1) return { data, journalBytes: 0, mustFold: true };
  if (epoch !== data.journal_epoch)
    return bad(`it continues epoch ${String(epoch)}, the snapshot is ${data.journal_epoch}`);
  for (let i = 1; i < lines.length; i++) applyEntry(data, parseLine(lines[i]!, i + 1, bad), i + 1, bad);
  return { data, journalBytes: Buffer.byteLength(journal), mustFold: torn };
}

function parseLine(line: string, n: number, bad: (why: string) => never): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch {
    return bad(`line ${n} is not JSON`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return bad(`line ${n} is not an object`);
  return v as Record<string, unknown>;
}

function applyEntry(data: StateFile, e: Record<string, unknown>, n: number, bad: (why: string) => never): void {
  for (const k of Object.keys(e)) {
    if (k !== 'items' && k !== 'last_fetched_generation' && k !== 'last_applied_generation')
      bad(`line ${n}: unknown member ${JSON.stringify(k.slice(0, 40))}`);
  }
  const gen = (v: unknown): number => (Number.isSafeInteger(v) ? (v as number) : bad(`line ${n}: generation`));
  if (e.last_fetched_generation !== undefined) data.last_fetched_generation = gen(e.last_fetched_generation);
  if (e.last_applied_generation !== undefined) data.last_applied_generation = gen(e.last_applied_generation);
  if (e.items === undefined) return;
  if (typeof e.items !== 'object' || e.items === null || Array.isArray(e.items)) bad(`line ${n}: items`);
  for (const [id, r] of Object.entries(e.items as Record<string, unknown>)) {
    if (r === null) delete data.items[id];
    else data.items[id] = parseItem(r, (why) => bad(`line ${n}: ${why} of item ${id}`));
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
  // a snapshot written before the journal existed has no epoch: 0
  const epoch = o.journal_epoch === undefined ? 0 : o.journal_epoch;
  if (!Number.isSafeInteger(epoch)) return bad('journal_epoch');
  const itemsRaw = o.items;
  if (typeof itemsRaw !== 'object' || itemsRaw === null || Array.isArray(itemsRaw)) return bad('items');
  // null prototype: an id such as `__proto__` stays an ordinary key
  const items = Object.create(null) as Record<string, ItemRecord>;
  for (const [id, r] of Object.entries(itemsRaw as Record<string, unknown>)) {
    items[id] = parseItem(r, (why) => bad(`${why} of item ${id}`));
  }
  return {
    version: STATE_VERSION,
    journal_epoch: epoch as number,
    last_fetched_generation: gen(o.last_fetched_generation),
    last_applied_generation: gen(o.last_applied_generation),
    items,
  };
}

function parseItem(r: unknown, bad: (why: string) => never): ItemRecord {
  if (typeof r !== 'object' || r === null) return bad('the record');
  const rec = r as Record<string, unknown>;
  if (
    typeof rec.deployment_id !== 'string' ||
    !Number.isSafeInteger(rec.revision) ||
    typeof rec.started_at !== 'string'
  )
    return bad('the record');
  const out: ItemRecord = {
    deployment_id: rec.deployment_id,
    revision: rec.revision as number,
    started_at: rec.started_at,
  };
  if (typeof rec.finished_at === 'string') out.finished_at = rec.finished_at;
  if (typeof rec.status_code === 'number') out.status_code = rec.status_code;
  if (rec.interrupted === true) out.interrupted = true;
  return out;
}
