/**
 * protocol/access.ts: the roles and what each holds, the selectors a grant's scope names (read,
 * written back the same, refused with the field at fault), name patterns and node labels.
 */
import { describe, expect, it } from 'vitest';
import {
  ACCESS_ROLES,
  checkLabels,
  formatSelector,
  nameMatches,
  parseScope,
  parseSelector,
  patchLabels,
  roleHolds,
  VERBS,
} from '../../protocol/access.js';
import { HeraldError } from '../../protocol/errors.js';

function refusal(fn: () => unknown): { code: string; field: string | undefined } {
  try {
    fn();
  } catch (err) {
    if (err instanceof HeraldError) return { code: err.code, field: err.field };
    throw err;
  }
  throw new Error('did not throw');
}

describe('roles', () => {
  it('are cumulative: reading, running existing configs, writing configs and administering are each a step', () => {
    const table = ACCESS_ROLES.map((r) => [r, VERBS.filter((v) => roleHolds(r, v))]);
    expect(table).toEqual([
      ['viewer', ['read']],
      ['deployer', ['read', 'deploy']],
      ['author', ['read', 'deploy', 'author']],
      ['admin', ['read', 'deploy', 'author', 'admin']],
    ]);
  });
});

describe('selectors', () => {
  it.each([
    ['*', { kind: 'all' }],
    ['node:web-*', { kind: 'node', pattern: 'web-*' }],
    ['node:db-?', { kind: 'node', pattern: 'db-?' }],
    ['label:team=web', { kind: 'label', labels: { team: 'web' } }],
    ['label:team=web,env=prod', { kind: 'label', labels: { team: 'web', env: 'prod' } }],
    ['cluster:shop', { kind: 'cluster', pattern: 'shop' }],
    ['cluster:Shop Front', { kind: 'cluster', pattern: 'Shop Front' }],
    ['nodegroup:shop/masters', { kind: 'nodegroup', cluster: 'shop', group: 'masters' }],
    ['nodegroup:a/b/workers', { kind: 'nodegroup', cluster: 'a/b', group: 'workers' }],
  ])('reads %s', (text, sel) => {
    expect(parseSelector(text)).toEqual(sel);
  });

  it('writes a selector back as it reads it (labels in key order)', () => {
    for (const t of ['*', 'node:web-*', 'cluster:shop', 'nodegroup:shop/masters', 'label:env=prod,team=web'])
      expect(formatSelector(parseSelector(t))).toBe(t);
    expect(formatSelector(parseSelector('label:team=web,env=prod'))).toBe('label:env=prod,team=web');
  });

  it.each([
    'web-*',
    'node:',
    'node:WEB',
    'node:a/b',
    'label:team',
    'label:team=',
    'label:=web',
    'label:team=web,team=db',
    'nodegroup:shop',
    'nodegroup:shop/Masters',
    'zone:eu',
    '',
  ])('refuses %j with invalid_request', (text) => {
    expect(refusal(() => parseSelector(text, 'scope.3'))).toEqual({ code: 'invalid_request', field: 'scope.3' });
  });

  it('a scope is 1 to 32 selectors, none twice, * alone', () => {
    expect(parseScope(['node:web-*', 'label:team=web']).map(formatSelector)).toEqual(['node:web-*', 'label:team=web']);
    expect(refusal(() => parseScope([]))).toEqual({ code: 'invalid_request', field: 'scope' });
    expect(refusal(() => parseScope('*'))).toEqual({ code: 'invalid_request', field: 'scope' });
    expect(refusal(() => parseScope(Array.from({ length: 33 }, (_, i) => `node:n${i}`)))).toEqual({
      code: 'invalid_request',
      field: 'scope',
    });
    expect(refusal(() => parseScope(['node:a', 'node:a']))).toEqual({ code: 'invalid_request', field: 'scope.1' });
    expect(refusal(() => parseScope(['*', 'node:a']))).toEqual({ code: 'invalid_request', field: 'scope' });
    expect(refusal(() => parseScope(['node:a', 7]))).toEqual({ code: 'invalid_request', field: 'scope.1' });
  });
});

describe('name patterns', () => {
  it.each([
    ['web-*', 'web-1', true],
    ['web-*', 'web-', true],
    ['web-*', 'db-1', false],
    ['web-*', 'xweb-1', false],
    ['*', 'anything', true],
    ['db-?', 'db-1', true],
    ['db-?', 'db-10', false],
    ['*-1', 'web-1', true],
    ['*-1', 'web-10', false],
    ['a*b*c', 'axxbyyc', true],
    ['a*b*c', 'axxbyy', false],
    ['web.1', 'webx1', false],
  ])('%s against %s is %s', (pattern, name, matches) => {
    expect(nameMatches(pattern, name)).toBe(matches);
  });

  it('answers a pattern of many stars against a long name (one backtracking point, never exponential)', () => {
    const name = 'a'.repeat(5_000);
    expect(nameMatches(`${'*a'.repeat(30)}b`, name)).toBe(false);
    expect(nameMatches(`${'*a'.repeat(30)}`, name)).toBe(true);
  });
});

describe('labels', () => {
  it('checks keys and values, and null only in a patch', () => {
    expect(checkLabels({ team: 'web', 'app.example/tier': 'front' })).toEqual({
      team: 'web',
      'app.example/tier': 'front',
    });
    expect(refusal(() => checkLabels({ team: 'we b' }))).toEqual({ code: 'invalid_request', field: 'labels.team' });
    expect(refusal(() => checkLabels({ team: null }))).toEqual({ code: 'invalid_request', field: 'labels.team' });
    expect(refusal(() => checkLabels({ 'bad key': 'x' }))).toEqual({ code: 'invalid_request', field: 'labels' });
    expect(refusal(() => checkLabels(['team=web']))).toEqual({ code: 'invalid_request', field: 'labels' });
    const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, 'v']));
    expect(refusal(() => checkLabels(many))).toEqual({ code: 'invalid_request', field: 'labels' });
    expect(checkLabels({ team: null }, 'labels', true)).toEqual({ team: null });
  });

  it('a patch sets and removes keys, and the result is in key order', () => {
    expect(patchLabels({ team: 'web', env: 'dev' }, { env: null, zone: 'eu', team: 'db' })).toEqual({
      team: 'db',
      zone: 'eu',
    });
    expect(Object.keys(patchLabels({ z: '1' }, { a: '2' }))).toEqual(['a', 'z']);
  });
});
