/**
 * `herald`: one executable for every role. Each command group registers its own options; heavy
 * modules (node-forge, SQLite, execa) load only inside the action that needs them, so `--help`
 * is instant and the agent does not carry the controller's code.
 */
import { Command, CommanderError } from 'commander';
import { HeraldError, isErrorCode } from '../protocol/errors.js';
import { registerCertsCommands } from '../certs/cli.js';
import { registerAgentCommand } from '../agent/cli.js';
import { registerOperatorCommands } from './operator.js';
import { registerDemoCommand } from './demo.js';
import { registerControllerCommand } from '../controller/cli.js';

export function buildProgram(): Command {
  const program = new Command('herald')
    .description('Push, not poll: signed wake-ups for Heat-style software deployments')
    .showHelpAfterError('(add --help for usage)')
    .exitOverride();
  registerCertsCommands(program);
  registerAgentCommand(program);
  registerControllerCommand(program);
  registerOperatorCommands(program);
  registerDemoCommand(program);
  return program;
}

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
    // one line, whatever a library put in the message
    process.stderr.write(`herald: ${coded.code}: ${coded.message.split('\n')[0]!}\n`);
    return 1;
  }
  process.stderr.write(
    `herald: unexpected error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
  );
  return 70;
}

async function main(): Promise<void> {
  // `herald certs list | head` closes our stdout early: that is the reader's choice, not an error
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(0);
    throw err;
  });
  try {
    await buildProgram().parseAsync(process.argv);
  } catch (err) {
    process.exitCode = reportError(err);
  }
}

await main();
