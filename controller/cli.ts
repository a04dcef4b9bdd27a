/**
 * `herald controller`: the command line of the controller process. Heavy modules (SQLite, ws,
 * pino) load inside the action, so `herald --help` stays instant.
 */
import type { Command } from 'commander';
import { DEFAULT_CONTROLLER_PORT } from '../protocol/limits.js';

/** The SIGTERM/SIGINT grace before a second signal (or this timeout) forces the exit. */
export const FORCED_EXIT_AFTER_MS = 30_000;

export function registerControllerCommand(program: Command): void {
  program
    .command('controller')
    .description('run the controller: HTTPS API, signed metadata, push wake-ups, cluster operations')
    .option('--listen <host:port>', `API address (default 127.0.0.1:${DEFAULT_CONTROLLER_PORT})`)
    .option(
      '--pki <dir>',
      'PKI directory (uses controller/<name>.crt and .key, ca.crt, revoked.json, wake-signing.jwk[s])',
    )
    .option(
      '--db <file|url>',
      'SQLite database file (created if missing; also sqlite:<path>), or postgres://user[:pass]@host:port/db shared by several controllers (docs/several-controllers.md)',
    )
    .option('--name <name>', 'the controller certificate name (default controller)')
    .option('--trust-domain <domain>', 'SPIFFE trust domain (default: from the PKI)')
    .option('--health-listen <host:port>', 'also serve a plain-HTTP GET /healthz for probes (off by default)')
    .option('--no-auto-register', 'refuse announcements of nodes an operator has not added')
    .option('--public-url <url>', 'https://host:port agents reach this API at (default from --listen)')
    .option(
      '--push-workers <n>',
      'push dialer worker processes, 0 to 64; 0 dials from the API process (default: the cores less one, 1 to 4)',
    )
    .option(
      '--connect-listen <host:port>',
      'also take push connections agents dial in (wss://host:port/v1/connect, for agents behind NAT: docs/protocol.md); off by default',
    )
    .option(
      '--connect-drain-ms <ms>',
      'on SIGTERM, close the dialled-in connections (1012) spread over this many ms, 0 to 20000 (default 10000)',
    )
    .option('--log-level <level>', 'fatal|error|warn|info|debug|trace|silent (default info)')
    .option('--config <file>', 'JSON file of options (keys: the long option names); command line and environment win')
    .option('--ca <file>', 'override <pki>/ca.crt')
    .option('--cert <file>', 'override <pki>/controller/<name>.crt')
    .option('--key <file>', 'override <pki>/controller/<name>.key')
    .option(
      '--signing-key <file>',
      'signing key (default <pki>/controller/<name>.jwk when it exists, else <pki>/wake-signing.jwk)',
    )
    .option(
      '--issuer <name>',
      'the issuing CA <pki>/issuer/<name>.crt/.key that signs agent certificates (docs/adding-nodes.md)',
    )
    .option(
      '--agent-cert-lifetime <duration>',
      'lifetime of the agent certificates enrolment and renewal issue, e.g. 7d, 12h, 90s (default 7d)',
    )
    .option(
      '--audit-checkpoint-interval <duration>',
      "how often this controller signs the audit trail's head, e.g. 60s, 5m (default 60s; docs/access.md)",
    )
    .option(
      '--object-store-listen <host:port>',
      "also serve Heat's object store there (the Swift subset Heat and os-collect-config speak; docs/heat.md); off by default",
    )
    .option(
      '--heat-project <id,...>',
      "the projects (accounts) whose Heat may make deployments on Herald's nodes; other accounts are a plain object store (required with --object-store-listen)",
    )
    .option(
      '--object-store-tokens <file>',
      'who may call the object store with a token, for standalone Heat: lines of "<sha256 of the token> [project|*] [name]"',
    )
    .option(
      '--keystone-credentials <file>',
      "who may call it in a cloud: Keystone validates the tokens, with the service credentials of this file's [keystone_authtoken]",
    )
    .option(
      '--keystone-ca <file>',
      "CA bundle for Keystone's certificate (default the file's cafile, else the system's)",
    )
    .option('--keystone-roles <a,b>', "roles a token must hold on the account's project (default admin,swiftoperator)")
    .option(
      '--bootstrap-admin <names>',
      'operators (the <name> of operator/<name>) who hold admin over the whole fleet whatever the grants say, comma-separated, or none (default admin: the certificate herald certs init makes; docs/access.md)',
    )
    .addHelpText(
      'after',
      `
Every option can also come from the environment as HERALD_CONTROLLER_<OPTION> (e.g.
HERALD_CONTROLLER_DB, HERALD_CONTROLLER_AUTO_REGISTER=false) or from --config; the command
line wins over the environment, which wins over the file. Logs are JSON lines on stderr.
SIGTERM or SIGINT: stop accepting, finish requests in flight, close the dialled-in connections
spread over --connect-drain-ms (1012: their agents move to another controller), close the other
agent connections, exit 0.`,
    )
    .action(async (flags: Record<string, unknown>, cmd: Command) => {
      const { resolveOptions } = await import('./options.js');
      const { startController } = await import('./main.js');
      const raw: Record<string, unknown> = {};
      const map: Record<string, string> = {
        listen: 'listen',
        pki: 'pki',
        db: 'db',
        name: 'name',
        trustDomain: 'trust-domain',
        healthListen: 'health-listen',
        publicUrl: 'public-url',
        pushWorkers: 'push-workers',
        connectListen: 'connect-listen',
        connectDrainMs: 'connect-drain-ms',
        logLevel: 'log-level',
        config: 'config',
        ca: 'ca',
        cert: 'cert',
        key: 'key',
        signingKey: 'signing-key',
        issuer: 'issuer',
        agentCertLifetime: 'agent-cert-lifetime',
        auditCheckpointInterval: 'audit-checkpoint-interval',
        objectStoreListen: 'object-store-listen',
        objectStoreTokens: 'object-store-tokens',
        heatProject: 'heat-project',
        keystoneCredentials: 'keystone-credentials',
        keystoneCa: 'keystone-ca',
        keystoneRoles: 'keystone-roles',
        bootstrapAdmin: 'bootstrap-admin',
      };
      for (const [k, opt] of Object.entries(map)) if (flags[k] !== undefined) raw[opt] = flags[k];
      // commander sets autoRegister=true by default for --no-auto-register: only the flag counts
      if (cmd.getOptionValueSource('autoRegister') === 'cli') raw['auto-register'] = flags.autoRegister;
      const options = resolveOptions(raw);
      const ctl = await startController(options);
      await new Promise<void>((resolve) => {
        let stopping = false;
        const stop = (signal: NodeJS.Signals): void => {
          if (stopping) {
            ctl.logger.warn({ signal }, 'second signal: exiting at once');
            process.exit(1);
          }
          stopping = true;
          ctl.logger.info({ signal }, 'signal received');
          const force = setTimeout(() => {
            ctl.logger.error({ afterMs: FORCED_EXIT_AFTER_MS }, 'shutdown took too long; exiting');
            process.exit(1);
          }, FORCED_EXIT_AFTER_MS);
          force.unref();
          ctl.close().then(resolve, (err: unknown) => {
            ctl.logger.error({ err }, 'shutdown failed');
            process.exitCode = 1;
            resolve();
          });
        };
        process.once('SIGTERM', stop);
        process.once('SIGINT', stop);
      });
    });
}
