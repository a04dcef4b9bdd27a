/**
 * Every refusal Herald can answer has a stable code, listed here with its meaning. docs/errors.md's
 * "Error codes" table documents the same list; `test/protocol/errors.test.ts` keeps the two in
 * sync. Tests assert on codes, never on messages.
 */
export const ERROR_CODES = {
  // wake-up frames (docs/protocol.md); also used for metadata signatures where they apply
  malformed: 'the frame or token is not a well-formed compact JWS with JSON claims',
  too_large: 'the frame is over the 4 KiB wake-up limit',
  binary_frame: 'a binary WebSocket frame; wake-ups are text',
  bad_algorithm: 'the JWS `alg` is not EdDSA',
  bad_header: 'the protected header has parameters other than alg, kid and typ',
  missing_kid: 'the protected header has no `kid`',
  unknown_kid: 'the `kid` is not in the trusted JWKS (or was revoked)',
  wrong_type: 'the `typ` is not the one expected (a metadata token used as a wake-up, or the reverse)',
  bad_signature: 'the signature does not verify with the named key',
  expired: 'the token is past `exp` (beyond the allowed clock skew)',
  not_yet_valid: '`iat` is in the future beyond the allowed clock skew',
  lifetime_too_long: '`exp - iat` is over 300 s',
  issued_before_start: 'the token was issued before the agent started (its replay cache is new)',
  wrong_audience: "`aud` is not the receiver's SPIFFE id",
  wrong_issuer: "`iss` is not the sender's SPIFFE id (the TLS peer, or the expected controller)",
  replayed: 'the `jti` was already accepted and has not expired',
  replay_cache_full: 'the replay cache is full of unexpired entries; the token is refused rather than a replay risked',
  bad_gen: '`gen` is not a non-negative integer',
  bad_claims: 'a required claim is missing or of the wrong type',

  // metadata responses (docs/api.md), checked by the agent
  missing_signature: 'the response has no Herald-Signature header',
  nonce_mismatch: 'the signature was made for another request nonce',
  digest_mismatch: 'the body does not match the signed `sha256`',
  rollback: 'the generation is lower than the last one applied',
  response_too_large: 'the metadata response is over 16 MiB',
  bad_response: 'the controller answered with an unexpected status or body',
  unexpected_frame:
    'a metadata or signalled frame on the push connection that answers no fetch or signal the agent asked there (or names another nonce)',
  push_fetch_failed:
    'a fetch over the push connection got no answer (the connection closed, or no answer in time); the agent fetches over HTTPS',
  push_signal_failed:
    'a signal over the push connection got no answer (the connection closed, or no answer in time); the agent signals over HTTPS',

  // TLS peers and identities (docs/configuration.md)
  no_client_certificate: 'the peer presented no certificate',
  untrusted_certificate: 'the certificate does not chain to the cluster CA',
  certificate_expired: 'the certificate is expired or not yet valid',
  revoked:
    "the certificate's serial is in revoked.json, or its identity was revoked (or the certificate superseded by a renewal) after it was issued",
  wrong_role: "the identity's role is not the one this endpoint serves",
  no_identity: 'the certificate has no Herald SPIFFE URI SAN',
  multiple_identities: 'the certificate has more than one URI SAN',
  wrong_trust_domain: 'the SPIFFE id is of another trust domain',
  bad_identity: 'the SPIFFE path is not exactly <role>/<name> with a valid role and name',
  wrong_eku: "the certificate's extended key usage does not fit its role",
  wrong_peer:
    "the server presented another identity than the one dialled, or a controller outside the agent's `--controller-id` connected to its listener",
  bad_issuer:
    'the certificate is signed by an intermediate that is not a Herald issuer (a CA signed by the cluster CA, pathLen 0, URI SAN spiffe://<trust domain>/issuer/<name>), or a Herald issuer signed something other than an agent certificate',
  tls_version: 'the peer did not negotiate TLS 1.3',

  // agent listener: connection-level refusals and WebSocket close reasons (docs/protocol.md)
  upgrade_required:
    "a plain HTTP request to /v1/wake (or to the controller's /v1/connect); only a WebSocket upgrade is served there",
  too_many_connections:
    'the listener holds its limit of pending (16) or authenticated (4) connections; at the API (429), the agent identity already holds 8 connections; a connection without a valid certificate past 64 in all, 8 from its host (an IPv4 address, an IPv6 /64) or 16 from its network (IPv4 /24, IPv6 /48) is destroyed before its request is read',
  handshake_timeout: 'TLS handshake plus WebSocket upgrade did not finish within 5 s; the socket was destroyed',
  tls_handshake_failed: 'the TLS handshake failed (a TLS version below 1.3, a bad certificate, or garbage)',
  idle_timeout: 'the connection sent neither ping nor frame for 90 s (WebSocket close 1000)',
  headers_timeout:
    'at the API, a connection without a valid certificate had not sent its request headers 5 s after its handshake, however slowly it was sending them; it was closed',
  pipelined_request:
    'at the API, a connection without a valid certificate sent a second request; it runs one, so the second was not run and the connection was closed after the first answer',
  client_gone: 'the client closed its connection before its request ran, so the request was not run',
  connection_replaced:
    'a newer connection from the same identity replaced this one (WebSocket close 4000): at the agent listener, of the same controller; at the controller, of the same node (dialled in)',
  connect_unavailable:
    'at the controller, no push worker could take a dialled-in connection (all were being restarted): its socket was closed',
  too_many_bad_frames: 'ten bad frames on one connection (WebSocket close 1008)',
  shutting_down:
    'the agent is stopping (WebSocket close 1001), or the controller is: it closes its dialled-in connections (1012) and refuses new ones (503)',

  // controller API (docs/api.md)
  wrong_node: 'an agent asked about another node than its own',
  forbidden:
    "the operator holds no grant whose role allows this (docs/access.md): reading needs viewer, running existing configs deployer, creating configs author, nodes, join tokens, certificates and grants admin; the controller's log line and `herald can-i` name the rule",
  out_of_scope:
    "the operator's role allows this, but not on this target: a node, cluster or node group the request names is outside the scope of their grants, or the route needs the role over the whole fleet (`*`) (docs/access.md)",
  not_found: 'no such resource or route',
  method_not_allowed: 'the route exists but not with this method',
  invalid_request: 'the body or a parameter failed validation (see `field`)',
  invalid_json: 'the body is not JSON',
  unsupported_media_type: 'the body is not application/json',
  body_too_large: "the body is over the route's limit (1 MiB, signals 4 MiB)",
  rate_limited: 'too many requests from this identity; retry after Retry-After seconds',
  unknown_node: 'the deployment or cluster names a node that does not exist',
  unknown_config: 'the deployment or cluster names a config that does not exist',
  unknown_nodegroup: 'the restart names a node group the cluster does not have (see `field`)',
  node_exists: 'a node with this id exists already',
  node_deleted: 'the node was deleted; only an operator can add it again',
  endpoint_not_in_san: "the endpoint host is not among the caller certificate's DNS or IP SANs",
  link_local_endpoint: 'the endpoint is a link-local address',
  forbidden_endpoint:
    'the endpoint is a cloud metadata service address (in any spelling), or its DNS name resolved to one of the refused addresses when the controller dialled it',
  bad_endpoint: 'the endpoint is not wss://host:port/v1/wake',
  stale_revision: 'the signal is for an older revision than the current one',
  unknown_revision: 'the signal is for a revision newer than the current one',
  empty_chunk: 'a live output chunk with no text (it would be kept without counting against the per-revision limit)',
  output_closed: "a live output chunk for a revision whose result is in: that revision's output is final",
  deployment_busy: 'the deployment belongs to a cluster operation and cannot be changed by hand',
  restart_in_progress: 'the cluster is already being restarted, upgraded, created or deleted',
  no_operation:
    'pause, resume, abort and promote need a running restart or upgrade; the cluster runs none (or a create, a delete, a node group change)',
  not_promotable:
    'the rollout has no canaries waiting for promotion (none were asked for, they are promoted already, or it reverts)',
  no_change: "the upgrade changes no node's configs or input values (every node has them already)",
  no_stable_revision:
    'the cluster has no stable revision to go back to: `on_failure: revert` and an undo need one (a revision a rollout completed on every node)',
  unknown_cluster_revision: 'the undo names a revision the cluster does not have (see `field`)',
  cluster_busy: 'the node already belongs to another cluster',
  node_in_cluster: 'the node belongs to a cluster; delete the cluster (or remove the node from it) first',
  deployment_deleting: 'the deployment is being deleted (its DELETE revision runs); it can no longer be changed',
  bad_input_value: 'an input value does not fit its declared type (see `field`)',
  internal: 'an unexpected error; details are in the controller log only',
  fetch_unavailable:
    'the controller cannot answer fetches on the push connection now (it is starting or stopping); the agent fetches over HTTPS',
  signal_unavailable:
    'the controller cannot take signals on the push connection now (it is starting or stopping, another is still answered on that connection or its answers are unwritten, or the API did not answer within 20 s); the agent signals over HTTPS',
  store_unavailable:
    'the database is unreachable or not answering in time (PostgreSQL down, cut off or stalled): nothing was changed, or the change cannot be confirmed; retry after Retry-After seconds',
  controller_revoked:
    "this controller's own certificate is revoked: it changes nothing and holds no nodes; ask another controller",
  controller_expired:
    "this controller's own certificate is expired or not yet valid: it changes nothing and holds no nodes until it is renewed; ask another controller",
  db_in_use:
    'another controller has this SQLite database open; several controllers share a PostgreSQL database instead (reported at start)',
  unsafe_file_mode:
    "a file that holds secrets is readable or writable by group or others: the database or its -wal/-shm (reported at start), the controller's TLS ticket key or Keystone credentials file (refused at start), or a push dialer's TLS session file (removed unread at start, logged); or the object store's static token file is writable by group or others (refused at start; every check `token_unverifiable` at run time)",
  session_file_unremovable:
    "at start, a push session file of a worker this controller no longer starts (fewer workers than the last start) could not be removed (logged with the file and the error; the start goes on): remove it by hand, it holds TLS sessions as sensitive as the controller's key",

  // the object store's callers: Heat's X-Auth-Token (docs/heat.md)
  token_invalid:
    'the object store token is unknown: Keystone does not know it (or it expired, or was revoked), or it is not in the static token file, or it is empty, over 8 KiB or not printable ASCII',
  token_wrong_project:
    'the token is valid but not for this account: its project is not the one after AUTH_ in the path (or, in the static token file, its lines name other projects)',
  token_role_missing:
    'the token is for this project but holds none of the roles the object store requires (by default admin or swiftoperator, as Swift)',
  token_unverifiable:
    "the object store could not check the token: Keystone is unreachable, slow, failing or refusing the controller's own credentials, or the static token file cannot be read; retry later (503)",

  // agent hooks and state (docs/architecture.md)
  bad_name: 'a group, tool, input or output name fails its pattern',
  forbidden_input: 'an input name would steer a loader or shell (PATH, LD_*, BASH_ENV, ...)',
  unknown_group: 'no hook for this group',
  unsafe_hooks_dir: 'the hooks dir or hook is not root-owned or is writable by group/others',
  nul_in_input: 'an input value holds a NUL byte',
  hook_timeout: 'the hook ran past its timeout and its process group was killed',
  hook_failed: "the hook could not be started or answered outside Heat's hook protocol",
  interrupted: 'the agent stopped while the item ran; it runs again only in a new revision',
  output_not_regular: 'an output path is a symlink or not a regular file',
  output_too_large: 'an output file is over 1 MiB',
  bad_config: 'a component config is not {"configs":[...]}',
  signal_too_large:
    "a result's outputs did not fit the 4 MiB signal limit and were dropped (stdout and stderr keep their tails)",
  hook_answer_too_deep:
    "a hook's answer (or its outputs) is nested deeper than 64 levels: the deployment fails and the answer is not read",
  unsafe_state_dir:
    'the agent runs as root and its state dir, a directory above it, the hooks dir or a hook is not root-owned or is writable by group/others: it refuses to start',
  unsafe_pki:
    'the agent runs as root and a PKI file it trusts (CA, its certificate or key, JWKS, revoked.json, pki.json), the PKI dir or a directory on the way is not root-owned or is writable by group/others: it refuses to start, or a running agent keeps the last good content',

  // push dialer (controller → agent listener): a node's `last_error` and dial-failure metric; an
  // agent dialling out (agent → controller, docs/dial-out.md) logs the same codes for its dials
  connection_refused:
    "nothing listens at the address dialled (the node's endpoint, or a controller's connect URL) (TCP connection refused)",
  connection_reset: 'the peer (agent or controller) or the network reset the connection',
  connection_closed: 'the peer (agent or controller) closed an established push connection',
  dial_timeout: 'TCP, TLS and the WebSocket upgrade did not finish within the dial timeout',
  unreachable: 'the host or network dialled is unreachable, or its name does not resolve',
  tls_error: "the TLS handshake failed for another reason than the peer's certificate",
  upgrade_refused: 'the peer answered the WebSocket upgrade with an unexpected HTTP status',
  half_open:
    'the peer did not answer a wake-up (or a ping) in time: the connection was dropped (an agent dialling out: no pong within 10 s)',
  protocol_error: 'the agent sent something that is not a valid answer frame',

  // the agent dialling out (docs/dial-out.md); it also reuses the dial codes above for its own dials
  proxy_refused:
    'the HTTP CONNECT proxy (HTTPS_PROXY) answered the agent with a status other than 2xx, or with no usable answer: the agent cannot reach the controller through it',

  // enrolment and renewal (docs/adding-nodes.md)
  enrollment_refused:
    'POST /v1/enroll refused: the one answer to an unknown, reused, expired, revoked or wrong-node token, a CSR that does not verify, carries a key outside the key policy or asks for another identity or other SANs (the controller log has the real reason)',
  enrollment_disabled:
    'the controller runs without --issuer, or its issuer is revoked: it cannot issue certificates (enrolment and renewal are off)',
  bad_csr:
    'a renewal CSR does not verify, asks for another identity or other SANs than the current certificate, or reuses its key',
  bad_key:
    'a renewal CSR carries a key Herald does not certify: only RSA of 2048 to 4096 bits with exponent 65537 (checked before any signature work; SECURITY.md)',
  ca_fingerprint_mismatch:
    "herald agent enroll: the controller's CA is not the one --ca-sha256 names (nothing was sent)",
  renewal_too_soon:
    'the node renewed its certificate a short while ago (a quarter of --agent-cert-lifetime); retry after Retry-After seconds',
  renewal_overdue:
    "an agent warning, not a refusal: 90 % of its certificate's lifetime has passed and renewal has not succeeded yet",

  // Heat's object store (docs/heat.md)
  heat_metadata_invalid:
    "a node's metadata written by Heat is not what Herald can serve (see `field`: not JSON, a malformed item, a config Herald refuses, or a signal transport other than TEMP_URL_SIGNAL or NO_SIGNAL); nothing was stored",
  tempurl_invalid:
    "a TempURL's signature does not match the account's temp-url key for this method and object, or it is malformed (a prefix TempURL, an expiry that is not epoch seconds, no key set)",
  tempurl_expired: 'a TempURL past its `temp_url_expires`',
  tempurl_sha1_refused: 'a TempURL signed with HMAC-SHA1: only SHA-256 and SHA-512 are accepted',
  token_missing: 'a request to the object store with neither a TempURL signature nor an X-Auth-Token',
  object_too_large: "an object over the object store's 4 MiB limit",
  object_store_full:
    'the account holds its limit of containers, or the container its limit of objects (docs/limits.md)',
  container_not_empty: 'a container DELETE while it still holds objects (409, as Swift answers)',
  temp_url_key_kept:
    "a log code, not a refusal: an account POST tried to replace the account's temp-url key; the first key stays in force (answered 204)",

  // the audit trail (docs/access.md "Audit trail"): what `herald audit verify` finds, each at a row's seq
  audit_row_edited:
    "an audit row's content does not match its hash, or its hash was recomputed too and the row after it is chained to another; or rows were added after the chain head outside the controller",
  audit_row_deleted:
    'audit rows are missing: a gap in seq where the chain breaks, rows after the last one (the chain head names a later seq), or rows before the first one without the pruning that would explain it',
  audit_row_reordered: "an audit row hashes right only under another row's seq: rows were moved",
  audit_checkpoint_invalid:
    "a checkpoint of the audit trail names a key of the JWKS but its signature, issuer or claims do not verify (a forged or damaged checkpoint); the controller's own check before it signs or prunes reports it too",
  audit_chain_rewritten:
    'a checkpoint of the audit trail verifies but signed another hash than the row before it now has: the rows before it were rewritten, hashes and all',
  audit_unanchored:
    'no checkpoint signed by a key of the JWKS given covers the audit trail (a new trail gets its first within a minute; a trail whose checkpoints were removed looks the same)',

  // configuration (start-up) and the CLI
  bad_option: 'a command-line option or configuration value is invalid',
  pki_exists: 'the PKI directory already holds a CA (use --force to replace it)',
  pki_missing: 'a file the PKI layout requires is missing',
  bad_ticket_key:
    "the controller's TLS session-ticket key file (`<pki>/controller/<name>.tls-ticket-key`) is not a regular file of exactly 48 bytes (refused at start)",
  api_error: 'the controller answered the CLI with an error',
  hidden_input_in_argv:
    "a CLI warning, not a refusal: a hidden input's value was given with --input, where every local user can read it in the process list (use --input-file)",
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export const ERROR_CODE_LIST = Object.keys(ERROR_CODES) as ErrorCode[];

export function isErrorCode(x: unknown): x is ErrorCode {
  return typeof x === 'string' && Object.hasOwn(ERROR_CODES, x);
}

/** The base of every coded Herald error. `code` is stable; `message` is for people. */
export class HeraldError extends Error {
  readonly code: ErrorCode;
  /** The field a validation error is about, as a dotted path (`input_values.port`). */
  readonly field: string | undefined;

  constructor(code: ErrorCode, message?: string, opts: { cause?: unknown; field?: string } = {}) {
    super(message ?? ERROR_CODES[code], opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'HeraldError';
    this.code = code;
    this.field = opts.field;
  }
}

/** A refusal of something a peer sent: a token, frame, response or TLS identity. */
export class RefusalError extends HeraldError {
  constructor(code: ErrorCode, message?: string, opts: { cause?: unknown; field?: string } = {}) {
    super(code, message, opts);
    this.name = 'RefusalError';
  }
}

/** A caller's or configuration mistake found at start-up; names the option. */
export class ConfigError extends HeraldError {
  constructor(message: string, opts: { cause?: unknown; field?: string; code?: ErrorCode } = {}) {
    super(opts.code ?? 'bad_option', message, opts);
    this.name = 'ConfigError';
  }
}

export function codeOf(err: unknown): ErrorCode | undefined {
  return err instanceof HeraldError ? err.code : undefined;
}
