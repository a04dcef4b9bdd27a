/**
 * The agent's pipeline (agent/pipeline.ts) with its parts faked at their smallest interface: a
 * fetcher whose answers the test gives, an apply loop, an outbox and a live output sender that
 * record what they were told. The coalescer is the pipeline's own and the poller the real one,
 * on a fake clock, so the retry policy checked here is the one the agent runs.
 */
import { describe, expect, it } from 'vitest';
import type { FetchResult } from '../../agent/fetcher.js';
import { FetchStatusError, RateLimitedError } from '../../agent/fetcher.js';
import { AgentPipeline } from '../../agent/pipeline.js';
import { Poller } from '../../agent/poller.js';
import type { MetadataDocument } from '../../protocol/heat.js';
import type { WakeClaims, WakeReason } from '../../protocol/wake.js';
import { memoryLog } from '../helpers/agent-pki.js';
import { FakeClock } from './fake-clock.js';

const INTERVAL_MS = 120_000;
/** With random 0.5: the first retry after a failure comes half of POLL_RETRY_BASE_MS (1 s) later. */
const FIRST_RETRY_MS = 500;

function claims(gen: number, reason: WakeReason = 'deployment'): WakeClaims {
  return { iss: 'controller', aud: 'agent/n1', iat: 0, exp: 60, jti: `jti-${gen}-${reason}`, gen, reason };
}

function doc(gen: number): MetadataDocument {
  return { node: 'n1', generation: gen, deployments: [] };
}

/** Lets every promise the last step settled run its continuations. */
const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

function pipelineWithFakes() {
  const clock = new FakeClock();
  const { log, lines } = memoryLog();
  /** The fetches asked of the fetcher, each answered by the test. */
  const fetches: Array<{ answer(r: FetchResult): void; fail(err: unknown): void }> = [];
  const submitted: MetadataDocument[] = [];
  const observed: Array<{ status: number; gen: number; poll: boolean }> = [];
  const failures: unknown[] = [];
  const counts = { retryNow: 0, granted: 0 };
  // the poller polls through the pipeline, which tells the poller about wake-ups' fetches
  let pipeline: AgentPipeline | undefined;
  const poller = new Poller({
    intervalMs: INTERVAL_MS,
    healthyIntervalMs: 600_000,
    timers: clock,
    random: () => 0.5, // no jitter: the intervals below are exact
    isPushHealthy: () => false,
    poll: () => pipeline!.onPoll(),
  });
  pipeline = new AgentPipeline({
    fetcher: {
      fetchMetadata: () => new Promise((answer, fail) => fetches.push({ answer, fail })),
    },
    apply: { submit: (d) => void submitted.push(d) },
    outbox: { retryNow: () => void counts.retryNow++ },
    output: { granted: () => void counts.granted++ },
    poller,
    log,
    observe: {
      fetched: (r, poll) => void observed.push({ status: r.status, gen: r.gen, poll }),
      fetchFailed: (err) => void failures.push(err),
    },
  });
  return { p: pipeline, poller, clock, fetches, submitted, observed, failures, counts, lines };
}

/** Starts the poller; its start-up poll gets a 304 for `gen`: the next poll is one interval later. */
async function startPolling(f: ReturnType<typeof pipelineWithFakes>, gen = 0): Promise<void> {
  f.poller.start(true);
  expect(f.fetches).toHaveLength(1);
  f.fetches[0]!.answer({ status: 304, gen });
  await settle();
  expect(f.poller.nextDueAt).toBe(INTERVAL_MS);
}

describe('agent pipeline: wake-ups and polls share one fetch', () => {
  it('a wake-up arriving while a poll fetches is covered by that fetch: one fetch, one document applied', async () => {
    const f = pipelineWithFakes();
    f.poller.start(true); // the start-up poll: its fetch starts at once
    expect(f.fetches).toHaveLength(1);
    expect(f.p.onWake(claims(7))).toBe('queued');
    expect(f.p.onWake(claims(6))).toBe('queued');
    f.fetches[0]!.answer({ status: 200, gen: 7, document: doc(7) });
    await settle();

    expect(f.fetches).toHaveLength(1);
    expect(f.p.coalescer.fetchCount).toBe(1);
    expect(f.submitted).toEqual([doc(7)]);
    expect(f.observed).toEqual([{ status: 200, gen: 7, poll: true }]);
    expect(f.p.lastFetchedGen).toBe(7);
    // the poll got its answer: the next one is an interval later, not a retry
    expect(f.poller.polls).toBe(1);
    expect(f.poller.nextDueAt).toBe(INTERVAL_MS);
    // a later wake-up for what was fetched fetches nothing
    expect(f.p.onWake(claims(7))).toBe('current');
    expect(f.fetches).toHaveLength(1);
  });

  it("a poll arriving while a wake-up's fetch runs waits behind it, then fetches once, whatever else arrives", async () => {
    const f = pipelineWithFakes();
    expect(f.p.onWake(claims(5))).toBe('started');
    const polled = f.p.onPoll();
    expect(f.p.onWake(claims(6))).toBe('queued');
    const polledAgain = f.p.onPoll();
    expect(f.fetches).toHaveLength(1);

    f.fetches[0]!.answer({ status: 200, gen: 6, document: doc(6) });
    await settle();
    // a poll always fetches (If-None-Match makes it a 304), even when a wake-up's fetch saw its generation
    expect(f.fetches).toHaveLength(2);
    f.fetches[1]!.answer({ status: 304, gen: 6 });
    expect(await polled).toBe(true);
    expect(await polledAgain).toBe(true);

    expect(f.p.coalescer.fetchCount).toBe(2);
    expect(f.submitted).toEqual([doc(6)]);
    // the queued fetch started outside the poll's call: it reports as not a poll's
    expect(f.observed).toEqual([
      { status: 200, gen: 6, poll: false },
      { status: 304, gen: 6, poll: false },
    ]);
  });

  it('a fetched document is applied once; a 304 applies nothing; every answer lets the outbox retry', async () => {
    const f = pipelineWithFakes();
    f.p.onWake(claims(3));
    f.fetches[0]!.answer({ status: 200, gen: 3, document: doc(3) });
    await settle();
    expect(f.submitted).toEqual([doc(3)]);
    expect(f.counts.retryNow).toBe(1);
    expect(f.lines.filter((l) => l.msg === 'metadata fetched').map((l) => l.gen)).toEqual([3]);

    const polled = f.p.onPoll();
    f.fetches[1]!.answer({ status: 304, gen: 3 });
    expect(await polled).toBe(true);
    expect(f.submitted).toEqual([doc(3)]);
    expect(f.counts.retryNow).toBe(2);
    expect(f.fetches).toHaveLength(2);
  });

  it('a wake-up grants live output past the limit; a ping grants none', () => {
    const f = pipelineWithFakes();
    f.p.onWake(claims(1, 'ping'));
    expect(f.counts.granted).toBe(0);
    f.p.onWake(claims(1, 'restart'));
    f.p.onWake(claims(2, 'deployment'));
    expect(f.counts.granted).toBe(2);
  });

  it("a wake-up's fetch that got its answer moves the next poll to an interval after it", async () => {
    const f = pipelineWithFakes();
    await startPolling(f);
    await f.clock.advance(30_000);
    f.p.onWake(claims(4));
    f.fetches[1]!.answer({ status: 304, gen: 4 });
    await settle();
    expect(f.poller.nextDueAt).toBe(30_000 + INTERVAL_MS);
    expect(f.poller.polls).toBe(1);
  });
});

describe('agent pipeline: a failed fetch', () => {
  it("a wake-up's fetch that failed on the network is retried by the poller after a backoff, not an interval", async () => {
    const f = pipelineWithFakes();
    await startPolling(f);
    await f.clock.advance(10_000);
    f.p.onWake(claims(2));
    f.fetches[1]!.fail(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }));
    await settle();

    expect(f.failures).toHaveLength(1);
    expect(f.lines.filter((l) => l.msg === 'metadata fetch failed').map((l) => l.code)).toEqual(['ECONNREFUSED']);
    expect(f.submitted).toEqual([]);
    expect(f.poller.nextDueAt).toBe(10_000 + FIRST_RETRY_MS);

    await f.clock.advance(FIRST_RETRY_MS);
    expect(f.fetches).toHaveLength(3);
    expect(f.poller.polls).toBe(2);
    f.fetches[2]!.answer({ status: 200, gen: 2, document: doc(2) });
    await settle();
    expect(f.submitted).toEqual([doc(2)]);
    expect(f.observed.at(-1)).toEqual({ status: 200, gen: 2, poll: true });
    // answered: back to the interval
    expect(f.poller.nextDueAt).toBe(10_000 + FIRST_RETRY_MS + INTERVAL_MS);
  });

  it("a wake-up's fetch answered 5xx is retried as soon; a 429 not before its Retry-After", async () => {
    const f = pipelineWithFakes();
    await startPolling(f);
    await f.clock.advance(10_000);
    f.p.onWake(claims(2));
    f.fetches[1]!.fail(new FetchStatusError(503, 'unavailable'));
    await settle();
    expect(f.lines.filter((l) => l.msg === 'metadata fetch failed').map((l) => l.code)).toEqual(['bad_response']);
    expect(f.poller.nextDueAt).toBe(10_000 + FIRST_RETRY_MS);

    f.p.onWake(claims(2));
    f.fetches[2]!.fail(new RateLimitedError('slow down', 30_000));
    await settle();
    expect(f.lines.filter((l) => l.msg === 'metadata fetch failed').map((l) => l.code)).toEqual([
      'bad_response',
      'rate_limited',
    ]);
    expect(f.poller.nextDueAt).toBe(10_000 + 30_000);
  });

  it("a wake-up's fetch refused (a 4xx, a bad signature) waits for the next poll", async () => {
    const f = pipelineWithFakes();
    await startPolling(f);
    await f.clock.advance(10_000);
    f.p.onWake(claims(2));
    f.fetches[1]!.fail(new FetchStatusError(403, 'forbidden'));
    await settle();
    expect(f.failures).toHaveLength(1);
    expect(f.poller.nextDueAt).toBe(INTERVAL_MS);
    // the wake-up is not taken as fetched: the next one for that generation fetches again
    expect(f.p.onWake(claims(2))).toBe('started');
  });

  it('a failed poll reports failure to the poller, which retries it after a backoff', async () => {
    const f = pipelineWithFakes();
    f.poller.start(true);
    f.fetches[0]!.fail(Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }));
    await settle();
    expect(f.poller.polls).toBe(1);
    expect(f.poller.nextDueAt).toBe(FIRST_RETRY_MS);
    await f.clock.advance(FIRST_RETRY_MS);
    expect(f.poller.polls).toBe(2);
    expect(f.fetches).toHaveLength(2);
  });
});
