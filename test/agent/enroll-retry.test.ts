/**
 * `herald agent enroll`'s retry budget (agent/enroll.ts): against a controller that refuses every
 * connection it keeps trying, jittered, until ENROLL_CLIENT_RETRY_BUDGET_MS from its first try
 * would be over, and no wait runs past it. Fake clock and sleep; a real closed port.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { enroll, type RetryNote } from '../../agent/enroll.js';
import { codeOf } from '../../protocol/errors.js';
import { ENROLL_CLIENT_BACKOFF_MAX_MS, ENROLL_CLIENT_RETRY_BUDGET_MS } from '../../protocol/limits.js';

async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

describe('herald agent enroll retry budget', () => {
  it('tries a refused connection again, jittered, for ENROLL_CLIENT_RETRY_BUDGET_MS from its first try and no longer', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-enroll-retry-'));
    let clock = 0;
    const notes: RetryNote[] = [];
    try {
      const err = await enroll({
        controller: `https://127.0.0.1:${await closedPort()}`,
        caSha256: 'a'.repeat(64),
        token: 'hj1.x',
        node: 'n1',
        pki: dir,
        now: () => clock,
        sleep: async (ms) => {
          clock += ms;
        },
        random: () => 0.999,
        onRetry: (n) => notes.push(n),
      }).catch((e: unknown) => e);
      expect(codeOf(err)).toBeDefined();
      // far more than a handful of tries: the budget, not a count, ends them
      expect(notes.length).toBeGreaterThan(10);
      const waited = notes.reduce((sum, n) => sum + n.waitMs, 0);
      expect(waited).toBeLessThanOrEqual(ENROLL_CLIENT_RETRY_BUDGET_MS);
      expect(waited).toBeGreaterThan(ENROLL_CLIENT_RETRY_BUDGET_MS - ENROLL_CLIENT_BACKOFF_MAX_MS);
      expect(notes.every((n) => n.leftMs >= 0)).toBe(true);
      expect(notes.at(-1)!.leftMs).toBe(ENROLL_CLIENT_RETRY_BUDGET_MS - waited);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
