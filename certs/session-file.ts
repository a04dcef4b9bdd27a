/**
 * A `TlsSessionStore` (certs/session-store.ts) kept in a file as well, so the push dialer's
 * client sessions with the agents' listeners survive a controller crash (issue 16: a restarted
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
 * which cost a full handshake each. At open the newest line of each key wins, lines that do not
 * parse are skipped, the store checks each entry as it offers it (revocation, dates, age), and
 * the file is rewritten with the live entries alone (atomically); it is rewritten again whenever
 * it holds PUSH_TLS_SESSION_FILE_SLACK_ENTRIES more lines than live sessions.
 *
 * A session lets its holder resume as this controller with the agent that issued it, until the
 * ticket's lifetime ends or the controller's certificate is revoked (the agent checks both): the
 * file is as sensitive as the controller's key beside it. One that group or others may read, or
 * that is not a regular file, is not read but removed (logged `unsafe_file_mode`): sessions are a
 * cache, never needed to start.
 */
import fs from 'node:fs';
import { PUSH_TLS_SESSION_FILE_SLACK_ENTRIES } from '../protocol/limits.js';
import { ROLES, type Role } from '../protocol/identity.js';
import { PRIVATE_FILE_MODE, writeFileAtomic } from './files.js';
import type { SessionPersistence, StoredSession, TlsSessionStore } from './session-store.js';
import type { Logger } from './tls.js';

interface Line {
  k: string;
  /** Forgotten: no session for `k` from here on. */
  d?: true;
  s?: string;
  p?: { spiffeId: string; role: Role; name: string; serials: string[]; notAfterMs: number };
  t?: number;
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
 * `close()` stops following and is idempotent.
 */
export class SessionFile implements SessionPersistence {
  readonly file: string;
  readonly #store: TlsSessionStore;
  readonly #slack: number;
  readonly #log: Logger | undefined;
  readonly #binding: () => string;
  #fd: number | undefined;
  #lines = 0;

  constructor(file: string, store: TlsSessionStore, o: SessionFileOptions) {
    this.file = file;
    this.#store = store;
    this.#binding = o.binding;
    this.#slack = o.slackEntries ?? PUSH_TLS_SESSION_FILE_SLACK_ENTRIES;
    this.#log = o.logger;
    let loaded = 0;
    for (const [key, entry] of this.#read()) if (store.restore(key, entry)) loaded++;
    this.#rewrite();
    store.persistTo(this);
    if (loaded > 0) this.#log?.info({ file, sessions: loaded }, 'push TLS sessions loaded');
  }

  saved(key: string, e: StoredSession): void {
    this.#append({
      k: key,
      s: e.session.toString('base64'),
      p: { spiffeId: e.spiffeId, role: e.role, name: e.name, serials: [...e.serials], notAfterMs: e.notAfterMs },
      t: e.storedAtMs,
    });
  }

  deleted(key: string): void {
    this.#append({ k: key, d: true });
  }

  cleared(): void {
    this.#rewrite();
  }

  close(): void {
    if (this.#fd === undefined) return;
    fs.closeSync(this.#fd);
    this.#fd = undefined;
  }

  #append(line: Line): void {
    if (this.#fd === undefined) return;
    try {
      const bytes = Buffer.from(`${JSON.stringify(line)}\n`, 'utf8');
      for (let at = 0; at < bytes.length; ) at += fs.writeSync(this.#fd, bytes, at);
      this.#lines++;
    } catch (err) {
      this.#log?.warn({ file: this.file, err }, 'push TLS sessions cannot be written; kept in memory only');
      this.close();
      return;
    }
    if (this.#lines > this.#store.size + this.#slack) this.#rewrite();
  }

  /** Replaces the file with the store's live entries and appends from there. */
  #rewrite(): void {
    this.close();
    const text = [...this.#store.entries()]
      .map(([key, e]) =>
        JSON.stringify({
          k: key,
          s: e.session.toString('base64'),
          p: { spiffeId: e.spiffeId, role: e.role, name: e.name, serials: [...e.serials], notAfterMs: e.notAfterMs },
          t: e.storedAtMs,
        } satisfies Line),
      )
      .map((l) => `${l}\n`)
      .join('');
    try {
      writeFileAtomic(this.file, `${JSON.stringify({ v: 1, b: this.#binding() })}\n${text}`, PRIVATE_FILE_MODE);
      this.#fd = fs.openSync(this.file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_NOFOLLOW);
      this.#lines = this.#store.size;
    } catch (err) {
      // what the file holds is older than the store (a clear() among it): it must not be read back
      this.#remove();
      this.#log?.warn({ file: this.file, err }, 'push TLS sessions cannot be written; kept in memory only');
    }
  }

  #remove(): void {
    try {
      fs.rmSync(this.file, { force: true });
    } catch (err) {
      this.#log?.error({ file: this.file, err }, 'push TLS session file cannot be removed');
    }
  }

  /** The newest entry of each key the file holds; nothing when it is missing or unsafe. */
  #read(): Map<string, StoredSession> {
    const out = new Map<string, StoredSession>();
    let text: string;
    let fd: number | undefined;
    try {
      // opened without following a link, then checked on the descriptor: what is read is what was checked
      fd = fs.openSync(this.file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW);
      const st = fs.fstatSync(fd);
      const ours = process.getuid === undefined || st.uid === process.getuid();
      if (!st.isFile() || (st.mode & 0o077) !== 0 || !ours) {
        this.#log?.warn(
          { file: this.file, code: 'unsafe_file_mode', mode: (st.mode & 0o777).toString(8), ours },
          'push TLS session file is not a private regular file of ours (0600, our uid); removed unread',
        );
        fs.closeSync(fd);
        fd = undefined;
        this.#remove();
        return out;
      }
      text = fs.readFileSync(fd, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT') {
        this.#log?.warn({ file: this.file, err }, 'push TLS session file cannot be read; removed, starting without');
        this.#remove();
      }
      return out;
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
    }
    const rows = text.split('\n');
    const head = parseHead(rows[0] ?? '');
    if (head !== this.#binding()) {
      this.#log?.info(
        { file: this.file },
        'push TLS session file made under another CA or controller certificate (or an older format); not used',
      );
      return out;
    }
    let bad = 0;
    for (const raw of rows.slice(1)) {
      if (raw === '') continue;
      const line = parseLine(raw);
      if (line === undefined) bad++;
      else if (line.d) out.delete(line.k);
      else {
        out.delete(line.k);
        out.set(line.k, {
          ...line.p!,
          session: Buffer.from(line.s!, 'base64'),
          storedAtMs: line.t!,
        });
      }
    }
    if (bad > 0) this.#log?.warn({ file: this.file, lines: bad }, 'push TLS session file lines skipped (not sessions)');
    return out;
  }
}

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
    typeof p.notAfterMs !== 'number'
  )
    return undefined;
  return l as unknown as Line;
}
