/**
 * The self-contained agent (`npm run package` bundles this file into
 * `dist/package/herald-agent.mjs`, docs/installing.md): the same `agent` and `agent enroll` commands as `herald`, and
 * nothing of the controller, the operator CLI or SQLite, so a node needs only `node`.
 */
import { Command } from 'commander';
import { registerAgentCommand } from '../agent/cli.js';
import { registerAgentEnrollCommand } from '../agent/enroll-cli.js';
import { applyAgentV8Flags } from '../agent/v8-flags.js';
import { runCli } from './run-cli.js';

// as `herald agent` does (cli/main.ts, docs/agent-footprint.md)
if (process.argv[2] === 'agent') applyAgentV8Flags();

const program = new Command('herald-agent')
  .description('Herald agent: listens for signed wake-ups, fetches its signed metadata, runs hooks, signals results')
  .showHelpAfterError('(add --help for usage)')
  .exitOverride();
registerAgentCommand(program);
registerAgentEnrollCommand(program);
// not awaited at the top level: the same entry is also bundled as CommonJS (the single executable)
void runCli(program);
