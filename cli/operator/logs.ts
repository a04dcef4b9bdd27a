/**
 * `herald deploy logs <id> [--follow]` (docs/api.md): prints a revision's kept live output (stdout
 * to stdout, stderr to stderr), and with `--follow` the chunks `/v1/events` brings as they come
 * until the revision is signalled; then it exits 0, or EXIT_FAILED when the deployment FAILED
 * (as `deploy create --wait` does), or EXIT_TIMEOUT at `--timeout`.
 *
 * The event stream is opened before the kept output is read, so no chunk falls between the two;
 * a chunk already in the kept output is not printed again (its sequence number). Events are
 * best-effort, so the deployment is also re-read now and then: a missed `deployment` event does
 * not leave the command waiting.
 *
 * The text is a node's: it is printed through `visible()` (terminal-text.ts), so the hook's
 * terminal control bytes are shown rather than obeyed, unless `raw`.
 */
import type { DeploymentOutputView, OutputEventView, OutputStream } from '../../protocol/output.js';
import type { DeploymentView } from '../../protocol/rest.js';
import type { ApiClient, SseEvent } from './client.js';
import { jsonText, visible } from '../terminal-text.js';

export interface LogsOptions {
  follow: boolean;
  revision?: number | undefined;
  timeoutMs: number;
  json: boolean;
  /** Print the node's text as it came, terminal control bytes included (`--raw`). */
  raw?: boolean;
  write?: (stream: OutputStream, text: string) => void;
}

/** How often `--follow` re-reads the deployment, ms (events are best-effort). */
const FOLLOW_POLL_INTERVAL_MS = 2_000;
/** How long the event stream may take to open before the kept output is read anyway, ms. */
const STREAM_OPEN_WAIT_MS = 5_000;
/** After the signal, how long late chunks are still printed, ms. */
const FOLLOW_TAIL_MS = 500;

export interface LogsOutcome {
  /** undefined: 0. */
  exitCode: 'failed' | 'timeout' | undefined;
}

export async function deployLogs(client: ApiClient, id: string, o: LogsOptions): Promise<LogsOutcome> {
  const sink = o.write ?? ((s: OutputStream, t: string) => (s === 'stdout' ? process.stdout : process.stderr).write(t));
  // every string printed below passes here: a node's control bytes made visible unless --raw
  const write = (s: OutputStream, t: string): void => sink(s, o.raw === true ? t : visible(t));
  const path = (rev?: number): string =>
    `/v1/deployments/${encodeURIComponent(id)}/output${rev === undefined ? '' : `?revision=${rev}`}`;
  if (!o.follow) {
    const kept = await client.get<DeploymentOutputView>(path(o.revision));
    if (o.json) sink('stdout', `${jsonText(kept, o.raw === true)}\n`);
    else printKept(kept, write);
    return { exitCode: undefined };
  }

  const early: OutputEventView[] = [];
  let onChunk: ((e: OutputEventView) => void) | undefined;
  let onDeployment: ((d: DeploymentView) => void) | undefined;
  let opened: () => void = () => undefined;
  const open = new Promise<void>((r) => {
    opened = r;
  });
  const stream = client.events(
    (e: SseEvent) => {
      const data = e.data as Record<string, unknown> | null;
      if (data === null || typeof data !== 'object' || data.deployment_id !== id) return;
      if (e.event === 'output') {
        const c = data as unknown as OutputEventView;
        if (onChunk) onChunk(c);
        else early.push(c);
      } else if (e.event === 'deployment') onDeployment?.(data as unknown as DeploymentView);
    },
    (state) => {
      if (state === 'open') opened();
    },
  );
  try {
    // a stream that cannot open does not hold the kept output back (events are best-effort)
    let openTimer: NodeJS.Timeout | undefined;
    await Promise.race([open, new Promise((r) => (openTimer = setTimeout(r, STREAM_OPEN_WAIT_MS)))]);
    clearTimeout(openTimer);
    const kept = await client.get<DeploymentOutputView>(path(o.revision));
    const revision = kept.revision;
    printKept(kept, write);
    let printed = Math.max(kept.stdout.last_seq ?? 0, kept.stderr.last_seq ?? 0);
    const print = (c: OutputEventView): void => {
      if (c.revision !== revision || c.seq <= printed) return;
      printed = c.seq;
      if (c.dropped_bytes) write(c.stream, `[herald: ${c.dropped_bytes} bytes of output not streamed]\n`);
      write(c.stream, c.text);
    };
    for (const c of early.splice(0)) print(c);
    onChunk = print;

    const current = await client.get<DeploymentView>(`/v1/deployments/${encodeURIComponent(id)}`);
    const finished = (d: DeploymentView): boolean => d.revision > revision || d.status !== 'IN_PROGRESS';
    let last = current;
    if (!kept.signalled && !finished(current)) {
      last = await new Promise<DeploymentView>((resolve) => {
        const deadline = setTimeout(() => resolve(last), o.timeoutMs);
        const poll = setInterval(() => {
          client
            .get<DeploymentView>(`/v1/deployments/${encodeURIComponent(id)}`)
            .then(check)
            .catch(() => undefined);
        }, FOLLOW_POLL_INTERVAL_MS);
        function check(d: DeploymentView): void {
          last = d;
          if (!finished(d)) return;
          clearTimeout(deadline);
          clearInterval(poll);
          resolve(d);
        }
        onDeployment = check;
      });
      if (!finished(last)) return { exitCode: 'timeout' };
      await new Promise((r) => setTimeout(r, FOLLOW_TAIL_MS));
    }
    const failed = last.revision === revision ? last.status === 'FAILED' : false;
    return { exitCode: failed ? 'failed' : undefined };
  } finally {
    stream.close();
  }
}

function printKept(kept: DeploymentOutputView, write: (s: OutputStream, t: string) => void): void {
  if (kept.stdout.text !== '') write('stdout', kept.stdout.text);
  if (kept.stderr.text !== '') write('stderr', kept.stderr.text);
}
