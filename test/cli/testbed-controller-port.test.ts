/**
 * The testbed (cli/testbed/: the demo's, the tests' and the benchmark's) starts controllers on
 * port 0 and reads the port the kernel gave from the controller's "controller listening" line (a
 * port chosen first could be taken by another process before the controller bound it).
 * `listenedPort` reads that line from a log.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { listenedPort } from '../../cli/testbed/controller.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-demo-sup-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function log(name: string, lines: string[]): string {
  const p = path.join(dir, name);
  fs.writeFileSync(p, lines.join('\n'));
  return p;
}

const line = (o: Record<string, unknown>): string => JSON.stringify({ level: 30, time: 1, ...o });

describe('the port a demo controller listens on', () => {
  it('is read from its "controller listening" line, past other lines', () => {
    const p = log('a.log', [
      line({ msg: 'store opened' }),
      line({ msg: 'controller listening', listen: '127.0.0.1:41317', health: null }),
    ]);
    expect(listenedPort(p)).toBe(41317);
  });

  it('is the last such line when the log holds an older one', () => {
    const p = log('g.log', [
      line({ msg: 'controller listening', listen: '127.0.0.1:1111' }),
      line({ msg: 'controller listening', listen: '127.0.0.1:2222' }),
    ]);
    expect(listenedPort(p)).toBe(2222);
  });

  it('is the last colon-separated part of an IPv6 address', () => {
    expect(listenedPort(log('b.log', [line({ msg: 'controller listening', listen: '::1:8443' })]))).toBe(8443);
  });

  it('is not known yet before the line, or from a line cut off mid-write, or without a log', () => {
    expect(listenedPort(log('c.log', [line({ msg: 'store opened' })]))).toBeUndefined();
    expect(
      listenedPort(log('d.log', ['{"level":30,"msg":"controller listening","listen":"127.0.0.1:41'])),
    ).toBeUndefined();
    expect(listenedPort(log('e.log', [line({ msg: 'controller listening', listen: '127.0.0.1:0' })]))).toBeUndefined();
    expect(listenedPort(path.join(dir, 'missing.log'))).toBeUndefined();
  });

  it('is not taken from another message that mentions it', () => {
    const p = log('f.log', [line({ msg: 'not the "controller listening" line', listen: '127.0.0.1:1234' })]);
    expect(listenedPort(p)).toBeUndefined();
  });
});
