/**
 * Row ids (configs, deployments, revisions' item ids, clusters): UUIDv7 (RFC 9562 §5.7), in the usual
 * 8-4-4-4-12 spelling. The first 48 bits are the time in ms, so ids made one after another sort
 * one after another, and a cluster's thousands of new rows land at the end of each index on them
 * instead of on a random page each (SQLite and PostgreSQL B-trees alike: fewer pages dirtied, a
 * smaller write-ahead log to checkpoint). Within one millisecond a 12-bit counter (`rand_a`,
 * RFC 9562 §6.2 method 1) keeps them increasing; the last 62 bits are random. An id is a name,
 * never a secret: who may act on a deployment is decided by the caller's certificate.
 */
import { randomFillSync } from 'node:crypto';
import { ID_RANDOM_POOL_BYTES } from '../../protocol/limits.js';

/** Per id: 8 for `rand_b`, 2 for a new millisecond's first counter. */
const RANDOM_BYTES = 10;
const pool = Buffer.alloc(ID_RANDOM_POOL_BYTES);
let offset = pool.length;
const bytes = Buffer.alloc(16);
let lastMs = -1;
let counter = 0;

/**
 * A new UUIDv7, greater than every one this process made before (its clock stepping back holds
 * the time part where it was). `nowMs` is for tests.
 */
export function newId(nowMs: number = Date.now()): string {
  if (offset + RANDOM_BYTES > pool.length) {
    randomFillSync(pool);
    offset = 0;
  }
  if (nowMs > lastMs) {
    lastMs = nowMs;
    // start low in the 12 bits (below 2^11), so a millisecond has room for 2,048 more
    counter = pool[offset + 8]! | ((pool[offset + 9]! & 0x07) << 8);
  } else if (++counter > 0xfff) {
    lastMs++; // a millisecond's counter spent: borrow the next one
    counter = 0;
  }
  bytes.writeUIntBE(lastMs, 0, 6);
  bytes[6] = 0x70 | (counter >>> 8);
  bytes[7] = counter & 0xff;
  pool.copy(bytes, 8, offset, offset + 8);
  offset += RANDOM_BYTES;
  bytes[8] = 0x80 | (bytes[8]! & 0x3f);
  const h = bytes.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
