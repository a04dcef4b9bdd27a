/**
 * Operators come from the openstack CLI (`list`) and from Unix (`ls`): every command that lists
 * things answers to both names, in every command group.
 */
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerCertsCommands } from '../../certs/cli.js';
import { registerOperatorCommands } from '../../cli/operator/commands.js';

function* walk(c: Command, trail: string[] = []): Generator<[string, Command]> {
  for (const sub of c.commands) {
    const at = [...trail, sub.name()];
    yield [at.join(' '), sub];
    yield* walk(sub, at);
  }
}

describe('list and ls', () => {
  it('every lister answers to both list and ls', () => {
    const program = new Command('herald');
    registerCertsCommands(program);
    registerOperatorCommands(program);
    const listers = [...walk(program)].filter(([, c]) => ['ls', 'list'].includes(c.name()));
    expect(listers.map(([at]) => at)).toEqual(
      expect.arrayContaining(['certs list', 'node ls', 'config ls', 'deploy ls', 'cluster ls', 'enroll list']),
    );
    for (const [at, c] of listers) expect([c.name(), ...c.aliases()].sort(), at).toEqual(['list', 'ls']);
  });
});
