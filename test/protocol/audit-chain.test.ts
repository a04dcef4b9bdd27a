/**
 * The audit trail's hash chain and its verification (protocol/audit-chain.ts), on chains made
 * here row by row and then damaged the ways a writer of the database could: each problem is
 * named by its code at the row's seq.
 */
import { spawnSync } from 'node:child_process';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  AUDIT_CHECKPOINT_ACTION,
  AUDIT_GENESIS_HASH,
  AUDIT_PRUNE_ACTION,
  AuditVerifier,
  auditRowHash,
  canonicalJson,
  nextAuditRow,
  type AuditChainRow,
  type AuditReport,
} from '../../protocol/audit-chain.js';
import { AUDIT_CHECKPOINT_TYP, KeySet, Signer } from '../../protocol/jws.js';
import { makeSigningKey, type TestSigningKey } from '../helpers/signing-keys.js';

const TD = 'spiffe://herald.test';
let c1: TestSigningKey;
let c2: TestSigningKey;
let stranger: TestSigningKey;
let keys: KeySet;

beforeAll(async () => {
  c1 = await makeSigningKey();
  c2 = await makeSigningKey();
  stranger = await makeSigningKey();
  keys = new KeySet({
    keys: [
      { ...c1.pub, controller: 'c1' },
      { ...c2.pub, controller: 'c2' },
    ],
  });
});

type Head = { seq: number; hash: string };

/** Appends a plain row after `rows` (or the genesis). */
function add(rows: AuditChainRow[], action = 'node.create', over: Partial<AuditChainRow> = {}): AuditChainRow {
  const last = rows[rows.length - 1];
  const head: Head = last ? { seq: last.seq, hash: last.hash } : { seq: 0, hash: AUDIT_GENESIS_HASH };
  const r = nextAuditRow(head, {
    at: new Date(Date.UTC(2026, 0, 1, 0, 0, rows.length)).toISOString(),
    who: `${TD}/operator/admin`,
    action,
    target: `n${rows.length + 1}`,
    detail: canonicalJson({ n: rows.length + 1 }),
    outcome: 'ok',
    controller: 'c1',
    ...over,
  });
  rows.push(r);
  return r;
}

/** Appends a checkpoint row over the last row, signed by `key` as controller `name`. */
function checkpoint(rows: AuditChainRow[], key: TestSigningKey = c1, name = 'c1', iss = name): AuditChainRow {
  const last = rows[rows.length - 1]!;
  const jws = new Signer(key.priv).sign(AUDIT_CHECKPOINT_TYP, {
    iss: `${TD}/controller/${iss}`,
    seq: last.seq,
    hash: last.hash,
    iat: 1_800_000_000,
  });
  return add(rows, AUDIT_CHECKPOINT_ACTION, {
    who: `${TD}/controller/${name}`,
    target: 'audit',
    detail: canonicalJson({ jws }),
    controller: name,
  });
}

/** Ten rows, a checkpoint, five rows, a checkpoint, two rows: seq 1..19. */
function trail(): AuditChainRow[] {
  const rows: AuditChainRow[] = [];
  for (let i = 0; i < 10; i++) add(rows);
  checkpoint(rows);
  for (let i = 0; i < 5; i++) add(rows);
  checkpoint(rows, c2, 'c2');
  add(rows);
  add(rows);
  return rows;
}

function verify(rows: AuditChainRow[], head: Head | null = lastOf(rows)): AuditReport {
  const v = new AuditVerifier({ keys, head });
  for (const r of [...rows].sort((a, b) => a.seq - b.seq)) v.add(r);
  return v.finish();
}

function lastOf(rows: AuditChainRow[]): Head | null {
  const l = rows[rows.length - 1];
  return l ? { seq: l.seq, hash: l.hash } : null;
}

const codes = (r: AuditReport) => r.problems.map((p) => [p.code, p.seq]);

/** Recomputes every row's link and hash from `from` on, in seq order: a rewrite "hashes and all". */
function rehash(rows: AuditChainRow[], from: number): void {
  for (let i = from; i < rows.length; i++) {
    const prev = rows[i - 1];
    const r = { ...rows[i]!, prev_hash: prev ? prev.hash : AUDIT_GENESIS_HASH };
    rows[i] = { ...r, hash: auditRowHash(r) };
  }
}

describe('the audit chain', () => {
  it('hashes the canonical JSON of a row: keys sorted, no spaces, every field but hash', () => {
    expect(canonicalJson({ b: 1, a: [{ d: null, c: 'x' }], e: undefined })).toBe('{"a":[{"c":"x","d":null}],"b":1}');
    const r = add([]);
    for (const f of ['at', 'who', 'action', 'target', 'detail', 'outcome', 'controller', 'prev_hash'] as const)
      expect(auditRowHash({ ...r, [f]: `${r[f]}x` }), f).not.toBe(r.hash);
    expect(auditRowHash({ ...r, seq: 2 })).not.toBe(r.hash);
    expect(r.prev_hash).toBe(AUDIT_GENESIS_HASH);
  });

  it.skipIf(spawnSync('python3', ['--version']).status !== 0)(
    'an exported line re-hashes byte for byte with another JSON library (python3 json, hashlib)',
    () => {
      const rows: AuditChainRow[] = [];
      add(rows, 'config.create', { detail: canonicalJson({ name: 'héllo ✓ "q" \\ \n', n: -1.5, list: [1, 2] }) });
      const line = JSON.stringify({ kind: 'row', ...rows[0] });
      const py = spawnSync(
        'python3',
        [
          '-c',
          'import sys,json,hashlib\nr=json.loads(sys.stdin.read())\nh=r.pop("hash");r.pop("kind")\nprint(hashlib.sha256(json.dumps(r,sort_keys=True,separators=(",",":"),ensure_ascii=False).encode()).hexdigest()==h)',
        ],
        { input: line, encoding: 'utf8' },
      );
      expect(py.stdout.trim()).toBe('True');
    },
  );

  it('an untouched trail verifies, signed through its last checkpoint', () => {
    const r = verify(trail());
    expect(r.problems).toEqual([]);
    expect(r).toMatchObject({ ok: true, rows: 19, first: 1, last: 19, anchoredThrough: 17, unanchoredRows: 2 });
    expect(r.checkpoints).toEqual({ trusted: 2, untrusted: 0, invalid: 0 });
  });

  it('an edited row is audit_row_edited at its seq', () => {
    const rows = trail();
    rows[4] = { ...rows[4]!, who: `${TD}/operator/mallory` };
    expect(codes(verify(rows))).toEqual([['audit_row_edited', 5]]);
  });

  it('an edited row whose hash was recomputed too is audit_row_edited at its seq (the next row is chained to another)', () => {
    const rows = trail();
    const r = { ...rows[4]!, detail: canonicalJson({ n: 99 }) };
    rows[4] = { ...r, hash: auditRowHash(r) };
    expect(codes(verify(rows))).toEqual([['audit_row_edited', 5]]);
  });

  it('a deleted row is audit_row_deleted at its seq; two in a row name the range', () => {
    const rows = trail();
    expect(codes(verify(rows.filter((r) => r.seq !== 6)))).toEqual([['audit_row_deleted', 6]]);
    const two = verify(rows.filter((r) => r.seq !== 6 && r.seq !== 7));
    expect(codes(two)).toEqual([['audit_row_deleted', 6]]);
    expect(two.problems[0]!.message).toMatch(/seq 6\.\.7 is missing/);
  });

  it('rows deleted at the end are audit_row_deleted after the last row kept (the chain head names a later seq)', () => {
    const rows = trail();
    expect(codes(verify(rows.slice(0, -2), lastOf(rows)))).toEqual([['audit_row_deleted', 18]]);
  });

  it('rows deleted at the start are audit_row_deleted unless an audit.prune row says where the kept trail starts', () => {
    const rows = trail();
    expect(codes(verify(rows.slice(3)))).toEqual([['audit_row_deleted', 3]]);
    // a pruning through seq 3 records it, then a checkpoint: the kept trail verifies
    const pruned = rows.slice(3);
    add(pruned, AUDIT_PRUNE_ACTION, {
      target: 'audit',
      detail: canonicalJson({ through_seq: 3, through_hash: rows[2]!.hash, first_kept_seq: 4, rows: 3 }),
    });
    checkpoint(pruned);
    expect(verify(pruned).problems).toEqual([]);
  });

  it('two rows swapped are audit_row_reordered at both seqs', () => {
    const rows = trail();
    const [a, b] = [rows[6]!, rows[7]!];
    rows[6] = { ...b, seq: a.seq };
    rows[7] = { ...a, seq: b.seq };
    expect(codes(verify(rows))).toEqual([
      ['audit_row_reordered', 7],
      ['audit_row_reordered', 8],
    ]);
  });

  it('a checkpoint whose signature was altered is audit_checkpoint_invalid', () => {
    const rows = trail();
    const cp = rows[10]!;
    const jws = (JSON.parse(cp.detail!) as { jws: string }).jws;
    const forged = `${jws.slice(0, -4)}${jws.slice(-4) === 'AAAA' ? 'BBBB' : 'AAAA'}`;
    const r = { ...cp, detail: canonicalJson({ jws: forged }) };
    rows[10] = { ...r, hash: auditRowHash(r) };
    rehash(rows, 11);
    // the second checkpoint now signs another hash than its predecessor has: rewritten too, and
    // no trusted checkpoint is left
    expect(codes(verify(rows))).toEqual([
      ['audit_unanchored', 1],
      ['audit_checkpoint_invalid', 11],
      ['audit_chain_rewritten', 17],
    ]);
  });

  it("a checkpoint signed with one controller's key in another's name is audit_checkpoint_invalid", () => {
    const rows = trail().slice(0, 16);
    checkpoint(rows, c2, 'c1', 'c1');
    expect(codes(verify(rows))).toEqual([['audit_checkpoint_invalid', 17]]);
  });

  it('rows rewritten before a checkpoint, hashes and all, are audit_chain_rewritten at the checkpoint', () => {
    const rows = trail();
    rows[2] = { ...rows[2]!, who: `${TD}/operator/mallory` };
    rehash(rows, 2);
    expect(codes(verify(rows))).toEqual([
      ['audit_unanchored', 1],
      ['audit_chain_rewritten', 11],
      ['audit_chain_rewritten', 17],
    ]);
  });

  it('a trail no trusted checkpoint covers is audit_unanchored, also when its checkpoints are signed by keys not given', () => {
    const rows: AuditChainRow[] = [];
    for (let i = 0; i < 4; i++) add(rows);
    expect(codes(verify(rows))).toEqual([['audit_unanchored', 1]]);
    checkpoint(rows, stranger, 'c3');
    const r = verify(rows);
    expect(codes(r)).toEqual([['audit_unanchored', 1]]);
    expect(r.checkpoints.untrusted).toBe(1);
  });

  it('verifies a part of the trail after a given row (what a controller checks before it signs)', () => {
    const rows = trail();
    const v = new AuditVerifier({ keys, after: { seq: 11, hash: rows[10]!.hash } });
    for (const r of rows.slice(11)) v.add(r);
    expect(v.finish().problems).toEqual([]);
    const bad = new AuditVerifier({ keys, after: { seq: 11, hash: rows[9]!.hash } });
    for (const r of rows.slice(11)) bad.add(r);
    expect(codes(bad.finish())).toEqual([['audit_row_edited', 11]]);
  });
});
