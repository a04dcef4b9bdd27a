/**
 * The access methods of the Store interface (docs/access.md), against both stores: SqliteStore on
 * `:memory:` and PgStore on a fresh database of a throwaway PostgreSQL. Grants made, listed (all,
 * or one operator's) and revoked, each with its audit row; a node's labels set in a transaction,
 * read back, and gone with the node; and the facts a scope check reads: labels, cluster and group.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ClusterEngine } from '../../controller/clusters/engine.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import type { NewConfig, Store } from '../../controller/store/store.js';
import { rejectedCode } from '../helpers/controller-codes.js';
import { newCluster } from '../helpers/new-cluster.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const WHO = 'spiffe://herald.local/operator/admin';
const CONFIG: NewConfig = { name: 'c', group: 'script', config: 'x', inputs: [], outputs: [], options: {} };
type Kind = 'sqlite' | 'postgres';
const stores: Store[] = [];
let pg: PgServer | undefined;
beforeAll(async () => {
  pg = await startPg();
});
afterAll(async () => {
  await pg?.close();
});
afterEach(async () => {
  for (const s of stores.splice(0)) await s.close();
});
async function openKind(kind: Kind): Promise<Store> {
  const s =
    kind === 'sqlite'
      ? new SqliteStore(':memory:')
      : await PgStore.open(await pg!.createDatabase(), { controller: 'c1' });
  stores.push(s);
  return s;
}

describe.each(['sqlite', 'postgres'] as const)('the access store (%s)', (kind) => {
  it('makes, lists and revokes grants, each change audited', async () => {
    const s = await openKind(kind);
    const a = await s.createAccessGrant({ id: 'g1', subject: 'alice', role: 'viewer', scope: ['*'] }, WHO);
    expect(a).toMatchObject({ id: 'g1', subject: 'alice', role: 'viewer', scope: ['*'], createdBy: WHO });
    await s.createAccessGrant(
      { id: 'g2', subject: 'bob', role: 'deployer', scope: ['node:web-*', 'label:team=web'] },
      WHO,
    );
    expect((await s.listAccessGrants()).map((g) => g.id)).toEqual(['g1', 'g2']);
    expect(await s.listAccessGrants('bob')).toEqual([
      expect.objectContaining({ id: 'g2', role: 'deployer', scope: ['node:web-*', 'label:team=web'] }),
    ]);
    expect(await s.listAccessGrants('carol')).toEqual([]);
    expect((await s.deleteAccessGrant('g1', WHO)).subject).toBe('alice');
    expect(await rejectedCode(s.deleteAccessGrant('g1', WHO))).toBe('not_found');
    expect((await s.listAccessGrants()).map((g) => g.id)).toEqual(['g2']);
    const audit = (await s.listAudit()).map((r) => `${r.action} ${r.target} ${r.who}`);
    expect(audit).toContain(`access.grant g1 ${WHO}`);
    expect(audit).toContain(`access.grant g2 ${WHO}`);
    expect(audit.filter((r) => r.startsWith('access.revoke g1'))).toHaveLength(1);
    const grantRow = (await s.listAudit()).find((r) => r.action === 'access.grant' && r.target === 'g2');
    expect(grantRow?.detail).toEqual({ subject: 'bob', role: 'deployer', scope: ['node:web-*', 'label:team=web'] });
  });

  it("keeps a node's labels, announces the change, and removes them with the node", async () => {
    const s = await openKind(kind);
    await s.createNode('web-1', null, WHO);
    await s.createNode('db-1', null, WHO);
    const { changes } = await s.transaction((tx) => tx.setNodeLabels('web-1', { team: 'web', tier: 'front' }, WHO));
    expect(changes.nodes).toEqual(['web-1']);
    expect(changes.wakes).toEqual([]); // labels are not in the node's metadata: no generation, no wake-up
    expect(changes.generation).toBeNull();
    expect(await s.nodeLabels(null)).toEqual(new Map([['web-1', { team: 'web', tier: 'front' }]]));
    expect(await s.nodeLabels(['db-1', 'web-1'])).toEqual(new Map([['web-1', { team: 'web', tier: 'front' }]]));
    expect(await rejectedCode(s.transaction((tx) => tx.setNodeLabels('nope', { a: 'b' }, WHO)))).toBe('not_found');
    expect((await s.listAudit()).some((r) => r.action === 'node.labels' && r.target === 'web-1')).toBe(true);
    await s.transaction((tx) => tx.setNodeLabels('web-1', {}, WHO));
    expect(await s.nodeLabels(['web-1'])).toEqual(new Map());
    await s.transaction((tx) => tx.setNodeLabels('web-1', { team: 'web' }, WHO));
    await s.deleteNode('web-1', WHO);
    await s.createNode('web-1', null, WHO);
    expect(await s.nodeLabels(['web-1'])).toEqual(new Map());
  });

  it('reads the facts a scope check needs: labels, cluster and group, of a few nodes or of all', async () => {
    const s = await openKind(kind);
    for (const n of ['m1', 'w1', 'w2', 'lone']) await s.createNode(n, null, WHO);
    await s.transaction((tx) => tx.setNodeLabels('w1', { team: 'web' }, WHO));
    const install = (await s.createConfig(CONFIG, WHO)).id;
    const uninstall = (await s.createConfig(CONFIG, WHO)).id;
    const group = (name: string, role: 'master' | 'worker', nodes: string[]) => ({
      name,
      role,
      nodes,
      ownInstallConfigId: null,
      ownUninstallConfigId: null,
      ownInputValues: null,
      installConfigId: install,
      uninstallConfigId: uninstall,
      installInputValues: {},
    });
    const {
      result: { id: clusterId },
    } = await s.transaction((tx) =>
      new ClusterEngine().create(
        tx,
        newCluster({
          name: 'shop',
          nodes: ['m1', 'w1', 'w2'],
          nodegroups: [group('masters', 'master', ['m1']), group('workers', 'worker', ['w1', 'w2'])],
          installConfigId: install,
          uninstallConfigId: uninstall,
        }),
        WHO,
        Date.now(),
      ),
    );
    const few = await s.nodeFacts(['w1', 'lone', 'ghost']);
    expect([...few.keys()].sort()).toEqual(['lone', 'w1']);
    expect(few.get('w1')).toEqual({
      id: 'w1',
      labels: { team: 'web' },
      cluster: { id: clusterId, name: 'shop', nodegroup: 'workers' },
    });
    expect(few.get('lone')).toEqual({ id: 'lone', labels: {}, cluster: null });
    const all = await s.nodeFacts(null);
    expect([...all.keys()].sort()).toEqual(['lone', 'm1', 'w1', 'w2']);
    expect(all.get('m1')?.cluster).toEqual({ id: clusterId, name: 'shop', nodegroup: 'masters' });
    // past ACCESS_FACTS_BY_KEY_ENTRIES names, one query of all, the same answer for the names asked
    const many = await s.nodeFacts([...Array.from({ length: 100 }, (_, i) => `x${i}`), 'm1']);
    expect([...many.keys()]).toEqual(['m1']);
  });
});
