/**
 * The push dialer checks, by protocol/address.ts's rules, every address an endpoint's DNS name
 * resolves to, and an IP literal stored before the rules, before any socket connects (docs/api.md,
 * agent routes). The resolver is injected (the dialer's `lookup` option); the listeners are real
 * TLS on 127.0.0.1. Every wait is for an event, with a bound.
 */
import { once } from 'node:events';
import net from 'node:net';
import type dns from 'node:dns';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PushDialer, type DialLookup, type PushDialerOptions } from '../../controller/push/dialer.js';
import type { PushEvents, PushState } from '../../controller/push/types.js';
import { CONTROLLER_ID, makePushPki, TD, TestWakeListener, type PushPki } from '../helpers/wake-listener.js';

let pki: PushPki;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki(['n1', 'n2']);
}, 60_000);

afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});

afterAll(() => pki?.cleanup());

function dialer(over: Partial<PushDialerOptions>): PushDialer {
  const d = new PushDialer({
    signer: pki.signer(),
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: pki.controllerMaterial(),
    logger: pki.logger,
    backoffBaseMs: 50,
    backoffMaxMs: 200,
    ...over,
  });
  open.push(d);
  return d;
}

/** A fake resolver: each name's answers, and every name it was asked for. */
function resolver(answers: Record<string, string[]>): { lookup: DialLookup; asked: string[] } {
  const asked: string[] = [];
  const lookup: DialLookup = (hostname, _options, callback) => {
    asked.push(hostname);
    const list: dns.LookupAddress[] = (answers[hostname] ?? []).map((address) => ({
      address,
      family: net.isIP(address),
    }));
    setImmediate(() => callback(null, list));
  };
  return { lookup, asked };
}

/** A plain TCP server on 127.0.0.1 that only counts the connections it gets. */
async function countingServer(): Promise<{ port: number; connections: () => number; close(): Promise<void> }> {
  let n = 0;
  const sockets = new Set<net.Socket>();
  const s = net.createServer((sock) => {
    n++;
    sockets.add(sock);
    sock.destroy();
  });
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  const handle = {
    port: (s.address() as net.AddressInfo).port,
    connections: () => n,
    close: () => new Promise<void>((r) => s.close(() => r())),
  };
  open.push(handle);
  return handle;
}

function nextState(
  d: PushDialer,
  node: string,
  pred: (s: PushState) => boolean,
  timeoutMs = 5_000,
): Promise<PushState> {
  return new Promise((resolve, reject) => {
    const fn = ((n: string, s: PushState) => {
      if (n !== node || !pred(s)) return;
      clearTimeout(timer);
      d.off('state', fn);
      resolve(s);
    }) as PushEvents['state'];
    const timer = setTimeout(() => {
      d.off('state', fn);
      reject(new Error(`no matching state of ${node} within ${timeoutMs} ms`));
    }, timeoutMs);
    d.on('state', fn);
  });
}

describe('push dialer: the address check at dial time', { timeout: 20_000 }, () => {
  it('dials a DNS-named endpoint at the one address it resolved and checked (loopback is allowed), resolving once per dial', async () => {
    const l = await TestWakeListener.start({ pkiDir: pki.dir, node: 'n1' });
    open.push(l);
    const r = resolver({ 'agent-n1.test': ['127.0.0.1'] });
    const d = dialer({ lookup: r.lookup });
    const acked = new Promise<void>((resolve) => d.on('ack', (e) => e.node === 'n1' && resolve()));
    await d.start([{ node: 'n1', url: `wss://agent-n1.test:${l.port}/v1/wake`, generation: 3, ackedGeneration: 2 }]);
    await acked;
    expect(r.asked).toEqual(['agent-n1.test']);
    expect(l.wakes[0]!.claims).toMatchObject({ gen: 3 });
  });

  const refusedAnswers: Array<[string, string[], string]> = [
    ['the AWS/GCP/Azure metadata address', ['169.254.169.254'], 'link_local_endpoint'],
    ['a link-local IPv6 address', ['fe80::1'], 'link_local_endpoint'],
    ['the AWS IPv6 metadata address', ['fd00:ec2::254'], 'forbidden_endpoint'],
    ['the Alibaba metadata address', ['100.100.100.200'], 'forbidden_endpoint'],
    ['the Azure wire server', ['168.63.129.16'], 'forbidden_endpoint'],
    ['the metadata address as NAT64', ['64:ff9b::a9fe:a9fe'], 'link_local_endpoint'],
    ['the unspecified address', ['0.0.0.0'], 'bad_endpoint'],
    // a name that also resolves to an allowed address is still refused: the socket could use either
    ['loopback and the metadata address together', ['127.0.0.1', '169.254.169.254'], 'link_local_endpoint'],
  ];
  it.each(refusedAnswers)(
    'a DNS name resolving to %s is never dialled: last_error %s',
    async (_what, addresses, code) => {
      const srv = await countingServer();
      const r = resolver({ 'evil.test': addresses });
      const d = dialer({ lookup: r.lookup });
      const failed = nextState(d, 'n2', (s) => s.last_error !== null);
      await d.start([{ node: 'n2', url: `wss://evil.test:${srv.port}/v1/wake`, generation: 1, ackedGeneration: 0 }]);
      const s = await failed;
      expect(s.last_error).toBe(code);
      expect(s.connected).toBe(false);
      expect(r.asked[0]).toBe('evil.test');
      // the loopback answer pointed at a live port: nothing connected to it
      expect(srv.connections()).toBe(0);
      expect(d.state('n2').last_error).toBe(code);
    },
  );

  it('an IP-literal endpoint stored before the rules (NAT64 form of the metadata address) is refused without a socket', async () => {
    const r = resolver({});
    const d = dialer({ lookup: r.lookup });
    const failed = nextState(d, 'n2', (s) => s.last_error !== null);
    await d.start([{ node: 'n2', url: 'wss://[64:ff9b::a9fe:a9fe]:7443/v1/wake', generation: 1, ackedGeneration: 0 }]);
    expect((await failed).last_error).toBe('link_local_endpoint');
    expect(r.asked).toEqual([]);
  });
});
