/**
 * The demo's progress while a slow step runs (Heat's start, a stack create): on a terminal, one
 * line redrawn with the time so far and cleared when the step ends; elsewhere (a log, a test), a
 * line every WAITING_LINE_EVERY_MS, so a long wait is never silent.
 */

/** How often the terminal line is redrawn. */
const WAITING_REDRAW_MS = 250;
/** How often a line is written when the output is not a terminal. */
export const WAITING_LINE_EVERY_MS = 10_000;

const FRAMES = ['|', '/', '-', '\\'];

/** Resolves (or rejects) as `work` does, telling `out` meanwhile that `label` is under way. */
export async function whileWaiting<T>(
  out: NodeJS.WritableStream & { isTTY?: boolean },
  label: string,
  work: Promise<T>,
): Promise<T> {
  const t0 = Date.now();
  const secs = (): string => `${((Date.now() - t0) / 1000).toFixed(0)} s`;
  let i = 0;
  const timer =
    out.isTTY === true
      ? setInterval(() => out.write(`\r  ${FRAMES[i++ % FRAMES.length]} ${label} ${secs()}\u001b[K`), WAITING_REDRAW_MS)
      : setInterval(() => out.write(`  … ${label}: ${secs()} so far\n`), WAITING_LINE_EVERY_MS);
  try {
    return await work;
  } finally {
    clearInterval(timer);
    if (out.isTTY === true) out.write('\r\u001b[K');
  }
}
