/**
 * Connections without a client certificate are admitted before any work, and a lost enrolment
 * answer is recoverable, with real processes (`bin/herald controller --issuer`, `herald agent
 * enroll`) over real TLS on loopback addresses of several networks (127.0.x.y): one address
 * cannot hold the pre-authentication pool, an enrolment past the pool's cap is never read (its
 * token stays usable), and `herald agent enroll` whose answer is cut off on the way tries again
 * with the same key and gets the same certificate, printing no stack trace.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeCsr } from '../../certs/csr.js';
import { identityOf } from '../../certs/identity.js';
import { newRsaKeyPem } from '../../certs/pki.js';
import {
  API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS,
  API_UNAUTHENTICATED_MAX_CONNECTIONS,
  API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS,
} from '../../protocol/limits.js';
import { makeEnrolBed, type EnrolBed } from '../helpers/enrollment.js';
import { api, isBuilt, startHerald, stopProc, waitFor, type Cred, type Proc } from '../helpers/procs.js';
import { TcpProxy } from '../helpers/tcp-proxy.js';

const built = isBuilt();
let e: EnrolBed;
let work: string;
let op: Cred;
let ca: Buffer;
let port: number;
let ctl: Proc;
let runs = 0;

/** A connection without a certificate from `from`, kept from going idle by a request that never ends. */
interface Held {
  closed: boolean;
  close(): void;
}

function hold(from: string): Promise<Held> {
  return new Promise((resolve) => {
    const h: Held = { closed: false, close: () => s.destroy() };
    const s = tls.connect({
      socket: net.connect({ host: '127.0.0.1', port, localAddress: from }),
      servername: 'localhost',
      ca,
    });
    // headers, one line a second: a request begun and never finished is not idle
    let trickle: NodeJS.Timeout | undefined;
    s.once('secureConnect', () => {
      s.write('POST /v1/enroll HTTP/1.1\r\nHost: localhost\r\n');
      trickle = setInterval(() => s.write('X-Hold: 1\r\n'), 1_000);
      resolve(h);
    });
    s.on('error', () => {});
    s.once('close', () => {
      h.closed = true;
      clearInterval(trickle);
      resolve(h);
    });
  });
}

/**
 * A connection without a certificate from `from` that sends its request's headers one byte a
 * second and never finishes them: an inactivity timer never fires on it.
 */
function trickle(from: string): Promise<Held> {
  return new Promise((resolve) => {
    const h: Held = { closed: false, close: () => s.destroy() };
    const s = tls.connect({
      socket: net.connect({ host: '127.0.0.1', port, localAddress: from }),
      servername: 'localhost',
      ca,
    });
    let timer: NodeJS.Timeout | undefined;
    s.once('secureConnect', () => {
      s.write('POST /v1/enroll HTTP/1.1\r\nHost: localhost\r\nX-Slow: ');
      timer = setInterval(() => s.write('a'), 1_000);
      resolve(h);
    });
    s.on('error', () => {});
    s.once('close', () => {
      h.closed = true;
      clearInterval(timer);
      resolve(h);
    });
  });
}

function refusals(metrics: string, code: string): number {
  return Number(new RegExp(`herald_api_refusals_total\\{code="${code}"\\} (\\d+)`).exec(metrics)?.[1] ?? 0);
}

/** The body of `POST /v1/enroll` for `node` with a fresh key. */
function enrollBody(token: string, node: string): string {
  const key = newRsaKeyPem();
  return JSON.stringify({
    token,
    node,
    csr: makeCsr({ keyPem: key, commonName: node, uris: [`spiffe://herald.local/agent/${node}`] }),
  });
}

async function holdMany(addresses: string[]): Promise<Held[]> {
  const held: Held[] = [];
  for (const a of addresses) held.push(await hold(a));
  return held;
}

function newToken(node: string): Promise<string> {
  return api(port, op, 'POST', '/v1/enrollment-tokens', { node }).then((r) => {
    expect(r.status).toBe(201);
    return r.json.token as string;
  });
}

async function tokenState(node: string): Promise<string> {
  const r = await api(port, op, 'GET', '/v1/enrollment-tokens');
  return (r.json.items as Array<{ node: string; state: string }>).find((t) => t.node === node)!.state;
}

/** `POST /v1/enroll` from `from`: the status, or 0 when the connection ended without one. */
function enrollFrom(from: string, token: string, node: string): Promise<{ status: number; code?: string }> {
  const body = enrollBody(token, node);
  return new Promise((resolve) => {
    const q = https.request(
      {
        host: '127.0.0.1',
        port,
        localAddress: from,
        method: 'POST',
        path: '/v1/enroll',
        ca,
        servername: 'localhost',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) },
      },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, code: text ? JSON.parse(text).error?.code : undefined }),
        );
        res.on('error', () => resolve({ status: 0 }));
      },
    );
    q.on('error', () => resolve({ status: 0 }));
    q.end(body);
  });
}

/** `herald agent enroll` run to its end (not blocking this process: a proxy may run here). */
async function enrollCli(node: string, token: string, url: string): Promise<{ code: number | null; out: string }> {
  const p = startHerald(`enroll-${runs++}`, e.enrollArgs(node, token, path.join(work, `node-${node}`), { url }), work);
  await p.exited;
  return { code: p.child.exitCode, out: p.log() };
}

function logEvents(event: string, node: string): Array<Record<string, unknown>> {
  return ctl
    .log()
    .split('\n')
    .filter((l) => l.includes(`"${event}"`))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((l) => l.node === node);
}

describe.skipIf(!built)('enrolment admission and lost answers with real processes', { timeout: 120_000 }, () => {
  beforeAll(async () => {
    e = await makeEnrolBed({
      prefix: 'herald-enroll-admission-',
      controllerArgs: ['--push-workers', '0', '--issuer', 'i1'],
    });
    ({ work, op, ca, port, ctl } = e);
  });

  afterAll(async () => {
    await stopProc(ctl).catch(() => {});
    await e?.close();
  });

  it('one address holds at most API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS (8) connections: 64 from one address do not block herald agent enroll from another', async () => {
    const held = await holdMany(Array(API_UNAUTHENTICATED_MAX_CONNECTIONS).fill('127.0.0.2'));
    try {
      const excess = API_UNAUTHENTICATED_MAX_CONNECTIONS - API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS;
      await waitFor(
        'the connections past the address cap to be closed',
        () => held.filter((h) => h.closed).length >= excess,
      );
      expect(held.filter((h) => !h.closed)).toHaveLength(API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS);
      const r = await enrollCli('a1', await newToken('a1'), `https://127.0.0.1:${port}`);
      expect(r.code, r.out).toBe(0);
      expect(await tokenState('a1')).toBe('used');
      // the controller counted them by their code
      const m = await api(port, op, 'GET', '/metrics');
      expect(
        Number(/herald_api_refusals_total\{code="too_many_connections"\} (\d+)/.exec(m.raw)?.[1]),
      ).toBeGreaterThanOrEqual(excess);
    } finally {
      for (const h of held) h.close();
    }
  });

  it('one /24 holds at most API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS (16); another network still enrols', async () => {
    const perAddress = API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS;
    const addresses = Array.from({ length: API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS / perAddress }, (_, i) =>
      Array(perAddress).fill(`127.0.5.${i + 1}`),
    ).flat();
    const held = await holdMany(addresses);
    try {
      const token = await newToken('p1');
      // a new address of the same network: refused before its request is read
      expect(await enrollFrom('127.0.5.200', token, 'p1')).toEqual({ status: 0 });
      expect(await tokenState('p1')).toBe('active');
      expect(await enrollFrom('127.0.6.1', token, 'p1')).toEqual({ status: 200, code: undefined });
    } finally {
      for (const h of held) h.close();
    }
  });

  it('past API_UNAUTHENTICATED_MAX_CONNECTIONS (64) in all, an enrolment is refused before its request is read: its token is not spent, and enrols once a place is free', async () => {
    // 64 from four networks, two addresses each: inside every per-address and per-network cap
    const addresses: string[] = [];
    for (let net = 10; addresses.length < API_UNAUTHENTICATED_MAX_CONNECTIONS; net++)
      for (const host of [1, 2])
        addresses.push(...Array(API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS).fill(`127.0.${net}.${host}`));
    const held = await holdMany(addresses);
    const token = await newToken('c65');
    try {
      expect(held.filter((h) => h.closed)).toHaveLength(0);
      expect(await enrollFrom('127.0.20.1', token, 'c65')).toEqual({ status: 0 });
      expect(await tokenState('c65')).toBe('active');
      expect(logEvents('enroll.issued', 'c65')).toHaveLength(0);
      expect(logEvents('enroll.refused', 'c65')).toHaveLength(0);
    } finally {
      for (const h of held) h.close();
    }
    // the controller frees their places as it sees them close: tried until then, with no effect
    const r = await waitFor('a place in the pool', async () => {
      const r = await enrollFrom('127.0.20.1', token, 'c65');
      return r.status === 0 ? undefined : r;
    });
    expect(r).toEqual({ status: 200, code: undefined });
    expect(await tokenState('c65')).toBe('used');
  });

  it('connections trickling a header byte a second fill the pool and are closed at the headers deadline (headers_timeout): herald agent enroll from another network, started meanwhile, enrols', async () => {
    const before = refusals((await api(port, op, 'GET', '/metrics')).raw, 'headers_timeout');
    // the whole pool, from four networks, inside every per-host and per-network cap
    const addresses: string[] = [];
    for (let net = 40; addresses.length < API_UNAUTHENTICATED_MAX_CONNECTIONS; net++)
      for (const host of [1, 2])
        addresses.push(...Array(API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS).fill(`127.0.${net}.${host}`));
    const held = await Promise.all(addresses.map(trickle));
    try {
      expect(held.filter((h) => h.closed)).toHaveLength(0);
      const run = enrollCli('t1', await newToken('t1'), `https://127.0.0.1:${port}`);
      await waitFor('every trickling connection to be closed', () => held.every((h) => h.closed), 15_000, 100);
      const m = (await api(port, op, 'GET', '/metrics')).raw;
      expect(refusals(m, 'headers_timeout') - before).toBeGreaterThanOrEqual(API_UNAUTHENTICATED_MAX_CONNECTIONS);
      const r = await run;
      expect(r.code, r.out).toBe(0);
      // it was kept out while the pool was full, and tried again
      expect(r.out).toMatch(/herald: enrolment try 1 failed \(connection_reset\)/);
      expect(await tokenState('t1')).toBe('used');
    } finally {
      for (const h of held) h.close();
    }
  });

  it('a connection without a certificate runs one request: of three pipelined enrolments with three tokens one is run, the other two tokens stay usable', async () => {
    const nodes = ['pl1', 'pl2', 'pl3'];
    const tokens = await Promise.all(nodes.map((n) => newToken(n)));
    const before = refusals((await api(port, op, 'GET', '/metrics')).raw, 'pipelined_request');
    const requests = nodes.map((n, i) => {
      const body = enrollBody(tokens[i]!, n);
      return `POST /v1/enroll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    });
    const answer = await new Promise<string>((resolve) => {
      const s = tls.connect({
        socket: net.connect({ host: '127.0.0.1', port, localAddress: '127.0.30.1' }),
        servername: 'localhost',
        ca,
      });
      let text = '';
      s.once('secureConnect', () => s.write(requests.join('')));
      s.on('data', (c: Buffer) => (text += c.toString()));
      s.on('error', () => {});
      s.once('close', () => resolve(text));
    });
    expect(answer.match(/^HTTP\/1\.1 /gm)).toHaveLength(1);
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    expect([await tokenState('pl1'), await tokenState('pl2'), await tokenState('pl3')]).toEqual([
      'used',
      'active',
      'active',
    ]);
    expect(logEvents('enroll.issued', 'pl2')).toHaveLength(0);
    expect(logEvents('enroll.refused', 'pl3')).toHaveLength(0);
    const m = (await api(port, op, 'GET', '/metrics')).raw;
    expect(refusals(m, 'pipelined_request') - before).toBeGreaterThanOrEqual(1);
    // the tokens not run are still good
    expect(await enrollFrom('127.0.30.2', tokens[1]!, 'pl2')).toEqual({ status: 200, code: undefined });
    expect(await enrollFrom('127.0.30.2', tokens[2]!, 'pl3')).toEqual({ status: 200, code: undefined });
  });

  it('herald agent enroll whose answer is lost on the way tries again with the same key and gets the same certificate, without a stack trace', async () => {
    const proxy = await new TcpProxy(port).start();
    try {
      const token = await newToken('lost1');
      const lost = proxy.loseNextAnswer();
      const run = enrollCli('lost1', token, proxy.url);
      const cut = await lost;
      // the controller has spent the token and issued the certificate: now the answer is lost
      await waitFor('the certificate to be issued', () => logEvents('enroll.issued', 'lost1').length === 1);
      cut();
      const r = await run;
      expect(r.code, r.out).toBe(0);
      expect(r.out).toMatch(
        /herald: enrolment try 1 failed \(connection_reset\); trying again in [\d.]+ s \(\d+ s of retries left\)/,
      );
      expect(r.out).not.toMatch(/\n\s+at /);
      // one certificate was issued, and given again to the same key
      expect(logEvents('enroll.issued', 'lost1')).toHaveLength(1);
      expect(logEvents('enroll.replayed', 'lost1')).toHaveLength(1);
      // the replay names the token it gave the answer of again
      expect(logEvents('enroll.replayed', 'lost1')[0]!.token).toBe(logEvents('enroll.issued', 'lost1')[0]!.token);
      expect(logEvents('enroll.replayed', 'lost1')[0]!.token).toEqual(expect.any(String));
      const dir = path.join(work, 'node-lost1', 'agent');
      const cert = new crypto.X509Certificate(fs.readFileSync(path.join(dir, 'lost1.crt')));
      expect(cert.checkPrivateKey(crypto.createPrivateKey(fs.readFileSync(path.join(dir, 'lost1.key'))))).toBe(true);
      expect(identityOf(fs.readFileSync(path.join(dir, 'lost1.crt')), 'herald.local').spiffeId).toBe(
        'spiffe://herald.local/agent/lost1',
      );
    } finally {
      await proxy.stop();
    }
  });

  it('a later run of herald agent enroll, after one that got no answer, asks with the key that run left and gets the same certificate; a new key is refused', async () => {
    const token = await newToken('again1');
    const dir = path.join(work, 'node-again1', 'agent');
    const first = await enrollCli('again1', token, `https://127.0.0.1:${port}`);
    expect(first.code, first.out).toBe(0);
    expect(fs.existsSync(path.join(dir, 'again1.key.enrolling')), 'the pending key is removed').toBe(false);
    const key = fs.readFileSync(path.join(dir, 'again1.key'));
    const serial = new crypto.X509Certificate(fs.readFileSync(path.join(dir, 'again1.crt'))).serialNumber;
    // as if the answer had been lost and the command had given up: only its pending key is left
    fs.rmSync(path.join(dir, 'again1.crt'));
    fs.rmSync(path.join(dir, 'again1.key'));
    fs.writeFileSync(path.join(dir, 'again1.key.enrolling'), key, { mode: 0o600 });
    const again = await enrollCli('again1', token, `https://127.0.0.1:${port}`);
    expect(again.code, again.out).toBe(0);
    expect(new crypto.X509Certificate(fs.readFileSync(path.join(dir, 'again1.crt'))).serialNumber).toBe(serial);
    expect(fs.readFileSync(path.join(dir, 'again1.key'))).toEqual(key);
    expect(fs.statSync(path.join(dir, 'again1.key')).mode & 0o777).toBe(0o600);
    expect(fs.existsSync(path.join(dir, 'again1.key.enrolling'))).toBe(false);
    expect(logEvents('enroll.replayed', 'again1')).toHaveLength(1);
    // control: without that key, a new one is refused (the token is spent)
    fs.rmSync(path.join(work, 'node-again1'), { recursive: true });
    const fresh = await enrollCli('again1', token, `https://127.0.0.1:${port}`);
    expect(fresh.code).not.toBe(0);
    expect(fresh.out).toMatch(/herald: enrollment_refused: /);
  });
});
