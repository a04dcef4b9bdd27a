/**
 * TLS session resumption on the push connections (reconnect storms): the dialer keeps
 * the sessions the agents' listeners give it, in a file too, so a controller started again after
 * a crash resumes instead of making a full mutual handshake with every agent. Real listeners on
 * 127.0.0.1, certificates made by certs/ for the run; every wait is for an event, with a bound.
 *
 * What must hold:
 * - a dialer started on the session file of an earlier one (no clean shutdown of it) resumes, and
 *   the resumed connection carries wake-ups; without the file it makes a full handshake;
 * - an agent certificate revoked since: its session is not offered, and the dial is refused `revoked`;
 * - a controller certificate revoked since: the agent refuses the resumed connection (403 `revoked`),
 *   and the dialler forgets that session (its next try is a full handshake);
 * - a file made under the controller's certificate before a renewal is not used;
 * - a session file group or others may read is removed unread, and the dial makes a full handshake.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PushDialer, type PushDialerOptions } from '../../controller/push/dialer.js';
import { pkiPaths } from '../../certs/paths.js';
import { normalizeSerial } from '../../certs/identity.js';
import { issueCert } from '../../certs/pki.js';
import { nextPushEvent } from '../helpers/push-events.js';
import { CONTROLLER_ID, makePushPki, TD, TestWakeListener, type PushPki } from '../helpers/wake-listener.js';

let pki: PushPki;
let tmp: string;
const open: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  pki = await makePushPki(['r1', 'r2', 'r3', 'r4', 'r5', 'r6']);
  tmp = fs.mkdtempSync(path.join(pki.dir, 'sessions-'));
}, 60_000);

afterEach(async () => {
  await Promise.all(open.splice(0).map((x) => x.close()));
});

afterAll(() => pki?.cleanup());

function dialer(sessionFile: string | undefined, over: Partial<PushDialerOptions> = {}): PushDialer {
  const d = new PushDialer({
    signer: pki.signer(),
    issuer: CONTROLLER_ID,
    trustDomain: TD,
    material: pki.controllerMaterial(),
    logger: pki.logger,
    backoffBaseMs: 50,
    backoffMaxMs: 200,
    ...(sessionFile === undefined ? {} : { sessionFile }),
    ...over,
  });
  open.push(d);
  return d;
}

async function listener(node: string): Promise<TestWakeListener> {
  const l = await TestWakeListener.start({ pkiDir: pki.dir, node });
  open.push(l);
  return l;
}

/** Starts `d` with `l`'s node behind, and waits for the ping wake-up's ack. */
async function connect(d: PushDialer, l: TestWakeListener, gen: number): Promise<void> {
  const acked = nextPushEvent(d, 'ack', (e) => e.node === l.node && e.gen === gen);
  await d.start([{ node: l.node, url: l.url, generation: gen, ackedGeneration: gen - 1 }]);
  await acked;
}

/** Waits until the file holds a session line for `node` (a ticket arrives just after the handshake). */
async function sessionKept(file: string, node: string): Promise<void> {
  const t0 = Date.now();
  while (!(fs.existsSync(file) && fs.readFileSync(file, 'utf8').includes(`"k":"${node}"`))) {
    if (Date.now() - t0 > 5_000) throw new Error(`no session for ${node} in ${file} within 5 s`);
    await new Promise((r) => setImmediate(r));
  }
}

function revokeSerialOf(certFile: string): () => void {
  const file = pkiPaths(pki.dir).revoked;
  const before = fs.readFileSync(file, 'utf8');
  const list = JSON.parse(before) as { serials: string[] };
  list.serials.push(normalizeSerial(new crypto.X509Certificate(fs.readFileSync(certFile)).serialNumber));
  fs.writeFileSync(`${file}.tmp`, JSON.stringify(list));
  fs.renameSync(`${file}.tmp`, file);
  return () => fs.writeFileSync(file, before);
}

describe('push TLS session resumption', () => {
  it('a dialer started on the session file of an earlier one resumes, and its wake-ups are answered', async () => {
    const file = path.join(tmp, 'restart');
    const l = await listener('r1');
    const first = dialer(file);
    await connect(first, l, 5);
    await sessionKept(file, 'r1');
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    // no clean shutdown of the first: the second takes over its node, as after a kill -9
    const second = dialer(file);
    await connect(second, l, 6);
    expect(l.resumed).toEqual([false, true]);
    const ack = nextPushEvent(second, 'ack', (e) => e.gen === 7);
    second.notify('r1', 7, 'deployment');
    const [ev] = await ack;
    expect(ev.fetch).toBe('started');
    expect(second.state('r1')).toMatchObject({ state: 'connected', generation_acked: 7 });
  });

  it('without a session file a new dialer makes a full handshake', async () => {
    const l = await listener('r2');
    await connect(dialer(undefined), l, 1);
    await connect(dialer(undefined), l, 2);
    expect(l.resumed).toEqual([false, false]);
  });

  it("an agent certificate revoked since its session was kept: the session is not offered, the dial is refused 'revoked'", async () => {
    const file = path.join(tmp, 'revoked-agent');
    const l = await listener('r3');
    await connect(dialer(file), l, 1);
    await sessionKept(file, 'r3');
    const undo = revokeSerialOf(pkiPaths(pki.dir).cert('agent', 'r3'));
    try {
      const d = dialer(file);
      const down = nextPushEvent(d, 'state', (n, s) => n === 'r3' && s.last_error !== null);
      await d.start([{ node: 'r3', url: l.url, generation: 2, ackedGeneration: 1 }]);
      const [, s] = await down;
      expect(s.last_error).toBe('revoked');
      expect(l.resumed).toEqual([false]);
    } finally {
      undo();
    }
  });

  it("a controller certificate revoked since: the agent refuses the resumed connection (403 'revoked')", async () => {
    const file = path.join(tmp, 'revoked-controller');
    const l = await listener('r4');
    const first = dialer(file);
    await connect(first, l, 1);
    await sessionKept(file, 'r4');
    await first.close(); // (else its own re-dial after the agent closes it counts here too)
    const undo = revokeSerialOf(pkiPaths(pki.dir).cert('controller', 'controller'));
    try {
      // the agent reads the new revoked.json; the dialer's own material is left as it was
      expect(l.material.reload().revoked).toBe(true);
      const refused = l.waitFor<string>('refused', (code) => code === 'revoked');
      const d = dialer(file);
      await d.start([{ node: 'r4', url: l.url, generation: 2, ackedGeneration: 1 }]);
      await refused;
      expect(l.resumedRefusals).toEqual(['revoked']);
      // the refused session is forgotten: the dialler's next try is a full handshake, not the same session again
      await l.waitFor<string>('refused', (code) => code === 'revoked');
      expect(l.resumedRefusals).toEqual(['revoked']);
      expect(l.resumed).toEqual([false]);
    } finally {
      undo();
      l.material.reload();
    }
  });

  it('a session file made under the controller certificate before a renewal is not used: a full handshake, then resumption again', async () => {
    const file = path.join(tmp, 'renewed');
    const l = await listener('r6');
    // each dialler stopped before the next starts, as a controller restarted
    const first = dialer(file);
    await connect(first, l, 1);
    await sessionKept(file, 'r6');
    await first.close();
    // the controller's certificate renewed while it was stopped (same key, same CA)
    const keyPem = fs.readFileSync(pkiPaths(pki.dir).key('controller', 'controller'), 'utf8');
    await issueCert({ dir: pki.dir, role: 'controller', name: 'controller', keyPem });
    const second = dialer(file);
    await connect(second, l, 2);
    await sessionKept(file, 'r6');
    await second.close();
    await connect(dialer(file), l, 3);
    expect(l.resumed).toEqual([false, false, true]);
  });

  it('a session file that group or others may read is removed unread, and the dial makes a full handshake', async () => {
    const file = path.join(tmp, 'loose');
    const l = await listener('r5');
    await connect(dialer(file), l, 1);
    await sessionKept(file, 'r5');
    fs.chmodSync(file, 0o644);
    await connect(dialer(file), l, 2);
    expect(l.resumed).toEqual([false, false]);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
  });
});
