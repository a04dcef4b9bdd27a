/**
 * Who may do what, from the operator's side (docs/access.md): `herald access grant|revoke|ls`
 * (an admin of the whole fleet), `herald whoami` and `herald can-i <verb> [target]` (anyone, to
 * ask before trying), and the `key=value` / `key-` label arguments of `herald node`. The
 * commands are registered with the operator CLI's own helpers (commands.ts), so they take the
 * same connection options and print the same way.
 */
import type { Command } from 'commander';
import { VERBS, type CanIView, type GrantView, type WhoamiView } from '../../protocol/access.js';
import { HeraldError } from '../../protocol/errors.js';
import type { ListEnvelope } from '../../protocol/rest.js';
import type { ApiClient } from './client.js';
import { collect, table } from './format.js';

interface PrintOptions {
  json?: boolean;
  raw?: boolean;
}

/** The operator CLI's helpers (cli/operator/commands.ts), handed over so these commands read and print as the others do. */
export interface CommandKit {
  withConnectionOptions(cmd: Command): Command;
  withClient<T>(cmd: Command, fn: (client: ApiClient, o: PrintOptions) => Promise<T>): Promise<T>;
  leaf(parent: Command, nameAndArgs: string, description: string, examples: string[]): Command;
  out(o: PrintOptions, s: string): void;
  printJson(o: PrintOptions, v: unknown): void;
}

/** Exit status of `herald can-i` when the answer is no. */
export const EXIT_NO = 1;

/**
 * `key=value` arguments as a labels object; with `patch`, `key-` removes the label (null).
 * The controller checks the keys and values themselves.
 * @throws HeraldError `bad_option`
 */
export function parseLabelArgs(args: readonly string[], patch: boolean): Record<string, string | null> {
  const out: Record<string, string | null> = {};
  for (const a of args) {
    const eq = a.indexOf('=');
    if (eq > 0) out[a.slice(0, eq)] = a.slice(eq + 1);
    else if (patch && a.length > 1 && a.endsWith('-')) out[a.slice(0, -1)] = null;
    else
      throw new HeraldError(
        'bad_option',
        `${JSON.stringify(a)}: a label is key=value${patch ? ', or key- to remove it' : ''}`,
      );
  }
  return out;
}

/** One grant in a line: `operator/alice is deployer on cluster:shop, node:web-*`. */
export function grantLine(g: GrantView): string {
  return `operator/${g.subject} is ${g.role} on ${g.scope.join(', ')}`;
}

/** `herald whoami` for people. */
export function whoamiText(w: WhoamiView): string {
  const lines = [`operator/${w.operator} (${w.identity})`];
  if (w.grants.length === 0) lines.push('no grant: every route but whoami and can-i is refused (403 forbidden)');
  else {
    lines.push('');
    lines.push(
      table(
        ['GRANT', 'ROLE', 'SCOPE', 'SOURCE'],
        w.grants.map((g) => [g.id, g.role, g.scope.join(', '), g.source]),
      ).trimEnd(),
    );
  }
  lines.push('');
  for (const v of VERBS) lines.push(`${`${v}:`.padEnd(8)}${w.verbs[v].length ? w.verbs[v].join(', ') : '-'}`);
  return `${lines.join('\n')}\n`;
}

/** `herald can-i` for people: yes or no, and the rule. */
export function canIText(a: CanIView): string {
  return `${a.allowed ? 'yes' : `no (${a.code})`}\n${a.rule}\n`;
}

export function registerAccess(program: Command, kit: CommandKit): void {
  const { leaf, out, printJson, withClient, withConnectionOptions } = kit;
  const access = withConnectionOptions(
    program
      .command('access')
      .description('who may do what: grants of roles (viewer, deployer, author, admin) over scopes (docs/access.md)'),
  );
  leaf(access, 'grant <operator> <role>', 'grant operator/<operator> a role over a scope (default the whole fleet)', [
    'herald access grant oncall viewer',
    'herald access grant alice deployer --scope cluster:shop --scope label:team=web',
    'herald access grant bob admin --scope node:web-*',
  ])
    .option(
      '--scope <selector>',
      'what the grant applies to (repeatable): *, node:<pattern>, label:<k>=<v>[,<k>=<v>], cluster:<pattern>, nodegroup:<cluster>/<group>',
      collect,
    )
    .action(async (subject: string, role: string, opts: { scope?: string[] }, cmd: Command) => {
      await withClient(cmd, async (client, o) => {
        const body = await client.post<GrantView>('/v1/access/grants', {
          subject,
          role,
          ...(opts.scope ? { scope: opts.scope } : {}),
        });
        if (o.json) return printJson(o, body);
        out(o, `grant ${body.id}: ${grantLine(body)}\n`);
      });
    });
  leaf(access, 'revoke <grant>', 'revoke a grant (by its id, as herald access ls shows it)', [
    'herald access revoke 0192...',
  ]).action(async (id: string, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.delete<GrantView>(`/v1/access/grants/${encodeURIComponent(id)}`);
      if (o.json) return printJson(o, body);
      out(o, `grant ${body.id} revoked: ${grantLine(body)} no more\n`);
    });
  });
  leaf(access, 'ls', 'list every grant (the controller options --bootstrap-admin ones first)', [
    'herald access ls',
  ]).action(async (_o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<ListEnvelope<GrantView>>('/v1/access/grants');
      if (o.json) return printJson(o, body);
      const rows = body.items.map((g) => [g.id, g.subject, g.role, g.scope.join(', '), g.source, g.created_by]);
      out(o, table(['ID', 'OPERATOR', 'ROLE', 'SCOPE', 'SOURCE', 'MADE BY'], rows));
    });
  });

  withConnectionOptions(
    program.command('whoami').description('who the controller takes you for: your operator identity and grants'),
  ).action(async (_o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const body = await client.get<WhoamiView>('/v1/access/whoami');
      if (o.json) return printJson(o, body);
      out(o, whoamiText(body));
    });
  });

  withConnectionOptions(
    program
      .command('can-i')
      .description(
        'ask the controller whether you may: exit 0 and "yes", or exit 1, "no" and the rule that refuses (docs/access.md)',
      )
      .argument('<verb>', VERBS.join(' | '))
      .argument(
        '[target]',
        'node:<id>, deployment:<id>, cluster:<id or name>, nodegroup:<cluster>/<group>, token:<id>, * (the whole fleet); none: the verb alone',
      )
      .addHelpText(
        'after',
        '\nExamples:\n  $ herald can-i deploy node:web-1\n  $ herald can-i deploy cluster:shop --as alice\n  $ herald can-i admin *\n',
      ),
  ).action(async (verb: string, target: string | undefined, _o, cmd: Command) => {
    await withClient(cmd, async (client, o) => {
      const q = new URLSearchParams({ verb, target: target ?? '' });
      const body = await client.get<CanIView>(`/v1/access/can-i?${q.toString()}`);
      if (o.json) printJson(o, body);
      else out(o, canIText(body));
      if (!body.allowed) process.exitCode = EXIT_NO;
    });
  });
}
