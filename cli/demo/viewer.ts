/**
 * The demo's look at who may do what (docs/access.md): the operator certificate the PKI starts
 * with, `admin`, is the controller's bootstrap admin; it grants `oncall` the viewer role, and the
 * viewer's read of the cluster is answered while its restart is refused 403 `forbidden`, with the
 * rule that refused it. One admin certificate is all the rest of the demo uses.
 */
import { ApiError, clientFromOptions, type ApiClient } from '../operator/client.js';
import type { ClusterView } from '../../protocol/rest.js';
import type { GrantView } from '../../protocol/access.js';
import { DemoFailure } from './supervisor.js';

/** The operator the demo makes a viewer of. */
export const DEMO_VIEWER = 'oncall';

/**
 * Grants DEMO_VIEWER the viewer role through `admin`, then reads the cluster and tries to restart it
 * as the viewer; resolves with the lines that tell it.
 * @throws DemoFailure when the read is refused or the restart is not refused `forbidden`
 */
export async function showViewer(
  admin: ApiClient,
  o: { url: string; pkiDir: string; env: NodeJS.ProcessEnv; clusterId: string },
): Promise<string[]> {
  const grant = await admin.post<GrantView>('/v1/access/grants', { subject: DEMO_VIEWER, role: 'viewer' });
  const viewer = clientFromOptions({ controller: o.url, pki: o.pkiDir, as: DEMO_VIEWER }, o.env);
  const path = `/v1/clusters/${encodeURIComponent(o.clusterId)}`;
  try {
    const seen = await viewer.get<ClusterView>(path);
    let refusal: ApiError | undefined;
    try {
      await viewer.patch(`${path}/actions/restart`, {});
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      refusal = err;
    }
    if (refusal?.status !== 403 || refusal.apiCode !== 'forbidden')
      throw new DemoFailure(
        `the viewer's restart was not refused 403 forbidden: ${refusal ? `${refusal.status} ${refusal.apiCode}` : 'it was accepted'}`,
      );
    return [
      `Access: operator/admin (the bootstrap admin) granted operator/${DEMO_VIEWER} the viewer role (grant ${grant.id}):`,
      `  ${DEMO_VIEWER}: GET ${path} → 200, ${seen.status}`,
      `  ${DEMO_VIEWER}: PATCH ${path}/actions/restart → 403 forbidden: ${refusal.message}`,
      `✓ a viewer reads and changes nothing (herald can-i deploy cluster:${seen.name} --as ${DEMO_VIEWER} says so before trying)`,
    ];
  } finally {
    viewer.close();
  }
}
