/**
 * `herald`: one executable for every role. Each command group registers its own options; heavy
 * modules (node-forge, SQLite) load only inside the action that needs them, so `--help`
 * is instant and the agent does not carry the controller's code.
 */
import { Command } from 'commander';
import { registerCertsCommands } from '../certs/cli.js';
import { registerAgentCommand } from '../agent/cli.js';
import { registerAgentEnrollCommand } from '../agent/enroll-cli.js';
import { registerOperatorCommands } from './operator.js';
import { registerDemoCommand } from './demo.js';
import { runCli } from './run-cli.js';
import { registerControllerCommand } from '../controller/cli.js';

export function buildProgram(): Command {
  const program = new Command('herald')
    .description('Push, not poll: signed wake-ups for Heat-style software deployments')
    .showHelpAfterError('(add --help for usage)')
    .exitOverride();
  registerCertsCommands(program);
  registerAgentCommand(program);
  registerAgentEnrollCommand(program);
  registerControllerCommand(program);
  registerOperatorCommands(program);
  registerDemoCommand(program);
  return program;
}

await runCli(buildProgram());
