import { describe, expect, it } from 'vitest';
import { OutputSender } from '../../agent/output-sender.js';
import type { MetadataItem } from '../../protocol/heat.js';
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
});
