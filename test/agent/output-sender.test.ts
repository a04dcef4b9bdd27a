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

  it("paces a run's chunks to the controller's rate, but not its last chunk of each stream, which the signal waits for", async () => {
    vi.useFakeTimers();
    try {
      const got: OutputChunkBody[] = [];
      const s = new OutputSender({
        node: 'n1',
        log,
        send: async (_p, body) => {
          got.push(body);
          return { status: 200 };
        },
      });
      const plain = (revision: number) => ({ ...item, revision, inputs: [] }) as unknown as MetadataItem;
      // back-to-back runs that print on both streams, well past the burst: no wait on the (fake) clock
      const t0 = Date.now();
      const runs = OUTPUT_RATE_BURST + 10;
      for (let r = 1; r <= runs; r++) {
        const live = s.open(plain(r));
        live.write('stdout', Buffer.from(`run ${r}\n`));
        live.write('stderr', Buffer.from(`warn ${r}\n`));
        await live.close();
      }
      expect(got).toHaveLength(2 * runs);
      expect(Date.now() - t0).toBe(0);
      // one run's chunks before its last still wait for tokens (the bucket is empty now): chunks
      // 1-3 at one token each, the fourth, its last, at once after them
      const live = s.open(plain(runs + 1));
      const big = Buffer.alloc(OUTPUT_CHUNK_MAX_BYTES, 'x');
      for (let i = 0; i < 4; i++) live.write('stdout', big);
      const closed = live.close();
      await vi.advanceTimersByTimeAsync((2.5 * 1000) / OUTPUT_RATE_PER_S);
      expect(got).toHaveLength(2 * runs + 2);
      await vi.advanceTimersByTimeAsync(1000 / OUTPUT_RATE_PER_S);
      await closed;
      expect(got).toHaveLength(2 * runs + 4);
      s.stop();
    } finally {
      vi.useRealTimers();
    }
  });
});
