/**
 * The audit trail's signed checkpoints and its retention (docs/access.md, "Audit trail"). Every
 * AUDIT_CHECKPOINT_INTERVAL_MS (and at start and stop) each controller:
 *
 * 1. checks the rows written since the newest checkpoint (their hashes and links, the
 *    checkpoint's signature), and, when they hold, appends a checkpoint row over the chain head:
 *    a JWS (its wake-up signing key, `typ` herald-audit-checkpoint+jwt) of the head's seq and
 *    hash, written under the head's lock right after it. Nothing new since the last checkpoint
 *    (the head is one): nothing written. A controller never signs over a chain it found broken:
 *    it logs `audit.broken` with the problem's code instead;
 * 2. prunes what is past retention (older than AUDIT_RETENTION_DAYS, or beyond the newest
 *    AUDIT_KEPT_MAX_ENTRIES rows), at most AUDIT_PRUNE_BATCH_ENTRIES rows a turn, once those rows
 *    check out up to a trusted checkpoint after them: the rows are deleted, and an `audit.prune`
 *    row naming the first row kept and the hash it follows, then a checkpoint, are appended in
 *    the same transaction; so the kept trail still verifies, and a deletion nobody recorded
 *    does not look like a pruning.
 *
 * Several controllers do this at once on one PostgreSQL: the head's lock orders them, a second
 * checkpoint over the same head is not written, and a second pruning finds nothing to delete.
 */
import type { Logger } from 'pino';
import {
  AUDIT_CHECKPOINT_ACTION,
  AUDIT_CHECKPOINT_TYP,
  AUDIT_PRUNE_ACTION,
  AuditVerifier,
  checkpointStanding,
  type AuditChainRow,
  type AuditCheckpointClaims,
  type AuditPruneDetail,
  type AuditReport,
} from '../../protocol/audit-chain.js';
import { HeraldError } from '../../protocol/errors.js';
import type { KeySet, Signer } from '../../protocol/jws.js';
import {
  AUDIT_CHECKPOINT_INTERVAL_MS,
  AUDIT_KEPT_MAX_ENTRIES,
  AUDIT_PAGE_ENTRIES,
  AUDIT_PRUNE_BATCH_ENTRIES,
  AUDIT_RETENTION_DAYS,
} from '../../protocol/limits.js';
import type { AuditWriter, ChainHead } from '../store/audit-chain.js';
import type { Store } from '../store/store.js';

const DAY_MS = 86_400_000;

export interface AuditCheckpointsOptions {
  store: Store;
  logger: Logger;
  /** This controller's SPIFFE id: each checkpoint's `iss`, and its rows' `who`. */
  spiffeId: string;
  /** The signing key now (it may be rotated while the controller runs). */
  signer: () => Signer;
  /** The controllers' public keys now (the JWKS, revoked kids left out). */
  keys: () => KeySet;
  now?: () => number;
  /** Default AUDIT_CHECKPOINT_INTERVAL_MS. */
  everyMs?: number;
  /** Default AUDIT_RETENTION_DAYS. */
  retentionDays?: number;
  /** Default AUDIT_KEPT_MAX_ENTRIES. */
  keptMaxEntries?: number;
  /** Default AUDIT_PRUNE_BATCH_ENTRIES. */
  pruneBatchEntries?: number;
}

export class AuditCheckpoints {
  readonly #o: AuditCheckpointsOptions;
  readonly #now: () => number;
  #timer: NodeJS.Timeout | undefined;
  #ticking: Promise<void> | undefined;
  #closed: Promise<void> | undefined;
  /** The last problem logged, so a broken trail is logged once, not every turn. */
  #lastBroken = '';

  constructor(o: AuditCheckpointsOptions) {
    this.#o = o;
    this.#now = o.now ?? Date.now;
  }

  /** A turn now (in the background), then one every interval. */
  start(): void {
    void this.tick();
    this.#timer = setInterval(() => void this.tick(), this.#o.everyMs ?? AUDIT_CHECKPOINT_INTERVAL_MS);
    this.#timer.unref();
  }

  /** One turn: a checkpoint, then a pruning; never two at once, never rejects. */
  tick(): Promise<void> {
    this.#ticking ??= (async () => {
      try {
        await this.checkpoint();
        await this.prune();
      } catch (err) {
        const code = err instanceof HeraldError ? err.code : 'internal';
        // a controller that lost its standing writes nothing, the checkpoints neither
        const level = code === 'controller_revoked' || code === 'controller_expired' ? 'debug' : 'warn';
        this.#o.logger[level](
          { event: 'audit.checkpoint_failed', code, err: { message: (err as Error).message } },
          'audit checkpoint or pruning failed; the next turn tries again',
        );
      } finally {
        this.#ticking = undefined;
      }
    })();
    return this.#ticking;
  }

  /**
   * Checks the rows since the newest checkpoint and signs the head when they hold.
   * @returns the new checkpoint row's seq, or null when none was written (nothing new, or broken)
   */
  async checkpoint(): Promise<number | null> {
    const store = this.#o.store;
    const head = await store.auditHead();
    if (head.seq === 0) return null;
    const [top] = await store.auditPage(head.seq - 1, 1);
    if (top?.seq === head.seq && top.action === AUDIT_CHECKPOINT_ACTION) return null;
    const start = await this.#newestCheckpoint();
    if (start === undefined) return null;
    const checked = await this.#check({ seq: start.seq - 1, hash: start.prev_hash }, head.seq);
    if (checked === null) return null;
    return (
      await store.transaction(async (tx) => {
        const chain = tx.auditChain;
        const h = await chain.head();
        // what came since the check is checked too, under the lock (a few rows)
        if (h.seq !== checked.seq) {
          const v = new AuditVerifier({ keys: this.#o.keys(), after: checked });
          for (let at = checked.seq; at < h.seq; ) {
            const page = await chain.page(at, AUDIT_PAGE_ENTRIES);
            if (page.length === 0) break;
            for (const r of page) v.add(r);
            at = page[page.length - 1]!.seq;
          }
          if (!this.#holds(v.finish())) return null;
        }
        if ((await chain.row(h.seq))?.action === AUDIT_CHECKPOINT_ACTION) return null;
        return (await this.#appendCheckpoint(chain, h)).seq;
      })
    ).result;
  }

  /**
   * Prunes the rows past retention, at most a batch, once they check out.
   * @returns how many rows were deleted
   */
  async prune(): Promise<number> {
    const store = this.#o.store;
    const head = await store.auditHead();
    const [first] = await store.auditPage(0, 1);
    if (first === undefined) return 0;
    const batch = this.#o.pruneBatchEntries ?? AUDIT_PRUNE_BATCH_ENTRIES;
    const limit = first.seq - 1 + batch;
    let through = Math.min(head.seq - (this.#o.keptMaxEntries ?? AUDIT_KEPT_MAX_ENTRIES), limit);
    const cutoff = new Date(this.#now() - (this.#o.retentionDays ?? AUDIT_RETENTION_DAYS) * DAY_MS).toISOString();
    // by age: from the oldest while older than the cutoff (rows are appended in time order,
    // give or take the clocks of several controllers)
    for (let at = first.seq - 1, young = false; !young && at < limit; ) {
      const page = await store.auditPage(at, AUDIT_PAGE_ENTRIES);
      if (page.length === 0) break;
      for (const r of page) {
        if (r.at >= cutoff || r.seq > limit) {
          young = true;
          break;
        }
        through = Math.max(through, r.seq);
      }
      at = page[page.length - 1]!.seq;
    }
    if (through < first.seq) return 0;
    // the rows to delete must check out, up to a trusted checkpoint after them
    const keys = this.#o.keys();
    const v = new AuditVerifier({ keys, after: { seq: first.seq - 1, hash: first.prev_hash } });
    let throughHash: string | undefined;
    let anchored = false;
    for (let at = first.seq - 1; !anchored; ) {
      const page = await store.auditPage(at, AUDIT_PAGE_ENTRIES);
      if (page.length === 0) break;
      for (const r of page) {
        v.add(r);
        if (r.seq <= through) throughHash = r.hash;
        else if (r.action === AUDIT_CHECKPOINT_ACTION && checkpointStanding(r, keys).kind === 'trusted') {
          anchored = true;
          break;
        }
      }
      at = page[page.length - 1]!.seq;
    }
    if (!anchored || throughHash === undefined || !this.#holds(v.finish())) return 0;
    const hash = throughHash;
    return (
      await store.transaction(async (tx) => {
        const chain = tx.auditChain;
        await chain.head();
        const rows = await chain.deleteThrough(through);
        if (rows === 0) return 0; // another controller pruned them
        const next = await chain.firstAfter(through);
        const h = await chain.head();
        const detail: AuditPruneDetail = {
          through_seq: through,
          through_hash: hash,
          first_kept_seq: next?.seq ?? h.seq + 1,
          rows,
        };
        const after = await chain.append([
          {
            at: this.#iso(),
            who: this.#o.spiffeId,
            action: AUDIT_PRUNE_ACTION,
            target: 'audit',
            detail: { ...detail },
          },
        ]);
        await this.#appendCheckpoint(chain, after);
        this.#o.logger.info({ event: 'audit.pruned', rows, through_seq: through }, `pruned ${rows} audit rows`);
        return rows;
      })
    ).result;
  }

  /** Stops the timer, waits for a turn in progress, and writes one last checkpoint. Idempotent. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      clearInterval(this.#timer);
      await this.#ticking;
      await this.checkpoint().catch(() => null);
    })();
    return this.#closed;
  }

  async #appendCheckpoint(chain: AuditWriter, head: ChainHead): Promise<ChainHead> {
    const claims: AuditCheckpointClaims = {
      iss: this.#o.spiffeId,
      seq: head.seq,
      hash: head.hash,
      iat: Math.floor(this.#now() / 1000),
    };
    const jws = this.#o.signer().sign(AUDIT_CHECKPOINT_TYP, claims);
    return chain.append([
      { at: this.#iso(), who: this.#o.spiffeId, action: AUDIT_CHECKPOINT_ACTION, target: 'audit', detail: { jws } },
    ]);
  }

  /** The newest checkpoint row, else the first row (a trail never checkpointed). */
  async #newestCheckpoint(): Promise<AuditChainRow | undefined> {
    const store = this.#o.store;
    const seq = await store.auditNewestOf(AUDIT_CHECKPOINT_ACTION);
    return (await store.auditPage(seq === undefined ? 0 : seq - 1, 1))[0];
  }

  /** Checks the rows after `after` through `through`; the last row read, when they hold. */
  async #check(after: ChainHead, through: number): Promise<ChainHead | null> {
    const v = new AuditVerifier({ keys: this.#o.keys(), after });
    let last = after;
    for (let at = after.seq; at < through; ) {
      const page = await this.#o.store.auditPage(at, AUDIT_PAGE_ENTRIES);
      if (page.length === 0) break;
      for (const r of page) {
        if (r.seq > through) break;
        v.add(r);
        last = { seq: r.seq, hash: r.hash };
      }
      at = page[page.length - 1]!.seq;
    }
    return this.#holds(v.finish()) ? last : null;
  }

  /** Whether a check found nothing wrong; what it found is logged (once while it stays the same). */
  #holds(report: AuditReport): boolean {
    const p = report.problems[0];
    if (p === undefined) return true;
    const key = `${p.code} ${p.seq}`;
    if (key !== this.#lastBroken) {
      this.#lastBroken = key;
      this.#o.logger.error(
        { event: 'audit.broken', code: p.code, seq: p.seq, problems: report.problems.length },
        `the audit trail does not verify (${p.message}); no checkpoint or pruning over it: run herald audit verify`,
      );
    }
    return false;
  }

  #iso(): string {
    return new Date(this.#now()).toISOString();
  }
}
