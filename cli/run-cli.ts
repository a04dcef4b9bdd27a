/**
 * How every `herald` entry point runs its commander program: one clear line for a coded or usage
 * error, never a stack (a stack only for the truly unexpected), and a closed stdout is the
 * reader's choice. Shared by `bin/herald` and the self-contained agent file, so it imports
 * nothing of the controller.
 */
import { type Command, CommanderError } from 'commander';
import { HeraldError, isErrorCode } from '../protocol/errors.js';
import { visible } from './terminal-text.js';

/**
 * The HeraldError `err` is or wraps (through `cause`, a few levels deep), else undefined. A
 * coded error wrapped by a library (or by another copy of this module) is still a coded error.
 */
function heraldErrorOf(err: unknown): HeraldError | undefined {
  let e: unknown = err;
  for (let depth = 0; depth < 8 && e !== null && typeof e === 'object'; depth++) {
    if (e instanceof HeraldError) return e;
    const x = e as { name?: unknown; code?: unknown; message?: unknown };
    if (x.name === 'HeraldError' || x.name === 'RefusalError' || x.name === 'ConfigError') {
      if (isErrorCode(x.code)) return new HeraldError(x.code, typeof x.message === 'string' ? x.message : undefined);
    }
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * Prints one clear line for a coded or usage error, never a stack; a stack only for the truly
 * unexpected.
 */
export function reportError(err: unknown): number {
  if (err instanceof CommanderError) return err.exitCode;
  const coded = heraldErrorOf(err);
  if (coded !== undefined) {
    // one line, whatever a library put in the message; a controller's message may quote what a
    // node sent, so its control characters are shown, not obeyed
    process.stderr.write(`herald: ${coded.code}: ${visible(coded.message.split('\n')[0]!)}\n`);
    return 1;
  }
  process.stderr.write(
    `herald: unexpected error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
  );
  return 70;
}

/** Parses `process.argv` with `program` and sets the exit code. */
export async function runCli(program: Command): Promise<void> {
  // `herald certs list | head` closes our stdout early: that is the reader's choice, not an error
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });
  try {
    await program.parseAsync(process.argv);
  } catch (err) {
    process.exitCode = reportError(err);
  }
}
