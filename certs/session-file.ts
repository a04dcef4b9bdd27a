/**
 * A `TlsSessionStore` (certs/session-store.ts) kept in a file as well, so the push dialer's
 * client sessions with the agents' listeners survive a controller crash (a restarted
 * controller otherwise makes a full mutual handshake with every agent at once).
 *
 * The file is `<db>.push-sessions-<worker>` beside a SQLite database, or
 * `<pki>/controller/<name>.push-sessions-<worker>` (certs/paths.ts) on PostgreSQL, mode 0600: a
 * first line naming what the sessions were made under (a digest of the CA and of our own
 * certificate: a file made under others is not read, as a CA replaced or a certificate renewed
 * while the controller was stopped would otherwise resume with what they replaced), then one
 * JSON line per session kept (its key, the peer checked in its full handshake, the session
 * bytes, when it was kept), or per session forgotten. Lines are appended as the store changes,
 * without fsync: a process crash loses nothing the kernel has, and a power loss only sessions,
 * which cost a full handshake each. At open the newest line of each key wins (its bytes are
 * left in the file), lines that do not parse are skipped, and the store checks each entry as it
 * offers it (revocation, dates, age). The file is rewritten with the live entries alone
 * (atomically) whenever it holds PUSH_TLS_SESSION_FILE_SLACK_ENTRIES more lines than live
 * sessions, and at open only then, or when it was made under another binding or its last line is
 * torn: a controller restarted after a crash reads its 10,000 sessions once and writes none of them
 * again (a rewrite at every open was ~5 s of a push worker's first seconds, `--profile`).
 *
 * While the file can be written, the session bytes live in it alone: the store keeps whom each
 * session was made with, and this class where its line starts and ends, and reads the line back
 * when the store offers the session (a redial). A push worker with 10,000 agents so holds ~2 KB
 * less per agent (memory per connected agent; a session then had the peer's certificate
 * in it, ~0.4 KB without it since 2026-12-04). A line that cannot be read back is a
 * session lost, which costs one full handshake.
 *
 * A session lets its holder resume as this controller with the agent that issued it, until the
 * ticket's lifetime ends or the controller's certificate is revoked (the agent checks both): the
 * file is as sensitive as the controller's key beside it. One that group or others may read, or
 * that is not a regular file, is not read but removed (logged `unsafe_file_mode`): sessions are a
 * cache, never needed to start.
 */
import fs from 'node:fs';
import { MAX_PUSH_WORKER_PROCESSES, PUSH_TLS_SESSION_FILE_SLACK_ENTRIES } from '../protocol/limits.js';
import { ROLES, type Role } from '../protocol/identity.js';
import { PRIVATE_FILE_MODE, writeFileAtomic } from './files.js';
import { withoutPeerCertificate } from './session-der.js';
import {
  peerOf,
  type SessionPeer,
  type SessionPersistence,
  type KeptSession,
  type StoredSession,
  type TlsSessionStore,
} from './session-store.js';
import type { Logger } from './tls.js';

interface Line {
  k: string;
  /** Forgotten: no session for `k` from here on. */
  d?: true;
  s?: string;
  p?: SessionPeer;
  t?: number;
}

/**
 * Removes the session files of the push workers a controller no longer starts: those of workers
 * `first` to MAX_PUSH_WORKER_PROCESSES - 1 (`fileOf(worker)`). Nodes are sharded over the workers
 * by their count, so after the count changed (by `--push-workers`, or a default that follows the
 * cores) a node's session may sit in another worker's file, which costs it one full handshake; a
 * file no worker opens again would keep sessions as sensitive as the controller's key for as long
 * as their tickets live. Returns the files removed; one that cannot be removed is left (logged
 * by the caller).
 */
export function removeSessionFilesFrom(
  fileOf: (worker: number) => string,
  first: number,
): { removed: string[]; failed: { file: string; error: string }[] } {
  const removed: string[] = [];
  const failed: { file: string; error: string }[] = [];
  for (let worker = Math.max(0, first); worker < MAX_PUSH_WORKER_PROCESSES; worker++) {
    const file = fileOf(worker);
    try {
      fs.unlinkSync(file);
      removed.push(file);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT') failed.push({ file, error: code ?? String(err) });
    }
  }
  return { removed, failed };
}

export interface SessionFileOptions {
  /** What the sessions are made under (CA and own certificate); read when the file is written, compared when it is read. */
  binding: () => string;
  /** Rewrite when the file holds this many lines more than live sessions. Default PUSH_TLS_SESSION_FILE_SLACK_ENTRIES. */
  slackEntries?: number;
  logger?: Logger;
}

/**
 * Keeps `store` in `file`: loads what the file holds into it, then follows its changes. When the
 * file cannot be written (a read-only directory), the store works from memory alone (logged).
 * `close()` stops following and is idempotent; the sessions whose bytes only the file held are then
 * no longer offered (a closing dialer needs none).
 */
export class SessionFile implements SessionPersistence {
  readonly file: string;
  readonly #store: TlsSessionStore;
  readonly #slack: number;
  readonly #log: Logger | undefined;
  readonly #binding: () => string;
  /** Opened to append and to read lines back (O_APPEND moves writes only). */
  #fd: number | undefined;
  /** False once a write failed: the store keeps new sessions in memory; what is here is still read. */
  #writable = false;
  /** The file's length: where the next line starts. */
  #size = 0;
  /** Where the newest line of each key's session is in the file. */
  readonly #at = new Map<string, { off: number; len: number }>();
  #lines = 0;

  constructor(file: string, store: TlsSessionStore, o: SessionFileOptions) {
    this.file = file;
    this.#store = store;
    this.#binding = o.binding;
    this.#slack = o.slackEntries ?? PUSH_TLS_SESSION_FILE_SLACK_ENTRIES;
    this.#log = o.logger;
    const found = this.#open();
    let loaded = 0;
    if (found !== undefined) {
      // (restored before the store reports to us: one it evicts meanwhile stays a stale line)
      for (const [key, { entry, at }] of found.sessions)
        if (store.restore(key, entry)) {
          this.#at.set(key, at);
          loaded++;
        }
      this.#lines = found.lines;
    }
    store.persistTo(this);
    // compacted at open only when it must be (another binding, a torn last line, the slack
    // reached): a restart after a crash reads the file once and writes nothing more of it
    if (found === undefined || !found.clean || this.#lines > store.size + this.#slack) this.#rewrite();
    if (loaded > 0) this.#log?.info({ file, sessions: loaded }, 'push TLS sessions loaded');
  }

  saved(key: string, e: StoredSession): boolean {
    return this.#append({
      k: key,
      s: e.session.toString('base64'),
      p: peerOf(e),
      t: e.storedAtMs,
    });
  }

  deleted(key: string): void {
    this.#append({ k: key, d: true });
  }

  cleared(): void {
    this.#rewrite();
  }

  load(key: string): Buffer | undefined {
    const at = this.#at.get(key);
    if (at === undefined || this.#fd === undefined) return undefined;
    try {
      const bytes = Buffer.allocUnsafe(at.len);
      let got = 0;
      while (got < at.len) {
        const n = fs.readSync(this.#fd, bytes, got, at.len - got, at.off + got);
        if (n === 0) return undefined;
        got += n;
      }
      const line = parseLine(bytes.toString('utf8'));
      return line?.k === key && line.s !== undefined ? Buffer.from(line.s, 'base64') : undefined;
    } catch (err) {
      this.#log?.warn({ file: this.file, err }, 'push TLS session cannot be read back; a full handshake instead');
      return undefined;
    }
  }

  close(): void {
    if (this.#fd === undefined) return;
    fs.closeSync(this.#fd);
    this.#fd = undefined;
    this.#writable = false;
    this.#at.clear();
  }

  /** Appends `line`; true when it is all in the file (and, for a session, can be read back). */
  #append(line: Line): boolean {
    if (this.#fd === undefined || !this.#writable) return false;
    const bytes = Buffer.from(`${JSON.stringify(line)}\n`, 'utf8');
    try {
      for (let at = 0; at < bytes.length; ) at += fs.writeSync(this.#fd, bytes, at);
    } catch (err) {
      this.#log?.warn({ file: this.file, err }, 'push TLS sessions cannot be written; new ones kept in memory only');
      // a part of the line may be there: nothing after it is written, so the file ends with it
      this.#writable = false;
      if (line.d) this.#at.delete(line.k);
      return false;
    }
    if (line.d) this.#at.delete(line.k);
    else this.#at.set(line.k, { off: this.#size, len: bytes.length - 1 });
    this.#size += bytes.length;
    this.#lines++;
    if (this.#lines > this.#store.size + this.#slack) this.#rewrite();
    return true;
  }

  /**
   * Replaces the file with the store's live entries and appends from there; their bytes then
   * live in the new file alone. When it cannot be written, the store gets the bytes back.
   */
  #rewrite(): void {
    const live: Array<{ key: string; session: Buffer; line: string }> = [];
    for (const [key, e] of this.#store.entries()) {
      // a line written before sessions were kept without the server's certificate loses it here
      const loaded = e.session ?? this.load(key);
      if (loaded === undefined) continue; // offered, it is dropped
      const session = withoutPeerCertificate(loaded);
      const line = JSON.stringify({
        k: key,
        s: session.toString('base64'),
        p: peerOf(e),
        t: e.storedAtMs,
      } satisfies Line);
      live.push({ key, session, line });
    }
    this.close();
    const head = `${JSON.stringify({ v: 1, b: this.#binding() })}\n`;
    try {
      writeFileAtomic(this.file, head + live.map((l) => `${l.line}\n`).join(''), PRIVATE_FILE_MODE);
      this.#fd = fs.openSync(this.file, fs.constants.O_RDWR | fs.constants.O_APPEND | fs.constants.O_NOFOLLOW);
    } catch (err) {
      // what the file holds is older than the store (a clear() among it): it must not be read back
      this.#remove();
      this.#log?.warn({ file: this.file, err }, 'push TLS sessions cannot be written; kept in memory only');
      for (const l of live) this.#store.keepBytes(l.key, l.session);
      return;
    }
    this.#writable = true;
    this.#size = Buffer.byteLength(head);
    for (const l of live) {
      const len = Buffer.byteLength(l.line);
      this.#at.set(l.key, { off: this.#size, len });
      this.#size += len + 1;
      this.#store.keepBytes(l.key, null);
    }
    this.#lines = live.length;
  }

  #remove(): void {
    try {
      fs.rmSync(this.file, { force: true });
    } catch (err) {
      this.#log?.error({ file: this.file, err }, 'push TLS session file cannot be removed');
    }
  }

  /**
   * Opens the file to read and append, and reads the newest line of each key: its peer and where
   * its bytes are (they stay in the file; `load` reads them back when offered). Undefined when it
   * is missing, unsafe (removed), unreadable (removed) or made under another binding; then nothing
   * is open. `clean`: it ends with a whole line (a crash may tear the last one).
   */
  #open():
    | {
        sessions: Map<string, { entry: KeptSession; at: { off: number; len: number } }>;
        lines: number;
        clean: boolean;
      }
    | undefined {
    let fd: number | undefined;
    let text: Buffer;
    try {
      // opened without following a link, then checked on the descriptor: what is read is what was checked
      fd = fs.openSync(this.file, fs.constants.O_RDWR | fs.constants.O_APPEND | fs.constants.O_NOFOLLOW);
      const st = fs.fstatSync(fd);
      const ours = process.getuid === undefined || st.uid === process.getuid();
      if (!st.isFile() || (st.mode & 0o077) !== 0 || !ours) {
        this.#log?.warn(
          { file: this.file, code: 'unsafe_file_mode', mode: (st.mode & 0o777).toString(8), ours },
          'push TLS session file is not a private regular file of ours (0600, our uid); removed unread',
        );
        fs.closeSync(fd);
        this.#remove();
        return undefined;
      }
      text = fs.readFileSync(fd);
    } catch (err) {
      if (fd !== undefined) fs.closeSync(fd);
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT') {
        this.#log?.warn({ file: this.file, err }, 'push TLS session file cannot be read; removed, starting without');
        this.#remove();
      }
      return undefined;
    }
    const sessions = new Map<string, { entry: KeptSession; at: { off: number; len: number } }>();
    let start = text.indexOf(NEWLINE);
    if (start < 0 || parseHead(text.toString('utf8', 0, start)) !== this.#binding()) {
      fs.closeSync(fd);
      this.#log?.info(
        { file: this.file },
        'push TLS session file made under another CA or controller certificate (or an older format); not used',
      );
      return undefined;
    }
    start++;
    let lines = 0;
    let bad = 0;
    while (start < text.length) {
      const end = text.indexOf(NEWLINE, start);
      if (end < 0) break; // a torn last line: not counted, rewritten below
      lines++;
      const line = end > start ? parseLine(text.toString('utf8', start, end)) : undefined;
      if (line === undefined) bad++;
      else if (line.d) sessions.delete(line.k);
      else {
        sessions.delete(line.k);
        sessions.set(line.k, {
          entry: { ...line.p!, session: null, storedAtMs: line.t! },
          at: { off: start, len: end - start },
        });
      }
      start = end + 1;
    }
    if (bad > 0) this.#log?.warn({ file: this.file, lines: bad }, 'push TLS session file lines skipped (not sessions)');
    this.#fd = fd;
    this.#writable = true;
    this.#size = text.length;
    return { sessions, lines, clean: start === text.length };
  }
}

const NEWLINE = 0x0a;

/** The binding the file's first line names, or undefined. */
function parseHead(raw: string): string | undefined {
  try {
    const v = JSON.parse(raw) as { v?: unknown; b?: unknown };
    return v.v === 1 && typeof v.b === 'string' ? v.b : undefined;
  } catch {
    return undefined;
  }
}

function parseLine(raw: string): Line | undefined {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const l = v as Record<string, unknown>;
  if (typeof l.k !== 'string') return undefined;
  if (l.d === true) return { k: l.k, d: true };
  const p = l.p as Record<string, unknown> | undefined;
  if (
    typeof l.s !== 'string' ||
    typeof l.t !== 'number' ||
    typeof p !== 'object' ||
    p === null ||
    typeof p.spiffeId !== 'string' ||
    typeof p.name !== 'string' ||
    !ROLES.includes(p.role as Role) ||
    !Array.isArray(p.serials) ||
    !p.serials.every((s) => typeof s === 'string') ||
    typeof p.notAfterMs !== 'number' ||
    (p.notBeforeMs !== undefined && typeof p.notBeforeMs !== 'number')
  )
    return undefined;
  return l as unknown as Line;
}
