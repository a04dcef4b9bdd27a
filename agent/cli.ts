/**
 * `herald agent ...` (docs/architecture.md). Options are checked here, each error naming its option; the
 * agent's modules load only inside the action, so `herald --help` stays light.
 */
import type { Command } from 'commander';
import { ConfigError } from '../protocol/errors.js';
import { isValidName, parseControllerIds } from '../protocol/identity.js';
import { DEFAULT_AGENT_PORT } from '../protocol/limits.js';
import { parseControllerUrls } from './controller-endpoints.js';
import { parseDialProxy, proxyEnvOf } from './dial-proxy.js';
import { parseDialOutUrls } from './dialer.js';

const UNITS_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/**
 * A duration like `2s`, `500ms`, `2m`, `1h` (a bare number is seconds), in ms.
 * @throws ConfigError naming `option`
 */
export function parseDuration(value: string, option: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(value.trim());
  const ms = m ? Math.round(Number(m[1]) * UNITS_MS[m[2] ?? 's']!) : NaN;
  if (!Number.isFinite(ms) || ms < 1 || ms > 7 * 86_400_000) {
    throw new ConfigError(
      `${option} ${JSON.stringify(value)} is not a duration like 120s, 500ms or 2m (up to 7 days)`,
      { field: option.replace(/^--/, '') },
    );
  }
  return ms;
}

/**
 * `host:port` or `[v6]:port`; with `defaultPort`, a bare host too.
 * @throws ConfigError naming `option`
 */
export function parseHostPort(value: string, option: string, defaultPort?: number): { host: string; port: number } {
  const bad = (): never => {
    throw new ConfigError(`${option} ${JSON.stringify(value)} is not host:port`, { field: option.replace(/^--/, '') });
  };
  let host: string;
  let portText: string | undefined;
  const v6 = /^\[([0-9a-fA-F:.]+)\](?::(\d+))?$/.exec(value);
  if (v6) {
    host = v6[1]!;
    portText = v6[2];
  } else {
    const i = value.lastIndexOf(':');
    if (i < 0) {
      host = value;
    } else {
      host = value.slice(0, i);
      portText = value.slice(i + 1);
    }
    if (host.includes(':') || !/^[A-Za-z0-9.-]*$/.test(host)) bad();
  }
  if (portText === undefined) {
    if (defaultPort === undefined) bad();
    portText = String(defaultPort);
  }
  if (!/^\d{1,5}$/.test(portText!)) bad();
  const port = Number(portText);
  if (port > 65535) bad();
  return { host: host === '' ? '0.0.0.0' : host, port };
}

interface AgentCliOptions {
  node: string;
  controller: string;
  listen?: string;
  dialOut?: string;
  advertise?: string;
  pki?: string;
  stateDir: string;
  hooksDir?: string;
  controllerId: string;
  pollInterval: string;
  pollIntervalHealthy: string;
  trustDomain?: string;
  ca?: string;
  cert?: string;
  key?: string;
  hookLauncher: boolean;
}

/** Adds `herald agent` to `program`. */
export function registerAgentCommand(program: Command): void {
  program
    .command('agent')
    .description(
      'run a node agent: listen for signed wake-ups (or dial out for them), fetch signed metadata, apply deployments, signal results',
    )
    .requiredOption('--node <id>', "this node's id; the certificate must be agent/<id>")
    .requiredOption(
      '--controller <url,...>',
      'controller API, https://host:port; several separated by commas: the agent uses one and moves to the next when it fails',
    )
    .option(
      '--listen <host:port>',
      `wake-up listener address (a bare host listens on port ${DEFAULT_AGENT_PORT}; port 0 picks a free one); needed unless --dial-out is given`,
    )
    .option(
      '--dial-out <url,...>',
      'dial the controllers instead of (or besides) listening: their connect URLs, wss://host:port/v1/connect, separated by commas; the agent keeps one push connection, to one of them (docs/dial-out.md). Without --listen it listens on nothing and announces no endpoint. HTTPS_PROXY and NO_PROXY apply to these dials',
    )
    .option(
      '--advertise <host:port>',
      'address announced to the controller (default: --listen; needed when --listen is a wildcard)',
    )
    .option('--pki <dir>', 'PKI directory (or a bundle) in the Herald layout; uses agent/<node>.crt/.key')
    .requiredOption('--state-dir <dir>', 'durable state: started/finished items, outbox, run directories (made 0700)')
    .option('--hooks-dir <dir>', 'hooks for groups other than script and component (<dir>/<group>)')
    .option(
      '--controller-id <name,...|*>',
      'the controllers accepted (API server, wake-up peer, --dial-out server): controller/<name> for each name, or * for every controller of the trust domain',
      'controller',
    )
    .option('--poll-interval <duration>', 'fallback poll interval, e.g. 120s, 2m (jittered ±10 %)', '120s')
    .option(
      '--poll-interval-healthy <duration>',
      'poll interval while push is healthy; when push is lost it drops back to --poll-interval, and a poll already overdue comes at a random moment between a quarter and one --poll-interval later',
      '600s',
    )
    .option('--trust-domain <domain>', "SPIFFE trust domain (default: the PKI's, else herald.local)")
    .option('--ca <file>', 'override the CA certificate file')
    .option('--cert <file>', 'override the agent certificate file')
    .option('--key <file>', 'override the agent key file')
    .option(
      '--no-hook-launcher',
      'spawn every hook from the agent itself, not from the small process that starts them (perl, where there is one: a hook then costs the agent no fork of itself)',
    )
    .addHelpText(
      'after',
      `
Examples:
  herald agent --node n1 --controller https://ctl.example:8443 --listen 10.0.0.5:7443 \\
    --pki /etc/herald/pki --state-dir /var/lib/herald --hooks-dir /etc/herald/hooks

  # behind NAT: no inbound port; the agent dials the controller's connect listener
  herald agent --node n1 --controller https://ctl.example:8443 \\
    --dial-out wss://ctl.example:9443/v1/connect --pki /etc/herald/pki --state-dir /var/lib/herald

Environment:
  HTTPS_PROXY, https_proxy   http://[user:password@]host[:port]: reach the controllers (push and API) through this HTTP CONNECT proxy
  NO_PROXY, no_proxy         hosts dialled directly: names and their suffixes, or *; ports are ignored`,
    )
    .action(async (o: AgentCliOptions) => {
      if (!isValidName(o.node))
        throw new ConfigError(`--node ${JSON.stringify(o.node)} does not match ^[a-z0-9][a-z0-9._-]{0,62}$`, {
          field: 'node',
        });
      parseControllerIds(o.controllerId);
      try {
        parseControllerUrls(o.controller);
      } catch (err) {
        throw new ConfigError((err as Error).message, { field: 'controller' });
      }
      if (o.pki === undefined && (o.ca === undefined || o.cert === undefined || o.key === undefined)) {
        throw new ConfigError('--pki <dir> is required (or all of --ca, --cert and --key)', { field: 'pki' });
      }
      if (o.listen === undefined && o.dialOut === undefined)
        throw new ConfigError('give --listen <host:port>, --dial-out <url,...>, or both: the agent needs a push path', {
          field: 'listen',
        });
      const listen = o.listen !== undefined ? parseHostPort(o.listen, '--listen', DEFAULT_AGENT_PORT) : undefined;
      if (listen === undefined && o.advertise !== undefined)
        throw new ConfigError('--advertise names the address of the listener: it needs --listen', {
          field: 'advertise',
        });
      const advertise =
        o.advertise !== undefined && listen !== undefined
          ? parseHostPort(o.advertise, '--advertise', listen.port)
          : undefined;
      if (o.dialOut !== undefined) {
        try {
          parseDialOutUrls(o.dialOut);
        } catch (err) {
          throw new ConfigError((err as Error).message, { field: 'dial-out' });
        }
      }
      // the environment is read here, at the edge; the agent's parts are handed what it says
      const proxyEnv = proxyEnvOf(process.env);
      parseDialProxy(proxyEnv);
      const pollIntervalMs = parseDuration(o.pollInterval, '--poll-interval');
      const pollIntervalHealthyMs = parseDuration(o.pollIntervalHealthy, '--poll-interval-healthy');
      const { startAgent } = await import('./main.js');
      const agent = await startAgent({
        node: o.node,
        controller: o.controller
          .split(',')
          .map((u) => u.trim().replace(/\/$/, ''))
          .join(','),
        listen,
        advertise,
        dialOut: o.dialOut,
        proxyEnv,
        pki: o.pki ?? '.',
        stateDir: o.stateDir,
        hooksDir: o.hooksDir,
        controllerId: o.controllerId,
        pollIntervalMs,
        pollIntervalHealthyMs,
        trustDomain: o.trustDomain,
        ca: o.ca,
        cert: o.cert,
        key: o.key,
        hookLauncher: o.hookLauncher,
      });
      await new Promise<void>((resolve) => {
        let signals = 0;
        const onSignal = (sig: NodeJS.Signals): void => {
          if (++signals > 1) {
            agent.log.warn({ signal: sig }, 'second signal: exiting now');
            process.exit(130);
          }
          void agent.stop(sig).then(resolve, (err: unknown) => {
            agent.log.error({ err }, 'error while stopping');
            resolve();
          });
        };
        process.on('SIGTERM', onSignal);
        process.on('SIGINT', onSignal);
      });
      // a daemon that stopped: do not wait on a kept-alive socket or a stray timer
      agent.log.flush();
      process.exit(0);
    });
}
