/**
 * What a write to Heat's object store does (controller/service/heat.ts), on a real SQLite store:
 * a node's metadata only from an account whose Heat drives Herald's nodes, unchanged items left
 * alone, changed ones a new revision, a replaced config a new deployment, gone ones removed,
 * signal objects of changed items emptied, an agent's result written where Heat reads it.
 */
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { HeatObjects } from '../../controller/service/heat.js';
import { recordSignal } from '../../controller/service/signal.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import type { ClusterEngine } from '../../controller/clusters/engine.js';

const WHO = 'spiffe://herald.local/operator/admin';
const SIGNAL = 'https://h/v1/AUTH_admin/stack-1/sig-1?temp_url_sig=x&temp_url_expires=2147483586';
const stores: SqliteStore[] = [];
afterEach(async () => {
  for (const s of stores.splice(0)) await s.close();
});

function open(): { store: SqliteStore; heat: HeatObjects } {
  const store = new SqliteStore(':memory:');
  stores.push(store);
  return { store, heat: new HeatObjects({ store, committed: async () => {}, heatProjects: ['admin'] }) };
}

interface Item {
  id: string;
  config?: string;
  value?: string;
  signal?: string;
}

function metadata(...items: Item[]): Buffer {
  const doc = JSON.parse(
    fs.readFileSync(new URL('../fixtures/heat/example-metadata-put.json', import.meta.url), 'utf8'),
  ) as { deployments: Array<Record<string, unknown> & { inputs: Array<{ name: string; value: unknown }> }> };
  const base = doc.deployments[0]!;
  doc.deployments = items.map((it) => {
    const d = structuredClone(base);
    d.id = it.id;
    if (it.config) d.config = it.config;
    for (const i of d.inputs) {
      if (i.name === 'greeting' && it.value) i.value = it.value;
      if (i.name === 'deploy_signal_id') i.value = it.signal ?? SIGNAL;
    }
    return d;
  });
  return Buffer.from(JSON.stringify(doc));
}

const KEY = { project: 'admin', container: 'web-1', name: 'stack.json' };
const SIG_KEY = { project: 'admin', container: 'stack-1', name: 'sig-1' };
const put = (heat: HeatObjects, body: Buffer, key = KEY) =>
  heat.put(key, body, 'application/octet-stream', 'tempurl:admin');

describe("Heat's metadata becomes a node's deployments", () => {
  it('only in an account whose Heat drives Herald: elsewhere a container named after a node is a plain object', async () => {
    const { store, heat } = await open();
    await store.createNode('web-1', null, WHO);
    const other = await put(heat, metadata({ id: 'a' }), { ...KEY, project: 'tenant-b' });
    expect(other.deployments).toBeNull();
    expect(await store.listDeployments({ node: 'web-1' })).toHaveLength(0);
    expect((await heat.get({ ...KEY, project: 'tenant-b' }))?.body.length).toBeGreaterThan(0);
    expect((await put(heat, metadata({ id: 'a' }))).deployments).toBe(1);
    expect(await store.listDeployments({ node: 'web-1' })).toHaveLength(1);
  });

  it('unchanged item: nothing; changed values: a new revision; changed config: a new deployment; gone: removed', async () => {
    const { store, heat } = await open();
    await store.createNode('web-1', null, WHO);
    await put(heat, metadata({ id: 'a' }));
    const [first] = await store.listDeployments({ node: 'web-1' });
    expect((await put(heat, metadata({ id: 'a' }))).changed).toBe(0);
    await put(heat, metadata({ id: 'b', value: 'venus' }));
    const [second] = await store.listDeployments({ node: 'web-1' });
    expect(second!.id).toBe(first!.id);
    expect(second!.current.revision).toBe(2);
    expect(second!.current.inputValues.greeting).toBe('venus');
    // Heat's own derived values are kept for the hook; its signal is not
    expect(second!.current.inputValues.deploy_resource_name).toBe('deployment');
    expect(JSON.stringify(second!.current.inputValues)).not.toContain('temp_url_sig');
    await put(heat, metadata({ id: 'c', config: '#!/bin/sh\necho other\n' }));
    const [third] = await store.listDeployments({ node: 'web-1' });
    expect(third!.id).not.toBe(first!.id);
    await put(heat, metadata());
    expect(await store.listDeployments({ node: 'web-1' })).toHaveLength(0);
  });

  it("a changed item empties its signal object (an earlier result is never read as the new one's); the agent's result is written there", async () => {
    const { store, heat } = await open();
    await store.createNode('web-1', null, WHO);
    await store.transaction(async (tx) => {
      await tx.objects.put({ ...SIG_KEY, body: Buffer.alloc(0), contentType: 'x', etag: '', modifiedMs: 1 });
    });
    await put(heat, metadata({ id: 'a' }));
    const [d] = await store.listDeployments({ node: 'web-1' });
    const engine = {} as ClusterEngine; // a plain deployment: the engine is never asked
    await store.transaction((tx) =>
      recordSignal(
        tx,
        engine,
        'web-1',
        d!.id,
        { revision: 1, deployStatusCode: 0, deployStdout: 'out', deployStderr: '', outputs: { result: 'r1' } },
        'agent',
        Date.now(),
      ),
    );
    const result = JSON.parse((await heat.get(SIG_KEY))!.body.toString()) as Record<string, unknown>;
    expect(result).toEqual({ result: 'r1', deploy_stdout: 'out', deploy_stderr: '', deploy_status_code: 0 });
    await put(heat, metadata({ id: 'b', value: 'venus' }));
    expect((await heat.get(SIG_KEY))!.body.length).toBe(0);
  });

  it("a node's metadata Herald cannot serve is refused and nothing is stored", async () => {
    const { store, heat } = await open();
    await store.createNode('web-1', null, WHO);
    await expect(put(heat, Buffer.from('not json'))).rejects.toMatchObject({ code: 'heat_metadata_invalid' });
    expect(await heat.get(KEY)).toBeUndefined();
    await expect(put(heat, metadata({ id: 'a', config: '' }).subarray(0, 20))).rejects.toMatchObject({
      code: 'heat_metadata_invalid',
    });
  });
});
