/** Waiting for a push dialer's events in tests, without sleeping. */
import type { PushEvents, PushService } from '../../controller/push/types.js';

/** The first dialer event `event` whose arguments satisfy `pred`, within `timeoutMs`. */
export function nextPushEvent<E extends keyof PushEvents>(
  d: Pick<PushService, 'on'> & { off: PushService['on'] },
  event: E,
  pred: (...args: Parameters<PushEvents[E]>) => boolean,
  timeoutMs = 5_000,
): Promise<Parameters<PushEvents[E]>> {
  return new Promise((resolve, reject) => {
    const fn = ((...args: Parameters<PushEvents[E]>) => {
      if (!pred(...args)) return;
      clearTimeout(timer);
      d.off(event, fn);
      resolve(args);
    }) as unknown as PushEvents[E];
    const timer = setTimeout(() => {
      d.off(event, fn);
      reject(new Error(`no matching '${event}' within ${timeoutMs} ms`));
    }, timeoutMs);
    d.on(event, fn);
  });
}
