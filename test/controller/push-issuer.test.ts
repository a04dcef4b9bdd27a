/**
 * The push dialer and agent listeners whose certificates a Herald issuer made (docs/adding-nodes.md), over
 * real TLS 1.3 on 127.0.0.1: the real agent listener serves leaf + issuer, the dialer's identity
 * check accepts it, refuses one made by an intermediate that is not a Herald issuer, and closes the live
 * connection when the issuer is revoked.
 */
import { nextPushEvent } from '../helpers/push-events.js';
import fs from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { pkiPaths } from '../../certs/paths.js';
import { issueIssuer, issueWithIssuer, makeCertificate, revoke, type Pem } from '../../certs/pki.js';
import type { PkiMaterial } from '../../certs/tls.js';
import { PushDialer } from '../../controller/push/dialer.js';
import { CONTROLLER_ID, makePushPki, TD, TestWakeListener, type PushPki } from '../helpers/wake-listener.js';

let pki: PushPki;
let issuer: Pem;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki([]);
  const r = await issueIssuer({ dir: pki.dir, name: 'i1' });
  issuer = { cert: fs.readFileSync(r.certPath, 'utf8'), key: fs.readFileSync(r.keyPath, 'utf8') };
}, 60_000);

afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});

afterAll(() => pki?.cleanup());

/**
 * Writes `agent/<file>.crt/.key` as leaf + signer: made by issueWithIssuer (`agent`), or by
 * makeCertificate as `agent/<name>` under any signer (`agent-raw`).
 */
function writeIssued(file: string, by: Pem, how: 'agent' | 'agent-raw' = 'agent', name = file): void {
  const p = pkiPaths(pki.dir);
  const made =
    how === 'agent'
      ? (() => {
          const m = issueWithIssuer({ issuer: by, role: 'agent', name, ip: ['127.0.0.1'] });
          return { cert: m.chain, key: m.key };
        })()
      : (() => {
          const m = makeCertificate({
            issuer: by,
            uris: [`spiffe://${TD}/agent/${name}`],
            ip: ['127.0.0.1'],
            eku: { serverAuth: true, clientAuth: true },
          });
          return { cert: `${m.cert}${by.cert}`, key: m.key };
        })();
  fs.writeFileSync(p.key('agent', file), made.key, { mode: 0o600 });
  fs.writeFileSync(p.cert('agent', file), made.cert);
}

function dialer(material: PkiMaterial): PushDialer {
  const d = new PushDialer({
    signer: pki.signer(),
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material,
    logger: pki.logger,
    backoffBaseMs: 5_000,
    backoffMaxMs: 5_000,
  });
  open.push(d);
  return d;
}

async function listener(node: string): Promise<TestWakeListener> {
  const l = await TestWakeListener.start({ pkiDir: pki.dir, node });
  open.push(l);
  return l;
}

const next = nextPushEvent;

describe('push dialer and an issuer', () => {
  it('connects to an agent listener whose certificate the issuer made, and wakes it', async () => {
    writeIssued('ni1', issuer);
    const l = await listener('ni1');
    const d = dialer(pki.controllerMaterial());
    const acked = next(d, 'ack', (e) => e.node === 'ni1');
    await d.start([{ node: 'ni1', url: l.url, generation: 3, ackedGeneration: 2 }]);
    await acked;
    expect(l.wakes).toHaveLength(1);
    expect(d.state('ni1')).toMatchObject({ state: 'connected', last_error: null });
  });

  it('refuses a listener whose certificate an intermediate that is not a Herald issuer made (bad_issuer) and sends it nothing', async () => {
    const p = pkiPaths(pki.dir);
    const root = { cert: fs.readFileSync(p.caCrt, 'utf8'), key: fs.readFileSync(p.caKey, 'utf8') };
    const bare = makeCertificate({ issuer: root, uris: [], eku: {}, ca: { pathLen: 0 } });
    writeIssued('ni2', { cert: bare.cert, key: bare.key }, 'agent-raw', 'ni2');
    const l = await listener('ni2');
    const d = dialer(pki.controllerMaterial());
    const failed = next(d, 'state', (n, s) => n === 'ni2' && s.state === 'disconnected');
    await d.start([{ node: 'ni2', url: l.url, generation: 2, ackedGeneration: 1 }]);
    const [, s] = await failed;
    expect(s.last_error).toBe('bad_issuer');
    expect(l.connections).toBe(0);
    expect(l.wakes).toHaveLength(0);
  });

  it('closes the live push connection when the issuer is revoked (revoked)', async () => {
    const r = await issueIssuer({ dir: pki.dir, name: 'r1' });
    const r1 = { cert: fs.readFileSync(r.certPath, 'utf8'), key: fs.readFileSync(r.keyPath, 'utf8') };
    writeIssued('ni3', r1);
    const l = await listener('ni3');
    const m = pki.controllerMaterial();
    const d = dialer(m);
    const acked = next(d, 'ack', (e) => e.node === 'ni3');
    await d.start([{ node: 'ni3', url: l.url, generation: 3, ackedGeneration: 2 }]);
    await acked;
    const down = next(d, 'state', (n, s) => n === 'ni3' && !s.connected);
    await revoke({ dir: pki.dir, target: 'issuer/r1' });
    expect(m.reload().revoked).toBe(true);
    const [, s] = await down;
    expect(s.last_error).toBe('revoked');
  });
});
