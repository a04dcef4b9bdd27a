/**
 * The outbox honours a 429's Retry-After: no signal goes before it, and a fetch's `retryNow`
 * does not cut that wait short. Found by the latency benchmark once signals went over the push
 * connection: back-to-back changes to one node made the agent retry its rate-limited signal at
 * every fetch, three 429s in a row closed the push connection (as the API closes its own), and
 * the next wake-up waited for the redial.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { OutboxSender, type SignalAnswer } from '../../agent/outbox.js';
import { OutboxStore } from '../../agent/outbox-store.js';
import type { SignalBody } from '../../protocol/heat.js';
import { tempDir } from './hooks-helpers.js';

let base: string;
beforeAll(async () => {
  base = await tempDir('herald-outbox-ra-');
});
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

const quiet = { info() {}, warn() {}, error() {}, debug() {} } as never;
const entry = {
  node: 'n1',
  deployment_id: 'd1',
  path: '/v1/nodes/n1/deployments/d1/signal',
  body: { revision: 1, deploy_status_code: 0, deploy_stdout: '', deploy_stderr: '', outputs: {} } as SignalBody,
};

/** Lets every timer-free continuation run: a retry `retryNow` released would have been sent by then. */
async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

/** A send stand-in answering `answers` in turn (then 200), with a promise per call made. */
function sender(answers: SignalAnswer[]): {
  send: () => Promise<SignalAnswer>;
  calls: () => number;
  called: (n: number) => Promise<void>;
} {
  let n = 0;
  const waiting: Array<{ n: number; resolve: () => void }> = [];
  return {
    send: async () => {
      n++;
      for (const w of waiting.filter((x) => x.n <= n)) w.resolve();
      return answers.shift() ?? { status: 200 };
    },
    calls: () => n,
    called: (k) => (n >= k ? Promise.resolve() : new Promise((resolve) => waiting.push({ n: k, resolve }))),
  };
}

/**
 * An outbox in `dir` whose signal has been sent once (answered `answers[0]`), and that has settled
 * into its wait, with the backoff given (`random` picks within its full jitter).
 */
async function afterFirstSend(
  dir: string,
  answers: SignalAnswer[],
  backoff: { baseMs: number; maxMs: number; random: number },
): Promise<{ outbox: OutboxSender; s: ReturnType<typeof sender> }> {
  const s = sender(answers);
  const outbox = new OutboxSender({
    store: await OutboxStore.open(join(base, dir)),
    log: quiet,
    backoffBaseMs: backoff.baseMs,
    backoffMaxMs: backoff.maxMs,
    random: () => backoff.random,
    send: s.send,
  });
  await outbox.put(entry);
  await s.called(1);
  await settle();
  return { outbox, s };
}

describe("outbox: a 429's Retry-After", () => {
  it('holds the retry: retryNow does not cut it short', async () => {
    const { outbox, s } = await afterFirstSend('a', [{ status: 429, retryAfterMs: 60_000 }], {
      baseMs: 1,
      maxMs: 120_000,
      random: 0,
    });
    // a fetch succeeds (the agent calls retryNow): without the Retry-After this would send at once
    outbox.retryNow();
    await settle();
    expect(s.calls()).toBe(1);
    expect(outbox.delivered).toBe(0);
    await outbox.stop();
    expect(s.calls()).toBe(1);
  });

  it('a short Retry-After passes and the signal is delivered; a plain refusal is retried on retryNow', async () => {
    const { outbox, s } = await afterFirstSend('b', [{ status: 429, retryAfterMs: 20 }, { status: 503 }], {
      baseMs: 60_000,
      maxMs: 60_000,
      random: 0.99,
    });
    // the 429's wait is the backoff (here about a minute) or the Retry-After, whichever is longer;
    // retryNow ends the backoff, and the retry goes once the 20 ms Retry-After is over
    outbox.retryNow();
    await s.called(2);
    // the 503 carries no Retry-After: retryNow sends again at once
    await settle();
    outbox.retryNow();
    await outbox.idle();
    expect(s.calls()).toBe(3);
    expect(outbox.delivered).toBe(1);
    await outbox.stop();
  });
});
