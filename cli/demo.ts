/**
 * `herald demo` (`npm run demo`): registers the command; the demo itself (`demo-run.ts`) loads
 * only when it runs.
 */
import type { Command } from 'commander';

export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description(
      'run a 5-node cluster restart on this machine: PKI, controller, agents, a cluster, a restart, checks; then clean up',
    )
    .option('--nodes <n>', 'how many agents (nodes)', '5')
    .option('--keep', 'leave everything running and print how to use it with the CLI and curl')
    .option('--dir <dir>', 'work in this directory (kept afterwards) instead of a new temporary one')
    .option('--timeout <duration>', 'give up on any step after this long', '45s')
    .addHelpText(
      'after',
      `
Starts, in a temporary directory, a PKI, a controller (embedded SQLite) and agents on 127.0.0.1;
each node gets a "volume" directory and an "application container" process the scripts must not
touch. Creates a cluster whose install script starts a small service (a pid file) and whose
uninstall script stops it, restarts the cluster, prints the timeline and checks that the
containers and volumes survived while the service pids changed. Exit 0 when all checks hold.

Examples:
  $ npm run demo
  $ herald demo --nodes 3 --keep
`,
    )
    .action(async (opts: { nodes: string; keep?: boolean; dir?: string; timeout: string }) => {
      const { runDemo } = await import('./demo-run.js');
      process.exitCode = await runDemo({
        nodes: opts.nodes,
        keep: opts.keep === true,
        dir: opts.dir,
        timeout: opts.timeout,
      });
    });
}
