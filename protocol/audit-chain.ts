/**
 * The audit trail's hash chain and its signed checkpoints (docs/access.md, "Audit trail"): how a
 * row's hash is made, what a checkpoint signs, and the one verification that `herald audit
 * verify`, the controller's checkpoints and its pruning share. Pure: rows come in, a report goes
 * out; the reading is the caller's.
 *
 * A row's hash is the SHA-256 (hex) of the canonical JSON (keys sorted, no spaces: RFC 8785 for
 * these values, which are strings, integers and null) of its fields, `prev_hash` among them: the
 * hash of the row before it, or AUDIT_GENESIS_HASH for the first row ever written. `detail` is
 * hashed as the JSON text the database holds, so any JSON library re-verifies an exported line
 * byte for byte. A checkpoint is a row too (`audit.checkpoint`), written by a controller right
 * after the head it covers: its detail holds a compact JWS (EdDSA, the controller's wake-up
 * signing key) of that head's seq and hash, which are the checkpoint row's own `seq - 1` and
 * `prev_hash`. So each checkpoint is checked where it stands, and a later edit of any row before
 * it shows either as a broken link or as a checkpoint whose signed hash is not its `prev_hash`.
 */
import { createHash } from 'node:crypto';
import { RefusalError } from './errors.js';
import { AUDIT_CHECKPOINT_TYP, checkKeyIssuer, type KeySet, verifyCompact } from './jws.js';

export { AUDIT_CHECKPOINT_TYP };

/** The `prev_hash` of the first row ever written. */
export const AUDIT_GENESIS_HASH = '0'.repeat(64);
/** The action of a checkpoint row; its detail is `{"jws": ...}`. */
export const AUDIT_CHECKPOINT_ACTION = 'audit.checkpoint';
/** The action of the row pruning writes; its detail says where the kept trail starts (AuditPruneDetail). */
export const AUDIT_PRUNE_ACTION = 'audit.prune';
/** The outcome of a change that was made. */
export const AUDIT_OK = 'ok';

/** A row as the chain hashes it, and as `herald audit export` writes it (with `kind: "row"`). */
export interface AuditChainRow {
  seq: number;
  at: string;
  /** A SPIFFE id. */
  who: string;
  action: string;
  target: string;
  /** The detail's JSON text exactly as stored, or null. */
  detail: string | null;
  /** `ok`, or the error code the change was refused with. */
  outcome: string;
  /** The name of the controller that wrote the row; null for rows written before the chain was. */
  controller: string | null;
  prev_hash: string;
  hash: string;
}

/** The claims a checkpoint signs: the chain head (`seq`, `hash`) and who signed it when. */
export interface AuditCheckpointClaims {
  /** `spiffe://<td>/controller/<name>`: the key must be that controller's (checkKeyIssuer). */
  iss: string;
  seq: number;
  hash: string;
  /** Epoch seconds. */
  iat: number;
}

/** What an `audit.prune` row records: the rows through `through_seq` were deleted, and the kept trail's first row. */
export interface AuditPruneDetail {
  through_seq: number;
  /** The hash of the row `through_seq`: the `prev_hash` of the first kept row. */
  through_hash: string;
  first_kept_seq: number;
  rows: number;
}

/**
 * Canonical JSON: object keys sorted (by UTF-16 code units, as RFC 8785), no whitespace.
 * `undefined` members are left out, as JSON.stringify leaves them.
 */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? 'null' : canonicalJson(x))).join(',')}]`;
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(',')}}`;
}

/** The hash of a row: SHA-256 (hex) of the canonical JSON of every field but `hash`. */
export function auditRowHash(r: Omit<AuditChainRow, 'hash'>): string {
  const fields = {
    action: r.action,
    at: r.at,
    controller: r.controller,
    detail: r.detail,
    outcome: r.outcome,
    prev_hash: r.prev_hash,
    seq: r.seq,
    target: r.target,
    who: r.who,
  };
  return createHash('sha256').update(canonicalJson(fields), 'utf8').digest('hex');
}

/** The row after `head` holding `fields`, with its seq, prev_hash and hash. */
export function nextAuditRow(
  head: { seq: number; hash: string },
  fields: Omit<AuditChainRow, 'seq' | 'prev_hash' | 'hash'>,
): AuditChainRow {
  const row = { ...fields, seq: head.seq + 1, prev_hash: head.hash };
  return { ...row, hash: auditRowHash(row) };
}

export type AuditProblemCode =
  | 'audit_row_edited'
  | 'audit_row_deleted'
  | 'audit_row_reordered'
  | 'audit_checkpoint_invalid'
  | 'audit_chain_rewritten'
  | 'audit_unanchored';

/** One thing wrong with the trail, at the row (seq) where it shows. */
export interface AuditProblem {
  code: AuditProblemCode;
  seq: number;
  message: string;
}

export interface AuditReport {
  ok: boolean;
  rows: number;
  /** The first and last seq read (null: no row). */
  first: number | null;
  last: number | null;
  checkpoints: { trusted: number; untrusted: number; invalid: number };
  /** The newest seq a trusted checkpoint covers (null: none). */
  anchoredThrough: number | null;
  /** Rows after it: chained, but not yet under a signature. */
  unanchoredRows: number;
  problems: AuditProblem[];
}

export interface AuditVerifierOptions {
  /** The controllers' public keys (their JWKS, revoked kids left out). */
  keys: KeySet;
  /** The chain head the database records (`audit_head`), when read with the rows. */
  head?: { seq: number; hash: string } | null;
  /**
   * Verify a part of the trail only: its first row follows this one (the controller checking
   * what it is about to sign or prune). Without it, the first row must follow the genesis or
   * the last `audit.prune` row, and a trusted checkpoint must cover the trail.
   */
  after?: { seq: number; hash: string };
  /** Stop keeping broken rows past this many (a trail rewritten whole would otherwise fill memory). */
  maxProblems?: number;
}

/** A checkpoint row's standing: its JWS checked against the keys and against its own place in the chain. */
export type CheckpointStanding =
  | { kind: 'trusted'; claims: AuditCheckpointClaims }
  | { kind: 'untrusted'; why: string }
  | { kind: 'invalid'; why: string }
  | { kind: 'mismatch'; claims: AuditCheckpointClaims };

/** Reads a checkpoint row's signature; `mismatch`: it verifies, but signs another head than the one before it. */
export function checkpointStanding(row: AuditChainRow, keys: KeySet): CheckpointStanding {
  let jws: unknown;
  try {
    jws = (JSON.parse(row.detail ?? 'null') as { jws?: unknown } | null)?.jws;
  } catch {
    return { kind: 'invalid', why: 'its detail is not JSON' };
  }
  if (typeof jws !== 'string') return { kind: 'invalid', why: 'it holds no signature' };
  let claims: Record<string, unknown>;
  let kid: string;
  try {
    ({ claims, kid } = verifyCompact(jws, AUDIT_CHECKPOINT_TYP, keys));
    checkKeyIssuer(keys, kid, claims.iss);
  } catch (err) {
    const code = err instanceof RefusalError ? err.code : 'malformed';
    // a key the verifier does not hold (revoked, or another PKI's) proves nothing either way
    if (code === 'unknown_kid') return { kind: 'untrusted', why: (err as Error).message };
    return { kind: 'invalid', why: `${code}: ${(err as Error).message}` };
  }
  const c = claims as unknown as AuditCheckpointClaims;
  if (!Number.isSafeInteger(c.seq) || typeof c.hash !== 'string' || !Number.isSafeInteger(c.iat))
    return { kind: 'invalid', why: 'its claims are not {iss, seq, hash, iat}' };
  if (row.controller === null || !c.iss.endsWith(`/controller/${row.controller}`))
    return { kind: 'invalid', why: `it is signed by ${c.iss}, not by the row's controller ${row.controller}` };
  if (c.seq !== row.seq - 1 || c.hash !== row.prev_hash) return { kind: 'mismatch', claims: c };
  return { kind: 'trusted', claims: c };
}

/** A row kept for the end: one whose content does not match its hash, or whose link breaks. */
interface Kept {
  row: AuditChainRow;
  /** The row before it in seq order (undefined: the first). */
  before: { seq: number; hash: string } | undefined;
}

/**
 * Checks a trail read in seq order, one row at a time (`add`), with memory for its broken rows
 * only; `finish` says what is wrong, each problem at the row where it shows:
 *
 * - `audit_row_edited`: a row's content does not match its hash; or its hash was recomputed too,
 *   and the row after it is chained to another one (reported at the rewritten row);
 * - `audit_row_deleted`: a gap in seq where the link breaks; rows missing after the last one
 *   (the chain head or a checkpoint names a later seq); rows missing before the first (it
 *   follows neither the genesis nor the last `audit.prune` row);
 * - `audit_row_reordered`: a row whose content hashes to its hash only under another row's seq;
 * - `audit_checkpoint_invalid`: a checkpoint signed by a known key whose signature, issuer or
 *   claims do not verify;
 * - `audit_chain_rewritten`: a checkpoint whose signature verifies but signs another hash than
 *   the row before it now has (the rows before it were rewritten, hashes and all);
 * - `audit_unanchored`: no trusted checkpoint covers the trail at all.
 */
export class AuditVerifier {
  readonly #o: AuditVerifierOptions;
  readonly #max: number;
  #rows = 0;
  #first: AuditChainRow | undefined;
  #prev: { seq: number; hash: string } | undefined;
  readonly #badContent: Kept[] = [];
  readonly #badLinks: Kept[] = [];
  readonly #checkpointProblems: AuditProblem[] = [];
  #trusted = 0;
  #untrusted = 0;
  #invalid = 0;
  #anchoredThrough: number | null = null;
  /** Rows read when the newest trusted checkpoint was. */
  #rowsAtAnchor = 0;
  #lastPrune: { seq: number; detail: Partial<AuditPruneDetail> } | undefined;
  #truncated = false;

  constructor(o: AuditVerifierOptions) {
    this.#o = o;
    this.#max = o.maxProblems ?? 10_000;
  }

  /** The next row, in ascending seq. @throws TypeError when rows come out of order (a reader's bug) */
  add(r: AuditChainRow): void {
    if (this.#prev !== undefined && r.seq <= this.#prev.seq)
      throw new TypeError(`audit rows out of order: ${r.seq} after ${this.#prev.seq}`);
    this.#rows++;
    this.#first ??= r;
    const before = this.#prev ?? this.#o.after;
    const contentOk = auditRowHash(r) === r.hash;
    if (!contentOk) this.#keep(this.#badContent, { row: r, before });
    else if (before !== undefined && r.prev_hash !== before.hash) this.#keep(this.#badLinks, { row: r, before });
    if (contentOk && r.action === AUDIT_CHECKPOINT_ACTION) this.#checkpoint(r);
    if (contentOk && r.action === AUDIT_PRUNE_ACTION) {
      try {
        this.#lastPrune = { seq: r.seq, detail: JSON.parse(r.detail ?? '{}') as Partial<AuditPruneDetail> };
      } catch {
        this.#lastPrune = { seq: r.seq, detail: {} };
      }
    }
    // a broken row's stored hash is still what the next row was chained to
    this.#prev = { seq: r.seq, hash: r.hash };
  }

  #keep(list: Kept[], k: Kept): void {
    if (this.#badContent.length + this.#badLinks.length >= this.#max) {
      this.#truncated = true;
      return;
    }
    // (its successor's link is checked against this stored hash either way)
    list.push(k);
  }

  #checkpoint(r: AuditChainRow): void {
    const s = checkpointStanding(r, this.#o.keys);
    if (s.kind === 'untrusted') {
      this.#untrusted++;
    } else if (s.kind === 'invalid') {
      this.#invalid++;
      this.#checkpointProblems.push({
        code: 'audit_checkpoint_invalid',
        seq: r.seq,
        message: `the checkpoint at seq ${r.seq} does not verify: ${s.why}`,
      });
    } else if (s.kind === 'mismatch') {
      this.#invalid++;
      this.#checkpointProblems.push({
        code: 'audit_chain_rewritten',
        seq: r.seq,
        message: `the checkpoint at seq ${r.seq} signed seq ${s.claims.seq} with hash ${s.claims.hash.slice(0, 16)}…, but the row before it now chains as seq ${r.seq - 1} with ${r.prev_hash.slice(0, 16)}…: the rows before it were rewritten`,
      });
    } else {
      this.#trusted++;
      // a checkpoint vouches for its own row too: its content matched its hash
      this.#anchoredThrough = r.seq;
      this.#rowsAtAnchor = this.#rows;
    }
  }

  /** What is wrong (nothing: `ok`), and how far signatures cover the trail. */
  finish(): AuditReport {
    const problems: AuditProblem[] = [];
    // rows whose content hashes right under another broken row's seq were moved there
    const badSeqs = this.#badContent.map((k) => k.row.seq);
    const moved = new Set<number>();
    for (const k of this.#badContent) {
      const from = badSeqs.find((s) => s !== k.row.seq && auditRowHash({ ...k.row, seq: s }) === k.row.hash);
      if (from !== undefined) {
        moved.add(k.row.seq);
        problems.push({
          code: 'audit_row_reordered',
          seq: k.row.seq,
          message: `the row at seq ${k.row.seq} was written as seq ${from}: rows were reordered`,
        });
      } else {
        problems.push({
          code: 'audit_row_edited',
          seq: k.row.seq,
          message: `the row at seq ${k.row.seq} (${k.row.action}) does not match its hash: it was edited`,
        });
      }
    }
    for (const k of this.#badLinks) {
      const before = k.before!;
      // the rows around a moved one are chained to where it was
      if (moved.has(k.row.seq) || moved.has(before.seq)) continue;
      if (k.row.seq - before.seq > 1) {
        const range = k.row.seq - before.seq === 2 ? `${before.seq + 1}` : `${before.seq + 1}..${k.row.seq - 1}`;
        problems.push({
          code: 'audit_row_deleted',
          seq: before.seq + 1,
          message: `seq ${range} is missing: the row at seq ${k.row.seq} is chained to another row than seq ${before.seq}`,
        });
      } else {
        problems.push({
          code: 'audit_row_edited',
          seq: before.seq,
          message: `the row at seq ${before.seq} was rewritten with its hash recomputed: the row after it is chained to another`,
        });
      }
    }
    problems.push(...this.#checkpointProblems);
    this.#ends(problems);
    if (this.#truncated)
      problems.push({
        code: problems[0]?.code ?? 'audit_row_edited',
        seq: this.#prev?.seq ?? 0,
        message: `more than ${this.#max} broken rows: the rest were not classified`,
      });
    problems.sort((a, b) => a.seq - b.seq);
    const last = this.#prev?.seq ?? null;
    return {
      ok: problems.length === 0,
      rows: this.#rows,
      first: this.#first?.seq ?? null,
      last,
      checkpoints: { trusted: this.#trusted, untrusted: this.#untrusted, invalid: this.#invalid },
      anchoredThrough: this.#anchoredThrough,
      unanchoredRows: this.#rows - this.#rowsAtAnchor,
      problems,
    };
  }

  /** The trail's two ends: where it starts (genesis or the last prune), and whether rows are missing after its last. */
  #ends(problems: AuditProblem[]): void {
    const first = this.#first;
    const head = this.#o.head;
    const last = this.#prev;
    if (head != null && last !== undefined) {
      if (head.seq > last.seq)
        problems.push({
          code: 'audit_row_deleted',
          seq: last.seq + 1,
          message: `seq ${last.seq + 1}..${head.seq} is missing: the chain head is seq ${head.seq}, the last row ${last.seq}`,
        });
      else if (head.seq < last.seq)
        problems.push({
          code: 'audit_row_edited',
          seq: head.seq + 1,
          message: `rows after the chain head (seq ${head.seq}) were written outside the controller`,
        });
      else if (head.hash !== last.hash)
        problems.push({
          code: 'audit_row_edited',
          seq: last.seq,
          message: `the last row (seq ${last.seq}) is not the chain head the controller recorded`,
        });
    } else if (head != null && head.seq > 0 && last === undefined && this.#o.after === undefined) {
      problems.push({
        code: 'audit_row_deleted',
        seq: 1,
        message: `the trail is empty, but its head is seq ${head.seq}`,
      });
    }
    if (this.#o.after !== undefined || first === undefined) return;
    if (first.prev_hash !== AUDIT_GENESIS_HASH) {
      const p = this.#lastPrune?.detail;
      const pruned = p !== undefined && p.first_kept_seq === first.seq && p.through_hash === first.prev_hash;
      if (!pruned)
        problems.push({
          code: 'audit_row_deleted',
          seq: first.seq - 1,
          message: `rows before seq ${first.seq} are missing: it follows neither the first row ever written nor the last pruning`,
        });
    }
    if (this.#anchoredThrough === null)
      problems.push({
        code: 'audit_unanchored',
        seq: first.seq,
        message:
          this.#untrusted > 0
            ? `no checkpoint is signed by a key of the JWKS given (${this.#untrusted} by other keys)`
            : 'no signed checkpoint covers the trail',
      });
  }
}
