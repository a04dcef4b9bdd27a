/**
 * The controller API's TLS session-ticket key, kept in a file of its own so that tickets issued
 * before a restart still resume after it (a restarted controller otherwise faces a full
 * mutual handshake from every agent at once).
 *
 * The file is `<pki>/controller/<name>.tls-ticket-key` (certs/paths.ts): exactly
 * TLS_TICKET_KEY_BYTES raw bytes (Node's `ticketKeys`), mode 0600, written atomically. Its mtime
 * is its age: a key older than TLS_TICKET_KEY_ROTATE_MS is replaced at start, and the key in use
 * is replaced on a timer when it reaches that age. Node holds one ticket key at a time, so each
 * rotation costs every agent one full handshake. Each controller has its own file; an agent
 * resumes only with the controller that issued its ticket.
 */
import crypto from 'node:crypto';
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import { ConfigError } from '../protocol/errors.js';
import { MAX_TIMER_DELAY_MS, TLS_TICKET_KEY_BYTES, TLS_TICKET_KEY_ROTATE_MS } from '../protocol/limits.js';
import { PRIVATE_FILE_MODE, writeFileAtomic } from './files.js';
import type { Logger } from './tls.js';

export interface TicketKeyOptions {
  /** The key file (`pkiPaths(dir).ticketKey(name)`). */
  file: string;
  /** Default TLS_TICKET_KEY_ROTATE_MS. */
  rotateMs?: number;
  /** Wall clock in ms (the file's mtime is compared with it). Default Date.now. */
  now?: () => number;
  logger?: Logger;
}

/**
 * The current ticket key, loaded from its file or made there, and rotated. Emits `'rotate'`
 * (key: Buffer) after each replacement; the API server hands it to `server.setTicketKeys`.
 * `close()` stops the timer and is idempotent.
 */
export class TicketKey extends EventEmitter {
  readonly file: string;
  readonly #rotateMs: number;
  readonly #now: () => number;
  readonly #log: Logger | undefined;
  #key: Buffer;
  /** When the key in use was made (the file's mtime, or when it was made in memory). */
  #madeAtMs: number;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;

  /**
   * Loads the key file, or makes it (0600, atomically) when it is missing; replaces a key older
   * than the rotation period. When the file cannot be written (a read-only PKI directory), the
   * key lives in memory only (logged): tickets then do not survive a restart, as before.
   * @throws ConfigError `unsafe_file_mode` when the file is readable or writable by group or
   *   others; `bad_ticket_key` when it is not a regular file of TLS_TICKET_KEY_BYTES bytes;
   *   `bad_option` when it cannot be read
   */
  constructor(o: TicketKeyOptions) {
    super();
    this.file = o.file;
    this.#rotateMs = o.rotateMs ?? TLS_TICKET_KEY_ROTATE_MS;
    this.#now = o.now ?? Date.now;
    this.#log = o.logger;
    if (!(this.#rotateMs > 0)) throw new ConfigError('the ticket key rotation period must be positive');
    const loaded = readTicketKey(o.file);
    if (loaded && this.#now() - loaded.mtimeMs < this.#rotateMs) {
      this.#key = loaded.key;
      this.#madeAtMs = loaded.mtimeMs;
    } else {
      this.#key = crypto.randomBytes(TLS_TICKET_KEY_BYTES);
      this.#madeAtMs = this.#now();
      this.#persist(loaded ? 'replaced (older than the rotation period)' : 'created');
    }
    this.#schedule();
  }

  /** The key in use: TLS_TICKET_KEY_BYTES bytes for `ticketKeys` / `setTicketKeys`. */
  current(): Buffer {
    return this.#key;
  }

  /** When the key in use was made, in ms since the epoch. */
  get madeAtMs(): number {
    return this.#madeAtMs;
  }

  /** Replaces the key when it has reached the rotation period; true when it did. */
  check(): boolean {
    if (this.#closed || this.#now() - this.#madeAtMs < this.#rotateMs) return false;
    this.rotate();
    return true;
  }

  /** Replaces the key now (file first, then `'rotate'`). */
  rotate(): void {
    if (this.#closed) return;
    this.#key = crypto.randomBytes(TLS_TICKET_KEY_BYTES);
    this.#madeAtMs = this.#now();
    this.#persist('rotated');
    this.emit('rotate', this.#key);
    this.#schedule();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
  }

  #persist(what: string): void {
    try {
      // the file's mtime (now) is the key's age at the next start
      writeFileAtomic(this.file, this.#key, PRIVATE_FILE_MODE);
      this.#log?.info({ file: this.file }, `TLS ticket key ${what}`);
    } catch (err) {
      this.#log?.warn(
        { file: this.file, err: { message: (err as Error).message, code: (err as NodeJS.ErrnoException).code } },
        `TLS ticket key ${what} in memory only: it could not be written, so session tickets will not survive a restart`,
      );
    }
  }

  #schedule(): void {
    clearTimeout(this.#timer);
    if (this.#closed) return;
    const dueMs = Math.max(0, this.#madeAtMs + this.#rotateMs - this.#now());
    // setTimeout fires at once past 2^31-1 ms (~24.8 days); a longer period is checked in steps
    this.#timer = setTimeout(() => this.check() || this.#schedule(), Math.min(dueMs, MAX_TIMER_DELAY_MS));
    this.#timer.unref();
  }
}

/**
 * Reads a ticket key file: undefined when it does not exist.
 * @throws ConfigError `unsafe_file_mode`, `bad_ticket_key` or `bad_option`, naming the file
 */
export function readTicketKey(file: string): { key: Buffer; mtimeMs: number } | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new ConfigError(`cannot read the TLS ticket key ${file}: ${(err as Error).message}`, {
      cause: err,
      field: 'tls-ticket-key',
    });
  }
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile())
      throw new ConfigError(`the TLS ticket key ${file} is not a regular file`, {
        code: 'bad_ticket_key',
        field: 'tls-ticket-key',
      });
    const mode = st.mode & 0o777;
    if ((mode & 0o077) !== 0)
      throw new ConfigError(
        `the TLS ticket key ${file} has mode ${mode.toString(8).padStart(4, '0')}: whoever reads it can forge a TLS session with this controller; chmod 600 it`,
        { code: 'unsafe_file_mode', field: 'tls-ticket-key' },
      );
    if (st.size !== TLS_TICKET_KEY_BYTES)
      throw new ConfigError(
        `the TLS ticket key ${file} holds ${st.size} bytes, not ${TLS_TICKET_KEY_BYTES}; remove it and a new one is made`,
        { code: 'bad_ticket_key', field: 'tls-ticket-key' },
      );
    const key = Buffer.alloc(TLS_TICKET_KEY_BYTES);
    const n = fs.readSync(fd, key, 0, TLS_TICKET_KEY_BYTES, 0);
    if (n !== TLS_TICKET_KEY_BYTES)
      throw new ConfigError(`the TLS ticket key ${file} was cut short while read`, {
        code: 'bad_ticket_key',
        field: 'tls-ticket-key',
      });
    return { key, mtimeMs: st.mtimeMs };
  } finally {
    fs.closeSync(fd);
  }
}
