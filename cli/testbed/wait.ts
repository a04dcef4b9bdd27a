/**
 * Waiting in the testbed (docs/development.md, "The testbed"): the processes are separate, so a
 * condition is polled, never slept for, and a process that must stay up ends the wait at once
 * when it exits, with the tail of its log. Also the one typed error of the testbed.
 */
import { tail, type HeraldProcess } from './process.js';

/** Why the testbed gave up: a wait ran out, a process it watched exited, or a bad option. */
export type TestbedErrorCode = 'timeout' | 'exited' | 'bad_option';

export class TestbedError extends Error {
  constructor(
    readonly code: TestbedErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'TestbedError';
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export interface WaitOptions {
  /** How long to wait before the TestbedError `timeout`. */
  timeoutMs: number;
  /** How often to ask again (default 20 ms). */
  everyMs?: number | undefined;
  /** Processes that must not exit meanwhile: one that does ends the wait (TestbedError `exited`). */
  watch?: readonly HeraldProcess[] | undefined;
  /** Errors `fn` throws that end the wait at once (others are retried; the last is named at the timeout). */
  rethrow?: ((err: unknown) => boolean) | undefined;
}

/**
 * Polls `fn` until it returns a truthy value, and returns it.
 * @throws TestbedError `timeout` after `timeoutMs` (naming `what` and the last error `fn`
 *   threw), `exited` when a watched process exits first (with its log's tail); or what `fn`
 *   threw when `rethrow` says so
 */
export async function waitFor<T>(what: string, fn: () => T | Promise<T>, o: WaitOptions): Promise<NonNullable<T>> {
  const t0 = Date.now();
  let last: unknown;
  for (;;) {
    const dead = o.watch?.find((p) => p.hasExited());
    if (dead)
      throw new TestbedError(
        'exited',
        `${dead.name} exited while waiting for ${what}; its log (${dead.logFile}):\n${tail(dead.logFile)}`,
      );
    try {
      const v = await fn();
      if (v) return v as NonNullable<T>;
    } catch (err) {
      if (o.rethrow?.(err)) throw err;
      last = err;
    }
    if (Date.now() - t0 > o.timeoutMs)
      throw new TestbedError(
        'timeout',
        `timed out after ${o.timeoutMs} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message ?? String(last)})` : ''}`,
        { cause: last },
      );
    await sleep(o.everyMs ?? 20);
  }
}
