import { describe, expect, it, vi } from 'vitest';
import { OutputSender } from '../../agent/output-sender.js';
import type { MetadataItem } from '../../protocol/heat.js';
import { OUTPUT_CHUNK_MAX_BYTES, OUTPUT_RATE_BURST, OUTPUT_RATE_PER_S } from '../../protocol/limits.js';
import type { OutputChunkBody } from '../../protocol/output.js';

const log = { info() {}, warn() {}, error() {}, debug() {} };
const item = {
  id: 'i1',
  deployment_id: 'd1',
  revision: 3,
  inputs: [{ name: 'pw', type: 'String', value: 'hunter2', hidden: true }],
} as unknown as MetadataItem;

describe('OutputSender', () => {
  it('numbers chunks, masks them, and sends what is left at close', async () => {
    const got: OutputChunkBody[] = [];
    const s = new OutputSender({
      node: 'n1',
      log,
      send: async (path, body) => {
        expect(path).toBe('/v1/nodes/n1/deployments/d1/output');
        got.push(body);
        return { status: 200 };
      },
    });
    const live = s.open(item);
    live.write('stdout', Buffer.from('pw=hun'));
    live.write('stdout', Buffer.from('ter2 ok\n'));
    live.write('stderr', Buffer.from('warn\n'));
    await live.close();
    expect(got.map((g) => g.seq)).toEqual(got.map((_, i) => i + 1));
    expect(got.every((g) => g.revision === 3)).toBe(true);
    const out = got
      .filter((g) => g.stream === 'stdout')
      .map((g) => g.text)
      .join('');
    expect(out).toBe('pw=*** ok\n');
    expect(JSON.stringify(got)).not.toContain('hun');
    expect(
      got
        .filter((g) => g.stream === 'stderr')
        .map((g) => g.text)
        .join(''),
    ).toBe('warn\n');
  });

  it('never blocks on a controller that does not answer: the queue stays bounded, the oldest go, the gap is told', async () => {
    const bodies: OutputChunkBody[] = [];
    let release: (() => void) | undefined;
    const s = new OutputSender({
      node: 'n1',
      log,
      maxQueueBytes: 256 * 1024,
      finalWaitMs: 50,
      send: (_p, body) => {
        bodies.push(body);
        return new Promise((r) => {
          release = () => r({ status: 200 });
        });
      },
    });
    const live = s.open({ ...item, inputs: [] } as unknown as MetadataItem);
    const line = Buffer.alloc(64 * 1024, 'x');
    const t0 = Date.now();
    for (let i = 0; i < 200; i++) live.write('stdout', line); // 12.5 MiB, synchronously
    expect(Date.now() - t0).toBeLessThan(2_000);
    const c0 = Date.now();
    await live.close();
    expect(Date.now() - c0).toBeLessThan(1_000);
    expect(s.droppedBytes).toBeGreaterThan(10 * 1024 * 1024);
    release?.();
    await new Promise((r) => setTimeout(r, 50));
    const withGap = bodies.find((b) => (b.dropped_bytes ?? 0) > 0);
    expect(withGap).toBeDefined();
    s.stop();
  });

  /** A sender on fake timers; `got` collects what it sent. */
  function pacedSender(): {
    s: OutputSender;
    got: OutputChunkBody[];
    open: (revision: number) => ReturnType<OutputSender['open']>;
  } {
    const got: OutputChunkBody[] = [];
    const s = new OutputSender({
      node: 'n1',
      log,
      send: async (_p, body) => {
        got.push(body);
        return { status: 200 };
      },
    });
    const open = (revision: number) => s.open({ ...item, revision, inputs: [] } as unknown as MetadataItem);
    return { s, got, open };
  }

  /** Lets the pump run what it can without the (fake) clock moving. */
  const settle = () => vi.advanceTimersByTimeAsync(0);

  it("sends a run's last chunk of each stream on a credit its wake-up gave, with no token and no wait; other chunks wait for tokens", async () => {
    vi.useFakeTimers();
    try {
      const { s, got, open } = pacedSender();
      // back-to-back runs that print on both streams, well past the burst, each after a wake-up
      const runs = OUTPUT_RATE_BURST + 10;
      for (let r = 1; r <= runs; r++) {
        s.granted();
        const live = open(r);
        live.write('stdout', Buffer.from(`run ${r}\n`));
        live.write('stderr', Buffer.from(`warn ${r}\n`));
        const closed = live.close();
        await settle();
        // both last chunks left at once: a token while there were any, then a credit
        expect(got).toHaveLength(2 * r);
        await closed;
      }
      // a run's chunks before its last wait for tokens (the bucket is empty now): chunks 1-3 one
      // token each; the fourth becomes the last at close, while it waits, and goes on a credit
      s.granted();
      const live = open(runs + 1);
      const big = Buffer.alloc(OUTPUT_CHUNK_MAX_BYTES, 'x');
      for (let i = 0; i < 4; i++) live.write('stdout', big);
      const closed = live.close();
      await vi.advanceTimersByTimeAsync((2.5 * 1000) / OUTPUT_RATE_PER_S);
      expect(got).toHaveLength(2 * runs + 2);
      await vi.advanceTimersByTimeAsync(1000 / OUTPUT_RATE_PER_S);
      expect(got).toHaveLength(2 * runs + 4);
      await closed;
      s.stop();
    } finally {
      vi.useRealTimers();
    }
  });

  it("without a credit a run's last chunk waits for a token like any other, and goes at once when a credit comes or close marks a waiting chunk last", async () => {
    vi.useFakeTimers();
    try {
      const { s, got, open } = pacedSender();
      for (let r = 1; r <= OUTPUT_RATE_BURST; r++) {
        const live = open(r);
        live.write('stdout', Buffer.from(`run ${r}\n`));
        await live.close();
      }
      expect(got).toHaveLength(OUTPUT_RATE_BURST);
      // the bucket is empty and no wake-up gave a credit: the last chunk waits for its token
      const a = open(OUTPUT_RATE_BURST + 1);
      a.write('stdout', Buffer.from('no credit\n'));
      const closedA = a.close();
      await settle();
      expect(got).toHaveLength(OUTPUT_RATE_BURST);
      // a wake-up's credit arriving while it waits sends it without the clock moving
      s.granted();
      await settle();
      expect(got).toHaveLength(OUTPUT_RATE_BURST + 1);
      await closedA;
      // a chunk waiting for its token when close finds nothing more: it is the last, and a
      // credit given meanwhile sends it at once
      const b = open(OUTPUT_RATE_BURST + 2);
      b.write('stdout', Buffer.alloc(OUTPUT_CHUNK_MAX_BYTES, 'y'));
      await settle();
      expect(got).toHaveLength(OUTPUT_RATE_BURST + 1);
      s.granted();
      const closedB = b.close();
      await settle();
      expect(got).toHaveLength(OUTPUT_RATE_BURST + 2);
      await closedB;
      s.stop();
    } finally {
      vi.useRealTimers();
    }
  });

  it("stops sending a run's output at the first 409 (output_closed: its result is in), never retrying it or sending the rest", async () => {
    const bodies: OutputChunkBody[] = [];
    const s = new OutputSender({
      node: 'n1',
      log,
      send: async (_p, body) => {
        bodies.push(body);
        return { status: 409 };
      },
    });
    const live = s.open(item);
    // three full chunks queued at once, the first of them sent before the others
    live.write('stdout', Buffer.from('x'.repeat(3 * OUTPUT_CHUNK_MAX_BYTES)));
    await live.close();
    expect(bodies.map((b) => b.seq)).toEqual([1]);
    expect(s.sent).toBe(0);
  });
});
