/**
 * The enrolment methods of the Store interface (docs/adding-nodes.md), run against both stores: SqliteStore
 * on `:memory:` and PgStore on a fresh database of a throwaway PostgreSQL. What each must do is
 * the interface's contract (controller/store/store.ts): a token kept by its hash, listed, revoked
 * once, consumed at most once and only when unused, unrevoked, unexpired and for its node (the
 * refusal reasons in that order); a node's certificate seen or issued, and its renewal failures.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PgStore } from '../../controller/store/pg/store.js';
import { SqliteStore } from '../../controller/store/sqlite/store.js';
import type { Store } from '../../controller/store/store.js';
import { rejectedCode } from '../helpers/controller-codes.js';
import { startPg, type PgServer } from '../helpers/pg.js';

const WHO = 'spiffe://herald.local/operator/admin';
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
async function openKind(kind: Kind): Promise<Store> {
  const s =
    kind === 'sqlite'
      ? new SqliteStore(':memory:')
      : await PgStore.open(await pg!.createDatabase(), { controller: 'c1' });
  stores.push(s);
  return s;
}
const inOneHour = (): string => new Date(Date.now() + 3_600_000).toISOString();
const token = (id: string, node: string, expiresAt = inOneHour()) => ({
  id,
  tokenHash: `hash-${id}`,
  node,
  dns: ['n.example'],
  ips: ['10.0.0.5'],
  expiresAt,
});

describe.each<Kind>(['sqlite', 'postgres'])('the enrolment store (%s)', (kind) => {
  it('keeps a token by its hash, lists it without the hash, revokes it once, each change audited', async () => {
    const s = await openKind(kind);
    const made = await s.createEnrollmentToken(token('t1', 'n1'), WHO);
    expect(made).toMatchObject({ id: 't1', node: 'n1', dns: ['n.example'], ips: ['10.0.0.5'], createdBy: WHO });
    expect(made).toMatchObject({ usedAt: null, usedBy: null, revokedAt: null });
    const list = await s.listEnrollmentTokens();
    expect(list.map((t) => t.id)).toEqual(['t1']);
    expect(JSON.stringify(list)).not.toContain('hash-t1');
    const r1 = await s.revokeEnrollmentToken('t1', WHO);
    expect(r1.revokedAt).not.toBeNull();
    const r2 = await s.revokeEnrollmentToken('t1', WHO);
    expect(r2.revokedAt).toBe(r1.revokedAt);
    expect(await rejectedCode(s.revokeEnrollmentToken('nope', WHO))).toBe('not_found');
    const actions = (await s.listAudit()).map((a) => `${a.action} ${a.target}`);
    expect(actions.filter((a) => a === 'enrollment_token.revoke t1')).toHaveLength(1);
    expect(actions).toContain('enrollment_token.create t1');
  });

  it('consumes a token at most once, and says why it does not', async () => {
    const s = await openKind(kind);
    await s.createEnrollmentToken(token('ok', 'n1'), WHO);
    await s.createEnrollmentToken(token('old', 'n1', new Date(Date.now() - 1_000).toISOString()), WHO);
    await s.createEnrollmentToken(token('rv', 'n1'), WHO);
    await s.revokeEnrollmentToken('rv', WHO);
    expect(await s.consumeEnrollmentToken('hash-none', 'n1', 'x')).toEqual({ ok: false, reason: 'unknown' });
    expect(await s.consumeEnrollmentToken('hash-ok', 'n2', 'x')).toEqual({ ok: false, reason: 'wrong_node' });
    expect(await s.consumeEnrollmentToken('hash-old', 'n1', 'x')).toEqual({ ok: false, reason: 'expired' });
    expect(await s.consumeEnrollmentToken('hash-rv', 'n1', 'x')).toEqual({ ok: false, reason: 'revoked' });
    const racing = await Promise.all(
      [1, 2, 3].map(() => s.consumeEnrollmentToken('hash-ok', 'n1', 'agent n1 from 127.0.0.1')),
    );
    const won = racing.filter((r) => r.ok);
    expect(won).toHaveLength(1);
    expect(won[0]!.ok && won[0]!.token).toMatchObject({ id: 'ok', usedBy: 'agent n1 from 127.0.0.1' });
    expect(racing.filter((r) => !r.ok)).toEqual([
      { ok: false, reason: 'used' },
      { ok: false, reason: 'used' },
    ]);
    // a revoked token that was also used says revoked (the order of the reasons)
    await s.revokeEnrollmentToken('ok', WHO);
    expect(await s.consumeEnrollmentToken('hash-ok', 'n1', 'x')).toEqual({ ok: false, reason: 'revoked' });
    const audit = (await s.listAudit()).filter((a) => a.action === 'enrollment_token.use');
    expect(audit.map((a) => [a.target, a.who])).toEqual([['ok', 'agent n1 from 127.0.0.1']]);
  });

  it("records a node's certificate seen and issued, and counts its renewal failures", async () => {
    const s = await openKind(kind);
    expect(await s.getNodeCertificate('n1')).toBeUndefined();
    const seen = {
      serial: 'aa',
      notBefore: '2026-12-01T00:00:00.000Z',
      notAfter: '2026-12-08T00:00:00.000Z',
      issued: false,
    };
    await s.noteNodeCertificate('n1', seen, 'spiffe://herald.local/agent/n1');
    expect(await s.getNodeCertificate('n1')).toEqual({
      node: 'n1',
      serial: 'aa',
      notBefore: seen.notBefore,
      notAfter: seen.notAfter,
      issuedAt: null,
      renewalFailures: 0,
      lastRenewalError: null,
      lastRenewalAttemptAt: null,
    });
    await s.noteRenewalFailure('n1', 'enrollment_disabled', 0);
    await s.noteRenewalFailure('n1', 'bad_csr', 5);
    expect(await s.getNodeCertificate('n1')).toMatchObject({ renewalFailures: 5, lastRenewalError: 'bad_csr' });
    await s.noteRenewalFailure('n1', 'bad_csr', 2);
    expect((await s.getNodeCertificate('n1'))!.renewalFailures).toBe(6);
    // the same certificate seen again changes nothing; an issued one resets the failures
    await s.noteNodeCertificate('n1', seen, 'spiffe://herald.local/agent/n1');
    expect((await s.getNodeCertificate('n1'))!.renewalFailures).toBe(6);
    await s.noteNodeCertificate('n1', { ...seen, serial: 'bb', issued: true }, 'spiffe://herald.local/agent/n1');
    const issued = (await s.getNodeCertificate('n1'))!;
    expect(issued).toMatchObject({ serial: 'bb', renewalFailures: 0, lastRenewalError: null });
    expect(issued.issuedAt).not.toBeNull();
    expect((await s.listAudit()).some((a) => a.action === 'certificate.issue' && a.target === 'n1')).toBe(true);
    // a failure of a node without a row changes nothing
    await s.noteRenewalFailure('n9', 'bad_csr', 3);
    expect(await s.getNodeCertificate('n9')).toBeUndefined();
  });

  it("removes a node's certificate state with the node", async () => {
    const s = await openKind(kind);
    await s.createNode('n1', null, WHO);
    await s.noteNodeCertificate(
      'n1',
      { serial: 'aa', notBefore: '2026-12-01T00:00:00.000Z', notAfter: '2026-12-08T00:00:00.000Z', issued: true },
      WHO,
    );
    await s.deleteNode('n1', WHO);
    expect(await s.getNodeCertificate('n1')).toBeUndefined();
  });

  it('raises an identity floor and never lowers it, retires a renewed certificate once, and keeps the floor past the node', async () => {
    const s = await openKind(kind);
    await s.createNode('n1', null, WHO);
    const t = (m: number): string => new Date(Date.UTC(2026, 11, 1, 0, m)).toISOString();
    await s.raiseIdentityFloor('n1', t(10), { serial: 'bb', notBefore: t(20) }, 'renewal', WHO);
    expect(await s.listIdentityFloors()).toEqual([
      { node: 'n1', notBefore: t(10), renewedSerial: 'bb', renewedNotBefore: t(20) },
    ]);
    // a renewal from an older certificate cannot bring the floor down
    await s.raiseIdentityFloor('n1', t(5), { serial: 'cc', notBefore: t(30) }, 'renewal', WHO);
    expect((await s.listIdentityFloors())[0]).toMatchObject({ notBefore: t(10), renewedSerial: 'cc' });
    expect(await s.retireSupersededCertificates('n1', 'bb')).toBe(false);
    expect(await s.retireSupersededCertificates('n1', 'cc')).toBe(true);
    expect(await s.retireSupersededCertificates('n1', 'cc')).toBe(false);
    expect((await s.listIdentityFloors())[0]).toMatchObject({ notBefore: t(30), renewedSerial: null });
    // an operator's revocation is audited; the floor outlives the node
    await s.raiseIdentityFloor('n1', t(40), null, 'revoke', WHO);
    expect((await s.listAudit()).some((a) => a.action === 'node.revoke' && a.target === 'n1')).toBe(true);
    await s.deleteNode('n1', WHO);
    expect(await s.listIdentityFloors()).toEqual([
      { node: 'n1', notBefore: t(40), renewedSerial: null, renewedNotBefore: null },
    ]);
  });
});
