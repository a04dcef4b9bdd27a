/**
 * `herald certs ...`: the PKI commands (docs/configuration.md). node-forge loads only inside an action
 * (dynamic import of ./pki.js), so `herald --help` and the other commands stay fast. Errors are
 * HeraldErrors, printed by cli/main.ts as one line; private keys are never printed.
 */
import type { Command } from 'commander';
import { HeraldError } from '../protocol/errors.js';

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

function parseDays(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < 1)
    throw new HeraldError('bad_option', `--days must be a positive whole number, not ${JSON.stringify(value)}`);
  return n;
}

function out(line = ''): void {
  process.stdout.write(`${line}\n`);
}

/** Adds `certs init|issue|revoke|list|bundle|rotate-signing-key` to `program`. */
export function registerCertsCommands(program: Command): void {
  const certs = program
    .command('certs')
    .description('make and manage the cluster PKI: CA, certificates, revocation, signing key')
    .addHelpText(
      'after',
      `
Layout of a PKI directory:
  ca.crt ca.key            cluster CA (ca.key stays on the CA host)
  wake-signing.jwk         the first controller's (controller) Ed25519 signing key
  wake-signing.jwks        public JWKS agents trust; each key names its controller
  controller/<name>.jwk    the signing key of every other controller
  revoked.json             revoked serials and signing key ids
  <role>/<name>.crt/.key   role: controller | agent | operator
  issuer/<name>.crt/.key   an issuing CA under the cluster CA (signs agent certificates)`,
    );

  certs
    .command('init')
    .description(
      'create a CA, a signing key, the controller certificate "controller" and the operator certificate "admin"',
    )
    .requiredOption('--dir <pki>', 'PKI directory to create (made 0700)')
    .option('--trust-domain <domain>', 'SPIFFE trust domain', 'herald.local')
    .option(
      '--controller-dns <name>',
      'extra DNS SAN for the controller certificate (repeatable; localhost is always included)',
      collect,
      [],
    )
    .option(
      '--controller-ip <ip>',
      'extra IP SAN for the controller certificate (repeatable; 127.0.0.1 is always included)',
      collect,
      [],
    )
    .option('--force', 'replace an existing CA and everything init writes', false)
    .addHelpText('after', '\nRefuses (pki_exists) and changes nothing when <pki>/ca.key exists, unless --force.')
    .action(
      async (o: {
        dir: string;
        trustDomain: string;
        controllerDns: string[];
        controllerIp: string[];
        force: boolean;
      }) => {
        const { initPki } = await import('./pki.js');
        const r = await initPki({
          dir: o.dir,
          trustDomain: o.trustDomain,
          controllerDns: o.controllerDns,
          controllerIp: o.controllerIp,
          force: o.force,
        });
        out(`PKI created in ${r.dir} (trust domain ${r.trustDomain})`);
        out(`  CA              ${o.dir}/ca.crt`);
        out(`  signing key     ${o.dir}/wake-signing.jwk (kid ${r.kid})`);
        out(`  controller      ${r.controller.certPath}  ${r.controller.spiffeId}  serial ${r.controller.serial}`);
        out(`  operator        ${r.operator.certPath}  ${r.operator.spiffeId}  serial ${r.operator.serial}`);
      },
    );

  certs
    .command('issue')
    .description('issue (or renew) the certificate of <role>/<name>, or an issuing CA (issuer <name>)')
    .argument('<role>', 'controller | agent | operator | issuer')
    .argument('<name>', 'node id or name, ^[a-z0-9][a-z0-9._-]{0,62}$')
    .requiredOption('--dir <pki>', 'PKI directory (holds ca.key)')
    .option('--dns <name>', 'DNS SAN (repeatable); locates the party, never authorizes it', collect, [])
    .option('--ip <ip>', 'IP SAN (repeatable)', collect, [])
    .option('--days <n>', 'lifetime in days (default 90)', parseDays)
    .addHelpText(
      'after',
      '\nExample: herald certs issue agent n1 --dir ./pki --ip 10.0.0.5 --dns n1.example\n' +
        'A controller other than "controller" also gets its own signing key, <pki>/controller/<name>.jwk (0600),\n' +
        'added to wake-signing.jwks; issuing it again keeps that key (a new one only if it is missing or revoked).\n' +
        'An issuer (herald certs issue issuer <name> --dir ./pki [--days 365]) is a CA under the cluster CA\n' +
        'that signs agent certificates only, written to <pki>/issuer/<name>.crt/.key.',
    )
    .action(async (role: string, name: string, o: { dir: string; dns: string[]; ip: string[]; days?: number }) => {
      const { issueCert } = await import('./pki.js');
      const r = await issueCert({
        dir: o.dir,
        role,
        name,
        dns: o.dns,
        ip: o.ip,
        ...(o.days !== undefined ? { days: o.days } : {}),
      });
      out(`issued ${r.spiffeId}`);
      out(`  certificate  ${r.certPath}`);
      out(`  key          ${r.keyPath} (0600)`);
      out(`  serial       ${r.serial}`);
      out(`  expires      ${r.notAfter.toISOString()}`);
      if (r.signingKey) {
        const k = r.signingKey;
        const how = k.made ? (k.replacedKid ? `new, replaces ${k.replacedKid} in the JWKS` : 'new') : 'kept';
        out(`  signing key  ${k.path} (0600, kid ${k.kid}, ${how})`);
        if (k.made) out('  copy wake-signing.jwks to every agent before this controller signs with the new key');
      }
    });

  certs
    .command('revoke')
    .description(
      'revoke a certificate (by name, role/name or hex serial) or a signing key (--kid); a controller loses its signing keys with it',
    )
    .argument('[target]', 'certificate name, role/name, or serial in hex')
    .requiredOption('--dir <pki>', 'PKI directory')
    .option('--kid <kid>', 'revoke this signing key id instead of a certificate')
    .addHelpText(
      'after',
      '\nAppends to <pki>/revoked.json; controllers and agents pick it up without a restart.\nCopy revoked.json to every host that has a bundle.',
    )
    .action(async (target: string | undefined, o: { dir: string; kid?: string }) => {
      const { revoke } = await import('./pki.js');
      if (target !== undefined && o.kid !== undefined)
        throw new HeraldError('bad_option', 'give a certificate or --kid, not both');
      if (target === undefined && o.kid === undefined)
        throw new HeraldError('bad_option', 'missing <target> (name, role/name or serial) or --kid <kid>');
      const r = await revoke({ dir: o.dir, ...(o.kid !== undefined ? { kid: o.kid } : { target: target! }) });
      if (r.revokedBefore !== undefined) {
        out(`revoked ${target}: every certificate of it issued before ${r.revokedBefore}, whatever issued it`);
        if (r.serial !== undefined) out(`  and serial ${r.serial} (${r.certificate})`);
        out('  copy revoked.json to every controller; on a controller, herald node revoke does the same at once');
        return;
      }
      const what =
        r.kid !== undefined
          ? `signing key ${r.kid}`
          : `serial ${r.serial}${r.certificate ? ` (${r.certificate})` : ''}`;
      out(r.already ? `${what} was already revoked` : `revoked ${what}`);
      if (r.kids?.length) out(`  and its signing key${r.kids.length > 1 ? 's' : ''} ${r.kids.join(', ')}`);
    });

  certs
    .command('list')
    .alias('ls')
    .description('list the certificates in the PKI: role, name, serial, expiry, revoked')
    .requiredOption('--dir <pki>', 'PKI directory')
    .option('--json', 'print JSON instead of a table', false)
    .action(async (o: { dir: string; json: boolean }) => {
      const { listCerts } = await import('./pki.js');
      const rows = await listCerts(o.dir);
      if (o.json) {
        out(
          JSON.stringify(
            rows.map((r) => ({ ...r, notAfter: r.notAfter.toISOString() })),
            null,
            2,
          ),
        );
        return;
      }
      const table = [
        ['ROLE', 'NAME', 'SERIAL', 'EXPIRES', 'REVOKED'],
        ...rows.map((r) => [r.role, r.name, r.serial, r.notAfter.toISOString(), r.revoked ? 'yes' : 'no']),
      ];
      const widths = table[0]!.map((_, i) => Math.max(...table.map((row) => row[i]!.length)));
      for (const row of table) out(row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i]!))).join('  '));
    });

  certs
    .command('bundle')
    .description('copy out exactly what <role>/<name> needs, in the PKI layout (never ca.key)')
    .argument('<role>', 'controller | agent | operator | issuer (for a controller host with --issuer)')
    .argument('<name>', 'the certificate name')
    .requiredOption('--dir <pki>', 'PKI directory')
    .requiredOption('--out <dir>', 'directory to write the bundle to (made 0700)')
    .addHelpText(
      'after',
      '\nWrites ca.crt, wake-signing.jwks, revoked.json, <role>/<name>.crt/.key, and for a controller its own signing key:\nwake-signing.jwk for "controller", controller/<name>.jwk for any other (never another controller\'s).',
    )
    .action(async (role: string, name: string, o: { dir: string; out: string }) => {
      const { bundle } = await import('./pki.js');
      const files = await bundle({ dir: o.dir, role, name, out: o.out });
      out(`bundle for ${role}/${name} in ${o.out}:`);
      for (const f of files) out(`  ${f}`);
    });

  certs
    .command('rotate-signing-key')
    .description('make a new wake-up signing key; the JWKS keeps the previous public key until you revoke its kid')
    .requiredOption('--dir <pki>', 'PKI directory')
    .option('--controller <name>', 'the controller whose key to rotate', 'controller')
    .addHelpText(
      'after',
      '\nRotation: 1) rotate-signing-key, 2) copy wake-signing.jwks to every agent (and the key file, wake-signing.jwk or controller/<name>.jwk, to that controller),\n3) once all agents have it: herald certs revoke --kid <old kid> --dir <pki>, and copy revoked.json out.',
    )
    .action(async (o: { dir: string; controller: string }) => {
      const { rotateSigningKey } = await import('./pki.js');
      const r = await rotateSigningKey({ dir: o.dir, controller: o.controller });
      out(`new signing key ${r.kid} of controller ${r.controller}`);
      if (r.previousKids.length)
        out(`still trusted: ${r.previousKids.join(', ')} (revoke with --kid once agents have the new JWKS)`);
    });
}
