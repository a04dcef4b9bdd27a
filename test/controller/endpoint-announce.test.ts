/**
 * The endpoint checks at announcement, through the real API over mutual TLS: an agent whose
 * certificate holds the address as an IP SAN (so the SAN check passes) still cannot announce a
 * NAT64, IPv4-compatible, unspecified-mapped or cloud metadata address; loopback stays allowed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeControllerTestPki, type ControllerTestPki, type Cred } from '../helpers/controller-pki.js';
import { startTestController, type TestController } from '../helpers/controller-harness.js';

const GENEROUS = { burst: 10_000, perS: 10_000 };
const SANS = [
  '127.0.0.1',
  '64:ff9b::a9fe:a9fe',
  '::a9fe:a9fe',
  '::ffff:0:0',
  'fd00:ec2::254',
  '100.100.100.200',
  '168.63.129.16',
  '::ffff:100.100.100.200',
];

let pki: ControllerTestPki;
let t: TestController;
let agent: Cred;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  agent = await pki.issueAgent('sly', { ip: SANS, dns: ['localhost'] });
  t = await startTestController(pki, {}, { rates: { announce: GENEROUS, fetch: GENEROUS, other: GENEROUS } });
}, 60_000);

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

const url = (host: string): string => `wss://${host}:7443/v1/wake`;

describe('PUT /v1/nodes/{node}/endpoint: refused addresses that are in the certificate', () => {
  it.each([
    ['NAT64 of 169.254.169.254', '[64:ff9b::a9fe:a9fe]', 'link_local_endpoint'],
    ['IPv4-compatible 169.254.169.254', '[::a9fe:a9fe]', 'link_local_endpoint'],
    ['::ffff:0:0 (mapped 0.0.0.0)', '[::ffff:0:0]', 'bad_endpoint'],
    ['AWS IPv6 metadata fd00:ec2::254', '[fd00:ec2::254]', 'forbidden_endpoint'],
    ['Alibaba metadata 100.100.100.200', '100.100.100.200', 'forbidden_endpoint'],
    ['Alibaba metadata, IPv4-mapped', '[::ffff:100.100.100.200]', 'forbidden_endpoint'],
    ['Azure wire server 168.63.129.16', '168.63.129.16', 'forbidden_endpoint'],
  ])('%s is 400 %s (field url) and the node keeps no endpoint', async (_what, host, code) => {
    const r = await t.req(agent, 'PUT', '/v1/nodes/sly/endpoint', { url: url(host) });
    expect({ status: r.status, code: r.json?.error?.code, field: r.json?.error?.field }).toEqual({
      status: 400,
      code,
      field: 'url',
    });
    // the push dialer was never told of it
    expect(t.push.endpoints.filter((e) => e.node === 'sly').map((e) => e.url)).not.toContain(url(host));
  });

  it('loopback from the same certificate is accepted', async () => {
    const r = await t.req(agent, 'PUT', '/v1/nodes/sly/endpoint', { url: url('127.0.0.1') });
    expect(r.status).toBe(200);
    expect(r.json.endpoint).toBe(url('127.0.0.1'));
  });
});
