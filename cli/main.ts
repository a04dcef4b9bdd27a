/**
 * `herald`: one executable for every role. Each command group registers its own options; heavy
 * modules (node-forge, SQLite) load only inside the action that needs them, so `--help`
 * is instant and the agent does not carry the controller's code.
 *
 * `herald agent ...` registers only the agent's commands (`agent`, `agent enroll`): the other
 * groups' modules (the operator CLI's helpers, the demo's, the controller's and the PKI's
 * command lines) would stay in the memory of an agent that runs for months and never uses
 * them (docs/agent-footprint.md). Its V8 flags are set here too, before anything else loads.
 */
import type { Command } from 'commander';
import { applyAgentV8Flags } from '../agent/v8-flags.js';

/** Every command group, in the order `herald --help` lists them; `only: 'agent'`: the agent's alone. */
export async function buildProgram(only?: 'agent'): Promise<Command> {
  const { Command } = await import('commander');
  const { registerAgentCommand } = await import('../agent/cli.js');
  const { registerAgentEnrollCommand } = await import('../agent/enroll-cli.js');
  const program = new Command('herald')
    .description('Push, not poll: signed wake-ups for Heat-style software deployments')
    .showHelpAfterError('(add --help for usage)')
    .exitOverride();
  if (only === 'agent') {
    registerAgentCommand(program);
    registerAgentEnrollCommand(program);
    return program;
  }
  const [
    { registerCertsCommands },
    { registerControllerCommand },
    { registerOperatorCommands },
    { registerDemoCommand },
    { registerAuditCommands },
  ] = await Promise.all([
    import('../certs/cli.js'),
    import('../controller/cli.js'),
    import('./operator/commands.js'),
    import('./demo/command.js'),
    import('./operator/audit.js'),
  ]);
  registerCertsCommands(program);
  registerAgentCommand(program);
  registerAgentEnrollCommand(program);
  registerControllerCommand(program);
  registerOperatorCommands(program);
  registerAuditCommands(program);
  registerDemoCommand(program);
  return program;
}

const agentOnly = process.argv[2] === 'agent';
if (agentOnly) applyAgentV8Flags();
const { runCli } = await import('./run-cli.js');
await runCli(await buildProgram(agentOnly ? 'agent' : undefined));
