/**
 * SqliteStore on `:memory:` and on a temp file: the global generation sequence, tombstones,
 * revisions and signals, migrations, and durability of a reopened file.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { codeOf } from '../../protocol/errors.js';
import { SCHEMA_VERSION, SqliteStore } from '../../controller/sqlite-store.js';
import type { NewConfig } from '../../controller/store.js';
import { thrownCode } from '../helpers/codes.js';

const WHO = 'spiffe://herald.local/operator/admin';
const CONFIG: NewConfig = { name: 'c', group: 'script', config: 'x', inputs: [], outputs: [{ name: 'o', type: 'String', error_output: false }], options: {} };
const stores: SqliteStore[] = [];
function open(file = ':memory:'): SqliteStore {
  const s = new SqliteStore(file);
  stores.push(s);
  return s;
}
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
});

describe('generations', () => {
  it('one global sequence, bumped once per transaction that changes a node\'s metadata', () => {
    const s = open();
    expect(s.generation()).toBe(0);
    const a = s.createNode('a', null, WHO);
    expect(a.node.generation).toBe(1);
    expect(a.changes.generation).toBe(1);
    const b = s.createNode('b', null, WHO);
    expect(b.node.generation).toBe(2);
    const cfg = s.createConfig(CONFIG, WHO);
    expect(s.generation()).toBe(2); // a config changes no node
    const d = s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: {} }, WHO);
    expect(d.changes.wakes).toEqual([{ node: 'a', generation: 3, reason: 'deployment' }]);
    expect(s.getNode('a')!.generation).toBe(3);
    expect(s.getNode('b')!.generation).toBe(2);
    const sig = s.recordSignal('a', d.deployment.id, { revision: 1, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} }, WHO);
    expect(sig.changes.generation).toBe(4);
    expect(sig.changes.wakes).toEqual([]); // a signal bumps, but wakes nobody
    expect(s.getNode('a')!.generation).toBe(4);
  });

  it('a deleted and re-created node gets a generation higher than any it had', () => {
    const s = open();
    s.createNode('a', null, WHO);
    const cfg = s.createConfig(CONFIG, WHO);
    for (let i = 0; i < 3; i++) s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} }, WHO);
    const high = s.getNode('a')!.generation;
    s.deleteNode('a', WHO);
    expect(s.getNode('a')).toBeUndefined();
    expect(s.isTombstoned('a')).toBe(true);
    expect(s.listDeployments({ node: 'a' })).toEqual([]);
    expect(thrownCode(() => s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true))).toBe('node_deleted');
    const again = s.createNode('a', null, WHO);
    expect(again.node.generation).toBeGreaterThan(high);
    expect(s.isTombstoned('a')).toBe(false);
  });
});

describe('nodes', () => {
  it('announce creates (auto-register), updates only on change, refuses unknown without auto-register', () => {
    const s = open();
    const r = s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true);
    expect(r).toMatchObject({ created: true, changed: true });
    expect(s.announceEndpoint('a', 'wss://h:1/v1/wake', WHO, true)).toMatchObject({ created: false, changed: false });
    expect(s.announceEndpoint('a', 'wss://h:2/v1/wake', WHO, true)).toMatchObject({ created: false, changed: true });
    expect(thrownCode(() => s.announceEndpoint('b', 'wss://h:1/v1/wake', WHO, false))).toBe('not_found');
    expect(thrownCode(() => s.createNode('a', null, WHO))).toBe('node_exists');
  });

  it('acked generations only grow', () => {
    const s = open();
    s.createNode('a', null, WHO);
    s.recordAcked(new Map([['a', 5]]));
    s.recordAcked(new Map([['a', 3], ['ghost', 9]]));
    expect(s.getNode('a')!.ackedGeneration).toBe(5);
  });
});

describe('deployments and signals', () => {
  it('revisions get new item ids; stale/unknown revisions refused; first result wins; Heat status', () => {
    const s = open();
    s.createNode('a', null, WHO);
    const cfg = s.createConfig({ ...CONFIG, outputs: [{ name: 'e', type: 'String', error_output: true }] }, WHO);
    const { deployment: d } = s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'UPDATE'], action: 'CREATE', inputValues: { k: 'v' } }, WHO);
    const u = s.updateDeployment(d.id, {}, WHO).deployment;
    expect(u.current).toMatchObject({ revision: 2, action: 'UPDATE', inputValues: { k: 'v' }, status: 'IN_PROGRESS' });
    expect(u.current.itemId).not.toBe(d.current.itemId);
    const sig = (revision: number, code = 0, outputs: Record<string, unknown> = {}) =>
      s.recordSignal('a', d.id, { revision, deployStatusCode: code, deployStdout: 'o', deployStderr: 'e', outputs }, WHO);
    expect(thrownCode(() => sig(1))).toBe('stale_revision');
    expect(thrownCode(() => sig(3))).toBe('unknown_revision');
    expect(thrownCode(() => s.recordSignal('b', d.id, { revision: 2, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} }, WHO))).toBe('not_found');
    const first = sig(2, 0, { e: 'bad' });
    expect(first.outcome).toBe('recorded');
    expect(first.deployment!.current).toMatchObject({ status: 'FAILED', signalled: true, outputValues: { e: 'bad', deploy_stdout: 'o', deploy_stderr: 'e', deploy_status_code: 0 } });
    const second = sig(2, 0);
    expect(second.outcome).toBe('duplicate');
    expect(second.changes.generation).toBeNull();
    expect(second.deployment!.current.status).toBe('FAILED');
    expect(s.listRevisions(d.id).map((r) => r.revision)).toEqual([1, 2]);
  });

  it('an action outside actions completes at once ("not triggered") without a wake-up', () => {
    const s = open();
    s.createNode('a', null, WHO);
    const cfg = s.createConfig(CONFIG, WHO);
    const r = s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['UPDATE'], action: 'CREATE', inputValues: {} }, WHO);
    expect(r.deployment.current).toMatchObject({ status: 'COMPLETE', signalled: true });
    expect(r.deployment.current.statusReason).toMatch(/not triggered/);
    expect(r.changes.wakes).toEqual([]);
    expect(r.changes.generation).not.toBeNull();
  });

  it('DELETE runs only when listed and removes the deployment once signalled', () => {
    const s = open();
    s.createNode('a', null, WHO);
    const cfg = s.createConfig(CONFIG, WHO);
    const plain = s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} }, WHO).deployment;
    expect(s.deleteDeployment(plain.id, WHO).deployment).toBeNull();
    expect(s.getDeployment(plain.id)).toBeUndefined();
    const listed = s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE', 'DELETE'], action: 'CREATE', inputValues: {} }, WHO).deployment;
    const del = s.deleteDeployment(listed.id, WHO);
    expect(del.deployment!.current).toMatchObject({ action: 'DELETE', revision: 2, status: 'IN_PROGRESS' });
    expect(del.changes.wakes.length).toBe(1);
    expect(s.deleteDeployment(listed.id, WHO).changes.generation).toBeNull(); // already running
    expect(thrownCode(() => s.updateDeployment(listed.id, {}, WHO))).toBe('deployment_deleting');
    const sig = s.recordSignal('a', listed.id, { revision: 2, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} }, WHO);
    expect(sig.deployment).toBeNull();
    expect(sig.changes.removedDeployments).toEqual([listed.id]);
    expect(s.getDeployment(listed.id)).toBeUndefined();
  });

  it('unknown node or config is refused with its code and field', () => {
    const s = open();
    s.createNode('a', null, WHO);
    expect(thrownCode(() => s.createDeployment({ node: 'zz', configId: 'x', name: null, actions: [], action: 'CREATE', inputValues: {} }, WHO))).toBe('unknown_node');
    expect(thrownCode(() => s.createDeployment({ node: 'a', configId: 'x', name: null, actions: [], action: 'CREATE', inputValues: {} }, WHO))).toBe('unknown_config');
  });

  it('audits who changed what', () => {
    const s = open();
    s.createNode('a', null, WHO);
    expect(s.listAudit()[0]).toMatchObject({ who: WHO, action: 'node.create', target: 'a' });
  });
});

describe('the database file', () => {
  it('survives reopening, keeps the sequence, and records its schema version', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    try {
      const s1 = new SqliteStore(file);
      s1.createNode('a', 'wss://h:1/v1/wake', WHO);
      const cfg = s1.createConfig(CONFIG, WHO);
      const d = s1.createDeployment({ node: 'a', configId: cfg.id, name: 'n', actions: ['CREATE'], action: 'CREATE', inputValues: { x: 1 } }, WHO).deployment;
      const gen = s1.generation();
      s1.close();
      s1.close(); // idempotent
      const s2 = open(file);
      expect(s2.generation()).toBe(gen);
      expect(s2.getDeployment(d.id)).toEqual(d);
      expect(s2.getConfig(cfg.id)).toEqual(cfg);
      expect(s2.getNode('a')!.endpoint).toBe('wss://h:1/v1/wake');
      s2.createNode('b', null, WHO);
      expect(s2.getNode('b')!.generation).toBe(gen + 1);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('migrates a version 1 database: the cluster indexes are added, the data kept', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    const indexes = (db: Database.Database) =>
      (db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'cluster_nodes' AND name NOT LIKE 'sqlite_%' ORDER BY name").all() as Array<{ name: string }>).map((r) => r.name);
    try {
      const s1 = new SqliteStore(file);
      s1.createNode('a', null, WHO);
      s1.close();
      // what version 1 left behind: no cluster_nodes index but the one by node
      const db = new Database(file);
      db.exec('DROP INDEX cluster_nodes_by_deadline; DROP INDEX cluster_nodes_by_position; DELETE FROM schema_migrations WHERE version > 1');
      expect(indexes(db)).toEqual(['cluster_nodes_by_node']);
      db.close();
      const s2 = open(file);
      expect(s2.getNode('a')).toBeDefined();
      s2.close();
      const after = new Database(file, { readonly: true });
      expect(indexes(after)).toEqual(['cluster_nodes_by_deadline', 'cluster_nodes_by_node', 'cluster_nodes_by_position']);
      expect((after.prepare('SELECT MAX(version) AS v FROM schema_migrations').get() as { v: number }).v).toBe(SCHEMA_VERSION);
      after.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a database written by a newer schema', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-store-'));
    const file = path.join(dir, 'h.db');
    try {
      new SqliteStore(file).close();
      const db = new Database(file);
      db.prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 'now')").run();
      db.close();
      expect(thrownCode(() => new SqliteStore(file))).toBe('bad_option');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('group commit', () => {
  it('shares one transaction but keeps each change\'s own result or error', async () => {
    const { GroupCommitter } = await import('../../controller/group-commit.js');
    const s = open();
    s.createNode('a', null, WHO);
    const cfg = s.createConfig(CONFIG, WHO);
    const ids = [0, 1, 2].map(() => s.createDeployment({ node: 'a', configId: cfg.id, name: null, actions: ['CREATE'], action: 'CREATE', inputValues: {} }, WHO).deployment.id);
    const g = new GroupCommitter(s);
    const body = (revision: number) => ({ revision, deployStatusCode: 0, deployStdout: '', deployStderr: '', outputs: {} });
    const results = await Promise.allSettled([
      g.run(() => s.recordSignal('a', ids[0]!, body(1), WHO)),
      g.run(() => s.recordSignal('a', ids[1]!, body(7), WHO)), // unknown_revision: only this one fails
      g.run(() => s.recordSignal('a', ids[2]!, body(1), WHO)),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(codeOf((results[1] as PromiseRejectedResult).reason)).toBe('unknown_revision');
    expect(s.getDeployment(ids[0]!)!.current.signalled).toBe(true);
    expect(s.getDeployment(ids[1]!)!.current.signalled).toBe(false);
    expect(s.getDeployment(ids[2]!)!.current.signalled).toBe(true);
    const gens = results.filter((r) => r.status === 'fulfilled').map((r) => (r as PromiseFulfilledResult<{ changes: { generation: number } }>).value.changes.generation);
    expect(gens[1]).toBeGreaterThan(gens[0]!);
    expect(s.getNode('a')!.generation).toBe(gens[1]);
  });
});
