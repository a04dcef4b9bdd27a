/**
 * What heat-all's log (cli/testbed/heat.ts: oslo.log, debug level, times in UTC to the
 * millisecond) tells of a stack operation: when Heat's API received a request for the stack, and
 * when the stack reached a state. The demo's timeline and the benchmark read Heat's side from
 * here; nothing here does I/O.
 *
 *   2026-12-07 21:50:00.889 5256 INFO heat.common.wsgi [None req-… admin - - - - -] Processing request: PATCH /v1/admin/stacks/h1
 *   2026-12-07 21:50:03.188 5256 INFO heat.engine.stack [None req-… admin - - - - -] Stack UPDATE COMPLETE (h1): Stack UPDATE completed successfully
 */

/** One line of Heat's log: its time (epoch ms) and message. */
export interface HeatLogLine {
  at: number;
  logger: string;
  message: string;
}

const LINE_RE = /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d\.\d{3}) \d+ [A-Z]+ (\S+) (?:\[[^\]]*\] )?(.*)$/;

/** The lines of `text` that have oslo.log's shape (a traceback's continuation lines have not). */
export function heatLogLines(text: string): HeatLogLine[] {
  const out: HeatLogLine[] = [];
  for (const line of text.split('\n')) {
    const m = LINE_RE.exec(line);
    if (!m) continue;
    const at = Date.parse(`${m[1]}T${m[2]}Z`);
    if (Number.isFinite(at)) out.push({ at, logger: m[3]!, message: m[4]! });
  }
  return out;
}

/**
 * When Heat's API first received `method` for the stack `stack` (by name: the CLI's first request
 * names it, and a redirect adds its id) at or after `afterMs`; undefined when it has not.
 */
export function requestReceivedAt(text: string, method: string, stack: string, afterMs = 0): number | undefined {
  const prefix = `Processing request: ${method} `;
  for (const l of heatLogLines(text)) {
    if (l.at < afterMs || l.logger !== 'heat.common.wsgi' || !l.message.startsWith(prefix)) continue;
    const path = l.message.slice(prefix.length).split(' ')[0]!;
    if (/\/stacks\/([^/]+)(?:\/[^/]+)?$/.exec(path)?.[1] === stack) return l.at;
  }
  return undefined;
}

/** A stack's state as Heat logged it: `UPDATE COMPLETE`, with the reason Heat gave. */
export interface StackStateLine {
  at: number;
  action: string;
  status: string;
  reason: string;
}

/**
 * The first state of `action` (CREATE, UPDATE, DELETE) that ends an operation (COMPLETE or
 * FAILED) Heat logged for the stack `stack` at or after `afterMs`; undefined until it has.
 */
export function stackEndedAt(text: string, stack: string, action: string, afterMs = 0): StackStateLine | undefined {
  const head = `Stack ${action} `;
  for (const l of heatLogLines(text)) {
    if (l.at < afterMs || l.logger !== 'heat.engine.stack' || !l.message.startsWith(head)) continue;
    const m = /^Stack (\S+) (COMPLETE|FAILED) \((.*?)\): ?(.*)$/.exec(l.message);
    if (m && m[3] === stack) return { at: l.at, action: m[1]!, status: m[2]!, reason: m[4]! };
  }
  return undefined;
}
