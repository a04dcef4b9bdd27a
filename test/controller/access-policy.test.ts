/**
 * controller/access/policy.ts, pure: the decision for every kind of target (a node by name, label,
 * cluster or group; a cluster or one group of it; the whole fleet), the union of several grants,
 * and the rule it names when it refuses or allows.
 */
import { describe, expect, it } from 'vitest';
import { decide, VerbScope, type ClusterFacts, type Grant, type NodeFacts } from '../../controller/access/policy.js';
import { parseSelector, type AccessRole } from '../../protocol/access.js';

function grant(role: AccessRole, ...scope: string[]): Grant {
  return {
    id: `g-${role}-${scope.join('+')}`,
    subject: 'alice',
    role,
    scope: scope.map((s) => parseSelector(s)),
    source: 'database',
    createdAt: null,
    createdBy: null,
  };
}

const web1: NodeFacts = { id: 'web-1', labels: { team: 'web' }, cluster: null };
const db1: NodeFacts = { id: 'db-1', labels: { team: 'db' }, cluster: null };
const shopCluster = { id: 'c1', name: 'shop' };
const m1: NodeFacts = { id: 'm1', labels: {}, cluster: { ...shopCluster, nodegroup: 'masters' } };
const w1: NodeFacts = { id: 'w1', labels: { team: 'web' }, cluster: { ...shopCluster, nodegroup: 'workers' } };
const shop: ClusterFacts = { ...shopCluster, members: [m1, w1] };
const shopWorkers: ClusterFacts = { ...shopCluster, nodegroup: 'workers', members: [w1] };

describe('the access decision', () => {
  it('refuses a verb no grant holds: forbidden, naming the roles that would and what is held', () => {
    const d = decide('alice', [grant('viewer', '*')], 'deploy', [{ kind: 'node', facts: web1 }]);
    expect(d).toEqual({
      allowed: false,
      code: 'forbidden',
      rule: 'deploy needs the role deployer, author or admin; operator/alice holds viewer on *',
    });
    expect(decide('alice', [], 'read', []).allowed).toBe(false);
    expect(decide('alice', [], 'read', []).rule).toContain('holds no grant');
  });

  it.each([
    ['node:web-*', web1, true],
    ['node:web-*', db1, false],
    ['label:team=web', web1, true],
    ['label:team=web', db1, false],
    ['label:team=web,env=prod', web1, false],
    ['cluster:shop', m1, true],
    ['cluster:sh*', w1, true],
    ['cluster:shop', web1, false],
    ['nodegroup:shop/workers', w1, true],
    ['nodegroup:shop/workers', m1, false],
    ['nodegroup:*/masters', m1, true],
    ['*', db1, true],
  ])('a node: %s over %o is %s', (sel, node, allowed) => {
    const d = decide('alice', [grant('deployer', sel)], 'deploy', [{ kind: 'node', facts: node }]);
    expect(d.allowed).toBe(allowed);
    if (!d.allowed) expect(d.code).toBe('out_of_scope');
  });

  it('a cluster: named by a selector, or all its members in scope, never an empty one by its members', () => {
    const ok = (sel: string[], c: ClusterFacts) =>
      decide('alice', [grant('deployer', ...sel)], 'deploy', [{ kind: 'cluster', facts: c }]).allowed;
    expect(ok(['cluster:shop'], shop)).toBe(true);
    expect(ok(['nodegroup:shop/*'], shop)).toBe(true); // every member is in one of its groups
    expect(ok(['node:m1', 'label:team=web'], shop)).toBe(true);
    expect(ok(['label:team=web'], shop)).toBe(false); // m1 is outside
    expect(ok(['node:*'], { ...shopCluster, members: [] })).toBe(false);
    // one group of it
    expect(ok(['nodegroup:shop/workers'], shopWorkers)).toBe(true);
    expect(ok(['label:team=web'], shopWorkers)).toBe(true);
    expect(ok(['nodegroup:shop/masters'], shopWorkers)).toBe(false);
  });

  it("unites the scopes of every grant whose role holds the verb; a lesser role's scope does not count", () => {
    const grants = [grant('deployer', 'node:m1'), grant('deployer', 'label:team=web'), grant('viewer', 'node:db-*')];
    expect(decide('alice', grants, 'deploy', [{ kind: 'cluster', facts: shop }]).allowed).toBe(true);
    expect(decide('alice', grants, 'deploy', [{ kind: 'node', facts: db1 }]).allowed).toBe(false);
    expect(decide('alice', grants, 'read', [{ kind: 'node', facts: db1 }]).allowed).toBe(true);
    const s = new VerbScope('deploy', grants);
    expect(s.describe()).toBe('node:m1, label:team=web');
  });

  it('the whole fleet needs a * selector, whatever else is held', () => {
    const scoped = decide('alice', [grant('admin', 'node:*')], 'admin', [{ kind: 'fleet' }]);
    expect(scoped).toMatchObject({ allowed: false, code: 'out_of_scope' });
    expect(scoped.rule).toBe("admin on the whole fleet: outside operator/alice's admin scope (node:*)");
    expect(decide('alice', [grant('admin', '*')], 'admin', [{ kind: 'fleet' }]).allowed).toBe(true);
  });

  it('every target must be in scope; the first outside one is named', () => {
    const d = decide('alice', [grant('deployer', 'node:web-*')], 'deploy', [
      { kind: 'node', facts: web1 },
      { kind: 'node', facts: db1 },
    ]);
    expect(d).toEqual({
      allowed: false,
      code: 'out_of_scope',
      rule: "deploy on node db-1: outside operator/alice's deploy scope (node:web-*)",
    });
    const yes = decide('alice', [grant('deployer', 'node:web-*')], 'deploy', [{ kind: 'node', facts: web1 }]);
    expect(yes).toEqual({
      allowed: true,
      rule: "deploy on node web-1: within operator/alice's deploy scope (node:web-*)",
    });
  });

  it('with no target, the verb over any scope is enough', () => {
    expect(decide('alice', [grant('author', 'node:web-*')], 'author', []).allowed).toBe(true);
  });
});
