/**
 * Every error code's HTTP status: the one mapping, for both ways an agent's request can come. The
 * HTTPS API (controller/api/server.ts) writes it on the status line; an answer to a frame on a
 * push connection (controller/service/agent-answers.ts) carries it in the frame, as the route
 * would have answered (docs/errors.md, docs/protocol.md). Heat's object store
 * (controller/heat/server.ts) answers with the same statuses, Swift's where they differ.
 */
import type { ErrorCode } from '../protocol/errors.js';

/** Every error code and its HTTP status. Unlisted codes are 400. */
export const STATUS_OF: Partial<Record<ErrorCode, number>> = {
  invalid_request: 400,
  invalid_json: 400,
  bad_name: 400,
  forbidden_input: 400,
  bad_input_value: 400,
  bad_config: 400,
  bad_endpoint: 400,
  link_local_endpoint: 400,
  bad_csr: 400,
  bad_key: 400,
  enrollment_refused: 403,
  enrollment_disabled: 403,
  no_client_certificate: 403,
  untrusted_certificate: 403,
  bad_issuer: 403,
  certificate_expired: 403,
  revoked: 403,
  wrong_role: 403,
  no_identity: 403,
  multiple_identities: 403,
  wrong_trust_domain: 403,
  bad_identity: 403,
  wrong_eku: 403,
  tls_version: 403,
  wrong_node: 403,
  forbidden: 403,
  out_of_scope: 403,
  endpoint_not_in_san: 403,
  node_deleted: 403,
  not_found: 404,
  method_not_allowed: 405,
  node_exists: 409,
  stale_revision: 409,
  unknown_revision: 409,
  output_closed: 409,
  deployment_busy: 409,
  deployment_deleting: 409,
  restart_in_progress: 409,
  no_operation: 409,
  not_promotable: 409,
  no_change: 409,
  no_stable_revision: 409,
  cluster_busy: 409,
  node_in_cluster: 409,
  body_too_large: 413,
  unsupported_media_type: 415,
  unknown_node: 422,
  unknown_nodegroup: 422,
  unknown_cluster_revision: 422,
  unknown_config: 422,
  rate_limited: 429,
  renewal_too_soon: 429,
  too_many_connections: 429,
  // Heat's object store: as Swift answers
  tempurl_invalid: 401,
  tempurl_expired: 401,
  tempurl_sha1_refused: 401,
  token_missing: 401,
  token_invalid: 401,
  token_wrong_project: 403,
  token_role_missing: 403,
  token_unverifiable: 503,
  container_not_empty: 409,
  object_too_large: 413,
  object_store_full: 413,
  internal: 500,
  store_unavailable: 503,
  controller_revoked: 503,
  controller_expired: 503,
};

export function statusOf(code: ErrorCode): number {
  return STATUS_OF[code] ?? 400;
}
