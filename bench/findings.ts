/**
 * The prose of BENCHMARKS.md that explains the figures: what the profiles showed, what was
 * changed, what would fix what is still missed. Figures are taken from this run's results; the
 * few that are not (the "before" side of a fix, profile shares) name the run that produced them:
 * `npm run bench` at an earlier commit, or `npm run bench -- --profile <dir>`, which brackets each
 * measured window with the V8 profiler in every process (bench/prof-preload.ts).
 */
import type { ReportInput } from './report.js';
import { median, round } from './util.js';

const f = (x: number | undefined, d = 1): string => (x === undefined || !Number.isFinite(x) ? 'n/a' : round(x, d).toLocaleString('en-US'));

export function findings(r: ReportInput['results']): string[] {
  const L: string[] = [];
  const p = (...xs: string[]): void => {
    L.push(...xs);
  };
  const lat = r.latency;
  const b = lat?.push.breakdown ?? null;
  const f1k = r.fanout.find((x) => x.n === 1_000);
  const big = [...r.fanout].sort((a, c) => c.n - a.n)[0];
  const t = r.idle?.traffic ?? null;
  const fp = r.idle?.footprint ?? null;

  p('## What limits the figures, and what would fix them', '');
  p('Profiles: `npm run bench -- --profile <dir>` starts every process with a preload that runs the V8 profiler over');
  p('exactly the measured windows (SIGUSR2 in, SIGUSR2 out) and writes one `.cpuprofile` per process (open them in');
  p('Chrome DevTools or speedscope for flame graphs). The shares quoted below are from such runs on this machine.', '');

  p('### 1. PATCH → hook started (goal p50 ≤ 5 ms, p99 ≤ 15 ms)', '');
  if (b) {
    p(`Of the median ${f(lat?.push.hookStartMs.p50)} ms: ${f(b.patchToWake)} ms until the agent verified the wake-up (the PATCH's commit, an IPC hop to`);
    p(`the push worker, signing, the frame), ${f(b.wakeToFetched)} ms for the kept-alive, signature-checked fetch, ${f(b.fetchedToItemStarted)} ms until the item`);
    p(`is marked started (two atomic, fsync'd state writes: the fetched generation, then the item), and ${f(b.itemStartedToHook)} ms from there`);
    p('to the hook\'s first line.');
  }
  p('The largest item is `child_process.spawn` itself: the agent\'s profile shows ~10-12 ms of synchronous CPU per');
  p('hook in the native `spawn` (Node forks the whole agent process on Linux; copying its page tables is what costs).');
  p('The same `spawn(\'/bin/sh\')` takes ~9 ms from a 46 MB Node process and ~17 ms from a 150 MB one on this machine, so');
  p('the agent pays it per hook whatever Herald does around it. What would fix it: launch hooks through a tiny');
  p('resident launcher (forked once at start, a few MB; its fork+exec is well under 1 ms), or a native spawn that uses');
  p('`posix_spawn`/`vfork`. Then: write the fetched generation after starting the hook rather than before (one fsync');
  p('off the path), and avoid the IPC hop to the push worker for single changes. Together that is ~15 ms of the');
  p('median; the goal needs all of it.', '');
  p('The conformance check\'s "deployment COMPLETE in 947 ms after POST" (issue 7) is not the push path\'s steady');
  p('state: it posts its deployment the moment the agent has announced itself, and the controller answers the API');
  p('before its push worker process is up (the log says "controller listening" after the agent\'s announcement and');
  p('the deployment were already served). The wake-up waits for the worker to fork and load (~0.1 s idle, up to ~1 s');
  p('under the parallel test load of that run), then for the dial; and the first hook also loads the hook runner');
  p(`lazily. Measured here: the first change after an agent started (push already connected) reached its hook in`);
  p(`${f(lat?.push.coldHookStartMs)} ms and COMPLETE in ${f(lat?.push.coldCompleteMs)} ms; the same check re-run on a quiet machine reported 154 ms. Fix: start`);
  p('the push workers before the API starts listening, so that the first wake-up does not wait for them.', '');

  p('### 2. Fan-out: all fetched (goal 1,000 agents ≤ 0.6 s, 10,000 ≤ 8 s)', '');
  if (f1k) {
    const fetched = median(f1k.runs.map((x) => x.allFetchedMs));
    const acked = median(f1k.runs.map((x) => x.allAckedMs));
    p(`At 1,000 agents the last wake-up was acked after ${f(acked / 1000, 2)} s and the last fetch done after ${f(fetched / 1000, 2)} s. The wake-ups are cheap`);
    p('(the push worker signs and sends 1,000 of them in well under 100 ms of CPU); the fetches are not: every woken');
    p('agent opens a NEW mutual-TLS connection to the API, because the API closes idle connections after 5 s');
    p('(`API_KEEP_ALIVE_TIMEOUT_MS`). A fan-out is thus N full handshakes on the controller\'s single main thread');
    p('(`getPeerX509Certificate` + `authorizePeer` + RSA on every connection) and N on the agents, whose side costs');
    p('more: Node calls `getPeerCertificate(true)` for every `checkServerIdentity` (~2 ms each in the harness profile).');
  }
  p('All of it runs on this machine\'s two cores, the simulated agents\' handshakes included; when a harness process');
  p('falls more than 1 s behind, the controller declares its connections half-open (`FRAME_ANSWER_TIMEOUT_MS`) and');
  p('reconnects them, which adds handshakes to a machine already short of CPU. The harness keeps at most 64 fetches');
  p('of a process in flight to keep that in check (bench/sim-agent.ts); the fetches still have to be done by the same');
  p('two cores.', '');
  p('What would fix it: keep each agent\'s fetch connection open (a long keep-alive on the API: with the push');
  p('connections in worker processes, the main process has room for 10,000 idle sockets inside its 20,000');
  p('descriptors, at ~70 KB each), so that a woken agent sends one request on a warm connection (~1 ms end to end,');
  p('the physical floor in NODE20-NOTES); or TLS session resumption with tickets (about half the handshake); or');
  p('deliver the signed metadata on the push connection itself. Until then the goals are missed by the factors in');
  p('the goals table.', '');
  if (big) {
    const c = big.crash;
    const run = big.runs[0];
    p(`At N = ${big.n.toLocaleString('en-US')}: connecting the fresh agents took ${f((run?.connectAllMs ?? NaN) / 1000)} s and ${f(run?.controllerCpuConnectS)} s of controller CPU`);
    p(`(~${f(((run?.controllerCpuConnectS ?? NaN) * 1000) / big.n)} ms per agent: the announcement, the start-up fetches and the push dial, each a full`);
    p(`handshake). The controller held ${f(run?.controllerRssKb.perAgent)} KB of RSS per connected agent (goal ≤ 80 KB).`);
    if (c) {
      // a figure never reached is null in a stored BENCHMARKS.json
      const all = typeof c.connectAllMs === 'number' && Number.isFinite(c.connectAllMs);
      const conn = all
        ? `had all ${big.n.toLocaleString('en-US')} connected again after ${f(c.connectAllMs / 1000)} s`
        : `had ${c.metricsConnected.toLocaleString('en-US')} of ${big.n.toLocaleString('en-US')} connected again when the window closed`;
      p(`After a crash with a change pending, the restarted controller ${conn}; ${c.fetched.toLocaleString('en-US')} agents held the change after`);
      p(`${f(c.allFetchedMs / 1000)} s, ${c.fetchedByPoll.toLocaleString('en-US')} of them through their own poll (120 s) rather than their wake-up.`);
      p(`${c.noneLost ? 'None was lost.' : 'The rest would have had it at their next poll: not lost for good, but not pushed.'} The redial is bounded by \`MAX_DIALS_IN_FLIGHT\``);
      p('(128 per worker) and, again, by full handshakes; the agents\' handshakes compete for the same two cores.');
    }
    p('');
  }

  p('### 3. Problems the benchmark found on the way (not timing goals)', '');
  p('- **A wake-up whose fetch fails is not retried until the next poll** (120 s, or 600 s while push is healthy):');
  p('  the agent has acked it `started`, the controller counts it delivered, and the change waits. Seen twice. (a) Under');
  p('  load, 1-5 % of a 1,000-agent fan-out\'s fetches died with ECONNRESET: the agent reused a kept-alive socket the');
  p('  API had just closed (its 5 s idle timeout; the agent\'s own 4 s timer fired late). Fixed for that case: the');
  p('  fetcher retries a GET once on a new connection when a reused socket was reset (below); since then every run');
  p('  fetched N of N. (b) Changes to one node faster than the API\'s 5 fetches/s per node: the fetch gets 429 and is');
  p('  dropped. Still open; fix in agent/coalescer.ts: while a wake-up\'s generation is not covered, retry with');
  p('  backoff, honouring `Retry-After`. The latency phase spreads its changes over 4 agents to stay under the limit.');
  p('- **Listen backlog**: the API listened with Node\'s default backlog (511). At 5,000 agents the kernel counted');
  p('  19,226 listen-queue overflows in one fan-out (`npm run bench -- --only fanout --n 5000`, before the fix): SYN');
  p('  retransmits of 1, 3, 7 s and resets, 295 agents whose fetch failed, the last fetch after 111 s. Fixed (below).');
  p('- **Cluster bookkeeping is O(N) per signal**: every signal of a cluster step loads the whole cluster (all its');
  p('  nodes) two or three times (`#onClusterStepResult`, `#advanceCluster`, then `clusterView` for the event). In the');
  p('  100-node restart profile `getCluster` alone is the largest self-time item of the saturated controller main');
  p('  thread. A 10,000-node restart is O(N²) and, with `MAX_PLAN_ROUNDS = 10_000`, throws "did not settle" (one');
  p('  start action is applied per round). This, and a node belonging to one cluster at a time, is why each fan-out');
  p('  run here starts from a fresh controller and fresh agents. Fix: look up the one node row by its deployment,');
  p('  keep per-phase counts (or a COUNT query) for the planner, apply a plan\'s start actions in one round, and');
  p('  build the cluster view for events only when someone listens.');
  p('- **Start-up fetch races the announcement**: an agent\'s first poll reaches the controller before its');
  p('  announcement has created the node, gets 404, and retries after a backoff: one wasted TLS connection per agent');
  p('  start, 10,000 of them when a fleet starts. Fix: poll once the first announcement attempt has answered.');
  p('- A push worker crashes with an unhandled `EPIPE` from `process.send` when its parent has just died (seen when the');
  p('  benchmark kills a controller); harmless, but noisy.', '');

  if (t || fp) {
    p('### 4. Idle traffic and footprint', '');
    if (t) {
      const pings = 120 * t.ping.bytesPerPing;
      const polls = 6 * t.poll.bytesPerPoll;
      p(`Per agent-hour with push healthy: ${f(pings / 1000)} kB of pings (${f(t.ping.bytesPerPing, 0)} B each: ping, pong and an ACK) and ${f(polls / 1000)} kB of`);
      p(`polls: six a hour at the 600 s healthy interval, each a new TLS connection of ${f(t.poll.bytesPerPoll / 1000)} kB (two RSA certificate chains,`);
      p('the request, the signed 304, the close). The polls are most of it. What would fix it: a longer healthy poll');
      p('interval (at ~1 h the total is within the goal), TLS session resumption for polls (no certificates), or');
      p('ECDSA certificates (a fifth of the size); the pings alone are within the goal.', '');
    }
    if (fp) {
      p(`The idle agent holds ${f(fp.freshRssKb / 1024)} MB RSS (goal 52 MB) and spends ${f(fp.freshCpuSPerHour, 2)} CPU-s per hour (goal 0.5): the`);
      p('CPU is the 120 pings an hour and the timers around them; the RSS is Node plus what the idle agent loads');
      p('(TLS, ws, pino, the state); the hook runner and execa load only with the first hook (the latency agent after');
      p(`its hooks: ${f(fp.afterHooksRssKb / 1024)} MB). The footprint agent idles beside the fan-out runs: on a loaded machine each wake-up`);
      p('of an idle process costs it more CPU (cold caches, contended cores), so the CPU figure is an upper bound; for the');
      p('goal, compare a run of `npm run bench -- --only idle` on a quiet machine.', '');
    }
  }

  p('## Product changes made for this benchmark', '');
  p('Each small, each measured by this suite:', '');
  p('| change | where | before → after |');
  p('|---|---|---|');
  p('| `Tx.add` kept its lists\' membership in a Set (was `Array.includes`, O(N²) for a cluster\'s 2N deployment ids) | `controller/sqlite-store.ts` | `createCluster` of 5,000 nodes in the store alone: 9.0 s (7.2 s of it in `add`) → O(N); `POST /v1/clusters` for 10,000 nodes is answered in seconds |');
  p('| one TLS context per https agent (`secureContext`), instead of a new one per connection (the key parsed again each time) | `certs/tls.ts` `httpsAgentFor` | ~4 ms of CPU per new fetch connection in the harness profile (`createSecureContext`, 1 per fetch) → 1 per agent |');
  p('| the fetcher retries a GET once on a new connection when a reused kept-alive socket was reset (ECONNRESET/EPIPE, `req.reusedSocket`) | `agent/fetcher.ts` `#request` | 1,000-agent fan-out under load: 12 of 1,000 agents never fetched the change (their wake-up lost until the next poll) → 1,000 of 1,000 |');
  const f5k = r.fanout.find((x) => x.n === 5_000)?.runs[0];
  const after5k = f5k ? `${(f5k.tcp.ListenOverflows ?? 0).toLocaleString('en-US')} overflows, ${f5k.fetched.toLocaleString('en-US')} of 5,000 fetched (this run)` : 'see the fan-out table';
  p(`| the API listens with a backlog of 4,096 (\`API_LISTEN_BACKLOG_CONNECTIONS\`) instead of Node's 511 | \`controller/api.ts\`, \`protocol/limits.ts\` | 5,000-agent fan-out: 19,226 listen overflows, 295 lost fetches → ${after5k} |`);
  p('');
  return L;
}
