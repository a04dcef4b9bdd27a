/**
 * A cluster as the engine takes it (`NewCluster`), named `k`, with no input values: what the
 * engine, rollout and store tests create; each names its nodes, configs and groups.
 */
import type { NewCluster } from '../../controller/model/records.js';

export function newCluster(
  o: Pick<NewCluster, 'nodes' | 'installConfigId' | 'uninstallConfigId'> & Partial<NewCluster>,
): NewCluster {
  return { name: 'k', installInputValues: {}, inputValues: {}, ...o };
}
