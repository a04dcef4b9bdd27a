/**
 * The operator CLI (docs/api.md operator routes): `herald node|config|deploy|cluster ...`. Each
 * command group takes the connection options (`--controller`, `--pki`, `--as`, `--ca/--cert/
 * --key`, `--controller-id`, `--json`); they may stand before or after the subcommand. Tables for
 * people, the API's JSON with `--json`. Modules beyond commander load inside the actions, so
 * `herald --help` stays instant.
 */
import { type Command, Option } from 'commander';
import type {
  ClusterRevisionView,
  ClusterView,
  ConfigView,
  ControllerView,
  DeploymentView,
  ListEnvelope,
  NodeView,
  RestartPlanView,
} from '../../protocol/rest.js';
import type { ApiClient, ClientOptions } from './client.js';
// small and pure: loaded eagerly; the client (certificates, https) and the watcher load lazily
import { CONTROLLERS_HELP, controllersTable } from './controllers.js';
import { collect, formatMs, keyValues, parseDuration, parsePositiveInt, splitList, table } from './format.js';
import { jsonText, visible } from '../terminal-text.js';
import { gatherInputs, hiddenOnArgvWarning, INPUT_FILE_HELP, warnHiddenOnArgv } from './inputs.js';
import {
  clusterMembers,
  formatPlan,
  RESTART_HELP,
  restartBody,
  rolloutBody,
  UPGRADE_HELP,
  type RestartFlags,
  type RolloutFlags,
} from './rollout.js';
import { registerAccess } from './access.js';

export interface CommonOptions extends ClientOptions {
  json?: boolean;
  raw?: boolean;
}

/** Exit status of `cluster restart --wait` (and `deploy --wait`) when the operation failed. */
export const EXIT_FAILED = 1;
/** Exit status when `--wait` gave up at `--timeout`. */
export const EXIT_TIMEOUT = 2;

const CONNECTION_HELP = `
Connection (on every operator command, before or after the subcommand):
  --controller <url>      controller API (env HERALD_CONTROLLER, default https://127.0.0.1:8443)
  --pki <dir>             PKI directory (env HERALD_PKI, default ./pki); uses
                          <pki>/ca.crt and <pki>/operator/<as>.crt|.key
  --as <name>             operator identity operator/<name> (default admin)
  --ca/--cert/--key       override the files taken from --pki
  --controller-id <name>  the server must present controller/<name> (default controller)
  --json                  print the API's JSON instead of tables
  --raw                   print text from nodes as it came: without it, terminal control
                          characters (ESC, CR, C1, ...) are shown as \\u001b etc. (docs/cli.md)`;

/** Adds the connection options to a command group. */
export function withConnectionOptions(cmd: Command): Command {
  return cmd
    .option('--controller <url>', 'controller API URL (env HERALD_CONTROLLER)')
    .option('--pki <dir>', 'PKI directory (env HERALD_PKI)')
    .option('--as <name>', 'operator identity: uses <pki>/operator/<name>.crt and .key (default admin)')
    .option('--ca <file>', 'CA certificate (default <pki>/ca.crt)')
    .option('--cert <file>', 'client certificate (default <pki>/operator/<as>.crt)')
    .option('--key <file>', 'client key (default <pki>/operator/<as>.key)')
    .option('--controller-id <name>', 'expected server identity controller/<name> (default controller)')
    .option('--json', 'print the API JSON instead of tables')
    .option('--raw', 'print text from nodes (output, reasons) as it came, terminal control bytes included')
    .addHelpText('after', CONNECTION_HELP);
}

/** Runs `fn` with an API client made from the command's (and its parents') options. */
export async function withClient<T>(cmd: Command, fn: (client: ApiClient, o: CommonOptions) => Promise<T>): Promise<T> {
  const o = cmd.optsWithGlobals<CommonOptions>();
  const { clientFromOptions } = await import('./client.js');
  const client = clientFromOptions(o);
  try {
    return await fn(client, o);
  } finally {
    client.close();
  }
}

/**
 * Prints text for people: what the controller sent (a node's output, reasons, names) goes through
 * `visible()` so a node's terminal control bytes are shown, not obeyed, unless `--raw`.
 */
export function out(o: CommonOptions, s: string): void {
  process.stdout.write(o.raw === true ? s : visible(s));
}

/** Prints the API's JSON (lossless: `jsonText` escapes C1 controls as `\u0080`-`\u009f` unless `--raw`). */
export function printJson(o: CommonOptions, v: unknown): void {
  process.stdout.write(`${jsonText(v, o.raw === true)}\n`);
}

/** GETs `path` and prints it: the API's JSON with --json, else what `render` makes of it. */
function printGet<T>(cmd: Command, path: string, render: (body: T) => string): Promise<void> {
  return withClient(cmd, async (client, o) => {
    const body = await client.get<T>(path);
    if (o.json) return printJson(o, body);
    out(o, render(body));
  });
}

function seg(s: string): string {
  return encodeURIComponent(s);
}

type Obj = Record<string, unknown>;

/** How often `--wait` re-reads the resource. */
const WAIT_POLL_INTERVAL_MS = 250;

/**
 * `--wait`: re-reads `path` while `busy` holds of the last answer and `timeoutMs` has not
 * passed; returns the last answer.
 */
async function waitWhile<T>(
  client: ApiClient,
  path: string,
  first: T,
  busy: (v: T) => boolean,
  timeoutMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let v = first;
  while (busy(v) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, WAIT_POLL_INTERVAL_MS));
    v = await client.get<T>(path);
  }
  return v;
}

/** The exit status `--wait` ends with: EXIT_TIMEOUT while still busy, EXIT_FAILED on failure. */
function waitExitCode(stillBusy: boolean, failed: boolean): number | undefined {
  return stillBusy ? EXIT_TIMEOUT : failed ? EXIT_FAILED : undefined;
}

/** A leaf subcommand with the examples shown under its help. */
export function leaf(parent: Command, nameAndArgs: string, description: string, examples: string[]): Command {
  const c = parent.command(nameAndArgs).description(description);
  // operators come from the openstack CLI (`list`) and from Unix (`ls`): a lister answers to both
  const verb = nameAndArgs.split(' ')[0];
  if (verb === 'ls') c.alias('list');
  else if (verb === 'list') c.alias('ls');
  c.configureHelp({ showGlobalOptions: true });
  if (examples.length) c.addHelpText('after', `\nExamples:\n${examples.map((e) => `  $ ${e}`).join('\n')}\n`);
  return c;
}

// ---- node ---------------------------------------------------------------------------------------

function registerNode(program: Command): void {
  const node = withConnectionOptions(program.command('node').description('list, show, add and remove nodes (agents)'));
  leaf(node, 'ls', 'list nodes with their endpoint and push state', ['herald node ls', 'herald node ls --json']).action(
    async (_o, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const body = await client.get<ListEnvelope<NodeView>>('/v1/nodes');
        if (o.json) return printJson(o, body);
        const rows = body.items.map(({ id, endpoint, generation, push: p, labels }) => [
          id,
          endpoint,
          // an agent that dialled in (docs/protocol.md, "Dialled-in connections") says so
          p.via === 'dialled-in' ? `${p.state} (dialled in)` : p.state,
          generation,
          p.generation_acked,
          p.last_ack_at,
          p.last_error,
          labelsText(labels),
        ]);
        out(o, table(['ID', 'ENDPOINT', 'PUSH', 'GEN', 'ACKED', 'LAST ACK', 'LAST ERROR', 'LABELS'], rows));
      });
    },
  );
  leaf(
    node,
    'show <id>',
    'show one node: endpoint, push state (connected, last ack, generations pushed/acked/fetched, last error)',
    ['herald node show n1'],
  ).action(async (id: string, _o, cmd: Command) => {
    await printGet<NodeView>(cmd, `/v1/nodes/${seg(id)}`, (body) => keyValues(body));
  });
  leaf(node, 'add <id>', 'add a node (agents also register themselves when they announce their endpoint)', [
    'herald node add n1',
    'herald node add n1 --endpoint wss://10.0.0.5:7443/v1/wake',
    'herald node add web-1 --label team=web --label tier=front',
  ])
    .option('--endpoint <url>', 'the agent listener, wss://host:port/v1/wake')
    .option('--label <key=value>', 'a label grants may select the node by (repeatable; docs/access.md)', collect)
    .action(async (id: string, opts: { endpoint?: string; label?: string[] }, cmd: Command) => {
      const { parseLabelArgs } = await import('./access.js');
      const labels = parseLabelArgs(opts.label ?? [], false);
      await withClient(cmd, async (client, o) => {
        const req: Obj = { id };
        if (opts.endpoint) req.endpoint = opts.endpoint;
        if (Object.keys(labels).length > 0) req.labels = labels;
        const body = await client.post<NodeView>('/v1/nodes', req);
        if (o.json) return printJson(o, body);
        out(o, `node ${body.id} added\n`);
      });
    });
  leaf(
    node,
    'label <id> <changes...>',
    'set (key=value) or remove (key-) labels of a node: what grants may select it by (docs/access.md)',
    ['herald node label web-1 team=web tier=front', 'herald node label web-1 tier-'],
  ).action(async (id: string, changes: string[], _o, cmd: Command) => {
    const { parseLabelArgs } = await import('./access.js');
    const labels = parseLabelArgs(changes, true);
    await withClient(cmd, async (client, o) => {
      const body = await client.patch<NodeView>(`/v1/nodes/${seg(id)}`, { labels });
      if (o.json) return printJson(o, body);
      out(o, `node ${body.id} labels: ${labelsText(body.labels) || '(none)'}\n`);
    });
  });
  leaf(node, 'rm <id>', 'delete a node; its id stays refused to agents until an operator adds it again', [
    'herald node rm n1',
  ]).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.delete(`/v1/nodes/${seg(id)}`);
      if (o.json) return printJson(o, body ?? { deleted: id });
      out(o, `node ${id} deleted\n`);
    });
  });
  leaf(
    node,
    'revoke <id>',
    "revoke every certificate of a node's agent issued up to now, whatever issued it; live connections of it are closed",
    ['herald node revoke n1'],
  ).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.post<{ node: string; revoked_before: string }>(`/v1/nodes/${seg(id)}/revoke`, {});
      if (o.json) return printJson(o, body);
      out(o, `node ${body.node} revoked: its certificates issued before ${body.revoked_before} are refused\n`);
      out(
        o,
        'to let it in again: herald enroll token --node <id>, then herald agent enroll on the node (docs/adding-nodes.md)\n',
      );
    });
  });
}

// ---- config -------------------------------------------------------------------------------------

function registerConfig(program: Command): void {
  const config = withConnectionOptions(
    program.command('config').description('create, list and show software configs (immutable)'),
  );
  leaf(config, 'create', 'create a software config from a file', [
    'herald config create --name install --file install.sh --input port:Number=8080 --output url',
    'herald config create --name db --file db.sh --hidden-input password',
    'herald config create --name both --group component --file component.json',
  ])
    .requiredOption('--name <name>', 'config name')
    .requiredOption(
      '--file <path>',
      "the config: a script for group script ('-' reads stdin); JSON for group component",
    )
    .option('--group <group>', "hook group: script (built in), component, or a hook in the agents' hooks dir", 'script')
    .option(
      '--input <name[:Type][=default]>',
      `declare an input (repeatable); Type one of String, Number, CommaDelimitedList, Json, Boolean`,
      collect,
    )
    .option(
      '--hidden-input <name[:Type][=default]>',
      'declare an input whose value is never shown (repeatable)',
      collect,
    )
    .option('--output <name[:Type]>', 'declare an output (repeatable)', collect)
    .option(
      '--error-output <name[:Type]>',
      'declare an output whose presence fails the deployment (repeatable)',
      collect,
    )
    .option(
      '--hidden-output <name[:Type]>',
      'declare an output whose value only operators who may deploy to the node see (repeatable; docs/access.md)',
      collect,
    )
    .option('--hook-timeout <duration>', 'options.timeout: kill the run after this long (e.g. 90s, 10m; default 600s)')
    .action(
      async (
        opts: {
          name: string;
          file: string;
          group: string;
          input?: string[];
          hiddenInput?: string[];
          output?: string[];
          errorOutput?: string[];
          hiddenOutput?: string[];
          hookTimeout?: string;
        },
        cmd: Command,
      ) => {
        const { readConfigFile, buildConfigRequest } = await import('./requests.js');
        for (const spec of opts.hiddenInput ?? []) {
          if (spec.includes('='))
            process.stderr.write(
              hiddenOnArgvWarning(spec.slice(0, spec.indexOf('=')).split(':')[0]!, '--hidden-input'),
            );
        }
        const text = await readConfigFile(opts.file);
        const req = buildConfigRequest({ ...opts, text });
        await withClient(cmd, async (client, o) => {
          const body = await client.post<ConfigView>('/v1/configs', req);
          if (o.json) return printJson(o, body);
          out(o, `config ${body.id} created (${opts.name}, group ${opts.group})\n`);
        });
      },
    );
  leaf(config, 'ls', 'list configs', ['herald config ls']).action(async (_o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<ListEnvelope<ConfigView>>('/v1/configs');
      if (o.json) return printJson(o, body);
      const rows = body.items.map((c) => [c.id, c.name, c.group, c.inputs.length, c.outputs.length, c.creation_time]);
      out(o, table(['ID', 'NAME', 'GROUP', 'INPUTS', 'OUTPUTS', 'CREATED'], rows));
    });
  });
  leaf(config, 'show <id>', 'show one config with its script, inputs (hidden defaults shown as ***) and outputs', [
    'herald config show 3f1c...',
  ]).action(async (id: string, _o, cmd: Command) => {
    await printGet<ConfigView>(cmd, `/v1/configs/${seg(id)}`, (body) => keyValues(body));
  });
}

// ---- deploy -------------------------------------------------------------------------------------

function registerDeploy(program: Command): void {
  const deploy = withConnectionOptions(
    program.command('deploy').description('create, update, show and remove software deployments'),
  );
  leaf(deploy, 'create', 'deploy a config to a node (a new deployment at revision 1)', [
    'herald deploy create --node n1 --config 3f1c... --input port=8080',
    'herald deploy create --node n1 --config 3f1c... --actions CREATE,UPDATE,DELETE --wait',
    'herald deploy create --node n1 --config 3f1c... --input-file secrets.json --input port=8080',
  ])
    .requiredOption('--node <id>', 'the node')
    .requiredOption('--config <id>', 'the config id')
    .option('--name <name>', "deployment name (default: the config's); sorts the node's deployments")
    .option('--action <action>', "this revision's action (default CREATE)")
    .option('--actions <list>', 'actions that run the config, comma-separated (default CREATE,UPDATE)')
    .option('--input <key=value>', 'an input value (repeatable; json:<JSON> for lists and objects)', collect)
    .option('--input-file <file>', INPUT_FILE_HELP)
    .option('--wait', 'wait until the deployment is COMPLETE or FAILED')
    .option('--timeout <duration>', 'with --wait: give up after this long', '10m')
    .action(
      async (
        opts: {
          node: string;
          config: string;
          name?: string;
          action?: string;
          actions?: string;
          input?: string[];
          inputFile?: string;
          wait?: boolean;
          timeout: string;
        },
        cmd: Command,
      ) => {
        const req: Obj = { node: opts.node, config_id: opts.config };
        if (opts.name) req.name = opts.name;
        if (opts.action) req.action = opts.action;
        if (opts.actions !== undefined) req.actions = splitList(opts.actions);
        const inputs = await gatherInputs(opts);
        if (inputs.values) req.input_values = inputs.values;
        const timeoutMs = parseDuration(opts.timeout, '--timeout');
        await withClient(cmd, async (client, o) => {
          await warnHiddenOnArgv(client, [opts.config], inputs.argvNames);
          const body = await client.post<DeploymentView>('/v1/deployments', req);
          await reportDeployment(client, body, 'created', opts.wait === true, timeoutMs, o);
        });
      },
    );
  leaf(deploy, 'update <id>', 'make a new revision with new input values and/or action', [
    'herald deploy update 9a2b... --input port=9090',
    'herald deploy update 9a2b... --action UPDATE --wait',
    'herald deploy update 9a2b... --input-file - < secrets.json',
  ])
    .option('--action <action>', "the new revision's action")
    .option('--input <key=value>', 'an input value (repeatable; json:<JSON> for lists and objects)', collect)
    .option('--input-file <file>', INPUT_FILE_HELP)
    .option('--wait', 'wait until the new revision is COMPLETE or FAILED')
    .option('--timeout <duration>', 'with --wait: give up after this long', '10m')
    .action(
      async (
        id: string,
        opts: { action?: string; input?: string[]; inputFile?: string; wait?: boolean; timeout: string },
        cmd: Command,
      ) => {
        const req: Obj = {};
        if (opts.action) req.action = opts.action;
        const inputs = await gatherInputs(opts);
        if (inputs.values) req.input_values = inputs.values;
        const timeoutMs = parseDuration(opts.timeout, '--timeout');
        await withClient(cmd, async (client, o) => {
          if (inputs.argvNames.length > 0) {
            const current = await client.get<DeploymentView>(`/v1/deployments/${seg(id)}`).catch(() => undefined);
            await warnHiddenOnArgv(client, [current?.config_id], inputs.argvNames);
          }
          const body = await client.patch<DeploymentView>(`/v1/deployments/${seg(id)}`, req);
          await reportDeployment(client, body, 'updated', opts.wait === true, timeoutMs, o);
        });
      },
    );
  leaf(
    deploy,
    'show <id>',
    'show a deployment: revision, status, reason and output values (stdout, stderr, status code)',
    ['herald deploy show 9a2b...'],
  ).action(async (id: string, _o, cmd: Command) => {
    await printGet<DeploymentView>(cmd, `/v1/deployments/${seg(id)}`, (body) => keyValues(body));
  });
  leaf(deploy, 'ls', 'list deployments', ['herald deploy ls', 'herald deploy ls --node n1'])
    .option('--node <id>', "only this node's")
    .action(async (opts: { node?: string }, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const body = await client.get<ListEnvelope<DeploymentView>>(
          `/v1/deployments${opts.node ? `?node=${seg(opts.node)}` : ''}`,
        );
        if (o.json) return printJson(o, body);
        out(
          o,
          table(
            ['ID', 'NODE', 'NAME', 'ACTION', 'REV', 'STATUS', 'REASON'],
            body.items.map((d) => [d.id, d.node, d.name, d.action, d.revision, d.status, d.status_reason]),
          ),
        );
      });
    });
  leaf(deploy, 'logs <id>', "print a deployment's live output; --follow: as it comes, until the revision's result", [
    'herald deploy logs 9a2b...',
    'herald deploy logs 9a2b... --follow',
    'herald deploy logs 9a2b... --revision 2',
  ])
    .option('--follow', 'keep printing new output until the revision is signalled (exit 1 if it FAILED)')
    .option('--revision <n>', 'this revision (default: the current one)')
    .option('--timeout <duration>', 'with --follow: give up after this long', '10m')
    .action(async (id: string, opts: { follow?: boolean; revision?: string; timeout: string }, cmd: Command) => {
      const timeoutMs = parseDuration(opts.timeout, '--timeout');
      const revision = opts.revision === undefined ? undefined : parsePositiveInt(opts.revision, '--revision');
      const { deployLogs } = await import('./logs.js');
      await withClient(cmd, async (client, o) => {
        const r = await deployLogs(client, id, {
          follow: opts.follow === true,
          revision,
          timeoutMs,
          json: o.json === true,
          raw: o.raw === true,
        });
        if (r.exitCode === 'timeout') process.stderr.write(`herald: timed out following deployment ${id}\n`);
        process.exitCode = waitExitCode(r.exitCode === 'timeout', r.exitCode === 'failed') ?? process.exitCode;
      });
    });
  leaf(deploy, 'rm <id>', 'delete a deployment: runs a DELETE revision if DELETE is in its actions, then removes it', [
    'herald deploy rm 9a2b...',
  ]).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.delete(`/v1/deployments/${seg(id)}`);
      if (o.json) return printJson(o, body ?? { deleted: id });
      out(o, `deployment ${id} ${body ? 'is being deleted' : 'deleted'}\n`);
    });
  });
}

async function reportDeployment(
  client: ApiClient,
  body: DeploymentView,
  verb: string,
  wait: boolean,
  timeoutMs: number,
  o: CommonOptions,
): Promise<void> {
  const busy = (d: DeploymentView): boolean => d.status === 'IN_PROGRESS';
  const d = wait ? await waitWhile(client, `/v1/deployments/${seg(body.id)}`, body, busy, timeoutMs) : body;
  if (o.json) printJson(o, d);
  else
    out(
      o,
      `deployment ${d.id} ${verb}: revision ${d.revision}, ${d.status}${d.status_reason ? ` (${d.status_reason})` : ''}\n`,
    );
  if (!wait) return;
  if (busy(d)) process.stderr.write(`herald: timed out waiting for deployment ${d.id}\n`);
  process.exitCode = waitExitCode(busy(d), d.status === 'FAILED') ?? process.exitCode;
}

// ---- cluster ------------------------------------------------------------------------------------

function registerCluster(program: Command): void {
  const cluster = withConnectionOptions(
    program.command('cluster').description('create, list, show, restart and remove clusters'),
  );
  leaf(cluster, 'create', 'create a cluster: the install config is deployed on every node', [
    'herald cluster create --name demo --nodes n1,n2,n3 --install <cfg> --uninstall <cfg>',
    'herald cluster create --name k8s --nodegroup masters:master:m1,m2 --nodegroup workers:worker:w1,w2,w3 --install <cfg> --uninstall <cfg>',
    'herald cluster create --name k8s --nodegroups-file groups.json --install <cfg> --uninstall <cfg>',
    'herald cluster create --name k8s --nodes n1,n2 --install <cfg> --uninstall <cfg> --input version=1.29 --wait',
    'herald cluster create --name db --nodes n1,n2 --install <cfg> --uninstall <cfg> --input-file secrets.json',
  ])
    .requiredOption('--name <name>', 'cluster name')
    .option('--nodes <list>', 'comma-separated node ids: one node group, default-worker')
    .option(
      '--nodegroup <name:role:nodes>',
      'a node group: name, role master or worker (may be left out: worker), comma-separated nodes (repeatable)',
      collect,
    )
    .option(
      '--nodegroups-file <file>',
      'node groups as a JSON array, each {"name","role"?,"nodes":[..],"install_config_id"?,"uninstall_config_id"?,"input_values"?}, for groups with configs or values of their own ("-" reads stdin)',
    )
    .requiredOption('--install <config>', 'install config id')
    .requiredOption('--uninstall <config>', 'uninstall config id')
    .option('--input <key=value>', 'an input value for both configs (repeatable)', collect)
    .option('--input-file <file>', `${INPUT_FILE_HELP} (values for both configs)`)
    .option('--wait', 'wait until CREATE_COMPLETE or CREATE_FAILED')
    .option('--timeout <duration>', 'with --wait: give up after this long', '10m')
    .action(
      async (
        opts: {
          name: string;
          nodes?: string;
          nodegroup?: string[];
          nodegroupsFile?: string;
          install: string;
          uninstall: string;
          input?: string[];
          inputFile?: string;
          wait?: boolean;
          timeout: string;
        },
        cmd: Command,
      ) => {
        const req: Obj = {
          name: opts.name,
          ...(await clusterMembers(opts)),
          install_config_id: opts.install,
          uninstall_config_id: opts.uninstall,
        };
        const inputs = await gatherInputs(opts);
        if (inputs.values) req.input_values = inputs.values;
        const timeoutMs = parseDuration(opts.timeout, '--timeout');
        await withClient(cmd, async (client, o) => {
          // both configs receive every cluster input: a name hidden by either is hidden
          await warnHiddenOnArgv(client, [opts.install, opts.uninstall], inputs.argvNames);
          const first = await client.post<ClusterView>('/v1/clusters', req);
          const busy = (c: ClusterView): boolean => c.status.endsWith('_IN_PROGRESS');
          const body = opts.wait
            ? await waitWhile(client, `/v1/clusters/${seg(first.id)}`, first, busy, timeoutMs)
            : first;
          if (o.json) printJson(o, body);
          else out(o, `cluster ${body.id} created (${opts.name}): ${body.status}\n`);
          if (opts.wait)
            process.exitCode = waitExitCode(busy(body), body.status.endsWith('_FAILED')) ?? process.exitCode;
        });
      },
    );
  leaf(cluster, 'ls', 'list clusters', ['herald cluster ls']).action(async (_o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<ListEnvelope<ClusterView>>('/v1/clusters');
      if (o.json) return printJson(o, body);
      out(
        o,
        table(
          ['ID', 'NAME', 'STATUS', 'NODES', 'REASON'],
          body.items.map((c) => [c.id, c.name, c.status, c.nodes.length, c.status_reason]),
        ),
      );
    });
  });
  leaf(cluster, 'show <id>', "show a cluster's status and each node's phase, times and failing reason", [
    'herald cluster show 7c0d...',
  ]).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<ClusterView>(`/v1/clusters/${seg(id)}`);
      if (o.json) return printJson(o, body);
      const { clusterStateOf } = await import('./watch.js');
      const c = clusterStateOf(body);
      const head: Obj = {};
      for (const [k, v] of Object.entries(body))
        if (!Array.isArray(v) && (v === null || typeof v !== 'object')) head[k] = v;
      if (body.counters)
        head.counters = Object.entries(body.counters)
          .map(([k, v]) => `${k} ${v}`)
          .join(', ');
      const state = body.rollout?.state;
      if (state) head.rollout = state.phase + (state.revert ? ` (revert to revision ${state.revert.revision})` : '');
      out(o, keyValues(head));
      const dur = (a?: number, b?: number): string => (a !== undefined && b !== undefined ? formatMs(b - a) : '-');
      out(
        o,
        `\n${table(
          ['NODE', 'PHASE', 'NODEGROUP', 'REVISION', 'UNINSTALL', 'INSTALL', 'REASON'],
          c.nodes.map((n, i) => [
            n.node,
            n.phase,
            body.nodes[i]?.nodegroup ?? '-',
            body.nodes[i]?.revision ?? '-',
            dur(n.uninstallStartedMs, n.uninstallDoneMs),
            dur(n.installStartedMs, n.installDoneMs),
            n.reason,
          ]),
        )}`,
      );
    });
  });
  const restart = leaf(
    cluster,
    'restart <id>',
    'restart the cluster: on each node the uninstall config, then the install config (deploy_action RESTART), group by group, masters first',
    [
      'herald cluster restart 7c0d... --wait',
      'herald cluster restart 7c0d... --max-unavailable 2 --wait --timeout 30m',
      'herald cluster restart 7c0d... --canary 1 --auto-promote 1m --on-failure pause --wait',
    ],
  );
  restart.option('--nodegroup <name>', 'restart only this node group (repeatable; default: all)', collect);
  withRolloutOptions(restart, 'restart', 'RESTART')
    .addHelpText('after', RESTART_HELP)
    .addHelpText(
      'after',
      "\nWith --wait on a terminal a progress bar shows each node's phase; otherwise one line per change:\n  12:00:01.234 n1 uninstalling\n  12:00:01.301 n1 installing\n  12:00:01.350 n1 complete (uninstall 40 ms, install 35 ms)\n",
    )
    .action(
      async (
        id: string,
        opts: RestartFlags & { wait?: boolean; timeout: string; progress?: 'bar' | 'lines'; events: boolean },
        cmd: Command,
      ) => {
        const body = restartBody(opts);
        const timeoutMs = parseDuration(opts.timeout, '--timeout');
        await withClient(cmd, async (client, o) => {
          const startedAt = new Date();
          const plan = await client.patch<RestartPlanView | undefined>(`/v1/clusters/${seg(id)}/actions/restart`, body);
          if (opts.dryRun) {
            if (o.json) printJson(o, plan);
            else if (plan) out(o, formatPlan(plan));
            return;
          }
          if (!opts.wait) {
            if (o.json) printJson(o, { accepted: true, cluster: id });
            else out(o, `restart of cluster ${id} accepted; follow it with: herald cluster show ${id}\n`);
            return;
          }
          const { followRestart } = await import('./restart.js');
          process.exitCode = await followRestart(client, {
            clusterId: id,
            startedAt,
            timeoutMs,
            json: o.json === true,
            raw: o.raw === true,
            progress: opts.progress,
            useEvents: opts.events,
          });
        });
      },
    );
  registerUpgrade(cluster);
  leaf(
    cluster,
    'nodegroup-add <id> <group>',
    'add a node group (name:role:n1,n2, or name:n1,n2 for a worker group) to an idle cluster: its nodes install',
    [
      'herald cluster nodegroup-add 7c0d... gpu:worker:n7,n8',
      'herald cluster nodegroup-add 7c0d... gpu:n7,n8 --install <cfg> --input driver=550 --wait',
    ],
  )
    .option('--install <config>', "the group's own install config (default: the cluster's)")
    .option('--uninstall <config>', "the group's own uninstall config (default: the cluster's)")
    .option('--input <key=value>', "an input value for the group's nodes, over the cluster's (repeatable)", collect)
    .option('--input-file <file>', INPUT_FILE_HELP)
    .option('--wait', 'wait until UPDATE_COMPLETE or UPDATE_FAILED')
    .option('--timeout <duration>', 'with --wait: give up after this long', '10m')
    .action(
      async (
        id: string,
        spec: string,
        opts: {
          install?: string;
          uninstall?: string;
          input?: string[];
          inputFile?: string;
          wait?: boolean;
          timeout: string;
        },
        cmd: Command,
      ) => {
        const { parseNodegroupSpec } = await import('./rollout.js');
        const req: Obj = { ...parseNodegroupSpec(spec) };
        if (opts.install) req.install_config_id = opts.install;
        if (opts.uninstall) req.uninstall_config_id = opts.uninstall;
        const inputs = await gatherInputs(opts);
        if (inputs.values) req.input_values = inputs.values;
        const timeoutMs = parseDuration(opts.timeout, '--timeout');
        await withClient(cmd, async (client, o) => {
          const g = await client.post<Obj>(`/v1/clusters/${seg(id)}/nodegroups`, req);
          const busy = (c: ClusterView): boolean => c.status.endsWith('_IN_PROGRESS');
          const now = await client.get<ClusterView>(`/v1/clusters/${seg(id)}`);
          const body = opts.wait ? await waitWhile(client, `/v1/clusters/${seg(id)}`, now, busy, timeoutMs) : now;
          if (o.json) printJson(o, opts.wait ? body : g);
          else out(o, `node group ${String(req.name)} added to cluster ${id}: ${body.status}\n`);
          if (opts.wait)
            process.exitCode = waitExitCode(busy(body), body.status.endsWith('_FAILED')) ?? process.exitCode;
        });
      },
    );
  leaf(
    cluster,
    'nodegroup-rm <id> <name>',
    'remove a node group: its nodes uninstall (deploy_action DELETE), then the group goes',
    ['herald cluster nodegroup-rm 7c0d... gpu'],
  ).action(async (id: string, name: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.delete(`/v1/clusters/${seg(id)}/nodegroups/${seg(name)}`);
      if (o.json) return printJson(o, body);
      out(o, `node group ${name} of cluster ${id} is being removed (uninstall on its nodes, then removal)\n`);
    });
  });
  leaf(cluster, 'rm <id>', 'delete a cluster: uninstalls on every node, then removes it', [
    'herald cluster rm 7c0d...',
  ]).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.delete(`/v1/clusters/${seg(id)}`);
      if (o.json) return printJson(o, body ?? { deleted: id });
      out(o, `cluster ${id} is being deleted (uninstall on every node, then removal)\n`);
    });
  });
}

/**
 * The options every rollout takes (docs/api.md "Rollouts"): windows, pauses, health check,
 * failure budget, canaries, deadlines, the gate, `--force`, a dry run, and `--wait`.
 */
function withRolloutOptions(c: Command, what: string, OP: string): Command {
  return c
    .option(
      '--max-unavailable <n|p%>',
      `per group, at most this many nodes in their ${what} at once, or a percentage of the group's nodes (default: 1 in a master group, all in the others; a master group keeps its quorum, max(1, (n-1)/2), unless --force)`,
    )
    .option('--pause <duration>', "keep a node's slot taken this long after it ended, e.g. 10s (default 0)")
    .option('--max-failures <n>', 'failed nodes tolerated before no other node starts (default 0)')
    .option(
      '--health-config <config>',
      'run this config on each node after its install (deploy_action CHECK); the node ends when it succeeded',
    )
    .option(
      '--canary <n|p%>',
      'per group, this many nodes (or a percentage of those it changes) go first, then it waits for a promotion',
    )
    .option(
      '--auto-promote <duration>',
      'promote the canaries this long after they completed (default: wait for herald cluster rollout promote)',
    )
    .option(
      '--on-failure <pause|abort|revert>',
      'once the failure budget is spent: wait for an operator, stop (default), or revert the nodes changed (an upgrade)',
    )
    .option('--node-deadline <duration>', "a node's whole pass must end within this, else it fails timed out")
    .option(
      '--progress-deadline <duration>',
      'the rollout fails once this long passes without progress (default 1h, or its steps end to end)',
    )
    .option('--gate-url <url>', 'an HTTPS URL asked before each new node starts: 2xx goes, anything else stops')
    .option('--gate-prometheus <url>', 'a Prometheus server asked before each new node starts (with --gate-query)')
    .option(
      '--gate-query <promql>',
      'with --gate-prometheus: an instant query whose non-empty result stops the rollout',
    )
    .option('--gate-fail-open', 'a gate that cannot be read lets the rollout go (default: it stops)')
    .option('--force', 'lift the quorum rule of master groups')
    .option('--dry-run', 'print the plan (groups in order, their nodes and limits) and run nothing')
    .option('--wait', `follow it live; exit 0 on ${OP}_COMPLETE, 1 on ${OP}_FAILED, 2 on --timeout`)
    .option('--timeout <duration>', 'with --wait: give up after this long', '10m')
    .addOption(
      new Option('--progress <mode>', 'with --wait: bar (default on a terminal) or lines').choices(['bar', 'lines']),
    )
    .addOption(new Option('--no-events', 'with --wait: only poll the cluster, do not follow /v1/events').hideHelp());
}

type FollowFlags = { wait?: boolean; timeout: string; progress?: 'bar' | 'lines'; events: boolean; dryRun?: boolean };

/** Sends an upgrade (or undo) and prints its plan, its acceptance, or (`--wait`) its course. */
async function sendRollout(
  cmd: Command,
  id: string,
  path: string,
  body: Obj,
  opts: FollowFlags,
  what: 'upgrade' | 'undo',
): Promise<void> {
  const timeoutMs = parseDuration(opts.timeout, '--timeout');
  await withClient(cmd, async (client, o) => {
    const startedAt = new Date();
    const answer = await client.patch<Obj>(path, body);
    if (opts.dryRun) {
      if (o.json) printJson(o, answer);
      else out(o, formatPlan(answer as unknown as RestartPlanView & { new_revision?: boolean }));
      return;
    }
    const c = answer as unknown as ClusterView;
    if (!opts.wait) {
      if (o.json) printJson(o, c);
      else
        out(
          o,
          `${what} of cluster ${id} to revision ${c.revision} accepted (${c.counters.targeted} node(s)); follow it with: herald cluster show ${id}\n`,
        );
      return;
    }
    if (!o.json)
      out(o, `${what} of cluster ${id} to revision ${c.revision}: ${c.counters.targeted} node(s) to change\n`);
    const { followRestart } = await import('./restart.js');
    process.exitCode = await followRestart(client, {
      clusterId: id,
      startedAt,
      timeoutMs,
      json: o.json === true,
      raw: o.raw === true,
      progress: opts.progress,
      useEvents: opts.events,
      what,
    });
  });
}

/** `herald cluster upgrade`, `herald cluster rollout pause|resume|abort|promote|undo`, `herald cluster revisions`. */
function registerUpgrade(cluster: Command): void {
  const upgrade = leaf(
    cluster,
    'upgrade <id>',
    'roll new configs or input values over the cluster (a new revision): on each node the uninstall of the old, the install of the new (deploy_action UPDATE)',
    [
      'herald cluster upgrade 7c0d... --install-config 9a1b... --canary 1 --on-failure revert --wait',
      'herald cluster upgrade 7c0d... --nodegroup workers --input version=1.30 --dry-run',
    ],
  )
    .option('--nodegroup <name>', "change this group's own configs and values, and roll them over its nodes alone")
    .option('--install-config <config>', 'the new install config')
    .option('--uninstall-config <config>', 'the new uninstall config')
    .option('--input <key=value>', 'a new input value, over the current ones (repeatable)', collect)
    .option('--remove-input <key>', 'remove an input value (repeatable)', collect)
    .option('--input-file <file>', INPUT_FILE_HELP);
  withRolloutOptions(upgrade, 'upgrade', 'UPDATE')
    .addHelpText('after', UPGRADE_HELP)
    .action(
      async (
        id: string,
        opts: RolloutFlags &
          FollowFlags & {
            nodegroup?: string;
            installConfig?: string;
            uninstallConfig?: string;
            input?: string[];
            inputFile?: string;
            removeInput?: string[];
          },
        cmd: Command,
      ) => {
        const body: Obj = rolloutBody(opts);
        if (opts.installConfig) body.install_config_id = opts.installConfig;
        if (opts.uninstallConfig) body.uninstall_config_id = opts.uninstallConfig;
        const inputs = await gatherInputs(opts);
        const removed = Object.fromEntries((opts.removeInput ?? []).map((k) => [k, null]));
        if (inputs.values || opts.removeInput?.length) body.input_values = { ...inputs.values, ...removed };
        const path =
          opts.nodegroup === undefined
            ? `/v1/clusters/${seg(id)}`
            : `/v1/clusters/${seg(id)}/nodegroups/${seg(opts.nodegroup)}`;
        await sendRollout(cmd, id, path, body, opts, 'upgrade');
      },
    );

  const rollout = cluster
    .command('rollout')
    .description("control a cluster's running restart or upgrade, or undo its last change (docs/api.md)");
  const controls: Array<['pause' | 'resume' | 'abort' | 'promote', string]> = [
    ['pause', 'no node starts any more; those in flight finish (herald cluster rollout resume goes on)'],
    ['resume', 'go on after a pause (after a pause of --on-failure pause, the failures so far are forgiven)'],
    ['abort', 'no node starts any more; the operation ends failed once none is in flight'],
    ['promote', 'the canaries are good: the rest of the rollout goes'],
  ];
  for (const [what, description] of controls)
    leaf(rollout, `${what} <id>`, description, [`herald cluster rollout ${what} 7c0d...`]).action(
      async (id: string, _o, cmd: Command) => {
        await withClient(cmd, async (client, o) => {
          const c = await client.patch<ClusterView>(`/v1/clusters/${seg(id)}/actions/${what}`);
          if (o.json) return printJson(o, c);
          const phase = c.rollout?.state?.phase ?? 'done';
          out(o, `cluster ${id} ${c.status}, rollout ${phase} (${what} recorded in the audit)\n`);
        });
      },
    );
  const undo = leaf(
    rollout,
    'undo <id>',
    'roll an earlier revision again, as a new one (default: the last stable revision before the current one)',
    ['herald cluster rollout undo 7c0d... --wait', 'herald cluster rollout undo 7c0d... --revision 3 --dry-run'],
  ).option('--revision <n>', 'the revision whose configs and values come back');
  withRolloutOptions(undo, 'undo', 'UPDATE').action(
    async (id: string, opts: RolloutFlags & FollowFlags & { revision?: string }, cmd: Command) => {
      const body: Obj = rolloutBody(opts);
      if (opts.revision !== undefined) body.revision = parsePositiveInt(opts.revision, '--revision');
      await sendRollout(cmd, id, `/v1/clusters/${seg(id)}/actions/undo`, body, opts, 'undo');
    },
  );

  leaf(
    cluster,
    'revisions <id>',
    "list a cluster's revisions: its configs and values after each change, and which are stable",
    ['herald cluster revisions 7c0d...'],
  ).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<ListEnvelope<ClusterRevisionView>>(`/v1/clusters/${seg(id)}/revisions`);
      if (o.json) return printJson(o, body);
      out(
        o,
        table(
          ['REVISION', 'CURRENT', 'STABLE', 'INSTALL', 'UNINSTALL', 'GROUPS OWN', 'MADE', 'BY', 'UNDO OF'],
          body.items.map((r) => [
            r.revision,
            r.current ? '*' : '',
            r.stable ? 'yes' : 'no',
            r.install_config_id,
            r.uninstall_config_id,
            r.nodegroups
              .filter((g) => g.install_config_id || g.uninstall_config_id || g.input_values)
              .map((g) => g.name)
              .join(',') || '-',
            r.created_at,
            r.created_by ?? '-',
            r.source_revision ?? '',
          ]),
        ),
      );
    });
  });
}

// ---- controllers --------------------------------------------------------------------------------

function registerControllers(program: Command): void {
  const c = withConnectionOptions(
    program
      .command('controllers')
      .description(
        'list the controllers of the database (docs/several-controllers.md): live, nodes owned and held, heartbeat age, API URL',
      ),
  );
  c.addHelpText('after', CONTROLLERS_HELP).action(async (_o, cmd: Command) => {
    await printGet<ListEnvelope<ControllerView>>(cmd, '/v1/controllers', (body) =>
      controllersTable(body.items, Date.now()),
    );
  });
}

/** `team=web,tier=front`, keys in order. */
function labelsText(labels: Record<string, string> | undefined): string {
  return Object.keys(labels ?? {})
    .sort()
    .map((k) => `${k}=${labels![k]!}`)
    .join(',');
}

/** Registers `herald node`, `config`, `deploy` and `cluster`. */
// ---- enroll -------------------------------------------------------------------------------------

function registerEnroll(program: Command): void {
  const enroll = withConnectionOptions(
    program.command('enroll').description('join tokens for enrolling nodes (docs/adding-nodes.md): make, list, revoke'),
  );
  leaf(enroll, 'token', 'make a single-use join token for one node; it is printed this once', [
    'herald enroll token --node n1 --ip 10.0.0.5 --dns n1.example --ttl 1h',
  ])
    .requiredOption('--node <id>', 'the node the token enrols')
    .option('--ip <addr>', 'an IP SAN its certificate carries (repeatable)', collect)
    .option('--dns <name>', 'a DNS SAN its certificate carries (repeatable)', collect)
    .option('--ttl <duration>', 'how long the token can be used, e.g. 10m, 1h (default 1h)')
    .action(async (opts: { node: string; ip?: string[]; dns?: string[]; ttl?: string }, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const req: Obj = {
          node: opts.node,
          ips: (opts.ip ?? []).flatMap((s) => splitList(s)),
          dns: (opts.dns ?? []).flatMap((s) => splitList(s)),
        };
        if (opts.ttl !== undefined) req.ttl_s = Math.max(1, Math.round(parseDuration(opts.ttl, '--ttl') / 1000));
        const body = await client.post<Obj & { token: string }>('/v1/enrollment-tokens', req);
        if (o.json) return printJson(o, body);
        out(o, `${body.token}\n`);
        process.stderr.write(
          `join token ${String(body.id)} for node ${String(body.node)}, single use, until ${String(body.expires_at)}\n`,
        );
      });
    });
  leaf(enroll, 'list', 'list join tokens (never their secrets)', ['herald enroll list']).action(
    async (_o, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const body = await client.get<ListEnvelope<Obj>>('/v1/enrollment-tokens');
        if (o.json) return printJson(o, body);
        const rows = body.items.map((t) => [t.id, t.node, t.state, t.expires_at, t.used_at, t.created_by]);
        out(o, table(['ID', 'NODE', 'STATE', 'EXPIRES', 'USED', 'MADE BY'], rows));
      });
    },
  );
  leaf(enroll, 'revoke <id>', 'revoke a join token', ['herald enroll revoke 3f2a9c0d1e4b5a6f']).action(
    async (id: string, _o, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const body = await client.delete(`/v1/enrollment-tokens/${seg(id)}`);
        if (o.json) return printJson(o, body);
        out(o, `join token ${id} revoked\n`);
      });
    },
  );
}

export function registerOperatorCommands(program: Command): void {
  registerAccess(program, { withConnectionOptions, withClient, leaf, out, printJson });
  registerEnroll(program);
  registerNode(program);
  registerConfig(program);
  registerDeploy(program);
  registerCluster(program);
  registerControllers(program);
}
