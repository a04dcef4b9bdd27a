/**
 * The on-disk half of the signal outbox (docs/architecture.md): a durable, ordered queue of signal bodies. A
 * signal is written here before it is sent and removed once the controller answered 2xx, 404 or
 * 409 (the sending loop is `agent/outbox.ts`). Each entry is one file `<seq>-<deployment>.json`
 * (0600, written atomically) in `<stateDir>/outbox` (0700); `seq` grows across restarts, so
 * `list()` gives the order of `enqueue` calls even after the agent was killed.
 *
 * Hidden inputs: a signal carries no inputs, only the run's exit code, stdout, stderr, outputs
 * and reason. `enqueue` copies exactly the keys of `SignalBody` and drops anything else, so an
 * input list passed by mistake never reaches the disk. What a script itself prints (a password it
 * echoes) is its stdout, sent to the controller as Heat would; Herald does not parse it.
 */
import { unlinkSync } from 'node:fs';
import { readdir, readFile, rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { SignalBody } from '../protocol/heat.js';
import { jsonTextDepth } from '../protocol/json-depth.js';
import { MAX_JSON_DEPTH_LEVELS } from '../protocol/limits.js';
import { fsyncDir } from '../certs/files.js';
import { ensurePrivateDir, TEMP_PREFIX, type WarnLogger, writeFileAtomicSync } from './atomic-file.js';

export const OUTBOX_DIR = 'outbox';
const SEQ_DIGITS = 12;
const ENTRY_RE = /^(\d{12})-([A-Za-z0-9_.-]{1,128})\.json$/;
const SAFE_ID_RE = /^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$/;

export interface OutboxSignal {
  /** The node the signal is for (the agent's own). */
  node: string;
  deployment_id: string;
  /** The signal route's path (or URL) to POST to. */
  path: string;
  body: SignalBody;
}

export interface OutboxEntry extends OutboxSignal {
  /** Position in the queue; grows by one per enqueue, never reused. */
  seq: number;
  /** ISO time of the enqueue. */
  enqueued_at: string;
}

export interface OutboxStoreOptions {
  log?: WarnLogger;
  now?: () => Date;
}

/** Open with `OutboxStore.open(stateDir)`. */
export class OutboxStore {
  readonly dir: string;
  private nextSeq: number;
  private readonly log: WarnLogger | undefined;
  private readonly now: () => Date;

  private constructor(dir: string, nextSeq: number, opts: OutboxStoreOptions) {
    this.dir = dir;
    this.nextSeq = nextSeq;
    this.log = opts.log;
    this.now = opts.now ?? (() => new Date());
  }

  /** Creates `<stateDir>/outbox` (0700) if needed, removes temporary files a crash left behind. */
  static async open(stateDir: string, opts: OutboxStoreOptions = {}): Promise<OutboxStore> {
    const dir = join(stateDir, OUTBOX_DIR);
    await ensurePrivateDir(dir, opts.log);
    let max = 0;
    for (const name of await readdir(dir)) {
      if (name.startsWith(TEMP_PREFIX)) {
        await unlink(join(dir, name)).catch(() => undefined);
        continue;
      }
      const m = ENTRY_RE.exec(name);
      if (m?.[1] !== undefined) max = Math.max(max, Number(m[1]));
    }
    return new OutboxStore(dir, max + 1, opts);
  }

  /**
   * Writes the signal durably and returns its entry. The `seq` is taken synchronously, so
   * concurrent calls keep their call order.
   * @throws TypeError when the body is not a SignalBody (a caller's bug)
   */
  async enqueue(signal: OutboxSignal): Promise<OutboxEntry> {
    const body = cleanBody(signal.body);
    if (
      typeof signal.node !== 'string' ||
      typeof signal.deployment_id !== 'string' ||
      typeof signal.path !== 'string'
    ) {
      throw new TypeError('outbox signal needs string node, deployment_id and path');
    }
    const seq = this.nextSeq++;
    const entry: OutboxEntry = {
      seq,
      node: signal.node,
      deployment_id: signal.deployment_id,
      path: signal.path,
      body,
      enqueued_at: this.now().toISOString(),
    };
    writeFileAtomicSync(join(this.dir, fileName(seq, signal.deployment_id)), JSON.stringify(entry));
    return entry;
  }

  /**
   * Every entry, oldest first. A file that is not a valid entry (which atomic writes cannot leave
   * behind) is renamed to `*.bad`, logged and skipped, so one bad file does not block the queue.
   */
  async list(): Promise<OutboxEntry[]> {
    const names: Array<{ seq: number; name: string }> = [];
    for (const name of await readdir(this.dir)) {
      const m = ENTRY_RE.exec(name);
      if (m?.[1] !== undefined) names.push({ seq: Number(m[1]), name });
    }
    names.sort((a, b) => a.seq - b.seq);
    const out: OutboxEntry[] = [];
    for (const { seq, name } of names) {
      const file = join(this.dir, name);
      let text: string;
      try {
        text = await readFile(file, 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // removed meanwhile
        throw err;
      }
      const entry = parseEntry(text, seq);
      if (entry === undefined) {
        this.log?.warn({ file }, 'outbox entry is not valid; renamed to .bad and skipped');
        await rename(file, `${file}.bad`).catch(() => undefined);
        continue;
      }
      out.push(entry);
    }
    return out;
  }

  /**
   * Removes the entry durably; a missing entry is not an error (idempotent). Its file is named by
   * its seq and deployment id (`fileName`): one unlink, no listing of the directory.
   */
  async remove(e: Pick<OutboxEntry, 'seq' | 'deployment_id'>): Promise<void> {
    try {
      unlinkSync(join(this.dir, fileName(e.seq, e.deployment_id)));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    fsyncDir(this.dir);
  }
}

function fileName(seq: number, deploymentId: string): string {
  // The id only helps a person reading the dir; an odd one is replaced, the entry holds the real id.
  const id = SAFE_ID_RE.test(deploymentId) ? deploymentId : 'deployment';
  return `${String(seq).padStart(SEQ_DIGITS, '0')}-${id}.json`;
}

/** Copies exactly SignalBody's keys, checking their types. */
function cleanBody(b: SignalBody): SignalBody {
  if (typeof b !== 'object' || b === null) throw new TypeError('signal body must be an object');
  if (
    !Number.isSafeInteger(b.revision) ||
    typeof b.deploy_status_code !== 'number' ||
    typeof b.deploy_stdout !== 'string' ||
    typeof b.deploy_stderr !== 'string' ||
    typeof b.outputs !== 'object' ||
    b.outputs === null ||
    Array.isArray(b.outputs) ||
    (b.status_reason !== undefined && typeof b.status_reason !== 'string')
  ) {
    throw new TypeError('signal body does not have the SignalBody shape');
  }
  const body: SignalBody = {
    revision: b.revision,
    deploy_status_code: b.deploy_status_code,
    deploy_stdout: b.deploy_stdout,
    deploy_stderr: b.deploy_stderr,
    outputs: { ...b.outputs },
  };
  if (b.status_reason !== undefined) body.status_reason = b.status_reason;
  return body;
}

function parseEntry(text: string, seq: number): OutboxEntry | undefined {
  // the one depth guard (docs/api.md): an entry nested deeper than any signal the agent writes would
  // overflow the stack when sent, and jam the outbox (nothing after it goes first)
  if (jsonTextDepth(text, MAX_JSON_DEPTH_LEVELS + 2) > MAX_JSON_DEPTH_LEVELS + 2) return undefined;
  try {
    const o = JSON.parse(text) as OutboxEntry;
    if (
      o.seq !== seq ||
      typeof o.node !== 'string' ||
      typeof o.deployment_id !== 'string' ||
      typeof o.path !== 'string' ||
      typeof o.enqueued_at !== 'string'
    )
      return undefined;
    return {
      seq,
      node: o.node,
      deployment_id: o.deployment_id,
      path: o.path,
      body: cleanBody(o.body),
      enqueued_at: o.enqueued_at,
    };
  } catch {
    return undefined;
  }
}
