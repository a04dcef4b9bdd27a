/**
 * Recording an agent's result for a deployment's current revision, inside the caller's
 * transaction: Heat's status rules (heat-status.ts), the audit row, the removal of a plain
 * deployment whose DELETE ran, the result written where Heat reads it for a deployment Heat made
 * (heat.ts), and, for a cluster's deployment, the cluster engine moving the
 * cluster on in the same transaction (so a crash cannot fall between the two).
 */
import { HeraldError } from '../../protocol/errors.js';
import type { ClusterEngine } from '../clusters/engine.js';
import { heatResult } from '../model/heat-status.js';
import type { DeploymentRecord, SignalInput } from '../model/records.js';
import type { StoreTx } from '../store/store.js';
import { writeHeatResult } from './heat.js';

export interface SignalOutcome {
  /** 'duplicate': the revision had its result already (the first one wins). */
  outcome: 'recorded' | 'duplicate';
  /** As it stands after the signal; null when the signal removed it. */
  deployment: DeploymentRecord | null;
}

/**
 * Records `s` for `node`'s deployment `deploymentId` at `nowMs` (epoch ms); `who` is audited.
 * @throws HeraldError not_found (not this node's deployment) | stale_revision | unknown_revision
 */
export async function recordSignal(
  tx: StoreTx,
  engine: ClusterEngine,
  node: string,
  deploymentId: string,
  s: SignalInput,
  who: string,
  nowMs: number,
): Promise<SignalOutcome> {
  const d = await tx.deployment(deploymentId);
  if (!d || d.node !== node) throw new HeraldError('not_found', `node ${node} has no deployment ${deploymentId}`);
  if (s.revision < d.current.revision)
    throw new HeraldError('stale_revision', `revision ${s.revision} is older than the current ${d.current.revision}`, {
      field: 'revision',
    });
  if (s.revision > d.current.revision)
    throw new HeraldError(
      'unknown_revision',
      `revision ${s.revision} is newer than the current ${d.current.revision}`,
      { field: 'revision' },
    );
  if (d.current.signalled) return { outcome: 'duplicate', deployment: d };
  const config = await tx.config(d.configId);
  if (!config) throw new HeraldError('internal', `deployment ${deploymentId} has no config ${d.configId}`);
  const result = heatResult(config, s);
  await tx.recordResult(d, result, nowMs);
  await writeHeatResult(tx, d, s, nowMs);
  await tx.audit(who, 'deployment.signal', deploymentId, { revision: s.revision, status: result.status });
  if (d.clusterId === null) {
    if (d.current.action === 'DELETE') {
      await tx.removeDeployment(deploymentId);
      return { outcome: 'recorded', deployment: null };
    }
  } else {
    await engine.onStepResult(
      tx,
      {
        clusterId: d.clusterId,
        node: d.node,
        deploymentId,
        ok: result.status === 'COMPLETE',
        reason: result.statusReason,
      },
      nowMs,
    );
  }
  return { outcome: 'recorded', deployment: (await tx.deployment(deploymentId)) ?? null };
}
