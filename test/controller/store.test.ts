/**
 * The store suite, run against both stores (docs/several-controllers.md): SqliteStore on `:memory:` and PgStore on
 * a fresh database of a throwaway PostgreSQL: the global generation sequence, tombstones,
 * revisions and signals, group commit and transactions. Then SQLite's own: migrations and
 * durability of a reopened file. PostgreSQL's own are in pg-store.test.ts.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { newCluster } from '../helpers/new-cluster.js';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { codeOf } from '../../protocol/errors.js';
import { CLUSTER_INSERT_BATCH_ENTRIES } from '../../protocol/limits.js';
import { ClusterEngine } from '../../controller/clusters/engine.js';
import { recordSignal, type SignalOutcome } from '../../controller/service/signal.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { SCHEMA_VERSION, SqliteStore } from '../../controller/store/sqlite/store.js';
import type { NewConfig, SignalInput, Store, StoreTx } from '../../controller/store/store.js';
import { thrownCode } from '../helpers/codes.js';
import { rejectedCode } from '../helpers/controller-codes.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const WHO = 'spiffe://herald.local/operator/admin';
const CONFIG: NewConfig = {
  name: 'c',
  group: 'script',
  config: 'x',
  inputs: [],
  outputs: [{ name: 'o', type: 'String', error_output: false }],
  options: {},
};
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
function openFile(file: string): SqliteStore {
  const s = new SqliteStore(file);
  stores.push(s);
  return s;
}
async function openKind(kind: Kind): Promise<Store> {
  const s =
    kind === 'sqlite'
      ? new SqliteStore(':memory:')
      : await PgStore.open(await pg!.createDatabase(), { controller: 'c1' });
  stores.push(s);
  return s;
}
/** An agent's result, as the service records it: one transaction (signal.ts). */
function signal(s: Store, node: string, dep: string, input: SignalInput, nowMs = Date.now()) {
  return s
    .transaction((tx) => recordSignal(tx, new ClusterEngine(), node, dep, input, WHO, nowMs))
    .then(({ result, changes }): SignalOutcome & { changes: typeof changes } => ({ ...result, changes }));
}

describe.each(['sqlite', 'postgres'] as const)('%s store', (kind) => {
  const open = () => openKind(kind);

  describe('generations', () => {
    it("one global sequence, bumped once per transaction that changes a node's metadata", async () => {
      const s = await open();
      expect(await s.generation()).toBe(0);
      const a = await s.createNode('a', null, WHO);
      expect(a.node.generation).toBe(1);
      expect(a.changes.generation).toBe(1);
      const b = await s.createNode('b', null, WHO);
      expect(b.node.generation).toBe(2);
      const cfg = await s.createConfig(CONFIG, WHO);
      expect(await s.generation()).toBe(2); // a config changes no node
      const d = await s.createDeployment(
        { node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: {} },
        WHO,
      );
      expect(d.changes.wakes).toEqual([{ node: 'a', generation: 3, reason: 'deployment' }]);
      expect((await s.getNode('a'))!.generation).toBe(3);
      expect((await s.getNode('b'))!.generation).toBe(2);
      const sig = await signal(s, 'a', d.deployment.id, {
        revision: 1,
        deployStatusCode: 0,
        deployStdout: '',
        deployStderr: '',
        outputs: {},
      });
      expect(sig.changes.generation).toBe(4);
      expect(sig.changes.wakes).toEqual([]); // a signal bumps, but wakes nobody
      expect((await s.getNode('a'))!.generation).toBe(4);
    });

    it('a deleted and re-created node gets a generation higher than any it had', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(CONFIG, WHO);
      for (let i = 0; i < 3; i++)
        await s.createDeployment(
          { node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
          WHO,
        );
      const high = (await s.getNode('a'))!.generation;
      await s.deleteNode('a', WHO);
      expect(await s.getNode('a')).toBeUndefined();
      expect(await s.isTombstoned('a')).toBe(true);
      expect(await s.listDeployments({ node: 'a' })).toEqual([]);
      expect(await rejectedCode(s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true))).toBe('node_deleted');
      const again = await s.createNode('a', null, WHO);
      expect(again.node.generation).toBeGreaterThan(high);
      expect(await s.isTombstoned('a')).toBe(false);
    });
  });

  describe('nodes', () => {
    it('announce creates (auto-register), updates only on change, refuses unknown without auto-register', async () => {
      const s = await open();
      const r = await s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true);
      expect(r).toMatchObject({ created: true, changed: true });
      expect(await s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true)).toMatchObject({
        created: false,
        changed: false,
      });
      expect(await s.announceEndpoint('a', 'wss://h:2/v1/wake', WHO, true)).toMatchObject({
        created: false,
        changed: true,
      });
      expect(await rejectedCode(s.announceEndpoint('b', 'wss://h:1/v1/wake', WHO, false))).toBe('not_found');
      expect(await rejectedCode(s.createNode('a', null, WHO))).toBe('node_exists');
    });

    it('acked generations only grow', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      await s.recordAcked(new Map([['a', 5]]));
      await s.recordAcked(
        new Map([
          ['a', 3],
          ['ghost', 9],
        ]),
      );
      expect((await s.getNode('a'))!.ackedGeneration).toBe(5);
    });
  });

  describe('deployments and signals', () => {
    it('a patch of a revision that is no longer current is refused, and nothing is written', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(CONFIG, WHO);
      const { deployment: d } = await s.createDeployment(
        { node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: {} },
        WHO,
      );
      await s.updateDeployment(d.id, { revises: 1, inputValues: { a: '1' } }, WHO);
      // values merged into revision 1, read before revision 2 was written: they would drop `a`
      expect(await rejectedCode(s.updateDeployment(d.id, { revises: 1, inputValues: { b: '2' } }, WHO))).toBe(
        'internal',
      );
      const now = (await s.getDeployment(d.id))!;
      expect(now.current).toMatchObject({ revision: 2, inputValues: { a: '1' } });
    });

    it('revisions get new item ids; stale/unknown revisions refused; first result wins; Heat status', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(
        { ...CONFIG, outputs: [{ name: 'e', type: 'String', error_output: true }] },
        WHO,
      );
      const { deployment: d } = await s.createDeployment(
        {
          node: 'a',
          configId: cfg.id,
          name: null,
          actions: ['CREATE', 'UPDATE'],
          action: 'CREATE',
          inputValues: { k: 'v' },
        },
        WHO,
      );
      const u = (await s.updateDeployment(d.id, { revises: 1 }, WHO)).deployment;
      expect(u.current).toMatchObject({
        revision: 2,
        action: 'UPDATE',
        inputValues: { k: 'v' },
        status: 'IN_PROGRESS',
      });
      expect(u.current.itemId).not.toBe(d.current.itemId);
      const sig = (revision: number, code = 0, outputs: Record<string, unknown> = {}) =>
        signal(s, 'a', d.id, { revision, deployStatusCode: code, deployStdout: 'o', deployStderr: 'e', outputs });
      expect(await rejectedCode(sig(1))).toBe('stale_revision');
      expect(await rejectedCode(sig(3))).toBe('unknown_revision');
      expect(
        await rejectedCode(
          signal(s, 'b', d.id, { revision: 2, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} }),
        ),
      ).toBe('not_found');
      const first = await sig(2, 0, { e: 'bad' });
      expect(first.outcome).toBe('recorded');
      expect(first.deployment!.current).toMatchObject({
        status: 'FAILED',
        signalled: true,
        outputValues: { e: 'bad', deploy_stdout: 'o', deploy_stderr: 'e', deploy_status_code: 0 },
      });
      const second = await sig(2, 0);
      expect(second.outcome).toBe('duplicate');
      expect(second.changes.generation).toBeNull();
      expect(second.deployment!.current.status).toBe('FAILED');
      expect((await s.listRevisions(d.id)).map((r) => r.revision)).toEqual([1, 2]);
    });

    it('an action outside actions completes at once ("not triggered") without a wake-up', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(CONFIG, WHO);
      const r = await s.createDeployment(
        { node: 'a', configId: cfg.id, name: null, actions: ['UPDATE'], action: 'CREATE', inputValues: {} },
        WHO,
      );
      expect(r.deployment.current).toMatchObject({ status: 'COMPLETE', signalled: true });
      expect(r.deployment.current.statusReason).toMatch(/not triggered/);
      expect(r.changes.wakes).toEqual([]);
      expect(r.changes.generation).not.toBeNull();
    });

    it('DELETE runs only when listed and removes the deployment once signalled', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(CONFIG, WHO);
      const plain = (
        await s.createDeployment(
          { node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
          WHO,
        )
      ).deployment;
      expect((await s.deleteDeployment(plain.id, WHO)).deployment).toBeNull();
      expect(await s.getDeployment(plain.id)).toBeUndefined();
      const listed = (
        await s.createDeployment(
          { node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'DELETE'], action: 'CREATE', inputValues: {} },
          WHO,
        )
      ).deployment;
      const del = await s.deleteDeployment(listed.id, WHO);
      expect(del.deployment!.current).toMatchObject({ action: 'DELETE', revision: 2, status: 'IN_PROGRESS' });
      expect(del.changes.wakes.length).toBe(1);
      expect((await s.deleteDeployment(listed.id, WHO)).changes.generation).toBeNull(); // already running
      expect(await rejectedCode(s.updateDeployment(listed.id, { revises: 2 }, WHO))).toBe('deployment_deleting');
      const sig = await signal(s, 'a', listed.id, {
        revision: 2,
        deployStatusCode: 0,
        deployStdout: '',
        deployStderr: '',
        outputs: {},
      });
      expect(sig.deployment).toBeNull();
      expect(sig.changes.removedDeployments).toEqual([listed.id]);
      expect(await s.getDeployment(listed.id)).toBeUndefined();
    });

    it('unknown node or config is refused with its code and field', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      expect(
        await rejectedCode(
          s.createDeployment(
            { node: 'zz', configId: 'x', name: null, actions: [], action: 'CREATE', inputValues: {} },
            WHO,
          ),
        ),
      ).toBe('unknown_node');
      expect(
        await rejectedCode(
          s.createDeployment(
            { node: 'a', configId: 'x', name: null, actions: [], action: 'CREATE', inputValues: {} },
            WHO,
          ),
        ),
      ).toBe('unknown_config');
    });

    it('audits who changed what', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      expect((await s.listAudit())[0]).toMatchObject({ who: WHO, action: 'node.create', target: 'a' });
    });
  });

  describe('metadata source', () => {
    it("reads each deployment with its config, and its cluster's name and every config of the cluster and its groups", async () => {
      const s = await open();
      for (const n of ['a', 'b']) await s.createNode(n, null, WHO);
      const mk = async (name: string) => (await s.createConfig({ ...CONFIG, name }, WHO)).id;
      const [install, uninstall, gpuInstall, gpuUninstall, solo] = [
        await mk('install'),
        await mk('uninstall'),
        await mk('gpu-install'),
        await mk('gpu-uninstall'),
        await mk('solo'),
      ];
      const { deployment: own } = await s.createDeployment(
        { node: 'a', configId: solo, name: 'own', actions: ['CREATE'], action: 'CREATE', inputValues: {} },
        WHO,
      );
      const group = (name: string, nodes: string[], i: string, u: string) => ({
        name,
        role: 'worker' as const,
        nodes,
        ownInstallConfigId: i,
        ownUninstallConfigId: u,
        ownInputValues: null,
        installConfigId: i,
        uninstallConfigId: u,
        installInputValues: {},
      });
      const {
        result: { id: clusterId },
      } = await s.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({
            nodes: ['a', 'b'],
            nodegroups: [group('plain', ['b'], install, uninstall), group('gpu', ['a'], gpuInstall, gpuUninstall)],
            installConfigId: install,
            uninstallConfigId: uninstall,
          }),
          WHO,
          Date.now(),
        ),
      );
      // a new cluster's node has its install alone: its uninstall deployment is made when its first
      // uninstall runs (a restart here), as Heat makes none for an action outside its actions
      const born = (await s.metadataSource('a'))!.source!;
      expect(born.entries.map((e) => e.deployment.id).sort()).toEqual(
        (await s.listDeployments({ node: 'a' })).map((d) => d.id).sort(),
      );
      expect(born.entries).toHaveLength(2);
      await s.transaction((tx) =>
        tx.newUninstallDeployment(clusterId, 'a', ['RESTART', 'DELETE'], 'RESTART', 'restart'),
      );
      const src = (await s.metadataSource('a'))!.source!;
      expect(src.node.id).toBe('a');
      // the node alone when its generation is known (a 304, a document already built)
      expect(await s.metadataSource('a', [src.node.generation - 1, src.node.generation])).toEqual({
        node: src.node,
        source: null,
      });
      expect(await s.metadataSource('a', 'all')).toEqual({ node: src.node, source: null });
      expect((await s.metadataSource('a', [src.node.generation - 1]))!.source).toEqual(src);
      expect(await s.metadataSource('nobody', [])).toBeUndefined();
      // (in no order: the document sorts them; each found by its role, which the source does not carry)
      const roles = new Map(
        (await s.listDeployments({ node: 'a' })).map((d) => [d.id, d.id === own.id ? 'own' : d.clusterRole]),
      );
      const of = (role: string) => src.entries.find((e) => roles.get(e.deployment.id) === role)!;
      expect(src.entries).toHaveLength(3);
      expect([of('own').config.id, of('install').config.id, of('uninstall').config.id]).toEqual([
        solo,
        gpuInstall,
        gpuUninstall,
      ]);
      expect(of('own').cluster).toBeNull();
      // read as arrays (VALUES_SQL): each field as the reads of row objects give it
      expect(src.node).toEqual(await s.getNode('a'));
      for (const d of await s.listDeployments({ node: 'a' })) {
        const { revision, itemId, action, inputValues, signalled } = d.current;
        expect(src.entries.find((e) => e.deployment.id === d.id)!.deployment).toEqual({
          id: d.id,
          node: d.node,
          configId: d.configId,
          name: d.name,
          clusterId: d.clusterId,
          createdAt: d.createdAt,
          current: { revision, itemId, action, inputValues, signalled },
        });
      }
      const k = of('install').cluster!;
      expect(of('uninstall').cluster).toBe(k); // one per cluster
      expect(k.id).toBe(clusterId);
      expect(k.name).toBe('k');
      expect(k.configs.map((c) => c.id)).toEqual([install, uninstall, gpuInstall, gpuUninstall]);
      expect(of('install').deployment.current).toEqual({
        revision: 1,
        itemId: expect.any(String),
        action: 'CREATE',
        inputValues: {},
        signalled: false,
      });
      // a fetch reads what the document carries, never the node's results (they can be large)
      expect(of('own').deployment.current).not.toHaveProperty('outputValues');
      expect(await s.metadataSource('nobody')).toBeUndefined();
      // a cluster of nodes alone (no nodegroups): its own two configs
      await s.createNode('c', null, WHO);
      const {
        result: { id: plainId },
      } = await s.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({ nodes: ['c'], installConfigId: gpuInstall, uninstallConfigId: gpuUninstall }),
          WHO,
          Date.now(),
        ),
      );
      const ofC = (await s.metadataSource('c'))!.source!;
      expect(ofC.entries).toHaveLength(1); // its install: the uninstall has not run
      for (const e of ofC.entries) {
        expect(e.cluster!.id).toBe(plainId);
        expect(e.cluster!.configs.map((c) => c.id)).toEqual([gpuInstall, gpuUninstall]);
      }
    });
  });

  describe('clusters', () => {
    /** A group of `nodes` with the given configs, no input values of its own. */
    const group = (name: string, nodes: string[], i: string, u: string) => ({
      name,
      role: 'worker' as const,
      nodes,
      ownInstallConfigId: null,
      ownUninstallConfigId: null,
      ownInputValues: null,
      installConfigId: i,
      uninstallConfigId: u,
      installInputValues: { step: 'in' },
    });

    it("writes every member's deployments, revisions and row together, and its change set names each node", async () => {
      const s = await open();
      // past one batch of inserted members (CLUSTER_INSERT_BATCH_ENTRIES): the second group spans two
      const total = CLUSTER_INSERT_BATCH_ENTRIES + 3;
      const nodes = Array.from({ length: total }, (_, i) => `n${String(i).padStart(4, '0')}`);
      await s.transaction(async (tx) => {
        for (const n of nodes) await tx.createNode(n, null, WHO);
      });
      const install = (await s.createConfig({ ...CONFIG, name: 'install' }, WHO)).id;
      const uninstall = (await s.createConfig({ ...CONFIG, name: 'uninstall' }, WHO)).id;
      const nowMs = Date.parse('2026-12-04T10:00:00.000Z');
      const { result: created, changes } = await s.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({
            nodes,
            nodegroups: [
              group('a', nodes.slice(0, 200), install, uninstall),
              group('b', nodes.slice(200), install, uninstall),
            ],
            installConfigId: install,
            uninstallConfigId: uninstall,
          }),
          WHO,
          nowMs,
        ),
      );
      const id = created.id;
      // what the API answers with: the rows as written, equal to a read of them after the commit
      expect(created).toEqual(await s.getCluster(id));
      expect([...changes.touchedNodes].sort()).toEqual(nodes);
      expect(changes.wakes.map((w) => w.node).sort()).toEqual(nodes);
      const c = (await s.getCluster(id))!;
      expect(c.nodes.map((n) => [n.node, n.position, n.phase, n.nodegroup])).toEqual(
        nodes.map((n, i) => [n, i, 'installing', i < 200 ? 'a' : 'b']),
      );
      expect(new Set(c.nodes.map((n) => n.stepDeadlineMs)).size).toBe(1);
      expect(c.nodes[0]!.stepDeadlineMs).toBeGreaterThan(nowMs);
      expect(c.nodes).toHaveLength(total);
      const installs = new Set<string>();
      for (const n of c.nodes) installs.add(n.installDeploymentId);
      expect(installs.size).toBe(total);
      expect(await s.listDeployments()).toHaveLength(total); // every one written, none twice
      // no uninstall deployment until the node's first uninstall (newUninstallDeployment)
      expect(c.nodes.filter((n) => n.uninstallDeploymentId !== null)).toEqual([]);
      for (const n of [
        c.nodes[0]!,
        c.nodes[CLUSTER_INSERT_BATCH_ENTRIES - 1]!,
        c.nodes[CLUSTER_INSERT_BATCH_ENTRIES]!,
        c.nodes[total - 1]!,
      ]) {
        const ds = await s.listDeployments({ node: n.node });
        const inst = ds.find((d) => d.id === n.installDeploymentId)!;
        expect(ds).toHaveLength(1);
        expect(inst).toMatchObject({ clusterId: id, clusterRole: 'install', name: 'k-install', configId: install });
        expect(inst.current).toMatchObject({
          revision: 1,
          action: 'CREATE',
          status: 'IN_PROGRESS',
          signalled: false,
          inputValues: { step: 'in' },
        });
      }
    });

    it("a node's uninstall deployment, made at its first uninstall: its group's config and input values over the cluster's, a triggered first revision, named on its row", async () => {
      const s = await open();
      const nodes = ['u0', 'u1', 'u2'];
      await s.transaction(async (tx) => {
        for (const n of nodes) await tx.createNode(n, null, WHO);
      });
      const inputs = [
        { name: 'size', type: 'Number' as const },
        { name: 'tag', type: 'String' as const },
      ];
      const install = (await s.createConfig({ ...CONFIG, name: 'install' }, WHO)).id;
      const uninstall = (await s.createConfig({ ...CONFIG, name: 'uninstall', inputs }, WHO)).id;
      const own = (await s.createConfig({ ...CONFIG, name: 'own-uninstall', inputs }, WHO)).id;
      const { result: c } = await s.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({
            name: 'k',
            nodes,
            nodegroups: [
              group('a', ['u0'], install, uninstall),
              {
                ...group('b', ['u1', 'u2'], install, own),
                ownUninstallConfigId: own,
                ownInputValues: { tag: 'b' },
              },
            ],
            installConfigId: install,
            uninstallConfigId: uninstall,
            inputValues: { size: '3', tag: 'k' },
          }),
          WHO,
          Date.now(),
        ),
      );
      const made = new Map<string, { id: string; configId: string }>();
      const { changes } = await s.transaction(async (tx) => {
        for (const [node, action] of [
          ['u0', 'RESTART'],
          ['u1', 'DELETE'],
        ] as const) {
          const d = await tx.newUninstallDeployment(c.id, node, ['RESTART', 'DELETE'], action, 'restart');
          made.set(node, d);
          // the step's start names it on the node's row
          await tx.setNodeStep(
            c.id,
            node,
            { type: 'start', step: 'uninstall', deadlineMs: Date.now() + 60_000, uninstallDeploymentId: d.id },
            Date.now(),
          );
        }
      });
      expect(changes.wakes.map((w) => `${w.node}:${w.reason}`).sort()).toEqual(['u0:restart', 'u1:restart']);
      expect(changes.clusters).toEqual([c.id]);
      const read = (await s.getCluster(c.id))!;
      const byNode = new Map(read.nodes.map((n) => [n.node, n]));
      expect(byNode.get('u0')!.uninstallDeploymentId).toBe(made.get('u0')!.id);
      expect(byNode.get('u1')!.uninstallDeploymentId).toBe(made.get('u1')!.id);
      expect(byNode.get('u2')!.uninstallDeploymentId).toBeNull();
      const u0 = (await s.getDeployment(made.get('u0')!.id))!;
      expect(made.get('u0')!.configId).toBe(uninstall);
      expect(u0).toMatchObject({ node: 'u0', clusterId: c.id, clusterRole: 'uninstall', name: 'k-uninstall' });
      expect(u0.actions).toEqual(['RESTART', 'DELETE']);
      // the cluster's values, coerced to the config's inputs
      expect(u0.current).toMatchObject({
        revision: 1,
        action: 'RESTART',
        status: 'IN_PROGRESS',
        signalled: false,
        inputValues: { size: 3, tag: 'k' },
      });
      // the group's own config, its values over the cluster's
      const u1 = (await s.getDeployment(made.get('u1')!.id))!;
      expect(made.get('u1')!.configId).toBe(own);
      expect(u1.configId).toBe(own);
      expect(u1.current).toMatchObject({ revision: 1, action: 'DELETE', inputValues: { size: 3, tag: 'b' } });
      // in the node's document at once (a triggered first revision)
      const md = (await s.metadataSource('u0'))!.source!;
      expect(md.entries.map((e) => e.deployment.id)).toContain(made.get('u0')!.id);
      // made once: a second is a bug, refused
      expect(
        codeOf(
          await s
            .transaction((tx) => tx.newUninstallDeployment(c.id, 'u0', ['RESTART', 'DELETE'], 'RESTART', 'restart'))
            .catch((e: unknown) => e),
        ),
      ).toBe('internal');
    });

    it("a group added writes every new member's rows, past one batch of members, at the positions after the cluster's", async () => {
      const s = await open();
      const total = CLUSTER_INSERT_BATCH_ENTRIES + 2;
      const more = Array.from({ length: total }, (_, i) => `m${String(i).padStart(4, '0')}`);
      await s.transaction(async (tx) => {
        for (const n of ['first', ...more]) await tx.createNode(n, null, WHO);
      });
      const install = (await s.createConfig({ ...CONFIG, name: 'install' }, WHO)).id;
      const uninstall = (await s.createConfig({ ...CONFIG, name: 'uninstall' }, WHO)).id;
      const { result: created } = await s.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({ nodes: ['first'], installConfigId: install, uninstallConfigId: uninstall }),
          WHO,
          Date.now(),
        ),
      );
      await s.transaction((tx) =>
        tx.insertNodegroup(
          created.id,
          group('more', more, install, uninstall),
          { installActions: ['CREATE'], stepDeadlineMs: Date.now() + 60_000 },
          Date.now(),
        ),
      );
      const c = (await s.getCluster(created.id))!;
      expect(c.nodes.map((n) => [n.node, n.position, n.nodegroup])).toEqual([
        ['first', 0, 'default-worker'],
        ...more.map((n, i) => [n, i + 1, 'more']),
      ]);
      expect(await s.listDeployments()).toHaveLength(total + 1);
      for (const n of [
        c.nodes[1]!,
        c.nodes[CLUSTER_INSERT_BATCH_ENTRIES]!,
        c.nodes[CLUSTER_INSERT_BATCH_ENTRIES + 1]!,
        c.nodes[total]!,
      ]) {
        const ds = await s.listDeployments({ node: n.node });
        expect(ds.map((d) => d.id)).toEqual([n.installDeploymentId]);
        expect(n.uninstallDeploymentId).toBeNull();
      }
    });

    it('refuses the first unknown or taken node by its index and writes nothing; a group added checks its configs', async () => {
      const s = await open();
      for (const n of ['a', 'b', 'c']) await s.createNode(n, null, WHO);
      const install = (await s.createConfig({ ...CONFIG, name: 'install' }, WHO)).id;
      const uninstall = (await s.createConfig({ ...CONFIG, name: 'uninstall' }, WHO)).id;
      const engine = new ClusterEngine();
      const create = (nodes: string[]) =>
        s.transaction((tx) =>
          engine.create(
            tx,
            newCluster({ nodes, installConfigId: install, uninstallConfigId: uninstall }),
            WHO,
            Date.now(),
          ),
        );
      const unknown = await create(['a', 'ghost', 'b']).catch((e: unknown) => e);
      expect(codeOf(unknown)).toBe('unknown_node');
      expect((unknown as { field?: string }).field).toBe('nodes.1');
      expect(await s.listClusters()).toEqual([]);
      expect(await s.listDeployments()).toEqual([]);
      const {
        result: { id: first },
      } = await create(['b']);
      const busy = await create(['a', 'c', 'b']).catch((e: unknown) => e);
      expect(codeOf(busy)).toBe('cluster_busy');
      expect((busy as { field?: string }).field).toBe('nodes.2');
      expect((await s.listClusters()).map((c) => c.id)).toEqual([first]);
      expect(await s.listDeployments({ node: 'a' })).toEqual([]);
      // a group added to it: the uninstall config is checked as the install config is
      const added = await s
        .transaction((tx) =>
          tx.insertNodegroup(
            first,
            group('more', ['a'], install, 'no-such-config'),
            { installActions: ['CREATE'], stepDeadlineMs: Date.now() + 60_000 },
            Date.now(),
          ),
        )
        .catch((e: unknown) => e);
      expect(codeOf(added)).toBe('unknown_config');
      expect((added as { field?: string }).field).toBe('uninstall_config_id');
      expect(await s.listDeployments({ node: 'a' })).toEqual([]);
    });
  });

  describe('group commit', () => {
    it("shares one transaction but keeps each change's own result or error", async () => {
      const { GroupCommitter } = await import('../../controller/service/group-commit.js');
      const s = await open();
      await s.createNode('a', null, WHO);
      const cfg = await s.createConfig(CONFIG, WHO);
      const ids: string[] = [];
      for (let i = 0; i < 3; i++)
        ids.push(
          (
            await s.createDeployment(
              { node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
              WHO,
            )
          ).deployment.id,
        );
      const g = new GroupCommitter(s);
      const engine = new ClusterEngine();
      const body = (revision: number) => ({
        revision,
        deployStatusCode: 0,
        deployStdout: '',
        deployStderr: '',
        outputs: {},
      });
      const results = await Promise.allSettled([
        g.run((tx) => recordSignal(tx, engine, 'a', ids[0]!, body(1), WHO, Date.now())),
        g.run((tx) => recordSignal(tx, engine, 'a', ids[1]!, body(7), WHO, Date.now())), // unknown_revision: only this one fails
        g.run((tx) => recordSignal(tx, engine, 'a', ids[2]!, body(1), WHO, Date.now())),
      ]);
      expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
      expect(codeOf((results[1] as PromiseRejectedResult).reason)).toBe('unknown_revision');
      expect((await s.getDeployment(ids[0]!))!.current.signalled).toBe(true);
      expect((await s.getDeployment(ids[1]!))!.current.signalled).toBe(false);
      expect((await s.getDeployment(ids[2]!))!.current.signalled).toBe(true);
      const gens = results
        .filter((r) => r.status === 'fulfilled')
        .map((r) => (r as PromiseFulfilledResult<{ changes: { generation: number } }>).value.changes.generation);
      expect(gens[1]).toBeGreaterThan(gens[0]!);
      expect((await s.getNode('a'))!.generation).toBe(gens[1]);
    });
  });

  describe('transactions', () => {
    it('a read outside sees only what was committed: it waits for the open transaction (SQLite) or reads the last commit (PostgreSQL)', async () => {
      const s = await open();
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      let entered!: () => void;
      const inside = new Promise<void>((r) => (entered = r));
      const tx = s.transaction(async (t) => {
        await t.createNode('a', null, WHO);
        entered();
        await gate; // the transaction stays open across turns of the event loop
        await t.createNode('b', null, WHO);
      });
      if (kind === 'sqlite') {
        let seen: unknown = 'pending';
        const read = s.listNodes().then((l) => (seen = l.map((n) => n.id)));
        await new Promise((r) => setImmediate(r));
        expect(seen).toBe('pending');
        release();
        await tx;
        await read;
        expect(seen).toEqual(['a', 'b']);
      } else {
        await inside;
        expect(await s.listNodes()).toEqual([]); // 'a' is not committed yet
        release();
        await tx;
        expect((await s.listNodes()).map((n) => n.id)).toEqual(['a', 'b']);
      }
    });

    it('a rejected callback rolls everything back; a second transaction never sees its writes', async () => {
      const s = await open();
      const order: string[] = [];
      const first = s.transaction(async (t) => {
        await t.createNode('a', null, WHO);
        await new Promise((r) => setImmediate(r));
        order.push('first');
        throw new Error('boom');
      });
      const second = s.transaction(async (t) => {
        order.push('second');
        expect(await t.node('a')).toBeUndefined();
        await t.createNode('b', null, WHO);
      });
      await expect(first).rejects.toThrow('boom');
      const { changes } = await second;
      // SQLite runs them one after the other; PostgreSQL at once (they touch different rows)
      if (kind === 'sqlite') expect(order).toEqual(['first', 'second']);
      else expect(order.sort()).toEqual(['first', 'second']);
      expect(changes.generation).toBe(1); // the rolled-back bump is gone too
      expect((await s.listNodes()).map((n) => n.id)).toEqual(['b']);
    });

    it('a config created (and read, and deployed) in a transaction that rolled back is not served afterwards (nor usable by a deployment)', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      let ghost = '';
      await expect(
        s.transaction(async (t) => {
          ghost = (await t.createConfig(CONFIG, WHO)).id;
          // read again and used within the transaction (which keeps the configs it has read)
          expect((await t.config(ghost))?.name).toBe('c');
          await t.createDeployment(
            { node: 'a', configId: ghost, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
            WHO,
          );
          throw new Error('undo');
        }),
      ).rejects.toThrow('undo');
      expect(await s.getConfig(ghost)).toBeUndefined();
      expect(
        await rejectedCode(
          s.createDeployment(
            { node: 'a', configId: ghost, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
            WHO,
          ),
        ),
      ).toBe('unknown_config');
    });

    it('a config created in one unit of a group that rolls back is unknown to the next unit of the same group', async () => {
      const s = await open();
      await s.createNode('a', null, WHO);
      let ghost = '';
      const [first, second] = await s.group<unknown>([
        async (t) => {
          ghost = (await t.createConfig(CONFIG, WHO)).id;
          expect((await t.config(ghost))?.name).toBe('c');
          throw new Error('undo');
        },
        (t) =>
          t.createDeployment(
            { node: 'a', configId: ghost, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} },
            WHO,
          ),
      ]);
      expect(first?.ok).toBe(false);
      expect(second?.ok).toBe(false);
      expect(second?.ok === false && codeOf(second.error)).toBe('unknown_config');
    });

    it('a transaction object used after its callback settled rejects internal', async () => {
      const s = await open();
      let kept: StoreTx | undefined;
      await s.transaction(async (t) => {
        kept = t;
      });
      expect(await rejectedCode(kept!.createNode('late', null, WHO))).toBe('internal');
      expect(await s.getNode('late')).toBeUndefined();
    });

    it('close waits for the open transaction; later calls reject internal', async () => {
      const s = await open();
      const tx = s.transaction(async (t) => {
        await new Promise((r) => setImmediate(r));
        await t.createNode('a', null, WHO);
      });
      const closed = s.close();
      await tx;
      await closed;
      expect(await rejectedCode(s.getNode('a'))).toBe('internal');
      expect(await rejectedCode(s.createNode('b', null, WHO))).toBe('internal');
    });
  });
});

describe('the database file', () => {
  it('survives reopening, keeps the sequence, and records its schema version', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    try {
      const s1 = new SqliteStore(file);
      await s1.createNode('a', 'wss://h:1/v1/wake', WHO);
      const cfg = await s1.createConfig(CONFIG, WHO);
      const d = (
        await s1.createDeployment(
          { node: 'a', configId: cfg.id, name: 'n', actions: ['CREATE'], action: 'CREATE', inputValues: { x: 1 } },
          WHO,
        )
      ).deployment;
      const gen = await s1.generation();
      await s1.close();
      await s1.close(); // idempotent
      const s2 = openFile(file);
      expect(await s2.generation()).toBe(gen);
      expect(await s2.getDeployment(d.id)).toEqual(d);
      expect(await s2.getConfig(cfg.id)).toEqual(cfg);
      expect((await s2.getNode('a'))!.endpoint).toBe('wss://h:1/v1/wake');
      await s2.createNode('b', null, WHO);
      expect((await s2.getNode('b'))!.generation).toBe(gen + 1);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('migrates a version 1 database: the cluster indexes are added, the data kept', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    const indexes = (db: Database.Database) =>
      (
        db
          .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'cluster_nodes' AND name NOT LIKE 'sqlite_%' ORDER BY name",
          )
          .all() as Array<{ name: string }>
      ).map((r) => r.name);
    try {
      const s1 = new SqliteStore(file);
      await s1.createNode('a', null, WHO);
      await s1.close();
      // what version 1 left behind: no cluster_nodes index but the one by node
      const db = new Database(file);
      db.exec(
        'DROP INDEX cluster_nodes_by_deadline; DROP INDEX cluster_nodes_by_position; DELETE FROM schema_migrations WHERE version > 1',
      );
      expect(indexes(db)).toEqual(['cluster_nodes_by_node']);
      db.close();
      const s2 = openFile(file);
      expect(await s2.getNode('a')).toBeDefined();
      await s2.close();
      const after = new Database(file, { readonly: true });
      expect(indexes(after)).toEqual([
        'cluster_nodes_by_deadline',
        'cluster_nodes_by_node',
        'cluster_nodes_by_position',
      ]);
      expect((after.prepare('SELECT MAX(version) AS v FROM schema_migrations').get() as { v: number }).v).toBe(
        SCHEMA_VERSION,
      );
      after.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("migrates a version 5 database: cluster nodes' uninstall deployment may be null, their rows and indexes kept", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    const columns = (db: Database.Database) =>
      db.prepare('PRAGMA table_info(cluster_nodes)').all() as Array<{ name: string; notnull: number }>;
    try {
      const s1 = new SqliteStore(file);
      for (const n of ['a', 'b']) await s1.createNode(n, null, WHO);
      await s1.close();
      // cluster_nodes as version 5 left it (migration 1's table and migration 3's columns), with a member
      const db = new Database(file);
      const v6 = columns(db).map((c) => c.name);
      db.exec(`
        DROP TABLE cluster_nodes;
        CREATE TABLE cluster_nodes (
          cluster_id TEXT NOT NULL, node TEXT NOT NULL, position INTEGER NOT NULL, phase TEXT NOT NULL,
          install_deployment_id TEXT NOT NULL, uninstall_deployment_id TEXT NOT NULL, step_deadline_ms INTEGER,
          uninstall_started_at TEXT, uninstall_finished_at TEXT, install_started_at TEXT, install_finished_at TEXT,
          reason TEXT, nodegroup TEXT NOT NULL DEFAULT 'default-worker', health_deployment_id TEXT,
          check_started_at TEXT, ended_at_ms INTEGER, PRIMARY KEY (cluster_id, node)) STRICT;
        CREATE INDEX cluster_nodes_by_node ON cluster_nodes (node);
        CREATE INDEX cluster_nodes_by_deadline ON cluster_nodes (cluster_id, phase, step_deadline_ms);
        CREATE INDEX cluster_nodes_by_position ON cluster_nodes (cluster_id, phase, position);
        INSERT INTO cluster_nodes (cluster_id, node, position, phase, install_deployment_id, uninstall_deployment_id, nodegroup, ended_at_ms)
          VALUES ('old', 'a', 0, 'complete', 'i-1', 'u-1', 'g', 42);
        DELETE FROM schema_migrations WHERE version > 5;
      `);
      expect(columns(db).find((c) => c.name === 'uninstall_deployment_id')!.notnull).toBe(1);
      db.close();
      const s2 = openFile(file);
      await s2.close();
      const after = new Database(file, { readonly: true });
      expect(columns(after).map((c) => c.name)).toEqual(v6); // the same columns, in the same order
      expect(columns(after).find((c) => c.name === 'uninstall_deployment_id')!.notnull).toBe(0);
      expect(after.prepare('SELECT * FROM cluster_nodes').all()).toMatchObject([
        {
          cluster_id: 'old',
          node: 'a',
          install_deployment_id: 'i-1',
          uninstall_deployment_id: 'u-1',
          nodegroup: 'g',
          ended_at_ms: 42,
        },
      ]);
      expect(
        (
          after
            .prepare(
              "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'cluster_nodes' AND name NOT LIKE 'sqlite_%' ORDER BY name",
            )
            .all() as Array<{ name: string }>
        ).map((r) => r.name),
      ).toEqual(['cluster_nodes_by_deadline', 'cluster_nodes_by_node', 'cluster_nodes_by_position']);
      expect((after.prepare('SELECT MAX(version) AS v FROM schema_migrations').get() as { v: number }).v).toBe(
        SCHEMA_VERSION,
      );
      after.close();
      // and a new cluster's member is written with none
      const s3 = openFile(file);
      const cfg = (await s3.createConfig(CONFIG, WHO)).id;
      const { result: c } = await s3.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({ nodes: ['b'], installConfigId: cfg, uninstallConfigId: cfg }),
          WHO,
          Date.now(),
        ),
      );
      expect((await s3.getCluster(c.id))!.nodes[0]!.uninstallDeploymentId).toBeNull();
      await s3.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('migrates a version 8 database: its clusters and nodes at revision 1, read from their rows until an upgrade writes the next', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    try {
      const s1 = new SqliteStore(file);
      for (const n of ['a', 'b']) await s1.createNode(n, null, WHO);
      const cfg = (await s1.createConfig(CONFIG, WHO)).id;
      const cfg2 = (await s1.createConfig({ ...CONFIG, name: 'next' }, WHO)).id;
      const { result: c } = await s1.transaction((tx) =>
        new ClusterEngine().create(
          tx,
          newCluster({ nodes: ['a', 'b'], installConfigId: cfg, uninstallConfigId: cfg, inputValues: { v: '1' } }),
          WHO,
          Date.now(),
        ),
      );
      await s1.close();
      // as version 8 left it: no revisions table, no revision columns, a cluster created and complete
      const db = new Database(file);
      const strip = (t: string) => {
        const cols = (db.prepare(`PRAGMA table_info(${t})`).all() as Array<{ name: string }>)
          .map((x) => x.name)
          .filter((x) => x !== 'revision');
        db.exec(
          `CREATE TABLE ${t}_old AS SELECT ${cols.join(', ')} FROM ${t}; DROP TABLE ${t}; ALTER TABLE ${t}_old RENAME TO ${t};`,
        );
      };
      strip('clusters');
      strip('cluster_nodes');
      db.exec(
        `DROP TABLE cluster_revisions; UPDATE clusters SET status = 'CREATE_COMPLETE'; DELETE FROM schema_migrations WHERE version > 8;`,
      );
      db.close();
      const s2 = openFile(file);
      const got = (await s2.getCluster(c.id))!;
      expect(got.revision).toBe(1);
      expect(got.nodes.map((n) => n.revision)).toEqual([1, 1]);
      expect(await s2.listClusterRevisions(c.id)).toMatchObject([
        { revision: 1, installConfigId: cfg, inputValues: { v: '1' }, stableAt: got.createdAt },
      ]);
      await s2.transaction((tx) =>
        new ClusterEngine().upgrade(tx, c.id, { installConfigId: cfg2 }, {}, WHO, Date.now()),
      );
      const revs = (await s2.listClusterRevisions(c.id))!;
      expect(revs.map((r) => [r.revision, r.installConfigId, r.stableAt !== null])).toEqual([
        [1, cfg, true],
        [2, cfg2, false],
      ]);
      await s2.close();
      // migration 9 run again over its own result changes nothing
      const again = new Database(file);
      again.exec('DELETE FROM schema_migrations WHERE version = 9');
      again.close();
      const s3 = openFile(file);
      expect((await s3.listClusterRevisions(c.id))!.length).toBe(2);
      await s3.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a second store on the same file at once (db_in_use), and lets it open once the first closed', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    try {
      const file = path.join(dir, 'h.db');
      const first = new SqliteStore(file);
      await first.createNode('a', null, WHO);
      expect(thrownCode(() => new SqliteStore(file))).toBe('db_in_use');
      await first.close();
      const again = openFile(file);
      expect((await again.getNode('a'))?.id).toBe('a');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a database written by a newer schema', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    try {
      await new SqliteStore(file).close();
      const db = new Database(file);
      db.prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 'now')").run();
      db.close();
      expect(thrownCode(() => new SqliteStore(file))).toBe('bad_option');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
