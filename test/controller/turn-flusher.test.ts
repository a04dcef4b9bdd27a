/**
 * The IPC batches between the main process and a push worker go at the end of the event loop's
 * turn, but a long turn (a worker reading thousands of sockets in one poll phase) does not hold
 * them past IPC_BATCH_MAX_DELAY_MS. The clock is a fake; the turn is the real event loop.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { TurnFlusher } from '../../controller/push/turn-flusher.js';
import { IPC_BATCH_MAX_DELAY_MS } from '../../protocol/limits.js';

function rig() {
  let now = 1_000;
  const queue: number[] = [];
  const posted: number[][] = [];
  const f = new TurnFlusher(
    () => {
      if (queue.length > 0) posted.push(queue.splice(0));
    },
    IPC_BATCH_MAX_DELAY_MS,
    () => now,
  );
  const put = (x: number): void => {
    queue.push(x);
    f.queued();
  };
  return { f, put, posted, advance: (ms: number) => (now += ms) };
}

describe('TurnFlusher', () => {
  it('posts what one short turn queued as one batch, at its end', async () => {
    const r = rig();
    r.put(1);
    r.put(2);
    r.put(3);
    expect(r.posted).toEqual([]);
    await nextTurn();
    expect(r.posted).toEqual([[1, 2, 3]]);
  });

  it('posts inside a long turn once the first message has waited the bound, and the rest at its end', async () => {
    const r = rig();
    r.put(1);
    r.advance(IPC_BATCH_MAX_DELAY_MS - 0.5);
    r.put(2);
    expect(r.posted).toEqual([]);
    r.advance(0.5);
    r.put(3); // the first has waited the bound: all three go now, still inside the turn
    expect(r.posted).toEqual([[1, 2, 3]]);
    r.put(4); // a new batch: its own wait starts here
    r.advance(IPC_BATCH_MAX_DELAY_MS - 0.5);
    r.put(5);
    expect(r.posted).toEqual([[1, 2, 3]]);
    await nextTurn();
    expect(r.posted).toEqual([
      [1, 2, 3],
      [4, 5],
    ]);
  });

  it('a batch posted at once (flushNow) leaves nothing for the end of the turn, and the next starts afresh', async () => {
    const r = rig();
    r.put(1);
    r.f.flushNow();
    expect(r.posted).toEqual([[1]]);
    r.advance(10 * IPC_BATCH_MAX_DELAY_MS);
    r.put(2); // the first of a new batch: it waits for the turn's end, not posted alone at once
    expect(r.posted).toEqual([[1]]);
    await nextTurn();
    expect(r.posted).toEqual([[1], [2]]);
  });
});
