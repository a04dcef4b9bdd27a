/**
 * The input-name refusal list (docs/architecture.md): every rule refuses, by family, both
 * through the shared check the controller and the agent call and through the real hook runner;
 * docs/hook-inputs.md shows exactly this list.
 */
import { readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HOOK_ERROR_STATUS_CODE, runItem } from '../../agent/hooks/run-item.js';
import { checkInputName, FORBIDDEN_INPUT_RULES, isForbiddenInputName } from '../../protocol/heat.js';
import { codeOf } from '../../protocol/errors.js';
import { item, tempDir } from './hooks-helpers.js';

/** The code checkInputName throws for `name`, or 'ok'. */
function verdict(name: string): string {
  try {
    checkInputName(name);
    return 'ok';
  } catch (err) {
    return codeOf(err) ?? 'threw';
  }
}

/** A name each rule must refuse: the name itself, or a member of the family. */
const sample = (r: (typeof FORBIDDEN_INPUT_RULES)[number]): string => (r.kind === 'name' ? r.match : `${r.match}X`);

describe('forbidden input names', () => {
  // the names the review found accepted
  it.each([
    'OPENSSL_CONF',
    'JDK_JAVA_OPTIONS',
    'CLASSPATH',
    'GIT_CONFIG_COUNT',
    'GIT_CONFIG_KEY_0',
    'GIT_CONFIG_VALUE_0',
    'GIT_CONFIG_PARAMETERS',
    'PYTHONWARNINGS',
    'PERL5DB',
    'LUA_INIT',
    'DOTNET_STARTUP_HOOKS',
    'ZDOTDIR',
    'BASH_XTRACEFD',
  ])('%s is refused forbidden_input', (n) => {
    expect(verdict(n)).toBe('forbidden_input');
  });

  it.each(FORBIDDEN_INPUT_RULES.map((r) => [`${r.match}${r.kind === 'prefix' ? '*' : ''}`, r] as const))(
    'rule %s refuses its name (and the whole family)',
    (_t, r) => {
      expect(verdict(sample(r))).toBe('forbidden_input');
      if (r.kind === 'prefix')
        expect(verdict(r.match.endsWith('_') ? `${r.match}A_B` : `${r.match}5LIB`)).toBe('forbidden_input');
    },
  );

  it.each(['db_password', 'NODE', 'port', 'GITHUB_TOKEN', 'PATHS', 'my_PATH', 'LDAP_URI', 'node_name', 'pythonpath'])(
    'control: %s is accepted',
    (n) => {
      expect(verdict(n)).toBe('ok');
      expect(isForbiddenInputName(n)).toBe(false);
    },
  );

  it('docs/hook-inputs.md lists exactly FORBIDDEN_INPUT_RULES, in order', () => {
    const doc = readFileSync(new URL('../../docs/hook-inputs.md', import.meta.url), 'utf8');
    const table = doc.slice(
      doc.indexOf('<!-- forbidden-inputs:start -->'),
      doc.indexOf('<!-- forbidden-inputs:end -->'),
    );
    const rows = [...table.matchAll(/^\| `([^`]+)` \| (.*) \|$/gm)].map((m) => [m[1], m[2]]);
    expect(rows).toEqual(FORBIDDEN_INPUT_RULES.map((r) => [r.kind === 'prefix' ? `${r.match}*` : r.match, r.why]));
  });
});

describe("forbidden input names at the agent's hook runner", () => {
  let base: string;
  beforeAll(async () => {
    base = await tempDir();
  });
  afterAll(async () => rm(base, { recursive: true, force: true }));

  it.each(['OPENSSL_CONF', 'PYTHONWARNINGS', 'GIT_CONFIG_COUNT', 'DOTNET_STARTUP_HOOKS', 'ZDOTDIR', 'BASH_XTRACEFD'])(
    'an item with input %s fails forbidden_input and runs nothing',
    async (n) => {
      const marker = join(base, `ran-${n}`);
      const r = await runItem(item({ config: `#!/bin/sh\ntouch ${marker}\n`, inputValues: { [n]: '/tmp/evil' } }), {
        runsDir: join(base, 'runs'),
        uid: 1000,
        env: { PATH: process.env.PATH },
      });
      expect(r.deploy_status_code).toBe(HOOK_ERROR_STATUS_CODE);
      expect(r.status_reason?.split(':')[0]).toBe('forbidden_input');
      expect(() => readFileSync(marker)).toThrow();
    },
  );
});
