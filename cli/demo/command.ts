/**
 * `herald demo` (`npm run demo`): registers the command; the demo itself (`cli/demo/run.ts`, or
 * `cli/demo/controllers.ts` with `--controllers`) loads only when it runs.
 */
import type { Command } from 'commander';
import { HeraldError } from '../../protocol/errors.js';

/** Nodes of the one-controller demo when `--nodes` is not given. */
const DEFAULT_DEMO_NODES = '5';
/** A step's limit when `--timeout` is not given (`--heat`: its own, cli/demo/heat.ts). */
const DEFAULT_DEMO_TIMEOUT = '45s';

export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description(
      'run a 5-node cluster restart on this machine: PKI, controller, agents, a cluster, a restart, checks; then clean up (--controllers 3: on three controllers sharing PostgreSQL, one killed -9 mid restart)',
    )
    .option('--nodes <n>', 'how many agents (nodes) (default 5; with --controllers, 3 per controller)')
    .option('--keep', 'leave everything running and print how to use it with the CLI and curl')
    .option('--dir <dir>', 'work in this directory (kept afterwards) instead of a new temporary one')
    .option('--timeout <duration>', 'give up on any step after this long (default 45s; with --heat 4m)')
    .option(
      '--controllers <n>',
      'several controllers (2 to 5) on one PostgreSQL: kill -9 the one owning the most nodes mid restart',
    )
    .option(
      '--heat',
      'unmodified OpenStack Heat drives Herald: a 3-node stack restarted with openstack stack update (needs Debian python3-heat)',
    )
    .option(
      '--dial-out',
      'the agents listen on nothing and dial out to the controller, as nodes behind NAT do (docs/dial-out.md)',
    )
    .option(
      '--upgrade',
      'two upgrades instead of the restart: a new service version with canaries promoted once healthy, then a broken one the canary catches and the rollout reverts (docs/api.md "Upgrades")',
    )
    .option(
      '--db <url>',
      'with --controllers: an empty PostgreSQL database, postgres://user[:password]@host:port/db (default: a throwaway server)',
    )
    .addHelpText(
      'after',
      `
Starts, in a temporary directory, a PKI, a controller (embedded SQLite) and agents on 127.0.0.1;
each node gets a "volume" directory and an "application container" process the scripts must not
touch. Creates a cluster whose install script starts a small service (a pid file) and whose
uninstall script stops it, restarts the cluster, prints the timeline and checks that the
containers and volumes survived while the service pids changed. Exit 0 when all checks hold.

With --upgrade (docs/api.md "Upgrades"): instead of the restart, PATCH /v1/clusters/{id} rolls
service version 2 (a new input value: a new revision) with one canary per group, promoted 1 s
after it is healthy; then a broken release (its service dies at start) with a canary and
on_failure revert: the canary's health check fails and the nodes it changed go back to revision
2 at once. The demo prints both timelines, the counters, and checks that every node runs
version 2 with its container and volume untouched.

With --dial-out (docs/dial-out.md): the controller also takes dialled-in connections
(--connect-listen) and every agent runs with --dial-out and no --listen: nothing can connect to
the nodes, and the restart still reaches them by push, over the connections they opened.

With --heat (docs/heat.md): the controller also serves Heat's object store, and standalone
OpenStack Heat from Debian (python3-heat, python3-heatclient, python3-openstackclient; without
them the demo says so and exits 1) runs in the directory with Herald's CA and a token Herald
knows. A stack of three DeployedServers, each with an install (actions CREATE, UPDATE) and an
uninstall (UPDATE) SoftwareDeployment, is created, then restarted with
openstack stack update --existing --parameter restart_trigger=1. The timeline: the command, Heat's
API receiving the PATCH, each metadata PUT reaching Herald, each hook's start, Heat's
UPDATE_COMPLETE; beside it what os-collect-config's 30 s polling would have added (computed).
Heat takes 10-30 s to start.

With --controllers N (docs/several-controllers.md): N controllers (c1..cN) share one PostgreSQL database: the one
--db names (it must be empty: the demo refuses one holding nodes or configs), or else a
throwaway server that initdb makes in a temporary directory and the demo removes afterwards
(needs PostgreSQL's server binaries, Debian package postgresql; as root it runs them as the user
postgres). Every agent knows all controllers (--controller url1,url2,.. --controller-id '*').
The demo shows how the nodes are spread (as herald controllers prints it), restarts the cluster
through one survivor, kills -9 the controller that owns the most nodes once the first node has
restarted, and prints the timeline from the kill: its nodes taken over, each pinged by its new
owner, the restart's end. It checks that the restart completed, that every step ran exactly once
(each node's scripts count their runs) and that the takeover took at most 10 s; exit 1 when a
check fails. With --keep it leaves the survivors, agents and PostgreSQL running and prints how to
use them (herald controllers, the killed controller's command line to start it again) and a
stop.sh.

Examples:
  $ npm run demo
  $ herald demo --nodes 3 --keep
  $ herald demo --heat
  $ herald demo --dial-out
  $ herald demo --controllers 3
  $ herald demo --controllers 3 --keep
  $ herald demo --controllers 3 --nodes 12 --db postgres://herald@db.example:5432/herald_demo
`,
    )
    .action(
      async (opts: {
        nodes?: string;
        keep?: boolean;
        dir?: string;
        timeout?: string;
        controllers?: string;
        db?: string;
        heat?: boolean;
        dialOut?: boolean;
        upgrade?: boolean;
      }) => {
        if (opts.upgrade === true && (opts.heat === true || opts.controllers !== undefined || opts.db !== undefined))
          throw new HeraldError(
            'bad_option',
            '--upgrade runs the one-controller demo: it takes no --heat, --controllers or --db',
          );
        if (opts.dialOut === true && (opts.heat === true || opts.controllers !== undefined || opts.db !== undefined))
          throw new HeraldError(
            'bad_option',
            '--dial-out runs the one-controller demo: it takes no --heat, --controllers or --db',
          );
        if (opts.heat === true) {
          if (opts.controllers !== undefined || opts.db !== undefined || opts.nodes !== undefined)
            throw new HeraldError(
              'bad_option',
              '--heat runs its own three nodes on one controller: it takes no --nodes, --controllers or --db',
            );
          const { runHeatDemo } = await import('./heat.js');
          process.exitCode = await runHeatDemo({ keep: opts.keep === true, dir: opts.dir, timeout: opts.timeout });
          return;
        }
        const timeout = opts.timeout ?? DEFAULT_DEMO_TIMEOUT;
        if (opts.controllers !== undefined) {
          const { runControllersDemo } = await import('./controllers.js');
          process.exitCode = await runControllersDemo({
            controllers: opts.controllers,
            db: opts.db,
            nodes: opts.nodes,
            dir: opts.dir,
            keep: opts.keep === true,
            timeout,
          });
          return;
        }
        if (opts.db !== undefined)
          throw new HeraldError(
            'bad_option',
            '--db needs --controllers: the one-controller demo runs on embedded SQLite',
          );
        const { runDemo } = await import('./run.js');
        process.exitCode = await runDemo({
          dialOut: opts.dialOut === true,
          upgrade: opts.upgrade === true,
          nodes: opts.nodes ?? DEFAULT_DEMO_NODES,
          keep: opts.keep === true,
          dir: opts.dir,
          timeout,
        });
      },
    );
}
