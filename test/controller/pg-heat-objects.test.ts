/**
 * Heat's object store on several controllers sharing one PostgreSQL database (docs/heat.md): the
 * temp-url key stays the first one set even when two controllers set theirs at the same moment,
 * an object written through one is read through the other, and a node's metadata written through
 * one is that node's deployments for all.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HeatObjects } from '../../controller/service/heat.js';
import { PgStore } from '../../controller/store/pg/store.js';
import { pgAvailable, startPg, type PgServer } from '../helpers/pg.js';

const WHO = 'spiffe://herald.local/operator/admin';
const here = pgAvailable();
if (!here) console.log('pg-heat-objects: skipped, no PostgreSQL server binaries (see docs/development.md)');
let pg: PgServer;
const open: PgStore[] = [];

beforeAll(async () => {
  if (here) pg = await startPg();
});
afterAll(async () => {
  for (const s of open) await s.close();
  await pg?.close();
});

async function two(): Promise<[HeatObjects, HeatObjects, PgStore]> {
  const url = await pg.createDatabase();
  const [a, b] = await Promise.all([PgStore.open(url, { controller: 'c1' }), PgStore.open(url, { controller: 'c2' })]);
  open.push(a, b);
  const objects = (s: PgStore) => new HeatObjects({ store: s, committed: async () => {}, heatProjects: ['admin'] });
  return [objects(a), objects(b), a];
}

const metadata = (container: string) => {
  const doc = JSON.parse(
    fs.readFileSync(new URL('../fixtures/heat/example-metadata-put.json', import.meta.url), 'utf8'),
  ) as { deployments: Array<{ inputs: Array<{ name: string; value: string }> }> };
  for (const i of doc.deployments[0]!.inputs)
    if (i.name === 'deploy_signal_id') i.value = `https://h/v1/AUTH_admin/stack-1/sig-1?temp_url_sig=x`;
  return Buffer.from(JSON.stringify({ ...doc, container }));
};

describe.skipIf(!here)("Heat's object store on several controllers", () => {
  it('two controllers setting the temp-url key at once: both read back the one that stayed', async () => {
    const [a, b] = await two();
    const [ra, rb] = await Promise.all([a.setTempUrlKey('admin', 'key-a'), b.setTempUrlKey('admin', 'key-b')]);
    const ka = await a.read((o) => o.tempUrlKey('admin'));
    const kb = await b.read((o) => o.tempUrlKey('admin'));
    expect(ka).toBe(kb);
    expect([ra.kept, rb.kept].filter(Boolean)).toHaveLength(1); // one set it, the other's was ignored
  });

  it("an object written through one controller is read through the other; a node's metadata is its deployments for both", async () => {
    const [a, b, storeA] = await two();
    await storeA.createNode('web-1', null, WHO);
    const key = { project: 'admin', container: 'web-1', name: 'stack.json' };
    const put = await a.put(key, metadata('web-1'), 'application/octet-stream', 'tempurl:admin');
    expect(put).toMatchObject({ deployments: 1, changed: 1 });
    const got = await b.get(key);
    expect(got?.etag).toBe(put.etag);
    expect(got?.body.equals(metadata('web-1'))).toBe(true);
    const ds = await open[open.length - 1]!.listDeployments({ node: 'web-1' });
    expect(ds).toHaveLength(1);
    // the same write again through the other controller changes nothing
    expect(await b.put(key, metadata('web-1'), 'application/octet-stream', 'tempurl:admin')).toMatchObject({
      changed: 0,
    });
  });
});
