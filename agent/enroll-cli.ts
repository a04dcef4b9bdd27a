/**
 * `herald agent enroll` (docs/adding-nodes.md): a subcommand of `herald agent`, registered beside it (also in
 * the packaged agent). `herald agent`'s own required options do not apply to it.
 */
import { type Command, CommanderError } from 'commander';
import { ConfigError, HeraldError } from '../protocol/errors.js';
import { isValidName } from '../protocol/identity.js';

interface EnrollCliOptions {
  controller?: string;
  caSha256: string;
  token?: string;
  tokenFile?: string;
  node?: string;
  pki?: string;
  controllerId?: string;
  force?: boolean;
}

/**
 * The exit code of `herald agent enroll` when it gave up on a failure that may pass (a connection
 * error, a 429 or a 503 after its own tries): EX_TEMPFAIL of sysexits.h. A script may run it again
 * later; any other failure (exit 1) is a definite refusal, and running it again changes nothing.
 */
export const ENROLL_TRY_AGAIN_EXIT_CODE = 75;

/** Adds `enroll` under the `agent` command of `program` (registerAgentCommand first). */
export function registerAgentEnrollCommand(program: Command): void {
  const agent = program.commands.find((c) => c.name() === 'agent');
  if (!agent) throw new Error('registerAgentCommand must run first');
  // `herald agent --node .. --listen ..` requires its options; `agent enroll` has its own
  agent.hook('preSubcommand', (parent, sub) => {
    if (sub.name() === 'enroll') for (const o of parent.options) o.mandatory = false;
  });
  agent
    .command('enroll')
    .description('enrol this node with a join token: make its key here, get its certificate, write the PKI layout')
    .requiredOption(
      '--ca-sha256 <fingerprint>',
      'SHA-256 of the cluster ca.crt (openssl x509 -noout -fingerprint -sha256)',
    )
    .option('--token <token>', 'the join token (herald enroll token); visible in the process list: prefer --token-file')
    .option('--token-file <file>', 'read the join token from this file')
    .option('--force', 'replace an existing agent/<node> key and certificate')
    .addHelpText(
      'after',
      `
Also takes --controller <url>, --node <id>, --pki <dir> and --controller-id <name> as herald agent does,
and goes through the HTTP CONNECT proxy of HTTPS_PROXY (NO_PROXY: hosts reached directly) as it does.

Exit codes: 0 enrolled; ${ENROLL_TRY_AGAIN_EXIT_CODE} a failure that may pass (connection error, 429, 503 after its own
tries): run it again later; 1 a definite refusal (spent or wrong token, CA fingerprint, options).
The key is made on the first run and kept in <pki>/agent/<node>.key.enrolling (0600) until its
certificate is installed: a later run asks with the same key, so an answer lost on the way is
given again (within 5 minutes) instead of refused.

Example:
  herald agent enroll --controller https://ctl.example:8443 --ca-sha256 AB:CD:... \\
    --token-file /run/herald/token --node n1 --pki /etc/herald/pki`,
    )
    .action(async (_flags: unknown, cmd: Command) => {
      const o = cmd.optsWithGlobals<EnrollCliOptions>();
      if (o.node === undefined || !isValidName(o.node))
        throw new ConfigError('--node <id> is required and must match ^[a-z0-9][a-z0-9._-]{0,62}$', { field: 'node' });
      if (o.controller === undefined || o.controller.includes(','))
        throw new ConfigError('--controller <url> is required: one https://host:port', { field: 'controller' });
      if (o.pki === undefined)
        throw new ConfigError('--pki <dir> is required: where the PKI layout is written', { field: 'pki' });
      let token = o.token;
      if (o.tokenFile !== undefined) {
        const fs = await import('node:fs');
        try {
          token = fs.readFileSync(o.tokenFile, 'utf8').trim();
        } catch (err) {
          throw new ConfigError(`--token-file ${o.tokenFile}: ${(err as Error).message}`, { field: 'token-file' });
        }
      }
      if (!token) throw new ConfigError('--token <token> or --token-file <file> is required', { field: 'token' });
      // the environment is read here, at the edge, as `herald agent` reads it
      const { parseDialProxy, proxyEnvOf } = await import('./dial-proxy.js');
      const proxy = parseDialProxy(proxyEnvOf(process.env));
      const { enroll, mayPass } = await import('./enroll.js');
      const r = await enroll({
        proxy,
        controller: o.controller.replace(/\/$/, ''),
        caSha256: o.caSha256,
        token,
        node: o.node,
        pki: o.pki,
        controllerId: o.controllerId?.split(',')[0] ?? 'controller',
        force: o.force === true,
        // one line per try tried again; the last failure is the command's error (cli/run-cli.ts)
        onRetry: (n) =>
          process.stderr.write(
            `herald: enrolment try ${n.attempt} failed (${n.code}); trying again in ${(n.waitMs / 1000).toFixed(1)} s (${Math.round(n.leftMs / 1000)} s of retries left)\n`,
          ),
      }).catch((err: unknown) => {
        if (!mayPass(err) || !(err instanceof HeraldError)) throw err;
        // the one line cli/run-cli.ts would print, control characters shown, then EX_TEMPFAIL
        const line = err.message
          .split('\n')[0]!
          // biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters are what it makes visible
          .replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);
        process.stderr.write(`herald: ${err.code}: ${line} (may pass: try again later)\n`);
        throw new CommanderError(ENROLL_TRY_AGAIN_EXIT_CODE, 'herald.enroll.tryAgain', '');
      });
      process.stdout.write(
        `enrolled ${r.spiffeId}: ${r.certPath} (serial ${r.serial}, valid until ${r.notAfter}), key ${r.keyPath}\n`,
      );
    });
}
