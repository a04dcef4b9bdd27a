/**
 * Every limit and default of the Herald contract (docs/limits.md), in one place, each named with its
 * unit. Processes take their defaults from here; tests and docs refer to these names.
 */

// ---- wake-up channel (agent listener) -------------------------------------------------------
/** A wake-up frame larger than this is answered `too_large`. */
export const MAX_WAKE_FRAME_BYTES = 4 * 1024;
/** The WebSocket layer's own payload limit, set above the frame check so the agent can answer. */
export const MAX_WS_PAYLOAD_BYTES = 64 * 1024;
/**
 * The agent's WebSocket message limit on a push connection whose controller offers fetches
 * (`Herald-Features: fetch`): a metadata frame is a head of at most MAX_WAKE_FRAME_BYTES and the
 * largest metadata body the agent reads. Wake-ups on it are still refused over 4 KiB.
 */
export const MAX_PUSH_METADATA_FRAME_BYTES = 16 * 1024 * 1024 + 4 * 1024;
/**
 * A push connection with more than this of answers not yet written to its socket gets no other
 * request answered there (503 `fetch_unavailable` / `signal_unavailable`: the agent asks over
 * HTTPS), so an agent that asks and does not read cannot make the controller queue answers without end.
 */
export const MAX_PUSH_ANSWER_BUFFERED_BYTES = 1024 * 1024;
/** Timed-out requests per push connection whose late answers the agent still recognises, and drops. */
export const MAX_LATE_FETCH_ENTRIES = 4;
/** Requests (fetches and signals) over one push connection refused 429 in a row before the controller closes it (as the API does). */
export const MAX_PUSH_REFUSED_REQUESTS = 3;
/**
 * Requests from the push workers (agents' fetches and signals) the controller's main process
 * answers at once; the rest wait their turn in arrival order. A worker's batch can hold thousands
 * (one fetch per agent of a fan-out); started together, every answer's half-built objects were
 * alive at each young-generation collection and copied, twice the collector's time per fetch of
 * answering a few at a time (docs/performance.md, "Measured 2026-12-05 11:55-13:25"). Enough for the
 * PostgreSQL pool (PG_POOL_CONNECTIONS) to have work queued for every connection.
 */
export const MAX_PUSH_REQUESTS_IN_FLIGHT = 32;
/**
 * A batch of IPC messages between the main process and a push worker waits for the end of the
 * event loop's turn (so the events of many sockets travel together), but never longer than this
 * after its first message was queued: a worker reading thousands of sockets stays in one poll
 * phase for seconds, and fetches held that long left the main process idle while the wake-ups
 * went out (controller/push/turn-flusher.ts).
 */
export const IPC_BATCH_MAX_DELAY_MS = 2;
/** The push worker answers a request 503 (`fetch_unavailable`, `signal_unavailable`) when the API has not within this (the agent asks HTTPS). */
export const PUSH_REQUEST_ANSWER_TIMEOUT_MS = 20_000;
/**
 * The largest signal frame (head and body) an agent sends on a push connection: the controller's
 * WebSocket message limit. A larger signal goes over HTTPS, whose route takes up to MAX_SIGNAL_BODY_BYTES.
 */
export const MAX_PUSH_SIGNAL_FRAME_BYTES = MAX_WS_PAYLOAD_BYTES;
/** Longest allowed `exp - iat` of a wake-up. */
export const MAX_WAKE_LIFETIME_S = 300;
/** Lifetime the controller gives its wake-ups. */
export const WAKE_LIFETIME_S = 60;
/** Clock skew tolerated either way on `iat`/`exp`. */
export const CLOCK_SKEW_S = 30;
/** Entries the replay cache holds before it refuses new tokens (`replay_cache_full`). */
export const REPLAY_CACHE_CAPACITY = 100_000;
/** The agent answers every frame within this time; the controller treats silence as half-open. */
export const FRAME_ANSWER_TIMEOUT_MS = 1_000;
/** The controller pings every connection this often. */
export const PING_INTERVAL_MS = 30_000;
/** The agent closes a connection that sent neither ping nor frame for this long. */
export const AGENT_IDLE_CLOSE_MS = 90_000;
/** A push connection counts as healthy when a ping or frame came within this window. */
export const PUSH_HEALTHY_WINDOW_MS = 90_000;
/** TLS handshake plus WebSocket upgrade at the listener must finish within this. */
export const LISTENER_HANDSHAKE_TIMEOUT_MS = 5_000;
/**
 * How often Node's HTTP server checks the listener's connections for `headersTimeout` and
 * `requestTimeout` (its `connectionsCheckingInterval`, 30 s by default). A backstop only: the
 * listener's own timer cuts every connection not upgraded within LISTENER_HANDSHAKE_TIMEOUT_MS.
 * Each check wakes an idle agent, which costs it 0.3-0.6 ms of CPU here (docs/agent-footprint.md).
 */
export const LISTENER_HTTP_CHECK_INTERVAL_MS = 300_000;
/** Connections at one listener that have not yet authenticated. */
export const MAX_PENDING_CONNECTIONS = 16;
/** Authenticated connections at one listener (one per controller identity). */
export const MAX_AUTHENTICATED_CONNECTIONS = 4;
/** Bad frames on one connection before it is closed with 1008. */
export const MAX_BAD_FRAMES = 10;
/** Default agent listener port. */
export const DEFAULT_AGENT_PORT = 7443;

// ---- controller API -------------------------------------------------------------------------
/** Default controller API port. */
export const DEFAULT_CONTROLLER_PORT = 8443;
/** Largest request body of any API route but signals. */
export const MAX_REQUEST_BODY_BYTES = 1024 * 1024;
/** Largest signal body. */
export const MAX_SIGNAL_BODY_BYTES = 4 * 1024 * 1024;
/** Largest metadata response the agent reads. */
export const MAX_METADATA_RESPONSE_BYTES = 16 * 1024 * 1024;
/** Endpoint announcements per node: burst, then sustained rate. */
export const ANNOUNCE_RATE_BURST = 5;
export const ANNOUNCE_RATE_PER_S = 1;
/** Metadata fetches per node: burst, then sustained rate. */
export const FETCH_RATE_BURST = 10;
export const FETCH_RATE_PER_S = 5;
/** Any other request per identity: burst, then sustained rate. */
export const API_RATE_BURST = 200;
export const API_RATE_PER_S = 100;
/**
 * Idle keep-alive on API connections: longer than the agent's longest poll gap while push is
 * healthy (POLL_INTERVAL_HEALTHY_MS + jitter), so an agent's polls and its fetch after a wake-up
 * reuse one TLS connection instead of a full mutual handshake each (`npm run bench`: fan-out
 * fetches and idle traffic). The push connections live in worker processes, so the main
 * process's descriptors hold one such connection per agent.
 */
export const API_KEEP_ALIVE_TIMEOUT_MS = 900_000;
/**
 * Open API connections one agent identity may hold (the agent itself uses at most
 * AGENT_API_MAX_CONNECTIONS); requests on more are answered 429 `too_many_connections` and closed,
 * so a stolen agent key cannot hold thousands of kept-alive connections.
 */
export const API_AGENT_MAX_CONNECTIONS = 8;
/**
 * Open API connections one operator or controller identity may hold (a CLI `--wait`, event
 * streams, a dashboard); past it, as for agents, requests are refused `too_many_connections`
 * and the connection closed. One policy for every identity (docs/api.md).
 */
export const API_IDENTITY_MAX_CONNECTIONS = 32;
/**
 * Open API connections whose certificate did not authorize (no certificate, another CA, revoked,
 * no Herald identity), all peers together. Each is answered 403 and closed at its first request;
 * past this many at once, new ones are destroyed at the handshake.
 */
export const API_UNAUTHENTICATED_MAX_CONNECTIONS = 64;
/**
 * Of those, what one host (an IPv4 address, an IPv6 /64) and one network (IPv4 /24, IPv6 /48)
 * may hold: the networks the enrolment rate limits key on (protocol/address.ts peerNetworks), so
 * a peer inside one network cannot take the whole pool; it takes four networks to fill it. Past
 * a cap the connection is destroyed at the handshake, before a byte of a request is read.
 */
export const API_UNAUTHENTICATED_HOST_MAX_CONNECTIONS = 8;
export const API_UNAUTHENTICATED_NETWORK_MAX_CONNECTIONS = 16;
/**
 * A connection whose certificate did not authorize must have sent its request's headers within
 * this of its handshake, however it spends the time (it gets one answer, then is closed): a fixed
 * deadline, not an inactivity timer, so neither an idle connection nor one trickling a header
 * byte at a time holds a place in the pool longer. A filled pool thus empties every few seconds,
 * well inside the enrolling client's ENROLL_CLIENT_RETRY_BUDGET_MS.
 */
export const API_UNAUTHENTICATED_HEADERS_DEADLINE_MS = 5_000;
/** Consecutive 429 answers on one connection before it is closed (one 429 does not close it). */
export const API_RATE_LIMITED_BEFORE_CLOSE_REQUESTS = 3;
/** Connections the agent's fetcher opens to the API at once. */
export const AGENT_API_MAX_CONNECTIONS = 4;
/**
 * While push is healthy the agent closes an API connection idle this long (and those idle when
 * push becomes healthy, at once). Its fetches go over the push connection then (docs/protocol.md), so its
 * API connections carry the start-up announcement, signals, live output and renewals; kept open,
 * each would cost the controller a second TLS connection per agent (`npm run bench`: memory per
 * agent). Another one resumes its TLS session. While push is down they are kept for polling.
 */
export const AGENT_API_IDLE_CLOSE_MS = 5_000;
/**
 * Connections the kernel may queue for the API before it accepts them (capped by
 * net.core.somaxconn). After a fan-out thousands of agents connect at once; with Node's default
 * (511) the rest overflow into SYN retransmits (1 s, 3 s, 7 s, ...) and resets (`npm run bench`).
 */
export const API_LISTEN_BACKLOG_CONNECTIONS = 4_096;

/** Idle connections are closed after this, and a request's headers must arrive within it. */
export const API_HEADERS_TIMEOUT_MS = 10_000;
/**
 * A whole request (headers and body) must arrive within this at the API; a client of the API (the
 * agent's fetcher, the operator CLI) gives up on an answer after as long.
 */
export const API_REQUEST_TIMEOUT_MS = 30_000;
/**
 * Metadata bodies kept built, the most recently asked first (each for its node's current
 * generation): a body is built for a 200 only (a 304 needs the generation alone), so this serves
 * a generation asked for again soon (a fetch retried over HTTPS, a restarted agent's poll); it is
 * not a body per node, which at 10,000 nodes held 1-2 KB of the controller's memory per agent.
 */
export const METADATA_CACHE_ENTRIES = 2_000;
/** Server-Sent Events: a comment line this often keeps proxies from closing an idle stream. */
export const SSE_HEARTBEAT_INTERVAL_MS = 15_000;
/** Server-Sent Events: a client that lets this much pile up unread is dropped. */
export const MAX_SSE_BUFFERED_BYTES = 4 * 1024 * 1024;
/**
 * An operator's event stream re-reads its grants (and the nodes' labels and clusters) this often,
 * so a policy change made through another controller reaches it (docs/access.md); one made through
 * the stream's own controller reaches it at once.
 */
export const ACCESS_STREAM_REFRESH_MS = 5_000;
/**
 * Cluster ids a scoped operator's event stream remembers having shown, so it can show their
 * removal (whose event names no node); the oldest are forgotten past this.
 */
export const ACCESS_STREAM_SEEN_ENTRIES = 10_000;
/** Labels one node may carry (docs/access.md). */
export const MAX_NODE_LABEL_ENTRIES = 32;
/** Selectors one grant's scope may list (docs/access.md). */
export const MAX_GRANT_SELECTOR_ENTRIES = 32;
/**
 * An access check of at most this many nodes reads those nodes' labels and clusters one by one;
 * more (a large cluster's create), and it reads every node's in one query.
 */
export const ACCESS_FACTS_BY_KEY_ENTRIES = 64;
/** Acknowledged generations from the push dialer and fetches are written in batches this often. */
export const ACK_FLUSH_INTERVAL_MS = 500;
/** Cluster operations are checked for step deadlines and window slots this often. */
export const CLUSTER_TICK_INTERVAL_MS = 1_000;
/** The longest `pause_s` a restart accepts (seconds): a day (docs/api.md). */
export const MAX_RESTART_PAUSE_S = 86_400;
/** On SIGTERM, in-flight requests may finish for this long before their sockets are destroyed. */
export const CONTROLLER_SHUTDOWN_GRACE_MS = 10_000;
/**
 * Free-form JSON values (configs, options, input values, signal outputs, hook answers) may be
 * nested at most this many levels (docs/api.md): deeper ones are refused before anything walks them.
 */
export const MAX_JSON_DEPTH_LEVELS = 64;
/**
 * Symlinks an agent running as root follows in one path of its state or hooks dir while it checks
 * that every step is root-owned, before it refuses the path: Linux's own limit (ELOOP, "too many
 * levels of symbolic links").
 */
export const MAX_SYMLINK_LEVELS = 40;
/** Signals per node: burst, then sustained rate (a signal may be 4 MiB to parse). */
export const SIGNAL_RATE_BURST = 20;
export const SIGNAL_RATE_PER_S = 5;
/** Streamed output chunks per node: burst, then sustained rate (docs/limits.md). */
export const OUTPUT_RATE_BURST = 20;
export const OUTPUT_RATE_PER_S = 8;
/**
 * A metadata fetch within this long of a wake-up the controller sent that node is never
 * rate-limited (docs/api.md): the controller asked for it.
 */
export const WAKE_FETCH_EXEMPT_MS = 5_000;
/**
 * Each change that gives a node work (a wake-up) grants it one signal that is not rate-limited
 * (the controller asked for its result); a node holds at most this many such signals at once, on
 * each controller, so an agent cannot bank more than this over SIGNAL_RATE_BURST, and one that
 * signals by itself meets the limit.
 */
export const EXEMPT_SIGNALS_CAPACITY = 8;
/**
 * Each change that gives a node work also grants it this many live output chunks that are not
 * rate-limited: a run's last chunk of stdout and of stderr, which its signal waits for, so
 * back-to-back runs that print are not paced by their own output.
 */
export const EXEMPT_OUTPUT_PER_WAKE_REQUESTS = 2;
/** Such output chunks a node holds at most, on each controller (as EXEMPT_SIGNALS_CAPACITY). */
export const EXEMPT_OUTPUT_CAPACITY = EXEMPT_SIGNALS_CAPACITY * EXEMPT_OUTPUT_PER_WAKE_REQUESTS;
/** Refusals before authentication are logged at most once per code per this interval, with the count. */
export const REFUSAL_LOG_INTERVAL_MS = 10_000;
/**
 * An agent with several `--controller` URLs logs a switch from one to the next at most once per
 * this long; the line carries how many switches there were since the last one.
 */
export const CONTROLLER_SWITCH_LOG_INTERVAL_MS = 10_000;
/** Token buckets kept per identity before idle (full) ones are swept. */
export const MAX_RATE_BUCKETS = 100_000;

// ---- hooks ----------------------------------------------------------------------------------
/** Of each of stdout and stderr, the last this many bytes are kept. */
export const MAX_HOOK_OUTPUT_BYTES = 1024 * 1024;
/** Largest output file a hook may leave. */
export const MAX_OUTPUT_FILE_BYTES = 1024 * 1024;
/** A hook run's default timeout (`options.timeout`, in seconds, overrides). */
export const HOOK_TIMEOUT_S = 600;
/** Grace between TERM and KILL of a timed-out hook's process group. */
export const HOOK_KILL_GRACE_MS = 10_000;
/** After a hook's own process exits, how long its output pipes may drain (a daemon may hold them). */
export const HOOK_OUTPUT_DRAIN_MS = 200;
/** Live output (docs/api.md): what a running hook printed is sent at least this often. */
export const OUTPUT_FLUSH_INTERVAL_MS = 250;
/** Live output: a chunk's text is at most this many bytes (UTF-8); more is flushed at once. */
export const OUTPUT_CHUNK_MAX_BYTES = 64 * 1024;
/** Live output: chunks waiting at the agent, in bytes; past it the oldest are dropped (a gap). */
export const OUTPUT_QUEUE_MAX_BYTES = 1024 * 1024;
/** Live output: after the hook ended, how long the agent waits for queued chunks before it signals. */
export const OUTPUT_FINAL_FLUSH_WAIT_MS = 1_000;
/** Live output: the controller keeps the last this many bytes of chunks per revision. */
export const OUTPUT_KEPT_PER_REVISION_BYTES = 1024 * 1024;
/** On agent shutdown, how long a running hook may finish before it is recorded as interrupted. */
export const AGENT_SHUTDOWN_GRACE_MS = 10_000;
/**
 * The agent's state journal (`state.journal`, one fdatasync'd line per change) is folded into
 * `state.json` once it holds this much: a start replays at most this, and the fold (two atomic
 * replaces) comes once in some hundreds of changes.
 */
export const AGENT_STATE_JOURNAL_MAX_BYTES = 64 * 1024;
/**
 * A hook whose start fails with ETXTBSY (its script still open for writing in a process another
 * spawn forked at that moment) is started again after this, doubling, within the MAX_WAIT.
 */
export const HOOK_SPAWN_BUSY_RETRY_MS = 10;
export const HOOK_SPAWN_BUSY_MAX_WAIT_MS = 1_000;
/**
 * The hook launcher (agent/hooks/launcher.ts: a small process that starts hooks so the agent does
 * not fork itself for each) ends after this long without a run; the next run starts it again.
 */
export const HOOK_LAUNCHER_IDLE_CLOSE_MS = 5 * 60_000;
/** A hook whose launcher died while it ran is looked for in /proc this often, until it ended. */
export const HOOK_LAUNCHER_LOST_PROBE_MS = 50;
/** Of what the launcher itself writes on stderr (never a hook's), at most this much is logged. */
export const MAX_HOOK_LAUNCHER_STDERR_BYTES = 1024;
/**
 * The agent's start-up fetch waits for its endpoint announcement at most this long: a node the
 * announcement registers does not exist before it, and a fetch racing it would be a 404.
 */
export const AGENT_FIRST_POLL_WAIT_MS = 5_000;

// ---- polling --------------------------------------------------------------------------------
/** Fallback poll interval. */
export const POLL_INTERVAL_MS = 120_000;
/** Poll interval while push is healthy. */
export const POLL_INTERVAL_HEALTHY_MS = 600_000;
/** Poll jitter, as a fraction either way. */
export const POLL_JITTER_FRACTION = 0.1;
/**
 * When push is lost and a poll is already overdue, or due within this fraction of an interval, it
 * comes at a random moment in the rest of one interval after this fraction of it (30 s of the
 * 120 s default, the longest a controller waits between redials of a node,
 * RECONNECT_BACKOFF_MAX_MS): a controller that restarts redials its fleet first, and polls in
 * those seconds only compete with the redials for its CPU.
 */
export const POLL_AFTER_PUSH_LOSS_MIN_FRACTION = 0.25;

// ---- push dialer (controller) ---------------------------------------------------------------
/** Reconnect backoff: first ceiling and cap (full jitter below the ceiling). */
export const RECONNECT_BACKOFF_BASE_MS = 250;
export const RECONNECT_BACKOFF_MAX_MS = 30_000;
/** Connect (TCP + TLS + upgrade) to an agent listener must finish within this. */
export const DIAL_TIMEOUT_MS = 5_000;
/** Wake-ups awaiting their answer, across all nodes of one dialer. */
export const MAX_WAKES_IN_FLIGHT = 2_000;
/**
 * Push connections being dialled at once by one dialer: the rest wait their turn, so a
 * controller reconnecting 10,000 agents does not start 10,000 TLS handshakes that then all miss
 * DIAL_TIMEOUT_MS on a CPU-starved machine (~350 full mutual-TLS handshakes/s on 2 cores).
 */
export const MAX_DIALS_IN_FLIGHT = 128;
/** Time a push connection gets to finish its closing handshake (1001) before it is destroyed. */
export const PUSH_CLOSE_GRACE_MS = 1_000;

// ---- dialling out (agent, docs/dial-out.md) ------------------------------------------------------
/** An agent dialling out pings its connection this often... */
export const AGENT_DIAL_PING_INTERVAL_MS = 30_000;
/** ...and closes it (half-open) when no pong came within this: a dropped NAT mapping shows within 40 s. */
export const AGENT_DIAL_PONG_TIMEOUT_MS = 10_000;
/** Redial backoff of an agent dialling out: first ceiling and cap (full jitter below the ceiling). */
export const AGENT_DIAL_BACKOFF_BASE_MS = 250;
export const AGENT_DIAL_BACKOFF_MAX_MS = 30_000;
/** A dialled connection that lived this long resets the redial backoff when it ends. */
export const AGENT_DIAL_STABLE_MS = 60_000;
/** TCP (and a proxy's CONNECT), TLS and the WebSocket upgrade of an agent's dial must finish within this. */
export const AGENT_DIAL_TIMEOUT_MS = 10_000;
/**
 * A controller that closes the dialled connection with 1012 (it is restarting, and drains its
 * connections) is redialled at the next URL after a random delay below this.
 */
export const AGENT_DIAL_RESTART_DELAY_MAX_MS = 1_000;
/** The longest answer head (status line and headers) an agent reads from an HTTP CONNECT proxy. */
export const MAX_PROXY_ANSWER_HEAD_BYTES = 16 * 1024;

// ---- dialled-in push connections (controller, `--connect-listen`; docs/protocol.md) --------------
/**
 * A dialled-in connection from which nothing arrived (no WebSocket ping, no frame) for this long
 * is half-open: destroyed, `half_open`. The agent pings every 30 s, so this is two pings missed
 * and a margin; the controller itself never pings these (an idle agent costs no traffic).
 */
export const CONNECT_SILENCE_MAX_MS = 75_000;
/**
 * A controller stopping on purpose closes its dialled-in connections (1012) spread evenly over
 * this window, so its agents reconnect to the other controllers over 10 s and not all at once.
 */
export const CONNECT_DRAIN_WINDOW_MS = 10_000;
/** The longest drain window `--connect-drain-ms` may set: a stop stays well inside the forced exit. */
export const CONNECT_DRAIN_WINDOW_MAX_MS = 20_000;
/** TLS handshake plus WebSocket upgrade of a dialled-in connection must finish within this. */
export const CONNECT_HANDSHAKE_TIMEOUT_MS = 5_000;
/**
 * Dialled-in connections pending authentication, per process that serves them (each push
 * worker, or the main process with `--push-workers 0`), and, with push workers, sockets the main
 * process accepted and holds for each worker until it takes them (one at a time); more are
 * destroyed at accept (`too_many_connections`). Higher than the agent listener's 16: a restart
 * brings thousands of agents back at once, and ~350 full handshakes a second fit on two cores.
 */
export const MAX_CONNECT_PENDING_CONNECTIONS = 1_024;
/**
 * Authenticated dialled-in connections one process holds at most (503 `too_many_connections`
 * before the upgrade): inside the 20,000 descriptors of a process, with room for its other sockets.
 */
export const MAX_CONNECT_CONNECTIONS = 15_000;
/**
 * Store reads of a dialled-in node's generation (its first wake-up, the ping) at once; the rest
 * wait in arrival order. A restart brings thousands of agents back within seconds, and the
 * PostgreSQL pool refuses callers past PG_POOL_QUEUE_ENTRIES.
 */
export const MAX_ATTACH_PING_READS_IN_FLIGHT = 4;

// ---- signal outbox (agent) ------------------------------------------------------------------
export const OUTBOX_BACKOFF_BASE_MS = 500;
export const OUTBOX_BACKOFF_MAX_MS = 60_000;

// ---- cluster restart ------------------------------------------------------------------------
/** A restart step's deadline is the hook timeout plus this margin. */
export const RESTART_STEP_MARGIN_S = 60;

// ---- rollouts: restarts and upgrades (docs/api.md "Rollouts") -------------------------------
/**
 * A rollout with no `progress_deadline_s` fails once this long passes without progress (a node
 * completed, a resume, a promotion), or its steps' deadlines end to end if longer: never a hang.
 */
export const ROLLOUT_PROGRESS_DEADLINE_S = 3_600;
/** The longest `progress_deadline_s`, `node_deadline_s` and `auto_promote_s` a rollout accepts (seconds): a week. */
export const MAX_ROLLOUT_DEADLINE_S = 604_800;
/** A rollout's external gate (`gate`) must answer within this; a gate that does not cannot be read. */
export const GATE_TIMEOUT_MS = 5_000;
/** A gate that said stop (or could not be read) is asked again this long after. */
export const GATE_RETRY_INTERVAL_MS = 2_000;
/** The most of a gate's answer the controller reads (a Prometheus result); a longer one cannot be read. */
export const MAX_GATE_ANSWER_BYTES = 1024 * 1024;

// ---- several controllers on PostgreSQL (docs/several-controllers.md) -------------------------------------------
/** A controller writes its heartbeat (and renews its lease) this often. */
export const CONTROLLER_HEARTBEAT_INTERVAL_MS = 2_000;
/** A controller whose lease is this old is dead: its nodes are taken over; it stops pushing itself when its own lease ends. */
export const CONTROLLER_LEASE_MS = 8_000;
/** Each controller compares the owners of the nodes with the rendezvous spread this often (and at once on a membership change). */
export const OWNERSHIP_RECONCILE_INTERVAL_MS = 1_000;
/** A controller checks its own certificate (revoked, expired) this often, besides at every change of revoked.json or of the certificate. */
export const CONTROLLER_STANDING_CHECK_INTERVAL_MS = 1_000;
/** Without a membership change or a new node, a controller reads every node's owner this often (what others released meanwhile). */
export const OWNERSHIP_FULL_SCAN_INTERVAL_MS = 10_000;
/** After a membership change or a move of nodes, the owners are read at every reconcile for this long. */
export const OWNERSHIP_SETTLE_MS = 5_000;
/** The change log is read in batches of this many entries. */
export const CHANGE_FEED_BATCH_ENTRIES = 500;
/** The change log is read this often even without a notification (a notification lost without a reconnect). */
export const CHANGE_FEED_POLL_INTERVAL_MS = 2_000;
/** Change log entries older than this are deleted; a controller cut off longer re-reads its nodes instead. */
export const CHANGE_LOG_RETENTION_S = 600;
/** Pooled PostgreSQL connections per controller (`LISTEN` takes one more). */
export const PG_POOL_CONNECTIONS = 10;
/** Connections per controller kept for membership and ownership alone (lease renewals never queue behind bulk work). */
export const PG_CONTROL_CONNECTIONS = 2;
/** Longest wait between attempts to reconnect to PostgreSQL (from 50 ms, doubling). */
export const PG_RECONNECT_BACKOFF_MAX_S = 1;
/** Connecting to PostgreSQL gives up after this (then `store_unavailable`). */
export const PG_CONNECT_TIMEOUT_S = 3;
/** A statement running longer than this is cancelled: a stuck database is `store_unavailable`, not a hang. */
export const PG_STATEMENT_TIMEOUT_MS = 10_000;
/**
 * A statement waiting this long for a lock (another session's table or row lock) gives up
 * (`lock_timeout`): a locked table is `store_unavailable` well inside PG_STATEMENT_TIMEOUT_MS.
 */
export const PG_LOCK_TIMEOUT_MS = 5_000;
/** A transaction left idle this long (its client stalled) is ended by the server, and its locks with it. */
export const PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 10_000;
/**
 * A request waits this long at most for one of the PG_POOL_CONNECTIONS pooled connections,
 * then is answered `store_unavailable` (controller/store/pg/pool-gate.ts): the client's own queue has
 * no deadline.
 */
export const PG_POOL_WAIT_MS = 5_000;
/**
 * Requests waiting for a pooled connection at most; one more is refused `store_unavailable` at
 * once, so a stalled database holds a bounded number of requests (and their memory).
 */
export const PG_POOL_QUEUE_ENTRIES = 1_000;
/** `Retry-After` of a 503 `store_unavailable`. */
export const STORE_UNAVAILABLE_RETRY_AFTER_S = 1;
/**
 * A new cluster's (or node group's) members whose rows are inserted together, in one transaction
 * all the same: the rows of 10,000 members held to the end outlived V8's young generation and
 * were copied and promoted before they were inserted (20 % of the create's CPU in one process,
 * docs/performance.md "Measured 2026-12-06 16:25-17:45 UTC").
 */
export const CLUSTER_INSERT_BATCH_ENTRIES = 1_024;
/**
 * Rows one PostgreSQL statement of a many-row insert carries at most; more go in further
 * statements of the same transaction, so none of them nears PG_STATEMENT_TIMEOUT_MS. A cluster's
 * members come in batches of CLUSTER_INSERT_BATCH_ENTRIES (a deployment, its revision and a row
 * each: at most 1,024 rows a statement), so this is the bound for any other caller.
 */
export const PG_INSERT_MANY_MAX_ROWS = 10_000;
/** A transaction that lost a deadlock, a serialization check or a unique-key race with another controller runs again this many times. */
export const PG_TX_RETRY_ATTEMPTS = 3;

// ---- the audit trail (docs/access.md "Audit trail") ---------------------------------------------
/** Each controller signs a checkpoint over the audit chain's head this often, when rows came since the last one (and at start and stop). */
export const AUDIT_CHECKPOINT_INTERVAL_MS = 60_000;
/** Audit rows older than this are pruned (the `audit.prune` row and a checkpoint after it anchor what is kept). */
export const AUDIT_RETENTION_DAYS = 400;
/** At most this many audit rows are kept (by seq): older ones are pruned, however young. */
export const AUDIT_KEPT_MAX_ENTRIES = 2_000_000;
/** One pruning removes at most this many rows; the next checkpoint's turn goes on. */
export const AUDIT_PRUNE_BATCH_ENTRIES = 50_000;
/**
 * Audit rows read per query when the trail is exported, verified or checked before a checkpoint or
 * a pruning: a row holds a whole request (a body of up to MAX_REQUEST_BODY_BYTES), so a page is
 * kept small.
 */
export const AUDIT_PAGE_ENTRIES = 100;
/** `GET /v1/audit` (the list) leaves out a row's detail longer than this, naming its length; the export keeps it. */
export const AUDIT_LIST_DETAIL_MAX_BYTES = 64 * 1024;

// ---- PKI ------------------------------------------------------------------------------------
export const DEFAULT_TRUST_DOMAIN = 'herald.local';
export const DEFAULT_CERT_DAYS = 90;
export const CA_CERT_DAYS = 3650;
export const RSA_KEY_BITS = 2048;
/**
 * RSA key sizes Herald admits from a peer (a CSR's key): a public-key operation costs with the
 * modulus, so a peer may not choose it beyond this (SECURITY.md, "Enrolment"). The exponent
 * must be 65537.
 */
export const MIN_PEER_RSA_KEY_BITS = 2048;
export const MAX_PEER_RSA_KEY_BITS = 4096;

/** Length of the controller API's TLS session-ticket key (Node's `ticketKeys`: name, HMAC and AES keys of 16 bytes each). */
export const TLS_TICKET_KEY_BYTES = 48;
/**
 * A ticket key file older than this (its mtime) is replaced at start, and the key in use is
 * replaced this long after it was made. Node holds one key at a time: a rotation costs every
 * agent one full handshake.
 */
export const TLS_TICKET_KEY_ROTATE_MS = 24 * 3_600_000;
/**
 * Lifetime of an API session ticket (the server's `sessionTimeout`), and the longest an agent
 * keeps a session: no longer than the ticket key it was made with can live.
 */
export const TLS_SESSION_LIFETIME_S = TLS_TICKET_KEY_ROTATE_MS / 1000;
/** Sessions the agent's API client keeps, one per controller host:port (the oldest goes first). */
export const TLS_SESSION_STORE_ENTRIES = 16;
/**
 * Parsed certificates a process keeps by their DER bytes (certs/x509-parse.ts): one connection
 * reads its peer's certificate several times and every connection the same CA and issuers.
 */
export const X509_PARSE_CACHE_ENTRIES = 1_024;
/**
 * The pool 128-bit random tokens (wake-up ids, fetch nonces) are sliced from, refilled by the
 * CSPRNG when spent (protocol/random-token.ts): 256 tokens a refill.
 */
export const RANDOM_TOKEN_POOL_BYTES = 4 * 1024;
/** The pool the random part of row ids is taken from (controller/store/ids.ts): 409 ids a refill. */
export const ID_RANDOM_POOL_BYTES = 4 * 1024;
/**
 * SQLite's page cache of the controller's database (`PRAGMA cache_size`): better-sqlite3's
 * default is 16 MiB, filled slowly as the database grows; the hot rows (nodes, current
 * deployments) fit in far less, and the OS page cache holds the rest.
 */
export const SQLITE_PAGE_CACHE_BYTES = 4 * 1024 * 1024;
/**
 * SQLite's `busy_timeout`: how long a statement waits for the database file's lock. The
 * controller holds that lock for good (one controller a file), so no wait should ever reach it.
 */
export const SQLITE_BUSY_TIMEOUT_MS = 5_000;

// ---- who may call the object store (docs/heat.md) ---------------------------------------------
/** A longer `X-Auth-Token` is refused `token_invalid` unread (Keystone's Fernet tokens are ~200 bytes, its JWS ones ~800). */
export const MAX_OBJECT_STORE_TOKEN_BYTES = 8 * 1024;
/** One request to Keystone, connect to last byte; past it the check answers `token_unverifiable`. */
export const KEYSTONE_REQUEST_TIMEOUT_MS = 5_000;
/** The largest answer read from Keystone (tokens are asked for without their catalog). */
export const KEYSTONE_MAX_RESPONSE_BYTES = 1024 * 1024;
/**
 * Token validations waiting for Keystone at once (a burst of one token asks once); one more is
 * answered `token_unverifiable` without asking, so a flood of fresh tokens cannot pile up
 * requests on Keystone or memory here.
 */
export const KEYSTONE_MAX_REQUESTS_IN_FLIGHT = 16;
/**
 * How long Keystone's word on a valid token is kept (never past the token's `expires_at`): a token
 * revoked in Keystone is still accepted this long (keystonemiddleware keeps 300 s by default).
 */
export const KEYSTONE_TOKEN_CACHE_MS = 60_000;
/** Valid tokens kept (by SHA-256); the least recently used goes first. */
export const KEYSTONE_TOKEN_CACHE_ENTRIES = 10_000;
/** How long a token Keystone did not know (404) is refused without asking again. */
export const KEYSTONE_INVALID_TOKEN_CACHE_MS = 10_000;
/** Unknown tokens kept, apart from the valid ones, so a flood of bad tokens evicts no good one. */
export const KEYSTONE_INVALID_TOKEN_CACHE_ENTRIES = 1_000;
/**
 * The controller's own Keystone token is renewed this long (or half its lifetime, if shorter)
 * before it expires, as keystoneauth does; a 401 to it renews it at once.
 */
export const KEYSTONE_SERVICE_TOKEN_RENEW_BEFORE_MS = 120_000;
/** The largest static token file (docs/heat.md) read. */
export const MAX_STATIC_TOKEN_FILE_BYTES = 1024 * 1024;

// ---- enrolment and renewal (docs/adding-nodes.md) --------------------------------------------------------
/** Lifetime of a join token unless `ttl_s` says otherwise. */
export const JOIN_TOKEN_TTL_S = 3_600;
/** Longest lifetime a join token may be given. */
export const MAX_JOIN_TOKEN_TTL_S = 7 * 86_400;
/** Random bytes in a join token's secret (base64url in the token). */
export const JOIN_TOKEN_SECRET_BYTES = 32;
/** Lifetime of an agent certificate issued online (enrolment, renewal) unless `--agent-cert-lifetime`. */
export const AGENT_CERT_LIFETIME_S = 7 * 86_400;
/** Shortest `--agent-cert-lifetime` (tests use seconds; below this renewal could not keep up). */
export const MIN_AGENT_CERT_LIFETIME_S = 10;
/** An agent renews once this fraction of its certificate's lifetime has passed. */
export const RENEWAL_AT_FRACTION = 2 / 3;
/** From this fraction of the lifetime on, an agent whose renewal has not succeeded warns. */
export const RENEWAL_WARN_FRACTION = 0.9;
/**
 * A node's certificate is renewed at most once per this fraction of `--agent-cert-lifetime`
 * (`renewal_too_soon` before): at most four certificates issued per identity and lifetime, and
 * an agent whose answer was lost (renewing at 2/3) retries in time before its certificate ends.
 */
export const RENEWAL_MIN_INTERVAL_FRACTION = 1 / 4;
/** How often a controller re-reads the identity floors (revoked nodes) other controllers may have set. */
export const IDENTITY_FLOOR_REFRESH_MS = 5_000;
/** Renewal retries: first ceiling and cap (full jitter), also bounded by the time left. */
export const RENEWAL_BACKOFF_BASE_MS = 1_000;
export const RENEWAL_BACKOFF_MAX_MS = 300_000;
/** `POST /v1/enroll` attempts per source address: burst, then this rate. */
export const ENROLL_RATE_BURST = 5;
export const ENROLL_RATE_PER_S = 0.1;
/**
 * `POST /v1/enroll` attempts per source network (IPv4 /24, IPv6 /48; the per-address limit above
 * counts an IPv6 /64 as one address): room for a rack enrolling at once, not for a scan spread
 * over a network's addresses (protocol/address.ts peerNetworks).
 */
export const ENROLL_NETWORK_RATE_BURST = 50;
export const ENROLL_NETWORK_RATE_PER_S = 1;
/** Body limit of `POST /v1/enroll` and of a renewal (a CSR and a token). */
export const MAX_ENROLL_BODY_BYTES = 16 * 1024;
/**
 * An enrolment whose answer was lost can be asked again: the same token with the same CSR key
 * (and node) gets the same certificate back on the same controller for this long after the
 * token was spent. At most this many such answers are kept (the oldest forgotten first).
 */
export const ENROLL_REPLAY_WINDOW_MS = 5 * 60_000;
export const ENROLL_REPLAY_MAX_ENTRIES = 1_024;
/**
 * `herald agent enroll` tries again on a connection error, a 429 or a 503 (keeping its key, so a
 * lost answer is asked again: ENROLL_REPLAY_WINDOW_MS) until ENROLL_CLIENT_RETRY_BUDGET_MS have
 * passed since its first try: long enough to outlast a pre-authentication pool held by a peer of
 * several networks, each of whose connections is closed within API_UNAUTHENTICATED_HEADERS_DEADLINE_MS.
 * Between tries full jitter doubling from the base to the cap, or the controller's Retry-After
 * plus that jitter when it gives one and it is at most ENROLL_CLIENT_RETRY_AFTER_MAX_S; no wait
 * runs past the budget.
 */
export const ENROLL_CLIENT_RETRY_BUDGET_MS = 90_000;
export const ENROLL_CLIENT_BACKOFF_BASE_MS = 500;
export const ENROLL_CLIENT_BACKOFF_MAX_MS = 8_000;
export const ENROLL_CLIENT_RETRY_AFTER_MAX_S = 60;

/**
 * V8's young-generation semi-space cap for Herald's processes (`node --max-semi-space-size`, in
 * MiB there). Node's default lets it grow to 16 MiB per semi-space under a steady stream of
 * changes and keep it: over 10,800 changes the controller's RSS grew 43 % and each agent's 43 %;
 * capped at 2 MiB, 10.5 % and 1.6 % (BENCHMARKS.md, soak), with the fan-out's controller CPU and
 * times unchanged or better and ~22 % less controller memory per agent. V8 reads it only at start:
 * it is on `bin/herald`'s `#!` line and in the agent unit's `ExecStart` (protocol/node-flags.ts).
 */
export const NODE_MAX_SEMI_SPACE_BYTES = 2 * 1024 * 1024;
/**
 * glibc's mmap threshold in the push worker processes (`GLIBC_TUNABLES=glibc.malloc.mmap_threshold`,
 * set when the controller forks them). Node keeps a 64 KiB read buffer and a 16 KiB write buffer
 * for each TLS connection it holds, and only their first pages are ever written (a record or
 * two). Carved from the heap, they land on memory that earlier allocations (handshakes, IPC)
 * dirtied, and count in full; mapped on their own, they cost the pages written. A push worker
 * holds thousands of such connections for days (BENCHMARKS.md, memory per agent). The price:
 * OpenSSL's ~17 KB record buffers, taken and given back for each record, are mapped too (~40 µs
 * of CPU a round trip, `node dist/bench/tls-record-cost.js`; not seen beyond the spread in a
 * fan-out, docs/performance.md).
 */
export const PUSH_WORKER_MMAP_THRESHOLD_BYTES = 16 * 1024;
/**
 * Lifetime of the agent listener's TLS session tickets (its `sessionTimeout`), the period after
 * which it replaces its ticket key, and the longest the push dialer keeps a client session: a
 * controller restarted after a crash resumes its push connections instead of a full mutual
 * handshake each.
 */
export const PUSH_TLS_SESSION_LIFETIME_S = 86_400;
/** Most push worker processes one controller starts (`--push-workers`). */
export const MAX_PUSH_WORKER_PROCESSES = 64;
/**
 * Most push workers a controller starts when `--push-workers` is not given (its default is one
 * fewer than the cores, controller/options.ts): each worker holds ~58-65 MB with no agents, and
 * past a few workers the main process, which answers every fetch (~0.21 ms an agent), is what a
 * fan-out waits for.
 */
export const MAX_DEFAULT_PUSH_WORKER_PROCESSES = 4;
/** How often the controller's main process checks whether it is quiet with garbage to collect (controller/idle-collector.ts). */
export const IDLE_GC_CHECK_MS = 5_000;
/** Quiet: its event loop busy at most this fraction of the last check's interval. */
export const IDLE_GC_MAX_BUSY_FRACTION = 0.25;
/** It collects when V8's used heap has grown this much since its last collection (or the lowest seen). */
export const IDLE_GC_MIN_GARBAGE_BYTES = 32 * 1024 * 1024;
/** Client sessions one push dialer keeps, one per node (the oldest goes first). */
export const PUSH_TLS_SESSION_STORE_ENTRIES = 100_000;
/** A push session file is rewritten when it holds this many lines more than live sessions (certs/session-file.ts). */
export const PUSH_TLS_SESSION_FILE_SLACK_ENTRIES = 20_000;

/**
 * The longest delay a Node timer takes (2^31 - 1 ms, about 24.8 days): a longer one fires after
 * 1 ms with a TimeoutOverflowWarning, so every timer that could be longer is clamped to it.
 */
export const MAX_TIMER_DELAY_MS = 2 ** 31 - 1;

// ---- Heat's object store (docs/heat.md) ---------------------------------------------------

/** The largest object the object store keeps: a node's whole metadata from Heat, or a result. */
export const OBJECT_STORE_OBJECT_MAX_BYTES = 4 * 1024 * 1024;
/** Objects in one container (a stack's signals, a node's metadata): a token holder cannot fill the database. */
export const OBJECT_STORE_CONTAINER_OBJECTS_MAX_ENTRIES = 10_000;
/** Containers in one account. */
export const OBJECT_STORE_ACCOUNT_CONTAINERS_MAX_ENTRIES = 10_000;
/** Most names one container or account listing returns (Swift's default). */
export const OBJECT_STORE_LISTING_MAX_ENTRIES = 10_000;
/**
 * Connections to the object store listener at once, all peers together, and from one host or
 * network. Heat opens a new connection for each look at a signal object (about one a second per
 * deployment in progress) and leaves it open: with the short keep-alive below each lingers a
 * couple of seconds, so one Heat host holds a few per deployment in progress, and 512 fit ~150.
 */
export const OBJECT_STORE_MAX_CONNECTIONS = 2_048;
export const OBJECT_STORE_MAX_HOST_CONNECTIONS = 512;
export const OBJECT_STORE_MAX_NETWORK_CONNECTIONS = 1_024;
/** Request headers within this after a connection's handshake (or its previous request). */
export const OBJECT_STORE_HEADERS_TIMEOUT_MS = 10_000;
/** A whole request, body included. */
export const OBJECT_STORE_REQUEST_TIMEOUT_MS = 30_000;
/**
 * Idle keep-alive: long enough for a HEAD's GET on the same connection, short because neither Heat
 * nor os-collect-config reuses a connection later: an idle one only holds a descriptor and a slot.
 */
export const OBJECT_STORE_KEEP_ALIVE_TIMEOUT_MS = 2_000;
/** How long a refused request's body is read and discarded before its answer goes out anyway (then the connection is closed). */
export const OBJECT_STORE_REFUSED_BODY_LINGER_MS = 2_000;
