import { createHash } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { heatMetadata, PeerMetadataServer } from '../../bench/peer-server.js';
import { pollModel } from '../../bench/peer.js';

type Doc = {
  'os-collect-config': { request: { metadata_url: string }; collectors: string[] };
  deployments: Array<{
    name: string;
    group: string;
    config: string;
    updated_time: string;
    inputs: Array<{ name: string; value: string }>;
  }>;
};

const input = (d: Doc, name: string): string | undefined =>
  d.deployments[0]!.inputs.find((i) => i.name === name)?.value;

let server: PeerMetadataServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

/** A clock the test moves: Last-Modified and updated_time follow it. */
function clock(startMs: number): { now: () => number; set: (ms: number) => void } {
  let t = startMs;
  return { now: () => t, set: (ms) => (t = ms) };
}

describe('the peer metadata server (bench --peer)', () => {
  it('serves the Heat-shaped document as JSON at its temp URL, with Swift-like headers', async () => {
    const c = clock(Date.UTC(2026, 11, 1, 12, 0, 0));
    server = await PeerMetadataServer.start({ now: c.now });
    const r = await fetch(server.url);
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toBe('application/json');
    const body = Buffer.from(await r.arrayBuffer());
    expect(body.equals(server.body)).toBe(true);
    expect(r.headers.get('etag')).toBe(createHash('md5').update(body).digest('hex'));
    expect(r.headers.get('last-modified')).toBe('Tue, 01 Dec 2026 12:00:00 GMT');
    const doc = JSON.parse(body.toString()) as Doc;
    expect(doc['os-collect-config'].request.metadata_url).toBe(server.url);
    expect(doc.deployments).toHaveLength(1);
    // what os-collect-config's merger needs of a deployment, and what Heat puts in one
    expect(doc.deployments[0]!.name).toBe('bench-deployment');
    expect(doc.deployments[0]!.group).toBe('script');
    expect(input(doc, 'deploy_action')).toBe('CREATE');
    expect(input(doc, 'deploy_signal_transport')).toBe('TEMP_URL_SIGNAL');
    expect(input(doc, 'mark')).toBe('r0');
  });

  it('answers a HEAD with the GET headers and no body', async () => {
    server = await PeerMetadataServer.start();
    const r = await fetch(server.url, { method: 'HEAD' });
    expect(r.status).toBe(200);
    expect(Number(r.headers.get('content-length'))).toBe(server.body.length);
    expect((await r.arrayBuffer()).byteLength).toBe(0);
  });

  it('a change is what the next GET sees: new revision, ETag, Last-Modified and updated_time', async () => {
    const c = clock(Date.UTC(2026, 11, 1, 12, 0, 0));
    server = await PeerMetadataServer.start({ now: c.now });
    const r0 = await fetch(server.url);
    const d0 = (await r0.json()) as Doc;
    c.set(Date.UTC(2026, 11, 1, 12, 0, 5));
    expect(server.change()).toBe(Date.UTC(2026, 11, 1, 12, 0, 5));
    expect(server.revision).toBe(1);
    const r1 = await fetch(server.url);
    const d1 = (await r1.json()) as Doc;
    expect(input(d1, 'mark')).toBe('r1');
    expect(input(d1, 'deploy_action')).toBe('UPDATE');
    expect(d1.deployments[0]!.updated_time).toBe('2026-12-01T12:00:05Z');
    expect(d1.deployments[0]!.updated_time).not.toBe(d0.deployments[0]!.updated_time);
    expect(r1.headers.get('etag')).not.toBe(r0.headers.get('etag'));
    expect(r1.headers.get('last-modified')).toBe('Tue, 01 Dec 2026 12:00:05 GMT');
    // the request log says which revision each answer carried
    expect(server.requests.map((q) => [q.method, q.revision, q.status])).toEqual([
      ['GET', 0, 200],
      ['GET', 1, 200],
    ]);
  });

  it('refuses what is not its temp URL: 401 without the signature, 404 elsewhere, 405 for a PUT', async () => {
    server = await PeerMetadataServer.start();
    const u = new URL(server.url);
    const noSig = `${u.origin}${u.pathname}`;
    expect((await fetch(noSig)).status).toBe(401);
    u.searchParams.set('temp_url_sig', 'f'.repeat(40));
    expect((await fetch(u)).status).toBe(401);
    expect((await fetch(`${u.origin}/v1/elsewhere`)).status).toBe(404);
    expect((await fetch(server.url, { method: 'PUT', body: '{}' })).status).toBe(405);
    expect(server.requests.map((q) => q.status)).toEqual([401, 401, 404, 405]);
  });

  it('counts requests and the bytes at its sockets', async () => {
    server = await PeerMetadataServer.start();
    await (await fetch(server.url, { method: 'HEAD' })).arrayBuffer();
    await (await fetch(server.url)).arrayBuffer();
    const k = server.counters();
    expect(k).toMatchObject({ requests: 2, heads: 1, gets: 1 });
    expect(k.connections).toBeGreaterThanOrEqual(1);
    expect(k.bytesOut).toBeGreaterThan(server.body.length);
    expect(k.bytesIn).toBeGreaterThan(0);
  });

  it('heatMetadata is a pure function of the ids, the revision and the time', () => {
    const ids = {
      serverId: 's',
      stackId: 'st',
      configId: 'c',
      deploymentId: 'd',
      metadataUrl: 'http://x/m',
      signalUrl: 'http://x/s',
    };
    const at = new Date(Date.UTC(2026, 0, 2));
    expect(heatMetadata(ids, 3, at)).toEqual(heatMetadata(ids, 3, at));
    expect(heatMetadata(ids, 3, at)).not.toEqual(heatMetadata(ids, 4, at));
  });
});

describe('the peer latency model (bench --peer)', () => {
  it('a uniformly random wait over one period plus the cost after the poll', () => {
    const m = pollModel(2_000, [10]);
    expect(m.p50Ms).toBe(1_009);
    expect(m.maxMs).toBe(2_009);
    expect(m.meanMs).toBeCloseTo(1_010, 6);
    // with two costs, each phase is paired with each
    const two = pollModel(1_000, [0, 100]);
    expect(two.meanMs).toBeCloseTo(550, 6);
    expect(two.maxMs).toBe(1_099.5);
  });
});
